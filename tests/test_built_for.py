"""Encodings built for one head layout and used with another (a reader's own attention module) name the sizes
they were built for, as RoPE, CoPE and FIRE do ("... was built for ..."), on the manual and the fused path,
instead of torch's matmul errors or, for TUPE, a silent run at the wrong width."""
import pytest
import torch
from posenc_lit.attention import default_positions, position_attention
from posenc_lit.deberta import DebertaRelative
from posenc_lit.relative import HuangMethod4, Shaw
from posenc_lit.tupe import TUPE

CASES = {  # the encoding, and what its message names
    'shaw': (lambda: Shaw(4, 1), r"\(Shaw\) was built for d_head=4"),
    'huang4': (lambda: HuangMethod4(8, 1, k=4), r"\(HuangMethod4\) was built for d_head=8"),
    'deberta': (lambda: DebertaRelative(32, 4, 1), r'DebertaRelative was built for 4 heads of d_head=8'),
    'tupe': (lambda: TUPE(32, 4), r'TUPE was built for 4 heads of d_head=8'),
}


@pytest.mark.parametrize('name', CASES)
@pytest.mark.parametrize('shape', [(1, 4, 6, 16), (1, 2, 6, 8)], ids=['width', 'heads'])
def test_a_mis_sized_q_is_named(name, shape):
    make, msg = CASES[name]
    pe, pos = make(), default_positions(6)
    if name in ('shaw', 'huang4') and shape[1] == 2:
        shape = (1, 2, 6, 8 if name == 'shaw' else 4)  # shared by the heads: only the width matters
    q = torch.randn(shape)
    ctx = pe.prepare(pos, pos)
    for fast in (False, True):
        with pytest.raises(ValueError, match=msg):
            position_attention(pe, q, q, q, ctx, 0, fast=fast)
    with pytest.raises(ValueError, match=msg):
        pe.score_mods(q, q, ctx, 0)  # the fused path's terms


@pytest.mark.parametrize('name', CASES)
def test_the_built_sizes_still_run(name):
    pe, pos = CASES[name][0](), default_positions(6)
    d = {'shaw': 4, 'huang4': 8}.get(name, 8)
    h = 1 if name in ('shaw', 'huang4') else 4
    q = torch.randn(1, h, 6, d)
    out = position_attention(pe, q, q, q, pe.prepare(pos, pos), 0)
    assert out.shape == q.shape and torch.isfinite(out).all()
