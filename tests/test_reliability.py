"""Reliability (issue 8): clear errors for bad input, invariances every encoding must keep, finite numerics in half
precision and at long lengths, property-based fast == manual checks, training that loses nothing, and data files
that fail with the file and line.

Every encoding test is parametrized over `list_encodings()`, so an encoding registered later is covered without
editing this file. Where an encoding's expected behaviour differs by design, the test selects by a property of the
encoding — `kind`, `relative_only` (see `PositionEncoding.relative_only`) or the model's `emd_steps` — never by name.
"""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')  # before datasets is imported

import gzip, json, signal, subprocess, sys, time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import cut_with_sigterm
from posenc_lit.checks import PositionRangeError
from posenc_lit.core import list_encodings
from posenc_lit.absolute import LearnedEncoding
from posenc_lit.alibi import ALiBi
from posenc_lit.attention import attend, MultiHeadAttention, position_attention
from posenc_lit.model import ModelConfig, EncoderForMLM, CheckpointError
from posenc_lit.data import corpus_dir, CorpusError, load_corpus
from posenc_lit import training, loop
from posenc_lit.training import make_train_config, pretrain, RunDirError

ENCODINGS = sorted(list_encodings())
V = 50           # vocabulary of the tiny models
N = 9            # tokens of the real sequences


def tiny(name, emd_steps=0, max_pos=32, d_model=32, n_heads=4, n_layers=2, dtype=torch.float64, seed=0, **kw):
    "A tiny eval-mode model whose position signal is strong: the encoding's parameters are redrawn with std 0.3."
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=V, d_model=d_model, n_heads=n_heads, n_layers=n_layers, d_ff=2 * d_model,
                      max_position_embeddings=max_pos, pe=name, dropout=0.0, attn_dropout=0.0, initializer_range=0.2,
                      emd_steps=emd_steps, **kw)
    m = EncoderForMLM(cfg)
    with torch.no_grad():   # at the default init (std 0.02) position terms are tiny and an invariance test would be weak
        for n_, p in m.encoder.pe.named_parameters():
            if 'ln' not in n_ and 'norm' not in n_: p.normal_(0, 0.3)
        if getattr(m, 'emd', None) is not None: m.emd.pos.weight.normal_(0, 0.3)
    return m.to(dtype).eval()


# The variants every invariance test runs: each encoding, and each one again with DeBERTa's Enhanced Mask Decoder
# (which adds absolute positions before the MLM head, for any encoding).
VARIANTS = [pytest.param(n, 0, id=n) for n in ENCODINGS] + [pytest.param(n, 2, id=f'{n}+emd') for n in ENCODINGS]


def states(m, ids, fast=True, **kw):
    "MLM-head input states `(b, n, D)` (the Enhanced Mask Decoder's output when the model has one)."
    for l in m.encoder.layers: l.fast = fast
    with torch.no_grad(): return m(ids, **kw)['hidden_states']


def close(a, b, tol=1e-9):
    err = (a - b).abs().max().item()
    assert err < tol, f'max abs difference {err:.3g} ≥ {tol:g}'


@pytest.fixture
def ids():
    return torch.randint(5, V, (2, N), generator=torch.Generator().manual_seed(1))


# ============================================================================ 1. validation at every public entry

