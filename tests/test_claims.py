"""The claims page (nbs/41_claims.ipynb; issues 6, 29, 37, 40): one verdict rule applied by one function to every
row; each row a part of a claim against the paper's own baseline, with its seeds and a Welch 95 % interval from each
entry's own spread; the forest plot first, then the table, both `claims` of the committed results; a results folder
that is not what its place says is an error naming the file."""
import json, re, shutil, statistics
from pathlib import Path

import pytest
from scipy import stats

from posenc_lit.claims import (CLAIMS, MARGIN, VERDICTS, claims, claims_markdown, entry_settings, gap_interval,
                               loss_values, task_values, verdict)

ROOT = Path(__file__).resolve().parent.parent


def write_run(root: Path, entry: str, seed: int, loss: float, growth: float = 0.5, **config) -> Path:
    "A study run as tools/run_study.sh commits it: config (the entry's settings), metrics, summary, lengths."
    d = root / 'study' / (entry if seed == 0 else f'{entry}-s{seed}')
    d.mkdir(parents=True)
    c = entry_settings(entry) | {'seed': seed, 'seq_len': 32, 'lr': 2e-3, 'steps': 12000, 'max_position_embeddings': 512}
    (d / 'config.json').write_text(json.dumps(c | config))
    (d / 'summary.json').write_text(json.dumps({'eval_loss': loss, 'pe': c['pe']}))
    evals = [{'split': 'eval', 'step': s, 'loss': loss + 12 / s} for s in range(1000, 12001, 1000)]
    (d / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in evals))
    at = [{'length': 32, 'loss': loss}, {'length': 256, 'loss': loss + growth}]
    (d / 'lengths.json').write_text(json.dumps({'pe': c['pe'], 'results': at}))
    return d


def write_task(root: Path, entry: str, task: str, values: list, metric: str = 'accuracy') -> Path:
    "The fine-tuning of study entry `entry` on `task` as tools/run_order.sh commits it: one seed folder per value."
    d = root / f'study_{task}' / entry
    for k in range(len(values)):
        (d / f'seed{k}').mkdir(parents=True)
        (d / f'seed{k}' / 'config.json').write_text(
            json.dumps({'seed': k, 'task': task, 'checkpoint': f'runs/study/{entry}'}))
    s = {'task': task, 'pe': entry_settings(entry)['pe'], 'checkpoint': f'runs/study/{entry}', 'main_metric': metric,
         'seeds': list(range(len(values))), 'test': {metric: {'values': values}}}
    (d / 'summary.json').write_text(json.dumps(s))
    return d


def row(root, ours, base, what='masked-token loss') -> dict:
    return next(r for r in claims(root) if (r['ours'], r['base'], r['what']) == (ours, base, what))


# --- the rule ---------------------------------------------------------------------------------------------------

S = (3, 3)  # three seeds a side


@pytest.mark.parametrize('args, kw, want', [
    ((0.10, 0.03, 0.17), {}, 'holds'),
    ((-0.10, -0.17, -0.03), {}, 'does not hold'),
    ((0.10, -0.02, 0.22), {}, 'cannot tell at this power'),
    ((0.10, None, None), {'seeds': (1, 3)}, 'cannot tell at this power'),  # one seed on a side: no interval
    ((0.10, 0.03, 0.17), {'seeds': (2, 3)}, 'cannot tell at this power'),  # two seeds: whatever the interval says
    ((-0.10, -0.17, -0.03), {'seeds': (3, 2)}, 'cannot tell at this power'),
    ((0.10, 0.03, 0.17), {'seeds': (3, None)}, 'holds'),                  # a fixed baseline has no seeds
    ((0.10, 0.03, 0.17), {'effect': 0.05}, 'cannot tell at this power'),  # the paper's effect < the half-width
    ((0.0, -0.5, 0.5), {'treated': False}, 'not tested'),
    ((None, None, None), {'seeds': None}, 'not measured yet'),
    ((0.01, -0.03, 0.04), {'margin': 0.05}, 'holds'),                 # ≈ within the margin
    ((0.12, 0.07, 0.17), {'margin': 0.05}, 'does not hold'),          # entirely beyond +margin
    ((-0.12, -0.17, -0.07), {'margin': 0.05}, 'does not hold'),       # entirely beyond −margin
    ((0.04, -0.01, 0.09), {'margin': 0.05}, 'cannot tell at this power'),
    ((0.01, -0.03, 0.04), {'margin': 0.05, 'seeds': (2, 2)}, 'cannot tell at this power'),
])
def test_verdict_gives_each_outcome(args, kw, want):
    assert verdict(*args, **({'seeds': S} | kw)) == want


