"""Ways to misuse the attention contract (the context records `key_mask` and `causal`; CHANGELOG, "The contract:
padding and causality said once, at `prepare`") that ran silently or failed with a message naming neither the
context nor the mask. Each test names its finding.

- F1 `fused.fused_scores` read a context prepared for other positions or another batch without a word (it
  skipped the checks `position_scores` makes): logits from the wrong positions, or a batch of 2 from q of 1.
- F2 `position_scores` / `fused_scores` with a mask `attend` refuses (a `(b, j)` key mask, say) dropped
  `ctx.key_mask` and broadcast the mask as `(i, j)`: padding attended, each query row masked by another
  sequence's padding.
- F3 a context whose `key_mask` was set by hand (a `Context(...)` or `ctx.key_mask = ...`) to a shape other
  than `(b|1, j)` broadcast silently on the manual path (a `(1, 1)` mask allows or forbids every key) and
  failed in a matrix product on the fast one; a `causal` that is not a bool ('no') made the call causal.
- F6 `ALiBi(h, bidirectional=False)`, the paper's causal form, prepared with `causal=False` (the default, or a
  causal `mask` passed instead) gave every key after the query bias 0, the query's own: without the mask it
  attended the future, with no error.
- F7 `pe.prepare = f` on an instance (not a subclass) shadowed the contract's wrapper: `f`'s arguments were not
  checked and its context recorded neither `key_mask` nor `causal`, so the padding it was told of was attended.
- F8 `prepare(q_pos, k_pos, causal=True)` with queries that are not the last `i` of the keys (a query at position 5
  against a static buffer of 10 keys) ran: the causal mask goes by order, so the query attended keys 6-9.
- F9 `T5RelativeBias(h, bidirectional=False)`, T5's causal buckets, prepared with `causal=False` (as F6) gave every
  key after the query the query's own bucket: an `Encoder` with `pe_kwargs={'bidirectional': False}` ran.
"""
import pytest
import torch
from posenc_lit.core import Context, PositionEncoding
from posenc_lit.attention import MultiHeadAttention, CombinedEncoding, causal_mask, position_attention, position_scores
from posenc_lit.alibi import ALiBi
from posenc_lit.fused import fused_scores

H, D = 2, 8


