"""Parity of the relative encodings with their reference implementations, and their memory footprint.

- T5 buckets against `transformers`' own `T5Attention._relative_position_bucket` (installed with the dev extras).
- Shaw keys and Huang et al. method 4 against golden outputs of HF BERT's `relative_key` / `relative_key_query`
  (transformers 4.57.6; made by `tools/make_hf_goldens.py`, committed as a fixture).
- Peak memory of the vectorized relative term against the `(i, j, d)` tensor of the naive computation.
"""
import json, subprocess, sys, textwrap
from pathlib import Path
import pytest
import torch
from safetensors import safe_open
from posenc_lit.checks import test_close_rel as close_rel   # renamed so that pytest does not collect it
from posenc_lit.attention import MultiHeadAttention
from posenc_lit.relative import Shaw, HuangMethod4
from posenc_lit.t5 import t5_bucket

FIXTURE = Path(__file__).parent / 'fixtures' / 'hf_bert_relative.safetensors'


@pytest.mark.parametrize('bidirectional,num_buckets,max_distance',
                         [(True, 32, 128), (False, 32, 128), (True, 8, 20), (False, 16, 64), (True, 64, 1000), (False, 10, 6)])
def test_t5_buckets_match_transformers(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention
    rel = torch.arange(-1000, 1001)
    theirs = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    ours = t5_bucket(rel, bidirectional, num_buckets, max_distance)
    assert ours.dtype == torch.int64
    assert torch.equal(ours, theirs), (ours != theirs).nonzero()[:5]


def _golden():
    with safe_open(str(FIXTURE), 'pt') as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    assert meta['transformers'].startswith('4.'), meta
    return json.loads(meta['config']), tensors


@pytest.mark.parametrize('kind', ['relative_key', 'relative_key_query'])
@pytest.mark.parametrize('case', ['self', 'cross'])
def test_bert_relative_parity(kind, case):
    cfg, g = _golden()
    D, H, L = cfg['hidden_size'], cfg['num_attention_heads'], cfg['max_position_embeddings']
    mha = MultiHeadAttention(D, H).double().eval()
    with torch.no_grad():
        for ours, theirs in (('q_proj', 'query'), ('k_proj', 'key'), ('v_proj', 'value')):
            getattr(mha, ours).weight.copy_(g[f'{kind}.{theirs}.weight']); getattr(mha, ours).bias.copy_(g[f'{kind}.{theirs}.bias'])
        mha.o_proj.weight.copy_(torch.eye(D)); mha.o_proj.bias.zero_()          # HF's self-attention returns the context
    # HF indexes its table by i - j (row i - j + L - 1); ours by j - i (row j - i + k): the same table reversed
    make = (lambda: Shaw(D // H, 1, k=L - 1, values=False)) if kind == 'relative_key' else (lambda: HuangMethod4(D // H, 1, k=L - 1))
    pe = make().double()
    with torch.no_grad(): pe.key_tables[0].copy_(g[f'{kind}.distance_embedding.weight'].flip(0))
    p = f'{kind}.{case}'
    x, kv, keep = g[f'{p}.hidden_states'], g[f'{p}.key_states'], g[f'{p}.key_mask'].bool()
    ctx = pe.prepare(torch.arange(x.shape[1])[None], torch.arange(kv.shape[1])[None])
    mask = keep[:, None, None, :]
    for fast in (True, False):
        out = mha(x, mask=mask, pe=pe, ctx=ctx, kv=kv, fast=fast)
        close_rel(out, g[f'{p}.context'], atol=1e-9, rtol=1e-9, msg=f'{kind} {case} fast={fast}')
    _, probs = mha(x, mask=mask, pe=pe, ctx=ctx, kv=kv, return_probs=True)
    close_rel(probs, g[f'{p}.probs'], atol=1e-9, rtol=1e-9, msg=f'{kind} {case} probabilities')
    # and the golden really depends on the relative term: without it the outputs differ
    with torch.no_grad(): pe.key_tables[0].zero_()
    assert (mha(x, mask=mask, pe=pe, ctx=ctx, kv=kv) - g[f'{p}.context']).abs().max() > 1e-3


_MEMORY_PROBE = textwrap.dedent('''
    import sys, torch
    torch.set_num_threads(1)
    from posenc_lit.relative import HuangMethod4
    from posenc_lit.attention import MultiHeadAttention
    mode, L, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    def status(field):   # kB figures of /proc/self/status, in bytes
        return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith(field + ':'))
    with torch.no_grad():
        pe, attn = HuangMethod4(d, 1, k=L - 1), MultiHeadAttention(d, 1)
        pos = torch.arange(L)[None]
        q, k = torch.randn(1, 1, L, d), torch.randn(1, 1, L, d)
        pe.score_terms(q[:, :, :8], k[:, :, :8], pe.prepare(pos[:, :8], pos[:, :8]), attn)   # warm up kernels
        open('/proc/self/clear_refs', 'w').write('5')     # reset the peak resident set size (VmHWM) to the current one
        base = status('VmRSS')
        if mode == 'vectorized':
            terms = pe.score_terms(q, k, pe.prepare(pos, pos), attn)
        else:   # the HF way: gather an (i, j, d) tensor of vectors, then two einsums
            a = pe.key_tables[0][pe.prepare(pos, pos).rel_idx[0]]                 # (i, j, d)
            terms = [torch.einsum('bhid,ijd->bhij', q, a), torch.einsum('bhjd,ijd->bhij', k, a)]
    print(status('VmHWM') - base)
''')


def _peak_bytes(mode, L, d):
    r = subprocess.run([sys.executable, '-c', _MEMORY_PROBE, mode, str(L), str(d)], capture_output=True, text=True, check=True)
    return int(r.stdout.strip())


def test_relative_term_memory_grows_like_the_score_matrix():
    L = 1024
    score_bytes = L * L * 4                                          # one float32 (i, j) matrix: 4 MiB
    naive_64 = _peak_bytes('naive', L, 64)
    assert naive_64 >= L * L * 64 * 4, naive_64                      # the probe sees an (i, j, d) tensor when there is one
    vec_64, vec_256 = _peak_bytes('vectorized', L, 64), _peak_bytes('vectorized', L, 256)
    assert vec_64 < 16 * score_bytes, (vec_64, score_bytes)          # a few (i, j)-sized tensors: scores, indices, gathers
    assert vec_256 < 1.25 * vec_64 + 2**20, (vec_256, vec_64)        # and it does not grow with d (the naive one grows ∝ d)
    assert vec_64 * 4 < naive_64, (vec_64, naive_64)                 # several times less than the naive computation
