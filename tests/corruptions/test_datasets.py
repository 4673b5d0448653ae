"""Corrupted datasets on a tiny fake clean source: made once, cached whole, written in the -C layout."""

from __future__ import annotations

import multiprocessing
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from zerosiam import corruptions
from zerosiam.assets import files
from zerosiam.corruptions import datasets

NAMES = ["airplane", "automobile"]


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, np.ndarray]:
    """Eight random 32×32 images standing in for the CIFAR-10 JPEG test set."""
    images = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    labels = np.tile(np.array([0, 1], dtype=np.int64), 4)
    monkeypatch.setattr(datasets, "read_cifar10_jpeg", lambda split="test": (images, labels, NAMES))
    return images, labels


def test_a_corrupted_split_is_made_once_and_cached_whole(clean, tmp_path: Path, monkeypatch) -> None:
    images, labels = clean
    got, got_labels = datasets.load_corrupted("cifar10c", "brightness", 2, cache=tmp_path)
    expected = corruptions.apply(images, "brightness", 2, preset="cifar", seed=datasets.CORRUPTION_SEED)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got_labels, labels)
    assert isinstance(got, np.memmap)  # the hot loop slices the file, it does not hold a copy
    cached = tmp_path / "corrupted" / "cifar10c" / "brightness" / "severity2.npy"
    assert stat.S_IMODE(cached.stat().st_mode) == 0o644
    assert not [p for p in cached.parent.iterdir() if p.name.endswith(files.TEMPORARY_SUFFIX)]

    def no_corrupting(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("corrupted again")

    monkeypatch.setattr(datasets, "corrupt_in_chunks", no_corrupting)
    again, _ = datasets.load_corrupted("cifar10c", "brightness", 2, cache=tmp_path)
    np.testing.assert_array_equal(again, expected)
    assert datasets.load_corrupted("cifar10c", "clean", 2, cache=tmp_path)[0] is images


def test_two_processes_wanting_one_split_build_it_once(clean, tmp_path: Path, monkeypatch) -> None:
    """Two ``zerosiam bench`` jobs started together: the second waits for the first's build, where before
    it built too, and its check removed the file the first had renamed into place but not yet recorded."""
    builds = tmp_path / "builds.log"
    corrupt = datasets.corrupt_in_chunks

    def slow_corrupting(*args: object, **kwargs: object) -> np.ndarray:
        with open(builds, "a") as log:
            log.write("built\n")
        time.sleep(0.5)  # long enough for the other process to look for the file meanwhile
        return corrupt(*args, **kwargs)

    monkeypatch.setattr(datasets, "corrupt_in_chunks", slow_corrupting)

    def load() -> None:
        datasets.load_corrupted("cifar10c", "brightness", 2, cache=tmp_path)

    fork = multiprocessing.get_context("fork")  # the children inherit the fake source and the slow build
    children = [fork.Process(target=load) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
    assert [child.exitcode for child in children] == [0, 0]
    assert builds.read_text() == "built\n"
    expected = corruptions.apply(clean[0], "brightness", 2, preset="cifar", seed=datasets.CORRUPTION_SEED)
    built, _ = datasets.load_corrupted("cifar10c", "brightness", 2, cache=tmp_path)
    np.testing.assert_array_equal(built, expected)


def test_chunks_give_what_one_call_gives(clean, monkeypatch: pytest.MonkeyPatch) -> None:
    images, _ = clean
    monkeypatch.setattr(datasets, "_CHUNK", 3)  # 3 + 3 + 2 images: per-image seeding makes it irrelevant
    chunked = datasets.corrupt_in_chunks(images, "gaussian_noise", 3, "cifar")
    whole = corruptions.apply(images, "gaussian_noise", 3, preset="cifar", seed=datasets.CORRUPTION_SEED)
    np.testing.assert_array_equal(chunked, whole)


def test_cifar10c_layout_stacks_the_severities(clean, tmp_path: Path, monkeypatch) -> None:
    images, labels = clean
    out = tmp_path / "CIFAR-10-C"
    written = datasets.build_cifar10c(out, names=["contrast"], cache=tmp_path / "cache", progress=False)
    assert written == [out / "contrast.npy", out / "labels.npy"]
    stacked = np.load(out / "contrast.npy")
    assert stacked.shape == (5 * len(images), 32, 32, 3)
    for severity in datasets.SEVERITIES:
        part = stacked[(severity - 1) * len(images) : severity * len(images)]
        np.testing.assert_array_equal(part, corruptions.apply(images, "contrast", severity, preset="cifar"))
    np.testing.assert_array_equal(np.load(out / "labels.npy"), np.tile(labels, 5))

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("a finished file was made again")

    monkeypatch.setattr(datasets, "load_corrupted", no_loading)
    assert datasets.build_cifar10c(out, names=["contrast"], progress=False) == written  # resumable


def test_an_unknown_dataset_is_named_with_the_choices() -> None:
    with pytest.raises(ValueError, match="cifar10c"):
        datasets.load_corrupted("cifar100c", "fog", 1)
