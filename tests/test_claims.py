"""The claims table (nbs/25_claims.ipynb; issues 6 and 29): the table on the page is `claims` of the committed results,
not typed numbers; every verdict is one of `VERDICTS`; a results folder without the study gives 'not measured yet',
never an error; a loss is the mean over the committed seeds, and a gap within the seed spread is not called clear."""
import json, math, shutil
from pathlib import Path

import pytest

from posenc_lit.claims import (ABS_MARGIN, CLAIMS, VERDICTS, absolute_works, claims, claims_markdown, seed_runs, study_loss,
                               study_noise)

ROOT = Path(__file__).resolve().parent.parent

# final held-out losses of a made-up study in which every claim holds (lower is better)
LOSSES = {'learned': 4.60, 'sinusoidal': 4.58, 'none': 6.10, 't5': 4.40, 'shaw': 4.45, 'huang4': 4.30, 'tupe-a': 4.20,
          'tupe-r': 4.10, 'tupe-a-tiecls': 4.21, 'deberta': 4.00, 'deberta-noemd': 4.05, 'deberta-noc2p': 4.08,
          'deberta-nop2c': 4.06, 'rope': 4.35, 'alibi': 4.50}
GROWTH = {'huang4': 0.02, 'sinusoidal': 1.5, 'learned': 2.0, 'alibi': 0.01, 'rope': 0.8}   # loss change from 32 to 256 tokens


def write_run(d: Path, final: float, growth: float = 0.5, steps: int = 12000):
    "A study run as tools/run_study.sh commits it: config, metrics (an eval curve ending at `final`), summary, lengths."
    d.mkdir(parents=True)
    (d / 'config.json').write_text(json.dumps({'seq_len': 32, 'steps': steps}))
    evals = [{'split': 'eval', 'step': s, 'loss': final + 2.0 * math.exp(-s / 1000)} for s in range(1000, steps + 1, 1000)]
    (d / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in evals))
    (d / 'summary.json').write_text(json.dumps({'eval_loss': final}))
    at = {32: final, 64: final + growth / 3, 128: final + growth / 2, 256: final + growth}
    (d / 'lengths.json').write_text(json.dumps({'results': [{'length': n, 'loss': v} for n, v in at.items()]}))


def fake_study(root: Path, losses=None, seeds=(0,), jitter=0.0) -> Path:
    "A results folder with a made-up study: every entry at `losses`, one run per seed (seed k moved by k × jitter)."
    for name, loss in {**LOSSES, **(losses or {})}.items():
        for k in seeds:
            write_run(root / 'study' / (name if k == 0 else f'{name}-s{k}'), loss + k * jitter, GROWTH.get(name, 0.5))
    return root


def row(root, start: str) -> dict:
    return next(r for r in claims(root) if r['claim'].startswith(start))


def test_notebook_table_is_claims_of_the_committed_json():
    nb = json.loads((ROOT / 'nbs' / '25_claims.ipynb').read_text())
    cell = next(c for c in nb['cells'] if c['cell_type'] == 'code'
                and 'display(Markdown(claims_markdown(rows)))' in ''.join(c['source']))
    shown = next(''.join(o['data']['text/markdown']) for o in cell['outputs'] if 'text/markdown' in o.get('data', {}))
    assert shown == claims_markdown(claims(ROOT / 'results'))


def test_every_claim_is_measured_or_names_the_missing_study_run():
    rows = claims(ROOT / 'results')
    assert len(rows) == len(CLAIMS) and all(r['verdict'] in VERDICTS for r in rows)
    missing = [r for r in rows if r['ours'].startswith('no committed result')]
    assert all(r['verdict'] == 'not measured yet' and '(study/' in r['ours'] for r in missing), missing


