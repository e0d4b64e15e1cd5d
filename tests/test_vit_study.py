"""The ViT study's seeds (issues 37 and 41): tools/run_vit_study.sh runs NAME-sK as seed K of entry NAME and checks
every name before the first run; the ViT rows of the claims pages (41_claims, 42_decoder_study) read every committed
seed of each side (`vit_runs`) through the one rule (`gap_interval`, `verdict`)."""
import json, os, subprocess, sys
from pathlib import Path

import pytest

from posenc_lit.claims import MIN_SEEDS, claims, gap_interval, verdict, vit_runs, vit_values
from posenc_lit.decoder_study import decoder_claims
from posenc_lit.vision import VisionDataError, resolve_source

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'tools' / 'run_vit_study.sh'


def write_vit(root: Path, name: str, seed: int, acc: float, at56: float, pe: str | None = None) -> Path:
    "A ViT run as tools/run_vit_study.sh commits it (config and summary): seed `seed` of study entry `name`."
    d = root / 'vit' / (name if seed == 0 else f'{name}-s{seed}')
    d.mkdir(parents=True)
    (d / 'config.json').write_text(json.dumps({'pe': pe or name, 'seed': seed, 'steps': 3000, 'data': 'auto'}))
    modes = dict.fromkeys(('bicubic', 'bilinear', 'none'), at56)
    s = {'pe': pe or name, 'data': 'fashion-mnist-full', 'test_accuracy': acc, 'eval': {'56x56': modes},
         'finetunes': {m: {'test_accuracy': acc - 0.01} for m in modes}}
    (d / 'summary.json').write_text(json.dumps(s))
    return d


def _row(rows, ours, base, what):
    return next(r for r in rows if (r['ours'], r['base'], r['what']) == (ours, base, what))


def test_vit_rows_read_every_seed_through_the_one_rule(tmp_path):
    "3 seeds a side of made-up runs: the row's seeds, gap, interval and verdict are those of gap_interval/verdict."
    none, learned = [0.80, 0.81, 0.79], [0.85, 0.86, 0.855]
    for k, (a, b) in enumerate(zip(none, learned)):
        write_vit(tmp_path, 'none', k, a, 0.5)
        write_vit(tmp_path, 'learned', k, b, 0.7)
    assert [p.name for p in vit_runs(tmp_path, 'learned')] == ['learned', 'learned-s1', 'learned-s2']
    assert vit_values(tmp_path, 'none', 'test_accuracy') == none
    r = _row(claims(tmp_path), 'none', 'learned (1D)', 'Fashion-MNIST test accuracy')
    # the claim: `none` is worse, so the gap is learned − none, in points
    gap, lo, hi = gap_interval([-100 * x for x in none], [-100 * x for x in learned])
    assert (r['seeds'], r['n']) == ('3 vs 3', (3, 3))
    assert (r['gap'], r['lo'], r['hi']) == pytest.approx((gap, lo, hi))
    assert r['verdict'] == verdict(gap, lo, hi, seeds=(3, 3)) == 'holds'
    assert r['note'] == 'ViT training seeds 0, 1, 2 vs 0, 1, 2'  # three a side: no "fewer than 3" note
    # a fourth seed of one side with a gap in the folder numbering (s4, no s3) counts too
    write_vit(tmp_path, 'none', 4, 0.805, 0.5)
    r = _row(claims(tmp_path), 'none', 'learned (1D)', 'Fashion-MNIST test accuracy')
    assert r['seeds'] == '4 vs 3' and r['note'] == 'ViT training seeds 0, 1, 2, 4 vs 0, 1, 2'
    assert r['gap'] == pytest.approx(gap_interval([-100 * x for x in none + [0.805]], [-100 * x for x in learned])[0])


