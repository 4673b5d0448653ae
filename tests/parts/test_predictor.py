"""ZeroSiam's predictor and its ablations."""

from __future__ import annotations

import math

import pytest
import torch

from zerosiam.parts.predictor import (
    FixedRandomLinear,
    IdentityLinear,
    MLPPredictor,
    build_predictor,
    identity_drift,
)


def test_identity_predictor_starts_as_identity_and_learns():
    h = IdentityLinear(5)
    z = torch.randn(3, 5)
    assert torch.equal(h(z), z)
    assert h.bias is None and h.weight.requires_grad
    assert float(identity_drift(h)) == 0.0


def test_fixed_random_predictor_is_i_plus_small_noise_and_frozen():
    h = FixedRandomLinear(16, scale=0.1, seed=3)
    assert not h.weight.requires_grad
    noise = h.weight - torch.eye(16)
    assert 0.05 < noise.std().item() < 0.15
    assert torch.equal(FixedRandomLinear(16, seed=3).weight, h.weight)


def test_the_rescue_predictor_starts_where_the_fixed_one_stays_and_is_learned():
    learned, fixed = build_predictor("random_learned", 16), build_predictor("random", 16)
    assert learned.weight.requires_grad and not fixed.weight.requires_grad
    assert torch.equal(learned.weight.detach(), fixed.weight)


def test_mlp_predictor_is_identity_on_nonnegative_features():
    h = MLPPredictor(6)
    z = torch.rand(4, 6)
    assert torch.allclose(h(z), z)
    assert math.isnan(identity_drift(h))
    with pytest.raises(ValueError, match="unknown predictor"):
        build_predictor("transformer", 4)
