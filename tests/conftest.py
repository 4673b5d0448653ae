"""Shared fixtures: tiny models that run in milliseconds and the path of the real-asset mirror."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

SHARED_ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets"


class TinyGN(nn.Module):
    """A miniature GroupNorm/LayerNorm classifier with a named ``fc`` head (like ResNet-50-GN)."""

    def __init__(self, num_classes: int = 5, width: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.gn = nn.GroupNorm(2, width)
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.gn(self.conv(x))).mean((2, 3))
        return self.fc(self.norm(features))


class TinyBN(nn.Module):
    """A miniature BatchNorm classifier whose head has an unusual name (found from the forward)."""

    def __init__(self, num_classes: int = 5, width: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.scorer = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scorer(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.fixture
def tiny_gn() -> TinyGN:
    torch.manual_seed(0)
    model = TinyGN()
    with torch.no_grad():  # spread the affine parameters so that updates are visible
        for module in (model.gn, model.norm):
            module.weight.uniform_(0.5, 1.5)
            module.bias.uniform_(-0.2, 0.2)
    return model


@pytest.fixture
def tiny_bn() -> TinyBN:
    torch.manual_seed(0)
    model = TinyBN()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.1, 0.1)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture
def images() -> torch.Tensor:
    return torch.rand(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def needs_assets() -> pytest.MarkDecorator:
    return pytest.mark.skipif(not SHARED_ASSETS.is_dir(), reason="the shared asset mirror is absent")
