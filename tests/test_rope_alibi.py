"""Parity of RoPE and ALiBi (`posenc_lit.rope`, `posenc_lit.alibi`) with Hugging Face `transformers` 5.x.

- RoPE, half-split pairing: `LlamaRotaryEmbedding` (the cos/sin LLaMA builds) + `modeling_llama.apply_rotary_pos_emb`,
  float32, batched and offset positions; the frequencies of HF's `linear` (position interpolation) and `dynamic` NTK
  rope types; partial rotary against GPT-NeoX (`GPTNeoXRotaryEmbedding` + its `apply_rotary_pos_emb`); the
  interleaved pairing against HF after `pairing_permutation`.
- ALiBi: slopes against BLOOM's (`modeling_bloom._get_alibi_slopes`, which follows the authors' code) for 1 to 64
  heads; `build_alibi_tensor` (which adds slope·j) against our causal form: the difference is constant along each
  row and the softmax probabilities under a causal mask are equal.
Relative differences are max|ours − HF| / max|HF|, float32; run with `-s` to print them.
"""
import pytest
import torch

from transformers import LlamaConfig, GPTNeoXConfig   # a dev dependency (settings.ini): a missing install fails, it does not skip
from transformers.models.llama import modeling_llama as llama
from transformers.models.gpt_neox import modeling_gpt_neox as neox
from transformers.models.bloom import modeling_bloom as bloom
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from posenc_lit.rope import RoPE, rope_frequencies, pairing_permutation
from posenc_lit.alibi import alibi_slopes, alibi_bias
from posenc_lit.attention import attend

TOL = 1e-5


def rel_diff(ours, theirs, what=''):
    d = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    print(f'{what}: max relative difference {d:.2e}')
    return d


def positions(b, n, offset):
    "Positions `(b, n)`: example e starts at `offset·e` (offsets beyond any trained length are fine for RoPE)."
    return torch.arange(n)[None] + offset * torch.arange(b)[:, None]


# ---------------------------------------------------------------- RoPE

def llama_config(d_head=16, heads=4, **rope):
    return LlamaConfig(hidden_size=d_head * heads, num_attention_heads=heads, max_position_embeddings=32,
                       rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0, **rope})


@pytest.mark.parametrize('d_head,base', [(16, 10000.0), (32, 10000.0), (8, 500000.0)])
@pytest.mark.parametrize('offset', [0, 1000])
def test_rope_matches_llama(d_head, base, offset):
    torch.manual_seed(0)
    b, h, n = 2, 4, 13
    q, k = torch.randn(b, h, n, d_head), torch.randn(b, h, n, d_head)
    pos = positions(b, n, offset)
    rot = llama.LlamaRotaryEmbedding(llama_config(d_head, h, rope_theta=base))
    cos, sin = rot(q, pos)                                            # (b, n, d)
    q_hf, k_hf = llama.apply_rotary_pos_emb(q, k, cos, sin)
    pe = RoPE(d_head, base=base)                                      # pairing='half' is the default
    q_ours, k_ours = pe.transform_qk(q, k, pe.prepare(pos, pos), None)
    assert rel_diff(q_ours, q_hf, f'rope q d={d_head} base={base:g} offset={offset}') <= TOL
    assert rel_diff(k_ours, k_hf, 'rope k') <= TOL
    assert rel_diff(q_ours @ k_ours.transpose(-1, -2), q_hf @ k_hf.transpose(-1, -2), 'rope scores') <= TOL
    assert torch.equal(pe.inv_freq(), rot.inv_freq)


def test_rope_interleaved_matches_llama_after_permutation():
    "The paper's interleaved pairing is HF's half-split one after `pairing_permutation` of the head dimensions."
    torch.manual_seed(1)
    q, k, pos = torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16), positions(2, 9, 7)
    idx = pairing_permutation(16, src='interleaved', dst='half')
    cos, sin = llama.LlamaRotaryEmbedding(llama_config())(q, pos)
    q_hf, k_hf = llama.apply_rotary_pos_emb(q[..., idx], k[..., idx], cos, sin)
    pe = RoPE(16, pairing='interleaved')
    q_ours, k_ours = pe.transform_qk(q, k, pe.prepare(pos, pos), None)
    assert rel_diff(q_ours[..., idx], q_hf, 'interleaved q, permuted') <= TOL
    assert rel_diff(q_ours @ k_ours.transpose(-1, -2), q_hf @ k_hf.transpose(-1, -2), 'interleaved scores') <= TOL


