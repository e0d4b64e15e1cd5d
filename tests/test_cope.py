"""CoPE (`posenc_lit.cope`, Golovneva et al. 2024, eq. 3-6; issue 41 part 1).

- Parity of the hooks with a naive loop (one gate at a time, the embedding interpolated before the product) in
  float32, ≤ 1e-6: causal with left padding, signed (our encoder form) with padding, and fewer queries than keys.
- Closed forms: every gate 1 gives the paper's i - j + 1 (and i - j - 1 after the query, signed); every gate 0
  gives position 0; the term then reads row 0 for every key.
- Padding keys count nothing: a left-padded text in the `CausalLM` and a right-padded one in the `Encoder` give
  the logits of the same text without padding.
- Cached decoding in the `CausalLM` (queries fewer than keys) equals the full forward ≤ 1e-5.
- Parity with the authors' `ContextPosSelfAttn` (facebookresearch/RAM, `projects/cope`; the causal form,
  both settings of `--cope-nodiv`, outputs and probabilities at the real queries, float32, ≤ 1e-6): against
  the committed golden file of `tools/make_fire_cope_goldens.py` always, and live when $POSENC_COPE_REF names
  the authors' file.
- The fast and manual attention paths agree, gradients match finite differences, the constructor and `prepare`
  refuse bad input. (`tests/test_trace_export.py` and the registry walk of `tests/test_contract.py` cover
  `cope` with every other registered encoding.)
"""
import math
from pathlib import Path

import pytest
from conftest import check_golden, check_live, load_tool
import torch

from posenc_lit.attention import MultiHeadAttention, position_attention
from posenc_lit.causal_lm import CausalLM
from posenc_lit.cope import CoPE, cope_gates, cope_interpolate, cope_positions
from posenc_lit.core import list_encodings
from posenc_lit.model import Encoder, ModelConfig, padding_invariance_error

B, H, D = 2, 3, 8


def naive_term(pe, q, k, keep, causal, layer):
    "(b, h, i, j): eq. 3-6 one entry at a time; 0 where the key is after the query and not counted."
    b_, h_, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    e, top, out = pe.e[layer], pe.npos_max - 1, torch.zeros(b_, h_, n_q, n_k, dtype=q.dtype)
    for b in range(b_):
        for h in range(h_):
            for i in range(n_q):
                a = i + n_k - n_q  # the query's own key among the keys
                for j in range(n_k):
                    if j > a and (causal or not pe.bidirectional):
                        continue
                    p = 0.0
                    for t in range(min(j, a), max(j, a) + 1):  # eq. 4 (signed after the query)
                        if keep is None or keep[b, t]:
                            p = p + torch.sigmoid(q[b, h, i] @ k[b, h, t] / math.sqrt(q.shape[-1]))  # eq. 3
                    p = min(max(float(p if j <= a else -p), -top), top)
                    row = p + (top if pe.bidirectional else 0)
                    lo, hi = math.floor(row), math.ceil(row)
                    e_p = (row - lo) * e[hi] + (1 - row + lo) * e[lo]  # eq. 5
                    out[b, h, i, j] = q[b, h, i] @ e_p  # eq. 6's position term
    return out


def _inputs(n=7, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, n, D, generator=g, dtype=dtype) for _ in range(2))
    keep = torch.ones(B, n, dtype=torch.bool)
    keep[0, :2] = False  # left padding in row 0
    keep[1, -1] = False  # a padding key at the end of row 1
    return q, k, keep


