"""Encodings built for one head layout and used with another (a reader's own attention module) are refused by the
contract, once, with one message naming the sizes they declared (`n_heads`, `d_head`: "... was built for ..."),
on the manual, fast and fused paths and through `position_scores` and `fused_scores`, instead of torch's matmul
errors, a term at the wrong scale (TUPE), or a rotation of part of q. The registry walk
(test_contract) checks every registered encoding's declarations against this rule."""
import pytest
import torch
from posenc_lit.alibi import ALiBi
from posenc_lit.attention import CombinedEncoding, default_positions, position_attention, position_scores
from posenc_lit.cope import CoPE
from posenc_lit.core import PositionEncoding
from posenc_lit.deberta import DebertaRelative
from posenc_lit.fire import FIRE
from posenc_lit.fused import fused_scores
from posenc_lit.relative import HuangMethod4, RelativeVectors, Shaw
from posenc_lit.rope import RoPE
from posenc_lit.tupe import TUPE

CASES = {  # the encoding, the (h, d) it runs at, and what its message names
    'shaw': (lambda: Shaw(4, 1), (1, 4), r'RelativeVectors was built for d_head=4'),
    'huang4': (lambda: HuangMethod4(8, 1, k=4), (1, 8), r'RelativeVectors was built for d_head=8'),
    'deberta': (lambda: DebertaRelative(32, 4, 1), (4, 8), r'DebertaRelative was built for 4 heads of d_head=8'),
    'tupe': (lambda: TUPE(32, 4), (4, 8), r'TUPE was built for 4 heads of d_head=8'),
    'rope': (lambda: RoPE(8), (2, 8), r'RoPE was built for d_head=8'),
    'alibi': (lambda: ALiBi(4), (4, 8), r'ALiBi was built for 4 heads'),
    'fire': (lambda: FIRE(2, n_layers=1), (2, 8), r'FIRE was built for 2 heads'),
    'cope': (lambda: CoPE(8, 1), (2, 8), r'CoPE was built for d_head=8'),
}


def _declared(name):  # the shapes this encoding refuses: other heads where it declares them, other widths too
    h, d = CASES[name][1]
    pe = CASES[name][0]()
    shapes = [(1, h, 6, 2 * d)] if pe.d_head is not None else []
    return shapes + ([(1, 2 * h, 6, d)] if pe.n_heads is not None else [])


@pytest.mark.parametrize('name', CASES)
def test_a_mis_sized_q_is_named_on_every_path(name):
    make, _, msg = CASES[name]
    pe, pos = make(), default_positions(6)
    ctx = pe.prepare(pos, pos)
    shapes = _declared(name)
    assert shapes
    for shape in shapes:
        q = torch.randn(shape)
        calls = [lambda f=fast: position_attention(pe, q, q, q, ctx, 0, fast=f) for fast in (False, True, 'fused')]
        calls += [lambda: position_scores(pe, q, q, ctx, 0), lambda: fused_scores(pe, q, q, ctx, 0)]
        for call in calls:
            with pytest.raises(ValueError, match=msg):
                call()


@pytest.mark.parametrize('name', CASES)
def test_the_built_sizes_still_run(name):
    make, (h, d), _ = CASES[name]
    pe, pos = make(), default_positions(6)
    q = torch.randn(1, h, 6, d)
    out = position_attention(pe, q, q, q, pe.prepare(pos, pos), 0)
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_what_is_not_declared_runs_at_any_size():
    "Shaw's tables are shared by the heads (no n_heads), ALiBi's slopes fit any width (no d_head)."
    pos = default_positions(6)
    for pe, q in ((Shaw(4, 1), torch.randn(1, 3, 6, 4)), (ALiBi(4), torch.randn(1, 4, 6, 5))):
        out = position_attention(pe, q, q, q, pe.prepare(pos, pos), 0)
        assert out.shape == q.shape and torch.isfinite(out).all()


def test_value_vectors_are_held_to_the_width_of_v_not_of_q():
    "Value vectors are added to an output of v's width: a table of them only is held to v, any q runs with it."
    pos = default_positions(6)
    q8, v4 = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 4)
    values_only = RelativeVectors(4, 1, 3, query_term=False, values=True)
    assert values_only.built_for() == {'n_heads': None, 'd_head': None, 'd_v': 4}
    out = position_attention(values_only, q8, q8, v4, values_only.prepare(pos, pos), 0)
    assert out.shape == (1, 2, 6, 4) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match=r'RelativeVectors was built for d_v=4 \(the width its value terms add to\); '
                                         r'got v of shape \(1, 2, 6, 8\)'):
        position_attention(values_only, q8, q8, q8, values_only.prepare(pos, pos), 0)
    shaw = Shaw(4, 1)  # keys and values: q's width and v's
    assert shaw.built_for() == {'n_heads': None, 'd_head': 4, 'd_v': 4}
    with pytest.raises(ValueError, match=r'RelativeVectors was built for d_v=4'):
        position_attention(shaw, v4, v4, q8, shaw.prepare(pos, pos), 0)
    assert HuangMethod4(4, 1, k=2).built_for()['d_v'] is None  # no value vectors


