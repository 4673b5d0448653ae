"""Models a user might bring to ``zerosiam bench`` as ``builder:tests.cli.toys:<function>``: each takes the
fake 4×4 images of ``tests/bench/conftest.py``'s ``fake_domains`` and has the 10 classes of CIFAR-10, so a
grid on them runs in a second (their model options: ``TOY_OPTIONS``)."""

from __future__ import annotations

import torch
from torch import nn

TOY_OPTIONS = ["--model-option", "mean=0", "--model-option", "std=1", "--model-option", "input_size=4",
               "--model-option", "dataset=cifar10"]  # fmt: skip
FEATURES = 3 * 4 * 4


class FlatLN(nn.Module):
    """A LayerNorm classifier: something for every adapting method to adapt."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(FEATURES)
        self.fc = nn.Linear(FEATURES, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x.flatten(1)))


class TwoOutputs(FlatLN):
    """Returns a dict of two tensors, neither called ``logits``: which holds the logits must be named."""

    def __init__(self) -> None:
        super().__init__()
        self.aux = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.norm(x.flatten(1))
        return {"scores": self.fc(features), "aux": self.aux(features)}


def flat_ln() -> FlatLN:
    torch.manual_seed(0)
    return FlatLN()


def two_outputs() -> TwoOutputs:
    torch.manual_seed(0)
    return TwoOutputs()


def no_norm() -> nn.Module:
    """A linear classifier: no norm layer, nothing an adapting method moves."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(FEATURES, 10))
