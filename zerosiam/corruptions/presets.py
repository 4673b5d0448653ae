"""Severity constants of ImageNet-C (224×224) and CIFAR-10-C (32×32), copied from the specification, and
the scale a CIFAR-10 CCC stream walks (``cifar-ccc``: CIFAR-10-C's, with ImageNet-C's per-pixel constants).

``PRESETS[preset].params(name, severity)`` gives what the corruption function of ``name`` receives. A few
entries carry a preset-level constant next to the per-severity ones (the fog map size, the frost texture
subsampling step), so every corruption function takes just the image batch, its parameters and the
per-image generators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Table = dict[str, tuple[Any, ...]]

_IMAGENET: Table = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
    "shot_noise": (60, 25, 12, 5, 3),
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),
    "speckle_noise": (0.15, 0.2, 0.35, 0.45, 0.6),
    # (disk radius, anti-alias σ)
    "defocus_blur": ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),
    # (σ, max delta, passes)
    "glass_blur": ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)),
    # (radius, sigma) of the line kernel
    "motion_blur": ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15)),
    # arange(start, stop, step) of zoom factors
    "zoom_blur": ((1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.02), (1, 1.26, 0.02), (1, 1.31, 0.03)),
    "gaussian_blur": (1, 2, 3, 4, 6),
    # (mean, std, zoom, threshold, blur radius, blur sigma, scene weight)
    "snow": (
        (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
        (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
        (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
        (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
        (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
    ),
    # (image weight, texture weight, texture step)
    "frost": tuple((a, b, 1) for a, b in ((1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75))),
    # (strength, wibble decay, fractal map size)
    "fog": tuple((a, d, 256) for a, d in ((1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4))),
    # (mean, std, σ, threshold, strength (mud: blur σ), mode 0 water / 1 mud)
    "spatter": (
        (0.65, 0.3, 4, 0.69, 0.6, 0),
        (0.65, 0.3, 3, 0.68, 0.6, 0),
        (0.65, 0.3, 2, 0.68, 0.5, 0),
        (0.65, 0.3, 1, 0.65, 1.5, 1),
        (0.67, 0.4, 1, 0.65, 1.5, 1),
    ),
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
    # (α, σ, affine jitter); the reference writes multiples of 244 where 224 was meant: kept
    "elastic_transform": (
        (244 * 2, 244 * 0.7, 244 * 0.1),
        (244 * 2, 244 * 0.08, 244 * 0.2),
        (244 * 0.05, 244 * 0.01, 244 * 0.02),
        (244 * 0.07, 244 * 0.01, 244 * 0.02),
        (244 * 0.12, 244 * 0.01, 244 * 0.02),
    ),
    "pixelate": (0.6, 0.5, 0.4, 0.3, 0.25),
    "jpeg_compression": (25, 18, 15, 10, 7),
    # (saturation gain, offset)
    "saturate": ((0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)),
}

_CIFAR: Table = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    "shot_noise": (500, 250, 100, 75, 50),
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
    "speckle_noise": (0.06, 0.1, 0.12, 0.16, 0.2),
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
    "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
    "motion_blur": ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),
    "zoom_blur": ((1, 1.06, 0.01), (1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.01), (1, 1.26, 0.01)),
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1),
    "snow": (
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
        (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
    ),
    "frost": tuple((a, b, 5) for a, b in ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))),
    "fog": tuple((a, d, 32) for a, d in ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75))),
    "spatter": (
        (0.62, 0.1, 0.7, 0.7, 0.5, 0),
        (0.65, 0.1, 0.8, 0.7, 0.5, 0),
        (0.65, 0.3, 1, 0.69, 0.5, 0),
        (0.65, 0.1, 0.7, 0.69, 0.6, 1),
        (0.65, 0.1, 0.5, 0.68, 0.6, 1),
    ),
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    "elastic_transform": (
        (32 * 0, 32 * 0, 32 * 0.08),
        (32 * 0.05, 32 * 0.2, 32 * 0.07),
        (32 * 0.08, 32 * 0.06, 32 * 0.06),
        (32 * 0.1, 32 * 0.04, 32 * 0.05),
        (32 * 0.1, 32 * 0.03, 32 * 0.03),
    ),
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
    "jpeg_compression": (80, 65, 58, 50, 40),
    "saturate": ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)),
}


@dataclass(frozen=True)
class Preset:
    """A benchmark's image size and its severity table (five entries per corruption)."""

    name: str
    size: int
    table: Table

    def params(self, corruption: str, severity: int) -> Any:
        """The parameters of ``corruption`` at ``severity`` (1..5) in this preset."""
        return self.table[corruption][severity - 1]


# The corruptions whose constants act on each pixel alone, or on the image's mean: the same constant does
# the same to an image of any size, where a kernel's, a map's or a JPEG block's is tied to 224 pixels.
PER_PIXEL = (
    "gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "brightness", "contrast", "saturate",
)  # fmt: skip

PRESETS: dict[str, Preset] = {
    "imagenet": Preset("imagenet", 224, _IMAGENET),
    "cifar": Preset("cifar", 32, _CIFAR),
    # CIFAR-10-C's scale with ImageNet-C's harsher constants where they mean the same at 32 pixels: the
    # scale CCC walks (it corrupts with ImageNet-C's), under which a CIFAR model can be brought near chance
    "cifar-ccc": Preset("cifar-ccc", 32, _CIFAR | {name: _IMAGENET[name] for name in PER_PIXEL}),
}
