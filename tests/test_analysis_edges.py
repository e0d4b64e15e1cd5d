"""Edges of the analysis tools a user runs on their own models, found by a break-it tester: each gave a raw error deep
inside torch, or a number for an argument that means nothing."""
import pytest, torch

from posenc_lit.locality import mass_within, text_blocks
from posenc_lit.model import EncoderForMLM, ModelConfig
from posenc_lit.probes import make_probe_config
from posenc_lit.regime import position_sensitivity, table_geometry


def test_text_blocks_too_short_for_cls_and_sep():
    with pytest.raises(ValueError, match='need at least one full block of n = 2 ≥ 3 tokens'):
        text_blocks(torch.arange(10, 50), 2, 4)            # was ZeroDivisionError
    assert text_blocks(torch.arange(10, 50), 3, 4).shape == (4, 3)


def test_mass_within_refuses_a_negative_distance():
    m = torch.tensor([0.5, 0.3, 0.2])
    assert mass_within(m, 1).item() == pytest.approx(0.8)
    with pytest.raises(ValueError, match='k is a distance ≥ 0; got -2'):
        mass_within(m, -2)                                  # was the mass of all but the last distance


def test_table_geometry_distances_are_positive():
    p = torch.randn(10, 8)
    cos = table_geometry(p, distances=(1, 3))['cos']
    u = torch.nn.functional.normalize(p, dim=-1)
    assert cos[3] == pytest.approx((u[:-3] * u[3:]).sum(-1).mean().item())
    for bad in ((-1,), (0,), (1.5,)):
        with pytest.raises(ValueError, match='distances must be positive integers'):
            table_geometry(p, distances=bad)


def test_position_sensitivity_needs_a_scored_token():
    model = EncoderForMLM(ModelConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_ff=32)).train()
    x = torch.randint(5, 40, (2, 8))
    with pytest.raises(ValueError, match='no token is scored'):
        position_sensitivity(model, x, torch.full_like(x, -100))   # was NaN for every number
    assert model.training


def test_probe_factors_start_at_the_training_length():
    assert make_probe_config('smoke').factors[0] == 1
    for bad in ((2, 1), (1, 4, 2), (2, 4)):          # (1, 1, 2): refused already, as not distinct
        with pytest.raises(ValueError, match='factors must start at 1'):
            make_probe_config('smoke', factors=bad)