def test_a_gap_far_below_the_seed_spread_cannot_tell():
    "The reviewer's row: 0.04811 against 0.04806, a gap of 0.00005 nats, with seeds that spread by 0.02."
    gap, lo, hi = gap_interval([4.04811 - 0.02, 4.04811, 4.04811 + 0.02], [4.04806 - 0.02, 4.04806, 4.04806 + 0.02])
    assert gap == pytest.approx(0.00005) and lo < -0.04 and hi > 0.04
    assert verdict(gap, lo, hi, seeds=S) == 'cannot tell at this power'


def test_gap_interval_is_welchs_with_each_sides_own_spread():
    a, b = [4.434, 4.327, 4.38], [4.247, 4.280]
    gap, lo, hi = gap_interval(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ci.low, ci.high)) and gap == pytest.approx(statistics.fmean(a) - statistics.fmean(b))
    one = stats.ttest_1samp(a, 4.0).confidence_interval(0.95)          # a fixed baseline: no variance of its own
    assert gap_interval(a, 4.0)[1:] == pytest.approx((one.low - 4.0, one.high - 4.0))
    assert gap_interval([4.4], b)[1:] == (None, None)
    quiet, noisy = gap_interval([1.0, 1.01], [0.0, 0.01]), gap_interval([1.0, 1.01], [0.0, 0.5])
    assert noisy[2] - noisy[1] > 10 * (quiet[2] - quiet[1])         # the noisy side's own spread widens it


def test_bad_input_to_the_rule_is_an_error():
    with pytest.raises(ValueError, match=r'the interval \[0.2, 0.3\] must contain the gap 0.1'):
        verdict(0.1, 0.2, 0.3, seeds=S)
    with pytest.raises(ValueError, match='margin must be positive'):
        verdict(0.1, 0.0, 0.2, seeds=S, margin=-1)
    with pytest.raises(ValueError, match='seeds must be'):
        verdict(0.1, 0.0, 0.2, seeds=(3, 0))
    with pytest.raises(ValueError, match='ours must be a non-empty list'):
        gap_interval([], [1.0, 2.0])


# --- the committed results ----------------------------------------------------------------------------------------

def test_notebook_shows_the_plot_then_the_table_of_the_committed_json():
    nb = json.loads((ROOT / 'nbs' / '41_claims.ipynb').read_text())
    code = [c for c in nb['cells'] if c['cell_type'] == 'code']
    src = [''.join(c['source']) for c in code]
    plot = next(i for i, s in enumerate(src) if 'forest_plot(rows)' in s)
    table = next(i for i, s in enumerate(src) if 'display(Markdown(claims_markdown(rows)))' in s)
    defined = [s for s in src[:plot] if '#| export' in s and re.search(r'^(def|class) ', s, re.M)]
    assert table == plot + 1 and not defined, 'the figure and table come first, the definitions after'
    assert '#| fig-alt:' in src[plot] and any('image/png' in o.get('data', {}) for o in code[plot]['outputs'])
    shown = next(''.join(o['data']['text/markdown']) for o in code[table]['outputs'] if 'text/markdown' in o.get('data', {}))
    assert shown == claims_markdown(claims(ROOT / 'results'))
    rule = ''.join(next(c for c in nb['cells'] if c['cell_type'] == 'markdown' and '## The rule' in ''.join(c['source']))['source'])
    assert all(v in rule for v in VERDICTS) and 'Welch' in rule and '±0.05 nats' in rule


def test_every_row_is_judged_by_the_one_rule():
    "Each row's verdict is `verdict` of its own gap and interval: no row has a rule of its own."
    rows = claims(ROOT / 'results')
    assert len(rows) == len(CLAIMS) and {r['verdict'] for r in rows} <= set(VERDICTS)
    for r in rows:
        margin = MARGIN[r['unit']] if r['way'] == 'equal' else None
        assert r['verdict'] == verdict(r['gap'], r['lo'], r['hi'], seeds=r['n'], margin=margin,
                                       treated=r['verdict'] != 'not tested'), r
        if r['n'] and any(n is not None and n < 3 for n in r['n']) and r['verdict'] != 'not tested':
            assert r['verdict'] == 'cannot tell at this power' and 'fewer than 3 a side' in r['note'], r
        if r['verdict'] != 'not measured yet':
            assert re.fullmatch(r'\d+ vs (\d+|fixed)', r['seeds']) and r['base'], r
        else:
            assert r['note'].startswith('no committed result: ') and r['gap'] is None, r
        assert 'in part' not in r['verdict']


