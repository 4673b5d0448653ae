"""Weather corruptions: snow, frost, fog, brightness and (extra) spatter (Hendrycks & Dietterich's groups)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from PIL import Image
from scipy import ndimage

from ._common import (
    clipped_zoom,
    gaussian_matrix,
    motion_blur,
    quantize_255,
    separable,
    to_uint8,
    unit,
    value_and_saturation,
)

FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg", "frost6.jpg")
# The reference lists six textures but draws the index from {0..4}: frost6 is never used. Kept.
FROST_USED = 5


# ------------------------------------------------------------------------------------------- snow
def snow(images: np.ndarray, params: tuple[float, ...], rngs: Sequence[np.random.Generator]) -> np.ndarray:
    """Zoomed, thresholded noise flakes streaked by a motion blur, over a brightened, desaturated scene.

    Per image: an H×W normal field, then one angle θ ~ U[−135°, −45°) (flakes streak downwards); the
    streaked layer is added together with its 180°-rotated copy.
    """
    mean, std, zoom, threshold, radius, sigma, keep = params
    n, h, w, _ = images.shape
    x = unit(images, np.float32)
    fields, angles = [], []
    for rng in rngs:  # per-image draw order: the field first, then the angle
        fields.append(rng.normal(mean, std, (h, w)))
        angles.append(rng.uniform(-135.0, -45.0))
    layer = clipped_zoom(np.stack(fields), float(zoom))
    layer[layer < threshold] = 0.0
    streaks = motion_blur(to_uint8(layer)[..., None], radius, sigma, np.array(angles))
    streaks = streaks[..., 0].astype(np.float32) / np.float32(255.0)
    grey = np.float32(0.299) * x[..., 0] + np.float32(0.587) * x[..., 1] + np.float32(0.114) * x[..., 2]
    scene = keep * x + (1 - keep) * np.maximum(x, 1.5 * grey[..., None] + 0.5)
    return to_uint8(scene + (streaks + streaks[:, ::-1, ::-1])[..., None])


# ------------------------------------------------------------------------------------------- frost
@lru_cache(maxsize=4)
def frost_textures(step: int) -> tuple[np.ndarray, ...]:
    """The five used frost textures as RGB uint8, decoded once and subsampled by ``step``.

    CIFAR scales the textures by 1/5 with a centre-aligned bilinear resize, which is exactly taking every
    5th pixel starting at offset 2; in general the offset is step // 2 (0 for step 1, i.e. full size).
    """
    from zerosiam.assets import fetch  # imported here so the other corruptions need no asset registry

    textures = []
    for name in FROST_FILES[:FROST_USED]:
        with Image.open(fetch("frost", name)) as image:
            texture = np.asarray(image.convert("RGB"))
        texture = np.ascontiguousarray(texture[step // 2 :: step, step // 2 :: step])
        texture.setflags(write=False)
        textures.append(texture)
    return tuple(textures)


def frost(images: np.ndarray, params: tuple[float, float, int], rngs: Sequence[np.random.Generator]):
    """Blend a random crop of a random frost texture: clip(a·X + b·T, 0, 255) on the 0..255 scale.

    Per image draws, in order: texture index in {0..4}, crop row, crop column (the last crop position is
    never drawn, as in the reference).
    """
    a, b, step = params
    textures = frost_textures(step)
    size = images.shape[1]
    crops = []
    for rng in rngs:
        texture = textures[rng.integers(0, FROST_USED)]
        top = rng.integers(0, texture.shape[0] - size)
        left = rng.integers(0, texture.shape[1] - size)
        crops.append(texture[top : top + size, left : left + size])
    blended = a * images.astype(np.float64) + b * np.stack(crops).astype(np.float64)
    return quantize_255(blended)


# ------------------------------------------------------------------------------------------- fog
def plasma_fractal(rngs: Sequence[np.random.Generator], size: int, decay: float) -> np.ndarray:
    """Diamond–square fractal on a torus, one per image, normalized to [0, 1]: (N, size, size).

    ``size`` is a power of two. Each level draws uniforms for the square step, then the two diamond sets
    (each n×n, row-major); the added noise at wibble w is w·U[−w, w). Every level is computed for the
    whole batch at once with strided slices and rolls; A[0, 0] stays 0.
    """
    n_images = len(rngs)
    uniforms = np.stack([rng.random(size * size - 1) for rng in rngs])
    fractal = np.zeros((n_images, size, size))
    wibble, step, used = 100.0, size, 0

    def noise(cells: int) -> np.ndarray:
        nonlocal used
        block = uniforms[:, used : used + cells * cells].reshape(n_images, cells, cells)
        used += cells * cells
        return wibble * (wibble * (2.0 * block - 1.0))

    while step >= 2:
        half, cells = step // 2, size // step
        corners = fractal[:, ::step, ::step]
        right, below = np.roll(corners, -1, axis=2), np.roll(corners, -1, axis=1)
        centres = (corners + right + below + np.roll(below, -1, axis=2)) / 4 + noise(cells)
        fractal[:, half::step, half::step] = centres
        top_edges = (np.roll(centres, 1, axis=1) + centres + corners + right) / 4 + noise(cells)
        left_edges = (np.roll(centres, 1, axis=2) + centres + corners + below) / 4 + noise(cells)
        fractal[:, ::step, half::step] = top_edges
        fractal[:, half::step, ::step] = left_edges
        step, wibble = half, wibble / decay
    fractal -= fractal.min(axis=(1, 2), keepdims=True)
    return fractal / fractal.max(axis=(1, 2), keepdims=True)


def fog(images: np.ndarray, params: tuple[float, float, int], rngs: Sequence[np.random.Generator]):
    """Add a plasma-fractal haze a·F, rescaled by m/(m+a) (m = the image's maximum) to keep the range."""
    strength, decay, map_size = params
    h, w = images.shape[1:3]
    x = unit(images)
    peak = x.max(axis=(1, 2, 3), keepdims=True)
    haze = plasma_fractal(rngs, map_size, decay)[:, :h, :w, None]
    return to_uint8((x + strength * haze) * peak / (peak + strength))


# ------------------------------------------------------------------------------------------- brightness
def brightness(images: np.ndarray, c: float, rngs: Sequence) -> np.ndarray:
    """Raise the HSV value by c (clipped to 1), keeping hue and saturation.

    Closed form of the HSV round trip: each pixel is scaled by min(V + c, 1)/V, and black pixels become
    grey (c, c, c). The max channel is set to the new value exactly, so saturated pixels reach 255.
    """
    x = unit(images)
    value, _ = value_and_saturation(x)
    new_value = np.minimum(value + c, 1.0)
    gain = np.divide(new_value, value, out=np.zeros_like(value), where=value > 0)
    out = np.where(value > 0, x * gain, c)
    return to_uint8(np.where(x == value, new_value, out))


# ------------------------------------------------------------------------------------------- spatter
_WATER = np.array([175, 238, 238], dtype=np.float32) / 255  # pale turquoise, RGB
_MUD = np.array([63, 42, 20], dtype=np.float32) / 255  # mud brown, RGB
_EMBOSS = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]], dtype=np.float64)


