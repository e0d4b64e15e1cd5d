"""NaN and ±inf under masks: the fast path (SDPA) against the manual one (issue 41; the note "A key holding NaN or
±inf, under a mask" in 01_attention).

- A NaN in k at key t under the causal mask: every registered text encoding gives the same NaN pattern on the fast
  and the manual path (rows before t finite, rows from t NaN), with and without padding (SDPA adds the mask to q·k,
  and NaN + -inf would be NaN: the fast path zeroes such keys and sets NaN in the rows that may attend them).
- A key holding ±inf but no NaN: the documented difference, pinned: the fast path gives NaN in every row that may
  attend it; the manual path only where s·q·k is not -inf there.
- A NaN in v at key t reaches every row of the full forward on every path (0·NaN in p @ v), the rows before t
  included; decoding with a KV cache keeps the rows before t finite.
"""
import pytest
import torch
import torch.nn as nn
from posenc_lit.attention import (
    KVCache, MultiHeadAttention, attend, attend_fast, causal_mask, default_positions, position_attention,
)
from posenc_lit.core import list_encodings
from posenc_lit.model import ModelConfig

TEXT = dict(vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_position_embeddings=24)
B, H, N, D, T = 2, 2, 9, 8, 4  # batch, heads, length, head dim; the key or value position that holds a NaN


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, N, D, generator=g) for _ in range(3))


@pytest.mark.parametrize('name', sorted(list_encodings()))
@pytest.mark.parametrize('padded', [False, True])
def test_a_nan_key_spoils_only_the_rows_that_may_attend_it_on_every_path(name, padded):
    pe = list_encodings()[name].factory(ModelConfig(**TEXT, pe=name)).eval()
    q, k, v = _qkv()
    k[:, :, T] = float('nan')
    pos = default_positions(N)
    keep = torch.ones(B, N, dtype=torch.bool)
    if padded:
        keep[1, :2] = False  # left padding
    mask = keep[:, None, None, :] if padded else None
    with torch.no_grad():
        ctx = pe.prepare(pos, pos, key_mask=keep if padded else None, causal=True)
        fast, manual = (position_attention(pe, q, k, v, ctx, 0, mask, causal=True, fast=f) for f in (True, False))
    assert torch.equal(fast.isnan(), manual.isnan()), name
    assert manual[:, :, :T].isfinite().all() and manual[:, :, T:].isnan().all()
    torch.testing.assert_close(fast[:, :, :T], manual[:, :, :T], atol=1e-5, rtol=1e-5)


def test_a_nan_key_with_a_term_and_a_row_mask_on_the_fast_path():
    "A float term, a mask that differs by row (documents) and the causal mask: as the manual path."
    q, k, v = _qkv(1)
    k[0, 1, T] = float('nan')
    doc = torch.arange(N) >= 6  # two documents: 0..5 and 6..8
    mask = (doc[:, None] == doc[None, :])[None, None]  # (1, 1, i, j)
    term = torch.randn(1, H, N, N, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        fast, manual = (attend(q, k, v, [term], mask, causal=True, fast=f) for f in (True, False))
        alone = attend_fast(q, k, v, [term], mask & causal_mask(N, N))  # the public fast path, called directly
    assert torch.equal(fast.isnan(), manual.isnan()) and torch.equal(alone.isnan(), manual.isnan())
    assert manual[0, 1, T:6].isnan().all() and manual[0, 1, 6:].isfinite().all()  # the other document: finite
    ok = ~manual.isnan()
    torch.testing.assert_close(fast[ok], manual[ok], atol=1e-5, rtol=1e-5)


def test_an_inf_key_the_documented_difference():
    """k[t] = (-inf, 0, …): s·q·k is -inf where q[0] > 0 (the key gets probability 0, the manual row is finite) and
    +inf where q[0] < 0 (NaN). The fast path cannot tell without the products inside the kernel: NaN in every row
    that may attend key t; the rows before t are finite on both paths."""
    q, k, v = _qkv(3)
    k[:, :, T] = 0.0
    k[:, :, T, 0] = float('-inf')
    with torch.no_grad():
        fast, manual = (attend(q, k, v, causal=True, fast=f) for f in (True, False))
    rows = fast.isnan().any(-1)  # (b, h, i)
    assert not rows[..., :T].any() and rows[..., T:].all()
    assert torch.equal(manual.isnan().any(-1)[..., T:], q[..., T:, 0] < 0)
    assert (q[..., T:, 0] > 0).any()  # the case exists in this draw: rows where the two paths differ


def test_a_nan_value_reaches_every_row_of_the_full_forward_but_not_cached_decoding():
    q, k, v = _qkv(4)
    v[:, :, T] = float('nan')
    with torch.no_grad():
        for fast in (True, False, 'fused'):
            out = attend(q, k, v, causal=True, fast=fast)
            assert out.isnan().all(), fast  # rows before t too: their p of key t is 0, and 0·NaN is NaN

    class NaNAt(nn.Module):  # the value projection, with a NaN value at absolute position T
        def __init__(self, lin):
            super().__init__()
            self.lin, self.seen = lin, 0

        def forward(self, x):  # (b, n, D)
            out = self.lin(x)
            if self.seen <= T < self.seen + x.shape[1]:
                out[:, T - self.seen] = float('nan')
            self.seen += x.shape[1]
            return out

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, H).eval()
    mha.v_proj = NaNAt(mha.v_proj)
    x = torch.randn(B, N, 16)
    with torch.no_grad():
        full = mha(x, causal=True)
        mha.v_proj.seen, cache = 0, KVCache()
        steps = torch.cat([mha(x[:, i : i + 1], causal=True, cache=cache) for i in range(N)], 1)
    assert full.isnan().all()
    assert steps[:, :T].isfinite().all() and steps[:, T:].isnan().all()


