"""The model zoo: names a user can type, each a model that takes float images in [0, 1].

Every entry carries its input size, normalization and class count; normalization happens inside the
returned module, so a stream of [0, 1] images works for every model and the adapter never needs to know.
Checkpoints come from the asset registry, which verifies their sha256 before they are read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zerosiam.parts.split import find_head

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Normalized(nn.Module):
    """A classifier behind its input normalization: ``forward(x) = model((x − mean) / std)``."""

    def __init__(self, model: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.model((x - self.mean) / self.std)

    def get_classifier(self) -> nn.Module | None:
        """The wrapped model's head, so the adapter's split sees through the normalization."""
        return find_head(self.model)

    @property
    def wrapped_model(self) -> nn.Module:
        return self.model


@dataclass(frozen=True)
class ModelEntry:
    """What the benchmark needs to know about a model besides its weights."""

    build: Callable[[], nn.Module]
    input_size: int
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    dataset: str


def _cifar_resnet(depth: int) -> nn.Module:
    from zerosiam.data.assets import fetch
    from zerosiam.zoo.cifar_resnet import CifarResNet

    checkpoint = torch.load(fetch(f"resnet{depth}"), map_location="cpu", weights_only=True)
    state = {key.removeprefix("module."): value for key, value in checkpoint["state_dict"].items()}
    model = CifarResNet(depth)
    model.load_state_dict(state)
    return model


MODELS: dict[str, ModelEntry] = {
    # akamaster/pytorch_resnet_cifar10: inputs normalised with ImageNet mean/std (shared/README.md).
    f"resnet{depth}": ModelEntry(
        build=lambda depth=depth: _cifar_resnet(depth),
        input_size=32,
        num_classes=10,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        dataset="cifar10",
    )
    for depth in (20, 32, 56)
}


def available_models() -> list[str]:
    return list(MODELS)


def load_model(name: str) -> nn.Module:
    """The named model in eval mode, normalizing inside: float images in [0, 1], ``(N, 3, H, W)`` → logits."""
    try:
        entry = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available_models())}") from None
    return Normalized(entry.build(), entry.mean, entry.std).eval()
