"""From what the readers return to what the models take.

Every reader yields uint8 ``(N, H, W, 3)`` images, the compact form that is cached, sliced and sent to a
device; every model takes float ``(B, 3, H, W)`` in [0, 1] and normalizes inside. This is the one place
that turns the first into the second.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch

from zerosiam.data.sources import DatasetFormatError


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


def decode_on(encoded: Sequence[torch.Tensor], device: torch.device, size: int = 224) -> torch.Tensor:
    """JPEG files (uint8 tensors of their bytes, ``EncodedBatch``) → float ``(B, 3, size, size)`` in
    [0, 1], decoded on ``device``: by the GPU's JPEG decoder on CUDA, so that a loader's workers only
    read files (libjpeg-turbo on a CPU, as PIL decodes, pixel for pixel). An image that is not ``size``²
    is resized to ``size · 256 / 224`` on its shorter side and centre-cropped, as ``ImageFiles`` does with
    PIL; a resize there rounds apart from PIL's."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        raise ImportError("decoding on the device needs torchvision: pip install torchvision") from None
    try:
        decoded = decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=device)
    except RuntimeError as error:  # torchvision's message names neither the file nor its place in the batch
        raise _undecodable(encoded, device, error) from None
    return torch.stack([_resized_center_crop(image, size) for image in decoded]).float().div_(255.0)


def _undecodable(
    encoded: Sequence[torch.Tensor], device: torch.device, error: RuntimeError
) -> DatasetFormatError:
    """The one-line error for a batch the decoder refused, naming its first file that does not decode alone
    (by its path where the batch knows it, an ``EncodedBatch``; else by its place)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    files = getattr(encoded, "files", None) or [f"number {i} of the batch" for i in range(len(encoded))]
    for data, name in zip(encoded, files, strict=True):
        try:
            decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError as refused:
            return DatasetFormatError(f"cannot decode image {name}: {_first_line(refused)}")
    return DatasetFormatError(f"cannot decode a batch of {len(encoded)} images: {_first_line(error)}")


def _first_line(error: Exception) -> str:
    """What torchvision says on its first line, less the C++ function and source line it starts with."""
    return re.sub(r"^\w+, \S+:\d+, ", "", str(error).splitlines()[0])


def _resized_center_crop(image: torch.Tensor, crop: int) -> torch.Tensor:
    """A uint8 ``(3, H, W)`` image with its shorter side at ``crop · 256 / 224`` (bilinear, antialiased)
    and its central ``crop``² kept: ``zerosiam.data.sources.resize_center_crop`` on the device."""
    height, width = image.shape[-2:]
    if (height, width) == (crop, crop):
        return image
    resize = crop * 256 // 224
    if width <= height:
        size = (int(resize * height / width), resize)  # (height, width)
    else:
        size = (resize, int(resize * width / height))
    scaled = torch.nn.functional.interpolate(
        image[None].float(), size=size, mode="bilinear", antialias=True, align_corners=False
    )[0]
    top, left = round((size[0] - crop) / 2.0), round((size[1] - crop) / 2.0)
    return scaled[:, top : top + crop, left : left + crop].round().clamp(0, 255).to(torch.uint8)