def test_a_combination_is_held_to_what_its_members_declare():
    pe, pos = CombinedEncoding(RoPE(8), ALiBi(4)), default_positions(6)
    assert (pe.n_heads, pe.d_head, pe.d_v) == (4, 8, None)
    assert CombinedEncoding(Shaw(8, 1), RoPE(8)).built_for() == {'n_heads': None, 'd_head': 8, 'd_v': 8}
    ctx = pe.prepare(pos, pos)
    assert position_attention(pe, *[torch.randn(1, 4, 6, 8)] * 3, ctx).shape == (1, 4, 6, 8)
    for shape in ((1, 4, 6, 16), (1, 2, 6, 8)):
        with pytest.raises(ValueError, match='CombinedEncoding was built for 4 heads of d_head=8; got q of shape'):
            position_attention(pe, *[torch.randn(shape)] * 3, ctx)
    with pytest.raises(ValueError, match=r'built for different d_head \(\[8, 16\]\): not combined'):
        CombinedEncoding(RoPE(8), RoPE(16))


def test_a_users_own_encoding_declares_with_two_attributes():
    class Bias(PositionEncoding):  # a (1, 3, i, j) bias: three heads, any width
        kind, n_heads = 'score', 3

        def score_terms(self, q, k, ctx, layer=None):
            return [torch.zeros(1, 3, q.shape[2], k.shape[2])]

    pe, pos = Bias(), default_positions(5)
    assert (pe.n_heads, pe.d_head, PositionEncoding().n_heads, PositionEncoding().d_head) == (3, None, None, None)
    q = torch.randn(2, 3, 5, 4)
    assert position_attention(pe, q, q, q, pe.prepare(pos, pos)).shape == q.shape
    with pytest.raises(ValueError, match=r'Bias was built for 3 heads; got q of shape \(2, 1, 5, 4\)'):
        position_attention(pe, *[q[:, :1]] * 3, pe.prepare(pos, pos))


def test_the_layout_is_named_before_the_sizes():
    "q as (b, n, h, d): the layout message, not 'built for other heads' (the check comes after the positions')."
    pe, pos = DebertaRelative(32, 4, 1), default_positions(10)
    q = torch.randn(2, 10, 4, 8)
    with pytest.raises(ValueError, match=r'has 4 at dim 2: q, k, v must be \(b, h, n, d\)'):
        position_attention(pe, q, q, q, pe.prepare(pos, pos), 0)


def test_a_value_term_of_another_width_than_v_is_refused_not_broadcast():
    "An encoding of one's own adding value vectors, no d_v declared: a v of width 1 was broadcast into them."

    class Values(PositionEncoding):  # (b, h, i, 4) added to the output: built for v of width 4, not declared
        def value_terms(self, ctx, layer=None):
            return [lambda probs: probs.sum(-1, keepdim=True) * torch.ones(4)]

    pe, pos = Values(), default_positions(6)
    q = torch.randn(1, 2, 6, 8)
    assert position_attention(pe, q, q, torch.randn(1, 2, 6, 4), pe.prepare(pos, pos)).shape == (1, 2, 6, 4)
    msg = r'value_terms\[0\] gave .*\(1, 2, 6, 4\).* must fit the output'
    for v in (torch.randn(1, 2, 6, 1), torch.randn(1, 2, 6, 8)):  # 1: was a (1, 2, 6, 4) output, silently
        for fast in (False, True):
            with pytest.raises(ValueError, match=msg):
                position_attention(pe, q, q, v, pe.prepare(pos, pos), fast=fast)


def test_a_built_for_of_ones_own_that_omits_a_size_is_named():
    class Partial(PositionEncoding):  # returns only what it declares: was a KeyError inside the check
        def built_for(self):
            return {'d_v': 4}

    pe, pos, q = Partial(), default_positions(6), torch.randn(1, 2, 6, 4)
    msg = r"Partial.built_for\(\) must return \{'n_heads': \.\.\., 'd_head': \.\.\., 'd_v': \.\.\.\}"
    with pytest.raises(TypeError, match=msg):
        position_attention(pe, q, q, q, pe.prepare(pos, pos))
    with pytest.raises(TypeError, match=msg):
        CombinedEncoding(pe, RoPE(4))


def test_the_hint_for_a_0_1_key_mask_is_given_for_a_0_1_mask_only():
    "A bool mask of another shape (transformers' (b, 1, 1, j)) is not told to call .bool(); a 0/1 or additive tensor is."
    pe, pos = ALiBi(2), default_positions(6)
    for mask in (torch.ones(1, 1, 1, 6, dtype=torch.bool), torch.ones(1, 5, dtype=torch.bool), [[True] * 6]):
        with pytest.raises(ValueError, match='key_mask must be a bool tensor') as e:
            pe.prepare(pos, pos, key_mask=mask)
        assert 'key_mask.bool()' not in str(e.value)
    hint = r'torch.int64 tensor of shape \(1, 6\) \(a 0/1 mask: key_mask.bool\(\); an additive mask'
    with pytest.raises(ValueError, match=hint):
        pe.prepare(pos, pos, key_mask=torch.ones(1, 6, dtype=torch.long))
    # an additive float mask (0 for real keys, -inf for padding): .bool() would invert it, so both are named
    additive = torch.tensor([[0.0, 0.0, 0.0, 0.0, -float('inf'), -float('inf')]])
    with pytest.raises(ValueError, match=r'an additive mask of 0 and -inf: key_mask == 0\)'):
        pe.prepare(pos, pos, key_mask=additive)
    assert (additive == 0).tolist() == [[True] * 4 + [False] * 2]
