"""CCC on the benchmark's data: the walks calibrated on the run's own source model, kept on disk.

CCC (Press et al., NeurIPS 2023) holds a reference model's accuracy near a target by choosing, for each
pair of corruptions, the walk through their severities whose calibrated accuracy is nearest it
(``zerosiam.protocols.streams.best_walk``). Here the reference is the run's source model, so the target
means the same on every model: a calibration grid is that model's accuracy on ``CALIBRATION_IMAGES``
clean images (one fixed set, ``seeding.CCC_CALIBRATION``) corrupted by the first corruption at each
severity 0–5 and then the second at each severity 0–5. CCC corrupts with ImageNet-C's constants; on
CIFAR-10 a stream corrupts with :data:`CCC_PRESETS`' scale, CIFAR-10-C's with ImageNet-C's harsher
constants where they act pixel by pixel (the noises, contrast, brightness, saturation): CIFAR-10-C's own
cannot bring a model below about half its images, let alone near chance. CCC calibrates on quarter steps
of severity with interpolated constants; this project's corruptions have the five published severities,
so a walk moves in whole steps. A grid is 36 small forward passes; it depends on the weights, the data,
the scale, the pair and the arithmetic, and is kept in the cache under all of them, so every method and
seed of a model reuses it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from zerosiam.assets.files import atomic_file
from zerosiam.assets.store import cache_dir
from zerosiam.bench import datasets
from zerosiam.bench.mistakes import weights_fingerprint
from zerosiam.bench.spec import RunSpec
from zerosiam.bench.store import run_id_for
from zerosiam.corruptions import apply
from zerosiam.corruptions.datasets import SOURCES, load_corrupted
from zerosiam.data.tensors import to_input
from zerosiam.protocols import seeding, streams
from zerosiam.protocols.build import CCCSource, Predict, subsample

FOLDER = "ccc_calibration"
Classes = Callable[[np.ndarray], np.ndarray]  # uint8 images to the source model's classes
CALIBRATION_IMAGES = 500
CALIBRATION_SEED = 0  # one calibration set for every run: the grid belongs to the model, not the run
CCC_PRESETS = {"cifar": "cifar-ccc"}  # a benchmark's corruption scale → the one its CCC streams walk


def ccc_preset(dataset: str) -> str:
    """The corruption scale a CCC stream over the clean images of ``dataset`` walks."""
    preset = SOURCES[dataset][1]
    return CCC_PRESETS.get(preset, preset)


def ccc_source(spec: RunSpec, model: nn.Module, predict: Predict, device: torch.device) -> CCCSource:
    """The clean images, corruption engine and calibrated walks of ``spec``'s CCC stream; the walks are
    calibrated on the unadapted ``model`` (``predict`` runs it on ``device``)."""
    calibration = Calibration(spec, model, predict, device)  # the stream corrupts on the scale it calibrates

    def corrupt(images: np.ndarray, name: str, severity: int, first: int) -> np.ndarray:
        return apply(images, name, severity, preset=calibration.preset, seed=spec.seed, start_index=first)

    return CCCSource(load_corrupted(calibration.dataset, "clean", 1), corrupt, calibration.walk)


class Calibration:
    """The calibration grids of one source model, one pair of corruptions at a time, and the walks they
    give at a run's target."""

    def __init__(self, spec: RunSpec, model: nn.Module, predict: Predict, device: torch.device) -> None:
        self.dataset = datasets.clean_source(spec.dataset)
        self.preset = ccc_preset(self.dataset)
        self.target = spec.target
        clean = load_corrupted(self.dataset, "clean", 1)
        self.images = subsample(*clean, CALIBRATION_IMAGES, CALIBRATION_SEED, seeding.CCC_CALIBRATION)
        self.classes: Classes = functools.partial(_classes, predict, device=device)
        self.identity = {
            "weights": weights_fingerprint(model),
            "dataset": self.dataset,
            "preset": self.preset,
            "images": CALIBRATION_IMAGES,
            "precision": spec.precision,
            "device": device.type,
        }

    @functools.cache  # noqa: B019 (one calibration per run: the cache goes with it)
    def grid(self, first: str, second: str) -> np.ndarray:
        """The source model's accuracy (%) with ``first`` at severity ``s1`` then ``second`` at ``s2``."""
        identity = self.identity | {"pair": [first, second]}
        return calibrated(identity, self.images, first, second, self.preset, self.classes)

    def walk(self, first: str, second: str) -> list[tuple[int, int]]:
        """The walk from ``first`` to ``second`` whose calibrated accuracy is nearest the target."""
        return streams.best_walk(self.grid(first, second), self.target)


def calibrated(
    identity: dict[str, Any],
    calibration: tuple[np.ndarray, np.ndarray],
    first: str,
    second: str,
    preset: str,
    classes: Classes,
) -> np.ndarray:
    """The accuracy grid (%) of ``first`` at severity ``s1`` then ``second`` at ``s2`` (rows, columns
    0–5), from the cache when found before, else measured and kept."""
    path = cache_dir() / FOLDER / f"{run_id_for(identity)}.npy"
    shape = (streams.CCC_SEVERITIES, streams.CCC_SEVERITIES)
    try:
        known = np.load(path, allow_pickle=False)
        if known.shape == shape:
            return known
    except (OSError, ValueError):
        pass
    found = measure_grid(calibration, first, second, preset, classes)
    with atomic_file(Path(path)) as handle:  # two workers measuring one grid write the same bytes
        np.save(handle, found, allow_pickle=False)
    return found


def measure_grid(
    calibration: tuple[np.ndarray, np.ndarray], first: str, second: str, preset: str, classes: Classes
) -> np.ndarray:
    """The source model's accuracy (%) on ``calibration`` under every pair of severities (CCC's
    calibration matrix of one pair of corruptions)."""
    images, labels = calibration
    images = np.ascontiguousarray(images)
    grid = np.zeros((streams.CCC_SEVERITIES, streams.CCC_SEVERITIES))
    for s1 in range(streams.CCC_SEVERITIES):
        once = apply(images, first, s1, preset=preset, seed=CALIBRATION_SEED) if s1 else images
        for s2 in range(streams.CCC_SEVERITIES):
            twice = apply(once, second, s2, preset=preset, seed=CALIBRATION_SEED) if s2 else once
            grid[s1, s2] = 100 * float(np.mean(classes(twice) == labels))
    return grid


def _classes(predict: Predict, images: np.ndarray, *, device: torch.device, batch: int = 250) -> np.ndarray:
    """``predict``'s classes for uint8 ``images``, without gradients, computed on ``device``."""
    classes = []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            x = to_input(torch.from_numpy(np.ascontiguousarray(images[start : start + batch])).to(device))
            classes.append(predict(x).argmax(1).cpu().numpy())
    return np.concatenate(classes)