def _bad_inputs():
    "(id, call, exception, regex): each public entry given one bad argument; the message names it and what is allowed."
    q = torch.randn(2, 4, 7, 8)
    m = tiny('learned', max_pos=16, dtype=torch.float32)
    ids = torch.randint(5, V, (2, N))
    mha = MultiHeadAttention(16, 4)
    seg = tiny('none', dtype=torch.float32, type_vocab_size=2)
    return [
        ('attend-q-rank', lambda: attend(q[0], q, q), ValueError, r'q must be a floating-point tensor of shape \(b, h, n, d\); got torch\.float32 tensor of shape \(4, 7, 8\)'),
        ('attend-int-v', lambda: attend(q, q, q.long()), ValueError, r'v must be a floating-point tensor'),
        ('attend-shapes', lambda: attend(q, q[..., :4], q), ValueError, r'incompatible shapes q \(2, 4, 7, 8\), k \(2, 4, 7, 4\)'),
        ('attend-dtypes', lambda: attend(q, q.double(), q), ValueError, r'q, k and v must have one dtype'),
        ('attend-device', lambda: attend(q, q, q.to('meta')), ValueError, r'v is on device meta but q is on cpu'),
        ('attend-float-mask', lambda: attend(q, q, q, mask=torch.ones(2, 1, 1, 7)), ValueError, r'mask must be a bool tensor \(True = may attend\).*got torch\.float32'),
        ('attend-mask-shape', lambda: attend(q, q, q, mask=torch.ones(2, 1, 1, 6, dtype=torch.bool)), ValueError, r'broadcastable to \(b, h, i, j\) = \(2, 4, 7, 7\)'),
        ('attend-int-term', lambda: attend(q, q, q, [torch.ones(1, 4, 7, 7, dtype=torch.long)]), ValueError, r'score_terms\[0\] must be a float tensor'),
        ('mha-heads', lambda: MultiHeadAttention(30, 4), ValueError, r'd_model=30 must be a positive multiple of n_heads=4'),
        ('mha-float-heads', lambda: MultiHeadAttention(8, 2.0), ValueError, r'n_heads must be an integer ≥ 1; got 2\.0'),
        ('mha-dropout', lambda: MultiHeadAttention(8, 2, dropout=2.0), ValueError, r'dropout must be in \[0, 1\); got 2\.0'),
        ('learned-width', lambda: LearnedEncoding(-8, 4), ValueError, r'd_model must be an integer ≥ 1; got -8'),
        ('layer-type', lambda: position_attention(ALiBi(4), q, q, q, ALiBi(4).prepare(torch.arange(7)[None], torch.arange(7)[None]), layer='abc'), TypeError, r"the layer address must be a layer index.*got str 'abc'"),
        ('encoder-causal-form', lambda: tiny('alibi', pe_kwargs={'bidirectional': False}), ValueError, r'an Encoder attends both ways: ALiBi is a causal form here'),
        ('mha-width', lambda: mha(torch.randn(2, 7, 12)), ValueError, r'x must be a float tensor of shape \(b, n, D\) with D = d_model = 16'),
        ('mha-kv-batch', lambda: mha(torch.randn(2, 7, 16), kv=torch.randn(3, 7, 16)), ValueError, r'kv has batch size 3 but x has 2'),
        ('ids-float', lambda: m(ids.float()), ValueError, r'input_ids must be an integer tensor of shape \(b, n\); got torch\.float32'),
        ('ids-rank', lambda: m(ids[0]), ValueError, r'input_ids must be an integer tensor of shape \(b, n\)'),
        ('ids-vocab', lambda: m(ids + V), ValueError, r'input_ids must lie in \[0, vocab_size=50\)'),
        ('ids-device', lambda: m(ids.to('meta')), ValueError, r'input_ids are on device meta but the model is on cpu'),
        ('mask-float', lambda: m(ids, attention_mask=torch.ones(2, N)), ValueError, r'attention_mask must be a bool or 0/1 integer tensor.*got torch\.float32'),
        ('mask-shape', lambda: m(ids, attention_mask=torch.ones(2, N + 1, dtype=torch.bool)), ValueError, r'of shape \(b, n\) = \(2, 9\)'),
        ('mask-additive', lambda: m(ids, attention_mask=torch.zeros(2, N, dtype=torch.long) - 10000), ValueError, r'must hold only 0 \(padding\) and 1'),
        ('pos-float', lambda: m(ids, position_ids=torch.arange(N) * 1.0), ValueError, r'position_ids must be an integer tensor.*got torch\.float32'),
        ('pos-shape', lambda: m(ids, position_ids=torch.arange(N).expand(3, N)), ValueError, r'position_ids must be an integer tensor of shape \(b, n\), \(1, n\) or \(n,\) with n=9'),
        ('pos-table', lambda: m(ids, position_ids=torch.arange(N) + 10), PositionRangeError, r'position 18 is outside the learned position table \(max_position_embeddings=16'),
        ('pos-negative', lambda: m(ids, position_ids=torch.arange(N) - 1), PositionRangeError, r'position -1 is outside'),
        ('length-table', lambda: m(torch.randint(5, V, (1, 17))), PositionRangeError, r'max_position_embeddings=16'),
        ('segments-none', lambda: m(ids, token_type_ids=torch.ones_like(ids)), ValueError, r'token_type_ids hold segment ids 1\.\.1 but the model has no segment embeddings \(type_vocab_size=0\): pass all-zero token_type_ids'),
        ('segments-none-negative', lambda: m(ids, token_type_ids=torch.full_like(ids, -1)), ValueError, r'segment ids -1\.\.-1 .* or use a model with segment embeddings \(type_vocab_size ≥ 2\)'),
        ('segments-range', lambda: seg(ids, token_type_ids=torch.full_like(ids, 2)), ValueError, r'token_type_ids must lie in \[0, type_vocab_size=2\)'),
        ('labels-float', lambda: m(ids, labels=ids.float()), ValueError, r'labels must be an integer tensor'),
        ('labels-range', lambda: m(ids, labels=torch.full_like(ids, V)), ValueError, r'labels must be token ids in \[0, vocab_size=50\) or -100'),
        ('cfg-heads', lambda: ModelConfig(d_model=30, n_heads=4), ValueError, r'd_model=30 must be divisible by n_heads=4'),
        ('cfg-type', lambda: ModelConfig(d_model=32.0), ValueError, r'd_model must be a positive integer; got 32\.0'),
        ('cfg-unknown-pe', lambda: ModelConfig(pe='rotary'), ValueError, r"unknown position encoding 'rotary'; valid names: "),
        ('cfg-unknown-option', lambda: ModelConfig.from_dict({'d_modle': 32}), ValueError, r"unknown ModelConfig option\(s\) \['d_modle'\]"),
        ('cfg-shaw-k', lambda: ModelConfig(pe='shaw', pe_kwargs={'k': 0}), ValueError, r'clipping distance k must be an integer ≥ 1.*got 0'),
        ('cfg-t5-buckets', lambda: ModelConfig(pe='t5', pe_kwargs={'num_buckets': 3}), ValueError, r'num_buckets must be an integer ≥ 4; got 3'),
        ('cfg-t5-distance', lambda: ModelConfig(pe='t5', pe_kwargs={'num_buckets': 32, 'max_distance': 8}), ValueError, r'max_distance=8 must be larger than the exact range'),
        ('cfg-conv-even', lambda: ModelConfig(conv_kernel_size=4), ValueError, r'conv_kernel_size must be 0 \(no convolution\) or odd.*got 4'),
        ('cfg-conv-groups', lambda: ModelConfig(conv_kernel_size=3, conv_groups=3), ValueError, r'conv_groups must be a positive divisor of d_model=128; got 3'),
        ('cfg-conv-act', lambda: ModelConfig(conv_kernel_size=3, conv_act='swish'), ValueError, r"conv_act must be one of \['tanh', 'gelu'\]; got 'swish'"),
        ('cfg-deberta-buckets', lambda: ModelConfig(pe='deberta', pe_kwargs={'position_buckets': 600}), ValueError, r'position_buckets=600 is larger than the span k=512'),
        ('train-unknown-option', lambda: make_train_config('smoke', stepz=3), ValueError, r"unknown training option\(s\) \['stepz'\]"),
        ('train-lr', lambda: make_train_config('smoke', lr=0.0), ValueError, r'lr must be > 0; got 0\.0'),
        ('train-type', lambda: make_train_config('smoke', batch_size=8.5), ValueError, r'batch_size must be an integer; got 8\.5'),
    ]


