"""FIRE (Li et al. 2024, nbs/11_fire.ipynb): parity with a naive scalar loop, the closed form at chosen
points, cached decoding in the `CausalLM`, the `Encoder` with it, and the checks of its constructor.
Parity with the paper's listing as mcleish7/arithmetic holds it (j ≤ i, float32, ≤ 1e-6): against the
committed golden file of `tools/make_fire_cope_goldens.py` always, and live when $POSENC_FIRE_REF names the
reference file.

One formula serves both attentions: for the keys a causal query sees (j ≤ i) it is the paper's
`f_θ(ψ(i-j)/ψ(max(L, i)))`; keys after the query (the bidirectional encoder) get the odd extension
ψ(-t) = -ψ(t).
"""
import math
import re
from dataclasses import replace
from pathlib import Path
import pytest
from conftest import check_golden, check_live, load_tool
import torch
from posenc_lit.attention import default_positions, position_attention
from posenc_lit.causal_lm import CausalLM
from posenc_lit.core import get_encoding
from posenc_lit.fire import FIRE, fire_inputs, fire_psi
from posenc_lit.model import ModelConfig, Encoder, EncoderForMLM, padding_invariance_error


def naive_bias(pe, q_pos, k_pos, t=0):
    "`(b, h, i, j)` float64: each entry from the definition, one pair and one hidden unit at a time."
    c, L, eps = abs(pe.c[t].item()), pe.threshold()[t].item(), pe.eps
    psi = lambda v: math.copysign(math.log(c * abs(v) + 1), v)  # odd: the encoder's keys after the query
    lin1, lin2 = pe.mlps[t][0], pe.mlps[t][2]
    W1, b1, W2, b2 = (p.double().tolist() for p in (lin1.weight, lin1.bias, lin2.weight, lin2.bias))
    B, n_q, n_k = max(len(q_pos), len(k_pos)), q_pos.shape[1], k_pos.shape[1]
    out = torch.zeros(B, pe.n_heads, n_q, n_k, dtype=torch.float64)
    for b in range(B):
        for i in range(n_q):
            for j in range(n_k):
                qi, kj = q_pos[min(b, len(q_pos) - 1), i].item(), k_pos[min(b, len(k_pos) - 1), j].item()
                x = psi(qi - kj) / (psi(max(L, qi)) + eps)
                hid = [max(0.0, w[0] * x + bb) for w, bb in zip(W1, b1)]
                for h in range(pe.n_heads):
                    out[b, h, i, j] = sum(w * a for w, a in zip(W2[h], hid)) + b2[h]
    return out


@pytest.fixture
def pe():
    torch.manual_seed(0)
    pe = FIRE(n_heads=3, n_layers=2, init_L=5.0)
    with torch.no_grad():  # weights and c, L of their own, so a mix-up of layers or parameters would show
        for p in pe.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return pe


@pytest.mark.parametrize('causal', [False, True])
def test_parity_with_a_naive_loop(pe, causal):
    "fp32 bias ≤ 1e-6 from the float64 scalar loop; positions cross L = 5 (row 1 starts past it), batched."
    pos = torch.stack([torch.arange(9), torch.arange(9) + 4])
    with torch.no_grad():
        ctx = pe.prepare(pos, pos, causal=causal)
    seen = torch.ones(9, 9, dtype=torch.bool).tril() if causal else torch.ones(9, 9, dtype=torch.bool)
    for t in range(2):
        got, ref = ctx.fire_bias[t].double(), naive_bias(pe, pos, pos, t)
        assert got.dtype == torch.float64 and got.shape == (2, 3, 9, 9)
        assert (got - ref)[..., seen].abs().max().item() <= 1e-6
    # a KV-cache step: the last 3 positions as queries against all keys
    with torch.no_grad():
        step = pe.prepare(pos[:, -3:], pos, causal=True).fire_bias[1].double()
    assert (step - naive_bias(pe, pos[:, -3:], pos, 1)).abs().max().item() <= 1e-6


