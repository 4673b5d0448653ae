"""Noise corruptions: gaussian, shot (Poisson), impulse (salt and pepper) and speckle.

Each image draws its whole noise field from its own generator (``rngs[i]``), so a batch gives exactly the
same pixels as processing its images one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ._common import to_uint8, unit


def _fields(rngs: Sequence[np.random.Generator], draw: Callable[[np.random.Generator], np.ndarray]):
    """Stack one independently drawn field per image."""
    return np.stack([draw(rng) for rng in rngs])


def gaussian_noise(images: np.ndarray, c: float, rngs: Sequence[np.random.Generator]) -> np.ndarray:
    """Additive N(0, c²) noise, independent per pixel and channel."""
    x = unit(images)
    return to_uint8(x + _fields(rngs, lambda rng: rng.normal(0.0, c, x.shape[1:])))


def shot_noise(images: np.ndarray, c: float, rngs: Sequence[np.random.Generator]) -> np.ndarray:
    """Photon noise: Poisson(c·x)/c, so c is the photon count at full white (larger c, less noise)."""
    x = unit(images)
    counts = np.stack([rng.poisson(image * c) for rng, image in zip(rngs, x, strict=True)])
    return to_uint8(counts / c)


def impulse_noise(images: np.ndarray, c: float, rngs: Sequence[np.random.Generator]) -> np.ndarray:
    """Salt and pepper decided per channel: a fraction c of values flips, half of them to white.

    The flip mask is drawn before the salt mask, as the specification orders the draws.
    """
    x = unit(images)

    def masks(rng: np.random.Generator) -> np.ndarray:
        flip = rng.random(x.shape[1:]) < c
        salt = rng.random(x.shape[1:]) < 0.5
        return np.stack([flip & salt, flip & ~salt])

    drawn = _fields(rngs, masks)
    return to_uint8(np.where(drawn[:, 0], 1.0, np.where(drawn[:, 1], 0.0, x)))


def speckle_noise(images: np.ndarray, c: float, rngs: Sequence[np.random.Generator]) -> np.ndarray:
    """Multiplicative noise x + x·n with n ~ N(0, c²): stronger in bright regions, none on black."""
    x = unit(images)
    return to_uint8(x + x * _fields(rngs, lambda rng: rng.normal(0.0, c, x.shape[1:])))
