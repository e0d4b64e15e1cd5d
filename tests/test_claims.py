"""The claims table (nbs/25_claims.ipynb, issue 6): the table on the page is `claims` of the committed results, not typed
numbers; every verdict is one of the four; a results folder without the studies gives 'not measured yet', never an error."""
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
    f = tmp_path / 'pretraining' / 'sinusoidal' / 'summary.json'
    s = json.loads(f.read_text()); s['eval_loss'] += 0.5; f.write_text(json.dumps(s))
    row = claims(tmp_path)[0]
    assert row['verdict'] == 'does not hold' and f"sinusoidal {s['eval_loss']:.3f}" in row['ours']


def test_missing_results_are_not_measured_yet(tmp_path):
    rows = claims(tmp_path)
    assert {r['verdict'] for r in rows} == {'not measured yet'} and len(rows) == len(CLAIMS)
