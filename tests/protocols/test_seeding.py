"""Seeding: the legacy draws keep their streams bit for bit, every other draw has a purpose of its own."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from zerosiam.protocols import seeding, streams
from zerosiam.protocols.build import subsample

SEEDS = (0, 1, 3, 12345, 2**32 - 1)


def first_draws(generator: np.random.Generator) -> list[int]:
    return generator.integers(0, 2**62, 8).tolist()


def legacy_label_shift(labels: np.ndarray, ratio: float, seed: int, length: int) -> np.ndarray:
    """The label-shift stream as it was drawn before the seeding helper: ``default_rng(seed)`` for the
    class schedule, ``default_rng([seed, 1])`` for the per-step classes and members."""
    classes, inverse = np.unique(labels, return_inverse=True)
    count = len(classes)
    visited = np.random.default_rng(seed).permutation(count)[np.arange(length) * count // length]
    rng = np.random.default_rng([seed, 1])
    p_visit = 1.0 if math.isinf(ratio) else ratio / (ratio + count - 1)
    drawn = visited.copy()
    if count > 1 and p_visit < 1.0:
        stay = rng.random(length) < p_visit
        other = rng.integers(0, count - 1, size=length)
        other += other >= visited
        drawn = np.where(stay, visited, other)
    by_class = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse, minlength=count)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return by_class[starts[drawn] + rng.integers(0, sizes[drawn])]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_legacy_purposes_are_the_legacy_generators(seed: int) -> None:
    assert first_draws(seeding.rng(seed)) == first_draws(np.random.default_rng(seed))
    assert first_draws(seeding.rng(seed, seeding.LABEL_SHIFT_DRAWS)) == first_draws(
        np.random.default_rng([seed, 1])
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_mild_label_shift_and_subsample_draw_as_before(seed: int) -> None:
    labels = np.random.default_rng(99).permutation(np.repeat(np.arange(7), [5, 9, 1, 12, 3, 8, 6]))
    n = len(labels)
    assert np.array_equal(streams.mild(labels, seed), np.random.default_rng(seed).permutation(n))
    for ratio, length in ((math.inf, n), (1.0, n), (7.5, 2 * n), (1000, 13)):
        assert np.array_equal(
            streams.label_shift(labels, ratio, seed, length=length),
            legacy_label_shift(labels, ratio, seed, length),
        )
    images = np.arange(n)[:, None, None, None] * np.ones((1, 2, 2, 3), np.int64)
    kept_images, kept_labels = subsample(images, labels, 20, seed)
    keep = np.sort(np.random.default_rng(seed).permutation(n)[:20])
    assert np.array_equal(kept_labels, labels[keep]) and np.array_equal(kept_images[:, 0, 0, 0], keep)


def test_every_other_purpose_is_nonzero_distinct_and_unlike_the_legacy_draws() -> None:
    purposes = list(seeding.PURPOSES.values())
    assert len(set(purposes)) == len(purposes) and 0 not in purposes  # [seed, 0] would be [seed]
    for seed in SEEDS:
        draws = [first_draws(seeding.rng(seed))]
        draws += [first_draws(seeding.rng(seed, p)) for p in purposes]
        draws += [first_draws(seeding.rng(seed, seeding.EPOCH_ORDER, e)) for e in range(1, 4)]
        assert len({tuple(d) for d in draws}) == len(draws)


def test_purposes_never_shift_into_the_seed() -> None:
    """(seed, purpose, index) tuples that differ anywhere give different generators: no ``seed + e``."""
    cases = list(itertools.product(range(3), (seeding.EPOCH_ORDER,), range(3)))
    draws = {tuple(first_draws(seeding.rng(*case))) for case in cases}
    assert len(draws) == len(cases)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0", None])
def test_seeds_must_be_non_negative_integers(seed: object) -> None:
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        seeding.rng(seed)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        streams.mild(np.arange(3), seed)  # type: ignore[arg-type]
