"""Issue 40 (reliability): every case of the issue in the areas of the run folders, the causal decoder, the
attention core, the model and the checkpoints, each asserting the error type and what its message names, or
the right result.

The two-process test of one `--out` runs POSENC_LIT_LOCK_LOOPS iterations (default 2, about 40 s on a quiet
machine; the issue's must-show is 10: `POSENC_LIT_LOCK_LOOPS=10 python -m pytest tests/test_issue40.py -k
two_commands`).
"""

import json, os, random, shutil, subprocess, sys, time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from posenc_lit.attention import attend, position_attention
from posenc_lit.causal_lm import CausalLM, LMCache
from posenc_lit.cli import main
from posenc_lit.core import list_encodings, register_encoding
from posenc_lit.model import Encoder, ModelConfig, build_encoding

ROOT = Path(__file__).resolve().parent.parent
ENCODINGS = list(list_encodings())
V = 50


def small_cfg(pe, **kw):
    return ModelConfig(
        vocab_size=V,
        d_model=16,
        n_heads=2,
        n_layers=2,
        d_ff=32,
        pe=pe,
        max_position_embeddings=16,
        dropout=0.0,
        attn_dropout=0.0,
        **kw,
    )


def lm_of(pe='rope', seed=0):
    torch.manual_seed(seed)
    return CausalLM(V, 16, 2, 2, 32, pe=build_encoding(small_cfg(pe))).eval()


def env():
    return {
        **os.environ,
        'PYTHONPATH': str(ROOT),
        'OMP_NUM_THREADS': '1',
        'HF_HUB_OFFLINE': '1',
        'HF_DATASETS_OFFLINE': '1',
    }


SMOKE = ['pretrain', '--pe', 'rope', '--preset', 'smoke', '--quiet']


def cli(*args, **kw):
    return subprocess.Popen(
        [sys.executable, '-m', 'posenc_lit.cli', *args],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def records(run: Path) -> list:
    "The metrics records without their timings (which differ from run to run)."
    return [
        {k: v for k, v in json.loads(l).items() if k != 'tokens_per_s'}
        for l in (run / 'metrics.jsonl').read_text().splitlines()
    ]


def summary(run: Path) -> dict:
    return {k: v for k, v in json.loads((run / 'summary.json').read_text()).items() if 'per_s' not in k}


# ---------------------------------------------------------------- one command per run folder


@pytest.fixture(scope='module')
def undisturbed(tmp_path_factory):
    out = tmp_path_factory.mktemp('ref') / 'run'
    p = cli(*SMOKE, '--out', str(out))
    assert p.wait(300) == 0, p.stderr.read()
    return out


def _wait_for_lock(out: Path, pid: int, first):
    "Until the first command holds the lock (or, without locks, has begun to write the run: its config.json)."
    f = out / '.posenc_lit.lock'
    for _ in range(2400):
        try:
            if json.loads(f.read_text())['pid'] == pid:
                return
        except (OSError, ValueError, KeyError):
            pass
        if (out / 'config.json').exists():
            return
        assert first.poll() is None, first.stderr.read()
        time.sleep(0.05)
    raise AssertionError('the first command never took the lock')


def test_two_commands_on_one_out(tmp_path, undisturbed):
    """A second command on a run folder that a first one is writing (--resume, --overwrite, or the same
    command again) fails at once with the lock's error naming the first process; the first run's records and
    summary equal an undisturbed run's. Before: the --resume truncated the first run's metrics.jsonl,
    --overwrite mixed two runs."""
    rng = random.Random(40)
    for it in range(int(os.environ.get('POSENC_LIT_LOCK_LOOPS', 2))):
        out = tmp_path / f'run{it}'
        first = cli(*SMOKE, '--out', str(out))
        _wait_for_lock(out, first.pid, first)
        time.sleep(rng.uniform(0, 2.5))
        how = [['--resume'], ['--overwrite'], []][it % 3]
        second = cli(*SMOKE, *how, '--out', str(out))
        err = second.communicate(timeout=300)[1]
        still_running = first.poll() is None
        assert second.returncode == 2, (how, err)
        assert f'is in use by process {first.pid}' in err and 'pretrain --pe rope' in err, err
        assert 'one command at a time may write a run folder' in err, err
        assert still_running, 'the second command did not fail while the first one ran'
        assert first.wait(300) == 0, first.stderr.read()
        assert records(out) == records(undisturbed), it
        assert summary(out) == summary(undisturbed), it
        assert not (out / '.posenc_lit.lock').exists()  # let go with the process


def test_lock_is_let_go_by_a_killed_process(tmp_path):
    "The OS lets the lock go however the process ends: after a kill -9 the folder can be resumed at once."
    out = tmp_path / 'run'
    first = cli(*SMOKE, '--out', str(out))
    _wait_for_lock(out, first.pid, first)
    first.kill()
    first.wait()
    again = cli(*SMOKE, '--resume', '--out', str(out))
    err = again.communicate(timeout=300)[1]
    assert again.returncode == 0, err


def test_lengths_takes_the_run_lock(tmp_path):
    """`posenc_lit lengths --run R` writes R/lengths.json, so it takes R's lock like every command that writes a
    run folder: while another process holds it, it fails at once naming that process (found by a breaker)."""
    run = tmp_path / 'run'
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, '-c', 'import sys, time; from posenc_lit.files import acquire_run_lock; '
         'acquire_run_lock(sys.argv[1]); print("held", flush=True); time.sleep(120)', str(run)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, 'PYTHONPATH': str(ROOT)},
    )
    try:
        assert holder.stdout.readline().strip() == 'held'
        p = subprocess.run(
            [sys.executable, '-m', 'posenc_lit.cli', 'lengths', '--run', str(run), '--lengths', '16'],
            capture_output=True, text=True, timeout=300, env={**os.environ, 'PYTHONPATH': str(ROOT)},
        )
        assert p.returncode == 2, p.stderr
        assert f'is in use by process {holder.pid}' in p.stderr, p.stderr
        assert not (run / 'lengths.json').exists()
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- CausalLM: inputs