@pytest.mark.parametrize('bidirectional,causal', [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize('n_q', [7, 3, 1])
def test_the_hooks_match_a_naive_loop_in_float32(bidirectional, causal, n_q):
    torch.manual_seed(0)
    pe = CoPE(D, 2, npos_max=4, bidirectional=bidirectional, init_std=0.5).eval()  # npos_max 4: counts clamp
    q, k, keep = _inputs()
    q = q[:, :, 7 - n_q:]  # the last n_q keys are the queries (a cache)
    ctx = pe.prepare(torch.arange(7 - n_q, 7), torch.arange(7), key_mask=keep, causal=causal)  # their positions
    with torch.no_grad():
        got = pe.score_terms(q, k, ctx, 1)[0]
        want = naive_term(pe, q, k, keep, causal, 1)
    assert got.dtype == torch.float32 and got.shape == (B, H, n_q, 7)
    if causal:  # keys after the query are masked by the attention: only the others are CoPE's
        live = torch.ones(n_q, 7, dtype=torch.bool).tril(7 - n_q)
        got, want = got[..., live], want[..., live]
    # float32 rounding of two orders of the same sums and products: ≤ 1e-6 of the largest term (≥ 1)
    err, scale = (got - want).abs().max().item(), max(1.0, want.abs().max().item())
    assert err <= 1e-6 * scale, (err, scale)


def test_closed_forms_of_the_positions():
    n = 9
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing='ij')
    ones, zeros = torch.ones(2, 3, n, n), torch.zeros(2, 3, n, n)
    causal = cope_positions(ones, signed=False)
    assert torch.equal(causal, torch.where(j <= i, i - j + 1, 0).float().expand(2, 3, n, n))  # the paper's
    signed = cope_positions(ones)
    assert torch.equal(signed, torch.where(j <= i, i - j + 1, i - j - 1).float().expand(2, 3, n, n))
    assert torch.equal(cope_positions(zeros), zeros) and torch.equal(cope_positions(zeros, signed=False), zeros)
    # fewer queries than keys: each query's row is the full square's row of its own key
    assert torch.equal(cope_positions(ones[:, :, -2:]), signed[:, :, -2:])


def test_all_gates_one_is_relative_pe_and_all_gates_zero_reads_row_zero():
    torch.manual_seed(0)
    pe = CoPE(D, 1, npos_max=10, init_std=1.0)
    n = 7
    q, k = torch.rand(B, H, n, D) + 0.1, 1000 * (torch.rand(B, H, n, D) + 0.1)  # q·k/√d > 28: σ = 1 in fp32
    assert torch.equal(cope_gates(q, k, D ** -0.5), torch.ones(B, H, n, n))
    pos = torch.arange(n)
    with torch.no_grad():
        t1 = pe.score_terms(q, k, pe.prepare(pos, pos, causal=True), 0)[0]
        i, j = torch.meshgrid(pos, pos, indexing='ij')
        rows = (i - j + 1).clamp(min=0) + 9  # row of count i - j + 1 (9: position 0)
        want = torch.einsum('bhid,ijd->bhij', q, pe.e[0][rows])
        lower = j <= i
        torch.testing.assert_close(t1[..., lower], want[..., lower], atol=1e-5, rtol=1e-6)
        none = torch.zeros(B, n, dtype=torch.bool)
        t0 = pe.score_terms(q, k, pe.prepare(pos, pos, key_mask=none), 0)[0]
        torch.testing.assert_close(t0, (q @ pe.e[0][9])[..., None].expand(B, H, n, n), atol=1e-5, rtol=1e-6)


def test_interpolation_is_eq_5():
    g = torch.Generator().manual_seed(1)
    e = torch.randn(7, D, generator=g, dtype=torch.float64)
    q = torch.randn(B, H, 5, D, generator=g, dtype=torch.float64)
    p = torch.rand(B, H, 5, 6, generator=g, dtype=torch.float64) * 6 - 3  # in [-3, 3]: a signed table, row0 3
    lo, hi = p.floor().long() + 3, p.ceil().long() + 3
    w = (p - p.floor())[..., None]
    e_p = w * e[hi] + (1 - w) * e[lo]  # (b, h, i, j, d)
    torch.testing.assert_close(cope_interpolate(q @ e.t(), p, 3), torch.einsum('bhid,bhijd->bhij', q, e_p))
    ints = p.round()
    assert torch.equal(cope_interpolate(q @ e.t(), ints, 3), (q @ e.t()).gather(-1, ints.long() + 3))


def test_gradients_match_finite_differences():
    "Through the gates, the positions (the interpolation weight) and the table, in float64."
    torch.manual_seed(0)
    q, k = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    e = (0.5 * torch.randn(5, 4, dtype=torch.float64)).requires_grad_()  # signed rows -2 … 2
    keep = torch.tensor([[False, True, True, True, True]])

    def term(q, k, e):  # score_terms' steps, with the table as an input
        p = cope_positions(cope_gates(q, k, 4 ** -0.5, keep)).clamp(-2, 2)
        return cope_interpolate(q @ e.t(), p, 2)

    pe = CoPE(4, 1, npos_max=3).double()
    with torch.no_grad():
        pe.e[0].copy_(e)
        pos = torch.arange(5)
        assert torch.equal(pe.score_terms(q, k, pe.prepare(pos, pos, key_mask=keep), 0)[0], term(q, k, e))
    assert torch.autograd.gradcheck(term, (q, k, e))


def test_fast_and_manual_paths_agree_in_values_and_gradients():
    torch.manual_seed(0)
    mha = MultiHeadAttention(24, 3, layer_idx=0)
    pe = CoPE(8, 1, init_std=0.5)
    x = torch.randn(2, 9, 24)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 6:] = False
    ctx = pe.prepare(torch.arange(9), torch.arange(9), key_mask=mask[:, 0, 0])
    outs, grads = [], []
    for fast in (True, False):
        pe.zero_grad()
        out = mha(x, mask, pe=pe, ctx=ctx, fast=fast)
        out.sum().backward()
        outs.append(out.detach())
        grads.append(pe.e[0].grad.clone())
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)
    assert grads[0].abs().sum() > 0


