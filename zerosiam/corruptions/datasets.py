"""Corrupted datasets made from a clean source, cached on disk, and written in the standard -C layouts.

A corrupted split is a fixed dataset, like the published CIFAR-10-C: it depends on (source, corruption,
severity, corruption seed), never on the run's seed, so every method and every run sees the same images.
Each (corruption, severity) is made once and cached as a uint8 ``.npy``; the hot loop only slices it.
Files are written through ``zerosiam.assets.files``, so an interrupted build never leaves half a file, and
a cached file is checked against its record (size, sha256, shape, dtype) when opened: a damaged one is
removed, with a warning naming it, and made again.

This module lives with the corruptions, not with the dataset readers, because it applies them: the readers
(``zerosiam.data``) sit below the corruption engine and must not import it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from zerosiam import assets
from zerosiam.assets.files import atomic_file, building, intact, write_checked
from zerosiam.corruptions.api import BENCHMARK, apply
from zerosiam.data.sources import CIFAR10_CLASSES, imagenet_wnids, read_cifar10_jpeg, read_imagenet_sample

CORRUPTION_SEED = 0  # the seed of the project's CIFAR-10-C / ImageNet-C builds
SEVERITIES = (1, 2, 3, 4, 5)
_CHUNK = 1000  # images corrupted per call: bounds memory and gives the progress bar its steps

CleanSource = Callable[[], tuple[np.ndarray, np.ndarray, list[str]]]
SOURCES: dict[str, tuple[CleanSource, str]] = {
    # dataset name -> (clean reader, corruption preset)
    "cifar10c": (lambda: read_cifar10_jpeg("test"), "cifar"),
    "imagenetc": (read_imagenet_sample, "imagenet"),
}
# dataset name -> how many classes its labels index: a model's head must have as many (the ImageNet
# builds, and ImageNet-C folders, use the canonical 1,000-class index of data/imagenet1k_wnids.txt)
CLASS_COUNTS: dict[str, int] = {"cifar10c": len(CIFAR10_CLASSES), "imagenetc": 1000}


def corrupt_in_chunks(
    images: np.ndarray, name: str, severity: int, preset: str, progress: bool = False
) -> np.ndarray:
    """Corrupt a whole split; image i gets the same result as if corrupted alone (per-image seeding)."""
    out = np.empty_like(images)
    starts = range(0, len(images), _CHUNK)
    for start in tqdm(starts, desc=f"{name} s{severity}", leave=False, disable=not progress):
        chunk = images[start : start + _CHUNK]
        out[start : start + len(chunk)] = apply(
            chunk, name, severity, preset=preset, seed=CORRUPTION_SEED, start_index=start
        )
    return out


def _cache_file(dataset: str, corruption: str, severity: int, cache: Path | None) -> Path:
    return assets.cache_dir(cache) / "corrupted" / dataset / corruption / f"severity{severity}.npy"


def load_corrupted(
    dataset: str, corruption: str, severity: int, cache: Path | None = None, progress: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The images (uint8 N×H×W×3, memory-mapped) and labels of one corruption and severity of ``dataset``.

    ``corruption="clean"`` gives the clean source. Made and cached on the first call.
    """
    reader, preset = _source(dataset)
    clean, labels, _ = reader()
    if corruption == "clean":
        return clean, labels
    path = _cache_file(dataset, corruption, severity, cache)
    facts = {"shape": list(clean.shape), "dtype": str(clean.dtype)}
    with building(path):  # another process building the same split is waited for, not raced
        if not intact(path, **facts):  # never built, or damaged (removed with a warning): build it
            corrupted = corrupt_in_chunks(clean, corruption, severity, preset, progress)
            write_checked(path, lambda handle: np.save(handle, corrupted), **facts)
    return np.load(path, mmap_mode="r"), labels


def _source(dataset: str) -> tuple[CleanSource, str]:
    try:
        return SOURCES[dataset]
    except KeyError:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {sorted(SOURCES)}") from None


def build_cifar10c(
    out: Path, names: Iterable[str] = BENCHMARK, cache: Path | None = None, progress: bool = True
) -> list[Path]:
    """Write CIFAR-10-C in its standard layout: ``<name>.npy`` (severities 1–5 stacked) and ``labels.npy``.

    Resumable: finished files are skipped, and each file appears only when complete.
    """
    out = Path(out)
    written = []
    names = list(names)
    for name in tqdm(names, desc="CIFAR-10-C", disable=not progress):
        target = out / f"{name}.npy"
        if not target.exists():
            stacked = [load_corrupted("cifar10c", name, s, cache, progress)[0] for s in SEVERITIES]
            with atomic_file(target) as handle:
                np.save(handle, np.concatenate(stacked))
        written.append(target)
    labels_file = out / "labels.npy"
    if not labels_file.exists():
        with atomic_file(labels_file) as handle:
            np.save(handle, np.tile(read_cifar10_jpeg("test")[1], len(SEVERITIES)))
    return [*written, labels_file]


def build_imagenet_c(
    out: Path, names: Iterable[str] = BENCHMARK, severities: Iterable[int] = SEVERITIES,
    cache: Path | None = None, progress: bool = True,
) -> Path:  # fmt: skip
    """Write the ImageNet sample's -C set as ImageNet-C folders ``<name>/<severity>/<wnid>/<n>.JPEG``.

    Images are saved as JPEG quality 85 (as ImageNet-C was). A (name, severity) folder is written under a
    temporary name and renamed when complete, so a rerun skips finished folders and redoes partial ones.
    """
    from PIL import Image

    wnids = imagenet_wnids()
    out = Path(out)
    jobs = [(n, s) for n in names for s in severities]
    for name, severity in tqdm(jobs, desc="ImageNet-C (sample)", disable=not progress):
        target = out / name / str(severity)
        if target.exists():
            continue
        images, labels = load_corrupted("imagenetc", name, severity, cache)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=".partial-"))
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            folder = partial / wnids[label]
            folder.mkdir(exist_ok=True)
            Image.fromarray(np.asarray(image)).save(folder / f"{i:05d}.JPEG", quality=85)
        os.replace(partial, target)
    return out
