"""Position probes (issue 29, item 1): encodings that carry the position a probe needs score far above chance, `none`
stays at chance (its outputs cannot depend on positions), a learned table past its size is n/a with the reason, a seed
gives the same numbers, a finished run is not repeated, and the command line. Smoke settings: seconds per run."""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import contextlib, io, json
import pytest
import torch

import posenc_lit.probes as probes
from posenc_lit.probes import PROBES, BOS, FIRST, make_probe_config, run_probe, run_probes, train_probe
from posenc_lit.cli import main
from posenc_lit.compare import compare_plan

SMOKE = make_probe_config('smoke')


@pytest.fixture(scope='module')
def solved():
    "Runs where the encoding carries what the probe needs: relative offset (T5, Shaw), absolute index and order (learned)."
    cases = [('t5', 'offset'), ('shaw', 'offset'), ('learned', 'index'), ('learned', 'precede')]
    return {c: run_probe(*c, SMOKE) for c in cases}


@pytest.mark.parametrize('case', [('t5', 'offset'), ('shaw', 'offset'), ('learned', 'index'), ('learned', 'precede')])
def test_above_chance(solved, case):
    "At the training length the score is far from chance (a test that fails if the encoding's position signal is lost)."
    r, n = solved[case], SMOKE.length
    c = PROBES[case[1]].chance(n, SMOKE)
    acc = r['acc'][str(n)]
    assert acc > c + 0.5 * (1 - c), (case, acc, c)


def test_learned_table_na(solved):
    "Past the learned table (sized to the training length) the cell is n/a with the model's own reason, not a number."
    r = solved[('learned', 'index')]
    for f in SMOKE.factors[1:]:
        n = str(SMOKE.length * f)
        assert r['acc'][n] is None
        assert 'max_position_embeddings=16' in r['errors'][n], r['errors']


@pytest.mark.parametrize('probe', list(PROBES))
def test_none_at_chance(probe):
    "Without positions the encoder is permutation-equivariant: outputs follow a permutation of the content tokens, and the score is chance."
    cfg = make_probe_config('smoke', steps=60)
    model, _ = train_probe('none', probe, cfg)
    g = torch.Generator().manual_seed(1)
    ids, y = PROBES[probe].batch(64, cfg.length, cfg, g)
    perm = torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.randperm(cfg.length - 1, generator=g)])   # [BOS] stays first
    with torch.no_grad():
        out, out_perm = model(ids), model(ids[:, perm])
    expected = out if PROBES[probe].kind == 'sequence' else out[:, perm]
    torch.testing.assert_close(out_perm, expected, rtol=1e-4, atol=1e-4)
    r = run_probe('none', probe, cfg)
    for n, acc in r['acc'].items():
        c = PROBES[probe].chance(int(n), cfg)
        tol = 0.15 if PROBES[probe].kind == 'sequence' else 0.03   # 128 sequences; thousands of scored tokens
        assert acc < c + tol, (probe, n, acc, c)                      # chance is the best it can do (a short run may do worse)


def test_seeded():
    "The same seed gives the same record (times aside) and leaves the caller's random state alone; another seed differs."
    cfg = make_probe_config('smoke', steps=30)
    state = torch.random.get_rng_state()
    a, b = run_probe('rope', 'offset', cfg), run_probe('rope', 'offset', cfg)
    assert torch.equal(torch.random.get_rng_state(), state)
    drop = lambda r: {k: v for k, v in r.items() if k not in ('train_s', 'cpu_s')}
    assert drop(a) == drop(b)
    c = run_probe('rope', 'offset', make_probe_config('smoke', steps=30, seed=1))
    assert drop(c) != drop(a)


