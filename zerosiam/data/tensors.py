"""From what the readers return to what the models take.

Every reader yields uint8 ``(N, H, W, 3)`` images, the compact form that is cached, sliced and sent to a
device; every model takes float ``(B, 3, H, W)`` in [0, 1] and normalizes inside. This is the one place
that turns the first into the second.
"""

from __future__ import annotations

import numpy as np
import torch


def to_input(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 ``(B, H, W, 3)`` → float ``(B, 3, H, W)`` in [0, 1], on the device the images are on.

    Move uint8 images to a GPU before calling this: they are a quarter of the bytes of the float input.
    """
    if isinstance(images, np.ndarray):  # cached memmaps are read-only, which a tensor may not share
        images = torch.from_numpy(np.require(images, requirements=("C", "W")))
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(
            f"expected uint8 images of shape (B, H, W, 3), got {images.dtype} {tuple(images.shape)}"
        )
    return images.permute(0, 3, 1, 2).float().div_(255.0)
