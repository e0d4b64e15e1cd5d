"""The encoding contract of `posenc_lit.core`, checked on every registered encoding, and two encodings of our
own written against it.

- The registry walk: every text and image encoding prepares a context with and without `key_mask`/`causal`,
  of its declared `context_type`, owned by it; its transforms keep shapes, its score terms are
  `(b|1, h|1, i, j)`, its value terms `(b, h, i, d)`; `max_len` and `position_tables()` are declared and
  agree.
- Ownership: a context is used with the encoding instance that prepared it (issue 40); `LayerRef(-1)` and
  `LayerRef(True)` are refused as a plain -1 is; projections lent by a layer (`lend_projections`) stay the
  layer's, not parameters of the encoding.
- A FIRE-style score term (Li et al. 2024: an MLP of a log-transformed distance normalized by the query
  position) and a CoPE-style one (Golovneva et al. 2024: positions as gated counts over the keys a query sees,
  which need the key mask and the causal flag), defined here with no edit to the package, run through the
  `Encoder`, the `CausalLM` and the tutorial's own attention module (01a), each against a naive loop.
"""
import inspect
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn
from posenc_lit.core import (
    Context, LayerRef, PositionEncoding, check_context, list_encodings, register_encoding, _REGISTRY,
)
from posenc_lit.attention import (
    MultiHeadAttention, default_positions, position_attention, position_scores, causal_mask,
)
from posenc_lit.model import ModelConfig, Encoder
from posenc_lit.causal_lm import CausalLM
from posenc_lit.relative import Shaw
from posenc_lit.t5 import T5RelativeBias
from posenc_lit.vit import ViTConfig

TEXT = dict(vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_position_embeddings=24)
B, H, D_HEAD, N_LAYERS = 2, 2, 8, 2


# ------------------------------------------------------------ the toy encodings, against the contract only
@dataclass(eq=False)
class FireContext(Context):
    bias: torch.Tensor  # `(b|1, h, i, j)`


class ToyFire(PositionEncoding):
    """FIRE-style bias: `b_h(i, j) = f_θ(ψ(i - j) / ψ(max(L, i)))`, ψ(x) = sign(x)·log(c|x| + 1) (signed, so
    that a bidirectional encoder can use it too), f_θ a 1 → 8 → h MLP."""

    kind, context_type = 'score', FireContext
    relative_only = False  # ψ(max(L, i)) reads the query's own position: a shift changes the bias

    def __init__(self, n_heads, L=4.0, c=1.0):
        super().__init__()
        self.L, self.c, self.n_heads = L, c, n_heads  # n_heads declared: q with other heads is refused
        self.f = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, n_heads))

    def psi(self, x):
        return torch.sign(x) * torch.log(self.c * x.abs() + 1)

    def prepare(self, q_pos, k_pos, *, key_mask=None, causal=False):
        i, j = q_pos.float()[..., :, None], k_pos.float()[..., None, :]  # (b|1, i, 1), (b|1, 1, j)
        x = self.psi(i - j) / self.psi(i.clamp(min=self.L))  # (b|1, i, j)
        return FireContext(q_pos, k_pos, self.f(x[..., None]).permute(0, 3, 1, 2), pe=self)  # (b|1, h, i, j)

    def score_terms(self, q, k, ctx, layer=None):
        return [ctx.bias]


def fire_naive(pe, q_pos, k_pos, b, h, i, j):  # one entry, scalar arithmetic
    qi, kj = float(q_pos[min(b, len(q_pos) - 1), i]), float(k_pos[min(b, len(k_pos) - 1), j])
    psi = lambda x: math.copysign(math.log(pe.c * abs(x) + 1), x) if x else 0.0
    return pe.f(torch.tensor([psi(qi - kj) / psi(max(pe.L, qi))]))[h]


@dataclass(eq=False)
class CopeContext(Context):
    key_mask: torch.Tensor | None  # `(b, j)` bool
    causal: bool


