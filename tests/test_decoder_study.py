"""The decoder study (issue 41, nbs/42_decoder_study.ipynb): causal-LM pretraining resumes exactly, the length
evaluation equals a naive computation, the causal probes' generators equal their closed forms, the page reads
a results folder, and the runner runs end to end at smoke size."""

import json, os, subprocess, sys
from pathlib import Path
import pytest
import torch
from conftest import write_small_corpus

from posenc_lit.decoder_study import (
    make_lm_config,
    pretrain_lm,
    load_lm,
    lm_model,
    lm_blocks,
    lm_length_loss,
    make_causal_probe_config,
    counting_batch,
    selective_copy_batch,
    flip_flop_batch,
    causal_index_batch,
    SET,
    INC,
    COUNT0,
    BLANK,
    COPY,
    W,
    R,
    BOS,
    decoder_table,
    decoder_claims,
    length_losses,
    entry_runs,
    DECODER,
)

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    **os.environ,
    'HF_HUB_OFFLINE': '1',
    'HF_DATASETS_OFFLINE': '1',
    'TOKENIZERS_PARALLELISM': 'false',
    'PYTHONPATH': str(ROOT),
}


@pytest.fixture(scope='module')
def small_corpus(tmp_path_factory):
    return write_small_corpus(tmp_path_factory.mktemp('corpus'), train=300, validation=60)


def _records(run, split):
    return [
        json.loads(l)
        for l in (Path(run) / 'metrics.jsonl').read_text().splitlines()
        if json.loads(l)['split'] == split
    ]


def test_resume_matches_uninterrupted(tmp_path, small_corpus):
    cfg = make_lm_config(
        'smoke',
        pe='rope',
        data=small_corpus,
        steps=8,
        save_every=4,
        log_every=1,
        eval_every=4,
        factors=[1, 2],
    )
    full = pretrain_lm(cfg, tmp_path / 'full', progress=False)
    assert pretrain_lm(cfg, tmp_path / 'cut', stop_at=4, progress=False) == {'stopped_at_step': 4, 'steps': 8}
    assert not (tmp_path / 'cut' / 'lengths.json').exists()
    resumed = pretrain_lm(cfg, tmp_path / 'cut', resume=True, progress=False)
    for split in ('train', 'eval'):
        a, b = _records(tmp_path / 'full', split), _records(tmp_path / 'cut', split)
        assert [r['loss'] for r in a] == [r['loss'] for r in b] and len(a) == (8 if split == 'train' else 2)
    rate = lambda s: {k: v for k, v in s.items() if 'per_s' not in k}
    assert rate(full) == rate(resumed) and full['steps'] == 8
    (m1, c1), (m2, _) = load_lm(tmp_path / 'full'), load_lm(tmp_path / 'cut')
    assert c1 == cfg and all(
        torch.equal(p, q) for p, q in zip(m1.state_dict().values(), m2.state_dict().values())
    )
    l1, l2 = (json.loads((tmp_path / d / 'lengths.json').read_text()) for d in ('full', 'cut'))
    assert (
        l1 == l2 and [r['length'] for r in l1['results']] == [16, 32] and set(l1['variants']) == {'pi', 'ntk'}
    )
    assert pretrain_lm(cfg, tmp_path / 'cut', resume=True, progress=False) == resumed  # finished: left as is


def test_length_loss_equals_naive():
    torch.manual_seed(1)
    model = lm_model(make_lm_config('smoke', pe='t5'), 30).eval()
    stream = torch.randint(3, 30, (70,))  # 2 blocks of 32, 6 tokens dropped
    r = lm_length_loss(model, stream, 32, 8, batch_tokens=32)
    x, y = lm_blocks(stream, 32)
    nll = torch.zeros(2, 32)
    for b in range(2):
        for t in range(32):  # the prefix alone: what the causal mask must give
            logp = model(x[b : b + 1, : t + 1])['logits'][0, -1].log_softmax(-1)
            nll[b, t] = -logp[y[b, t]]
    assert r['tokens'] == 64 and abs(r['loss'] - nll.mean().item()) < 1e-4
    assert list(r['position_loss']) == ['0-7', '8-15', '16-31']
    assert abs(r['position_loss']['16-31'] - nll[:, 16:].mean().item()) < 1e-4