BAD = [c[0] for c in _bad_inputs()]


@pytest.mark.parametrize('case', BAD)
def test_bad_input_gets_a_clear_error(case):
    _, call, exc, match = next(c for c in _bad_inputs() if c[0] == case)
    with pytest.raises(exc, match=match):
        call()


def test_zero_segment_ids_are_ignored_without_segment_embeddings(ids):
    "A tokenizer's all-zero `token_type_ids` (one segment) pass through a model without segment embeddings, as in transformers."
    m = tiny('learned', max_pos=16, dtype=torch.float32)
    batch = {'input_ids': ids, 'token_type_ids': torch.zeros_like(ids), 'attention_mask': torch.ones_like(ids)}
    with torch.no_grad():
        assert torch.equal(m(**batch)['hidden_states'], m(ids)['hidden_states'])
    batch['token_type_ids'][1, 4] = 1                                             # one non-zero id: an error
    with pytest.raises(ValueError, match=r'segment ids 0\.\.1 but the model has no segment embeddings'):
        m(**batch)


@pytest.mark.parametrize('name', ENCODINGS)
def test_unknown_encoding_option_is_named(name):
    "Every encoding refuses an option it does not know, naming it (never silently ignored)."
    with pytest.raises(ValueError, match=r'no_such_option'):
        ModelConfig(vocab_size=V, d_model=32, n_heads=4, pe=name, pe_kwargs={'no_such_option': 1})


@pytest.mark.parametrize('name', ENCODINGS)
def test_sequence_longer_than_tables(name):
    """Beyond `max_position_embeddings` an encoding with an absolute table (`max_len`) raises `PositionRangeError`
    naming the size; the others run, with finite outputs. Never an IndexError, never a silent wrap."""
    m = tiny(name, max_pos=16, dtype=torch.float32)
    long_ids = torch.randint(5, V, (1, 24))
    if getattr(m.encoder.pe, 'max_len', None) is not None:
        with pytest.raises(PositionRangeError, match='max_position_embeddings=16'): m(long_ids)
    else:
        assert torch.isfinite(states(m, long_ids)).all()


# ============================================================================ 2. invariances, every encoding

@pytest.mark.parametrize('name,emd', VARIANTS)
def test_right_padding_with_mask_changes_nothing(name, emd, ids):
    "Appending padding (random tokens, not [PAD]: the mask must do the work) leaves the real tokens' states unchanged."
    m = tiny(name, emd)
    pad = torch.randint(5, V, (2, 4), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([ids, pad], 1)
    mask = torch.cat([torch.ones(2, N, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long)], 1)
    for fast in (True, False):
        ref = states(m, ids, fast)
        close(states(m, padded, fast, attention_mask=mask)[:, :N], ref)
    assert (states(m, padded)[:, :N] - ref).abs().max() > 1e-4   # without the mask the padding is seen: the test has teeth


@pytest.mark.parametrize('name,emd', VARIANTS)
def test_example_independent_of_batch(name, emd):
    "An example's states do not depend on the other examples of its batch (of other lengths, padded on the right)."
    m = tiny(name, emd)
    g = torch.Generator().manual_seed(3)
    lengths = [N, 4, 7]
    ids = torch.randint(5, V, (3, N), generator=g)
    mask = torch.stack([torch.arange(N) < n for n in lengths])
    batch = states(m, ids, attention_mask=mask)
    for e, n in enumerate(lengths):
        close(batch[e, :n], states(m, ids[e:e + 1, :n])[0])


@pytest.mark.parametrize('name,emd', VARIANTS)
def test_left_padding_with_position_ids_matches_unpadded(name, emd, ids):
    "Left padding plus explicit position ids (real tokens at 0 … n-1) gives the unpadded run's states."
    m = tiny(name, emd)
    n_pad, short = 3, ids[1, :6]
    left = torch.stack([ids[0], torch.cat([torch.randint(5, V, (n_pad,)), short])])          # (2, 9)
    mask = torch.stack([torch.ones(N, dtype=torch.bool), torch.arange(N) >= n_pad])
    pos = torch.stack([torch.arange(N), (torch.arange(N) - n_pad).clamp(min=0)])              # padding at position 0
    for fast in (True, False):
        out = states(m, left, fast, attention_mask=mask, position_ids=pos)
        close(out[0], states(m, ids[:1], fast)[0])
        close(out[1, n_pad:], states(m, short[None], fast)[0])


@pytest.mark.parametrize('name,emd', VARIANTS)
def test_common_shift_of_positions(name, emd, ids):
    """A common shift of all positions changes nothing exactly when the encoding is `relative_only` and no absolute
    positions are added by the Enhanced Mask Decoder. Absolute encodings change by design, and so does TUPE (its
    positional correlation reads an absolute table and its [CLS] reset looks for position 0); asserting that they *do*
    change keeps the `relative_only` attribute honest."""
    m = tiny(name, emd)
    # FIRE reads the query's position only past its threshold L (below it, a shift changes nothing): shift past L
    past = int(m.encoder.pe.threshold().max()) if name == 'fire' and getattr(m, 'emd', None) is None else 0
    shifted = states(m, ids, position_ids=torch.arange(N) + 7 + past)
    invariant = m.encoder.pe.relative_only and getattr(m, 'emd', None) is None
    if invariant: close(shifted, states(m, ids), 1e-6)   # 1e-6, not 1e-9: RoPE computes its angles in float32 by design
    else: assert (shifted - states(m, ids)).abs().max() > 1e-4


@pytest.mark.parametrize('name,emd', VARIANTS)
def test_permutation_equivariance_without_position_signal(name, emd, ids):
    "With no position signal (kind 'none', no decoder positions) permuting the tokens permutes the states; otherwise not."
    m = tiny(name, emd)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(4))
    err = (states(m, ids)[:, perm] - states(m, ids[:, perm])).abs().max().item()
    if m.encoder.pe.kind == 'none' and getattr(m, 'emd', None) is None: assert err < 1e-9
    else: assert err > 1e-4


