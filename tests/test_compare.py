"""`posenc_lit compare` end to end on a tiny study (issue 6, item 4): the records of results.json, the printed table,
resume (finished stages skipped, files untouched), reused pretraining runs, and bad input (exit status 2, nothing written).
The quick preset itself is far too long for the test suite; it is measured by hand (see nbs/30_compare.ipynb)."""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import gzip, json, shutil, time
from pathlib import Path
import pytest

from posenc_lit.cli import main
from posenc_lit.compare import COMPARE_PRESETS, compare
from posenc_lit.report import format_results
from posenc_lit.data import corpus_dir


def tiny_spec(folder: Path) -> dict:
    "A study of a few steps on the first rows of the embedded corpus; learned positions stop at 48 tokens."
    (folder / 'corpus').mkdir(parents=True)
    for split, n in (('train', 3000), ('validation', 400)):
        with gzip.open(corpus_dir() / f'{split}.jsonl.gz', 'rt') as f: rows = [next(f) for _ in range(n)]
        (folder / 'corpus' / f'{split}.jsonl').write_text(''.join(rows))
    return dict(pretrain=dict(preset='smoke', data=str(folder / 'corpus'), steps=6, eval_every=3, save_every=6, log_every=3,
                              eval_blocks=8, max_position_embeddings=48),
                finetune=dict(preset='smoke', max_train=64, batch_size=32, max_len=16, eval_lengths=[16, 32, 64]), tasks=['sentiment'], seeds=[0, 1],
                lengths=[32, 64], length_tokens=1024, vit_encodings=['none'],
                vit=dict(preset='smoke', steps=4, eval_every=4, save_every=4, log_every=2, batch_size=16, eval_sizes=[[28, 28]]))


@pytest.fixture(scope='module')
def study(tmp_path_factory):
    "The tiny study run once through the command line: (output folder, stdout, stderr, seconds)."
    d = tmp_path_factory.mktemp('compare')
    mp = pytest.MonkeyPatch(); mp.setitem(COMPARE_PRESETS, 'tiny', tiny_spec(d))
    import contextlib, io
    out, err = io.StringIO(), io.StringIO()
    t = time.time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(['compare', '--preset', 'tiny', '--out', str(d / 'study'), '--encodings', 'learned', 't5', '--quiet'])
    assert rc == 0, err.getvalue()
    yield d / 'study', out.getvalue(), err.getvalue(), time.time() - t
    mp.undo()


def run_cli(argv, capsys):
    rc = main(argv); cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_results_json_records(study):
    out, _, err, _ = study
    res = json.loads((out / 'results.json').read_text())
    assert res['finished'] and res['preset'] == 'tiny' and res['encodings'] == ['learned', 't5']
    assert [(r['pe'], r['task'], r['seed']) for r in res['records']] == [(pe, 'sentiment', s) for pe in ('learned', 't5') for s in (0, 1)]
    for r in res['records']:
        assert 0 <= r['test']['accuracy'] <= 1 and r['steps'] == 2 and r['wall_s'] > 0 and r['train_tokens_per_s'] > 0
        assert r['pretrain_eval_loss'] == res['pretrain'][r['pe']]['eval_loss'] and r['pretrain_steps'] == 6
        seed_dir = out / 'finetune' / r['pe'] / 'sentiment' / f"seed{r['seed']}"
        assert json.loads((seed_dir / 'summary.json').read_text())['test'] == r['test']
    for pe in ('learned', 't5'):
        p = res['pretrain'][pe]
        assert p['steps'] == 6 and p['wall_s'] > 0 and p['train_tokens_per_s'] > 0 and not p['reused']
        assert (out / 'pretrain' / pe / 'summary.json').is_file() and (out / 'lengths' / f'{pe}.json').is_file()
    b = res['baselines']['sentiment']
    assert b['train_examples'] == 64 and 0 <= b['majority']['accuracy'] <= 1 and 0 <= b['bow']['accuracy'] <= 1
    assert [v['pe'] for v in res['vit']] == ['none'] and res['vit'][0]['steps'] == 4 and 0 <= res['vit'][0]['test_accuracy'] <= 1
    env = res['environment']
    assert env['torch'] and env['hostname'] and env['cpu_count'] >= 1 and 'git_commit' in env
    assert res['wall_s'] > 0 and res['compute_s'] > 0
    assert {p.name for p in (out / 'figures').iterdir()} == {'pretraining.png', 'lengths.png', 'finetune_sentiment.png', 'downstream_sentiment.png', 'vit.png'}
    assert '[ 1/10 ' in err and '[10/10 ' in err and 'pretrain learned: done in' in err   # one line per stage


