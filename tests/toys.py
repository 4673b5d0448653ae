"""Toy models and batches shared by the parts' and the methods' tests: fast, and shaped so that each
part has something to act on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerosiam.parts.contract import Batch
from zerosiam.parts.losses import entropy

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
"""What device tests run on: the CPU always, CUDA where the machine has it (never in CI)."""


class Tiny(nn.Module):
    """conv → GroupNorm → flatten → linear: position-sensitive (for PLPD) and fast."""

    def __init__(self, classes: int = 5, size: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4 * size * size, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.gn(self.conv(x))).flatten(1))


def tiny(scale: float = 1.0, seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    model = Tiny()
    with torch.no_grad():
        model.fc.weight.mul_(scale)
    return model


def batch_of(logits: torch.Tensor, **fields) -> Batch:
    fields.setdefault("learner", None)
    return Batch(
        x=torch.zeros(len(logits), 3, 4, 4), logits=logits, target=logits, entropy=entropy(logits), **fields
    )


def norm_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


class CifarToy(nn.Module):
    """A small GroupNorm classifier of 32×32 RGB images into 10 classes: a user's own model, built by
    ``builder:tests.toys:cifar_toy`` (it carries no normalization of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


def cifar_toy() -> CifarToy:
    torch.manual_seed(0)
    return CifarToy()