def spatter(images: np.ndarray, params: tuple[float, ...], rngs: Sequence[np.random.Generator]):
    """Water drops (mode 0: an embossed, distance-to-edge texture in pale turquoise) or mud (mode 1)."""
    mean, std, sigma, threshold, strength, mode = params
    h, w = images.shape[1:3]
    x = unit(images, np.float32)
    liquid = separable(np.stack([rng.normal(mean, std, (h, w)) for rng in rngs]), gaussian_matrix(sigma, h))
    liquid[liquid < threshold] = 0.0
    if mode == 0:
        amount = np.stack([_water_amount(layer, strength) for layer in to_uint8(liquid)])
        return to_uint8(x + amount[..., None].astype(np.float32) * _WATER)
    mud = separable((liquid > threshold).astype(np.float64), gaussian_matrix(strength, h))
    mud[mud < 0.8] = 0.0
    mud = mud[..., None].astype(np.float32)
    return to_uint8(x * (1 - mud) + mud * _MUD)


def _water_amount(layer: np.ndarray, strength: float) -> np.ndarray:
    """Per-pixel water amount in [0, strength] from the uint8 liquid layer (one image).

    Distance to the nearest Canny edge (capped at 20), box-smoothed, histogram-equalized, embossed and
    smoothed again, times the liquid layer and normalized. Pure NumPy/SciPy re-implementations of the
    OpenCV steps of the reference; the distance is the exact Euclidean one (OpenCV uses a 5×5 mask
    approximation), so values can differ slightly.
    """
    edges = _canny(layer, 50.0, 150.0)
    distance = np.full(layer.shape, 20.0) if not edges.any() else ndimage.distance_transform_edt(~edges)
    distance = np.minimum(distance, 20.0)
    texture = np.floor(ndimage.uniform_filter(distance, 3, mode="mirror") + 1e-9)
    texture = _equalize_hist(texture.astype(np.uint8)).astype(np.float64)
    texture = np.clip(np.rint(ndimage.correlate(texture, _EMBOSS, mode="mirror")), 0, 255)
    texture = ndimage.uniform_filter(texture, 3, mode="mirror")
    wet = layer.astype(np.float64) * texture
    peak = wet.max()
    return strength * wet / peak if peak > 0 else np.zeros_like(wet)


