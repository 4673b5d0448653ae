"""What every zoo model shares: the normalization wrapper and the description a benchmark needs.

Kept apart from the registry so that the loaders of each kind of model can use it without importing
one another.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zerosiam.parts.split import OutputChoice, find_head, logits_of

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The datasets the benchmark runner can feed, with the side of the square images it feeds.
DATASET_INPUT_SIZES = {"cifar10": 32, "imagenet": 224}
# A class count that names its dataset, so that a user model needs no ``dataset=`` in the common cases.
_DATASET_BY_CLASSES = {10: "cifar10", 1000: "imagenet"}


class UnknownModelError(ValueError):
    """The name matches no zoo entry and no model spec; the message lists what would."""


class Normalized(nn.Module):
    """A classifier behind its input normalization: ``forward(x) = model((x − mean) / std)``, read as logits.

    Normalizing inside lets every stream hand over plain [0, 1] images, whatever the model was trained
    with, so neither the adapter nor the benchmark has to know a model's preprocessing. With
    ``resize_to``, images of another size are first resized to that square side with ``interpolation``
    (a Hugging Face model, whose processor resizes every image). What the model returns is read as its
    logits (``zerosiam.parts.split.logits_of``; ``output`` names the field when the rule cannot tell), so
    every zoo model returns a tensor and an adapter never sees another output.
    """

    def __init__(
        self,
        model: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        resize_to: int | None = None,
        interpolation: str = "bilinear",
        output: OutputChoice = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.output = output
        self.resize_to = resize_to
        self.interpolation = interpolation
        self.register_buffer("mean", torch.tensor(tuple(mean)).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(tuple(std)).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return logits_of(self.model((self._resized(x) - self.mean) / self.std), self.output)

    def _resized(self, x: Tensor) -> Tensor:
        """``x`` at ``resize_to``² (antialiased when shrinking, as PIL resizes), or as it is."""
        size = (self.resize_to, self.resize_to)
        if self.resize_to is None or tuple(x.shape[-2:]) == size:
            return x
        smooth = self.interpolation in ("bilinear", "bicubic")
        return F.interpolate(
            x, size=size, mode=self.interpolation, antialias=smooth, align_corners=False if smooth else None
        )

    def get_classifier(self) -> nn.Module | None:
        """The wrapped model's head, so the adapter's split sees through the normalization."""
        return find_head(self.model)

    @property
    def wrapped_model(self) -> nn.Module:
        """The model itself, for code that picks settings by architecture (e.g. learning rates)."""
        return self.model


@dataclass(frozen=True)
class ModelEntry:
    """What the benchmark needs to know about a model besides its weights.

    ``dataset`` tells the runner which data to stream ("cifar10" or "imagenet"); it is None for a user
    model whose class count names no known dataset. ``build`` returns the bare model (without the
    normalization), in eval mode or not; :func:`zerosiam.load_model` wraps and switches it. ``resize`` is
    None when images reach the model as they come (``input_size`` is then recorded only), or the
    interpolation the wrapper resizes them to ``input_size`` with (``hf:`` models, whose processor says so).
    """

    build: Callable[[], nn.Module]
    input_size: int
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    dataset: str | None
    source: str = ""
    licence: str = ""
    resize: str | None = None  # an interpolation: images of another size are resized to input_size with it


def as_channels(values: Sequence[float] | float, what: str) -> tuple[float, ...]:
    """Per-channel constants as a tuple of 3 floats (a single number is used for every channel)."""
    if isinstance(values, int | float):
        values = (float(values),) * 3
    result = tuple(float(v) for v in values)
    if len(result) != 3:
        raise ValueError(f"{what} needs one value per RGB channel (3), got {len(result)}: {result}")
    return result


def check_normalization(mean: Sequence[float] | float, std: Sequence[float] | float) -> tuple[tuple, tuple]:
    """Validated ``(mean, std)``: three channels each and a strictly positive std."""
    mean_t, std_t = as_channels(mean, "mean"), as_channels(std, "std")
    if min(std_t) <= 0:
        raise ValueError(f"std must be positive in every channel, got {std_t}")
    return mean_t, std_t


def dataset_for(num_classes: int, dataset: str | None) -> str | None:
    """The dataset a model is evaluated on: as given, else the one its class count names, else None."""
    if dataset is not None:
        if dataset not in DATASET_INPUT_SIZES:
            raise ValueError(f"dataset must be one of {sorted(DATASET_INPUT_SIZES)}, got {dataset!r}")
        return dataset
    return _DATASET_BY_CLASSES.get(num_classes)


@dataclass(frozen=True)
class Options:
    """The keyword options of :func:`zerosiam.load_model` for a spec (zoo entries take none)."""

    num_classes: int | None = None
    checkpoint: str | os.PathLike[str] | None = None
    checkpoint_sha256: str | None = None
    mean: Sequence[float] | float | None = None
    std: Sequence[float] | float | None = None
    input_size: int | None = None
    dataset: str | None = None
    builder_kwargs: Mapping[str, Any] = field(default_factory=dict)
    strict: bool = True
    output: str | int | None = None  # the field of the model's output that holds the logits (logits_of)
