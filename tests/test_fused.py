"""Fused path (issue 42, `03_fused`): FlexAttention with the encodings' `score_mods` against the manual path.

- Every registered encoding (text and image) and a few options the registry's defaults do not reach (Shaw
  without values, causal T5 and ALiBi, DeBERTa with log buckets, c2p only, shared keys, TUPE-R's reset, a
  combined encoding): the fused scores (`fused_scores`, the index functions on the whole grid) equal
  `position_scores`, and the fused outputs equal the manual ones (fp32, 1e-5), bidirectional, causal, with
  left padding (per-sequence positions, a key mask), and a cached-decoding step (3 queries, 11 keys).
- On CPU FlexAttention runs forward only (no backward in PyTorch 2.13): the forward runs under no_grad; the
  gradient parity runs where CUDA is (the GPU script, tools/gpu_fused.py, runs it too) and is skipped here
  with that reason. An encoding without `score_mods` is skipped with its name; Shaw's value term is refused,
  by name.
- The rule: `fast=True` on CPU keeps the paths of 01_attention; with CPU in `FUSED_AUTO` it takes the fused
  path.
"""

import pytest
import torch
import torch.nn as nn
import posenc_lit.attention as A
from posenc_lit.core import LayerRef, list_encodings
from posenc_lit.attention import (
    CombinedEncoding,
    KVCache,
    MultiHeadAttention,
    default_positions,
    position_attention,
    position_scores,
)
from posenc_lit.fused import fused_scores
from posenc_lit.model import ModelConfig
from posenc_lit.vit import ViTConfig
from posenc_lit.relative import Shaw, HuangMethod4
from posenc_lit.t5 import T5RelativeBias
from posenc_lit.alibi import ALiBi
from posenc_lit.deberta import DebertaRelative
from posenc_lit.tupe import TUPE

TEXT = dict(vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_position_embeddings=24)
B, H, D_HEAD, D = 2, 2, 8, 16
TOL = dict(atol=1e-5, rtol=1e-5)


def _text(name):
    return list_encodings()[name].factory(ModelConfig(**TEXT, pe=name)), {}


def _image(name):
    cfg = ViTConfig(image_size=(12, 16), patch_size=4, d_model=D, n_heads=H, n_layers=2, d_ff=32, pe=name)
    return list_encodings('image')[name].factory(cfg), {'grid': cfg.grid}


EXTRA = {
    'shaw(values=False)': lambda: Shaw(D_HEAD, 2, k=3, values=False),
    'huang4(k=2)': lambda: HuangMethod4(D_HEAD, 2, k=2),
    't5(causal buckets)': lambda: T5RelativeBias(H, num_buckets=8, max_distance=6, bidirectional=False),
    't5(max_distance=4)': lambda: T5RelativeBias(H, num_buckets=8, max_distance=4),
    'alibi(causal form)': lambda: ALiBi(H, bidirectional=False),
    'deberta(log buckets)': lambda: DebertaRelative(D, H, 2, k=8, position_buckets=4),
    'deberta(c2p)': lambda: DebertaRelative(D, H, 2, k=6, pos_att_type=['c2p']),
    'deberta(share_att_key)': lambda: DebertaRelative(D, H, 2, k=6, share_att_key=True),
    'tupe-r(reset_relative)': lambda: TUPE(D, H, 24, relative=True, reset_relative=True),
    'alibi+huang4': lambda: CombinedEncoding(ALiBi(H), HuangMethod4(D_HEAD, 2, k=3)),
}
CASES = [('text', n) for n in list_encodings()] + [('image', n) for n in list_encodings('image')]
CASES += [('extra', n) for n in EXTRA]


def _build(modality, name):
    torch.manual_seed(0)
    if modality == 'extra':
        pe, extra = EXTRA[name](), {}
    else:
        pe, extra = (_text if modality == 'text' else _image)(name)
    for p in pe.parameters():  # visible terms: the defaults start near 0 (T5, TUPE's θ, ...)
        nn.init.normal_(p, std=0.5)
    torch.manual_seed(1)
    pe.lend_projections(1, nn.Linear(D, D), nn.Linear(D, D))  # layer 1's, for DeBERTa's share_att_key
    return pe.eval(), extra


def _layer():  # the address of layer 1 (its projections are lent by _build)
    return LayerRef(1)


