"""RoPE-Mixed (`posenc_lit.rope_mixed`, Heo et al. 2024) beyond its notebook (nbs/14_rope_mixed.ipynb).

- The rotation against a naive loop of scalar arithmetic (per layer, head, patch and pair), float32, ≤ 1e-6, both
  pairings; [CLS] unrotated.
- Closed forms for random ("learned") frequencies: the score depends only on the 2D offset; θʸ = 0 is 1D RoPE
  along the columns (θˣ = 0 along the rows); the axial directions with base 100 are `rope2d`.
- Parity with timm's `RotaryEmbeddingMixed` (compatible with the authors' naver-ai/rope-vit): against the committed
  golden file of `tools/make_rope_mixed_goldens.py` always, and live when timm can be loaded (it is not installed
  here: see the tool's docstring).
- The ViT at its training grid and at a larger one, `torch.export` and `torch.jit.trace`, save/load, and the
  evaluation at other image sizes of `posenc_lit.vit_train`.
"""
import math, warnings
from pathlib import Path

import pytest
from conftest import load_tool
import torch
from safetensors.torch import load_file

from posenc_lit.attention import default_positions
from posenc_lit.rope import apply_rope, rope_cos_sin
from posenc_lit.rope_mixed import RoPEMixed, mixed_angles, mixed_frequencies
from posenc_lit.vit import RoPE2d, ViT, ViTConfig, grid_positions, load_vit, save_vit
from posenc_lit.vit_train import evaluate_sizes, make_vit_config, model_for, vit_no_decay

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / 'tests' / 'fixtures' / 'timm_rope_mixed.safetensors'


def _tool():
    return load_tool('make_rope_mixed_goldens')


def _pos(grid, prefix=1):
    p = default_positions(prefix + grid[0] * grid[1])
    return p, p


def _learned(pe, seed=0):
    "Frequencies far from their initial values, as after training."
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in (pe.theta_x, pe.theta_y):
            t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))
    return pe


