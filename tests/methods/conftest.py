"""Fixtures of the method tests."""

from __future__ import annotations

import pytest
import torch

from zerosiam.parts import selection


@pytest.fixture
def confident_gn(tiny_gn, monkeypatch):
    """TinyGN with sharp logits, so that entropy filters keep some samples and drop others; DeYO's patch
    shuffle made deterministic (the colour channels reversed), so that stacked and lone streams see the
    same second view (a random shuffle draws differently for a stacked batch)."""
    with torch.no_grad():
        tiny_gn.fc.weight.mul_(8.0)
    monkeypatch.setattr(selection, "shuffle_patches", lambda x, grid=4, permutation=None: x.flip(1))
    return tiny_gn
