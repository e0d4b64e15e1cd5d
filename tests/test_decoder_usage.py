"""Issue 41, part 2: the causal decoder as a user meets it, and the encoder under left padding.

- packed sequences: documents in one row with restarted `position_ids` give each document's logits alone, in
  one call and in cached decoding;
- left padding: a padded row equals the row alone, in `Encoder` and `CausalLM`, for every registered encoding;
- an attention mask that covers the cache and the new tokens (as `transformers`' `generate` passes it);
- `torch.jit.trace` and `torch.export` of `CausalLM` itself, for every encoding it takes.
"""

import warnings

import pytest
import torch

from posenc_lit.alibi import ALiBi
from posenc_lit.causal_lm import CausalLM
from posenc_lit.core import list_encodings
from posenc_lit.model import Encoder, ModelConfig, build_encoding
from posenc_lit.t5 import T5RelativeBias

V, D, H, L, TOL = 50, 16, 2, 2, 1e-5
REGISTERED = sorted(list_encodings())
DECODER_FORMS = {  # the decoder forms of T5 (one-sided buckets) and ALiBi (the paper's causal form)
    't5-causal': lambda: T5RelativeBias(H, num_buckets=8, max_distance=16, bidirectional=False),
    'alibi-causal': lambda: ALiBi(H, bidirectional=False),
}
DECODER = REGISTERED + sorted(DECODER_FORMS)


# FIRE reads the query's own position only past its threshold L (512 tokens by default): a threshold of a few
# tokens makes these short rows depend on where they sit, so a wrong position shows for FIRE too
PE_KWARGS = {'fire': {'init_L': 2.0}}


def cfg(pe):
    return ModelConfig(vocab_size=V, d_model=D, n_heads=H, n_layers=L, d_ff=32, pe=pe,
                       pe_kwargs=PE_KWARGS.get(pe, {}), max_position_embeddings=32, dropout=0.0, attn_dropout=0.0)


def weigh(model):  # position parameters of weight 1, so that a wrong position shows
    with torch.no_grad():
        for p in model.pe.parameters():
            p.normal_()
    return model


def lm_of(name, seed=0):
    torch.manual_seed(seed)
    pe = DECODER_FORMS[name]() if name in DECODER_FORMS else build_encoding(cfg(name))
    return weigh(CausalLM(V, D, H, L, 32, pe=pe).eval())


def ids_of(*shape, seed=1):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


def gap(a, b):
    return (a - b).abs().max().item()


# ---------------------------------------------------------------- packed sequences


@pytest.mark.parametrize('fast', [True, False])
@pytest.mark.parametrize('name', DECODER)
def test_packed_documents_equal_each_document_alone(name, fast):
    "Row 0 packs A (4 tokens) and B (5) with positions 0…3, 0…4; row 1 is one document of 9."
    lm, a, b, c = lm_of(name), ids_of(1, 4, seed=1), ids_of(1, 5, seed=2), ids_of(1, 9, seed=3)
    ids = torch.cat([torch.cat([a, b], 1), c])
    pos = torch.stack([torch.cat([torch.arange(4), torch.arange(5)]), torch.arange(9)])
    with torch.no_grad():
        out = lm(ids, position_ids=pos, fast=fast)['logits']
        alone_a, alone_b = lm(a, fast=fast)['logits'], lm(b, fast=fast)['logits']
        assert gap(out[0, :4], alone_a[0]) <= TOL and gap(out[0, 4:], alone_b[0]) <= TOL
        assert gap(out[1], lm(c, fast=fast)['logits'][0]) <= TOL
        # the test has teeth: one document (positions 0 … 8) lets B read A
        assert gap(lm(ids, position_ids=torch.arange(9), fast=fast)['logits'][0, 4:], alone_b[0]) > 1e-3