@pytest.mark.parametrize('factor', [1.0, 2.0, 4.0])
def test_position_interpolation_matches_hf_linear(factor):
    cfg = llama_config(rope_type='linear', factor=factor)
    theirs, _ = ROPE_INIT_FUNCTIONS['linear'](cfg, None)
    ours = rope_frequencies(16, scaling='linear', factor=factor)
    assert rel_diff(ours, theirs, f'PI frequencies, factor {factor}') <= 1e-7
    torch.manual_seed(2)
    q, pos = torch.randn(1, 4, 11, 16), positions(1, 11, 0)
    q_hf, _ = llama.apply_rotary_pos_emb(q, q, *llama.LlamaRotaryEmbedding(cfg)(q, pos))
    pe = RoPE(16, scaling='linear', factor=factor)
    assert rel_diff(pe.transform_qk(q, q, pe.prepare(pos, pos), None)[0], q_hf, 'PI q') <= TOL


@pytest.mark.parametrize('factor', [2.0, 4.0, 8.0])
def test_ntk_matches_hf_dynamic(factor):
    "HF's dynamic NTK at a length `factor` times the trained one (its own factor 1) is the static NTK-aware base b·s^(d/(d-2))."
    cfg = llama_config(rope_type='dynamic', factor=1.0)
    theirs, _ = ROPE_INIT_FUNCTIONS['dynamic'](cfg, None, seq_len=int(32 * factor))
    ours = rope_frequencies(16, scaling='ntk', factor=factor)
    assert rel_diff(ours, theirs, f'NTK frequencies, factor {factor}') <= 1e-6


@pytest.mark.parametrize('pct', [0.25, 0.5])
def test_partial_rotary_matches_gpt_neox(pct):
    torch.manual_seed(3)
    d_head, h = 32, 4
    cfg = GPTNeoXConfig(hidden_size=d_head * h, num_attention_heads=h,
                        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': pct})
    q, k, pos = torch.randn(2, h, 10, d_head), torch.randn(2, h, 10, d_head), positions(2, 10, 50)
    cos, sin = neox.GPTNeoXRotaryEmbedding(cfg)(q, pos)               # (b, n, d_r)
    q_hf, k_hf = neox.apply_rotary_pos_emb(q, k, cos, sin)
    pe = RoPE(d_head, rotary_dim=int(d_head * pct))
    q_ours, k_ours = pe.transform_qk(q, k, pe.prepare(pos, pos), None)
    assert rel_diff(q_ours, q_hf, f'partial rotary q, {pct}') <= TOL and rel_diff(k_ours, k_hf, 'partial rotary k') <= TOL


# ---------------------------------------------------------------- ALiBi

def test_alibi_slopes_match_bloom():
    worst = 0.0
    for h in range(1, 65):
        theirs = bloom._get_alibi_slopes(h, torch.device('cpu'))
        ours = alibi_slopes(h)
        assert ours.shape == theirs.shape == (h,)
        worst = max(worst, ((ours - theirs).abs() / theirs).max().item())
    print(f'alibi slopes, 1-64 heads: max relative difference {worst:.2e}')
    assert worst <= 1e-6


@pytest.mark.parametrize('h', [8, 6, 12, 20])
def test_alibi_causal_bias_matches_bloom_up_to_a_row_constant(h):
    n = 11
    theirs = bloom.build_alibi_tensor(torch.ones(1, n, dtype=torch.long), h, torch.float32).view(1, h, 1, n)   # slope·j
    ours = alibi_bias(torch.arange(n), torch.arange(n), alibi_slopes(h), bidirectional=False)                 # (1, h, i, j)
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    diff = (theirs - ours).expand(1, h, n, n)
    row = diff[..., :1]                                               # each row's constant: slope·i
    spread = (diff - row).masked_fill(~causal, 0).abs().max().item()
    print(f'alibi h={h}: difference from BLOOM varies along a row by at most {spread:.2e}')
    assert spread <= 1e-5
    assert torch.allclose(row[0, :, :, 0], alibi_slopes(h)[:, None] * torch.arange(n).float(), rtol=1e-6, atol=1e-6)
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, h, n, 8) for _ in range(3))
    _, p_theirs = attend(q, k, v, [theirs], causal, return_probs=True)
    _, p_ours = attend(q, k, v, [ours], causal, return_probs=True)
    assert rel_diff(p_ours, p_theirs, f'alibi h={h} probabilities') <= TOL