def test_committed_rows_use_the_papers_baselines_and_say_what_they_lack():
    rows = claims(ROOT / 'results')
    pairs = {(r['ours'], r['base']) for r in rows}
    assert ('shaw', 'sinusoidal') in pairs and ('shaw', 'learned') not in {
        (r['ours'], r['base']) for r in rows if r['paper'].startswith('Shaw')}
    assert {r['base'] for r in rows if r['ours'] == 'deberta'} == {'learned'}     # no hidden "beat TUPE-R"
    assert {r['base'] for r in rows if r['ours'] in ('deberta-noc2p', 'deberta-nop2c', 'deberta-emd')} == {'deberta'}
    dropin = next(r for r in rows if r['ours'] == 'MiniLM + method 4')
    assert dropin['verdict'] == 'not tested' and "plain run's test accuracy to the last digit" in dropin['note']
    vit = [r for r in rows if r['what'].startswith(('Fashion-MNIST', 'accuracy at 56'))]
    assert len(vit) == 7
    for r in vit:  # every committed seed of each side (vit_runs): the note names them, the seeds count them
        seeds = r['note'].split(';')[0].removeprefix('ViT training seeds ').split(' vs ')
        a, b = (len(s.split(', ')) for s in seeds)
        assert r['note'].startswith('ViT training seeds 0') and r['seeds'] == f'{a} vs {b}', r
        assert r['verdict'] == 'cannot tell at this power' or min(a, b) >= 3, r
    first = [r for r in rows if 'deberta-k512' in (r['ours'] + r['base'])]
    assert first and all(r['label'].startswith('first study: k = 512, lr 2e-3') for r in first)
    assert all(r['base'].startswith('deberta-k512') for r in first)           # never against a headline entry
    longer = [r for r in rows if r['what'].startswith('loss growth') and r['ours'].startswith('huang4')]
    assert {r['ours'] for r in longer} == {'huang4', 'huang4-k511'}
    assert {r['base'] for r in longer} == {'learned', 'sinusoidal'}
    assert all('never trained' in r['label'] for r in longer if r['base'] == 'learned')
    devlin = [r for r in rows if r['paper'].startswith('Devlin')]
    # one row, on the real MiniLM: the study's encoders do not apply the paper's treatment (41_claims, The rows)
    assert [r['ours'] for r in devlin] == ['real MiniLM, fine-tuned'] and devlin[0]['seeds'] == '1 vs fixed'


def test_entry_settings_are_those_of_study_entries_sh():
    """claims.ENTRY_SETTINGS (what a run's config.json must say) and study.entry_args (what tools/study_entries.sh
    prints for tools/run_study.sh to run) agree, for every entry."""
    from posenc_lit.study import ENTRIES, entry_args
    for entry in ENTRIES:
        args = ' '.join(entry_args(entry))
        pe = re.search(r'--pe (\S+)', args)[1]
        kw = re.search(r'--pe-kwargs (\{.*\})', args)
        emd = re.search(r'--emd-steps (\d+)', args)
        want = {'pe': pe, 'pe_kwargs': json.loads(kw[1]) if kw else {}, 'emd_steps': int(emd[1]) if emd else 0}
        assert entry_settings(entry) == want, entry


def test_study_entries_sh_prints_entry_args():
    "tools/study_entries.sh's args_for prints study.entry_args on one line (the checkout's own package)."
    import subprocess
    from posenc_lit.study import entry_args
    script = 'source "$0"; args_for deberta-k512-emd-noc2p; args_for my-rope'
    sh = str(ROOT / 'tools' / 'study_entries.sh')
    out = subprocess.run(['bash', '-c', script, sh], capture_output=True, text=True, check=True).stdout
    assert out == ' '.join(entry_args('deberta-k512-emd-noc2p')) + '\n--pe my-rope\n'
    assert out.startswith('--pe deberta --emd-steps 2 --pe-kwargs {"pos_att_type":["p2c"]}\n')


# --- made-up results ------------------------------------------------------------------------------------------------

def test_missing_results_are_not_measured_yet_naming_the_files(tmp_path):
    rows = claims(tmp_path)
    assert {r['verdict'] for r in rows} == {'not measured yet'} and len(rows) == len(CLAIMS)
    r = next(r for r in rows if r['ours'] == 'deberta-emd')
    assert r['note'] == 'no committed result: study/deberta-emd/summary.json, study/deberta/summary.json'