def _settings(modality, extra):
    "(label, q_pos, k_pos, key_mask (b, j) or None, causal): the calls a model makes."
    n = 1 + extra['grid'][0] * extra['grid'][1] if extra else 9
    pos = default_positions(n)
    keep = torch.ones(B, n, dtype=torch.bool)
    keep[1, :3] = False  # left padding: the real tokens of sequence 1 start at position 0
    shifted = (torch.arange(n) - torch.tensor([[0], [3]])).clamp(min=0)  # (b, n)
    out = [('bidirectional', pos, pos, None, False), ('causal', pos, pos, None, True)]
    if modality == 'image':  # a ViT attends bidirectionally over its fixed grid
        return out[:1] + [('padding', pos.expand(B, n), pos.expand(B, n), keep, False)]
    out += [('padding', shifted, shifted, keep, False), ('padding+causal', shifted, shifted, keep, True)]
    return out + [('cache (3 of 11 keys)', torch.arange(8, 11)[None], torch.arange(11)[None], None, True)]


def _inputs(q_pos, k_pos):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(B, H, q_pos.shape[-1], D_HEAD, generator=g)
    k, v = (torch.randn(B, H, k_pos.shape[-1], D_HEAD, generator=g) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize('modality,name', CASES)
def test_fused_equals_manual(modality, name):
    pe, extra = _build(modality, name)
    layer = _layer()
    for label, q_pos, k_pos, keep, causal in _settings('image' if extra else 'text', extra):
        # keys ahead at bias 0, or in the query's own bucket: refused (test_contract_breaks F6, F9)
        if name in ('alibi(causal form)', 't5(causal buckets)') and not causal:
            with pytest.raises(ValueError, match=r"(ALiBi|T5RelativeBias) is a causal form here \(causal_only\)"):
                pe.prepare(q_pos, k_pos, key_mask=keep, causal=causal)
            continue
        q, k, v = _inputs(q_pos, k_pos)
        mask = None if keep is None else keep[:, None, None, :]  # (b, 1, 1, j)
        with torch.no_grad():
            ctx = pe.prepare(q_pos, k_pos, key_mask=keep, causal=causal, **extra)
            tq, tk = pe.transform_qk(q, k, ctx, layer)
            if pe.score_mods(tq, tk, ctx, layer) is None:
                pytest.skip(f'{name}: its score_mods returns None (no fused terms): manual path only')
            sf = fused_scores(pe, q, k, ctx, layer, mask, causal)
            sm = position_scores(pe, q, k, ctx, layer, mask, causal)
            assert torch.equal(sf.isfinite(), sm.isfinite()), label
            torch.testing.assert_close(sf[sm.isfinite()], sm[sm.isfinite()], **TOL, msg=label)
            if pe.value_terms(ctx, layer):  # Shaw's a^V: scores fuse, outputs stay on the manual path
                with pytest.raises(ValueError, match="value terms read the probabilities"):
                    position_attention(pe, q, k, v, ctx, layer, mask, fast='fused', causal=causal)
                continue
            out = position_attention(pe, q, k, v, ctx, layer, mask, fast='fused', causal=causal)
            ref = position_attention(pe, q, k, v, ctx, layer, mask, fast=False, causal=causal)
            torch.testing.assert_close(out, ref, **TOL, msg=label)


# registered encodings without index functions, each with the reason (an encoding added later lands here or
# gets a `score_mods`)
NOT_FUSED = {
    # q_i·e[p_ij] with p_ij = Σ_{k=j..i} σ(q_i·k_k): a scan over the keys between j and i, which an index
    # function of one entry (a score_mod) cannot compute; CoPE runs on the manual path
    'cope': 'its positions are cumulative sums of gates over keys, not a function of one (i, j) entry',
}


def test_every_score_term_encoding_is_fused():
    "The registered encodings all give index functions, or are listed in NOT_FUSED with the reason."
    for modality, name in CASES[: len(CASES) - len(EXTRA)]:
        pe, extra = _build(modality, name)
        q_pos = default_positions(1 + extra['grid'][0] * extra['grid'][1] if extra else 9)
        ctx = pe.prepare(q_pos, q_pos, **extra)
        q, k, _ = _inputs(q_pos, q_pos)
        with torch.no_grad():
            fused = pe.score_mods(q, k, ctx, _layer()) is not None
        assert fused != (name in NOT_FUSED), (
            f'{modality} encoding {name!r}: give it a score_mods (03_fused) or list it in NOT_FUSED with why'
            if not fused
            else f'{name!r} is fused now: take it out of NOT_FUSED'
        )


@pytest.mark.parametrize('name', ['alibi', 'huang4', 'deberta', 't5', 'rope'])
def test_cached_decoding_fused(name):
    "A KV cache fed one token at a time on the fused path equals the full causal forward on the manual path."
    pe, _ = _build('text', name)
    torch.manual_seed(3)
    mha = MultiHeadAttention(D, H, layer_idx=1).eval()
    x = torch.randn(B, 6, D)
    with torch.no_grad():
        full = mha(x, pe=pe, causal=True, fast=False)
        cache = KVCache()
        steps = [mha(x[:, :2], pe=pe, causal=True, cache=cache, fast='fused')]
        steps += [mha(x[:, t : t + 1], pe=pe, causal=True, cache=cache, fast='fused') for t in range(2, 6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)


def test_the_rule():
    pe, _ = _build('text', 'alibi')
    pos = default_positions(9)
    q, k, v = _inputs(pos, pos)
    ctx = pe.prepare(pos, pos)
    assert not A.use_fused(True, q)  # CPU: the default keeps the paths of 01_attention
    with pytest.raises(ValueError, match='no backward on CPU'):  # gradients on
        position_attention(pe, q, k, v, ctx, 0, fast='fused')
    with torch.no_grad():
        with pytest.raises(ValueError, match='no attention dropout'):
            position_attention(pe, q, k, v, ctx, 0, fast='fused', dropout_p=0.1)
        with pytest.raises(ValueError, match='keeps no probabilities'):
            position_attention(pe, q, k, v, ctx, 0, fast='fused', return_probs=True)


def test_fast_true_takes_the_fused_path_where_the_rule_says(monkeypatch):
    pe, _ = _build('text', 'deberta')
    pos = default_positions(9)
    q, k, v = _inputs(pos, pos)
    calls = []
    real = A.attend_fused
    monkeypatch.setattr(A, 'attend_fused', lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with torch.no_grad():
        ctx = pe.prepare(pos, pos)
        ref = position_attention(pe, q, k, v, ctx, 0)
        assert calls == []  # CPU is not in FUSED_AUTO
        monkeypatch.setattr(A, 'FUSED_AUTO', ('cpu',))
        position_attention(pe, q, k, v, ctx, 0)
        assert calls == []  # d = 8: not a head dimension the rule takes by itself
        monkeypatch.setattr(A, '_AUTO_HEAD_DIMS', (D_HEAD,))
        out = position_attention(pe, q, k, v, ctx, 0)
        assert calls == [1]
        assert position_attention(pe, q, k, v, ctx, 0, dropout_p=0.0, return_probs=True)[0].shape == out.shape
        assert calls == [1]  # return_probs: the manual path
        with pytest.raises(ValueError, match=r'dropout_p is a probability in \[0, 1\]'):  # checked as before
            position_attention(pe, q, k, v, ctx, 0, dropout_p=-0.1)
        assert calls == [1]
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize('name', ['alibi', 'huang4', 'deberta', 't5', 'tupe-r'])
def test_fused_gradients(name):
    if not torch.cuda.is_available():
        pytest.skip('FlexAttention has no backward on CPU (PyTorch 2.13): gradients are compared on a GPU')
    pe, _ = _build('text', name)
    pe = pe.cuda()
    pos = default_positions(64, 'cuda')
    q, k, v = (t.cuda() for t in _inputs(pos, pos))
    grads = []
    for fast in ('fused', False):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        pe.zero_grad()
        out = position_attention(pe, *xs, pe.prepare(pos, pos, causal=True), 1, fast=fast, causal=True)
        out.square().sum().backward()
        grads.append([out] + [x.grad for x in xs] + [p.grad for p in pe.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_fused_keeps_the_cores_edge_cases():
    "NaN in padding keys stays out, a fully masked row gives 0, a NaN query gives NaN: as the manual path."
    pe, _ = _build('text', 'huang4')
    pos = default_positions(7)
    q, k, v = _inputs(pos, pos)
    keep = torch.ones(B, 7, dtype=torch.bool)
    keep[1, 4:] = False
    k[1, :, 5], v[1, :, 6] = float('nan'), float('nan')  # padding keys holding NaN
    q[0, 1, 2, 0] = float('nan')  # one NaN query
    mask = keep[:, None, None, :] & torch.ones(B, 1, 7, 1, dtype=torch.bool)
    mask[0, :, 3] = False  # query 3 of sequence 0 sees no key
    with torch.no_grad():
        ctx = pe.prepare(pos, pos)
        out, ref = (position_attention(pe, q, k, v, ctx, 0, mask, fast=f) for f in ('fused', False))
    assert out[0, :, 3].eq(0).all() and out[0, 1, 2].isnan().all()
    assert out.isnan().sum() == ref.isnan().sum() == D_HEAD
    torch.testing.assert_close(out, ref, **TOL, equal_nan=True)