class ToyCoPE(PositionEncoding):
    """CoPE-style term: gates `g_ik = σ(q_i·k_k)` over the real keys, positions `p_ij = Σ_k g_ik` for k from j
    to i (signed: negative for keys before the query when bidirectional; causal: only j ≤ i, so p ≥ 0), and
    the logit `q_i·e[p_ij]` with e interpolated between the integer rows of a learned table `(2P+1, d)`."""

    kind, context_type = 'score', CopeContext

    def __init__(self, d_head, P=6):
        super().__init__()
        self.P, self.d_head = P, d_head  # d_head declared: q of another width is refused
        self.e = nn.Parameter(torch.randn(2 * P + 1, d_head) * 0.5)  # row P + p: position p

    def prepare(self, q_pos, k_pos, *, key_mask=None, causal=False):
        return CopeContext(q_pos, k_pos, key_mask, causal, pe=self)

    def score_terms(self, q, k, ctx, layer=None):
        i, j = q.shape[2], k.shape[2]
        g = torch.sigmoid(q @ k.transpose(-1, -2))  # (b, h, i, j): g_ik, k over the key axis
        if ctx.key_mask is not None:
            g = g * ctx.key_mask[:, None, None, :]
        a = torch.arange(i, device=q.device)[:, None] + (j - i)  # (i, 1): each query's index among the keys
        if ctx.causal:
            g = g * causal_mask(i, j, q.device)
        C = g.cumsum(-1)  # (b, h, i, j): Σ_{k ≤ j} g_ik
        at_a = a.expand(*g.shape[:2], i, 1)
        Ca, ga = C.gather(-1, at_a), g.gather(-1, at_a)  # (b, h, i, 1): at the query's own key
        after, before = C - Ca + ga, Ca - C + g  # Σ over k in [a, j], over k in [j, a]
        kk = torch.arange(j, device=q.device)[None]  # (1, j)
        p = torch.where(kk >= a, after, -before).clamp(-self.P, self.P) + self.P  # (b, h, i, j), in [0, 2P]
        z = q @ self.e.t()  # (b, h, i, 2P+1): q_i·e[r] for every integer row
        lo = p.floor().long().clamp(max=2 * self.P - 1)
        w = p - lo
        return [z.gather(-1, lo) * (1 - w) + z.gather(-1, lo + 1) * w]


def cope_naive(pe, q, k, keep, causal, b, h, i, j):  # one entry: the sum over keys as a loop
    n_q, n_k = q.shape[2], k.shape[2]
    a = i + n_k - n_q
    lo_k, hi_k = min(a, j), max(a, j)
    p = 0.0
    for kk in range(lo_k, hi_k + 1):
        if (keep is None or keep[b, kk]) and not (causal and kk > a):
            p += torch.sigmoid(q[b, h, i] @ k[b, h, kk])
    p = (p if j >= a else -p)
    p = min(max(float(p), -pe.P), pe.P) + pe.P
    lo = min(int(math.floor(p)), 2 * pe.P - 1)
    e = pe.e[lo] * (1 - (p - lo)) + pe.e[lo + 1] * (p - lo)
    return q[b, h, i] @ e


def naive_attention(q, k, v, term, keep, causal, scale):  # `term(b, h, i, j)` a scalar; loops over everything
    b_, h_, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    out = torch.zeros(b_, h_, n_q, v.shape[-1], dtype=q.dtype)
    for b in range(b_):
        for h in range(h_):
            for i in range(n_q):
                a = i + n_k - n_q  # the query's own index among the keys
                js = [j for j in range(n_k) if (keep is None or keep[b, j]) and not (causal and j > a)]
                if js:  # a row with no key to attend gives 0
                    logits = torch.stack([scale * q[b, h, i] @ k[b, h, j] + term(b, h, i, j) for j in js])
                    out[b, h, i] = logits.softmax(0) @ v[b, h, js]
    return out


def layer_inputs(attn, x, kv=None):  # (b, h, n, d) projections of one MultiHeadAttention
    kv = x if kv is None else kv
    pairs = ((attn.q_proj, x), (attn.k_proj, kv), (attn.v_proj, kv))
    return tuple(attn.split_heads(proj(t)) for proj, t in pairs)


def merge(attn, out):  # (b, h, n, d) -> the layer's output (b, n, D)
    return attn.o_proj(out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1))


def toy_term(pe, q, k, ctx, keep, causal):
    if isinstance(pe, ToyFire):
        return lambda b, h, i, j: fire_naive(pe, ctx.q_pos, ctx.k_pos, b, h, i, j)
    return lambda b, h, i, j: cope_naive(pe, q, k, keep, causal, b, h, i, j)