def test_numbers_come_from_the_files_and_each_side_keeps_its_spread(tmp_path):
    for k, (s, l) in enumerate([(4.25, 4.43), (4.28, 4.33), (4.27, 4.38)]):
        write_run(tmp_path, 'sinusoidal', k, s)
        write_run(tmp_path, 'learned', k, l)
    r = row(tmp_path, 'sinusoidal', 'learned')          # ≈ with learned's own spread: the interval crosses the margin
    assert r['verdict'] == 'cannot tell at this power' and r['seeds'] == '3 vs 3' and r['lo'] < 0.05 < r['hi']
    for k, l in enumerate([4.27, 4.26, 4.265]):
        (tmp_path / 'study' / ('learned' if k == 0 else f'learned-s{k}') / 'summary.json').write_text(
            json.dumps({'eval_loss': l, 'pe': 'learned'}))
    r = row(tmp_path, 'sinusoidal', 'learned')
    assert r['verdict'] == 'holds' and -0.05 < r['lo'] < r['hi'] < 0.05, r


def test_length_rows_say_which_offsets_were_trained(tmp_path):
    for k in range(3):
        write_run(tmp_path, 'huang4', k, 4.1 + k / 100, growth=0.02 + k / 100)
        write_run(tmp_path, 'huang4-k511', k, 4.1 + k / 100, growth=1.5 + k / 10)
        write_run(tmp_path, 'learned', k, 4.4 + k / 100, growth=2.0 + k / 10)
    r = row(tmp_path, 'huang4', 'learned', 'loss growth, 32 → 256 tokens')
    assert r['verdict'] == 'holds' and 'huang4 k = 16: 32-token blocks train every row ±16' in r['note']
    assert 'learned: rows 0–31 trained; at 256 tokens rows 32–255 never trained' in r['note']
    r = row(tmp_path, 'huang4-k511', 'learned', 'loss growth, 32 → 256 tokens')
    assert 'huang4 k = 511: 32-token blocks train rows ±31 only; 256 tokens read rows ±32…±255 untrained' in r['note']


def test_a_seed_folder_of_another_encoding_or_seed_is_an_error_naming_it(tmp_path):
    write_run(tmp_path, 'learned', 0, 4.4)
    f = write_run(tmp_path, 'learned', 1, 4.3, pe='sinusoidal') / 'config.json'
    with pytest.raises(ValueError, match=f"{re.escape(str(f))} says pe 'sinusoidal', but its folder learned-s1 holds "
                                         "seed 1 of study entry 'learned'"):
        loss_values(tmp_path, 'learned')
    with pytest.raises(ValueError, match=re.escape(str(f))):
        claims(tmp_path)                                   # the page names it too, never a count
    shutil.rmtree(f.parent)
    shutil.copytree(tmp_path / 'study' / 'learned', f.parent)     # a copied seed folder: seed 0 twice
    with pytest.raises(ValueError, match=f"{re.escape(str(f))} says seed 0, but its folder learned-s1 holds seed 1"):
        loss_values(tmp_path, 'learned')


def test_an_entry_at_other_settings_or_a_run_twice_is_an_error(tmp_path):
    f = write_run(tmp_path, 'deberta', 0, 4.0, emd_steps=2) / 'config.json'     # the old `deberta` (with EMD)
    with pytest.raises(ValueError, match=f"{re.escape(str(f))} says emd_steps 2, but its folder deberta holds seed 0 "
                                         "of study entry 'deberta' \\(emd_steps 0"):
        loss_values(tmp_path, 'deberta')
    write_run(tmp_path, 'shaw', 0, 4.1)
    g = write_run(tmp_path, 'shaw', 1, 4.2, lr=1e-3) / 'config.json'
    with pytest.raises(ValueError, match=f"{re.escape(str(g))} has lr 0.001, but .* \\(seed 0 of 'shaw'\\) has 0.002"):
        loss_values(tmp_path, 'shaw')
    shutil.rmtree(g.parent)
    g = write_run(tmp_path, 'shaw', 1, 4.1)
    with pytest.raises(ValueError, match=f"{re.escape(str(g / 'summary.json'))} has the eval_loss of .*: one run twice"):
        loss_values(tmp_path, 'shaw')


