"""Adversarial small inputs against what landed with the causal decoder, FIRE, CoPE, RoPE-Mixed and the fused path.

Each test asserts the right behaviour for an input that broke it (the reproduction is the test):
- CoPE and non-finite values: a NaN query or key made its positions NaN, and `cope_interpolate` turned NaN into an
  index (a RuntimeError, index out of bounds); a NaN padding key (gate·0 = NaN) or a NaN key after the query in a
  causal row reached the counts of other keys. NaN must pass through as through the manual path of any encoding:
  NaN in the rows that read it, nothing elsewhere.
- The fused path with an empty batch (b = 0) or no heads: an IndexError / ZeroDivisionError inside FlexAttention
  (the manual and SDPA paths return an empty result).
"""
import pytest
import torch

from posenc_lit.attention import MultiHeadAttention, PositionEncoding, attend, position_attention
from posenc_lit.causal_lm import CausalLM
from posenc_lit.cope import CoPE
from posenc_lit.fire import FIRE
from posenc_lit.t5 import T5RelativeBias

NAN = float('nan')


def qkv(n=4, d=4, b=1, h=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, d, generator=g) for _ in range(3))


def cope_attention(pe, q, k, v, key_mask=None, causal=False, fast=False):
    pos = torch.arange(q.shape[2])[None]
    ctx = pe.prepare(pos, pos, key_mask=key_mask, causal=causal)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    return position_attention(pe, q, k, v, ctx, 0, mask, causal=causal, fast=fast)


@pytest.mark.parametrize('bidirectional', [True, False])
def test_cope_nan_query_gives_nan_in_its_row_only(bidirectional):
    "A NaN query: its row NaN, the other rows as without it (was a RuntimeError: index out of bounds)."
    pe = CoPE(4, 1, bidirectional=bidirectional, init_std=1.0)
    q, k, v = qkv()
    q[..., 1, :] = NAN
    with torch.no_grad():
        out = cope_attention(pe, q, k, v, causal=not bidirectional)
    assert out[..., 1, :].isnan().all()
    assert out[..., [0, 2, 3], :].isfinite().all()


def test_cope_nan_in_a_padding_key_stays_out():
    "A padding key holding NaN counts nothing and reaches no row (its gate was 0·NaN = NaN)."
    pe = CoPE(4, 1, init_std=1.0)
    q, k, v = qkv()
    k[..., 2, :], v[..., 2, :] = NAN, NAN
    keep = torch.tensor([[True, True, False, True]])
    with torch.no_grad():
        out = cope_attention(pe, q, k, v, key_mask=keep)
        ref = cope_attention(pe, q, k.nan_to_num(0.0), v.nan_to_num(0.0), key_mask=keep)
    assert out.isfinite().all()
    torch.testing.assert_close(out, ref)


def test_cope_causal_nan_in_a_later_key_leaves_earlier_rows():
    """Causal CoPE: a NaN key after the query is not seen, so it must not make the row NaN (0·NaN in the
    count), as on the manual path without CoPE (a NaN value would: probability 0 times NaN)."""
    pe = CoPE(4, 1, bidirectional=False, init_std=1.0)
    q, k, v = qkv()
    k[..., 3, :] = NAN
    with torch.no_grad():
        out = cope_attention(pe, q, k, v, causal=True)
        ref = attend(q, k, v, causal=True, fast=False)
    assert out[..., :3, :].isfinite().all() and ref[..., :3, :].isfinite().all()
    assert out[..., 3, :].isnan().all() and ref[..., 3, :].isnan().all()


def nan_rows(pe, cache=False):
    "Which logits rows are NaN when token 9's embedding is NaN (row 1: it is padding; column 9, tied, left out)."
    torch.manual_seed(0)
    lm = CausalLM(10, 16, 2, 2, 16, pe=pe).eval()
    ids = torch.tensor([[1, 2, 9, 3, 4], [9, 1, 2, 3, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]).bool()
    with torch.no_grad():
        lm.word.weight[9] = NAN
        if not cache:
            return lm(ids, attention_mask=mask, fast=False)['logits'][..., :9].isnan().any(-1)
        o = lm(ids[:, :3], attention_mask=mask[:, :3], cache=lm.new_cache())
        o2 = lm(ids[:, 3:], attention_mask=mask, cache=o['cache'])
        return torch.cat([o['logits'], o2['logits']], 1)[..., :9].isnan().any(-1)


@pytest.mark.parametrize('cache', [False, True])
def test_causal_lm_nan_token_with_cope_as_without(cache):
    "CoPE in the CausalLM: the rows NaN that NoPE makes NaN (was a RuntimeError), the padding row finite."
    ref = nan_rows(PositionEncoding())
    assert not ref[1, 1:].any() and ref[0, 2:].all()
    assert torch.equal(nan_rows(CoPE(8, 2), cache), ref)


@pytest.mark.parametrize('shape', [(0, 2, 3, 8), (2, 0, 3, 8)])
def test_fused_empty_batch_or_no_heads(shape):
    "attend(fast='fused') with b = 0 or h = 0 returns the empty result (was an IndexError / ZeroDivisionError)."
    q = torch.randn(*shape)
    terms = [torch.randn(1, shape[1], 3, 3)]
    with torch.no_grad():
        for t in ((), terms):
            assert attend(q, q, q, t, fast='fused').shape == shape
            assert attend(q, q, q, t, fast=False).shape == shape


@pytest.mark.parametrize('pe', [FIRE(2, 1), T5RelativeBias(2), PositionEncoding()], ids=['fire', 't5', 'none'])
def test_fused_empty_batch_through_the_models(pe):
    "An empty batch through the CausalLM and MultiHeadAttention on the fused path, as on the default path."
    lm = CausalLM(10, 16, 2, 1, 16, pe=pe).eval()
    with torch.no_grad():
        assert lm(torch.zeros(0, 4, dtype=torch.long), fast='fused')['logits'].shape == (0, 4, 10)
        assert MultiHeadAttention(16, 2)(torch.randn(0, 4, 16), pe=pe, fast='fused').shape == (0, 4, 16)


def test_fused_checks_the_terms_shape_as_the_manual_path():
    "FIRE's context for another batch: the fused path says so as the manual path does (was a RuntimeError)."
    pe, pos = FIRE(1, 1), torch.arange(3).expand(3, 3)  # a context for 3 rows
    q, k, v = qkv(n=3, b=2)
    ctx = pe.prepare(pos, pos)
    with torch.no_grad():
        for fast in (False, 'fused'):
            with pytest.raises(ValueError, match='do not fit q'):
                position_attention(pe, q, k, v, ctx, 0, fast=fast)


def test_cope_key_mask_of_another_batch():
    "A key_mask of 3 rows for a batch of 2: a ValueError naming it (was a RuntimeError from a broadcast)."
    pe, pos = CoPE(4, 1), torch.arange(3)[None]
    q, k, v = qkv(n=3, b=2)
    ctx = pe.prepare(pos, pos, key_mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match='key_mask of 3 rows'):
        position_attention(pe, q, k, v, ctx, 0)


@pytest.mark.parametrize('name', ['n_layers', 'num_prefix_tokens', 'd_head', 'n_heads'])
def test_vit_pe_kwargs_that_the_model_sets(name):
    "`vit --pe rope-mixed --pe-kwargs '{\"n_layers\": 3}'` says the model sets it (was: 'check the types')."
    from posenc_lit.vit import ViTConfig

    with pytest.raises(ValueError, match=f"pe_kwargs cannot set '{name}': pe='rope-mixed' takes it from the model"):
        ViTConfig(pe='rope-mixed', pe_kwargs={name: 3})