def test_probe_generators_closed_forms():
    cfg, g = make_causal_probe_config('study', n_seeds=1), torch.Generator().manual_seed(3)
    ids, y = counting_batch(32, 64, cfg, g)
    for row, lab in zip(ids.tolist(), y.tolist()):
        c = 0
        for t in range(1, 64):
            c = 0 if row[t] == SET else c + (row[t] == INC)
            assert lab[t] == COUNT0 + c <= COUNT0 + cfg.count_max
    ids, y = selective_copy_batch(32, 40, cfg, g)
    for row, lab in zip(ids.tolist(), y.tolist()):
        k = row.index(COPY)
        data = [v for v in row[1:k] if v != BLANK]
        assert row[k + 1 :] == data and [v for v in lab if v != -100] == data and lab[k] == data[0]
    ids, y = flip_flop_batch(32, 64, cfg, g)
    for row, lab in zip(ids.tolist(), y.tolist()):
        last = None
        for t in range(1, 63, 2):
            last = row[t + 1] if row[t] == W else last
            assert lab[t] == (last if row[t] == R else -100) and (row[t] != R or row[t + 1] == last)
    ids, y = causal_index_batch(4, 40, cfg, g)
    assert (y[:, : cfg.index] == -100).all() and (y[:, cfg.index :] == ids[:, [cfg.index]]).all()


def _fake(root, name, losses):
    d = Path(root) / DECODER / name
    d.mkdir(parents=True)
    rs = [{'length': 64 * f, 'loss': l} for f, l in losses.items()]
    (d / 'lengths.json').write_text(json.dumps({'train_seq_len': 64, 'results': rs, 'variants': {}}))


def test_page_reads_a_fake_results_folder(tmp_path):
    assert [r['verdict'] for r in decoder_claims(tmp_path)] == ['not measured yet'] * 4
    assert '| none | — | not run yet |' in decoder_table(tmp_path)
    for s, (fire, t5) in enumerate([(4.0, 4.1), (4.3, 4.0), (4.1, 4.2)]):
        _fake(tmp_path, 'fire' + (f'-s{s}' if s else ''), {1: 3.0, 8: fire})
        _fake(tmp_path, 't5' + (f'-s{s}' if s else ''), {1: 3.0, 8: t5})
    assert [p.name for p in entry_runs(tmp_path, 'fire')] == ['fire', 'fire-s1', 'fire-s2']
    assert length_losses(tmp_path, 't5') == {1: [3.0, 3.0, 3.0], 8: [4.1, 4.0, 4.2]}
    row = decoder_claims(tmp_path)[0]
    assert (
        row['seeds'] == '3 vs 3'
        and row['verdict'] == 'cannot tell at this power'
        and row['lo'] < 0 < row['hi']
    )
    assert '| fire | 3 | 3.000 ± 0.000 | 4.133 ± 0.153 |' in decoder_table(tmp_path, factors=(1, 8))


def test_runner_end_to_end(tmp_path):
    "The runner refuses an unknown name before it runs anything, then runs an LM and the probes (smoke size)."
    run = lambda *names: subprocess.run(
        ['bash', str(ROOT / 'tools' / 'run_decoder_study.sh'), *names],
        env={**ENV, 'STUDY_ROOT': str(tmp_path), 'COMMIT': '0', 'PRESET': 'smoke'},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    bad = run('alibi', 'nope')
    assert bad.returncode == 2 and "unknown entry 'nope'" in bad.stderr and not (tmp_path / 'runs').exists()
    ok = run('alibi', 'probes-alibi')
    assert ok.returncode == 0, ok.stderr[-2000:]
    dest = tmp_path / 'results' / 'decoder'
    assert {p.name for p in (dest / 'alibi').iterdir()} == {
        'config.json',
        'metrics.jsonl',
        'summary.json',
        'lengths.json',
    }
    assert len(json.loads((dest / 'alibi' / 'lengths.json').read_text())['results']) == 4
    probes = json.loads((dest / 'probes' / 'alibi.json').read_text())
    assert len(probes['runs']) == 6 and probes['lengths'] == [16, 32]
    assert 'done already: alibi' in run('alibi').stdout
