"""Digital corruptions: contrast, elastic transform, pixelate, JPEG and (extra) saturate."""

from __future__ import annotations

import io
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from PIL import Image

from ._common import (
    along_last,
    along_rows,
    bilinear_sample,
    gaussian_matrix,
    separable,
    to_uint8,
    unit,
    value_and_saturation,
)


# ------------------------------------------------------------------------------------------- HSV based
def saturate(images: np.ndarray, params: tuple[float, float], rngs: Sequence) -> np.ndarray:
    """Scale the HSV saturation: S′ = clip(a·S + b), keeping hue and value.

    Closed form: out = V − (V − x)·S′/S. Grey pixels have hue 0 (red) in the HSV convention used by the
    reference, so with b > 0 they take a red tint (V, V(1−S′), V(1−S′)); kept on purpose.
    """
    a, b = params
    x = unit(images)
    value, saturation = value_and_saturation(x)
    new_saturation = np.clip(saturation * a + b, 0.0, 1.0)
    ratio = np.divide(new_saturation, saturation, out=np.zeros_like(value), where=saturation > 0)
    coloured = value - (value - x) * ratio
    red = np.concatenate([value, value * (1 - new_saturation), value * (1 - new_saturation)], axis=-1)
    return to_uint8(np.where(saturation > 0, coloured, red))


def contrast(images: np.ndarray, c: float, rngs: Sequence) -> np.ndarray:
    """Pull every channel towards its own mean over the image: (x − μ)·c + μ."""
    x = unit(images)
    mean = x.mean(axis=(1, 2), keepdims=True)
    return to_uint8((x - mean) * c + mean)


# ------------------------------------------------------------------------------------------- elastic
def elastic_transform(images: np.ndarray, params: tuple[float, float, float], rngs: Sequence) -> np.ndarray:
    """A random affine warp (mirror border) followed by a smooth random displacement (symmetric border).

    Per image draws, in order: six affine jitters U[−A, A) for the three control points (x then y of each),
    then two H×W fields U[−1, 1) (columns, then rows) smoothed by a Gaussian of σ (truncation 3) and
    scaled by α. The two resamplings stay separate, as in the reference.
    """
    alpha, sigma, jitter = params
    n, h, w, _ = images.shape
    x = unit(images, np.float32)
    inverse, fields = [], []
    for rng in rngs:
        inverse.append(_inverse_affine(h, w, rng.uniform(-jitter, jitter, size=6).astype(np.float32)))
        fields.append(rng.uniform(-1.0, 1.0, size=(2, h, w)))
    rows, cols = np.mgrid[0:h, 0:w].astype(np.float64)
    grid = np.stack([cols, rows, np.ones_like(rows)])  # homogeneous (column, row, 1)
    source = np.einsum("nij,jhw->nihw", np.stack(inverse), grid)  # (N, 2, H, W): source (column, row)
    src_cols, src_rows = source[:, 0], source[:, 1]
    warped = bilinear_sample(x, src_rows, src_cols, "mirror").astype(np.float32)
    smooth = gaussian_matrix(float(sigma), h, "symmetric", 3.0)
    shift = (alpha * separable(np.stack(fields).reshape(2 * n, h, w), smooth)).astype(np.float32)
    shift = shift.reshape(n, 2, h, w)
    out = bilinear_sample(warped, rows + shift[:, 1], cols + shift[:, 0], "symmetric")
    return to_uint8(out)


def _inverse_affine(h: int, w: int, jitter: np.ndarray) -> np.ndarray:
    """The 2×3 map from output to source (column, row) for control points P_k → P_k + δ_k.

    P₁ = (c+q, c+q), P₂ = (c+q, c−q), P₃ = (c−q, c−q) in (column, row), c = ⌊H/2⌋, q = ⌊min(H, W)/3⌋.
    """
    centre, reach = h // 2, min(h, w) // 3
    source = np.array(
        [
            [centre + reach, centre + reach],
            [centre + reach, centre - reach],
            [centre - reach, centre - reach],
        ],
        dtype=np.float32,
    )
    target = source + jitter.reshape(3, 2)
    design = np.concatenate([target.astype(np.float64), np.ones((3, 1))], axis=1)
    return np.linalg.solve(design, source.astype(np.float64)).T


# ------------------------------------------------------------------------------------------- pixelate
@lru_cache(maxsize=32)
def _box_matrices(size: int, small: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's BOX downsampling (small×size, equal weights per window) and BOX/nearest upsampling."""
    owner = np.floor((np.arange(size) + 0.5) * small / size).astype(np.int64)
    down = np.zeros((small, size))
    down[owner, np.arange(size)] = 1.0
    down /= down.sum(axis=1, keepdims=True)
    up = np.zeros((size, small))
    up[np.arange(size), owner] = 1.0
    return down, up


def pixelate(images: np.ndarray, c: float, rngs: Sequence) -> np.ndarray:
    """Downsample to ⌊H·c⌋ with a box filter and upsample back with nearest neighbour.

    As Pillow does it: the horizontal pass first, each pass rounded half-up to 8 bits.
    """
    size = images.shape[1]
    down, up = _box_matrices(size, int(size * c))
    planes = np.moveaxis(images.astype(np.float64), -1, 1)  # (N, C, H, W)
    small = np.floor(along_last(planes, down) + 0.5)  # horizontal pass first, rounded half-up
    small = np.floor(along_rows(small, down) + 0.5)
    return np.moveaxis(along_rows(along_last(small, up), up), 1, -1).astype(np.uint8)


# ------------------------------------------------------------------------------------------- JPEG
def jpeg_compression(images: np.ndarray, quality: int, rngs: Sequence) -> np.ndarray:
    """Encode and decode each image as a baseline JPEG (4:2:0) at the given quality with Pillow."""
    out = np.empty_like(images)
    for i, image in enumerate(images):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=int(quality))
        buffer.seek(0)
        with Image.open(buffer) as decoded:
            out[i] = np.asarray(decoded.convert("RGB"))
    return out
