"""Building blocks shared by several corruptions: scaling, quantization, linear filters and resampling.

Everything works on a batch laid out as (N, H, W, C) (or (N, H, W) for one-channel fields). The linear
operators are precomputed as dense H×H matrices with the border rule folded in, so one batched matrix
product ``B · X · Bᵀ`` applies a separable filter to a whole batch at once, whatever the kernel radius
(the folding stays exact even when the radius exceeds the image, which a single padding step cannot do).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import sparse

Border = str  # "edge" (a a | a b c), "symmetric" (b a | a b c) or "mirror" (c b | a b c)

# Values that are integers in exact arithmetic can land a rounding error below the integer; without this
# tolerance the truncation to uint8 would cut them down a whole grey level (e.g. a saturated 1.0 → 254).
_TRUNCATION_TOLERANCE = 1e-6


def unit(images: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    """uint8 in 0..255 to floats in [0, 1] (the scale every corruption formula is written on)."""
    return images.astype(dtype) / dtype(255.0)


def to_uint8(x: np.ndarray) -> np.ndarray:
    """Floats in [0, 1] (clipped) to uint8 by truncation, as the reference pipelines store results."""
    return quantize_255(np.clip(x, 0.0, 1.0) * 255.0)


def quantize_255(v: np.ndarray) -> np.ndarray:
    """Floats on the 0..255 scale (clipped) to uint8 by truncation (⌊v⌋, within the rounding tolerance)."""
    return np.floor(np.clip(v, 0.0, 255.0) + _TRUNCATION_TOLERANCE).astype(np.uint8)


def fold_index(index: np.ndarray, size: int, border: Border) -> np.ndarray:
    """Map integer positions outside 0..size-1 back into the image under the given border rule."""
    if border == "edge":
        return np.clip(index, 0, size - 1)
    if border == "symmetric":  # period 2·size, reflecting about the outer pixel edges
        index = np.mod(index, 2 * size)
        return np.where(index >= size, 2 * size - 1 - index, index)
    if border == "mirror":  # period 2·(size-1), reflecting about the outer pixel centres
        if size == 1:
            return np.zeros_like(index)
        index = np.mod(index, 2 * (size - 1))
        return np.where(index >= size, 2 * (size - 1) - index, index)
    raise ValueError(f"unknown border rule {border!r}")


def gaussian_weights(sigma: float, truncate: float) -> np.ndarray:
    """SciPy's 1-D Gaussian: taps |k| ≤ ⌊truncate·σ + 0.5⌋, weights ∝ exp(−k²/2σ²), summing to 1."""
    radius = int(truncate * sigma + 0.5)
    k = np.arange(-radius, radius + 1, dtype=np.float64)
    weights = np.exp(-0.5 * (k / sigma) ** 2) if sigma > 0 else (k == 0).astype(np.float64)
    return weights / weights.sum()


def filter_matrix(weights: np.ndarray, size: int, border: Border) -> np.ndarray:
    """The size×size matrix of a centred 1-D correlation with ``weights`` under ``border``."""
    radius = len(weights) // 2
    rows = np.repeat(np.arange(size), len(weights))
    taps = np.tile(np.arange(-radius, radius + 1), size)
    matrix = np.zeros((size, size))
    np.add.at(matrix, (rows, fold_index(rows + taps, size, border)), np.tile(weights, size))
    return matrix


@lru_cache(maxsize=128)
def gaussian_matrix(sigma: float, size: int, border: Border = "edge", truncate: float = 4.0) -> np.ndarray:
    """The Gaussian filter G_σ of the specification as a size×size matrix (σ = 0 is the identity)."""
    matrix = filter_matrix(gaussian_weights(sigma, truncate), size, border)
    matrix.setflags(write=False)
    return matrix