def test_baselines_fit_the_sentences_the_fine_tuning_draws(study):
    """With `max_train` the baselines see the random subset the fine-tuning trains on (`train_subset`), not the first
    rows (the split is sorted by label)."""
    from posenc_lit.finetune import train_subset
    from posenc_lit.tasks import bow_baseline, get_task, load_task, majority_baseline
    res = json.loads((study[0] / 'results.json').read_text())
    dd, spec = load_task('sentiment'), get_task('sentiment')
    dd['train'] = train_subset(dd['train'], 64)
    b = res['baselines']['sentiment']
    assert b['bow'] == bow_baseline(dd, spec)['test'] and b['majority'] == majority_baseline(dd, spec)['test']


def test_length_past_the_encoding_is_reported(study):
    "learned has 48 positions: n=64 is `n/a` with the reason; t5 runs at any length."
    out, stdout, _, _ = study
    res = json.loads((out / 'results.json').read_text())
    learned = {r['length']: r for r in res['lengths']['learned']['results']}
    assert 'loss' in learned[32] and 'is outside the learned position table (max_position_embeddings=48' in learned[64]['error']
    assert all('loss' in r for r in res['lengths']['t5']['results'])
    assert 'n/a: learned cannot run 64 tokens: position 63 is outside the learned position table (max_position_embeddings=48, valid positions 0..47)\n' in stdout


def test_downstream_lengths(study):
    "Fine-tuned cut to 16 tokens, scored cut to 16, 32, 64: at 16 the test score itself; learned (48 rows) cannot take 64 and says so."
    out, stdout, _, _ = study
    res = json.loads((out / 'results.json').read_text())
    for r in res['records']:
        at = {x['max_len']: x for x in r['test_at_length']}
        assert r['max_len'] == 16 and sorted(at) == [16, 32, 64]
        assert at[16]['accuracy'] == r['test']['accuracy'] and at[32]['truncated'] <= at[16]['truncated']
        if r['pe'] == 'learned': assert 'past what the encoding can take' in at[64]['error'] and 'accuracy' not in at[64]
        else: assert 0 <= at[64]['accuracy'] <= 1
    block = stdout.split('sentiment, fine-tuned on examples cut to 16 tokens')[1].splitlines()
    assert block[1].split() == ['encoding', 'accuracy@16', '↑', 'accuracy@32', '↑', 'accuracy@64', '↑']   # higher is better
    assert block[2].split()[0] == 'learned' and block[2].split()[-1] == 'n/a' and block[3].split()[0] == 't5'


def test_printed_table_is_format_results_of_the_json(study):
    out, stdout, _, _ = study
    res = json.loads((out / 'results.json').read_text())
    assert stdout == format_results(res) + f'\nresults: {out}/results.json, figures: {out}/figures/\n'
    lines = stdout.splitlines()
    top = next(k for k, l in enumerate(lines) if l.startswith('encoding '))   # the ⚠ legend and its lines come first
    rows = {l.split()[0]: l for l in lines[top:top + 6]}
    assert set(rows) == {'encoding', 'learned', 't5', 'majority', 'bag-of-words', 'unigram'}
    assert f"{res['pretrain']['t5']['eval_loss']:.4f}" in rows['t5']