def _lm(bidirectional, seed=0):
    torch.manual_seed(seed)
    pe = CoPE(8, 2, npos_max=6, bidirectional=bidirectional, init_std=0.5)
    return CausalLM(40, 24, 3, 2, 32, pe=pe).eval()


@pytest.mark.parametrize('bidirectional', [False, True])
def test_cached_decoding_equals_the_full_forward(bidirectional):
    lm = _lm(bidirectional)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (2, 10), generator=g)
    am = torch.ones(2, 10, dtype=torch.long)
    am[0, :3] = 0  # left padding
    with torch.no_grad():
        full = lm(ids, attention_mask=am)['logits']
        out = lm(ids[:, :4], attention_mask=am[:, :4], cache=lm.new_cache())
        steps = [out['logits']]
        for t0, t1 in ((4, 5), (5, 8), (8, 10)):  # one token, then three, then two: L_q ≠ L_k each time
            out = lm(ids[:, t0:t1], attention_mask=am[:, t0:t1], cache=out['cache'])
            steps.append(out['logits'])
    real = am.bool()[:, :, None]
    err = ((torch.cat(steps, 1) - full) * real).abs().max().item()
    assert err <= 1e-5, err


@pytest.mark.parametrize('bidirectional', [False, True])
def test_padding_keys_do_not_count_in_the_causal_lm(bidirectional):
    "A left-padded text gives the logits of the same text without padding (CoPE reads no position values)."
    lm = _lm(bidirectional)
    ids = torch.randint(5, 40, (1, 6), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    am = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        a = lm(ids)['logits']
        b = lm(padded, attention_mask=am)['logits'][:, 3:]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_registered_encoding_in_the_encoder():
    assert 'cope' in list_encodings()
    spec = list_encodings()['cope']
    assert spec.kind == 'score' and 'Golovneva' in spec.source
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, d_model=24, n_layers=2, n_heads=3, d_ff=32, max_position_embeddings=16,
                      pe='cope', pe_kwargs={'npos_max': 8, 'init_std': 0.5}, dropout=0.0, attn_dropout=0.0)
    m = Encoder(cfg).eval()
    pe = m.pe
    assert isinstance(pe, CoPE) and pe.bidirectional and pe.npos_max == 8
    assert [t.shape for t in pe.e] == [(15, 8), (15, 8)]
    assert pe.max_len is None and pe.position_tables() == {} and pe.relative_only
    ids = torch.randint(5, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    assert padding_invariance_error(m, ids) < 1e-5  # padding keys appended and masked: nothing changes
    with torch.no_grad():
        out = m(torch.randint(5, 50, (1, 40)))  # longer than max_position_embeddings
        assert out['hidden_states'].shape == (1, 40, 24) and out['hidden_states'].isfinite().all()
        # the mask reached the encoding
        am = torch.ones(2, 12, dtype=torch.long)
        am[1, 9:] = 0
        ctx = m(ids, attention_mask=am)['ctx']
        assert torch.equal(ctx.key_mask, am.bool()) and ctx.causal is False


@pytest.mark.parametrize('kw,msg', [
    ({'d_head': 0}, 'd_head must be an integer ≥ 1'),
    ({'d_head': 8.0}, 'd_head must be an integer ≥ 1'),
    ({'n_layers': 0}, 'n_layers must be an integer ≥ 1'),
    ({'npos_max': 1}, 'npos_max must be an integer ≥ 2'),
    ({'npos_max': True}, 'npos_max must be an integer ≥ 2'),
    ({'npos_max': '64'}, 'npos_max must be an integer ≥ 2'),
    ({'bidirectional': 1}, 'bidirectional must be true or false'),
    ({'init_std': -0.1}, 'init_std must be a finite number ≥ 0'),
    ({'init_std': float('nan')}, 'init_std must be a finite number ≥ 0'),
    ({'init_std': '0.02'}, 'init_std must be a finite number ≥ 0'),
])
def test_the_constructor_refuses_bad_input(kw, msg):
    with pytest.raises(ValueError, match=msg):
        CoPE(**({'d_head': 8, 'n_layers': 2} | kw))


def test_prepare_and_the_hooks_refuse_bad_input():
    pos = torch.arange(5)
    with pytest.raises(ValueError, match=r"CoPE is a causal form here \(causal_only\).*got causal=False"):
        CoPE(8, 1, bidirectional=False).prepare(pos, pos)
    with pytest.raises(ValueError, match='got 5 queries for 3 keys'):
        CoPE(8, 1).prepare(pos, pos[:3])
    with pytest.raises(ValueError, match=r'key_mask must be a bool tensor \(b, j\) with j = 5'):
        CoPE(8, 1).prepare(pos, pos, key_mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match='causal must be true or false'):
        CoPE(8, 1).prepare(pos, pos, causal='yes')
    with pytest.raises(TypeError, match='signed integer tensor'):
        CoPE(8, 1).prepare(pos.float(), pos)
    pe = CoPE(8, 2)
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match='pass the layer index'):
        pe.score_terms(q, q, pe.prepare(pos, pos))
    with pytest.raises(ValueError, match='CoPE was built for d_head=8'):  # the contract's check, every path
        position_attention(pe, *[q[..., :4]] * 3, pe.prepare(pos, pos), 0)
    with pytest.raises(ValueError, match="the paper's causal form"):
        ModelConfig(pe='cope', pe_kwargs={'bidirectional': False})