@pytest.mark.parametrize('name', DECODER)
def test_packed_documents_in_cached_decoding_and_with_padding(name):
    "The packed row decoded token by token (positions given per step) and a left-padded packed row."
    lm, ids = lm_of(name), ids_of(2, 9)
    pos = torch.cat([torch.arange(4), torch.arange(5)]).expand(2, 9)
    with torch.no_grad():
        full = lm(ids, position_ids=pos)['logits']
        out = lm(ids[:, :3], position_ids=pos[:, :3], cache=lm.new_cache())
        steps = [out['logits']]
        for t in range(3, 9):
            out = lm(ids[:, t:t + 1], position_ids=pos[:, t:t + 1], cache=out['cache'])
            steps.append(out['logits'])
        assert gap(torch.cat(steps, 1), full) <= TOL
        # after the packed prompt, default positions continue the last document: B's next token at 5
        nxt = ids_of(2, 1, seed=5)
        b_then = lm(torch.cat([ids[:, 4:], nxt], 1))['logits'][:, -1]
        assert gap(lm(nxt, cache=out['cache'])['logits'][:, 0], b_then) <= TOL
        # two tokens of left padding before the packed row
        padded = torch.cat([torch.zeros(2, 2, dtype=torch.long), ids], 1)
        mask = torch.ones(2, 11, dtype=torch.bool)
        mask[:, :2] = False
        ppos = torch.cat([torch.zeros(2, 2, dtype=torch.long), pos], 1)
        assert gap(lm(padded, mask, position_ids=ppos)['logits'][:, 2:], full) <= TOL


# ---------------------------------------------------------------- left padding