def test_every_claim_has_a_verdict_on_a_complete_study(tmp_path):
    fake_study(tmp_path, seeds=(0, 1), jitter=0.001)
    (tmp_path / 'minilm').mkdir()
    rows = [r for r in claims(tmp_path) if r['paper'].split()[0] in ('Vaswani', 'Shaw', 'Ke', 'He', 'Press')
            or 'longer than its training length' in r['claim'] or r['claim'].startswith('method 4 > Shaw')]
    assert len(rows) == 10
    assert {r['claim'][:30]: r['verdict'] for r in rows if r['verdict'] != 'holds'} == {
        'untying [CLS] from the positio': 'not measured yet'}   # needs the study's fine-tuning


def test_numbers_come_from_the_files(tmp_path):
    "Change one committed number in the results: the row that reads it changes with it."
    fake_study(tmp_path)
    assert row(tmp_path, 'sinusoidal and learned')['verdict'] == 'holds'
    f = tmp_path / 'study' / 'sinusoidal' / 'summary.json'
    f.write_text(json.dumps({'eval_loss': 5.08}))
    r = row(tmp_path, 'sinusoidal and learned')
    assert r['verdict'] == 'does not hold' and 'sinusoidal 5.080' in r['ours'] and '(one seed)' in r['ours']


def test_claims_against_absolute_positions_cannot_be_tested_without_a_working_baseline(tmp_path):
    "Rows that compare with BERT-style positions say 'cannot test here' (with the losses) until learned and sinusoidal beat none by 0.3 nats."
    fake_study(tmp_path, {'none': LOSSES['learned'] + ABS_MARGIN - 0.05})
    ok, losses = absolute_works(tmp_path)
    blocked = [r for r in claims(tmp_path) if r['verdict'] == 'cannot test here']
    assert not ok and blocked and all(losses in r['ours'] for r in blocked)
    assert any(r['claim'].startswith('TUPE reaches the baseline') for r in blocked)
    assert not any(r['claim'].startswith('untying [CLS]') for r in blocked)   # tupe-a against its own ablation
    (tmp_path / 'study' / 'none' / 'summary.json').write_text(json.dumps({'eval_loss': LOSSES['sinusoidal'] + ABS_MARGIN + .05}))
    assert absolute_works(tmp_path)[0] and 'cannot test here' not in {r['verdict'] for r in claims(tmp_path)}


def test_missing_results_are_not_measured_yet(tmp_path):
    rows = claims(tmp_path)
    assert {r['verdict'] for r in rows} == {'not measured yet'} and len(rows) == len(CLAIMS)


def test_a_loss_is_the_mean_over_seeds_and_gaps_within_the_spread_are_not_clear(tmp_path):
    fake_study(tmp_path, seeds=(0, 1), jitter=0.1)      # every entry: seeds 0.1 apart, std 0.0707 = σ
    s = study_loss(tmp_path, 'shaw')
    assert s['n'] == 2 and s['mean'] == pytest.approx(LOSSES['shaw'] + 0.05) and s['std'] == pytest.approx(0.1 / 2 ** .5)
    assert study_noise(tmp_path) == pytest.approx(0.1 / 2 ** .5)
    r = row(tmp_path, 'relative positions beat absolute')   # shaw 0.15 below learned: beyond 2σ√(1/2 + 1/2) = 0.141
    assert r['verdict'] == 'holds' and 'shaw 4.500 ± 0.071' in r['ours'] and '(2 seeds, mean ± std)' in r['ours']
    r = row(tmp_path, 'TUPE-R > TUPE-A')                      # gaps of 0.10 and 0.40: the first within the bar
    assert r['verdict'] == 'in part' and 'within two standard errors: tupe-r–tupe-a 0.100 < 0.141' in r['ours']
    r = row(tmp_path, 'removing C2P')                         # ablations 0.05–0.08 worse: all within the bar
    assert r['verdict'] == 'cannot test here' and '−C2P, −P2C, −EMD within two standard errors' in r['ours']


