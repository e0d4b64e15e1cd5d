"""`posenc_lit bench` end to end (the CI-sized `--quick` run), its resume, and the ratio/target arithmetic.

Timings are never asserted here: only that every variant was measured, checked equal and written, and that the
ratios and targets follow from the rows (the benchmark's numbers are in results/bench and on the docs page).
"""
import json, os, subprocess, sys
from pathlib import Path
import pytest

from posenc_lit.bench import bench_ratios, bench_targets, format_bench

ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1'}


def run(*argv):
    return subprocess.run([sys.executable, '-c', 'from posenc_lit.cli import main; raise SystemExit(main())', 'bench', *argv], capture_output=True, text=True, env=ENV, timeout=900)


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp('bench') / 'quick'
    p = run('--quick', '--no-compiled', '--threads', '1', '--out', str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    return out, p


def test_quick_run_writes_every_variant(quick):
    out, p = quick
    assert {f.name for f in out.iterdir()} >= {'bench.json', 'bench.md', 'bench.png', 'bench_memory.png'}
    res = json.loads((out / 'bench.json').read_text())
    assert res['env']['allocator'] and res['config']['lengths'] == [32, 64] and res['config']['flush_denormal'] is True
    assert 'subnormals flushed to zero' in format_bench(res).splitlines()[0]
    for L in (32, 64):
        got = {(r['case'], r['variant']) for r in res['rows'] if r['L'] == L}
        assert got == {('floor', 'sdpa'), *((c, v) for c in ('shaw', 'huang4', 'huang4-unclipped') for v in ('ours', 'naive')),
                       *((c, v) for c in ('t5', 'tupe', 'alibi') for v in ('ours', 'naive', 'sdpa-mask')), ('rope', 'ours'),
                       ('deberta', 'ours'), ('deberta', 'hf'), ('t5-module', 'ours'), ('t5-module', 'hf')}, got
    assert all(r['time_s'] > 0 and r['peak_bytes'] >= 0 and r['max_rel_diff'] <= 1e-4 for r in res['rows'])
    assert set(res['model']['tokens_per_s']) >= {'learned', 't5', 'deberta', 'rope', 'alibi'}
    assert '| case | variant |' in p.stdout and (out / 'bench.md').read_text().strip() == format_bench(res).strip()


def test_rerun_resumes_and_other_config_is_refused(quick):
    out, _ = quick
    before = (out / 'bench.json').read_text()
    p = run('--quick', '--no-compiled', '--threads', '1', '--out', str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    assert (out / 'bench.json').read_text() == before                 # nothing measured again
    p = run('--quick', '--no-compiled', '--threads', '1', '--repeats', '3', '--out', str(out))
    assert p.returncode == 2 and "another configuration (repeats: 2 in the folder, 3 now)" in p.stderr and 'use a new folder' in p.stderr, p.stderr
    p = run('--quick', '--no-compiled', '--threads', '1', '--keep-denormals', '--out', str(out))
    assert p.returncode == 2 and "flush_denormal: True in the folder, False now" in p.stderr, p.stderr


@pytest.mark.parametrize('content,msg', [('{"rows": [', 'is unreadable or truncated'), ('[1, 2]', 'is not a benchmark result')])
def test_a_folder_without_a_readable_benchmark_is_refused(tmp_path, content, msg):
    (tmp_path / 'bench.json').write_text(content)
    p = run('--quick', '--no-compiled', '--no-model', '--threads', '1', '--out', str(tmp_path))
    assert p.returncode == 2 and msg in p.stderr and str(tmp_path / 'bench.json') in p.stderr, p.stderr


def test_bad_out_and_sizes_fail_before_measuring(tmp_path):
    (tmp_path / 'afile').write_text('x')
    p = run('--quick', '--no-model', '--out', str(tmp_path / 'afile'))
    assert p.returncode == 2 and p.stderr.startswith('usage: posenc_lit bench') and 'is a file' in p.stderr, p.stderr
    p = run('--quick', '--no-model', '--batch', '1000000', '--lengths', '4096', '--out', str(tmp_path / 'big'))
    assert p.returncode == 2 and 'GiB for the naive forms' in p.stderr and 'lower the batch or the length' in p.stderr, p.stderr
    assert not (tmp_path / 'big' / 'bench.json').exists()


def _row(L, case, variant, baseline, t, mem, b=8):
    return dict(L=L, b=b, case=case, variant=variant, baseline=baseline, note='', time_s=t, peak_bytes=mem, max_rel_diff=0.0, first_call_s=t)


def test_ratios_and_targets_follow_from_the_rows():
    res = {'rows': [_row(1024, 'floor', 'sdpa', 'floor', 1.0, 100), _row(1024, 'huang4', 'ours', 'naive', 3.0, 20),
                    _row(1024, 'huang4', 'naive', 'naive', 10.0, 100), _row(1024, 't5', 'ours', 'floor', 2.5, 300),
                    _row(1024, 'deberta', 'ours', 'hf', 0.7, 50), _row(1024, 'deberta', 'hf', 'hf', 1.0, 60)],
           'model': {'tokens_per_s': {'learned': 1000.0, 't5': 700.0}}}
    r = {(x['case'], x['variant']): x for x in bench_ratios(res)}
    assert set(r) == {('huang4', 'ours'), ('t5', 'ours'), ('deberta', 'ours')}       # baselines are not rows of their own
    assert r['huang4', 'ours']['time_ratio'] == pytest.approx(0.3) and r['huang4', 'ours']['mem_ratio'] == pytest.approx(0.2)
    assert r['huang4', 'ours']['floor_ratio'] == pytest.approx(3.0) and r['deberta', 'ours']['floor_ratio'] is None
    assert r['t5', 'ours']['time_ratio'] == pytest.approx(2.5)                         # a bias term: against the floor
    t = {(x['case'], x['quantity'], x['L']): x['met'] for x in bench_targets(res)}
    assert t == {('deberta', 'time_ratio', 1024): True, ('huang4', 'time_ratio', 1024): True, ('huang4', 'mem_ratio', 1024): True,
                 ('t5', 'floor_ratio', 1024): False, ('t5', 'throughput_vs_learned', None): False}


def test_flush_denormal_is_checked_and_restored():
    import torch
    from posenc_lit.bench import bench
    with pytest.raises(ValueError, match="flush_denormal must be True or False; got 'yes'"):
        bench((8,), b=1, h=2, d=8, hf=False, compiled=False, model_preset=None, flush_denormal='yes')
    tiny = torch.tensor(1e-40)                                        # a subnormal float32
    res = bench((8,), b=1, h=2, d=8, repeats=1, warmup=0, threads=1, hf=False, compiled=False, model_preset=None, progress=False)
    assert res['config']['flush_denormal'] is True and (tiny * 1) > 0  # back to the process default afterwards: subnormals kept