def test_a_fine_tuning_seed_folder_that_is_not_its_place_is_an_error(tmp_path):
    d = write_task(tmp_path, 'tupe-a', 'order', [0.80, 0.82, 0.81])
    assert task_values(tmp_path, 'tupe-a', 'order') == ([0.80, 0.82, 0.81], 'accuracy')
    c = d / 'seed2' / 'config.json'
    c.write_text(json.dumps({'seed': 0, 'task': 'order', 'checkpoint': 'runs/study/tupe-a'}))   # seed0 copied
    with pytest.raises(ValueError, match=f"{re.escape(str(c))} says seed 0, task 'order'.* holds seed 2 of order"):
        task_values(tmp_path, 'tupe-a', 'order')
    c.write_text(json.dumps({'seed': 2, 'task': 'order', 'checkpoint': 'runs/study/tupe-a-tiecls'}))
    with pytest.raises(ValueError, match=f"{re.escape(str(c))} .*checkpoint 'runs/study/tupe-a-tiecls'"):
        task_values(tmp_path, 'tupe-a', 'order')
    c.write_text(json.dumps({'seed': 2, 'task': 'order', 'checkpoint': 'runs/study/tupe-a'}))
    s = json.loads((d / 'summary.json').read_text())
    (d / 'summary.json').write_text(json.dumps(s | {'seeds': [0, 1, 1]}))
    with pytest.raises(ValueError, match=r'lists seeds \[0, 1, 1\] for 3 test values'):
        task_values(tmp_path, 'tupe-a', 'order')


def pretraining(root: Path, name: str, **change) -> dict:
    "The `pretraining` record finetune writes when it starts from the committed study run `name`, `change` applied."
    c = json.loads((root / 'study' / name / 'config.json').read_text())
    loss = json.loads((root / 'study' / name / 'summary.json').read_text())['eval_loss']
    rec = {'run': f'runs/study/{name}', 'step': c['steps'], **{k: c.get(k) for k in ('lr', 'steps', 'seed', 'pe', 'pe_kwargs')},
           'eval_loss': loss, 'sha256': {'model.safetensors': 'ab' * 32}}
    return rec | change


def record(root: Path, task: str, name: str, **change):
    "Add the `pretraining` record of study run `name` to its committed fine-tuning on `task`."
    f = root / f'study_{task}' / name / 'summary.json'
    f.write_text(json.dumps(json.loads(f.read_text()) | {'pretraining': pretraining(root, name, **change)}))


def test_a_fine_tuning_from_another_pretraining_run_is_left_out_with_its_note(tmp_path):
    "Issue 37: a row never pairs a fine-tuning with a pretraining run other than the committed one, and says so."
    from posenc_lit.claims import pretraining_check, UNRECORDED
    for k in range(2):
        write_run(tmp_path, 'tupe-a', k, [4.1, 4.125][k])
        write_run(tmp_path, 'learned', k, 4.4 + k / 100)
    write_task(tmp_path, 'tupe-a', 'order', [0.80, 0.82, 0.81])
    write_task(tmp_path, 'tupe-a-s1', 'order', [0.95])
    write_task(tmp_path, 'learned', 'order', [0.70, 0.71, 0.69])
    write_task(tmp_path, 'learned-s1', 'order', [0.72])
    write_run(tmp_path, 'none', 0, 5.9)
    write_task(tmp_path, 'none', 'order', [0.50, 0.52, 0.51])   # the control: below the baseline, so a test
    s = json.loads((tmp_path / 'study_order' / 'tupe-a-s1' / 'summary.json').read_text())
    run = tmp_path / 'study' / 'tupe-a-s1'
    assert pretraining_check(s, run) == UNRECORDED
    assert pretraining_check(s | {'pretraining': pretraining(tmp_path, 'tupe-a-s1')}, run) == ''
    assert pretraining_check(s | {'pretraining': pretraining(tmp_path, 'tupe-a-s1', lr=4e-3, eval_loss=4.5)}, run) == (
        'pretrained with lr 0.004 (committed: 0.002), eval_loss 4.5 (committed: 4.125)')
    record(tmp_path, 'order', 'tupe-a')                         # the committed run: used, nothing to say
    record(tmp_path, 'order', 'tupe-a-s1', lr=4e-3)             # another run: left out of the row
    r = row(tmp_path, 'tupe-a', 'learned', 'order test metric')
    assert r['seeds'] == '1 vs 2' and r['means'].startswith('81.00 against'), r
    assert 'pretraining seeds 0 vs 0, 1, each the mean of its fine-tuning seeds (3 vs 3, 1)' in r['note'], r['note']
    assert 'tupe-a seed 1 left out, pretrained with lr 0.004 (committed: 0.002)' in r['note'], r['note']
    assert 'pretraining not recorded: learned seeds 0, 1' in r['note'] and 'tupe-a seed 0' not in r['note'], r['note']
    record(tmp_path, 'order', 'tupe-a', seed=5)                 # every fine-tuning of a side left out: not measured
    r = row(tmp_path, 'tupe-a', 'learned', 'order test metric')
    assert r['verdict'] == 'not measured yet' and r['note'] == (
        'no committed result: study_order/tupe-a/summary.json (left out: pretrained with seed 5 (committed: 0)), '
        'study_order/tupe-a-s1/summary.json (left out: pretrained with lr 0.004 (committed: 0.002))'), r['note']
    shutil.rmtree(tmp_path / 'study_order' / 'none')           # the study page's table too, of the two sides
    from posenc_lit.study import task_left_out, task_markdown, task_rows
    f = tmp_path / 'study_order' / 'learned' / 'summary.json'
    f.write_text(json.dumps(json.loads(f.read_text()) | {'validation': {'accuracy': {'mean': 0.7}}}))
    rows, left = task_rows(tmp_path, 'order'), task_left_out(tmp_path, 'order')
    assert left == {'tupe-a': 'pretrained with seed 5 (committed: 0)'}
    assert [(r['entry'], r['pretraining']) for r in rows] == [('learned', UNRECORDED)]
    assert 'tupe-a is left out: its fine-tuning pretrained with seed 5 (committed: 0).' in task_markdown(rows, 'order', left)