@pytest.mark.parametrize('name', REGISTERED)
def test_left_padded_encoder_row_equals_the_row_alone(name):
    torch.manual_seed(0)
    enc, ids = weigh(Encoder(cfg(name)).eval()), ids_of(2, 9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False  # row 1: 3 tokens of left padding
    with torch.no_grad():
        out = enc(ids, attention_mask=mask)['hidden_states']
        assert gap(out[1, 3:], enc(ids[1:, 3:])['hidden_states'][0]) <= TOL
        assert gap(out[0], enc(ids[:1])['hidden_states'][0]) <= TOL
        # explicit position_ids are taken as given (here: the padding counted)
        explicit = enc(ids, attention_mask=mask, position_ids=torch.arange(9))['hidden_states']
        if enc.pe.relative_only:
            assert gap(explicit[1, 3:], out[1, 3:]) <= TOL
        else:
            assert gap(explicit[1, 3:], out[1, 3:]) > 1e-3


@pytest.mark.parametrize('name', DECODER)
def test_left_padded_decoder_row_equals_the_row_alone(name):
    lm, ids = lm_of(name), ids_of(2, 9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        out = lm(ids, mask)['logits']
        assert gap(out[1, 3:], lm(ids[1:, 3:])['logits'][0]) <= TOL
        assert gap(out[0], lm(ids[:1])['logits'][0]) <= TOL


# ---------------------------------------------------------------- a mask over the cache and the new tokens


@pytest.mark.parametrize('name', DECODER)
def test_a_mask_covering_the_cache_and_the_new_tokens(name):
    lm, ids, nxt = lm_of(name), ids_of(2, 6), ids_of(2, 2, seed=4)
    with torch.no_grad():
        c = lm(ids, cache=lm.new_cache())['cache']
        plain = lm(nxt, cache=c.fork())['logits']
        ones = lm(nxt, torch.ones(2, 8, dtype=torch.long), cache=c.fork())['logits']
        assert torch.equal(ones, plain)  # all ones: the same as no mask
        assert gap(plain, lm(torch.cat([ids, nxt], 1))['logits'][:, 6:]) <= TOL
        # left padding: the (b, n) mask and the (b, len(cache) + n) mask give the same, and the row alone
        mask = torch.ones(2, 6, dtype=torch.bool)
        mask[1, :2] = False
        c = lm(ids, mask, cache=lm.new_cache())['cache']
        new_only = lm(nxt, cache=c.fork())['logits']
        covering = lm(nxt, torch.cat([mask, torch.ones(2, 2, dtype=torch.bool)], 1), cache=c.fork())['logits']
        assert torch.equal(covering, new_only)
        assert gap(covering[1], lm(torch.cat([ids[1:, 2:], nxt[1:]], 1))['logits'][0, 4:]) <= TOL


def test_a_covering_mask_that_contradicts_the_cache_or_has_another_width():
    lm, ids = lm_of('rope'), ids_of(2, 6)
    with torch.no_grad():
        c = lm(ids, cache=lm.new_cache())['cache']
        wrong = torch.ones(2, 7, dtype=torch.bool)
        wrong[0, 1] = False  # a cached token said to be padding
        with pytest.raises(ValueError, match=r'len\(cache\)=6 columns of attention_mask must repeat.*row 0'):
            lm(ids[:, :1], wrong, cache=c.fork())
        with pytest.raises(ValueError, match=r'\(b, n\) = \(2, 1\).*\(b, len\(cache\) \+ n\) = \(2, 7\)'):
            lm(ids[:, :1], torch.ones(2, 5, dtype=torch.bool), cache=c.fork())
        with pytest.raises(ValueError, match='attention_mask must hold only 0 \\(padding\\) and 1'):
            lm(ids[:, :1], torch.full((2, 7), 2), cache=c.fork())
        with pytest.raises(ValueError, match=r'position_ids must be an integer tensor of shape \(b, n\)'):
            lm(ids, position_ids=torch.arange(5))


# ---------------------------------------------------------------- tracing and export


SHORT, LONG = ids_of(2, 8, seed=8), ids_of(2, 20, seed=20)


def _padding(n, n_pad):  # (2, n) bool: row 0 all real, row 1 with n_pad tokens of left padding
    m = torch.ones(2, n, dtype=torch.bool)
    m[1, :n_pad] = False
    return m


def _packed(n, first):  # (2, n) positions: row 0 two documents (first, then n - first tokens), row 1 one
    return torch.stack([torch.cat([torch.arange(first), torch.arange(n - first)]), torch.arange(n)])


@pytest.mark.parametrize('name', DECODER)
def test_jit_trace_of_the_decoder(name):
    "Traced at 8 tokens (with a mask; with packed positions), run at 20: equal to eager."
    lm = lm_of(name)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # torch.jit.trace is deprecated in favour of torch.export (below)
        masked = torch.jit.trace(lm, (SHORT, _padding(8, 3)), strict=False, check_trace=False)
        packed = torch.jit.trace(lm, example_kwarg_inputs={'input_ids': SHORT, 'position_ids': _packed(8, 3)},
                                 strict=False, check_trace=False)
    with torch.no_grad():
        for n, k in ((8, 3), (20, 7)):
            ids = SHORT if n == 8 else LONG
            assert gap(masked(ids, _padding(n, k))['logits'], lm(ids, _padding(n, k))['logits']) <= TOL, n
            pos = _packed(n, k)
            eager = lm(ids, position_ids=pos)['logits']
            assert gap(packed(input_ids=ids, position_ids=pos)['logits'], eager) <= TOL, n


@pytest.mark.parametrize('name', DECODER)
def test_export_of_the_decoder_with_a_dynamic_length(name):
    "Exported with a mask and packed positions at 8 tokens; at 20 tokens equal to eager."
    lm = lm_of(name)
    n = torch.export.Dim('n', min=2, max=31)
    ep = torch.export.export(lm, (SHORT,), {'attention_mask': _padding(8, 3), 'position_ids': _packed(8, 3)},
                             dynamic_shapes={'input_ids': {1: n}, 'attention_mask': {1: n},
                                             'position_ids': {1: n}})
    with torch.no_grad():
        for ids, k in ((SHORT, 3), (LONG, 7)):
            kw = {'attention_mask': _padding(ids.shape[1], k), 'position_ids': _packed(ids.shape[1], k)}
            assert gap(ep.module()(ids, **kw)['logits'], lm(ids, **kw)['logits']) <= TOL, ids.shape
