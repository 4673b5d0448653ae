"""Blur corruptions: defocus, glass, motion, zoom and (extra) gaussian blur."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy import ndimage

from ._common import (
    filter_matrix,
    gaussian_matrix,
    separable,
    to_uint8,
    unit,
    zoom_average_operator,
)
from ._common import motion_blur as _motion_blur


# ------------------------------------------------------------------------------------------- defocus
@lru_cache(maxsize=32)
def disk_kernel(radius: float, alias_sigma: float) -> np.ndarray:
    """The anti-aliased disk of defocus blur, trimmed to its non-zero support.

    A normalized disk on a 17×17 grid (radius ≤ 8) or a (2r+1)² grid, blurred by a 3×3 (or 5×5) Gaussian
    window with a mirror border at the grid edge and deliberately *not* renormalized afterwards: where the
    disk touches the grid border the kernel sums to about 1.01, which brightens ImageNet severities 4–5
    like the reference does. Rows and columns that are exactly zero are trimmed symmetrically; that keeps
    the centre and only saves work.
    """
    half, window = (8, 3) if radius <= 8 else (int(radius), 5)
    grid = np.arange(-half, half + 1, dtype=np.float64)
    disk = (grid[:, None] ** 2 + grid[None, :] ** 2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    k = np.arange(-(window // 2), window // 2 + 1, dtype=np.float64)
    taps = np.exp(-(k**2) / (2.0 * alias_sigma**2))
    smooth = filter_matrix(taps / taps.sum(), len(grid), "mirror")
    kernel = smooth @ disk @ smooth.T
    while kernel.shape[0] > 1 and not kernel[0].any() and not kernel[:, 0].any():
        kernel = kernel[1:-1, 1:-1]
    kernel.setflags(write=False)
    return kernel


def defocus_blur(images: np.ndarray, params: tuple[float, float], rngs: Sequence) -> np.ndarray:
    """Correlate every channel with the anti-aliased disk (mirror border)."""
    kernel = disk_kernel(*params)
    out = ndimage.correlate(unit(images), kernel[None, :, :, None], mode="mirror")
    return to_uint8(out)


# ------------------------------------------------------------------------------------------- glass
def glass_blur(images: np.ndarray, params: tuple[float, int, int], rngs: Sequence) -> np.ndarray:
    """Gaussian blur, T passes of local pixel copies, Gaussian blur again (uint8 truncation between).

    One pass visits rows and columns δ+1..H−δ in descending raster order and copies onto each visited pixel
    the *current* value at an offset (dx, dy) drawn uniformly from {−δ..δ−1}² (the reference's "swap" is
    a one-way copy and its offset range is asymmetric; both quirks are kept). The sequential scan is
    reproduced exactly but in parallel by resolving, for every pixel, the chain of already-visited sources
    it reads through (:func:`_pass_sources`).
    """
    sigma, delta, passes = params
    n, h, w, c = images.shape
    blur = gaussian_matrix(float(sigma), h)
    shuffled = to_uint8(separable(unit(images), blur)).reshape(n, h * w, c)
    visited = _scan_order(h, w, delta)
    for _ in range(passes):
        offsets = np.stack([rng.integers(-delta, delta, size=(len(visited), 2)) for rng in rngs])
        sources = _pass_sources(visited, offsets, h, w)
        shuffled = np.take_along_axis(shuffled, sources[:, :, None], axis=1)
    return to_uint8(separable(unit(shuffled.reshape(n, h, w, c)), blur))


@lru_cache(maxsize=16)
def _scan_order(h: int, w: int, delta: int) -> np.ndarray:
    """Flat indices of the visited pixels in the reference's visiting order (descending raster index)."""
    rows = np.arange(h - delta, delta, -1)
    cols = np.arange(w - delta, delta, -1)
    order = (rows[:, None] * w + cols[None, :]).ravel()
    order.setflags(write=False)
    return order


def _pass_sources(visited: np.ndarray, offsets: np.ndarray, h: int, w: int) -> np.ndarray:
    """For one pass, the pass-start flat index each pixel ends up holding, per image: (N, H·W).

    Pixel p copies s(p) = p + dy·W + dx. If s(p) was itself visited earlier in this pass (it is visited
    and has a larger raster index), p holds what s(p) copied, so we follow the chain while each link
    points to an already-visited pixel with a larger index than the previous one. Links strictly increase
    the index, so the loop ends (after one round when δ = 1, where no chain can continue).
    """
    n = offsets.shape[0]
    size = h * w
    source = np.broadcast_to(np.arange(size), (n, size)).copy()
    source[:, visited] = visited + offsets[:, :, 1] * w + offsets[:, :, 0]
    is_visited = np.zeros(size, dtype=bool)
    is_visited[visited] = True
    pointer = source.copy()
    previous = np.broadcast_to(np.arange(size), (n, size)).copy()
    active = np.broadcast_to(is_visited, (n, size)).copy()
    while True:
        follow = active & is_visited[pointer] & (pointer > previous)
        if not follow.any():
            return pointer
        previous = np.where(follow, pointer, previous)
        pointer = np.where(follow, np.take_along_axis(source, pointer, axis=1), pointer)
        active = follow


# ------------------------------------------------------------------------------------------- motion
def motion_blur(images: np.ndarray, params: tuple[float, float], rngs: Sequence) -> np.ndarray:
    """Line-kernel motion blur with one angle θ ~ U[−45°, 45°) per image (roughly horizontal streaks)."""
    radius, sigma = params
    angles = np.array([rng.uniform(-45.0, 45.0) for rng in rngs])
    return _motion_blur(images, radius, sigma, angles)


# ------------------------------------------------------------------------------------------- zoom
def zoom_factors(start: float, stop: float, step: float) -> np.ndarray:
    """The reference's ``arange`` of zoom factors, kept as ``arange`` so that its float rounding (which
    sometimes includes the stop value) gives the same factor counts as the published benchmark."""
    return np.arange(start, stop, step)


def zoom_blur(images: np.ndarray, params: tuple[float, float, float], rngs: Sequence) -> np.ndarray:
    """Average of the image and its clipped zooms by every factor (1.00 included, so the unzoomed image
    carries weight 2/(|Z|+1)), applied as one precomputed sparse operator on the flattened images."""
    n, h, w, c = images.shape
    operator = zoom_average_operator(h, tuple(float(z) for z in zoom_factors(*params)))
    planes = unit(images).reshape(n, h * w, c).transpose(1, 0, 2).reshape(h * w, n * c)
    out = (operator @ planes).reshape(h * w, n, c).transpose(1, 0, 2)
    return to_uint8(out.reshape(n, h, w, c))


# ------------------------------------------------------------------------------------------- gaussian
def gaussian_blur(images: np.ndarray, sigma: float, rngs: Sequence) -> np.ndarray:
    """Gaussian blur with SciPy's truncation (4σ) and edge-replicating border."""
    return to_uint8(separable(unit(images), gaussian_matrix(float(sigma), images.shape[1])))