def test_resume(tmp_path, monkeypatch):
    "A second call on the same file runs nothing; a different configuration on the same file is refused."
    cfg, f = make_probe_config('smoke', steps=5, eval_examples=8), tmp_path / 'p.json'
    first = run_probes(['none', 't5'], ['offset'], cfg, out=f, progress=False)
    assert json.loads(f.read_text())['runs'] == json.loads(json.dumps(first['runs']))
    monkeypatch.setattr(probes, 'run_probe', lambda *a, **k: pytest.fail('a finished probe was run again'))
    again = run_probes(['none', 't5'], ['offset'], cfg, out=f, progress=False)
    assert again['runs'] == json.loads(json.dumps(first['runs']))
    with pytest.raises(ValueError, match='another configuration'):
        run_probes(['none'], ['offset'], make_probe_config('smoke', steps=6, eval_examples=8), out=f, progress=False)


def test_batches():
    "Content tokens are distinct, [BOS] first; both classes of the order probe have the same multiset."
    g = torch.Generator().manual_seed(0)
    for p in PROBES.values():
        ids, y = p.batch(16, 64, SMOKE, g)
        assert (ids[:, 0] == BOS).all() and (ids[:, 1:] >= FIRST).all()
        assert all(len(set(row[1:].tolist())) == 63 for row in ids)
    ids, y = PROBES['precede'].batch(512, 16, SMOKE, g)
    assert 0.4 < y.mean().item() < 0.6


def test_bad_config():
    with pytest.raises(ValueError, match='n_values=40 must be ≥'): make_probe_config('smoke', n_values=40)
    with pytest.raises(ValueError, match='unknown probe preset'): make_probe_config('huge')
    with pytest.raises(ValueError, match='unknown probe'): run_probe('t5', 'bogus', SMOKE)
    with pytest.raises(ValueError, match='unknown encoding'): run_probes(['bogus'], ['offset'], SMOKE)


def test_cli(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(['probes', '--preset', 'smoke', '--steps', '5', '--encodings', 'none', 'learned', '--probes', 'index',
                   '--out', str(tmp_path / 'p.json'), '--quiet'])
    assert rc == 0, err.getvalue()
    assert out.getvalue().startswith('Position probes'), out.getvalue()
    assert 'chance' in out.getvalue() and 'n/a: learned cannot run n > 16: positions are outside' in out.getvalue()
    assert (tmp_path / 'p.png').is_file() and (tmp_path / 'p.json').is_file()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(['probes', '--probes', 'bogus']) == 2
    assert "unknown probe(s) ['bogus']" in err.getvalue()
    for folder in (str(tmp_path / 'new') + '/', str(tmp_path)):   # --out is a file: a folder is refused at once
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            assert main(['probes', '--preset', 'smoke', '--out', folder]) == 2
        assert f"--out {folder}: a folder, but the probes write one JSON file" in err.getvalue()
    assert not (tmp_path / 'new').exists()


def test_cli_seeds_are_a_list_as_in_finetune_and_compare(tmp_path):
    "`--seeds 1 2` runs seeds 1 and 2 (the other commands' form); seeds with a gap are refused before any run."
    out = tmp_path / 'p.json'
    argv = ['probes', '--preset', 'smoke', '--steps', '2', '--encodings', 'none', '--probes', 'index', '--quiet']
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv + ['--seeds', '2', '1', '--out', str(out)]) == 0
    assert set(json.loads(out.read_text())['runs']['index']['none']['seeds']) == {'1', '2'}
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(argv + ['--seeds', '0', '2']) == 2
    assert '--seeds for probes must be consecutive, each once' in err.getvalue()


def test_compare_plan():
    "`compare --preset quick` shows the committed probe study (three seeds) first; --no-probes leaves them out."
    plan = compare_plan('quick', encodings=['t5'], vit=False)
    assert plan['probes']['config'] == make_probe_config('study') and plan['probes']['names'] == list(PROBES)
    assert plan['probes']['committed'] == 'results/probes/study/probes.json'
    assert compare_plan('quick', encodings=['t5'], vit=False, probes=False)['probes'] is None


