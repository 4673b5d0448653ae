"""COME's opinion entropy: bounded, and no gradient through the logit norm."""

from __future__ import annotations

import math

import pytest
import torch

from zerosiam.parts.come import come_entropy
from zerosiam.parts.losses import OBJECTIVES, entropy


def test_come_entropy_is_bounded_by_log_of_classes_plus_one():
    for scale in (0.0, 1.0, 30.0, 1e4):
        logits = torch.randn(64, 10) * scale
        values = come_entropy(logits)
        assert torch.isfinite(values).all()
        assert (values <= math.log(11) + 1e-6).all() and (values >= -1e-6).all()  # 1e-7 in the log: ≈ 0
    # zero logits, K = C = 10: S = 10 + 10, beliefs 1/20 each and uncertainty 1/2
    by_hand = -(10 * 0.05 * math.log(0.05) + 0.5 * math.log(0.5))
    assert come_entropy(torch.zeros(1, 10)).item() == pytest.approx(by_hand, abs=1e-5)
    # K = 1 makes the same opinion uniform over the C + 1 values: the bound itself
    assert come_entropy(torch.zeros(1, 10), uncertainty_mass=1).item() == pytest.approx(
        math.log(11), abs=1e-5
    )
    assert OBJECTIVES["come"] is come_entropy


def test_come_passes_no_gradient_through_the_logit_norm():
    logits = (torch.randn(8, 10) * 3).requires_grad_(True)
    come_entropy(logits).sum().backward()
    radial = (logits.grad * logits.detach()).sum(-1)  # the gradient's component along u changes ‖u‖
    assert torch.allclose(radial, torch.zeros(8), atol=1e-5)
    plain = logits.detach().clone().requires_grad_(True)
    entropy(plain).sum().backward()
    assert (plain.grad * plain.detach()).sum(-1).abs().max() > 1e-3  # softmax entropy does change it