def test_the_seed_noise_of_some_entries_calls_the_gaps_of_all(tmp_path):
    "σ pooled over the entries with two seeds sets the bar for entries with one; with no second seed, signs decide."
    fake_study(tmp_path)                                     # one seed each
    assert study_noise(tmp_path) is None
    r = row(tmp_path, 'TUPE-R > TUPE-A')
    assert r['verdict'] == 'holds' and 'the seed noise is unknown' in r['ours']
    for name in ('none', 'sinusoidal'):                      # two entries get a second seed 0.1 away: σ = 0.0707
        write_run(tmp_path / 'study' / f'{name}-s1', LOSSES[name] + 0.1)
    assert study_noise(tmp_path) == pytest.approx(0.1 / 2 ** .5)
    r = row(tmp_path, 'TUPE-R > TUPE-A')                      # one seed each: bar 2σ√2 = 0.200 > the 0.10 gap
    assert r['verdict'] == 'in part' and 'tupe-r–tupe-a 0.100 < 0.200' in r['ours'] and 'σ = 0.071' in r['ours']


def test_seed_runs_of_an_entry_are_its_own(tmp_path):
    "tupe-a's seeds are tupe-a and tupe-a-s1, never the tupe-a-tiecls ablation; seed 0 missing is 'not measured yet'."
    fake_study(tmp_path, seeds=(0, 1))
    assert [p.name for p in seed_runs(tmp_path, 'tupe-a')] == ['tupe-a', 'tupe-a-s1']
    write_run(tmp_path / 'study' / 'tupe-a-s10', 9.0)
    assert [p.name for p in seed_runs(tmp_path, 'tupe-a')] == ['tupe-a', 'tupe-a-s1', 'tupe-a-s10']
    for f in (tmp_path / 'study' / 'tupe-r').iterdir():
        f.unlink()
    r = row(tmp_path, 'TUPE-R > TUPE-A')
    assert r['verdict'] == 'not measured yet' and 'study/tupe-r/summary.json' in r['ours']


def test_length_claims_read_the_training_length_and_the_longest(tmp_path):
    fake_study(tmp_path)
    r = row(tmp_path, 'ALiBi trained short')
    assert r['verdict'] == 'holds' and 'from 32 to 256 tokens' in r['ours'] and 'alibi +0.010, rope +0.800' in r['ours']
    r = row(tmp_path, 'method 4 holds up')
    assert r['verdict'] == 'holds' and 'huang4 +0.020, sinusoidal +1.500; learned +2.000' in r['ours']


def test_a_damaged_file_names_the_claim_and_the_file(tmp_path):
    fake_study(tmp_path)
    f = tmp_path / 'study' / 'learned' / 'summary.json'
    f.write_text('{"eval_loss": NaN}')
    with pytest.raises(ValueError, match=f'eval_loss of {f} is nan, not a finite number'):
        claims(tmp_path)
    f.write_text('{"eval_loss": ')
    with pytest.raises(ValueError, match='summary.json is not valid JSON'):
        claims(tmp_path)


def _compare(root: Path, recs: list, pes=None) -> Path:
    """Write the records (pe, task, main_metric, test) as the study's fine-tuning summaries,
    study_<task>/<pe>/summary.json (tools/run_order.sh), after removing the earlier ones; the last file written."""
    for d in root.glob('study_*'):
        shutil.rmtree(d)
    by, f = {}, None
    for r in recs:
        by.setdefault((r['pe'], r['task']), []).append(r)
    for (pe, task), rs in by.items():
        m = rs[0]['main_metric']
        f = root / f'study_{task}' / pe / 'summary.json'
        f.parent.mkdir(parents=True)
        s = {'task': task, 'pe': pe, 'main_metric': m, 'test': {m: {'values': [r['test'][m] for r in rs]}}}
        f.write_text(json.dumps(s))
    return f