IDS = torch.randint(1, V, (2, 5), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    'mask, names',
    [
        (torch.zeros(2, 5), 'attention_mask must be a bool or 0/1 integer tensor'),  # additive 0 / -inf
        (
            torch.tensor([[0.0, 0, 0, float('-inf'), 0]] * 2),
            'attention_mask must be a bool or 0/1 integer tensor',
        ),
        (torch.tensor([[0.0, 0, -1e4, 0, 0]] * 2), 'attention_mask must be a bool or 0/1 integer tensor'),
        (
            torch.tensor([[1, 1, -1, 1, 1]] * 2),
            'attention_mask must hold only 0 (padding) and 1 (real token)',
        ),
        (
            torch.ones(2, 4, dtype=torch.bool),
            'attention_mask must be a bool or 0/1 integer tensor of shape (b, n) = (2, 5)',
        ),
        (
            torch.ones(1, 5, dtype=torch.bool),
            'attention_mask must be a bool or 0/1 integer tensor of shape (b, n) = (2, 5)',
        ),
    ],
)
def test_causal_lm_refuses_masks_that_would_invert_padding(mask, names):
    with pytest.raises(ValueError, match='attention_mask') as e:
        lm_of()(IDS, mask)
    assert names in str(e.value) and 'ctx' not in str(e.value)


def test_causal_lm_mask_of_ones_and_zeros_is_keep():
    lm = lm_of()
    with torch.no_grad():
        full = lm(IDS)['logits']
        torch.testing.assert_close(lm(IDS, torch.ones(2, 5, dtype=torch.long))['logits'], full)
        torch.testing.assert_close(lm(IDS, torch.ones(2, 5, dtype=torch.bool))['logits'], full)


@pytest.mark.parametrize('ids', [IDS + V, IDS - V])
def test_causal_lm_out_of_vocabulary_ids(ids):
    with pytest.raises(ValueError, match=r'input_ids must lie in \[0, vocab_size=50\)'):
        lm_of()(ids)


# ---------------------------------------------------------------- CausalLM: the cache