def test_closed_form_at_chosen_points():
    c, L = torch.tensor(0.1, dtype=torch.float64), torch.tensor(8.0, dtype=torch.float64)
    assert fire_psi(torch.tensor(0.0, dtype=torch.float64), c).item() == 0.0  # ψ(0) = 0
    psi30 = fire_psi(torch.tensor(30.0, dtype=torch.float64), c).item()
    assert psi30 == pytest.approx(math.log(4.0), abs=1e-15)
    pos = torch.arange(20)
    x = fire_inputs(pos, pos, c, L)[0]  # (i, j)
    psi = lambda v: math.log(0.1 * v + 1)
    # i < L: normalized by ψ(L); i ≥ L: by ψ(i); a key after the query: -ψ(j - i)
    assert x[5, 2].item() == pytest.approx(psi(3) / (psi(8) + 1e-6), rel=1e-12)
    assert x[7, 0].item() == pytest.approx(psi(7) / (psi(8) + 1e-6), rel=1e-12)
    assert x[12, 2].item() == pytest.approx(psi(10) / (psi(12) + 1e-6), rel=1e-12)
    assert x[2, 5].item() == pytest.approx(-psi(3) / (psi(8) + 1e-6), rel=1e-12)
    assert x[12, 15].item() == pytest.approx(-psi(3) / (psi(12) + 1e-6), rel=1e-12)
    # below L the input is Toeplitz (a function of i - j only); past L it is not
    assert torch.equal(x[1:8, 1:8], x[:7, :7]) and not torch.equal(x[10:, 10:], x[9:-1, 9:-1])
    # the keys a causal query sees map into [0, 1), whatever the length
    lower = torch.ones(20, 20, dtype=torch.bool).tril()
    assert x[lower].min() >= 0 and x[lower].max() < 1 and x[~lower].max() < 0


def test_the_threshold_and_c_are_learned_and_their_signs_do_not_matter():
    pe = FIRE(2, init_c=0.1, init_L=16.0)
    assert pe.threshold().tolist() == [16.0] and pe.c.tolist() == pytest.approx([0.1])
    pos = default_positions(30)
    with torch.no_grad():
        ref = pe.prepare(pos, pos).fire_bias[0]
        pe.c.neg_(), pe.L_scale.neg_()  # |c x| and |ℓ|·L_0, as in the authors' listing
        assert torch.equal(pe.prepare(pos, pos).fire_bias[0], ref)
    assert {n for n, p in pe.named_parameters()} >= {'c', 'L_scale'} and 'init_L' in dict(pe.named_buffers())


def test_layers_have_their_own_mlp_and_fire_s_shares_one():
    torch.manual_seed(0)
    pos, q = default_positions(6), torch.randn(1, 2, 6, 4)
    per, shared = FIRE(2, n_layers=3), FIRE(2, n_layers=3, share_layers=True)
    assert len(per.mlps) == 3 and len(shared.mlps) == 1
    cp, cs = per.prepare(pos, pos), shared.prepare(pos, pos)
    terms = [per.score_terms(q, q, cp, l)[0] for l in range(3)]
    assert all((terms[a] - terms[b]).abs().max() > 1e-4 for a, b in ((0, 1), (1, 2)))
    assert all(shared.score_terms(q, q, cs, l)[0] is cs.fire_bias[0] for l in range(3))
    with pytest.raises(ValueError, match='FIRE has one set of MLPs per layer'):
        per.score_terms(q, q, cp)
    with pytest.raises(ValueError, match='layer 3 but FIRE has MLPs for 3 layers'):
        shared.score_terms(q, q, cs, 3)
    with pytest.raises(ValueError, match='FIRE was built for 2 heads'):  # the contract's check, every path
        position_attention(per, *[torch.randn(1, 4, 6, 4)] * 3, cp, 0)


def test_cached_decoding_equals_the_full_forward():
    "Prompt of 4, then one token at a time, left padding in row 0; L = 3 so the threshold is crossed."
    torch.manual_seed(0)
    lm = CausalLM(40, 24, 3, 2, 32, pe=FIRE(3, n_layers=2, init_L=3.0)).eval()
    ids, am = torch.randint(0, 40, (2, 10)), torch.ones(2, 10, dtype=torch.long)
    am[0, :3] = 0
    with torch.no_grad():
        full = lm(ids, attention_mask=am)['logits']
        out = lm(ids[:, :4], attention_mask=am[:, :4], cache=lm.new_cache())
        steps = [out['logits']]
        for t in range(4, 10):
            out = lm(ids[:, t:t + 1], attention_mask=am[:, t:t + 1], cache=out['cache'])
            steps.append(out['logits'])
    real = am.bool()[:, :, None]
    assert ((torch.cat(steps, 1) - full) * real).abs().max().item() <= 1e-5