def _canny(image: np.ndarray, low: float, high: float) -> np.ndarray:
    """Canny edges of a uint8 image: 3×3 Sobel, L1 magnitude, non-maximum suppression, hysteresis."""
    f = image.astype(np.float64)
    gx = ndimage.sobel(f, axis=1, mode="nearest")
    gy = ndimage.sobel(f, axis=0, mode="nearest")
    magnitude = np.abs(gx) + np.abs(gy)
    padded = np.pad(magnitude, 1)
    h, w = image.shape

    def shifted(dr: int, dc: int) -> np.ndarray:
        return padded[1 + dr : 1 + dr + h, 1 + dc : 1 + dc + w]

    ax, ay = np.abs(gx), np.abs(gy)
    tan22, tan67 = np.tan(np.deg2rad(22.5)), np.tan(np.deg2rad(67.5))
    horizontal = ay <= ax * tan22
    vertical = ay > ax * tan67
    same_sign = gx * gy > 0
    n1 = np.where(horizontal, shifted(0, -1), np.where(vertical, shifted(-1, 0), 0.0))
    n2 = np.where(horizontal, shifted(0, 1), np.where(vertical, shifted(1, 0), 0.0))
    diagonal = ~horizontal & ~vertical
    n1 = np.where(diagonal, np.where(same_sign, shifted(-1, -1), shifted(-1, 1)), n1)
    n2 = np.where(diagonal, np.where(same_sign, shifted(1, 1), shifted(1, -1)), n2)
    candidate = (magnitude > low) & (magnitude > n1) & (magnitude >= n2)
    labels, count = ndimage.label(candidate, structure=np.ones((3, 3)))
    if count == 0:
        return candidate
    strong = np.zeros(count + 1, dtype=bool)
    strong[np.unique(labels[candidate & (magnitude > high)])] = True
    strong[0] = False
    return strong[labels]


def _equalize_hist(image: np.ndarray) -> np.ndarray:
    """Histogram equalization of a uint8 image (the lowest occupied level maps to 0, the CDF to 0..255)."""
    hist = np.bincount(image.ravel(), minlength=256)
    first = int(np.flatnonzero(hist)[0])
    total = image.size
    if hist[first] == total:
        return np.full_like(image, first)
    cdf = np.cumsum(hist)
    lut = np.clip(np.rint((cdf - hist[first]) * 255.0 / (total - hist[first])), 0, 255)
    lut[:first] = 0
    return lut.astype(np.uint8)[image]