def _compiled(f, *args):  # f(*args) through torch.compile on CPU (Inductor); a clean skip where it cannot compile
    try:
        return torch.compile(f, backend='inductor')(*args)
    except Exception as e:  # noqa: BLE001 (the compiler's own errors: no C compiler, ...)
        pytest.skip(f'torch.compile (inductor, CPU) is unavailable here: {type(e).__name__}: {e}')


def test_nan_keys_and_queries_stay_nan_under_torch_compile():
    "Inductor folds x·0 to 0: `_nonfinite`'s eager sum trick would make NaN rows finite inside a compiled graph."
    torch._dynamo.reset()
    q, k, v = _qkv(5)
    k[:, :, T] = float('nan')
    q[0, 1, 1, 0] = float('inf')
    keep = torch.ones(B, 1, 1, N, dtype=torch.bool)
    with torch.no_grad():
        manual = attend(q, k, v, mask=keep, causal=True, fast=False)
        compiled = _compiled(lambda q, k, v, m: attend(q, k, v, mask=m, causal=True), q, k, v, keep)
    assert manual[:, :, T:].isnan().all() and manual[0, 1, 1].isnan().all()
    assert torch.equal(compiled.isnan(), manual.isnan())
    ok = ~manual.isnan()
    torch.testing.assert_close(compiled[ok], manual[ok], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('shape', [(N,), (N, N), (B, 1, 1, N), (1, H, N, N), (B, 1, N, N), (B, H, N, N)])
def test_the_rows_that_may_attend_a_bad_key_for_every_mask_shape(shape):
    from posenc_lit.attention import _nonfinite_keys

    g = torch.Generator().manual_seed(6)
    k = torch.randn(B, H, N, D, generator=g)
    k[0, 1, 2, 3], k[1, 0, 5, 0] = float('nan'), float('inf')
    mask = torch.rand(shape, generator=g) > 0.5
    _, rows = _nonfinite_keys(k, mask)
    want = (mask & ~k.isfinite().all(-1)[..., None, :]).any(-1, keepdim=True)  # (b, h, i, 1)
    assert torch.equal(rows.expand_as(want), want)


def test_attend_fast_takes_an_additive_float_mask_as_sdpa_does():
    q, k, v = _qkv(7)
    k[:, :, T] = float('nan')
    keep = causal_mask(N, N)
    additive = torch.zeros(N, N).masked_fill(~keep, float('-inf'))
    with torch.no_grad():
        a, b = attend_fast(q, k, v, mask=keep), attend_fast(q, k, v, mask=additive)
    assert torch.equal(a.isnan(), b.isnan()) and b[:, :, :T].isfinite().all() and b[:, :, T:].isnan().all()
    torch.testing.assert_close(a[:, :, :T], b[:, :, :T])


def test_the_check_builds_no_b_h_i_j_temporary():
    from torch.profiler import ProfilerActivity, profile

    from posenc_lit.attention import _nonfinite_keys

    b, h, n, d = 4, 8, 512, 16
    k, cm = torch.randn(b, h, n, d), causal_mask(n, n)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _nonfinite_keys(k, cm)
    peak = max(e.cpu_memory_usage for e in prof.events())
    assert peak <= k.numel() * 4 < b * h * n * n  # the copy of k (1 MiB), not b·h·i·j bools (8 MiB)


def test_fused_rows_left_empty_by_padding_and_causal_are_zero_as_on_the_manual_path():
    "Left padding plus causal=True: the first rows have no allowed key (0), NaN in a real value or not."
    q, k, v = _qkv(8)
    keep = torch.ones(B, 1, 1, N, dtype=torch.bool)
    keep[1, ..., :3] = False  # left padding: rows 0..2 of batch row 1 see only padding
    for nan in (False, True):
        if nan:
            v[1, :, 5] = float('nan')
        with torch.no_grad():
            fused, manual = (attend(q, k, v, mask=keep, causal=True, fast=f) for f in ('fused', False))
        assert (manual[1, :, :3] == 0).all() and (fused[1, :, :3] == 0).all(), nan
        assert torch.equal(fused.isnan(), manual.isnan())
        ok = ~manual.isnan()
        torch.testing.assert_close(fused[ok], manual[ok], atol=1e-5, rtol=1e-5)


def test_gradients_with_a_nan_key_the_documented_difference():
    "Manual path: a NaN in every row of dq, dk, dv; fast path: finite, dk 0 at the NaN key; the loss NaN on both."
    for mask in (None, torch.ones(B, 1, 1, N, dtype=torch.bool)):
        grads = {}
        for fast in (False, True):
            q, k, v = _qkv(9)
            k[:, :, T, 0] = float('nan')
            for t in (q, k, v):
                t.requires_grad_(True)
            loss = attend(q, k, v, mask=mask, causal=mask is None, fast=fast).sum()
            loss.backward()
            assert loss.isnan()
            grads[fast] = (q.grad, k.grad, v.grad)
        assert all(g.isnan().any(-1).all() for g in grads[False])  # a NaN in every row
        assert all(g.isfinite().all() for g in grads[True])
        assert (grads[True][1][:, :, T] == 0).all()