def along_last(x: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Apply ``matrix`` (M×K) to the last axis (length K) of ``x``: one large matrix product.

    A single GEMM over all rows is used instead of a broadcast stack of small products: with a threaded
    BLAS, thousands of tiny products each pay the call's and the threads' overhead, which on a busy CPU
    costs far more than the arithmetic (``docs/corruptions.md`` gives the measurement).
    """
    return (x.reshape(-1, x.shape[-1]) @ matrix.T).reshape(*x.shape[:-1], matrix.shape[0])


def along_rows(x: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Apply ``matrix`` to the second-to-last axis of ``x`` (the rows of an (…, H, W) stack of planes)."""
    return along_last(x.swapaxes(-1, -2), matrix).swapaxes(-1, -2)


def separable(x: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Apply the same 1-D operator along rows and columns of every image and channel: B·X·Bᵀ.

    ``x`` is (N, H, W) or (N, H, W, C); channels are never mixed.
    """
    if x.ndim == 3:
        return along_rows(along_last(x, matrix), matrix)
    planes = np.moveaxis(x, -1, 1)  # (N, C, H, W)
    return np.moveaxis(along_rows(along_last(planes, matrix), matrix), 1, -1)


@lru_cache(maxsize=128)
def _clipped_zoom_taps(size: int, zoom: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lower/upper source indices and upper weights of the 1-D clipped zoom (see :func:`clipped_zoom`)."""
    crop = math.ceil(size / zoom)
    top = (size - crop) // 2
    zoomed = round(crop * zoom)  # SciPy's output length rule: half to even
    trim = (zoomed - size) // 2
    coords = top + (np.arange(size) + trim) * (crop - 1) / (zoomed - 1)
    lower = np.clip(np.floor(coords).astype(np.int64), top, top + crop - 1)
    upper = np.minimum(lower + 1, top + crop - 1)
    return lower, upper, coords - lower


def clipped_zoom(x: np.ndarray, zoom: float) -> np.ndarray:
    """Centre crop of ⌈S/zoom⌉ pixels, linearly resampled (corner-aligned) to round(crop·zoom), cropped to S.

    Used by zoom_blur and snow on (N, S, S[, C]) batches. The resampled length follows SciPy's rounding
    (half to even), so some zooms are slightly off-centre, as in the reference. Linear interpolation has
    two taps per output, so it is applied as two gathers per axis rather than a dense matrix product.
    """
    lower, upper, frac = _clipped_zoom_taps(x.shape[1], float(zoom))
    weight = frac.astype(x.dtype).reshape(-1, *([1] * (x.ndim - 2)))
    x = x[:, lower] * (1 - weight) + x[:, upper] * weight
    weight = weight.reshape(1, -1, *([1] * (x.ndim - 3)))
    return x[:, :, lower] * (1 - weight) + x[:, :, upper] * weight


@lru_cache(maxsize=32)
def zoom_average_operator(size: int, zooms: tuple[float, ...]) -> sparse.csr_matrix:
    """(I + Σ_z Z_z ⊗ Z_z) / (len(zooms) + 1) as a sparse (S², S²) matrix acting on row-major flat images.

    Z_z is the 1-D clipped zoom, so Z_z ⊗ Z_z applies it along both axes; summing the Kronecker products
    once turns zoom blur's dozens of resamplings into one sparse product per channel (few distinct source
    pixels per output, as nearby zooms read nearly the same neighbours).
    """
    total = sparse.identity(size * size, format="csr")
    for zoom in zooms:
        lower, upper, frac = _clipped_zoom_taps(size, zoom)
        rows = np.repeat(np.arange(size), 2)
        one_d = sparse.csr_matrix(
            (np.column_stack([1 - frac, frac]).ravel(), (rows, np.column_stack([lower, upper]).ravel())),
            shape=(size, size),
        )
        total = total + sparse.kron(one_d, one_d, format="csr")
    return (total / (len(zooms) + 1)).tocsr()


def motion_blur(images: np.ndarray, radius: float, sigma: float, angles_deg: np.ndarray) -> np.ndarray:
    """Line-kernel motion blur with ImageMagick's radius/sigma/angle semantics, one angle per image.

    K = 2⌈radius⌉+1 taps with one-sided Gaussian weights exp(−m²/2σ²), m = 0..K−1 (the heaviest tap is
    the pixel itself); tap m reads the pixel at (row + ⌈m·sinθ − ½⌉, column + ⌈m·cosθ − ½⌉) with edge
    replication. The sum is rounded at 16-bit precision and then truncated to 8 bits, as ImageMagick's Q16
    build does with 8-bit images. ``images`` is uint8 (N, H, W, C); the result is uint8 of the same shape.
    """
    n, h, w = images.shape[:3]
    taps = np.arange(2 * math.ceil(radius) + 1, dtype=np.float64)
    weights = np.exp(-(taps**2) / (2.0 * sigma**2))
    weights /= weights.sum()
    theta = np.deg2rad(np.asarray(angles_deg, dtype=np.float64))[:, None]
    col_off = np.ceil(taps * np.cos(theta) - 0.5).astype(np.int64)  # (N, K)
    row_off = np.ceil(taps * np.sin(theta) - 0.5).astype(np.int64)
    flat = images.reshape(n * h * w, -1)
    first = (np.arange(n) * (h * w))[:, None, None]  # flat index of each image's first pixel
    acc = np.zeros(images.shape, dtype=np.float64)
    for m, weight in enumerate(weights):
        rows = np.clip(np.arange(h)[None, :] + row_off[:, m : m + 1], 0, h - 1)
        cols = np.clip(np.arange(w)[None, :] + col_off[:, m : m + 1], 0, w - 1)
        acc += weight * np.take(flat, first + rows[:, :, None] * w + cols[:, None, :], axis=0)
    return np.floor(np.floor(acc * 257.0 + 0.5) / 257.0).astype(np.uint8)


def bilinear_sample(images: np.ndarray, rows: np.ndarray, cols: np.ndarray, border: Border) -> np.ndarray:
    """Sample (N, H, W, C) images at real (rows, cols) of shape (N, H', W') by bilinear interpolation.

    Coordinates outside the image are first folded back under ``border``: "mirror" reflects about the
    outer pixel centres (OpenCV's default warp border), "symmetric" about the outer pixel edges (SciPy's
    "reflect"). Folding the coordinate is exact because both extensions are piecewise linear between
    integer positions, mirrored onto integer positions.
    """
    n, h, w = images.shape[:3]
    r0, r1, fr = _fold_coordinate(rows, h, border)
    c0, c1, fc = _fold_coordinate(cols, w, border)
    flat = images.reshape(n * h * w, -1)
    first = (np.arange(n) * (h * w)).reshape(n, *([1] * (rows.ndim - 1)))
    fr, fc = fr[..., None], fc[..., None]

    def row(r: np.ndarray) -> np.ndarray:
        left = np.take(flat, first + r * w + c0, axis=0)
        return left + (np.take(flat, first + r * w + c1, axis=0) - left) * fc

    top = row(r0)
    return top + (row(r1) - top) * fr


def _fold_coordinate(coord: np.ndarray, size: int, border: Border) -> tuple[np.ndarray, ...]:
    """Fold real coordinates into the image; return lower/upper neighbour indices and the upper weight."""
    if border == "mirror":
        period = 2.0 * (size - 1)
        coord = np.mod(coord, period)
        coord = np.where(coord > size - 1, period - coord, coord)
    elif border == "symmetric":
        period = 2.0 * size
        coord = np.mod(coord + 0.5, period) - 0.5
        coord = np.where(coord > size - 0.5, period - 1.0 - coord, coord)
    else:
        raise ValueError(f"unsupported border rule for sampling {border!r}")
    lower = np.floor(coord)
    frac = (coord - lower).astype(coord.dtype)
    lower = lower.astype(np.int64)
    return np.clip(lower, 0, size - 1), np.clip(lower + 1, 0, size - 1), frac


def value_and_saturation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HSV value (max channel) and saturation ((max − min)/max, 0 on black), kept as (N, H, W, 1)."""
    value = np.maximum(np.maximum(x[..., 0:1], x[..., 1:2]), x[..., 2:3])  # faster than max(axis=-1)
    spread = value - np.minimum(np.minimum(x[..., 0:1], x[..., 1:2]), x[..., 2:3])
    saturation = np.divide(spread, value, out=np.zeros_like(value), where=value > 0)
    return value, saturation