def test_the_causal_lm_trains_every_parameter():
    torch.manual_seed(0)
    lm = CausalLM(30, 16, 2, 2, 32, pe=FIRE(2, n_layers=2, init_L=4.0))
    ids = torch.randint(0, 30, (2, 12))
    logits = lm(ids)['logits']
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 30), ids[:, 1:].reshape(-1)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lm.pe.parameters())


def test_the_encoder_runs_with_it():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_position_embeddings=8,
                      pe='fire', pe_kwargs={'init_L': 6.0}, dropout=0.0, attn_dropout=0.0)
    m = EncoderForMLM(cfg).eval()
    with torch.no_grad():  # the model's init (normal, std 0.02) leaves the MLP's bias nearly flat
        for p in m.encoder.pe.mlps.parameters():
            p.normal_()
    assert isinstance(m.encoder.pe, FIRE) and m.encoder.pe.n_layers == 2 and not m.encoder.pe.relative_only
    ids = torch.randint(5, 50, (2, 11))
    m(ids, labels=ids)['loss'].backward()
    assert all(p.grad is not None for p in m.encoder.pe.parameters())
    assert padding_invariance_error(m, ids) < 1e-5
    with torch.no_grad():
        assert m(torch.randint(5, 50, (1, 30)))['hidden_states'].shape == (1, 30, 16)  # past the table size
        # below L a common shift changes nothing; past it, it does (relative_only is false)
        h = m(ids)['hidden_states']
        assert (m(ids, position_ids=torch.arange(11) + 20)['hidden_states'] - h).abs().max() > 1e-4
    enc = Encoder(replace(cfg, pe_kwargs={'init_L': 512.0})).eval()
    with torch.no_grad():
        a, b = enc(ids)['hidden_states'], enc(ids, position_ids=torch.arange(11) + 20)['hidden_states']
    assert (a - b).abs().max() < 1e-5


def test_registered():
    spec = get_encoding('fire')
    assert spec.kind == 'score' and 'Li et al. 2024' in spec.source
    pe = spec.factory(ModelConfig(n_heads=4, n_layers=3, pe='fire', pe_kwargs={'share_layers': True}))
    assert (pe.n_heads, pe.n_layers, pe.share_layers, len(pe.mlps)) == (4, 3, True, 1)
    with pytest.raises(ValueError, match='not accepted'):
        ModelConfig(pe='fire', pe_kwargs={'L': 8})


@pytest.mark.parametrize('kw,msg', [
    ({'n_heads': 0}, 'n_heads must be an integer ≥ 1; got 0'),
    ({'n_heads': 2.0}, 'n_heads must be an integer ≥ 1; got 2.0'),
    ({'n_layers': 0}, 'n_layers must be an integer ≥ 1'),
    ({'n_layers': True}, 'n_layers must be an integer ≥ 1; got True'),
    ({'mlp_width': -3}, 'mlp_width must be an integer ≥ 1'),
    ({'share_layers': 'yes'}, 'share_layers must be true or false'),
    ({'init_c': 0.0}, 'init_c must be a finite number > 0'),
    ({'init_c': float('nan')}, 'init_c must be a finite number > 0'),
    ({'init_L': -512.0}, 'init_L must be a finite number > 0'),
    ({'init_L': float('inf')}, 'init_L must be a finite number > 0'),
    ({'init_L': '512'}, 'init_L must be a finite number > 0'),
    ({'eps': 0.0}, 'eps must be a number in (0, 1)'),
    ({'eps': 1.0}, 'eps must be a number in (0, 1)'),
])
def test_bad_constructor_arguments(kw, msg):
    args = {'n_heads': 2} | kw
    with pytest.raises(ValueError, match=re.escape(msg)):
        FIRE(**args)


def test_positions_are_checked_at_prepare():
    pe = FIRE(2)
    with pytest.raises(TypeError, match='signed integer tensor'):
        pe.prepare(torch.arange(4).float(), torch.arange(4))
    with pytest.raises(TypeError, match='q_pos must be a signed integer tensor'):
        pe.prepare([0, 1, 2], [0, 1, 2])


