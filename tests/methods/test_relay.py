"""Relay: one method adapts the first batches, another takes the adapted model over (saving a collapse)."""

from __future__ import annotations

import copy

import pytest
import torch

import zerosiam
from tests.conftest import TinyGN
from zerosiam.methods.relay import Relay


def _stream(n: int, seed: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(6, 3, 8, 8, generator=generator) * 2 for _ in range(n)]


def _norms(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: p.detach().clone() for name, p in model.named_parameters() if "gn" in name or "norm" in name
    }


def test_release_can_keep_the_adapted_weights(tiny_gn: TinyGN):
    source = _norms(tiny_gn)
    flags = {name: p.requires_grad for name, p in tiny_gn.named_parameters()}
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=1e-1)
    for x in _stream(3):
        adapter(x)
    adapted = _norms(tiny_gn)
    assert any(not torch.equal(adapted[k], source[k]) for k in source)
    model = adapter.release(keep_adapted=True)
    assert all(torch.equal(p, adapted[k]) for k, p in _norms(model).items())
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags  # as they came


def test_the_second_leg_starts_from_the_first_legs_weights(tiny_gn: TinyGN):
    """After the hand-over the stream goes on exactly as a second adapter built on the adapted model would
    take it: the relay neither resets the weights nor takes an extra step."""
    twin = copy.deepcopy(tiny_gn)
    stream = _stream(5)
    relay = Relay(
        zerosiam.adapt(tiny_gn, "tent", lr=1e-1),
        2,
        lambda model: zerosiam.adapt(model, "zerosiam", lr=1e-2, predictor_lr=1e-2),
    )
    outputs = [relay(x) for x in stream]
    first = zerosiam.adapt(twin, "tent", lr=1e-1)
    expected = [first(x) for x in stream[:2]]
    second = zerosiam.adapt(first.release(keep_adapted=True), "zerosiam", lr=1e-2, predictor_lr=1e-2)
    expected += [second(x) for x in stream[2:]]
    for got, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert relay.steps == 5 and len(relay.history) == 5
    assert relay.current is relay.second and relay.second.steps == 3
    assert torch.isnan(torch.tensor(relay.history[1]["predictor_drift"]))  # Tent has no predictor
    assert relay.history[2]["predictor_drift"] > 0


def test_a_relay_needs_a_positive_whole_number_of_steps(tiny_gn: TinyGN):
    adapter = zerosiam.adapt(tiny_gn, "tent")
    for steps in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive whole number"):
            Relay(adapter, steps, lambda model: zerosiam.adapt(model, "zerosiam"))
