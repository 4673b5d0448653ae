"""The per-sample losses: entropy, divergences, objectives."""

from __future__ import annotations

import math

import pytest
import torch

from zerosiam.parts import losses


def test_entropy_of_uniform_is_log_c_and_of_one_hot_is_zero():
    assert losses.entropy(torch.zeros(2, 7)).tolist() == pytest.approx([math.log(7)] * 2)
    assert losses.entropy(torch.tensor([[1e4, 0.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_matches_hand_computation():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    expected = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))
    assert losses.entropy(logits).item() == pytest.approx(expected, rel=1e-6)


def test_probability_entropy_is_the_entropy_of_the_same_distribution_and_finite_on_empty_classes():
    logits = torch.randn(5, 10)
    assert torch.allclose(losses.probability_entropy(logits.softmax(-1)), losses.entropy(logits), atol=1e-5)
    histogram = torch.tensor([0.5, 0.5, 0.0, 0.0])  # two classes never called: log 2, not NaN
    assert losses.probability_entropy(histogram).item() == pytest.approx(math.log(2))


@pytest.mark.parametrize("name", sorted(losses.DIVERGENCES))
def test_divergences_vanish_at_equality_and_are_positive_otherwise(name):
    divergence = losses.DIVERGENCES[name]
    a, b = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).unbind(0)[:2]
    a, b = a[None], b[None]
    assert divergence(a, a).item() == pytest.approx(0.0, abs=1e-6)
    assert divergence(a, b).item() > 1e-4


def test_symmetric_kl_is_the_sum_of_both_kls_and_js_is_bounded():
    a, b = torch.randn(2, 3, 10).unbind(0)
    assert torch.allclose(losses.symmetric_kl(a, b), losses.kl(a, b) + losses.reverse_kl(a, b), atol=1e-6)
    assert torch.allclose(losses.symmetric_kl(a, b), losses.symmetric_kl(b, a), atol=1e-6)
    far = torch.tensor([[50.0, 0.0]]), torch.tensor([[0.0, 50.0]])
    assert losses.jensen_shannon(*far).item() == pytest.approx(math.log(2), rel=1e-4)


def test_kl_matches_hand_computation():
    p, q = torch.tensor([0.7, 0.3]), torch.tensor([0.4, 0.6])
    expected = float((p * (p / q).log()).sum())
    assert losses.kl(p.log()[None], q.log()[None]).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("name", sorted(losses.OBJECTIVES))
def test_objectives_prefer_confident_predictions(name):
    objective = losses.OBJECTIVES[name]
    confident, unsure = torch.tensor([[6.0, 0.0, 0.0]]), torch.tensor([[0.3, 0.0, 0.0]])
    assert objective(confident).item() < objective(unsure).item()


def test_unknown_loss_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown divergence 'l3'.*skl"):
        losses.resolve(losses.DIVERGENCES, "l3", "divergence")