def _qkv(b, n, m=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    return tuple(torch.randn(b, H, s, D, generator=g) for s in (n, m, m))


def test_F1_fused_scores_checks_the_context():
    "F1: fused_scores refuses a context of other positions or another batch, as position_scores does."
    pe = ALiBi(H)
    q, k, _ = _qkv(1, 2)
    three = torch.arange(3)[None]
    with pytest.raises(ValueError, match='ctx was prepared for 3 q_pos positions'):
        fused_scores(pe, q, k, pe.prepare(three, three))
    keep = torch.tensor([[True, False], [True, True]])
    two = torch.arange(2)[None]
    with pytest.raises(ValueError, match='key_mask of 2 rows but q has a batch of 1'):
        fused_scores(pe, q, k, pe.prepare(two, two, key_mask=keep))


@pytest.mark.parametrize('fn', ['position_scores', 'fused_scores'])
def test_F2_a_mask_that_does_not_fit_is_refused(fn):
    "F2: a `(b, j)` mask (b = i here) is named, not broadcast as `(i, j)` with the context's key_mask dropped."
    pe = ALiBi(H)
    q, k, _ = _qkv(2, 2)
    pos = torch.arange(2)[None]
    ctx = pe.prepare(pos, pos, key_mask=torch.tensor([[True, False], [True, True]]))
    f = {'position_scores': position_scores, 'fused_scores': fused_scores}[fn]
    assert f(pe, q, k, ctx)[0, :, :, 1].isneginf().all()  # the context's padding, without a mask
    with pytest.raises(ValueError, match=r'mask must be a bool tensor .* broadcastable to \(b, h, i, j\)'):
        f(pe, q, k, ctx, mask=torch.ones(2, 2, dtype=torch.bool))


@pytest.mark.parametrize('fast', [False, True])
@pytest.mark.parametrize('how', ['by hand', 'assigned'])
def test_F3_a_key_mask_set_by_hand_is_checked(fast, how):
    "F3: a context's key_mask of another shape than `(b|1, j)` is named, on the manual and the fast path."
    pe = PositionEncoding()
    q, k, v = _qkv(2, 4)
    pos = torch.arange(4)[None]
    bad = torch.zeros(1, 1, dtype=torch.bool)  # forbids every key if broadcast
    if how == 'by hand':
        ctx = Context(pos, pos, pe=pe, key_mask=bad)
    else:
        ctx = pe.prepare(pos, pos, key_mask=torch.ones(2, 4, dtype=torch.bool))
        ctx.key_mask = bad
    with pytest.raises(ValueError, match=r'key_mask .*\(b, j\) .*j = 4'):
        position_attention(pe, q, k, v, ctx, fast=fast)
    with pytest.raises(ValueError, match=r'key_mask .*\(b, j\) .*j = 4'):
        position_scores(pe, q, k, ctx)


def test_F3_a_causal_set_by_hand_is_a_bool():
    "F3: `Context(..., causal='no')` is refused, not read as causal."
    pe = PositionEncoding()
    q, k, v = _qkv(1, 3)
    pos = torch.arange(3)[None]
    with pytest.raises(ValueError, match='causal'):
        position_attention(pe, q, k, v, Context(pos, pos, pe=pe, causal='no'))


def test_F4_the_context_records_what_prepare_ran_with():
    """F4: a `prepare` whose own default is `causal=True` (a decoder-only encoding) ran causal but its context
    recorded False, so `position_attention` attended both ways; a `prepare(q_pos, k_pos, causal, key_mask)`
    called positionally had its `causal` read as the key mask."""

    class Decoder(PositionEncoding):
        def prepare(self, q_pos, k_pos, *, key_mask=None, causal=True):
            self.ran_causal = causal
            return Context(q_pos, k_pos, pe=self)

    class Positional(PositionEncoding):
        def prepare(self, q_pos, k_pos, causal=False, key_mask=None):
            return Context(q_pos, k_pos, pe=self)

    pos = torch.arange(3)[None]
    pe = Decoder()
    ctx = pe.prepare(pos, pos)
    assert pe.ran_causal is True and ctx.causal is True
    q, k, v = _qkv(1, 3)
    lower = torch.ones(3, 3, dtype=torch.bool).tril()
    assert position_scores(pe, q, k, ctx)[..., ~lower].isneginf().all()
    keep = torch.tensor([[True, True, False]])
    ctx = Positional().prepare(pos, pos, True, keep)
    assert ctx.causal is True and ctx.key_mask is keep


def test_F5_a_context_returned_twice_keeps_each_calls_mask():
    """F5: a `prepare` that returns one context object for every call (cached: the positions do not change)
    had an earlier context's key_mask and causal overwritten by a later call's, so the earlier batch was
    masked with the later batch's padding, without a word."""

    class Cached(PositionEncoding):
        def prepare(self, q_pos, k_pos, *, key_mask=None, causal=False):
            if not hasattr(self, 'made'):
                self.made = Context(q_pos, k_pos, pe=self)
            return self.made

    pe, pos = Cached(), torch.arange(3)[None]
    first = torch.tensor([[True, True, True]])
    a = pe.prepare(pos, pos, key_mask=first)
    b = pe.prepare(pos, pos, key_mask=torch.tensor([[True, False, False]]), causal=True)
    assert a.key_mask is first and a.causal is False
    assert b.causal is True and b.key_mask[0, 1].item() is False


def test_F6_the_causal_form_of_alibi_is_prepared_causal():
    """F6: the causal form with causal=False is refused, by default, by keyword, inside `checked_inputs()`, as a
    `CombinedEncoding` member and in `MultiHeadAttention`; the symmetric form, and causal=True, run."""
    from posenc_lit.core import checked_inputs
    from posenc_lit.t5 import T5RelativeBias

    pe, pos = ALiBi(H, bidirectional=False), torch.arange(5)[None]
    msg = r"ALiBi is a causal form here \(causal_only\).*Prepare it with causal=True.*bidirectional=True"
    both = CombinedEncoding(pe, T5RelativeBias(H))
    for call in (
        lambda: pe.prepare(pos, pos),
        lambda: pe.prepare(pos, pos, key_mask=torch.ones(1, 5, dtype=torch.bool), causal=False),
        lambda: both.prepare(pos, pos, causal=False),
    ):
        with pytest.raises(ValueError, match=msg):
            call()
    with checked_inputs(), pytest.raises(ValueError, match=msg):  # the contract's checks skipped: still refused
        pe.prepare(pos, pos, causal=False)
    attn, x = MultiHeadAttention(H * D, H), torch.randn(1, 5, H * D)
    with pytest.raises(ValueError, match=msg):  # a causal mask instead of causal=True
        attn(x, causal_mask(5, 5), pe=pe)
    assert pe.prepare(pos, pos, causal=True).causal is True
    assert ALiBi(H).prepare(pos, pos).causal is False
    with torch.no_grad():
        torch.testing.assert_close(attn(x, pe=pe, causal=True), attn(x, causal_mask(5, 5), pe=ALiBi(H)))


def test_F6_a_combination_with_a_causal_form_is_one():
    """A `CombinedEncoding` with a causal member is `causal_only` too: a context made by hand (no causal
    recorded) is refused at attention with the member's message, as the member alone is."""
    from posenc_lit.attention import CombinedContext
    from posenc_lit.rope import RoPE

    pe, pos = CombinedEncoding(ALiBi(H, bidirectional=False), RoPE(D)), torch.arange(5)[None]
    assert pe.causal_only and not CombinedEncoding(ALiBi(H), RoPE(D)).causal_only
    ctx = CombinedContext(pos, pos, [m.prepare(pos, pos, causal=True) for m in pe.members], pe=pe)
    q = torch.randn(1, H, 5, D)
    with pytest.raises(ValueError, match=r'ALiBi is a causal form here \(causal_only\)'):
        position_attention(pe, q, q, q, ctx)
    ok = position_attention(pe, q, q, q, pe.prepare(pos, pos, causal=True))
    torch.testing.assert_close(ok, position_attention(pe, q, q, q, ctx, causal=True))


def test_F7_prepare_is_not_assigned_on_an_instance():
    """F7: `pe.prepare = f` (by assignment, `setattr` or `mock.patch.object`) is refused, naming a subclass; the
    instance keeps its checked `prepare`, and a subclass that wraps `super().prepare` is checked and recorded."""
    from unittest import mock

    pe, pos = ALiBi(H), torch.arange(4)[None]
    keep = torch.tensor([[True, True, True, False]])
    own = lambda q_pos, k_pos, **kw: pe.context_type(q_pos, k_pos, pe=pe)  # records no key_mask
    msg = r'prepare cannot be assigned on an instance.*subclass'
    with pytest.raises(AttributeError, match=msg):
        pe.prepare = own
    with pytest.raises(AttributeError, match=msg):
        setattr(pe, 'prepare', own)
    with pytest.raises(AttributeError, match=msg), mock.patch.object(pe, 'prepare', own):
        pass
    assert 'prepare' not in vars(pe) and pe.prepare(pos, pos, key_mask=keep).key_mask is keep
    with pytest.raises(ValueError, match='key_mask must be a bool'):
        pe.prepare(pos, pos, key_mask=keep.float())

    class Counted(ALiBi):  # the way to wrap prepare: a subclass
        calls = 0

        def prepare(self, *a, **kw):
            type(self).calls += 1
            return super().prepare(*a, **kw)

    q, k, v = _qkv(1, 4)
    counted = Counted(H)
    ctx = counted.prepare(pos, pos, key_mask=keep)
    assert Counted.calls == 1 and ctx.key_mask is keep
    assert position_scores(counted, q, k, ctx)[..., 3].isneginf().all()
    with pytest.raises(ValueError, match='key_mask must be a bool'):
        counted.prepare(pos, pos, key_mask=keep.float())


def _order_encodings():
    "Encodings with a causal form or a direction, each prepared causal=True, and one of a user's own."
    from posenc_lit.cope import CoPE
    from posenc_lit.fire import FIRE
    from posenc_lit.rope import RoPE
    from posenc_lit.t5 import T5RelativeBias

    class Mine(PositionEncoding):  # its own prepare: the contract checks it all the same
        def prepare(self, q_pos, k_pos, *, key_mask=None, causal=False):
            return Context(q_pos, k_pos, pe=self)

    return {
        'rope': RoPE(D), 'alibi-causal': ALiBi(H, bidirectional=False), 'fire': FIRE(H),
        't5-causal': T5RelativeBias(H, num_buckets=8, max_distance=16, bidirectional=False),
        'cope-causal': CoPE(D, 1, bidirectional=False), 'mine': Mine(),
    }


@pytest.mark.parametrize('name', ['rope', 'alibi-causal', 'fire', 't5-causal', 'cope-causal', 'mine'])
def test_F8_causal_queries_are_the_last_keys(name):
    """F8: a query at position 5 against all 10 keys of a static buffer is refused at prepare, with the order
    rule and the ways out; the keys up to the query (a sliced buffer) run: the query sees its first 6 keys."""
    from posenc_lit.core import checked_inputs

    pe = _order_encodings()[name]
    q, k, v = _qkv(1, 10)
    q5, k10 = torch.tensor([[5]]), torch.arange(10)[None]
    with pytest.raises(ValueError, match=r'causal=True masks by order: the i=1 queries are the last i'):
        pe.prepare(q5, k10, causal=True)
    with pytest.raises(ValueError, match=r'query 0 has position 5 but key 9 .*slice a static KV buffer'):
        pe.prepare(q5.expand(2, 1), k10.expand(2, 10), causal=True)  # every row is checked
    with torch.no_grad():
        ctx = pe.prepare(q5, k10[:, :6], causal=True)
        sliced = position_attention(pe, q[:, :, 5:6], k[:, :, :6], v[:, :, :6], ctx, 0)
        full = position_attention(pe, q, k, v, pe.prepare(k10, k10, causal=True), 0)
    torch.testing.assert_close(sliced, full[:, :, 5:6])  # the query at 5 sees keys 0-5, as in the whole text
    with checked_inputs():  # a caller that checked its inputs itself: not read
        pe.prepare(q5, k10, causal=True)


def test_F8_legit_causal_positions_run():
    "F8: left padding (repeated 0s), packed documents (restarts) and a KV cache (new positions last) pass."
    pe = _order_encodings()['rope']
    left = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 0, 1]])
    for q_pos, k_pos in ((left, left), (left[:, 3:], left), (torch.tensor([8, 9]), torch.arange(10)[None])):
        assert pe.prepare(q_pos, k_pos, causal=True).causal is True
    late = left[:, 3:].clone()
    late[1, 1] = 7
    with pytest.raises(ValueError, match='in row 1, query 1 has position 7 but key 4 in its place'):
        pe.prepare(late, left, causal=True)
    assert pe.prepare(torch.tensor([[5]]), torch.arange(10)[None]).causal is False  # a static buffer