def test_counts_stay_float32_for_bfloat16_inputs():
    "A bfloat16 sum of gates would have a resolution of 0.25 by position 64: gates and counts stay float32."
    q, k, keep = _inputs()
    qb, kb = q.bfloat16(), k.bfloat16()
    g = cope_gates(qb, kb, D ** -0.5, keep)
    assert g.dtype == torch.float32
    torch.testing.assert_close(g, cope_gates(qb.float(), kb.float(), D ** -0.5, keep), atol=1e-2, rtol=0)
    pe = CoPE(D, 1, init_std=0.5)
    t = pe.score_terms(qb, kb, pe.prepare(torch.arange(7), torch.arange(7), key_mask=keep), 0)[0]
    assert t.dtype == torch.float32 and t.isfinite().all()
    cfg = ModelConfig(vocab_size=50, d_model=24, n_layers=2, n_heads=3, d_ff=32, pe='cope')
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        out = Encoder(cfg).eval()(torch.randint(5, 50, (2, 9)))['hidden_states']
    assert out.isfinite().all()


# ---------------------------------------------------------------- parity with the authors' code
ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / 'tests' / 'fixtures' / 'cope_reference.safetensors'


def _tool():
    return load_tool('make_fire_cope_goldens')


def _ours_from_authors(gold, tool, nodiv):
    """Our causal CoPE holding the authors' tables: their `pos_emb` `(1, d, npos)` is our `e[l]ᵀ` `(npos, d)`;
    their position logits q·pos_emb are divided by sqrt(d) with the content logits (ours are added after the
    scaling), so our e = pos_emb/sqrt(d), or e = pos_emb with `cope_nodiv`. Both sides gate with
    σ(q·k/sqrt(d))."""
    pe = CoPE(tool.COPE_D, tool.COPE_LAYERS, npos_max=tool.COPE_NPOS, bidirectional=False)
    with torch.no_grad():
        for l in range(tool.COPE_LAYERS):
            pe.e[l].copy_(gold[f'layer{l}.pos_emb'][0].t() / (1.0 if nodiv else math.sqrt(tool.COPE_D)))
    return pe