# ============================================================================ 3. numerics, every encoding

@pytest.mark.parametrize('name', ENCODINGS)
def test_fully_masked_row_gives_zeros(name):
    "A query with no key to attend to gets attention output 0 (so the layer returns `o_proj`'s bias), never NaN."
    m = tiny(name, dtype=torch.float32)
    enc, x = m.encoder, torch.randn(2, N, 32)
    attn, pos = enc.layers[0].attn, torch.arange(N)[None]
    mask = torch.ones(2, 1, N, N, dtype=torch.bool); mask[1, :, 2] = False; mask[0] = False   # one row; a whole example
    for fast in (True, False):
        with torch.no_grad(): out = attn(x, mask=mask, pe=enc.pe, ctx=enc.pe.prepare(pos, pos), fast=fast)
        assert torch.isfinite(out).all()
        close(out[1, 2], attn.o_proj.bias, 1e-6); close(out[0], attn.o_proj.bias.expand(N, -1), 1e-6)


@pytest.mark.parametrize('name', ENCODINGS)
def test_fully_masked_example_is_finite_and_isolated(name, ids):
    "An example whose attention_mask is all 0: finite states, loss and gradients, and the other example is unaffected."
    m = tiny(name, dtype=torch.float32)
    mask = torch.ones(2, N, dtype=torch.long); mask[1] = 0
    labels = torch.full_like(ids, -100); labels[:, ::3] = ids[:, ::3]
    out = m(ids, attention_mask=mask, labels=labels)
    out['loss'].backward()
    assert torch.isfinite(out['hidden_states']).all() and torch.isfinite(out['loss'])
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    close(out['hidden_states'][0].detach(), states(m, ids[:1])[0], 1e-5)


def _large_logits(m, ids, factor):
    "Scale every layer's q and k projections by `factor`; returns the largest |content logit| of layer 0 (float32)."
    enc = m.encoder
    with torch.no_grad():
        for l in enc.layers:
            l.attn.q_proj.weight.mul_(factor); l.attn.k_proj.weight.mul_(factor)
        pos = enc.positions(ids)
        x, a = enc.embeddings(ids, pos, enc.pe), enc.layers[0].attn
        q, k = enc.pe.transform_qk(a.split_heads(a.q_proj(x)), a.split_heads(a.k_proj(x)), enc.pe.prepare(pos, pos), a)
        return (q @ k.transpose(-1, -2) * enc.pe.content_scale(a.d_head)).abs().max().item()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
@pytest.mark.parametrize('name', ENCODINGS)
def test_autocast_large_logits_finite(name, dtype, ids):
    """Forward and backward under CPU autocast stay finite with content logits around 2·10⁴ (softmax saturated,
    q·k before scaling beyond fp16's range), a padded example and a fully masked one, on both attention paths."""
    for fast in (True, False):
        m = tiny(name, dtype=torch.float32, fast_attention=fast)
        ids3 = torch.cat([ids, ids[:1]])
        top = _large_logits(m, ids3, 70.0)
        assert 1e4 < top < 6e4, top
        mask = torch.ones(3, N, dtype=torch.long); mask[1, 5:] = 0; mask[2] = 0
        labels = torch.full_like(ids3, -100); labels[:2, ::2] = ids3[:2, ::2]
        with torch.autocast('cpu', dtype=dtype):
            out = m(ids3, attention_mask=mask, labels=labels)
        out['loss'].backward()
        assert torch.isfinite(out['hidden_states']).all() and torch.isfinite(out['loss']), (fast, out['loss'])
        bad = [n for n, p in m.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, (fast, bad)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
@pytest.mark.parametrize('name', ENCODINGS)
def test_long_sequence_half_precision(name, dtype):
    """1,024 tokens under autocast: the position terms (T5/ALiBi biases, DeBERTa c2p/p2c, Shaw/Huang terms, TUPE)
    neither overflow nor turn the output non-finite, forward or backward."""
    n = 1024
    m = tiny(name, max_pos=n, d_model=16, n_heads=2, n_layers=1, dtype=torch.float32)
    enc = m.encoder
    pos = torch.arange(n)[None]
    with torch.no_grad(), torch.autocast('cpu', dtype=dtype):
        x = torch.randn(1, n, 16)
        ctx = enc.pe.prepare(pos, pos)
        a = enc.layers[0].attn
        q, k = a.split_heads(a.q_proj(x)), a.split_heads(a.k_proj(x))
        for t in enc.pe.score_terms(q, k, ctx, a):
            assert torch.isfinite(t.to(dtype)).all(), 'a score term overflows the half-precision dtype'
    ids = torch.randint(5, V, (1, n), generator=torch.Generator().manual_seed(5))
    labels = torch.full_like(ids, -100); labels[:, ::7] = ids[:, ::7]
    with torch.autocast('cpu', dtype=dtype):
        out = m(ids, labels=labels)
    out['loss'].backward()
    assert torch.isfinite(out['hidden_states']).all() and torch.isfinite(out['loss'])
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


# ============================================================================ 3b. property-based (hypothesis)

# Derandomized (the same examples on every run, so CI cannot flake) and without an example database in the repo.
HYPOTHESIS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def attention_inputs(draw):
    b, h, i, j = (draw(st.integers(1, 3)) for _ in range(4))
    d, dv = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 3, 8]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, i, d, dtype=torch.float64, generator=g) * draw(st.sampled_from([0.1, 1.0, 10.0]))
    k, v = torch.randn(b, h, j, d, dtype=torch.float64, generator=g), torch.randn(b, h, j, dv, dtype=torch.float64, generator=g)
    def bshape(): return tuple(s if draw(st.booleans()) else 1 for s in (b, h)) + (i, j)
    terms = [torch.randn(*bshape(), dtype=torch.float64, generator=g) * 3 for _ in range(draw(st.integers(0, 2)))]
    mask = None
    if draw(st.booleans()):
        mshape = tuple(s if draw(st.booleans()) else 1 for s in (b, h, i)) + (j,)
        mask = torch.rand(*mshape, generator=g) < draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    return q, k, v, terms, mask, scale