@pytest.mark.parametrize('pe', [e for e in probes.list_encodings() if e != 'none'])
def test_every_encoding_beats_chance_on_offset(pe):
    """Every registered language encoding carries a relative offset at its training length: the offset probe (smoke
    settings) ends well above chance. A change that cuts an encoding's position signal fails here (`none`: the
    permutation test above). Smoke scores seen: 1.000 for most, sinusoidal 0.65, ALiBi 0.31, chance 0.07."""
    r, n = run_probe(pe, 'offset', SMOKE), SMOKE.length
    c = PROBES['offset'].chance(n, SMOKE)
    assert r['acc'][str(n)] > c + 0.15, (pe, r['acc'], c)


# --- the stopping rule, seeds, [BOS] (issue 37) -------------------------------------------------------------------

def test_stopping_rule():
    "A solved run stops at its first window below stop_loss; a flat one at min_steps; otherwise at the cap."
    cfg = make_probe_config('smoke', steps=400, window=20, min_steps=60)
    _, solved = train_probe('learned', 'offset', cfg)
    assert solved['stopped'] == 'solved' and solved['steps'] < 400 and solved['final_loss'] < cfg.stop_loss, solved
    assert solved['steps'] == cfg.window * len(solved['curve'])
    _, flat = train_probe('none', 'precede', cfg)     # a bag of words: nothing to learn, the loss is flat at ln 2
    assert flat['stopped'] == 'flat' and 60 <= flat['steps'] < 400, flat
    _, cap = train_probe('none', 'precede', make_probe_config('smoke', steps=30, window=20, min_steps=60))
    assert (cap['stopped'], cap['steps'], len(cap['curve'])) == ('cap', 30, 2)


def test_seeds(tmp_path):
    "n_seeds runs each seed with its own weights and data; the table gives mean ± sd and the loss."
    cfg = make_probe_config('smoke', steps=20, eval_examples=16, n_seeds=2, seed=5)
    res = run_probes('t5', 'offset', cfg, out=tmp_path / 'p.json', progress=False)
    seeds = res['runs']['offset']['t5']['seeds']
    assert sorted(seeds) == ['5', '6'] and seeds['5']['acc'] != seeds['6']['acc']
    cell = probes.probe_cell(res['runs']['offset']['t5'], 16)
    assert cell['seeds'] == 2 and cell['acc'][1] > 0 and cell['loss'][0] > 0
    table = probes.format_probe_table(res)
    assert 'mean ± sd over 2 seeds' in table and f"{cell['acc'][0]:.3f}±{cell['acc'][1]:.3f} ({cell['loss'][0]:.2f})" in table


def test_no_bos_batches():
    "Without [BOS] every token is content and the labels follow it; the chance levels count n content tokens."
    cfg, g = make_probe_config('smoke', bos=False, n_values=66), torch.Generator().manual_seed(0)
    ids, y = PROBES['offset'].batch(4, 16, cfg, g)
    assert (ids != BOS).all() and (y[:, 1:] == ids[:, :-1]).all() and (y[:, :1] == -100).all()
    ids, y = PROBES['index'].batch(4, 16, cfg, g)
    assert (y == ids[:, 10:11]).all()
    assert PROBES['offset'].chance(16, cfg) == 1 / 15 and PROBES['index'].chance(16, cfg) == 1 / 16


def test_alibi_without_bos_is_reversal_equivariant():
    "The derivation's symmetry: without [BOS], ALiBi's outputs reverse with the input (so precede sits at 1/2)."
    cfg = make_probe_config('smoke', bos=False, n_values=66)
    for probe in ('offset', 'precede'):
        model = probes.ProbeModel('alibi', probe, cfg).eval()
        ids, _ = PROBES[probe].batch(8, 16, cfg, torch.Generator().manual_seed(1))
        with torch.no_grad():
            out, rev = model(ids), model(ids.flip(1))
        torch.testing.assert_close(rev, out if probe == 'precede' else out.flip(1), rtol=1e-4, atol=1e-4)
    assert probes.probe_theory('alibi', 'precede', cfg)[0] == 'impossible'
    assert probes.probe_theory('alibi', 'precede', make_probe_config('smoke'))[0] == 'via [BOS]'