def test_a_task_row_names_its_control_and_the_sides_that_do_not_beat_it(tmp_path):
    "A referee's sentiment rows: the model without positions beside each task row, a note that never changes a verdict."
    for k in range(3):
        write_run(tmp_path, 'shaw', k, 4.1 + k / 100)
        write_run(tmp_path, 'sinusoidal', k, 4.3 + k / 100)
        write_task(tmp_path, 'shaw' if k == 0 else f'shaw-s{k}', 'sentiment', [0.80 + k / 1000])
        write_task(tmp_path, 'sinusoidal' if k == 0 else f'sinusoidal-s{k}', 'sentiment', [0.75 + k / 1000])
    what = 'sentiment test metric'
    r = row(tmp_path, 'shaw', 'sinusoidal', what)               # no control committed: said, and judged
    assert r['verdict'] == 'holds' and r['note'].endswith('no control: none (no positions) is not fine-tuned on '
                                                          'sentiment'), r
    write_run(tmp_path, 'none', 0, 5.9)
    write_task(tmp_path, 'none', 'sentiment', [0.76, 0.77, 0.78])   # one checkpoint: its mean 77.00
    r = row(tmp_path, 'shaw', 'sinusoidal', what)
    assert r['verdict'] == 'holds', r                             # the same verdict: a note, not a filter
    assert r['note'].endswith('control: none (no positions) 77.00, pretraining seeds 0; sinusoidal at or below it: '
                              'on sentiment positions do not lift it above no positions here, and the gap need '
                              'not come from positions'), r['note']
    write_task(tmp_path, 'none-s1', 'sentiment', [0.70])          # two checkpoints: 77.00 and 70.00, mean 73.50
    write_run(tmp_path, 'none', 1, 5.91)
    r = row(tmp_path, 'shaw', 'sinusoidal', what)
    assert r['verdict'] == 'holds' and r['note'].endswith('control: none (no positions) 73.50, pretraining seeds '
                                                          '0, 1'), r['note']
    write_run(tmp_path, 'sinusoidal', 3, 4.33)                    # pretrained, its fine-tuning not committed
    r = row(tmp_path, 'shaw', 'sinusoidal', what)
    assert r['seeds'] == '3 vs 3' and 'sinusoidal seed 3: pretrained, not fine-tuned on sentiment' in r['note'], r