@pytest.fixture(scope='module')
def toys():
    "The two toys registered as text encodings: the Encoder builds them by name, the registry walk sees them."
    register_encoding('toy-fire', 'score', 'FIRE-style toy', replace=True)(lambda cfg: ToyFire(cfg.n_heads))
    register_encoding('toy-cope', 'score', 'CoPE-style toy', replace=True)(
        lambda cfg: ToyCoPE(cfg.d_model // cfg.n_heads))
    yield TOYS
    del _REGISTRY['text', 'toy-fire'], _REGISTRY['text', 'toy-cope']


# ---------------------------------------------------------------- the registry walk
def _text(name):
    cfg = ModelConfig(**TEXT, pe=name)
    return list_encodings()[name].factory(cfg), {}


def _image(name):
    cfg = ViTConfig(image_size=(12, 16), patch_size=4, d_model=16, n_heads=2, n_layers=2, d_ff=32, pe=name)
    return list_encodings('image')[name].factory(cfg), {'grid': cfg.grid}


TOYS = ['toy-fire', 'toy-cope']
# every registered encoding, and the two toys (registered by the `toys` fixture when the tests run)
WALK = [('text', n) for n in list_encodings()] + [('image', n) for n in list_encodings('image')]
WALK += [('text', n) for n in TOYS]


def _check_context(pe, ctx, q_pos, k_pos):
    assert isinstance(ctx, Context) and isinstance(ctx, pe.context_type), type(ctx)
    assert ctx.pe is pe and ctx.q_pos.shape == q_pos.shape and ctx.k_pos.shape == k_pos.shape


def _check_hooks(pe, ctx, b, n_q, n_k, torch_gen):
    h, d = H, D_HEAD
    q, k, v = (torch.randn(b, h, n, d, generator=torch_gen) for n in (n_q, n_k, n_k))
    for layer in [LayerRef(l) for l in range(N_LAYERS)]:
        tq, tk = pe.transform_qk(q, k, ctx, layer)
        assert tq.shape == q.shape and tk.shape == k.shape and tq.dtype == q.dtype
        terms = pe.score_terms(tq, tk, ctx, layer)
        assert isinstance(terms, list)
        for t in terms:
            assert t.dtype.is_floating_point and t.ndim == 4, (t.dtype, t.shape)
            assert all(s in (1, f) for s, f in zip(t.shape, (b, h, n_q, n_k))), t.shape
            assert t.shape[-2:] == (n_q, n_k)
        probs = torch.rand(b, h, n_q, n_k, generator=torch_gen).softmax(-1)
        for f in pe.value_terms(ctx, layer):
            assert f(probs).shape == (b, h, n_q, d)
        out = position_attention(pe, q, k, v, ctx, layer)
        assert out.shape == (b, h, n_q, d) and out.isfinite().all()


@pytest.mark.parametrize('modality,name', WALK)
def test_every_registered_encoding_keeps_the_contract(modality, name, toys):
    pe, extra = (_text if modality == 'text' else _image)(name)
    assert isinstance(pe, PositionEncoding) and isinstance(pe, nn.Module)
    pe.eval()  # no dropout (DeBERTa's on P): one result per input
    assert issubclass(pe.context_type, Context)
    # declarations: max_len, position tables, relative_only
    assert pe.max_len is None or (isinstance(pe.max_len, int) and pe.max_len >= 1)
    tables = pe.position_tables()
    assert isinstance(tables, dict) and all(isinstance(n, str) for n in tables)
    own = {id(p) for p in pe.parameters()}
    assert all(isinstance(p, nn.Parameter) and id(p) in own for p in tables.values())
    proj = lambda: nn.Linear(H * D_HEAD, H * D_HEAD)
    for l in range(N_LAYERS):  # the models lend each layer's projections once; they stay the layer's
        assert pe.lend_projections(l, proj(), proj()) is None
    assert {id(p) for p in pe.parameters()} == own
    if pe.max_len is not None:
        shapes = {n: p.shape for n, p in tables.items()}
        assert tables and all(s[0] == pe.max_len for s in shapes.values()), shapes
    assert isinstance(pe.relative_only, bool) and not (pe.relative_only and pe.kind == 'absolute')
    assert isinstance(pe.causal_only, bool)  # the registry's defaults: never a causal form (an encoder's)
    assert not pe.causal_only
    # the sizes of q and v it was built for (None: any): the model's, so that the contract can hold every call
    size = pe.built_for()
    assert set(size) == {'n_heads', 'd_head', 'd_v'}, size
    assert size['n_heads'] in (None, H) and size['d_head'] in (None, D_HEAD) and size['d_v'] in (None, D_HEAD)
    assert pe.kind != 'qk' or size['d_head'] == D_HEAD  # a rotation of part of q would otherwise pass silently
    # repr: the class, then each constructor option the encoding keeps as a plain value, as it holds it
    kept = [n for n in inspect.signature(type(pe).__init__).parameters if n in vars(pe)]
    plain = [n for n in kept if isinstance(getattr(pe, n), (bool, int, float, str, tuple, type(None)))]
    assert repr(pe).startswith(f'{type(pe).__name__}(')
    assert all(f'{n}={getattr(pe, n)!r}' in repr(pe) for n in plain), (repr(pe), plain)
    gen = torch.Generator().manual_seed(0)
    n = 1 + extra['grid'][0] * extra['grid'][1] if extra else 9
    pos = default_positions(n)
    batched = torch.arange(n).expand(B, n)
    keep = torch.ones(B, n, dtype=torch.bool)
    keep[1, :2] = False  # left padding
    cases = [(pos, pos, {}), (batched, batched, {'key_mask': keep}), (pos, pos, {'causal': True}),
             (batched, batched, {'key_mask': keep, 'causal': True})]
    if modality == 'text':  # a KV-cache step: the last 3 of the keys as queries
        cases.append((batched[:, -3:], batched, {'key_mask': keep, 'causal': True}))
    for q_pos, k_pos, kw in cases:
        ctx = pe.prepare(q_pos, k_pos, **kw, **extra)
        _check_context(pe, ctx, q_pos, k_pos)
        _check_hooks(pe, ctx, B, q_pos.shape[1], k_pos.shape[1], gen)
    # relative_only is a claim about the scores: a common shift of all positions leaves them as they are
    q, k = torch.randn(B, H, n, D_HEAD, generator=gen), torch.randn(B, H, n, D_HEAD, generator=gen)
    shifted = [position_scores(pe, q, k, pe.prepare(p, p, **extra), 1) for p in (pos, pos + 7)]
    if pe.relative_only:
        torch.testing.assert_close(shifted[0], shifted[1], atol=1e-4, rtol=1e-4)
    # what it declares is held, with one message: q with other heads, or of another width, is refused
    for declared, shape in ((size['n_heads'], (B, 2 * H, n, D_HEAD)), (size['d_head'], (B, H, n, 2 * D_HEAD))):
        q = torch.randn(shape)
        if declared is not None:
            with pytest.raises(ValueError, match=f'{type(pe).__name__} was built for'):
                position_attention(pe, q, q, q, pe.prepare(pos, pos, **extra), 0)
    if size['d_v'] is not None:  # v of another width than its value terms add to
        q, v = torch.randn(B, H, n, D_HEAD), torch.randn(B, H, n, 2 * D_HEAD)
        with pytest.raises(ValueError, match=f'{type(pe).__name__} was built for d_v={D_HEAD}'):
            position_attention(pe, q, q, v, pe.prepare(pos, pos, **extra), 0)
    # a context of another instance of the same encoding is refused at use
    other = (_text if modality == 'text' else _image)(name)[0]
    q, k, v = (torch.randn(B, H, n, D_HEAD) for _ in range(3))
    with pytest.raises(ValueError, match=f'ctx was prepared by another {type(pe).__name__} instance'):
        position_attention(pe, q, k, v, other.prepare(pos, pos, **extra), 0)


_PREPARE_BAD = {  # what a caller's own attention module may pass to `prepare`: (kwargs, error, message)
    'float key_mask': (lambda keep: {'key_mask': keep.float()}, ValueError,
                       r'key_mask must be a bool tensor \(b, j\) with j = \d+ keys, True = real; got torch.float32'),
    'short key_mask': (lambda keep: {'key_mask': keep[:, 1:]}, ValueError, r'key_mask must be a bool tensor \(b, j\)'),
    'key_mask (j,)': (lambda keep: {'key_mask': keep[0]}, ValueError, r'got torch.bool tensor of shape \(\d+,\)'),
    'key_mask of another batch': (lambda keep: {'key_mask': keep.repeat(2, 1)}, ValueError,
                                  'key_mask has 4 rows but the positions a batch of 2'),
    "causal='yes'": (lambda keep: {'causal': 'yes'}, ValueError, "causal must be true or false; got 'yes'"),
    'causal=1': (lambda keep: {'causal': 1}, ValueError, 'causal must be true or false; got 1'),
    'float positions': (lambda keep: {'q_pos': 'float'}, TypeError, 'q_pos must be a signed integer tensor'),
}


@pytest.mark.parametrize('modality,name', WALK)
def test_every_encodings_prepare_refuses_bad_arguments(modality, name, toys):
    """`prepare` is public (an attention module of one's own calls it): every encoding, the toys registered from
    outside the package too, refuses a float or wrong-length key_mask and a non-bool causal with the contract's
    message (`check_prepare`), before its own code runs; a valid call still works."""
    pe, extra = (_text if modality == 'text' else _image)(name)
    n = 1 + extra['grid'][0] * extra['grid'][1] if extra else 9
    pos = torch.arange(n).expand(B, n)
    keep = torch.ones(B, n, dtype=torch.bool)
    keep[1, :2] = False
    for what, (kw, err, msg) in _PREPARE_BAD.items():
        kw = kw(keep)
        q_pos = pos.float() if kw.pop('q_pos', None) else pos
        with pytest.raises(err, match=msg):
            pe.prepare(q_pos, pos, **kw, **extra)
    ctx = pe.prepare(pos, pos, key_mask=keep, causal=modality == 'text', **extra)
    _check_context(pe, ctx, pos, pos)


def test_the_contract_checks_once_per_call(monkeypatch):
    "A prepare that calls another (CombinedEncoding's members, rel2d's super().prepare) is checked once, not again."
    import posenc_lit.core as core
    from posenc_lit.attention import CombinedEncoding
    from posenc_lit.core import checked_inputs
    calls = []
    real = core.check_prepare
    monkeypatch.setattr(core, 'check_prepare', lambda *a: calls.append(a) or real(*a))
    pos = default_positions(9)
    CombinedEncoding(Shaw(D_HEAD, N_LAYERS), T5RelativeBias(H)).prepare(pos, pos, causal=True)
    assert len(calls) == 1
    pe, extra = _image('rel2d')
    pe.prepare(default_positions(13), default_positions(13), **extra)
    assert len(calls) == 2
    with checked_inputs():  # a caller that checked its inputs itself
        T5RelativeBias(H).prepare(pos, pos)
    assert len(calls) == 2
    with pytest.raises(ValueError, match='key_mask must be a bool'):  # checked again after a failure, too
        T5RelativeBias(H).prepare(pos, pos, key_mask=torch.ones(1, 9))
    T5RelativeBias(H).prepare(pos, pos)
    assert len(calls) == 4


def test_the_walk_sees_every_encoding(toys):
    registered = {(m, n) for m in ('text', 'image') for n in list_encodings(m)}
    assert registered == set(WALK), registered ^ set(WALK)
    assert {'t5', 'rope', 'alibi', 'deberta', 'learned', 'rope2d', 'rel2d', *TOYS} <= {n for _, n in WALK}


def test_the_base_class_is_the_contract():
    nope = PositionEncoding()
    assert (nope.max_len, nope.position_tables(), nope.relative_only) == (None, {}, True)
    assert nope.context_type is Context
    pos = default_positions(4)
    ctx = nope.prepare(pos, pos, key_mask=torch.ones(1, 4, dtype=torch.bool), causal=True)
    assert check_context(nope, ctx) is ctx
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'pe'"):
        Context(pos, pos)
    with pytest.raises(TypeError, match=r'ctx must be a Context'):
        check_context(nope, {'q_pos': pos, 'k_pos': pos})   # the ViT's old dict contexts


# ---------------------------------------------------------------- ownership (issue 40)
def test_a_context_of_another_instance_of_the_same_class_is_an_error():
    torch.manual_seed(0)
    pos = default_positions(10)
    q, k, v = (torch.randn(2, 4, 10, 8) for _ in range(3))
    shaw2, shaw8 = Shaw(8, 2, k=2), Shaw(8, 2, k=8)
    with pytest.raises(ValueError, match='ctx was prepared by another RelativeVectors instance') as e:
        position_attention(shaw8, q, k, v, shaw2.prepare(pos, pos), 0)
    assert 'ctx = pe.prepare(q_pos, k_pos, ...) of the pe you pass' in str(e.value)
    t5a, t5b = T5RelativeBias(4), T5RelativeBias(4)
    with pytest.raises(ValueError, match='another T5RelativeBias instance'):
        position_attention(t5b, q, k, v, t5a.prepare(pos, pos), 0)
    mha = MultiHeadAttention(32, 4, layer_idx=0)
    with pytest.raises(ValueError, match='another T5RelativeBias instance'):
        mha(torch.randn(2, 10, 32), pe=t5b, ctx=t5a.prepare(pos, pos))
    # its own context works, and one of another class is still a TypeError naming the type
    assert position_attention(shaw8, q, k, v, shaw8.prepare(pos, pos), 0).shape == (2, 4, 10, 8)
    with pytest.raises(TypeError, match='ctx must be a RelativeContext'):
        position_attention(shaw8, q, k, v, t5a.prepare(pos, pos), 0)


@pytest.mark.parametrize('bad', [-1, True, False, 1.0, '0', -3])
def test_layer_ref_refuses_what_a_plain_index_refuses(bad):
    with pytest.raises(TypeError, match='the layer index is an int ≥ 0'):
        LayerRef(bad)


def test_layer_ref_takes_indices_and_none():
    assert LayerRef(0).idx == 0 and LayerRef(5).idx == 5 and LayerRef().idx is None


# ---------------------------------------------------------------- the toys against a naive loop
def _capture(attn):
    "Records the first call of a MultiHeadAttention: its input x and keyword arguments, and its output."
    seen = {}

    def hook(mod, args, kwargs, out):
        if not seen:
            seen.update(x=args[0], out=out if isinstance(out, torch.Tensor) else out[0], **kwargs)
    return seen, attn.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize('name', ['toy-fire', 'toy-cope'])
def test_toys_in_the_encoder_match_a_naive_loop(name, toys):
    torch.manual_seed(0)
    m = Encoder(ModelConfig(**TEXT, pe=name)).eval()
    assert type(m.pe).__name__ in ('ToyFire', 'ToyCoPE')
    ids = torch.randint(5, 40, (2, 7))
    am = torch.ones(2, 7, dtype=torch.long)
    am[1, :3] = 0  # left padding
    attn = m.layers[1].attn
    seen, handle = _capture(attn)
    with torch.no_grad():
        out = m(ids, attention_mask=am)
    handle.remove()
    ctx, keep = out['ctx'], am.bool()
    if name == 'toy-cope':  # the mask reached the encoding
        assert torch.equal(ctx.key_mask, keep) and ctx.causal is False
    with torch.no_grad():
        q, k, v = layer_inputs(attn, seen['x'])
        ref = naive_attention(q, k, v, toy_term(m.pe, q, k, ctx, keep, False), keep, False, D_HEAD ** -0.5)
        torch.testing.assert_close(merge(attn, ref), seen['out'], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('cls', [ToyFire, ToyCoPE])
def test_toys_in_the_causal_lm_match_a_naive_loop_and_cached_decoding(cls):
    torch.manual_seed(0)
    pe = ToyFire(H) if cls is ToyFire else ToyCoPE(D_HEAD)
    lm = CausalLM(40, H * D_HEAD, H, N_LAYERS, 32, pe=pe).eval()
    ids = torch.randint(0, 40, (2, 8))
    am = torch.ones(2, 8, dtype=torch.long)
    am[0, :2] = 0  # left padding
    attn = lm.layers[0].attn
    seen, handle = _capture(attn)
    with torch.no_grad():
        full = lm(ids, attention_mask=am)['logits']
    handle.remove()
    ctx, keep = seen['ctx'], am.bool()
    if cls is ToyCoPE:
        assert torch.equal(ctx.key_mask, keep) and ctx.causal is True
    with torch.no_grad():
        q, k, v = layer_inputs(attn, seen['x'])  # x: the layer's LN(x)
        ref = naive_attention(q, k, v, toy_term(pe, q, k, ctx, keep, True), keep, True, D_HEAD ** -0.5)
        torch.testing.assert_close(merge(attn, ref), seen['out'], atol=1e-5, rtol=1e-5)
        # cached decoding: 5 tokens, then one at a time, equals the full forward
        out = lm(ids[:, :5], attention_mask=am[:, :5], cache=lm.new_cache())
        steps = [out['logits']]
        for t in range(5, 8):  # each call returns the extended cache (the one passed in is left as it was)
            out = lm(ids[:, t:t + 1], attention_mask=am[:, t:t + 1], cache=out['cache'])
            steps.append(out['logits'])
    real = keep[:, :, None]
    torch.testing.assert_close(torch.cat(steps, 1) * real, full * real, atol=1e-5, rtol=1e-5)


class MyAttention(nn.Module):
    "The tutorial's own attention module (01a), as a user writes it."

    def __init__(self, d_model, n_heads, layer_idx):
        super().__init__()
        self.h, self.d = n_heads, d_model // n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model) for _ in range(4))
        self.layer = LayerRef(layer_idx)

    def heads(self, x):
        return x.view(*x.shape[:2], self.h, self.d).transpose(1, 2)

    def forward(self, x, pe, ctx, mask=None, causal=False):
        q, k, v = self.heads(self.wq(x)), self.heads(self.wk(x)), self.heads(self.wv(x))
        out = position_attention(pe, q, k, v, ctx, self.layer, mask, causal=causal)
        return self.wo(out.transpose(1, 2).reshape(x.shape)), (q, k, v)


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('cls', [ToyFire, ToyCoPE])
def test_toys_in_your_own_attention_match_a_naive_loop(cls, causal):
    torch.manual_seed(0)
    pe = ToyFire(H) if cls is ToyFire else ToyCoPE(D_HEAD)
    attn = MyAttention(H * D_HEAD, H, 0)
    x = torch.randn(2, 6, H * D_HEAD)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, 4:] = False
    pos = default_positions(6)
    with torch.no_grad():
        ctx = pe.prepare(pos, pos, key_mask=keep, causal=causal)
        out, (q, k, v) = attn(x, pe, ctx, keep[:, None, None, :], causal=causal)
        ref = naive_attention(q, k, v, toy_term(pe, q, k, ctx, keep, causal), keep, causal, D_HEAD ** -0.5)
        torch.testing.assert_close(out, attn.wo(ref.transpose(1, 2).reshape(x.shape)), atol=1e-5, rtol=1e-5)


def test_cope_positions_depend_on_the_mask_and_the_direction():
    "Why the contract has key_mask and causal: the same q, k give other logits under another mask or flag."
    torch.manual_seed(0)
    pe = ToyCoPE(D_HEAD)
    q, k = torch.randn(1, H, 6, D_HEAD), torch.randn(1, H, 6, D_HEAD)
    pos = default_positions(6)
    keep = torch.ones(1, 6, dtype=torch.bool)
    keep[0, 2] = False
    t = lambda **kw: pe.score_terms(q, k, pe.prepare(pos, pos, **kw))[0]
    lower = torch.ones(6, 6, dtype=torch.bool).tril(-1)  # keys before the query
    assert (t() - t(key_mask=keep))[..., lower].abs().max() > 1e-3
    assert (t() - t(causal=True)).abs().max() > 1e-3


def test_the_contract_is_not_bypassed_by_wraps_a_mixin_or_positional_arguments():
    "functools.wraps copies attributes, a mixin's prepare comes through the MRO, key_mask/causal may be positional."
    import functools

    from posenc_lit.core import Context, PositionEncoding

    pos, bad = default_positions(6), torch.full((1, 6), 0.5)

    class Wrapped(PositionEncoding):
        @functools.wraps(PositionEncoding.prepare)  # to reuse the base's docstring
        def prepare(self, q_pos, k_pos, *, key_mask=None, causal=False):
            return Context(q_pos, k_pos, pe=self)

    class Positional(PositionEncoding):
        def prepare(self, q_pos, k_pos, key_mask=None, causal=False):
            return Context(q_pos, k_pos, pe=self)

    class Mixin:
        def prepare(self, q_pos, k_pos, *, key_mask=None, causal=False):
            return Context(q_pos, k_pos, pe=self)

    class WithMixin(Mixin, PositionEncoding):
        pass

    for cls in (Wrapped, WithMixin, Positional):
        with pytest.raises(ValueError, match='key_mask must be a bool'):
            cls().prepare(pos, pos, key_mask=bad)
        with pytest.raises(ValueError, match='causal must be true or false'):
            cls().prepare(pos, pos, causal='yes')
        assert cls().prepare(pos, pos, key_mask=torch.ones(1, 6, dtype=torch.bool), causal=True).pe is not None
    with pytest.raises(ValueError, match='key_mask must be a bool'):
        Positional().prepare(pos, pos, bad)
    with pytest.raises(ValueError, match='causal must be true or false'):
        Positional().prepare(pos, pos, None, 'yes')



def test_positional_arguments_a_prepare_does_not_take_are_named_not_misread():
    """`pe.prepare(q, k, None, True)` where prepare takes key_mask and causal by keyword: a TypeError saying so,
    for the causal forms too (not 'got causal=False' from causal_only, the True passed being read as absent)."""
    from posenc_lit.alibi import ALiBi
    from posenc_lit.cope import CoPE

    pos = default_positions(6)
    causal_forms = [ALiBi(H, False), T5RelativeBias(H, bidirectional=False), CoPE(D_HEAD, 1, bidirectional=False)]
    for pe in causal_forms + [ALiBi(H), T5RelativeBias(H)]:
        with pytest.raises(TypeError, match=r'takes key_mask and causal by keyword: prepare\(q_pos, k_pos, \*, '):
            pe.prepare(pos, pos, None, True)
        assert pe.prepare(pos, pos, key_mask=None, causal=True).causal is True


def test_a_causal_form_is_not_attended_both_ways_through_a_context_made_by_hand():
    """A causal form's context made by hand (causal None) or edited to causal=False, attended without
    causal=True: refused as its prepare refuses causal=False (keys after the query would get ALiBi's bias 0,
    T5's bucket 0), on the manual, fast and fused paths; with causal=True it attends."""
    from posenc_lit.alibi import ALiBi, ALiBiContext
    from posenc_lit.fused import fused_scores
    from posenc_lit.t5 import T5Context

    pos, q = default_positions(6), torch.randn(B, H, 6, D_HEAD)
    for pe, make in ((ALiBi(H, False), ALiBiContext), (T5RelativeBias(H, bidirectional=False), T5Context)):
        edited = pe.prepare(pos, pos, causal=True)
        edited.causal = False
        for ctx in (make(pos, pos, pe=pe), edited):
            calls = [lambda: position_attention(pe, q, q, q, ctx, fast=fast) for fast in (False, True, 'fused')]
            calls += [lambda: position_scores(pe, q, q, ctx), lambda: fused_scores(pe, q, q, ctx)]
            for call in calls:
                with pytest.raises(ValueError, match=rf'{type(pe).__name__} is a causal form here \(causal_only\)'):
                    call()
        assert position_attention(pe, q, q, q, make(pos, pos, pe=pe), causal=True).shape == q.shape

def test_checked_inputs_is_reentrant():
    "One checked_inputs() object nested in itself: the checks are back on once both blocks are left."
    from posenc_lit.core import checked_inputs

    pos, bad = default_positions(6), torch.ones(1, 6)
    ci = checked_inputs()
    with ci:
        with ci:
            T5RelativeBias(H).prepare(pos, pos, key_mask=bad)  # not checked inside
        T5RelativeBias(H).prepare(pos, pos, key_mask=bad)
    with pytest.raises(ValueError, match='key_mask must be a bool'):
        T5RelativeBias(H).prepare(pos, pos, key_mask=bad)


# ------------------------------------------------- the context's key_mask and causal: said once, at prepare
def _said_once_encodings():
    "Encodings whose output depends on padding or on the direction, with tables that are not zero."
    from posenc_lit.alibi import ALiBi
    from posenc_lit.cope import CoPE
    from posenc_lit.rope import RoPE
    torch.manual_seed(0)
    return {
        't5': T5RelativeBias(H), 'cope': CoPE(D_HEAD, 1, init_std=0.5), 'alibi': ALiBi(H),
        'alibi-causal': ALiBi(H, bidirectional=False), 'shaw': Shaw(D_HEAD, 1, k=2), 'rope': RoPE(D_HEAD),
    }


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('name', ['t5', 'cope', 'alibi', 'alibi-causal', 'shaw', 'rope'])
def test_forgetting_mask_attends_no_padding(name, causal):
    "prepare(key_mask=keep) then position_attention without mask=: the unpadded sequence's output, every path."
    pe = _said_once_encodings()[name]
    if name == 'alibi-causal' and not causal:  # keys after the query would get bias 0: refused, not attended
        pos = default_positions(6)
        with pytest.raises(ValueError, match=r"ALiBi is a causal form here.*Prepare it with causal=True.*bidirectional=True"):
            pe.prepare(pos, pos, key_mask=torch.ones(B, 6, dtype=torch.bool), causal=causal)
        return
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, 6, D_HEAD, generator=g) for _ in range(3))
    keep = torch.ones(B, 6, dtype=torch.bool)
    keep[1, 4:] = False  # row 1: 4 real tokens, 2 of padding
    pos, pos4 = default_positions(6), default_positions(4)
    with torch.no_grad():
        ref = position_attention(pe, q[1:, :, :4], k[1:, :, :4], v[1:, :, :4], pe.prepare(pos4, pos4, causal=causal))
        ctx = pe.prepare(pos, pos, key_mask=keep, causal=causal)
        for fast in (True, False):
            forgot = position_attention(pe, q, k, v, ctx, 0, fast=fast)
            both = position_attention(pe, q, k, v, ctx, 0, keep[:, None, None, :], fast=fast)
            torch.testing.assert_close(forgot[1:, :, :4], ref, atol=1e-5, rtol=1e-5)
            assert torch.equal(forgot, both), (name, fast)
        # the test can fail: attending the padding gives another output
        open_ctx = pe.prepare(pos, pos, causal=causal)
        if not causal:  # (causal: the real queries come first and never see the padding after them)
            assert (position_attention(pe, q, k, v, open_ctx, 0)[1:, :, :4] - ref).abs().max() > 1e-3
        scores = position_scores(pe, q, k, ctx, 0)  # the logits: -inf at the context's padding keys
        assert scores[1, ..., 4:].isneginf().all() and scores[0].isfinite().any()


