"""EATA's Fisher regularizer: the estimate, the penalty, and the error without clean data."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import zerosiam
from tests.toys import tiny
from zerosiam.parts.fisher import MissingCleanDataError, estimate_fisher, fisher


def test_fisher_is_the_mean_squared_gradient_of_self_labelled_cross_entropy():
    model = tiny(scale=3.0)
    params = {"gn.weight": model.gn.weight, "gn.bias": model.gn.bias}
    batches = [torch.rand(4, 3, 8, 8), (torch.rand(4, 3, 8, 8), torch.zeros(4))]
    fisher = estimate_fisher(model, params, batches)
    expected = torch.zeros_like(model.gn.weight)
    for x in (batches[0], batches[1][0]):
        logits = model(x)
        (grad,) = torch.autograd.grad(
            nn.functional.cross_entropy(logits, logits.argmax(-1)), [model.gn.weight]
        )
        expected += grad.pow(2) / 2
    assert torch.allclose(fisher["gn.weight"], expected, atol=1e-8)


def test_fisher_term_is_zero_at_the_source_and_grows_away_from_it():
    model = tiny(scale=3.0)
    adapter = zerosiam.adapt(model, "eata", clean_data=[torch.rand(4, 3, 8, 8) for _ in range(3)], lr=0.1)
    regularizer = adapter.recipe.regularizer
    assert regularizer(adapter).item() == 0.0
    distances = []
    for delta in (0.01, 0.1):
        with torch.no_grad():
            model.gn.weight.copy_(regularizer.anchor["gn.weight"] + delta)
        distances.append(regularizer(adapter).item())
        manual = 2000.0 * (regularizer.fisher["gn.weight"] * delta**2).sum().item()
        assert distances[-1] == pytest.approx(manual, rel=1e-4)
    assert 0 < distances[0] < distances[1]


def test_eata_without_clean_data_is_a_clear_error():
    with pytest.raises(MissingCleanDataError, match="clean_data"):
        zerosiam.adapt(tiny(), "eata", lr=0.1)
    with pytest.raises(TypeError, match="unknown option"):
        zerosiam.adapt(tiny(), "tent", clean_data=[torch.rand(2, 3, 8, 8)], lr=0.1)
    zerosiam.adapt(tiny(), "eta", lr=0.1)  # ETA has no Fisher: no clean data needed
    # a recipe given the regularizer by override also takes the clean data
    adapter = zerosiam.adapt(
        tiny(), "tent", regularizer=fisher(), clean_data=[torch.rand(2, 3, 8, 8)], lr=0.1
    )
    assert adapter.recipe.regularizer.fisher
