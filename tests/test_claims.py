"""The claims table (nbs/25_claims.ipynb, issue 6): the table on the page is `claims` of the committed results, not typed
numbers; every verdict is one of `VERDICTS`; a results folder without the studies gives 'not measured yet', never an error."""
import json
from pathlib import Path

from posenc_lit.claims import CLAIMS, VERDICTS, claims, claims_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_notebook_table_is_claims_of_the_committed_json():
    nb = json.loads((ROOT / 'nbs' / '25_claims.ipynb').read_text())
    cell = next(c for c in nb['cells'] if c['cell_type'] == 'code' and 'display(Markdown(claims_markdown(rows)))' in ''.join(c['source']))
    shown = next(''.join(o['data']['text/markdown']) for o in cell['outputs'] if 'text/markdown' in o.get('data', {}))
    assert shown == claims_markdown(claims(ROOT / 'results'))


def test_every_claim_is_measured_from_the_committed_results():
    rows = claims(ROOT / 'results')
    assert len(rows) == len(CLAIMS) and all(r['verdict'] in VERDICTS for r in rows)
    measured = [r for r in rows if not r['ours'].startswith('no committed result')]
    assert len(measured) == len(rows), [r for r in rows if r not in measured]


def test_numbers_come_from_the_files(tmp_path):
    "Change one committed number in a copy of the results: the row that reads it changes with it."
    import shutil
    shutil.copytree(ROOT / 'results' / 'pretraining', tmp_path / 'pretraining')
    _working_absolute_baseline(tmp_path)
    f = tmp_path / 'pretraining' / 'sinusoidal' / 'summary.json'
    s = json.loads(f.read_text()); s['eval_loss'] += 0.5; f.write_text(json.dumps(s))
    row = claims(tmp_path)[0]
    assert row['verdict'] == 'does not hold' and f"sinusoidal {s['eval_loss']:.3f}" in row['ours']


def _working_absolute_baseline(root, gain=1.5):
    "Make `none` worse by `gain` nats in a copy of the results, so that the absolute baseline counts as working."
    f = root / 'pretraining' / 'none' / 'summary.json'
    s = json.loads(f.read_text()); s['eval_loss'] += gain; f.write_text(json.dumps(s))


def test_claims_against_absolute_positions_cannot_be_tested_without_a_working_baseline(tmp_path):
    "Rows that compare with BERT-style positions say 'cannot test here' (with the losses) until learned and sinusoidal beat none by 0.3 nats."
    import shutil
    from posenc_lit.claims import ABS_MARGIN, absolute_works
    shutil.copytree(ROOT / 'results' / 'pretraining', tmp_path / 'pretraining')
    ok, losses = absolute_works(tmp_path)
    rows = claims(tmp_path)
    blocked = [r for r in rows if r['verdict'] == 'cannot test here']
    assert not ok and blocked and all(losses in r['ours'] for r in blocked)
    assert any(r['claim'].startswith('TUPE reaches the baseline') for r in blocked)
    assert not any(r['claim'].startswith('untying [CLS]') for r in blocked)   # tupe-a against its own ablation
    _working_absolute_baseline(tmp_path, gain=ABS_MARGIN + 0.05)
    assert absolute_works(tmp_path)[0] and 'cannot test here' not in {r['verdict'] for r in claims(tmp_path)}


def test_missing_results_are_not_measured_yet(tmp_path):
    rows = claims(tmp_path)
    assert {r['verdict'] for r in rows} == {'not measured yet'} and len(rows) == len(CLAIMS)