def test_rope_mixed_row_reads_every_seed(tmp_path):
    "The RoPE-Mixed row of 42_decoder_study: not measured until rope-mixed is committed, then every seed a side."
    for k, x in enumerate([0.25, 0.24, 0.26]):
        write_vit(tmp_path, 'rope2d', k, 0.86, x)
    r = next(r for r in decoder_claims(tmp_path) if r['ours'] == 'rope-mixed')
    assert r['verdict'] == 'not measured yet' and 'vit/rope-mixed/summary.json' in r['note']
    write_vit(tmp_path, 'rope-mixed', 0, 0.87, 0.40)
    r = next(r for r in decoder_claims(tmp_path) if r['ours'] == 'rope-mixed')
    assert r['seeds'] == '1 vs 3' and r['verdict'] == 'cannot tell at this power'
    assert r['note'].endswith(f'1 vs 3 seeds: fewer than {MIN_SEEDS} a side')
    for k, x in ((1, 0.42), (2, 0.38)):
        write_vit(tmp_path, 'rope-mixed', k, 0.87, x)
    r = next(r for r in decoder_claims(tmp_path) if r['ours'] == 'rope-mixed')
    gap, lo, hi = gap_interval([40.0, 42.0, 38.0], [25.0, 24.0, 26.0])
    assert r['seeds'] == '3 vs 3' and (r['gap'], r['lo'], r['hi']) == pytest.approx((gap, lo, hi))
    assert r['verdict'] == verdict(gap, lo, hi, seeds=(3, 3)) == 'holds'


def test_a_vit_seed_that_is_not_its_place_is_an_error_naming_it(tmp_path):
    "A seed folder holding another seed, another encoding or another data set names its file."
    write_vit(tmp_path, 'learned', 0, 0.85, 0.7)
    d = write_vit(tmp_path, 'learned', 1, 0.86, 0.7)
    (d / 'config.json').write_text(json.dumps({'pe': 'learned', 'seed': 0, 'steps': 3000}))
    with pytest.raises(ValueError, match=r"learned-s1/config\.json says seed 0, but its folder holds seed 1"):
        vit_runs(tmp_path, 'learned')
    (d / 'config.json').write_text(json.dumps({'pe': 'learned', 'seed': 1, 'steps': 1000}))
    with pytest.raises(ValueError, match=r"learned-s1/config\.json has steps 1000, but .*learned/config\.json"):
        vit_runs(tmp_path, 'learned')
    (d / 'config.json').write_text(json.dumps({'pe': 'learned', 'seed': 1, 'steps': 3000}))
    (d / 'summary.json').write_text(json.dumps({'pe': 'learned', 'data': 'fashion-mnist', 'test_accuracy': 0.8}))
    with pytest.raises(ValueError, match=r"learned-s1/summary\.json has data 'fashion-mnist', but"):
        vit_runs(tmp_path, 'learned')
    write_vit(tmp_path, 'none', 0, 0.80, 0.5, pe='learned')
    with pytest.raises(ValueError, match=r"none/config\.json says pe 'learned', but its folder is vit/none"):
        vit_values(tmp_path, 'none', 'test_accuracy')
    with pytest.raises(FileNotFoundError):
        vit_runs(tmp_path, 'rel2d')  # seed 0 not committed: 'not measured yet'


# --- the runner -------------------------------------------------------------------------------------------------


def _run(env, *names):
    return subprocess.run(['bash', str(SCRIPT), *names], env=env, capture_output=True, text=True, timeout=60)