# ---------------------------------------------------------------- the naive loop
def naive_rotate(x, rc, theta_x, theta_y, pairing):
    "x `(b, h, n, d)` turned by scalar arithmetic: pair t of head h at token n by col·θˣ[h, t] + row·θʸ[h, t]."
    b_, h_, n_, d = x.shape
    out = torch.empty_like(x)
    for b in range(b_):
        for h in range(h_):
            for n in range(n_):
                row, col = int(rc[n, 0]), int(rc[n, 1])
                for t in range(d // 2):
                    i, j = (2 * t, 2 * t + 1) if pairing == 'interleaved' else (t, t + d // 2)
                    a = col * float(theta_x[h, t]) + row * float(theta_y[h, t])
                    c, s = math.cos(a), math.sin(a)
                    x1, x2 = float(x[b, h, n, i]), float(x[b, h, n, j])
                    out[b, h, n, i], out[b, h, n, j] = x1 * c - x2 * s, x1 * s + x2 * c
    return out


@pytest.mark.parametrize('pairing', ['interleaved', 'half'])
def test_rotation_matches_a_naive_loop_in_float32(pairing):
    torch.manual_seed(0)
    pe = _learned(RoPEMixed(8, 2, 2, pairing=pairing))
    grid = (3, 4)
    ctx = pe.prepare(*_pos(grid), grid=grid)
    q, k = torch.randn(2, 2, 13, 8), torch.randn(2, 2, 13, 8)
    for l in range(2):
        rq, rk = pe.transform_qk(q, k, ctx, l)
        assert rq.dtype == torch.float32
        for got, x in ((rq, q), (rk, k)):
            ref = naive_rotate(x, grid_positions(grid), pe.theta_x[l].detach(), pe.theta_y[l].detach(), pairing)
            assert (got - ref).abs().max().item() <= 1e-6, (pairing, l)
        assert torch.equal(rq[:, :, 0], q[:, :, 0]) and torch.equal(rk[:, :, 0], k[:, :, 0])   # [CLS] at (0, 0)


# ---------------------------------------------------------------- closed forms
@pytest.mark.parametrize('seed', [0, 1, 2])
def test_score_depends_only_on_the_2d_offset_for_any_frequencies(seed):
    "q at patch p, k at patch p': the score equals that of q at p + s, k at p' + s, for every shift s on the grid."
    pe = _learned(RoPEMixed(8, 2, 2, num_prefix_tokens=0), seed).double()
    grid = (4, 5)
    ctx = pe.prepare(*_pos(grid, 0), grid=grid)
    g = torch.Generator().manual_seed(seed)
    u, w = torch.randn(2, 8, generator=g, dtype=torch.float64)
    for l in range(2):
        rq, rk = pe.transform_qk(u.expand(1, 2, 20, 8), w.expand(1, 2, 20, 8), ctx, l)
        S = (rq @ rk.transpose(-1, -2))[0].reshape(2, 4, 5, 4, 5)   # (h, r, c, r', c')
        for r, c, r2, c2 in torch.cartesian_prod(*[torch.arange(n) for n in (4, 5, 4, 5)]).tolist():
            for sr, sc in ((1, 0), (0, 1), (1, 1), (-1, 2)):
                if 0 <= min(r, r2) + sr and max(r, r2) + sr < 4 and 0 <= min(c, c2) + sc and max(c, c2) + sc < 5:
                    torch.testing.assert_close(S[:, r + sr, c + sc, r2 + sr, c2 + sc], S[:, r, c, r2, c2],
                                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('axis', ['x', 'y'])
def test_one_axis_of_frequencies_zero_is_1d_rope(axis):
    "θʸ = 0: 1D RoPE over the columns with frequencies θˣ (per head); θˣ = 0: over the rows with θʸ."
    pe = _learned(RoPEMixed(8, 3, 2), 5).double()
    with torch.no_grad():
        (pe.theta_y if axis == 'x' else pe.theta_x).zero_()
    grid = (3, 5)
    ctx = pe.prepare(*_pos(grid), grid=grid)
    q = torch.randn(2, 3, 16, 8, dtype=torch.float64)
    p = ctx.rc[:, 1] if axis == 'x' else ctx.rc[:, 0]   # (n,) the 1D positions
    for l in range(2):
        theta = (pe.theta_x if axis == 'x' else pe.theta_y)[l].detach()   # (h, d/2)
        cos, sin = (torch.stack(t) for t in zip(*[rope_cos_sin(p, theta[h]) for h in range(3)]))   # (h, n, d/2)
        torch.testing.assert_close(pe.transform_qk(q, q, ctx, l)[0], apply_rope(q, cos, sin, 'interleaved'),
                                   rtol=1e-12, atol=1e-12)


def test_axial_directions_with_base_100_are_rope2d():
    "α = 0 turns pair t < d/4 by the column and the rest by the row: RoPE-Axial, `rope2d` (its pairs interleaved)."
    torch.manual_seed(0)
    axial = RoPEMixed(16, 2, 2, base=100.0, pairing='interleaved', rotate=False)
    r2d = RoPE2d(16, base=100.0, pairing='interleaved')
    grid = (5, 6)
    q = torch.randn(2, 2, 31, 16)
    ours = axial.transform_qk(q, q, axial.prepare(*_pos(grid), grid=grid), 1)[0]
    ref = r2d.transform_qk(q, q, r2d.prepare(*_pos(grid), grid=grid), None)[0]
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=2e-6)   # cos(π/2) = -4e-8 in float32, not 0


def test_layers_and_heads_have_their_own_frequencies():
    tx, ty = mixed_frequencies(16, 4, 3, generator=torch.Generator().manual_seed(0))
    directions = torch.atan2(ty[..., 0], tx[..., 0]).flatten()   # (L·h,) α of every layer and head
    assert len(set(directions.round(decimals=5).tolist())) == 12
    pe = RoPEMixed(16, 4, 3)
    ctx = pe.prepare(*_pos((3, 3)), grid=(3, 3))
    q = torch.randn(1, 4, 10, 16)
    outs = [pe.transform_qk(q, q, ctx, l)[0] for l in range(3)]
    assert (outs[0] - outs[1]).abs().max() > 1e-3 and (outs[1] - outs[2]).abs().max() > 1e-3
    with pytest.raises(ValueError, match='one set of frequencies per layer'):
        pe.transform_qk(q, q, ctx, None)
    with pytest.raises(ValueError, match='layer 3 but RoPEMixed has frequencies for 3 layers'):
        pe.transform_qk(q, q, ctx, 3)


def test_angles_are_float32_at_least():
    pe = RoPEMixed(8, 2, 1).to(torch.bfloat16)
    ctx = pe.prepare(*_pos((3, 3)), grid=(3, 3))
    assert ctx.cos.dtype == torch.float32
    q = torch.randn(1, 2, 10, 8, dtype=torch.bfloat16)
    assert pe.transform_qk(q, q, ctx, 0)[0].dtype == torch.bfloat16
    assert RoPEMixed(8, 2, 1).double().prepare(*_pos((3, 3)), grid=(3, 3)).cos.dtype == torch.float64
    rc = grid_positions((2, 2))
    torch.testing.assert_close(mixed_angles(rc, torch.ones(1, 4), 2 * torch.ones(1, 4))[0, :, 0],
                               torch.tensor([0., 0., 1., 2., 3.]))   # x + 2y: [CLS], (0,0), (0,1), (1,0), (1,1)


# ---------------------------------------------------------------- parity with timm
def _ours_from_timm(freqs):
    "A RoPEMixed (layers, heads, d/2 from `freqs` (2, L, h, d/2)) holding timm's frequencies."
    _, L, h, half = freqs.shape
    pe = RoPEMixed(2 * half, h, L)
    with torch.no_grad():
        pe.theta_x.copy_(freqs[0])
        pe.theta_y.copy_(freqs[1])
    return pe


def _check_against(gold, tool):
    "Our initial frequencies and rotations against timm's tensors `gold` (the golden file's keys)."
    torch.manual_seed(tool.SEED)
    tx, ty = mixed_frequencies(tool.D, tool.H, tool.L)   # the same draw as timm's __init__
    assert torch.equal(tx, gold['init.freqs'][0]) and torch.equal(ty, gold['init.freqs'][1])
    pe = _ours_from_timm(gold['trained.freqs'])
    for gh, gw in tool.GRIDS:
        ctx = pe.prepare(*_pos((gh, gw)), grid=(gh, gw))
        q = gold[f'q.{gh}x{gw}']
        cls = torch.randn(2, tool.H, 1, tool.D)
        x = torch.cat([cls, q], 2)   # [CLS] first, as our ViT orders the tokens
        for l in range(tool.L):
            got = pe.transform_qk(x, x, ctx, l)[0]
            torch.testing.assert_close(got[:, :, 1:], gold[f'trained.{gh}x{gw}.layer{l}'], rtol=0, atol=1e-6)
            assert torch.equal(got[:, :, :1], cls)   # the authors rotate the patches only


def test_parity_with_timm_golden_file():
    _check_against(load_file(str(GOLDEN)), _tool())


def test_parity_with_timm_live():
    tool = _tool()
    T = tool.load_timm_sincos()
    if T is None:
        pytest.skip('timm is not installed: its wheel requires torchvision, whose only wheels here are CUDA builds '
                    'that break the CPU torch at import; the golden file (tools/make_rope_mixed_goldens.py) checks '
                    'the same')
    _check_against(tool.goldens(T), tool)


# ---------------------------------------------------------------- in the ViT
def _vit(**kw):
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=16, d_model=32, n_layers=2, n_heads=2, d_ff=64, pe='rope-mixed', **kw)
    m = ViT(cfg).eval()
    torch.nn.init.normal_(m.head.weight)
    return m


def test_vit_at_the_training_grid_and_a_larger_one():
    m = _vit()
    pe_params = [n for n, _ in m.named_parameters() if n.startswith('pe.')]
    assert m.pe.table_grid is None and pe_params == ['pe.theta_x', 'pe.theta_y']
    assert all(vit_no_decay(n) for n in pe_params)   # no weight decay on the frequencies, as the authors
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        out16, feats = m(x), m.features(torch.randn(2, 1, 36, 28))
    assert out16.shape == (2, 10) and out16.isfinite().all()
    assert feats['grid'] == (9, 7) and feats['hidden_states'].shape == (2, 64, 32) and feats['pooled'].isfinite().all()
    m.train()
    m(torch.randn(2, 1, 36, 28)).sum().backward()   # trains at the larger grid too: every layer's θ gets a gradient
    for t in (m.pe.theta_x, m.pe.theta_y):
        assert (t.grad.abs().amax((1, 2)) > 0).all()


def test_gap_pool_has_no_prefix_token():
    "pool='gap': no prefix token, every token is a patch and turns; another grid runs as well."
    m = _vit(pool='gap')
    assert m.pe.num_prefix_tokens == 0
    with torch.no_grad():
        assert m(torch.randn(1, 1, 24, 24)).isfinite().all()


def test_export_and_trace_equal_eager():
    m = _vit()
    x = torch.randn(2, 1, 16, 16)
    ep = torch.export.export(m, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')   # torch.jit.trace is deprecated
        traced = torch.jit.trace(m, (x,), check_trace=False)
    with torch.no_grad():
        ref = m(x)
        assert (ep.module()(x) - ref).abs().max().item() <= 1e-6
        assert (traced(x) - ref).abs().max().item() <= 1e-6


def test_save_and_load(tmp_path):
    m = _vit(pe_kwargs={'base': 20.0, 'pairing': 'half'})
    x = torch.randn(2, 1, 20, 20)
    m2 = load_vit(save_vit(m, tmp_path / 'vit'))
    assert m2.cfg.pe_kwargs == {'base': 20.0, 'pairing': 'half'} and m2.pe.pairing == 'half'
    with torch.no_grad():
        assert torch.equal(m2(x), m(x))


def test_vit_train_evaluates_other_sizes_with_the_model_as_it_is():
    cfg = make_vit_config('smoke', pe='rope-mixed', eval_sizes=['28', '56', '28x44'], interpolate=None)
    assert cfg.pe == 'rope-mixed'
    m = _vit()
    assert model_for(m, (56, 56), 'bicubic') is m and model_for(m, (28, 28), 'none') is m
    g = torch.Generator().manual_seed(0)
    images, labels = torch.randint(0, 256, (6, 16, 16), generator=g, dtype=torch.uint8), torch.arange(6) % 10
    acc = evaluate_sizes(m, images, labels, 0.5, 0.25, [(16, 16), (32, 24)], modes=('bicubic', 'none'))
    assert set(acc) == {'16x16', '32x24'}
    assert all(len(set(r.values())) == 1 for r in acc.values())   # one model for every mode: no table to treat
