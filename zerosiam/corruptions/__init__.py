"""Common image corruptions (ImageNet-C / CIFAR-10-C), re-implemented in vectorized NumPy.

>>> from zerosiam import corruptions
>>> corrupted = corruptions.apply(images, "fog", severity=3, preset="cifar", seed=0)

``images`` is uint8 (N, S, S, 3) with S = 32 ("cifar") or 224 ("imagenet"). Every image draws its
randomness from its own generator keyed by (seed, corruption, severity, start_index + position), so
results do not depend on batch size or composition. See docs/corruptions.md.
"""

from .api import ALL, BENCHMARK, CORRUPTIONS, EXTRA, GROUPS, SEVERITIES, Corruption, apply, image_rng
from .presets import PRESETS, Preset

__all__ = [
    "ALL",
    "BENCHMARK",
    "CORRUPTIONS",
    "EXTRA",
    "GROUPS",
    "PRESETS",
    "SEVERITIES",
    "Corruption",
    "Preset",
    "apply",
    "image_rng",
]