def test_the_drop_in_is_not_tested_when_no_prediction_moved(tmp_path):
    def minilm(run, added, values):
        d = tmp_path / 'minilm' / run
        for k in range(len(values)):
            (d / f'seed{k}').mkdir(parents=True)
            (d / f'seed{k}' / 'config.json').write_text(json.dumps({'seed': k, 'add_relative': added}))
        (d / 'summary.json').write_text(json.dumps({'seeds': list(range(len(values))),
                                                    'test': {'accuracy': {'values': values}},
                                                    'baselines': {'bow': {'accuracy': 0.79}}}))
        return d
    minilm('plain', '', [0.845, 0.844, 0.839])
    r = row(tmp_path, 'real MiniLM, fine-tuned', 'bag-of-words', 'sentiment test accuracy')
    assert (r['seeds'], r['verdict']) == ('1 vs fixed', 'cannot tell at this power')   # one checkpoint: one seed
    h = minilm('huang4', 'huang4', [0.845, 0.844, 0.839])
    r = row(tmp_path, 'MiniLM + method 4', 'MiniLM', 'sentiment test accuracy, real MiniLM')
    assert r['verdict'] == 'not tested' and r['note'] == "every seed (3) has the plain run's test accuracy to the last digit"
    shutil.rmtree(h)
    minilm('huang4', 'huang4', [0.835, 0.834, 0.830])
    assert row(tmp_path, 'MiniLM + method 4', 'MiniLM', 'sentiment test accuracy, real MiniLM')['verdict'] == 'does not hold'
    (h / 'seed1' / 'config.json').write_text(json.dumps({'seed': 1, 'add_relative': ''}))
    with pytest.raises(ValueError, match="seed1/config.json says add_relative '', seed 1, but its folder holds seed 1 "
                                         "of minilm/huang4"):
        claims(tmp_path)


def test_a_damaged_file_names_the_claim_and_the_file(tmp_path):
    write_run(tmp_path, 'learned', 0, 4.4)
    f = tmp_path / 'study' / 'learned' / 'summary.json'
    f.write_text('{"eval_loss": NaN}')
    with pytest.raises(ValueError, match=f'eval_loss of {re.escape(str(f))} is nan, not a finite number'):
        claims(tmp_path)
    f.write_text('{"eval_loss": ')
    with pytest.raises(ValueError, match=f'{re.escape(str(f))} is not valid JSON'):
        claims(tmp_path)


# --- many rows: the family and Holm's correction ----------------------------------------------------------------------

def test_holm_by_hand_and_between_bonferronis_bounds():
    "Holm 1979: sort p, reject while p_(i) < α/(m − i + 1), stop at the first failure (worked by hand)."
    from posenc_lit.claims import holm
    assert holm([0.001, 0.013, 0.02, 0.3]) == [True, True, True, False]     # thresholds .0125, .0167, .025, .05
    assert holm([0.04, 0.005, 0.03, 0.01]) == [False, True, False, True]    # 0.03 ≥ 0.025 stops: 0.04 < α stays
    assert holm([0.05]) == [False] and holm([0.0499]) == [True] and holm([]) == []
    assert holm([0.02, 0.02]) == [True, True] and holm([0.03, 0.03, 0.03]) == [False] * 3
    rng = __import__('random').Random(7)
    for _ in range(3000):
        p = [rng.random() ** rng.choice([1, 4, 8]) for _ in range(rng.randint(1, 10))]
        kept, m = holm(p), len(p)
        assert all(k for q, k in zip(p, kept) if q < 0.05 / m)               # Bonferroni's rejections ⊆ Holm's
        assert all(q < 0.05 for q, k in zip(p, kept) if k)                   # Holm's ⊆ the per-row rule's
        assert all(k for q, k in zip(p, kept) if q <= min((x for x, kk in zip(p, kept) if kk), default=-1))
    with pytest.raises(ValueError, match=r'a p-value must lie in \[0, 1\], got 1.5'):
        holm([0.01, 1.5])
    with pytest.raises(ValueError, match=r'alpha must lie in \(0, 1\), got 0'):
        holm([0.01], alpha=0)


def test_a_rows_p_value_is_dual_to_its_interval():
    "p < 0.05 exactly where the row's 95 % interval calls it; Welch's p; for ≈ twice the TOST p-value."
    import random
    from posenc_lit.claims import p_value, welch
    a, b = [4.434, 4.327, 4.38], [4.247, 4.280, 4.26]
    gap, se, df = welch(a, b)
    assert p_value(gap, se, df) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-10)
    lo = stats.ttest_ind([x + 0.2 for x in a], b, equal_var=False, alternative='greater').pvalue   # H0: gap ≤ −0.2
    hi = stats.ttest_ind([x - 0.2 for x in a], b, equal_var=False, alternative='less').pvalue      # H0: gap ≥ +0.2
    assert p_value(gap, se, df, margin=0.2) == pytest.approx(2 * max(lo, hi), rel=1e-10)
    rng = random.Random(3)
    for _ in range(500):
        x = [rng.gauss(rng.gauss(0, 0.1), 0.05) for _ in range(rng.randint(3, 5))]
        y = [rng.gauss(0, 0.05) for _ in range(3)]
        margin = rng.choice([None, 0.05])
        g, l, h = gap_interval(x, y)
        called = verdict(g, l, h, seeds=(len(x), 3), margin=margin) in ('holds', 'does not hold')
        assert (p_value(*welch(x, y), margin) < 0.05) == called