def test_cache_reused_for_a_second_continuation_is_an_error_or_forked():
    lm, nxt = lm_of(), torch.randint(1, V, (2, 2), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        c = lm(IDS, cache=lm.new_cache())['cache']
        fresh = lm(torch.cat([IDS, nxt], 1))['logits'][:, 5:]
        a, b = lm(nxt, cache=c.fork())['logits'], lm(nxt, cache=c.fork())['logits']
        torch.testing.assert_close(a, fresh, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b, fresh, atol=1e-5, rtol=1e-5)
        lm(nxt, cache=c)
        with pytest.raises(ValueError, match=r"continued by an earlier call.*out\['cache'\].*fork"):
            lm(nxt, cache=c)


@pytest.mark.parametrize('other', ['model', 'encoding', 'batch', 'depth', 'not a cache'])
def test_cache_of_another_model_encoding_batch_or_depth(other):
    lm = lm_of()
    with torch.no_grad():
        c = lm(IDS, cache=lm.new_cache())['cache']
        call, names = {
            'model': (lambda: lm_of(seed=1)(IDS[:, :1], cache=c), 'cache belongs to another model'),
            'encoding': (lambda: lm_of('alibi')(IDS[:, :1], cache=c), 'cache belongs to another model'),
            'batch': (lambda: lm(IDS[:1, :1], cache=c), 'cache holds a batch of 2 rows but input_ids has 1'),
            'depth': (
                lambda: lm(IDS[:, :1], cache=LMCache(c.layers[:1], c.mask, c.model)),
                'cache has 1 layers but the model has 2',
            ),
            'not a cache': (lambda: lm(IDS[:, :1], cache=[]), 'cache must be an LMCache'),
        }[other]
        with pytest.raises(ValueError, match='cache') as e:
            call()
        assert names in str(e.value) and 'ctx' not in str(e.value)


def test_interrupted_call_leaves_the_cache_consistent():
    lm, nxt = lm_of('learned'), torch.randint(1, V, (2, 2), generator=torch.Generator().manual_seed(1))

    class Fails(nn.Module):
        def forward(self, *a):
            raise KeyboardInterrupt

    with torch.no_grad():
        c = lm(IDS, cache=lm.new_cache())['cache']
        keep, lm.layers[1] = lm.layers[1], Fails()
        with pytest.raises(KeyboardInterrupt):
            lm(nxt, cache=c)
        lm.layers[1] = keep
        assert [len(x) for x in c.layers] == [5, 5] and len(c) == 5
        torch.testing.assert_close(
            lm(nxt, cache=c)['logits'], lm(torch.cat([IDS, nxt], 1))['logits'][:, 5:], atol=1e-5, rtol=1e-5
        )
        # a table overrun mid-decoding: the error, and the cache as it was
        c = lm(torch.randint(1, V, (2, 15)), cache=lm.new_cache())['cache']
        with pytest.raises(ValueError, match='outside the learned position table'):
            lm(nxt, cache=c)
        assert [len(x) for x in c.layers] == [15, 15] and c.spent is None


def test_causal_with_more_queries_than_keys_is_an_error():
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 2, 8)
    for fast in (True, False):
        with pytest.raises(
            ValueError, match='causal=True needs at least as many keys as queries.*i=4 queries and j=2 keys'
        ):
            attend(q, k, k, causal=True, fast=fast)


# ---------------------------------------------------------------- empty inputs, over the registry


@pytest.mark.parametrize('fast', [True, False])
@pytest.mark.parametrize('terms', [False, True])
def test_attend_with_no_keys_gives_zero_rows(fast, terms):
    q, k = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 0, 8)
    out = attend(q, k, k, [torch.zeros(1, 3, 4, 0)] if terms else (), fast=fast)
    assert out.shape == (2, 3, 4, 8) and not out.any()
    out, probs = attend(q, k, k, return_probs=True)
    assert probs.shape == (2, 3, 4, 0) and not out.any()


@pytest.mark.parametrize('pe', ENCODINGS)
def test_empty_sequence_in_the_encoder_and_the_causal_lm(pe):
    x = torch.zeros(2, 0, dtype=torch.long)
    assert Encoder(small_cfg(pe)).eval()(x)['hidden_states'].shape == (2, 0, 16)
    lm = lm_of(pe)
    assert lm(x)['logits'].shape == (2, 0, V)
    out = lm(x, cache=lm.new_cache())
    assert out['logits'].shape == (2, 0, V) and len(out['cache']) == 0


# ---------------------------------------- NaN and inf: the fused path as the manual one


def _both(q, k, v, terms=(), mask=None):
    return attend(q, k, v, terms, mask, fast=True), attend(q, k, v, terms, mask, fast=False)