def test_resume_skips_finished_stages(study, capsys):
    out, first, _, seconds = study
    files = lambda: {p: p.stat().st_mtime_ns for p in out.rglob('*') if p.is_file() and p.name != 'results.json' and p.parent.name != 'figures'}
    before = files()
    t = time.time()
    rc, stdout, err = run_cli(['compare', '--preset', 'tiny', '--out', str(out), '--encodings', 'learned', 't5', '--quiet'], capsys)
    assert rc == 0 and time.time() - t < max(3.0, seconds / 3), (time.time() - t, seconds)
    assert files() == before                                                 # nothing trained, nothing rewritten
    assert err.count('finished earlier, skipped') == 10 and 'done in' not in err
    assert stdout == first                                                   # the same table (stage times are kept)


def test_interrupted_seed_runs_again_alone(study, capsys):
    "A fine-tuning seed without summary.json (interrupted) is run again; every other stage is skipped."
    out = study[0]
    seed = out / 'finetune' / 't5' / 'sentiment' / 'seed1'
    (seed / 'summary.json').unlink()
    rc, stdout, err = run_cli(['compare', '--preset', 'tiny', '--out', str(out), '--encodings', 'learned', 't5'], capsys)   # with progress
    assert rc == 0 and err.count('done in') == 1 and 'finetune t5 sentiment seed 1: done in' in err
    assert (seed / 'summary.json').is_file()
    assert 'step ' in err and 'step ' not in stdout and stdout.startswith('posenc_lit compare')   # progress on stderr, the table alone on stdout


def test_reused_pretraining_runs(study, tmp_path, capsys):
    out = study[0]
    rc, stdout, err = run_cli(['compare', '--preset', 'tiny', '--out', str(tmp_path / 'b'), '--encodings', 't5', '--seeds', '0',
                               '--no-vit', '--quiet', '--pretrained-dir', str(out / 'pretrain')], capsys)
    assert rc == 0, err
    res = json.loads((tmp_path / 'b' / 'results.json').read_text())
    assert res['pretrain']['t5']['reused'] and res['pretrain']['t5']['run'] == str(out / 'pretrain' / 't5')
    assert not (tmp_path / 'b' / 'pretrain').exists() and [r['seed'] for r in res['records']] == [0] and res['vit'] == []
    assert 'pretrain t5: finished earlier, skipped, eval_loss' in err and f"(reused {out / 'pretrain' / 't5'})" in err
    assert res['pretrain']['t5']['differs_from_preset'] == {} and 'note:' not in err


def test_reused_run_pretrained_otherwise_is_named(study, tmp_path, capsys):
    "A reused run pretrained at another rate than the preset's: a note before anything runs, kept in the record."
    shutil.copytree(study[0] / 'pretrain' / 't5', tmp_path / 'pre' / 't5')
    f = tmp_path / 'pre' / 't5' / 'config.json'
    c = json.loads(f.read_text())
    f.write_text(json.dumps({**c, 'lr': c['lr'] * 2}))
    rc, _, err = run_cli(['compare', '--preset', 'tiny', '--out', str(tmp_path / 'b'), '--encodings', 't5', '--seeds', '0',
                          '--no-vit', '--quiet', '--pretrained-dir', str(tmp_path / 'pre')], capsys)
    assert rc == 0, err
    note = f"note: {tmp_path / 'pre' / 't5'} was pretrained otherwise than the preset 'tiny': lr {c['lr'] * 2} (preset {c['lr']})"
    assert note in err and err.index(note) < err.index('pretrain t5:'), err
    res = json.loads((tmp_path / 'b' / 'results.json').read_text())
    assert res['pretrain']['t5']['differs_from_preset'] == {'lr': [c['lr'] * 2, c['lr']]}


