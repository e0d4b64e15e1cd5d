"""tools/gpu_study_grid.py on the CPU (a test of the script, not of a GPU): two tiny study runs end to end in
two workers (pretraining, lengths, the order fine-tuning), the tarball's content and the manifest; and a
budget that stops a running pretraining and starts no further run. A tiny corpus (the first lines of the
embedded one)."""

import gzip, json, os, subprocess, sys, tarfile, time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'tools' / 'gpu_study_grid.py'
ENV = {
    **os.environ,
    'HF_HUB_OFFLINE': '1',
    'HF_DATASETS_OFFLINE': '1',
    'OMP_NUM_THREADS': '1',
    'PYTHONPATH': os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])),
}


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp('corpus')
    for split, n in (('train', 300), ('validation', 40)):
        with gzip.open(ROOT / 'posenc_lit' / 'corpus' / f'{split}.jsonl.gz', 'rt') as f:
            (d / f'{split}.jsonl').write_text(''.join(next(f) for _ in range(n)))
    return d


def grid(tmp_path, corpus, *args, timeout=600):
    out, work = tmp_path / 'out', tmp_path / 'work'
    cmd = [sys.executable, SCRIPT, out, *args, '--tiny', '--data', corpus, '--work', work, '--no-extras']
    t = time.monotonic()
    p = subprocess.run(list(map(str, cmd)), env=ENV, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return out, json.loads((out / 'manifest.json').read_text()), time.monotonic() - t


def members(out):
    with tarfile.open(out / 'study_gpu.tar.gz') as t:
        return {m.name for m in t.getmembers() if m.isfile()}


def test_two_runs_end_to_end(tmp_path, corpus):
    out, m, _ = grid(
        tmp_path,
        corpus,
        'learned-s3',
        'alibi-s4',
        '--workers',
        '2',
        '--budget-s',
        '500',
        '--tasks',
        'order',
        '--commit',
        'abc123',
    )
    assert sorted(os.listdir(out)) == ['logs.tar.gz', 'manifest.json', 'manifest.md', 'study_gpu.tar.gz']
    assert m['commit'] == 'abc123' and m['torch'] and 'CPU' in m['device'] and m['workers'] == 2
    files = members(out)
    for name, lr in (('learned-s3', 0.002), ('alibi-s4', 0.004)):  # each entry's study_lr
        r = m['runs'][name]
        assert r['status'] == 'finished' and r['lr'] == lr, r
        assert [s['step'] for s in r['steps']] == ['pretrain', 'lengths', 'finetune order']
        assert all(s['rc'] == 0 and s['wall_s'] > 0 for s in r['steps'])
        for f in ('config.json', 'metrics.jsonl', 'summary.json', 'lengths.json', 'device.json'):
            assert f'results/study_gpu/{name}/{f}' in files
        assert f'results/study_gpu_order/{name}/summary.json' in files
        assert not any('checkpoint' in f for f in files)
        assert not any(f.startswith('results/study/') for f in files)  # never mixed into the CPU runs
    with tarfile.open(out / 'study_gpu.tar.gz') as t:
        cfg = json.load(t.extractfile('results/study_gpu/alibi-s4/config.json'))
        dev = json.load(t.extractfile('results/study_gpu/alibi-s4/device.json'))
        grids = [f for f in files if f.startswith('results/study_gpu/grids/')]
        assert len(grids) == 1 and json.load(t.extractfile(grids[0]))['runs'].keys() == m['runs'].keys()
    assert cfg['pe'] == 'alibi' and cfg['seed'] == 4 and cfg['lr'] == 0.004 and cfg['steps'] == 4
    assert dev['device'] == m['device'] and dev['commit'] == 'abc123'
    md = (out / 'manifest.md').read_text()
    assert m['device'] in md and '2 of 2 finished' in md


def test_budget_stops_a_run(tmp_path, corpus):
    "A pretraining far past the budget is stopped, the run queued behind it never starts, nothing is packed."
    out, m, wall = grid(
        tmp_path,
        corpus,
        'learned-s3',
        'alibi-s4',
        '--workers',
        '1',
        '--budget-s',
        '4',
        '--grace-s',
        '20',
        '--tiny-steps',
        '1000000',
        '--tasks',
        timeout=120,
    )
    assert wall < 4 + 20 + 20  # budget + grace + start-up and packing
    first, second = m['runs']['learned-s3'], m['runs']['alibi-s4']
    assert first['status'] == 'stopped' and first['packed'] == []
    assert [s['step'] for s in first['steps']] == ['pretrain'] and first['steps'][0]['rc'] != 0
    assert second['status'] == 'not started' and 'steps' not in second
    assert {f.split('/')[1] for f in members(out)} == {'study_gpu'}
    assert all(f.startswith('results/study_gpu/grids/') for f in members(out))