def test_in_position_attention_with_a_mask_equals_the_written_out_attention():
    torch.manual_seed(0)
    pe = FIRE(2, n_layers=1, init_L=2.0).double()
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    pos = torch.stack([torch.arange(5), torch.arange(5) + 7])
    keep = torch.ones(2, 5, dtype=torch.bool)
    keep[1, :2] = False
    out = position_attention(pe, q, k, v, pe.prepare(pos, pos, key_mask=keep), 0, keep[:, None, None, :])
    logits = q @ k.transpose(-1, -2) / 2 + naive_bias(pe, pos, pos)
    ref = logits.masked_fill(~keep[:, None, None, :], float('-inf')).softmax(-1) @ v
    torch.testing.assert_close(out, ref, atol=1e-9, rtol=1e-9)


# ---------------------------------------------------------------- parity with the reference listing
ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / 'tests' / 'fixtures' / 'fire_reference.safetensors'


def _tool():
    return load_tool('make_fire_cope_goldens')


def _ours_from_reference(gold, tool):
    "Our FIRE, one MLP per layer, holding the reference modules' parameters (`layer{l}.` keys of the file)."
    pe = FIRE(tool.FIRE_H, n_layers=tool.FIRE_LAYERS, mlp_width=tool.FIRE_W, init_L=512.0)
    with torch.no_grad():
        for l in range(tool.FIRE_LAYERS):
            mlp = {k.split('.', 2)[2]: v for k, v in gold.items() if k.startswith(f'layer{l}.mlp.')}
            pe.mlps[l].load_state_dict(mlp)  # the same nn.Sequential: 0.weight, 0.bias, 2.weight, 2.bias
            pe.c[l] = gold[f'layer{l}.c']  # c of ψ(x) = log(|c x| + 1)
            pe.L_scale[l] = gold[f'layer{l}.L_multiplier']  # ℓ: L = |ℓ|·L_0
            assert torch.equal(pe.init_L, gold[f'layer{l}.init_L'])  # L_0 = 512, a buffer here, frozen there
    return pe


def _check_against(gold, tool):
    "Our initial MLP and bias against the reference tensors `gold`: keys at or before the query (j ≤ i) only."
    torch.manual_seed(tool.SEED)
    init = FIRE(tool.FIRE_H, mlp_width=tool.FIRE_W)  # the same draw as the reference's __init__
    for k, v in init.mlps[0].state_dict().items():
        assert torch.equal(v, gold[f'init.mlp.{k}']), k
    assert torch.equal(init.c[0], gold['init.c']) and torch.equal(init.L_scale[0], gold['init.L_multiplier'])
    assert torch.equal(init.init_L, gold['init.init_L'])
    pe = _ours_from_reference(gold, tool)
    assert (pe.threshold() < min(tool.FIRE_LENGTHS)).all()  # every length crosses L: both normalizers show
    for n in tool.FIRE_LENGTHS:
        pos, seen = torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril()
        with torch.no_grad():
            full = pe.prepare(pos, pos, causal=True)
            step = pe.prepare(pos[-3:], pos, causal=True)  # a cache step: the last 3 queries
        for l in range(tool.FIRE_LAYERS):
            ref = gold[f'layer{l}.bias.n{n}']  # (1, h, n, n)
            torch.testing.assert_close(full.fire_bias[l][..., seen], ref[..., seen], rtol=0, atol=1e-6)
            torch.testing.assert_close(step.fire_bias[l][..., seen[-3:]], ref[..., -3:, :][..., seen[-3:]],
                                       rtol=0, atol=1e-6)
            # after the query the reference is even in i - j (masked in its use), ours odd: they differ there
            assert (full.fire_bias[l] - ref)[..., ~seen].abs().max() > 1e-2


def test_parity_with_the_reference_golden_file():
    "mcleish7/arithmetic's FIRE (the paper's listing; see tools/make_fire_cope_goldens.py), fp32, ≤ 1e-6."
    tool = _tool()
    check_golden(GOLDEN, tool.FIRE_REF, lambda gold: _check_against(gold, tool))


def test_parity_with_the_reference_live():
    tool = _tool()
    check = lambda gold: _check_against(gold, tool)
    check_live(tool.load_fire(), tool.FIRE_REF, tool.FIRE_ENV, tool.fire_goldens, check, "the reference FIRE")