def _callable(r: dict) -> bool:
    "The family, from the row's own fields: measured, treated, ≥ 3 seeds a side (a fixed baseline has none), an interval."
    if r['verdict'] in ('not tested', 'not measured yet') or r['lo'] is None:
        return False
    return all(n is None or n >= 3 for n in r['n'])


def test_the_family_is_the_rows_the_rule_can_call_and_holm_runs_over_it():
    from posenc_lit.claims import holm
    rows = claims(ROOT / 'results')
    family = [r for r in rows if _callable(r)]
    assert [r['p'] is not None for r in rows] == [_callable(r) for r in rows]
    assert all(r['holm'] is None for r in rows if not _callable(r))
    assert [r['holm'] for r in family] == holm([r['p'] for r in family])
    assert all(r['verdict'] in ('holds', 'does not hold') for r in rows if r['holm'])    # Holm only narrows
    assert all((r['p'] < 0.05) == (r['verdict'] in ('holds', 'does not hold')) for r in family)
    assert {r['verdict'] for r in rows if not _callable(r)} <= {'cannot tell at this power', 'not tested',
                                                                 'not measured yet'}
    table = claims_markdown(rows)
    assert f'| Holm (5 %, m = {len(family)}) |' in table.splitlines()[0]
    assert all(line.count(' | ') == table.splitlines()[0].count(' | ') for line in table.splitlines()[2:])


def test_familywise_on_made_up_rows(tmp_path):
    "Three entries at three seeds each: the family is the callable rows, and Holm decides which calls survive."
    from posenc_lit.claims import familywise, holm_markdown
    for k in range(3):
        write_run(tmp_path, 'huang4', k, 4.10 + k / 100, growth=0.02 + k / 100)
        write_run(tmp_path, 'sinusoidal', k, 4.30 + k / 50, growth=2.0 + k / 10)
        write_run(tmp_path, 'learned', k, 4.31 + k / 100, growth=2.5 + k / 10)
    rows = claims(tmp_path)
    family = [r for r in rows if r['p'] is not None]
    assert {(r['ours'], r['base'], r['what']) for r in family} == {
        ('sinusoidal', 'learned', 'masked-token loss'), ('huang4', 'learned', 'masked-token loss'),
        ('huang4', 'sinusoidal', 'loss growth, 32 → 256 tokens'), ('huang4', 'learned', 'loss growth, 32 → 256 tokens')}
    assert all(r['holm'] for r in family if r['p'] < 0.05 / len(family))
    assert familywise([r | {'p': None} for r in rows]) == [r | {'p': None, 'holm': None} for r in rows]
    text = holm_markdown(rows)
    assert f'(the m = {len(family)} rows the rule can call)' in text and text.count('\n| ') == len(family) + 1


def test_the_page_states_the_family_and_reads_its_sizes_from_the_runs():
    "The rule names the family and the correction; the counts and sizes on the page are computed, not typed."
    from posenc_lit.claims import family_markdown, holm_markdown
    nb = json.loads((ROOT / 'nbs' / '41_claims.ipynb').read_text())
    md = lambda c: next((''.join(o['data']['text/markdown']) for o in c.get('outputs', [])
                         if 'text/markdown' in o.get('data', {})), None)
    shown = [md(c) for c in nb['cells'] if c['cell_type'] == 'code']
    rows = claims(ROOT / 'results')
    assert family_markdown(rows) in shown and holm_markdown(rows) in shown
    m = sum(r['p'] is not None for r in rows)
    assert f'the rule can call **m = {m}**' in family_markdown(rows) and f'{m * 0.05:.2f} spurious calls' in family_markdown(rows)
    rule = ''.join(next(c for c in nb['cells'] if c['cell_type'] == 'markdown' and '## The rule' in ''.join(c['source']))['source'])
    assert 'Holm' in rule and 'the family' in rule and 'headline verdict is the per-row one' in rule
    entries = {e for c in CLAIMS for e in (c.ours, c.base) if (ROOT / 'results' / 'study' / e).is_dir()}
    sizes = [json.loads((ROOT / 'results' / 'study' / e / 'summary.json').read_text())['parameters'] for e in entries]
    intro = next(s for s in shown if s and s.startswith('The papers compare'))
    assert f'encoders of {min(sizes) / 1e6:.2f}–{max(sizes) / 1e6:.2f} million parameters' in intro
    assert not any('2-million' in ''.join(c['source']) + (md(c) or '') for c in nb['cells'])