@pytest.mark.parametrize('argv, msg', [
    (['--encodings', 'learned', 'bogus'], "unknown encoding 'bogus'; valid: alibi, cope, deberta, fire, huang4, learned,"),
    (['--encodings', 'sincos2d'], "unknown encoding 'sincos2d'; valid:"),
    (['--tasks', 'sst-3'], "unknown task 'sst-3'; valid: sentiment, rating, reviews"),
    (['--vit-encodings', 'rope'], "unknown vision encoding 'rope'; valid: learned,"),
    (['--seeds', '1', '1'], 'seeds must be distinct'),
    (['--preset', 'huge'], "unknown preset 'huge'; valid: quick, reference"),
    (['--lengths', '64', '9000'], 'lengths (--lengths) must be distinct integers from 3 to 8194'),
    (['--lengths', '64', '64'], 'lengths (--lengths) must be distinct integers'),
    (['--lengths', '0'], 'argument --lengths: must be an integer ≥ 1; got 0'),
    (['--pretrained-dir', 'NOWHERE'], '--pretrained-dir NOWHERE: no such folder'),
    (['--pretrained-dir', 'PRE', '--encodings', 'learned', 'rope'], "has no pretraining run for encoding 'rope'"),
    (['--pretrained-dir', 'FT', '--encodings', 'learned'], 'is a fine-tuning checkpoint (task sentiment), not a pretraining one'),
    (['--pretrained-dir', 'VIT', '--encodings', 'none'], 'is not a pretraining checkpoint'),
    (['--pretrained-dir', 'AFILE'], 'is a file; expected a folder with one pretraining run per encoding'),
    (['--no-vit', '--vit-encodings', 'none'], '--vit-encodings selects ViTs and --no-vit skips them: pass one of the two'),
])
def test_bad_input_exits_2_before_anything_runs(argv, msg, study, tmp_path, capsys):
    out = study[0]
    ft = tmp_path / 'ft'; ft.mkdir(); (ft / 'learned').symlink_to(out / 'finetune' / 'learned' / 'sentiment' / 'seed0')   # a fine-tuning run
    vit = tmp_path / 'vit'; vit.mkdir(); (vit / 'none').symlink_to(out / 'vit' / 'none')                           # a ViT run
    (tmp_path / 'afile').write_text('')
    subst = {'NOWHERE': str(tmp_path / 'nowhere'), 'PRE': str(out / 'pretrain'), 'FT': str(ft), 'VIT': str(vit), 'AFILE': str(tmp_path / 'afile')}
    argv, msg = [subst.get(a, a) for a in argv], msg.replace('NOWHERE', subst['NOWHERE'])
    rc, stdout, err = run_cli(['compare', '--out', str(tmp_path / 'never'), '--quiet', *argv], capsys)
    assert rc == 2 and err.startswith('usage: posenc_lit compare') and msg in err and 'Traceback' not in err, err
    assert not (tmp_path / 'never').exists() and stdout == ''


def test_another_study_in_the_same_folder_is_refused(study, capsys):
    rc, _, err = run_cli(['compare', '--preset', 'quick', '--out', str(study[0]), '--encodings', 'learned'], capsys)
    assert rc == 2 and "holds a study with another preset, spec (about, encodings, finetune, known, length_tokens, lengths, " in err and "(preset 'tiny')" in err, err


def test_a_folder_of_other_files_is_refused(tmp_path, capsys):
    "--out that holds something other than a study (a pretraining run, the user's files): refused, nothing written into it."
    mine = tmp_path / 'mine'; mine.mkdir(); (mine / 'notes.txt').write_text('mine')
    rc, _, err = run_cli(['compare', '--preset', 'quick', '--out', str(mine), '--quiet'], capsys)
    assert rc == 2 and f'{mine} is not empty and holds no study (notes.txt)' in err, err
    assert [p.name for p in mine.iterdir()] == ['notes.txt']


