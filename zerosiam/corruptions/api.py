"""The public entry point :func:`apply`, the corruption registry and the per-image random generators."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import blur, digital, noise, weather
from .presets import PRESETS

CorruptionFn = Callable[[np.ndarray, Any, Sequence[np.random.Generator]], np.ndarray]


@dataclass(frozen=True)
class Corruption:
    """One corruption: its family, its function and whether it draws random numbers."""

    name: str
    group: str
    fn: CorruptionFn
    random: bool


_REGISTRY: tuple[Corruption, ...] = (
    # the 15 benchmark corruptions, in the order of the paper's tables
    Corruption("gaussian_noise", "noise", noise.gaussian_noise, True),
    Corruption("shot_noise", "noise", noise.shot_noise, True),
    Corruption("impulse_noise", "noise", noise.impulse_noise, True),
    Corruption("defocus_blur", "blur", blur.defocus_blur, False),
    Corruption("glass_blur", "blur", blur.glass_blur, True),
    Corruption("motion_blur", "blur", blur.motion_blur, True),
    Corruption("zoom_blur", "blur", blur.zoom_blur, False),
    Corruption("snow", "weather", weather.snow, True),
    Corruption("frost", "weather", weather.frost, True),
    Corruption("fog", "weather", weather.fog, True),
    Corruption("brightness", "weather", weather.brightness, False),
    Corruption("contrast", "digital", digital.contrast, False),
    Corruption("elastic_transform", "digital", digital.elastic_transform, True),
    Corruption("pixelate", "digital", digital.pixelate, False),
    Corruption("jpeg_compression", "digital", digital.jpeg_compression, False),
    # the 4 extra ones (not part of the 15-corruption average)
    Corruption("speckle_noise", "noise", noise.speckle_noise, True),
    Corruption("gaussian_blur", "blur", blur.gaussian_blur, False),
    Corruption("spatter", "weather", weather.spatter, True),
    Corruption("saturate", "digital", digital.saturate, False),
)

CORRUPTIONS: dict[str, Corruption] = {c.name: c for c in _REGISTRY}
BENCHMARK: tuple[str, ...] = tuple(c.name for c in _REGISTRY[:15])
EXTRA: tuple[str, ...] = tuple(c.name for c in _REGISTRY[15:])
ALL: tuple[str, ...] = BENCHMARK + EXTRA
GROUPS: dict[str, tuple[str, ...]] = {
    group: tuple(name for name in BENCHMARK if CORRUPTIONS[name].group == group)
    for group in ("noise", "blur", "weather", "digital")
}
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)

# Bounds the working memory of one call: images are processed in chunks of at most this many pixels.
# Chunking never changes a result, because every image has its own generator.
_CHUNK_PIXELS = 1 << 20


def image_rng(seed: int, name: str, severity: int, index: int) -> np.random.Generator:
    """The generator of image ``index`` for corruption ``name`` at ``severity`` under ``seed``.

    Keyed by (seed, position of ``name`` in :data:`ALL`, severity, index) through NumPy's SeedSequence,
    so an image gets the same corruption whatever batch, chunk or process it is computed in, and
    different corruptions and severities get independent randomness.
    """
    return np.random.default_rng([seed, ALL.index(name), severity, index])


def apply(
    images: np.ndarray,
    name: str,
    severity: int,
    preset: str = "cifar",
    seed: int = 0,
    start_index: int = 0,
) -> np.ndarray:
    """Corrupt a batch of RGB images with one corruption at one severity.

    ``images`` is uint8 of shape (N, S, S, 3) with S the preset's size (32 for "cifar", 224 for
    "imagenet"); the result is a new uint8 array of the same shape. Image ``i`` of the call is corrupted
    with :func:`image_rng` ``(seed, name, severity, start_index + i)``, so splitting a dataset into calls
    with matching ``start_index`` reproduces one big call exactly.
    """
    corruption, chosen = _validate(images, name, severity, preset, seed, start_index)
    params = chosen.params(name, severity)
    images = np.ascontiguousarray(images)
    out = np.empty_like(images)
    chunk = max(1, _CHUNK_PIXELS // (chosen.size * chosen.size))
    for lo in range(0, len(images), chunk):
        batch = images[lo : lo + chunk]
        indices = range(start_index + lo, start_index + lo + len(batch))
        rngs = [image_rng(seed, name, severity, i) for i in indices] if corruption.random else []
        out[lo : lo + len(batch)] = corruption.fn(batch, params, rngs)
    return out


def _validate(images: Any, name: Any, severity: Any, preset: Any, seed: Any, start_index: Any):
    """Check every argument of :func:`apply`, with an error message that says what was expected."""
    if not isinstance(name, str) or name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; choose one of {', '.join(ALL)}")
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if isinstance(severity, bool) or not isinstance(severity, int | np.integer) or severity not in SEVERITIES:
        raise ValueError(f"severity must be an integer from 1 to 5, got {severity!r}")
    for label, value in (("seed", seed), ("start_index", start_index)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(f"{label} must be a non-negative integer, got {value!r}")
    chosen = PRESETS[preset]
    if not isinstance(images, np.ndarray):
        raise TypeError(f"images must be a numpy array, got {type(images).__name__}")
    if images.dtype != np.uint8:
        raise TypeError(f"images must be uint8 (0..255), got dtype {images.dtype}")
    expected = (chosen.size, chosen.size, 3)
    if images.ndim != 4 or images.shape[1:] != expected:
        raise ValueError(
            f"images must have shape (N, {chosen.size}, {chosen.size}, 3) for preset {preset!r} "
            f"(its constants are tied to that size), got {images.shape}"
        )
    return CORRUPTIONS[name], chosen