@pytest.mark.parametrize('mask', [False, True])
def test_nan_score_term_row_stays_nan_on_the_fused_path(mask):
    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))
    t = torch.zeros(1, 2, 3, 3)
    t[0, 0, 1] = float('nan')
    m = torch.tensor([True, True, False])[None, None, None] if mask else None
    fast, manual = _both(q, k, v, [t], m)
    assert fast[0, 0, 1].isnan().all() and manual[0, 0, 1].isnan().all()
    assert torch.equal(fast.isnan(), manual.isnan())


@pytest.mark.parametrize('val', [float('inf'), float('-inf'), float('nan')])
@pytest.mark.parametrize('row', [True, False])
@pytest.mark.parametrize('pe', ENCODINGS)
def test_non_finite_query_gives_nan_on_both_paths(pe, val, row):
    "Before: a ±inf (or NaN) query row gave 0 on the fused path (deberta, huang4, learned, none, sinusoidal)."
    enc = build_encoding(small_cfg(pe)).eval()
    pos = torch.arange(5)[None]
    ctx = enc.prepare(pos, pos)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    if row:
        q[0, 0, 1, :] = val
    else:
        q[0, 0, 1, 0] = val
    for mask in (None, torch.tensor([True] * 4 + [False])[None, None, None]):
        with torch.no_grad():
            fast = position_attention(enc, q, k, v, ctx, 0, mask, fast=True)
            manual = position_attention(enc, q, k, v, ctx, 0, mask, fast=False)
        assert fast[0, 0, 1].isnan().all(), (pe, val, mask)
        assert torch.equal(fast.isnan(), manual.isnan()), (pe, val, mask)


def test_fp32_term_above_fp16_range_agrees():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g).half() for _ in range(3))
    t = torch.zeros(1, 2, 3, 3)
    t[..., 0] = 1e5
    t[0, 1, 2] = torch.tensor([7e4, 7e4 + 1.0, -2e5])
    fast, manual = _both(q, k, v, [t])
    assert fast.isfinite().all() and manual.isfinite().all()
    torch.testing.assert_close(fast.float(), manual.float(), atol=2e-3, rtol=2e-3)


# ---------------------------------------------------------------- share_layers, the registry, add_relative


@pytest.mark.parametrize('pe', ['shaw', 'huang4'])
@pytest.mark.parametrize('n_layers', [2, 3])
def test_share_layers_with_several_layers(pe, n_layers):
    cfg = ModelConfig(
        vocab_size=V,
        d_model=16,
        n_heads=2,
        n_layers=n_layers,
        d_ff=32,
        pe=pe,
        max_position_embeddings=16,
        pe_kwargs={'share_layers': True},
    )
    model = Encoder(cfg)
    assert len(list(model.pe.parameters())) == {'shaw': 2, 'huang4': 1}[pe]  # one table (shaw: keys, values)
    model(torch.randint(1, V, (2, 7)))['hidden_states'].sum().backward()
    assert all(p.grad is not None for p in model.pe.parameters())


def test_share_layers_from_the_cli(tmp_path, capsys):
    "The smoke preset has one layer: two, as the issue's failing command had."
    out, pe = tmp_path / 'run', ['--pe', 'shaw', '--pe-kwargs', '{"share_layers": true}']
    args = '--preset smoke --n-layers 2 --steps 2 --eval-every 2 --save-every 2 --log-every 1 --quiet'.split()
    assert main(['pretrain', *pe, *args, '--out', str(out)]) == 0, capsys.readouterr().err
    assert json.loads((out / 'summary.json').read_text())['steps'] == 2


def test_factory_returning_a_linear_layer_is_refused(monkeypatch):
    from posenc_lit import core

    # the registry as it was after the test: later tests in this worker walk it
    monkeypatch.setattr(core, '_REGISTRY', dict(core._REGISTRY))

    @register_encoding('issue40-linear', 'score', 'a factory that returns nn.Linear', replace=True)
    def _linear(cfg):
        return nn.Linear(2, 2)

    with pytest.raises(TypeError, match=r"'issue40-linear'.*_linear\) returned Linear.*PositionEncoding"):
        ModelConfig(pe='issue40-linear')
    with pytest.raises(TypeError, match=r"'issue40-linear'.*returned Linear"):
        ModelConfig(add_relative='issue40-linear')


@pytest.mark.parametrize('name', ['tupe-a', 'tupe-r'])
def test_add_relative_tupe_message(name):
    with pytest.raises(ValueError, match=f"add_relative='{name}' must name a relative encoding") as e:
        ModelConfig(add_relative=name)
    msg = str(e.value)
    assert 'with an absolute table' in msg
    valid = msg.split('Relative ones: ')[1].split(', ')
    assert 'tupe-a' not in valid and 'tupe-r' not in valid and 'huang4' in valid