def test_a_narrower_selection_in_the_same_folder_is_refused(study, capsys):
    "results.json is rebuilt from the call's selection: a call that leaves out an earlier encoding would lose its records."
    before = (study[0] / 'results.json').read_text()
    rc, _, err = run_cli(['compare', '--preset', 'tiny', '--out', str(study[0]), '--encodings', 't5', '--quiet'], capsys)
    assert rc == 2 and "holds results of encodings ['learned'] that this call does not select" in err, err
    assert (study[0] / 'results.json').read_text() == before


def _markdown_output(cell_marker: str) -> str:
    "The Markdown that the cell of nbs/30_compare.ipynb holding `cell_marker` displays."
    nb = json.loads((Path(__file__).resolve().parent.parent / 'nbs' / '30_compare.ipynb').read_text())
    cell = next(c for c in nb['cells'] if c['cell_type'] == 'code' and cell_marker in ''.join(c['source']))
    return ''.join(''.join(o['data']['text/markdown']) for o in cell['outputs'] if 'text/markdown' in o.get('data', {}))


def test_notebook_table_is_the_committed_json():
    "The quick study's tables in nbs/30_compare.ipynb are `results_markdown` of the committed results.json, not typed numbers."
    from posenc_lit.report import results_markdown
    root = Path(__file__).resolve().parent.parent
    from posenc_lit.probes import read_probe_results
    res = json.loads((root / 'results' / 'compare' / 'quick' / 'results.json').read_text())
    if not res.get('finished'): pytest.skip('results/compare/quick/results.json is a run in progress')
    res['probes'] = read_probe_results(root / 'results' / 'probes' / 'study' / 'probes.json')  # what compare now reads
    assert _markdown_output('display(Markdown(results_markdown(quick)))') == results_markdown(res)
    assert res['preset'] == 'quick'
    assert len(res['records']) == len(res['encodings']) * len(res['tasks']) * len(res['seeds'])


def test_notebook_reference_table_is_the_committed_json():
    "The reference study's tables in nbs/30_compare.ipynb are `results_markdown` of the committed results/compare/reference/results.json."
    from posenc_lit.report import results_markdown
    f = Path(__file__).resolve().parent.parent / 'results' / 'compare' / 'reference' / 'results.json'
    shown = _markdown_output('if ref: display(Markdown(results_markdown(ref)))')
    if not f.is_file():
        assert shown == ''; return
    res = json.loads(f.read_text())
    assert shown == results_markdown(res)
    assert '| encoding | pretrain loss ↓ |' in shown and '**' in shown        # a table, with the best of each column bold
    assert res['preset'] == 'reference' and res['vit_encodings'] == []
    assert len(res['records']) == len(res['encodings']) * len(res['tasks']) * len(res['seeds'])   # only whole encodings are committed


def test_printed_table_marks_direction_and_baseline(study):
    "Every header of the printed table says which direction is better; a value worse than its baseline is marked, with a legend."
    from posenc_lit.report import WORSE, WORSE_LEGEND
    _, stdout, _, _ = study
    res = json.loads((study[0] / 'results.json').read_text())
    header = next(l for l in stdout.splitlines() if l.startswith('encoding '))
    assert 'pretrain loss ↓' in header and 'sentiment accuracy ↑' in header and 'loss@32 ↓' in header, header
    worse = [f"{v['eval_loss']:.4f} {WORSE}" for v in res['pretrain'].values() if v['eval_loss'] > v['unigram_loss']]   # 6 steps: above unigram
    assert worse and all(w in stdout for w in worse)
    lines = stdout.splitlines()   # the legend, and each encoding with a ⚠, before the table
    top = lines.index(header)
    assert WORSE_LEGEND + ':' in lines[:top] and all(f'  {pe}: ' in '\n'.join(lines[:top]) for pe, v in res['pretrain'].items()
                                                      if v['eval_loss'] > v['unigram_loss'])


