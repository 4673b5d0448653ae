"""The datasets a benchmark run can stream: the project's builds and the real -C folders on disk.

* ``cifar10c``, ``imagenetc``: built by the project from CIFAR-10 (JPEG q75) and the ImageNet sample,
  cached (``zerosiam.corruptions.datasets``);
* ``cifar10-c:<root>``: the published CIFAR-10-C layout, ``<corruption>.npy`` (severities 1–5 stacked)
  and ``labels.npy``, memory-mapped;
* ``imagenet-c:<root>``: the published ImageNet-C layout, ``<corruption>/<severity>/<wnid>/*.JPEG``,
  streamed: images are decoded in the protocol's order by ``DataLoader`` workers as the run needs them,
  labelled by the canonical ImageNet-1k index of their wnid. Memory stays flat in the folder's size.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from zerosiam.corruptions.datasets import SOURCES, load_corrupted
from zerosiam.data.sources import EncodedFiles, ImageFiles, imagenet_wnids, open_imagenet_c, read_cifar10c

ON_DISK = {"cifar10-c": "cifar10c", "imagenet-c": "imagenetc"}  # a folder's layout -> its clean source
CHOICES = (*SOURCES, *(f"{layout}:<root>" for layout in ON_DISK))


def parse(dataset: str) -> tuple[str, Path | None]:
    """``(layout, root)`` of a folder on disk, or ``(name, None)`` of a project build; a one-line
    ``ValueError`` naming the choices, or the missing folder, otherwise."""
    layout, colon, root = dataset.partition(":")
    if not colon:
        if dataset not in SOURCES:
            raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(CHOICES)}")
        return dataset, None
    if layout not in ON_DISK or not root:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(CHOICES)}")
    if not Path(root).expanduser().is_dir():
        raise ValueError(f"dataset folder {root!r} of {dataset!r} does not exist")
    return layout, Path(root).expanduser()


def open_domain(dataset: str, corruption: str, severity: int) -> tuple[np.ndarray | ImageFiles, np.ndarray]:
    """One corruption and severity of ``dataset``: uint8 ``(N, H, W, 3)`` images (an array, a memory
    map, or files decoded on demand) and their labels."""
    layout, root = parse(dataset)
    if root is None:
        return load_corrupted(dataset, corruption, severity)
    if layout == "cifar10-c":
        images, labels, _ = read_cifar10c(root, corruption, severity)
        return images, labels
    return open_imagenet_c(root, corruption, severity, imagenet_wnids())


def clean_source(dataset: str) -> str:
    """The project build whose clean images stand for ``dataset``'s source distribution (EATA's Fisher)."""
    layout, root = parse(dataset)
    return ON_DISK[layout] if root is not None else dataset


def is_cached(dataset: str) -> bool:
    """Whether the dataset is one of the project's builds, made and cached before workers start."""
    return parse(dataset)[1] is None


def streams_files(dataset: str) -> bool:
    """Whether ``dataset``'s images are files decoded as a run streams them (an ImageNet-C folder), which
    the device may decode instead (``Speed.decode_on_device``); CIFAR-10-C is read into memory whole."""
    layout, root = parse(dataset)
    return root is not None and layout == "imagenet-c"


def loader_workers(images: object) -> int:
    """``DataLoader`` worker processes for a domain: none for arrays in memory (slicing is all it takes),
    up to eight for files that must be decoded, leaving a core to the model. (Decoding a 224² JPEG is slow
    beside a GPU's step on it: a GPU adapting a ViT-B/16 keeps several decoding cores busy.)"""
    if not isinstance(images, ImageFiles | EncodedFiles):
        return 0
    return max(1, min(8, (os.cpu_count() or 2) - 1))