def test_forgetting_mask_attends_no_padding_on_the_compiled_and_fused_paths():
    pe = _said_once_encodings()['t5']
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, 6, D_HEAD, generator=g) for _ in range(3))
    keep = torch.ones(B, 6, dtype=torch.bool)
    keep[1, 4:] = False
    pos, pos4 = default_positions(6), default_positions(4)
    with torch.no_grad():
        ref = position_attention(pe, q[1:, :, :4], k[1:, :, :4], v[1:, :, :4], pe.prepare(pos4, pos4), 0, fast=False)
        ctx = pe.prepare(pos, pos, key_mask=keep)
        for fast in ('compiled', 'fused'):
            out = position_attention(pe, q, k, v, ctx, 0, fast=fast)
            torch.testing.assert_close(out[1:, :, :4], ref, atol=1e-5, rtol=1e-5)
        from posenc_lit.fused import fused_scores
        assert fused_scores(pe, q, k, ctx, 0)[1, ..., 4:].isneginf().all()


def test_a_passed_mask_and_the_contexts_key_mask_are_combined():
    "Both say 'may attend': a key is attended only where both allow it."
    pe = _said_once_encodings()['t5']
    q, k, v = (torch.randn(1, H, 5, D_HEAD) for _ in range(3))
    pos = default_positions(5)
    keep = torch.tensor([[True, True, True, False, True]])  # key 3: padding
    doc = torch.tensor([True, True, True, True, False])[None, None, None]  # key 4: another document
    with torch.no_grad():
        out = position_attention(pe, q, k, v, pe.prepare(pos, pos, key_mask=keep), 0, doc)
        ref = position_attention(pe, q, k, v, pe.prepare(pos, pos), 0, doc & keep[:, None, None, :])
    assert torch.equal(out, ref)