@settings(max_examples=50, **HYPOTHESIS)
@given(attention_inputs())
def test_attend_fast_equals_manual(inp):
    "Random shapes, broadcast terms and masks (empty rows included): both paths agree in values and gradients, all finite."
    q, k, v, terms, mask, scale = inp
    res = []
    for fast in (True, False):
        xs = [t.clone().requires_grad_() for t in (q, k, v, *terms)]
        out = attend(*xs[:3], xs[3:], mask, scale=scale, fast=fast)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        assert torch.isfinite(out).all() and all(torch.isfinite(x.grad).all() for x in xs)
        res.append((out, [x.grad for x in xs]))
    torch.testing.assert_close(res[0][0], res[1][0], rtol=1e-9, atol=1e-10)
    for a, b in zip(res[0][1], res[1][1]): torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    if mask is not None:   # rows with no allowed key are exactly zero
        empty = ~mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]).any(-1)
        assert (res[0][0][empty] == 0).all()


@st.composite
def model_inputs(draw):
    name = draw(st.sampled_from(ENCODINGS))
    h = draw(st.sampled_from([1, 2, 4]))
    d_model = h * draw(st.sampled_from([2, 4, 8]))
    n, b = draw(st.integers(1, 12)), draw(st.integers(1, 3))
    lengths = [draw(st.integers(0, n)) for _ in range(b)]
    return name, h, d_model, draw(st.integers(1, 2)), draw(st.sampled_from([0, 2])), n, lengths, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=40, **HYPOTHESIS)
@given(model_inputs())
def test_model_fast_equals_manual_and_finite(inp):
    """Random encoding, width, heads, layers, decoder, length (1 included) and right padding (whole examples of
    padding included): fast and manual paths agree, everything is finite, also under bf16 autocast."""
    name, h, d_model, n_layers, emd, n, lengths, seed = inp
    m = tiny(name, emd, max_pos=16, d_model=d_model, n_heads=h, n_layers=n_layers, seed=seed % 1000)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (len(lengths), n), generator=g)
    mask = torch.stack([torch.arange(n) < l for l in lengths])
    fast, manual = states(m, ids, True, attention_mask=mask), states(m, ids, False, attention_mask=mask)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast, manual, rtol=1e-9, atol=1e-9)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        assert torch.isfinite(m.float()(ids, attention_mask=mask)['hidden_states']).all()


# ============================================================================ 4. training that loses nothing

# Subprocesses use this process's thread count, so that their losses can be compared bit for bit with in-process runs.
ENV = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'TOKENIZERS_PARALLELISM': 'false',
       'OMP_NUM_THREADS': str(torch.get_num_threads())}
STEPS = 60


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    "A small local corpus (the first records of the embedded splits)."
    d = tmp_path_factory.mktemp('corpus')
    for split, n in (('train', 300), ('validation', 40)):
        with gzip.open(corpus_dir() / f'{split}.jsonl.gz', 'rt') as f: lines = [next(f) for _ in range(n)]
        (d / f'{split}.jsonl').write_text(''.join(lines))
    return str(d)


def _cfg(corpus, **kw):
    return make_train_config('smoke', **{'data': corpus, 'pe': 't5', 'steps': STEPS, 'log_every': 1, 'eval_every': 20,
                                         'save_every': 25, **kw})


def _losses(run, split='train'):
    recs = [json.loads(l) for l in (Path(run) / 'metrics.jsonl').read_text().splitlines()]
    return [(r['step'], r['loss']) for r in recs if r['split'] == split]


def same_losses(run, ref):
    "The same steps with the same train and eval losses (to 1e-6: in-process runs of other tests share RNG-free state)."
    for split in ('train', 'eval'):
        a, b = _losses(run, split), _losses(ref, split)
        assert [s for s, _ in a] == [s for s, _ in b]
        assert [l for _, l in a] == pytest.approx([l for _, l in b], rel=1e-6)