def test_F9_the_causal_buckets_of_t5_are_prepared_causal():
    """F9: as F6, for T5's causal buckets: refused by default, by keyword, inside `checked_inputs()`, as a
    `CombinedEncoding` member, in `MultiHeadAttention` with a causal mask, and in an `Encoder`; causal=True
    runs."""
    from posenc_lit.core import checked_inputs
    from posenc_lit.model import EncoderForMLM, ModelConfig
    from posenc_lit.t5 import T5RelativeBias

    pe, pos = T5RelativeBias(H, num_buckets=8, max_distance=16, bidirectional=False), torch.arange(5)[None]
    msg = r"T5RelativeBias is a causal form here \(causal_only\).*T5's bucket 0.*Prepare it with causal=True"
    both = CombinedEncoding(ALiBi(H), pe)
    for call in (
        lambda: pe.prepare(pos, pos),
        lambda: pe.prepare(pos, pos, key_mask=torch.ones(1, 5, dtype=torch.bool), causal=False),
        lambda: both.prepare(pos, pos, causal=False),
    ):
        with pytest.raises(ValueError, match=msg + '.*bidirectional=True'):
            call()
    with checked_inputs(), pytest.raises(ValueError, match=msg):  # the contract's checks skipped: refused
        pe.prepare(pos, pos, causal=False)
    attn, x = MultiHeadAttention(H * D, H), torch.randn(1, 5, H * D)
    with pytest.raises(ValueError, match=msg):  # a causal mask instead of causal=True
        attn(x, causal_mask(5, 5), pe=pe)
    assert pe.prepare(pos, pos, causal=True).causal is True
    cfg = ModelConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, pe='t5',
                      pe_kwargs={'bidirectional': False})
    with pytest.raises(ValueError, match=msg):  # an encoder attends both ways
        EncoderForMLM(cfg)(torch.randint(5, 50, (2, 6)))