# ---------------------------------------------------------------- checkpoints: lengths and --resume


@pytest.fixture(scope='module')
def stopped_runs(tmp_path_factory):
    "Two smoke runs stopped at step 10 (seeds 0 and 1)."
    d = tmp_path_factory.mktemp('stopped')
    procs = [cli(*SMOKE, '--stop-at', '10', '--seed', str(s), '--out', str(d / f'seed{s}')) for s in (0, 1)]
    for p in procs:
        assert p.wait(300) == 0, p.stderr.read()
    return d


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_lengths_on_a_checkpoint_without_trainer_state(stopped_runs, tmp_path, capsys):
    run = _copy(stopped_runs / 'seed0', tmp_path / 'run')
    (run / 'checkpoint' / 'trainer_state.json').unlink()
    assert main(['lengths', '--run', str(run), '--lengths', '32', '--max-tokens', '64']) == 0
    text = capsys.readouterr().out
    assert (
        'step None' not in text
        and 'no readable trainer_state.json: the step it was saved at is unknown' in text
    )
    (run / 'checkpoint' / 'trainer_state.json').write_text('{not json')
    assert main(['lengths', '--run', str(run), '--lengths', '32', '--max-tokens', '64']) == 0
    assert 'the step it was saved at is unknown' in capsys.readouterr().out


def test_resume_refuses_an_edited_step(stopped_runs, tmp_path, capsys):
    run = _copy(stopped_runs / 'seed0', tmp_path / 'run')
    f = run / 'checkpoint' / 'trainer_state.json'
    st = json.loads(f.read_text())
    f.write_text(json.dumps({**st, 'step': 15, 'micro_step': 15, 'run_n': 0}))
    before = (run / 'metrics.jsonl').read_text()
    assert main([*SMOKE, '--resume', '--out', str(run)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and 'was changed after its save' in err, err
    assert (run / 'metrics.jsonl').read_text() == before


def test_resume_refuses_another_runs_weights(stopped_runs, tmp_path, capsys):
    run = _copy(stopped_runs / 'seed0', tmp_path / 'run')
    w = run / 'checkpoint' / 'model.safetensors'
    shutil.copy(stopped_runs / 'seed1' / 'checkpoint' / 'model.safetensors', w)
    assert main([*SMOKE, '--resume', '--out', str(run)]) == 2
    err = capsys.readouterr().err
    assert str(w) in err and "another run's file copied in" in err, err


def test_resume_of_an_untouched_checkpoint_still_works(stopped_runs, tmp_path, undisturbed, capsys):
    run = _copy(stopped_runs / 'seed0', tmp_path / 'run')
    assert main([*SMOKE, '--resume', '--out', str(run)]) == 0
    assert records(run) == records(undisturbed) and summary(run) == summary(undisturbed)


# ============================================================================ contexts prepared under no_grad


@pytest.mark.parametrize('pe', ENCODINGS)
def test_context_prepared_under_no_grad(pe):
    """A context made under `torch.no_grad()` and used with gradients on: where it holds terms made from the
    encoding's parameters (a float tensor), a `ValueError` naming no_grad (those parameters would silently not
    train); a context of indices only stays usable; under `no_grad` every context is used as before."""
    from posenc_lit.attention import MultiHeadAttention

    torch.manual_seed(0)
    enc = build_encoding(small_cfg(pe))
    mha = MultiHeadAttention(16, 2, layer_idx=0)  # layer 0 of the encoding's per-layer tables
    x, pos = torch.randn(2, 5, 16), torch.arange(5)[None]
    with torch.no_grad():
        ctx = enc.prepare(pos, pos)
        mha(x, pe=enc, ctx=ctx)  # used where it was made: fine
    floats = any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vars(ctx).values())
    if floats and any(p.requires_grad for p in enc.parameters()):
        with pytest.raises(ValueError, match=r'prepared under torch\.no_grad\(\).*would silently not train'):
            mha(x, pe=enc, ctx=ctx)
    else:
        mha(x, pe=enc, ctx=ctx).sum().backward()
    mha(x, pe=enc, ctx=enc.prepare(pos, pos)).sum().backward()  # prepared with gradients on: trains