@pytest.mark.parametrize('name', ['tupe-a-tiecls', 'deberta-noemd', 'deberta-noc2p', 'deberta-nop2c'])
def test_ablation_is_the_pretraining_study_run(name):
    "An ablation of the reference compare pretrains what the reference pretraining study (tools/run_reference.sh) ran under its name."
    from dataclasses import asdict
    from posenc_lit.compare import compare_plan
    from posenc_lit.core import list_ablations
    assert name in list_ablations()
    saved = json.loads((Path(__file__).parent.parent / 'results' / 'pretraining' / name / 'config.json').read_text())
    plan = json.loads(json.dumps(asdict(compare_plan('reference', encodings=[name], vit=False)['pretrain'][name])))
    assert {k: plan[k] for k in saved} == saved


def test_cli_help_names_every_ablation(capsys):
    from posenc_lit.core import list_ablations
    assert main(['compare', '--help']) == 0
    text = ' '.join(capsys.readouterr().out.split()).replace('- ', '-')   # argparse wraps lines, at hyphens too
    assert all(a in text for a in list_ablations()), text


def test_probe_table_is_printed_as_soon_as_the_probes_are_done(tmp_path, capsys, monkeypatch):
    "The first thing `compare` prints is the probe table, before the rest of the study runs; the report repeats it."
    from posenc_lit.probes import format_probe_table
    monkeypatch.setitem(COMPARE_PRESETS, 'tiny-probes', {**tiny_spec(tmp_path), 'probes': dict(preset='smoke')})
    out = tmp_path / 'study'
    argv = ['compare', '--preset', 'tiny-probes', '--out', str(out), '--encodings', 'none', '--seeds', '0']
    rc, stdout, err = run_cli(argv + ['--no-vit', '--quiet'], capsys)
    assert rc == 0, err
    table = format_probe_table(json.loads((out / 'results.json').read_text())['probes'])
    assert stdout.startswith(table + '\n(the study goes on; its full report follows)\n'), stdout[:500]
    assert stdout.count(table) == 2 and stdout.index('posenc_lit compare, preset') > len(table)


def test_a_signal_during_fine_tuning_stops_the_study_with_a_message(tmp_path, capsys, monkeypatch):
    "A fine-tuning seed stopped by SIGTERM: the study stops, says the seed starts again on resume, status 143."
    import posenc_lit.compare as cmp
    stopped = {'signal': 'SIGTERM', 'stopped_at_step': 3, 'steps': 10}
    monkeypatch.setattr(cmp, '_finetune_stage', lambda *a: stopped)
    monkeypatch.setitem(COMPARE_PRESETS, 'tiny', tiny_spec(tmp_path))
    out = tmp_path / 'study'
    argv = ['compare', '--preset', 'tiny', '--out', str(out), '--encodings', 'learned', '--no-vit', '--quiet']
    rc, stdout, err = run_cli(argv, capsys)
    assert rc == 143 and stdout == '', (rc, stdout, err)
    assert ('interrupted by SIGTERM during finetune learned sentiment seed 0 (step 3 of 10): this seed starts '
            'again; finished stages are kept: run the same command again to resume') in err, err
    res = json.loads((out / 'results.json').read_text())
    assert res['interrupted']['stage'] == 'finetune learned sentiment seed 0' and not res['finished']
    assert res['records'] == [] and (out / 'pretrain' / 'learned' / 'summary.json').is_file()


def test_quick_preset_entries_and_rates():
    "The quick plan runs QUICK_ENTRIES by default, each at the study's rate for its family (the committed sweep)."
    from posenc_lit.compare import QUICK_ENTRIES, compare_plan
    from posenc_lit.study import study_lr
    root = Path(__file__).resolve().parents[1]
    plan = compare_plan('quick', probes=False)
    assert plan['encodings'] == QUICK_ENTRIES and 'none' in QUICK_ENTRIES
    for pe in QUICK_ENTRIES:
        assert plan['pretrain'][pe].lr == study_lr(pe, root / 'results'), pe
    assert compare_plan('quick', encodings=['learned'], probes=False)['encodings'] == ['learned']