def test_runner_refuses_a_bad_name_before_the_first_run(tmp_path, stand_in):
    "A bad name (an unknown entry, seed 0 or a leading zero as -sK, whitespace, a seed ≥ 2**32) runs nothing."
    env, called = stand_in
    for names in (['learned', 'nope'], ['learned', 'learned-s0'], ['rope-mixed', 'rope-mixed-s01'],
                  ['none', 'tupe-a-s1']):
        p = _run(env, *names)
        assert p.returncode == 2, (names, p.returncode, p.stderr)
        assert f"run_vit_study.sh: unknown study entry '{names[1]}'; nothing was run" in p.stderr, p.stderr
        assert 'Known entries: learned none sincos2d learned2d hybrid rope2d rel2d rope-mixed quick' in p.stderr
        assert not called.exists(), called.read_text()
    for names, why in ((['learned', 'learned none'], "the name 'learned none' holds whitespace; nothing was run"),
                       (['rel2d', 'rel2d-s4294967296'], "the seed of 'rel2d-s4294967296' is past the largest seed")):
        p = _run(env, *names)
        assert p.returncode == 2 and why in p.stderr, (names, p.returncode, p.stderr)
        assert not called.exists(), called.read_text()


def test_runner_passes_the_seed_and_needs_the_full_data(tmp_path, stand_in):
    "NAME-sK reaches the CLI as entry NAME with --seed K, into runs/vit/NAME-sK; no full Fashion-MNIST: no run."
    env, called = stand_in
    (tmp_path / 'fmnist').mkdir()  # a folder the data check finds (the stand-in CLI reads nothing)
    p = _run(env | {'POSENC_LIT_FASHION_MNIST': str(tmp_path / 'fmnist')}, 'rope-mixed-s2')
    assert p.returncode != 0 and called.read_text().split() == [
        'vit', '--preset', 'reference', '--pe', 'rope-mixed', '--seed', '2', '--out', 'runs/vit/rope-mixed-s2',
        '--resume', '--quiet']
    called.unlink()
    p = _run(env | {'PRESET': 'smoke'}, 'learned-s1')  # the smoke preset wins, on any data
    assert ' '.join(called.read_text().split()).startswith(
        'vit --preset reference --pe learned --finetune-res 56 --finetune-steps 100 --finetune-eval-sizes 56 '
        '--finetune-init bicubic,bilinear,none --seed 1 --preset smoke --out runs/vit/learned-s1')
    called.unlink()
    (tmp_path / 'results' / 'vit' / 'rel2d-s1').mkdir(parents=True)
    (tmp_path / 'results' / 'vit' / 'rel2d-s1' / 'summary.json').write_text('{}')
    p = _run(env | {'PRESET': 'smoke'}, 'rel2d-s1')
    assert p.returncode == 0 and 'done already: rel2d-s1' in p.stdout and not called.exists()
    try:
        resolve_source('fashion-mnist-full')
    except VisionDataError:
        p = _run(env, 'quick', 'none-s1')
        assert p.returncode == 2 and 'fashion-mnist-full: not found here' in p.stderr, p.stderr
        assert 'nothing was run (the reference runs train on the full Fashion-MNIST)' in p.stderr
        assert not called.exists()
    else:
        pytest.skip('the full Fashion-MNIST is on this machine: the refusal without it is not exercised')


def test_runner_end_to_end(tmp_path):
    "A seed of an entry with a table, smoke-sized: its files land in results/vit/NAME-sK; run again, it is skipped."
    env = {**os.environ, 'STUDY_ROOT': str(tmp_path), 'COMMIT': '0', 'PRESET': 'smoke', 'PYTHONPATH': str(ROOT)}
    run = lambda: subprocess.run(['bash', str(SCRIPT), 'learned2d-s3'], env=env, capture_output=True, text=True,
                                 timeout=900)
    p = run()
    assert p.returncode == 0, p.stderr[-2000:]
    dest = tmp_path / 'results' / 'vit' / 'learned2d-s3'
    assert {f.name for f in dest.iterdir()} == {'config.json', 'metrics.jsonl', 'summary.json',
                                                'pos_embed.safetensors'}
    c = json.loads((dest / 'config.json').read_text())
    assert (c['pe'], c['seed'], c['steps']) == ('learned2d', 3, 20)
    assert 'finished learned2d-s3: ' in p.stdout
    assert 'done already: learned2d-s3' in run().stdout
