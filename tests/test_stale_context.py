"""A context is valid for the weights it was prepared with (00_core, `check_context`): one used after its
encoding's parameters changed (an optimizer step, `load_state_dict`, an in-place edit) is refused on the
manual, fast and fused paths, where it would silently give the old position terms; a fresh `prepare` is
accepted, and the models (which prepare once per forward, and once per step when decoding) are unaffected."""
import pytest
import torch
from posenc_lit.attention import default_positions, position_attention, position_scores
from posenc_lit.causal_lm import CausalLM
from posenc_lit.deberta import DebertaRelative
from posenc_lit.fire import FIRE
from posenc_lit.fused import fused_scores
from posenc_lit.model import EncoderForMLM, ModelConfig
from posenc_lit.relative import Shaw
from posenc_lit.t5 import T5RelativeBias

STALE = 'prepared before the parameters of'


def _qkv(h=2, n=5, d=8):
    torch.manual_seed(0)
    return (torch.randn(1, h, n, d) for _ in range(3))


@pytest.mark.parametrize('make', [lambda: T5RelativeBias(2), lambda: FIRE(2, n_layers=1)], ids=['t5', 'fire'])
@pytest.mark.parametrize('fast', [False, True, 'fused'])
def test_a_context_used_after_an_in_place_update_is_refused(make, fast):
    pe, pos, (q, k, v) = make(), default_positions(5), _qkv()
    ctx = pe.prepare(pos, pos)
    with torch.no_grad():
        before = position_attention(pe, q, k, v, ctx, 0, fast=fast)
        torch.manual_seed(1)
        for p in pe.parameters():  # what an optimizer step does
            p.add_(torch.randn_like(p))
        fresh = position_attention(pe, q, k, v, pe.prepare(pos, pos), 0, fast=fast)
        if fast == 'fused' and isinstance(pe, T5RelativeBias):  # its fused path reads the weights live:
            torch.testing.assert_close(position_attention(pe, q, k, v, ctx, 0, fast=fast), fresh)  # none kept
        else:
            with pytest.raises(ValueError, match=STALE):
                position_attention(pe, q, k, v, ctx, 0, fast=fast)
    assert (fresh - before).abs().max() > 1e-3  # what a stale context would have hidden


def test_scores_and_fused_scores_refuse_it_too():
    pe, pos, (q, k, _) = T5RelativeBias(2), default_positions(5), _qkv()
    ctx = pe.prepare(pos, pos)
    position_scores(pe, q, k, ctx, 0)  # T5 makes its bias at the first read, then keeps it
    pe.load_state_dict({n: p + 1 for n, p in pe.state_dict().items()})
    for f in (position_scores, fused_scores):
        with pytest.raises(ValueError, match='call pe.prepare once per forward'):
            f(pe, q, k, ctx, 0)


def test_parameters_replaced_by_load_state_dict_assign_are_seen():
    "assign=True swaps in new parameter objects (version 0, like the old ones): the identities tell."
    pe, pos, (q, k, v) = T5RelativeBias(2), default_positions(5), _qkv()
    ctx = pe.prepare(pos, pos)
    position_attention(pe, q, k, v, ctx, 0)
    pe.load_state_dict({n: p + 1 for n, p in pe.state_dict().items()}, assign=True)
    assert pe.weight._version == 0  # what the version counters alone would have missed
    with pytest.raises(ValueError, match=STALE):
        position_attention(pe, q, k, v, ctx, 0)
    position_attention(pe, q, k, v, pe.prepare(pos, pos), 0)  # a fresh one is fine


def test_an_optimizer_step_between_two_uses_is_named_not_a_second_backward():
    pe, pos, (q, k, v) = T5RelativeBias(2), default_positions(5), _qkv()
    opt = torch.optim.SGD(pe.parameters(), lr=1.0)
    ctx = pe.prepare(pos, pos)
    position_attention(pe, q, k, v, ctx, 0).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match='after each optimizer step or load_state_dict'):
        position_attention(pe, q, k, v, ctx, 0)


def test_a_context_without_computed_terms_stays_valid():
    """Shaw's context holds rows and indices, DeBERTa's without LayerNorm a view of its table: an in-place
    update reaches them, nothing is stale, and they are accepted (the golden tests zero a table and reuse the
    context); DeBERTa's normalized rows are computed, and refused."""
    pos, (q, k, v) = default_positions(5), _qkv(d=4)
    qd = torch.randn(1, 2, 5, 8)
    for pe, qq in ((Shaw(4, 1), q), (DebertaRelative(16, 2, 1, k=4), qd)):
        ctx = pe.prepare(pos, pos)
        with torch.no_grad():
            before = position_attention(pe, qq, qq, qq, ctx, 0)
            for p in pe.parameters():
                p.add_(torch.randn_like(p))
            after = position_attention(pe, qq, qq, qq, ctx, 0)
            torch.testing.assert_close(after, position_attention(pe, qq, qq, qq, pe.prepare(pos, pos), 0))
        assert (after - before).abs().max() > 1e-3
    pe = DebertaRelative(16, 2, 1, k=4, norm_rel_ebd=True)
    ctx = pe.prepare(pos, pos)
    with torch.no_grad():
        pe.rel_embeddings.add_(1.0)
    with pytest.raises(ValueError, match=STALE):
        position_attention(pe, qd, qd, qd, ctx, 0)


def test_models_prepare_each_forward_train_and_decode():
    torch.manual_seed(0)
    for pe in ('t5', 'fire', 'shaw', 'deberta', 'tupe-a'):
        m = EncoderForMLM(ModelConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, pe=pe))
        opt, ids = torch.optim.SGD(m.parameters(), lr=0.1), torch.randint(0, 30, (2, 6))
        for _ in range(2):  # an optimizer step between two forwards: each prepares its own context
            m(ids, labels=ids)['loss'].backward()
            opt.step()
    lm = CausalLM(40, 24, 3, 2, 32, pe=FIRE(3, n_layers=2))
    opt, ids = torch.optim.SGD(lm.parameters(), lr=0.1), torch.randint(0, 40, (1, 4))
    lm(ids)['logits'].sum().backward()
    opt.step()
    with torch.no_grad():  # cached decoding: one prepare per step
        out = lm(ids, cache=lm.new_cache())
        for t in range(3):
            out = lm(ids[:, t : t + 1], cache=out['cache'])