@pytest.fixture(scope='module')
def reference(corpus, tmp_path_factory):
    "An uninterrupted run, in-process, to compare the interrupted ones with."
    out = tmp_path_factory.mktemp('ref') / 'run'
    pretrain(_cfg(corpus), out, progress=False)
    return out


def _cli(*args):
    return [sys.executable, '-c', 'from posenc_lit.cli import main; raise SystemExit(main())', *map(str, args)]


def test_sigterm_mid_run_then_resume_gives_identical_losses(corpus, reference, tmp_path):
    """Kill a `posenc_lit pretrain` process with SIGTERM mid-run: it saves a checkpoint at the step it was on, exits
    with status 143 and no traceback; `--resume` then logs exactly the losses of an uninterrupted run, step for step."""
    c = _cfg(corpus)
    args = ['pretrain', '--pe', c.pe, '--preset', 'smoke', '--data', corpus, '--steps', c.steps, '--log-every', c.log_every,
            '--eval-every', c.eval_every, '--save-every', c.save_every, '--quiet', '--out', tmp_path / 'run']
    k = cut_with_sigterm(_cli(*args), tmp_path / 'run', ENV, c.steps)
    assert [s for s, _ in _losses(tmp_path / 'run')] == list(range(1, k + 1))
    r = subprocess.run(_cli(*args, '--resume'), capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    for split in ('train', 'eval'):                            # identical, not merely close
        assert _losses(tmp_path / 'run', split) == _losses(reference, split)


def test_sigint_in_process_saves_and_resumes(corpus, reference, tmp_path, monkeypatch):
    "Ctrl-C (SIGINT) inside `pretrain` (as in a notebook): a checkpoint at that step, a clean return, the handler restored."
    log = loop.log_record
    def log_and_interrupt(out, rec, main=True):
        log(out, rec, main)
        if rec['split'] == 'train' and rec['step'] == 7: signal.raise_signal(signal.SIGINT)
    monkeypatch.setattr(loop, 'log_record', log_and_interrupt)
    before = signal.getsignal(signal.SIGINT)
    res = pretrain(_cfg(corpus), tmp_path / 'run', progress=False)
    assert res == {'stopped_at_step': 7, 'steps': STEPS, 'signal': 'SIGINT'}
    assert signal.getsignal(signal.SIGINT) is before
    assert json.loads((tmp_path / 'run' / 'checkpoint' / 'trainer_state.json').read_text())['step'] == 7
    monkeypatch.setattr(loop, 'log_record', log)
    pretrain(_cfg(corpus), tmp_path / 'run', resume=True, progress=False)
    same_losses(tmp_path / 'run', reference)


def _stopped_run(cfg, out, at=25):
    pretrain(cfg, out, stop_at=at, progress=False)
    return {p.name: p.read_bytes() for p in (out / 'checkpoint').iterdir()}


def test_failed_save_keeps_last_good_checkpoint(corpus, reference, tmp_path, monkeypatch):
    "A save that dies half-way (a full disk) leaves the previous checkpoint whole; resuming from it loses nothing."
    out = tmp_path / 'run'
    good = _stopped_run(_cfg(corpus), out)                             # checkpoint at step 25
    from accelerate import Accelerator
    def full_disk(self, output_dir, **kw):
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / 'model.safetensors').write_bytes(b'\0' * 100)
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(Accelerator, 'save_state', full_disk)
    with pytest.raises(OSError, match='No space left'):
        pretrain(_cfg(corpus), out, resume=True, progress=False)      # the next save, at step 50, fails
    assert {p.name: p.read_bytes() for p in (out / 'checkpoint').iterdir()} == good
    monkeypatch.undo()
    pretrain(_cfg(corpus), out, resume=True, progress=False)
    assert not (out / 'checkpoint.tmp').exists()
    same_losses(out, reference)


@pytest.mark.parametrize('damage', ['model.safetensors', 'optimizer.bin', 'custom_checkpoint_0.pkl',   # the last: the scheduler
                                    'random_states_0.pkl',
                                    'trainer_state.json'])