def test_downstream_accuracy_joins_the_loss_verdict(tmp_path):
    "Where the reference compare study has fine-tuned the encodings of a claim, their accuracy is shown and can turn the verdict."
    import shutil
    shutil.copytree(ROOT / 'results' / 'pretraining', tmp_path / 'pretraining')
    _working_absolute_baseline(tmp_path)
    loss_only = next(r for r in claims(tmp_path) if r['claim'].startswith('DeBERTa beats'))   # no compare study in the copy
    assert loss_only['verdict'] == 'holds' and 'sentiment accuracy' not in loss_only['ours']   # deberta has the lowest loss
    f = tmp_path / 'compare' / 'reference' / 'results.json'; f.parent.mkdir(parents=True)
    rec = lambda pe, acc: {'pe': pe, 'task': 'sentiment', 'main_metric': 'accuracy', 'test': {'accuracy': acc}}
    def deberta_row(gain, pes=('learned', 'deberta')):
        recs = [rec(pe, a + (gain if pe == 'deberta' else 0)) for pe in pes for a in (0.70, 0.71, 0.72)]
        f.write_text(json.dumps({'encodings': list(pes), 'records': recs}))
        return next(r for r in claims(tmp_path) if r['claim'].startswith('DeBERTa beats'))
    up, down = deberta_row(0.05), deberta_row(-0.05)
    assert up['verdict'] == 'holds' and 'deberta 0.760 ± 0.010, learned 0.710 ± 0.010' in up['ours']
    assert down['verdict'] == 'in part' and 'deberta 0.660 ± 0.010' in down['ours']
    assert 'within the seed spread' in deberta_row(0.005)['ours']
    only = deberta_row(0.05, pes=('learned',))                       # deberta not fine-tuned yet: the loss verdict, said so
    assert only['verdict'] == 'holds' and 'the others not run yet' in only['ours']
    f.write_text(json.dumps({'encodings': ['learned'], 'records': [rec('learned', float('nan'))]}))
    try: claims(tmp_path); raise AssertionError('a NaN accuracy was read')
    except ValueError as e: assert 'sentiment test accuracy of learned' in str(e) and str(f) in str(e)


def test_untied_cls_reads_the_ablation_on_every_task(tmp_path):
    "The untied-[CLS] row compares tupe-a with the tupe-a-tiecls ablation task by task; its verdict follows the gaps and the seed spread."
    import shutil
    shutil.copytree(ROOT / 'results' / 'pretraining', tmp_path / 'pretraining')
    f = tmp_path / 'compare' / 'reference' / 'results.json'; f.parent.mkdir(parents=True)
    metric = {'sentiment': 'accuracy', 'rating': 'pearson', 'reviews': 'accuracy'}
    def row(gains: dict):
        recs = [{'pe': pe, 'task': t, 'main_metric': metric[t], 'test': {metric[t]: a + (g if pe == 'tupe-a' else 0)}}
                for t, g in gains.items() for pe in ('tupe-a', 'tupe-a-tiecls') for a in (0.70, 0.71, 0.72)]
        f.write_text(json.dumps({'encodings': ['tupe-a', 'tupe-a-tiecls'], 'records': recs}))
        return next(r for r in claims(tmp_path) if r['claim'].startswith('untying [CLS]'))
    up = row({'sentiment': 0.05, 'rating': 0.02, 'reviews': 0.001})
    assert up['verdict'] == 'holds' and 'sentiment accuracy 0.760 ± 0.010 against 0.710 ± 0.010 (+5.0 pts)' in up['ours']
    assert 'rating pearson 0.730' in up['ours'] and 'reviews accuracy' in up['ours'] and '(reviews within the seed spread)' in up['ours']
    assert row({'sentiment': 0.05, 'rating': -0.02, 'reviews': 0.0})['verdict'] == 'in part'
    flat = row({'sentiment': 0.005, 'rating': -0.005, 'reviews': 0.0})
    assert flat['verdict'] == 'does not hold' and 'no gain beyond the seed spread' in flat['ours']
    f.write_text(json.dumps({'encodings': ['tupe-a'], 'records': []}))
    assert next(r for r in claims(tmp_path) if r['claim'].startswith('untying [CLS]'))['verdict'] == 'not measured yet'