def _check_against(gold, tool):
    "Our outputs and probabilities against the authors' `(b·h, i, ·)` tensors `gold`, at the real queries."
    assert torch.equal(CoPE(tool.COPE_D, 1, npos_max=tool.COPE_NPOS, bidirectional=False).e[0],
                       gold['init.pos_emb'][0].t())  # both start from zero tables
    q, k, v, keep = gold['q'], gold['k'], gold['v'], gold['keep']
    b, h, n, d = q.shape
    for nodiv in (False, True):
        pe = _ours_from_authors(gold, tool, nodiv)
        for case, n_q in tool.COPE_CASES.items():
            ctx = pe.prepare(torch.arange(n - n_q, n), torch.arange(n), key_mask=keep, causal=True)
            real = keep[:, n - n_q:].repeat_interleave(h, 0)  # (b·h, i); a padding query there sees itself
            g = cope_gates(q[:, :, n - n_q:], k, d ** -0.5, keep)
            assert cope_positions(g, signed=False).max() > tool.COPE_NPOS - 1  # the clamp is reached
            for l in range(tool.COPE_LAYERS):
                name = f"{'nodiv' if nodiv else 'div'}.{case}.layer{l}"
                with torch.no_grad():
                    out, probs = position_attention(pe, q[:, :, n - n_q:], k, v, ctx, l, return_probs=True)
                out, probs = out.reshape(b * h, n_q, d), probs.reshape(b * h, n_q, n)  # (b·h, i, ·), theirs
                torch.testing.assert_close(out[real], gold[f'{name}.out'][real], rtol=0, atol=1e-6)
                torch.testing.assert_close(probs[real], gold[f'{name}.attn'][real], rtol=0, atol=1e-6)
    # the scale of the table matters: the other setting's mapping does not match
    wrong = _ours_from_authors(gold, tool, nodiv=True)
    ctx = wrong.prepare(torch.arange(n), torch.arange(n), key_mask=keep, causal=True)
    with torch.no_grad():
        out = position_attention(wrong, q, k, v, ctx, 0).reshape(b * h, n, d)
    assert (out - gold['div.self.layer0.out'])[keep.repeat_interleave(h, 0)].abs().max() > 1e-2


def test_parity_with_the_authors_golden_file():
    "facebookresearch/RAM's ContextPosSelfAttn (see tools/make_fire_cope_goldens.py), fp32, ≤ 1e-6."
    tool = _tool()
    check_golden(GOLDEN, tool.COPE_REF, lambda gold: _check_against(gold, tool))


def test_parity_with_the_authors_live():
    tool = _tool()
    check = lambda gold: _check_against(gold, tool)
    check_live(tool.load_cope(), tool.COPE_REF, tool.COPE_ENV, tool.cope_goldens, check, "the authors' CoPE")