def test_damaged_checkpoint_is_a_clear_error_and_nothing_changes(corpus, tmp_path, damage):
    "A truncated checkpoint file: `CheckpointError` naming the checkpoint; every file of the run is left as it was."
    out, cfg = tmp_path / 'run', _cfg(corpus, save_every=3)
    _stopped_run(cfg, out, at=3)
    f = out / 'checkpoint' / damage
    f.write_bytes(f.read_bytes()[:len(f.read_bytes()) // 2])
    before = {p: p.read_bytes() for p in out.rglob('*') if p.is_file()}
    with pytest.raises(CheckpointError, match=str(out / 'checkpoint')):
        pretrain(cfg, out, resume=True, progress=False)
    assert {p: p.read_bytes() for p in out.rglob('*') if p.is_file()} == before


def test_checkpoint_holds_everything_to_resume(corpus, tmp_path):
    "Model, optimizer, scheduler (accelerate's custom_checkpoint_0), RNG states, data position, both configurations, tokenizer."
    out, cfg = tmp_path / 'run', _cfg(corpus, save_every=3)
    _stopped_run(cfg, out, at=3)
    assert pretrain(cfg, out, resume=True, stop_at=2, progress=False) == {'stopped_at_step': 3, 'steps': STEPS}  # no step to run
    names = {p.name for p in (out / 'checkpoint').iterdir()}
    assert {'model.safetensors', 'optimizer.bin', 'custom_checkpoint_0.pkl', 'random_states_0.pkl', 'config.json',
            'train_config.json', 'tokenizer.json', 'trainer_state.json'} <= names
    st = json.loads((out / 'checkpoint' / 'trainer_state.json').read_text())
    assert (st['step'], st['micro_step'], st['processes']) == (3, 3, 1)
    assert json.loads((out / 'checkpoint' / 'train_config.json').read_text())['pe'] == 't5'


def test_full_folder_needs_overwrite(corpus, tmp_path):
    """A non-empty run folder is replaced only with overwrite=True, only once every input has been checked, and only if it holds
    nothing but the run (a file of the user's beside it is never deleted)."""
    out = tmp_path / 'run'
    pretrain(_cfg(corpus), out, stop_at=3, progress=False)
    (out / 'note.txt').write_text('mine')
    with pytest.raises(RunDirError, match='--overwrite to replace it'):
        pretrain(_cfg(corpus), out, progress=False)
    with pytest.raises(RunDirError, match=r'files a pretraining run does not write \(note.txt\)'):   # the user's file is never deleted
        pretrain(_cfg(corpus, steps=4), out, overwrite=True, progress=False)
    assert (out / 'note.txt').read_text() == 'mine'
    (out / 'note.txt').unlink()
    with pytest.raises(ValueError, match='fewer than one global batch'):   # a bad option: the old run stays
        pretrain(_cfg(corpus, batch_size=100000), out, overwrite=True, progress=False)
    assert (out / 'checkpoint' / 'trainer_state.json').is_file()
    pretrain(_cfg(corpus, steps=4), out, overwrite=True, progress=False)
    assert json.loads((out / 'summary.json').read_text())['steps'] == 4
    assert [p.name for p in tmp_path.iterdir()] == ['run']                 # nothing left aside
    other = tmp_path / 'photos'; other.mkdir(); (other / 'a.png').write_bytes(b'')
    with pytest.raises(RunDirError, match='refusing to delete it'):
        pretrain(_cfg(corpus), other, overwrite=True, progress=False)
    assert (other / 'a.png').is_file()


def test_resume_with_another_process_count_is_refused(corpus, tmp_path):
    "The data order depends on the number of processes: a resume with another number would not continue the same run."
    out, cfg = tmp_path / 'run', _cfg(corpus, save_every=3)
    pretrain(cfg, out, stop_at=3, progress=False)
    st = out / 'checkpoint' / 'trainer_state.json'
    st.write_text(json.dumps({**json.loads(st.read_text()), 'processes': 2}))
    with pytest.raises(CheckpointError, match='written by 2 processes and this run has 1'):
        pretrain(cfg, out, resume=True, progress=False)


def test_resume_without_config_json_is_refused(corpus, tmp_path):
    "Without config.json the options cannot be checked: a resume with another encoding would mix two runs."
    out, cfg = tmp_path / 'run', _cfg(corpus, save_every=3)
    pretrain(cfg, out, stop_at=3, progress=False)
    (out / 'config.json').unlink()
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob('*'))
    with pytest.raises(RunDirError, match='has a checkpoint but no config.json .* keeps a copy: .*train_config.json'):
        pretrain(_cfg(corpus, save_every=3, pe='alibi'), out, resume=True, progress=False)
    assert sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob('*')) == before   # nothing changed


# ============================================================================ 5. data files

def _corpus_with(tmp_path, name, content, good=b'{"text": "fine text here"}\n' * 5):
    "A corpus folder whose validation file is `name` with `content` (bytes); the train file is good, of the same type."
    ext = name.split('.', 1)[1]
    train = {'jsonl': good, 'txt': b'fine text here\n' * 5, 'csv': b'text\nfine text here\n',
             'json': good, 'jsonl.gz': gzip.compress(good)}[ext]
    (tmp_path / f'train.{ext}').write_bytes(train)
    (tmp_path / name).write_bytes(content)
    return tmp_path


@pytest.mark.parametrize('name,content,msg', [
    ('validation.jsonl', b'{"text": "a"}\n{"text": "b"\n{"text": "c"}\n', r'validation\.jsonl, line 2: not valid JSON'),
    ('validation.jsonl', b'{"text": "a"}\n\n[1, 2]\n', r'validation\.jsonl, line 3: expected a JSON object'),
    ('validation.jsonl', b'{"text": "a"}\n{"text": 7}\n', r'validation\.jsonl, line 2: expected a JSON object with a string `text`'),
    ('validation.jsonl', b'{"text": "a"}\n{"text": "caf\xe9"}\n', r'validation\.jsonl, line 2: not valid UTF-8 \(byte 0xe9 at column 14\)'),
    ('validation.jsonl.gz', gzip.compress(b'{"text": "a"}\n' * 3 + b'\xff\xfe\n'), r'validation\.jsonl\.gz, line 4: not valid UTF-8'),
    ('validation.txt', b'line one\nline two\n\x80\n', r'validation\.txt, line 3: not valid UTF-8'),
    ('validation.csv', b'text\nok\nna\xefve\n', r'validation\.csv, line 3: not valid UTF-8'),
    ('validation.json', b'[{"text": "a"},\n {"text": "b"}\n', r'validation\.json, line 3: not valid JSON'),
    ('validation.jsonl', b'', r'validation\.jsonl: empty file'),
    ('validation.txt', b'\n  \n\n', r'validation\.txt: empty file'),
    ('validation.jsonl.gz', gzip.compress(b'{"text": "a"}\n' * 200)[:-20], r'validation\.jsonl\.gz: corrupt or truncated gzip'),
], ids=['bad-json', 'not-object', 'text-not-string', 'latin1-jsonl', 'binary-gz', 'latin1-txt', 'latin1-csv',
        'json-doc', 'empty', 'blank', 'truncated-gz'])