def test_not_converged_note():
    "A cell the theory calls solvable that sits at chance carries the note that training did not converge."
    cfg = make_probe_config('smoke', steps=3, eval_examples=16)
    res = run_probes(['learned'], ['index'], cfg, progress=False)
    assert 'did not converge: learned on index, 1 of 1 seed(s) near chance (cap at step 3, training loss' in probes.format_probe_table(res)


# --- issue 40: inputs of run_probes and the probes command ----------------------------------------------------------

def test_one_name_as_a_string():
    "A string names one encoding (or probe), not its letters."
    res = run_probes('rope', 'offset', make_probe_config('smoke', steps=2, eval_examples=8), progress=False)
    assert list(res['runs']) == ['offset'] and list(res['runs']['offset']) == ['rope']


@pytest.mark.parametrize('kw', [dict(encodings=[]), dict(probes=[])])
def test_empty_lists_refused(kw):
    with pytest.raises(ValueError, match='is empty: give at least one name'):
        run_probes(**kw, cfg=make_probe_config('smoke', steps=2), progress=False)


def test_non_finite_loss():
    "A diverging run is an error naming the loss, the step and the learning rate, never NaN scored as accuracy 0."
    with pytest.raises(FloatingPointError, match=r'training loss is nan at step \d+, not finite: lr=1e\+30'):
        run_probe('t5', 'offset', make_probe_config('smoke', lr=1e30, steps=20))
    with pytest.raises(FloatingPointError, match='not finite'):
        run_probes(['t5'], ['offset'], make_probe_config('smoke', lr=1e30, steps=20), progress=False)


def test_cli_out_png_refused(tmp_path):
    "The figure is written beside the results with the suffix .png: --out x.png would overwrite the results."
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(['probes', '--preset', 'smoke', '--out', str(tmp_path / 'res.png'), '--quiet'])
    assert rc == 2 and 'res.json' in err.getvalue() and '.png' in err.getvalue(), err.getvalue()
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize('content', ['{"config": ', '[1, 2]', '{"runs": {}}', '{"config": {}, "lengths": [], "probes": [], '
                                     '"chance": {}, "runs": {"offset": {"t5": {"seeds": {"0": {"acc": 3}}}}}}', None])
def test_damaged_results_file(tmp_path, content):
    "A damaged probes.json (not JSON, not an object, missing keys, a bad record, a folder) is named in the error."
    f = tmp_path / 'probes.json'
    f.mkdir() if content is None else f.write_text(content)
    with pytest.raises(ValueError, match='probes.json'):
        probes.read_probe_results(f)
    with pytest.raises(ValueError, match='probes.json'):
        run_probes(['t5'], ['offset'], make_probe_config('smoke', steps=2), out=f, progress=False)


def test_compare_reads_the_committed_probes(tmp_path):
    "compare's probe stage reads the runs of a committed probe set made with its configuration; it trains the rest."
    from posenc_lit import compare as C
    cfg, f = make_probe_config('smoke', steps=2, eval_examples=8), tmp_path / 'probes.json'
    committed = run_probes(['t5'], ['offset'], cfg, out=f, progress=False)
    calls = []

    def run(key, done, fn, note=lambda r: ''):
        calls.append((key, done))
        return fn()

    res = {}
    plan = {'probes': {'config': cfg, 'names': ['offset'], 'committed': str(f)}, 'encodings': ['t5', 'none']}
    C._probe_stages(plan, tmp_path / 'out', res, run)
    assert res['probes']['runs']['offset']['t5'] == json.loads(json.dumps(committed['runs']['offset']['t5']))
    # in name order; the committed run is read whole (t5 would be read with encodings ['none'] too)
    assert res['probes']['source'] == str(f) and calls == [('probe offset none', False), ('probe offset t5', True)]
    other = {**plan, 'probes': {**plan['probes'], 'config': make_probe_config('smoke', steps=3, eval_examples=8)}}
    C._probe_stages(other, tmp_path / 'out2', res, run)   # another configuration: nothing is read from it
    assert res['probes']['source'] is None and calls[-2:] == [('probe offset none', False), ('probe offset t5', False)]