def test_downstream_accuracy_joins_the_loss_verdict(tmp_path):
    "Where the study's fine-tuning has the encodings of a claim, their accuracy is shown and can turn the verdict."
    fake_study(tmp_path)
    loss_only = row(tmp_path, 'DeBERTa beats')
    assert loss_only['verdict'] == 'holds' and 'sentiment accuracy' not in loss_only['ours']
    rec = lambda pe, acc: {'pe': pe, 'task': 'sentiment', 'main_metric': 'accuracy', 'test': {'accuracy': acc}}
    def deberta_row(gain, pes=('learned', 'deberta')):
        _compare(tmp_path, [rec(pe, a + (gain if pe == 'deberta' else 0)) for pe in pes for a in (0.70, 0.71, 0.72)], pes)
        return row(tmp_path, 'DeBERTa beats')
    up, down = deberta_row(0.05), deberta_row(-0.05)
    assert up['verdict'] == 'holds' and 'deberta 0.760 ± 0.010, learned 0.710 ± 0.010' in up['ours']
    assert down['verdict'] == 'in part' and 'deberta 0.660 ± 0.010' in down['ours']
    assert 'within the seed spread' in deberta_row(0.005)['ours']
    only = deberta_row(0.05, pes=('learned',))                       # deberta not fine-tuned yet: the loss verdict, said so
    assert only['verdict'] == 'holds' and 'the others not run yet' in only['ours']
    f = _compare(tmp_path, [rec('learned', float('nan'))], ['learned'])
    with pytest.raises(ValueError, match='sentiment test accuracy of learned') as e:
        claims(tmp_path)
    assert str(f) in str(e.value)


def test_untied_cls_reads_the_ablation_on_every_task(tmp_path):
    "The untied-[CLS] row compares tupe-a with the tupe-a-tiecls ablation task by task; its verdict follows the gaps and the seed spread."
    fake_study(tmp_path)
    metric = {'sentiment': 'accuracy', 'rating': 'pearson', 'reviews': 'accuracy'}
    def untied(gains: dict):
        recs = [{'pe': pe, 'task': t, 'main_metric': metric[t], 'test': {metric[t]: a + (g if pe == 'tupe-a' else 0)}}
                for t, g in gains.items() for pe in ('tupe-a', 'tupe-a-tiecls') for a in (0.70, 0.71, 0.72)]
        _compare(tmp_path, recs, ['tupe-a', 'tupe-a-tiecls'])
        return row(tmp_path, 'untying [CLS]')
    up = untied({'sentiment': 0.05, 'rating': 0.02, 'reviews': 0.001})
    assert up['verdict'] == 'holds' and 'sentiment accuracy 0.760 ± 0.010 against 0.710 ± 0.010 (+5.0 pts)' in up['ours']
    assert 'rating pearson 0.730' in up['ours'] and '(reviews within the seed spread)' in up['ours']
    assert untied({'sentiment': 0.05, 'rating': -0.02, 'reviews': 0.0})['verdict'] == 'in part'
    flat = untied({'sentiment': 0.005, 'rating': -0.005, 'reviews': 0.0})
    assert flat['verdict'] == 'does not hold' and 'no gain beyond the seed spread' in flat['ours']
    _compare(tmp_path, [], ['tupe-a'])
    assert row(tmp_path, 'untying [CLS]')['verdict'] == 'not measured yet'


def test_an_entry_whose_own_seeds_spread_more_than_the_pooled_noise_is_named(tmp_path):
    # every entry: seeds 0.01 apart, but learned's 0.4 apart (std 0.283): the pooled σ (0.073) calls the gap
    fake_study(tmp_path, losses={'sinusoidal': 4.30}, seeds=(0, 1), jitter=0.01)
    (tmp_path / 'study' / 'learned-s1' / 'summary.json').write_text(json.dumps({'eval_loss': LOSSES['learned'] + 0.4}))
    assert study_loss(tmp_path, 'learned')['std'] == pytest.approx(0.4 / 2 ** .5)
    r = row(tmp_path, 'sinusoidal and learned')   # gap 0.495, beyond the pooled bar 0.147
    assert r['verdict'] == 'does not hold' and "learned's own seeds spread more (std 0.283)" in r['ours'], r['ours']
    assert 'against that the gap is within two standard errors (0.566)' in r['ours'], r['ours']