def test_bad_data_file_names_file_and_line(tmp_path, name, content, msg):
    with pytest.raises(CorpusError, match=msg):
        load_corpus(_corpus_with(tmp_path, name, content), cache_dir=tmp_path / 'cache')


def test_bad_data_file_fails_before_writing(tmp_path):
    "A malformed data file stops `pretrain` before the run directory exists."
    (tmp_path / 'data').mkdir()
    d = _corpus_with(tmp_path / 'data', 'validation.jsonl', b'{"text": "a"}\n{oops}\n')
    with pytest.raises(CorpusError, match=r'validation\.jsonl, line 2'):
        pretrain(make_train_config('smoke', data=str(d)), tmp_path / 'run', progress=False)
    assert not (tmp_path / 'run').exists()


# ============================================================================ 6. tools

RUN_STUDY = Path(__file__).resolve().parent.parent / 'tools' / 'run_study.sh'


def test_run_study_checks_every_name_before_the_first_run(tmp_path, stand_in):
    """`tools/run_study.sh learned no-such-entry` stops before it starts `learned` (a run takes most of an
    hour), naming the unknown name and the known entries; `posenc_lit` is a stand-in that records a call."""
    env, called = stand_in
    for names in (['learned', 'no-such-entry'], ['learned', 'learned-s0'], ['tupe-a-s1', 'learned-s01']):
        p = subprocess.run(['bash', str(RUN_STUDY), *names], env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2, (names, p.returncode, p.stderr)
        assert f"unknown study entry '{names[1]}'; nothing was run" in p.stderr, p.stderr
        assert 'Known entries: learned sinusoidal none t5' in p.stderr, p.stderr
        assert not called.exists(), called.read_text()
    for names, why in (
        (['learned', 'learned sinusoidal'], "the name 'learned sinusoidal' holds whitespace; nothing was run"),
        (['learned', 'none\t'], "holds whitespace; nothing was run"),
        (['learned', 'learned-s99999999999999999999'], "the seed of 'learned-s99999999999999999999' is past"),
        (['learned', 'learned-s4294967296'], "the seed of 'learned-s4294967296' is past the largest seed"),
    ):
        p = subprocess.run(['bash', str(RUN_STUDY), *names], env=env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 2 and why in p.stderr, (names, p.returncode, p.stderr)
        assert not called.exists(), called.read_text()
    p = subprocess.run(['bash', str(RUN_STUDY), 'learned-s4294967295'], env=env, capture_output=True, text=True,
                       timeout=300)  # no sweep under STUDY_ROOT/results: no learning rate, nothing run
    assert p.returncode == 2 and 'no learning rate for learned-s4294967295 yet' in p.stderr, p.stderr
    assert not called.exists(), called.read_text()
    for lr, loss in (('1e-3', 6.2), ('2e-3', 6.1), ('4e-3', 6.3)):  # a made-up sweep in which 2e-3 wins
        run = tmp_path / 'results' / 'sweep' / f'learned-lr{lr}'
        run.mkdir(parents=True)
        (run / 'config.json').write_text(json.dumps({'pe': 'learned', 'lr': float(lr), 'steps': 3000}))
        (run / 'summary.json').write_text(json.dumps({'pe': 'learned', 'eval_loss': loss}))
    p = subprocess.run(['bash', str(RUN_STUDY), 'learned-s4294967295'], env=env, capture_output=True, text=True,
                       timeout=300)  # the largest seed passes the checks and reaches the (stand-in) CLI
    assert ' --seed 4294967295 ' in called.read_text(), called.read_text()
    assert ' --lr 0.002 ' in called.read_text(), called.read_text()  # the sweep's rate
    called.unlink()
    p = subprocess.run(['bash', str(RUN_STUDY)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.startswith('usage: bash tools/run_study.sh NAME'), p.stderr


def test_refit_study_refuses_what_it_cannot_refit(tmp_path, stand_in):
    """`tools/refit_study.sh` pretrains nothing for a name without a committed run, nor for one whose
    fine-tunings are committed already (a re-run would replace them), and says so; every name is checked first."""
    env, called = stand_in
    refit = RUN_STUDY.with_name('refit_study.sh')
    run = lambda *names: subprocess.run(['bash', str(refit), *names], env=env, capture_output=True, text=True,
                                        timeout=300)
    p = run()
    assert p.returncode == 2 and p.stderr.startswith('usage: bash tools/refit_study.sh NAME'), p.stderr
    for d in ('study', 'study_order'):
        (tmp_path / 'results' / d / 'shaw-s1').mkdir(parents=True)
        (tmp_path / 'results' / d / 'shaw-s1' / 'summary.json').write_text('{"eval_loss": 4.3}')
    (tmp_path / 'results' / 'study' / 'learned-s1').mkdir()
    (tmp_path / 'results' / 'study' / 'learned-s1' / 'summary.json').write_text('{"eval_loss": 4.3}')
    for names, why in (
        (['learned-s1', 'none-s1'], 'no committed study run none-s1 (results/study/none-s1/summary.json)'),
        (['learned-s1', 'shaw-s1'], 'shaw-s1 is fine-tuned already (results/study_order/shaw-s1)'),
    ):
        p = run(*names)
        assert p.returncode == 2 and why in p.stderr and 'nothing was run' in p.stderr, (names, p.stderr)
        assert not called.exists() and not (tmp_path / 'runs').exists()
