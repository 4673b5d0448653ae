"""SAR end to end: recovery puts the source weights back."""

from __future__ import annotations

import torch

import zerosiam
from tests.toys import norm_params, tiny


def test_sar_resets_the_model_when_its_ema_falls_below_the_floor():
    model = tiny(scale=20.0)
    source = norm_params(model)
    adapter = zerosiam.adapt(model, "sar", lr=0.5)
    x = torch.rand(8, 3, 8, 8)
    adapter.recipe.recover.ema = 10.0  # far above the floor: adapts and keeps the adapted weights
    adapter(x)
    assert adapter.last["selected"] > 0 and not adapter.last["recovered"]
    assert not torch.equal(model.gn.weight, source["gn.weight"])
    adapter.recipe.recover.ema = 0.0  # collapsed: 0.9·0 + 0.1·L2 < 0.2 → reset
    adapter(x)
    assert adapter.last["recovered"] and adapter.recipe.recover.ema is None
    assert torch.equal(model.gn.weight, source["gn.weight"]) and torch.equal(model.gn.bias, source["gn.bias"])