@pytest.mark.parametrize('name', ['t5', 'cope', 'alibi-causal', 'rope'])
def test_a_causal_flag_that_contradicts_the_context_is_refused(name):
    pe = _said_once_encodings()[name]
    q, k, v = (torch.randn(1, H, 5, D_HEAD) for _ in range(3))
    pos = default_positions(5)
    flags = [True] if name == 'alibi-causal' else [True, False]
    for was in flags:
        ctx = pe.prepare(pos, pos, causal=was)
        msg = f'causal={not was} here but ctx was prepared with causal={was}'
        with pytest.raises(ValueError, match=msg):
            position_attention(pe, q, k, v, ctx, 0, causal=not was)
        with pytest.raises(ValueError, match=msg):
            position_scores(pe, q, k, ctx, 0, causal=not was)
        attn = MultiHeadAttention(H * D_HEAD, H, layer_idx=0)
        with pytest.raises(ValueError, match=msg):
            attn(torch.randn(1, 5, H * D_HEAD), pe=pe, ctx=ctx, causal=not was)
        with torch.no_grad():  # left out: the context's flag
            assert torch.equal(
                position_attention(pe, q, k, v, ctx, 0), position_attention(pe, q, k, v, ctx, 0, causal=was)
            )


def test_a_kv_cache_needs_causal_and_a_bidirectional_prefix_is_a_prefix_lm():
    "MultiHeadAttention with a cache: causal=False prefills a prefix seen both ways; left out, it is refused."
    from posenc_lit.attention import KVCache
    from posenc_lit.rope import RoPE
    torch.manual_seed(0)
    attn, pe = MultiHeadAttention(H * D_HEAD, H, layer_idx=0).eval(), RoPE(D_HEAD)
    x = torch.randn(1, 7, H * D_HEAD)
    with pytest.raises(ValueError, match='with a KV cache, pass causal=True'):
        attn(x[:, :3], pe=pe, cache=KVCache())
    with torch.no_grad():
        cache = KVCache()
        steps = [attn(x[:, :3], pe=pe, causal=False, cache=cache)]
        steps += [attn(x[:, t : t + 1], pe=pe, causal=True, cache=cache) for t in range(3, 7)]
        prefix_lm = causal_mask(7, 7) | (torch.arange(7) < 3)
        torch.testing.assert_close(torch.cat(steps, 1), attn(x, prefix_lm, pe=pe), atol=1e-6, rtol=1e-5)
