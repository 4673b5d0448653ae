"""The long continual streams (continual, gradual, CCC): order, lengths, seeding, and CCC's walks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.protocols.test_build import Spec as Fields
from zerosiam.protocols import streams
from zerosiam.protocols.build import CCCSource, build_stream

DOMAINS = ["fog", "snow", "frost"]


def spec(protocol: str = "continual", corruption: str = "continual", **changes) -> Fields:
    """A stream's spec, of a continual protocol by default."""
    return Fields(protocol=protocol, corruption=corruption, **changes)


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    """40 images of 4 classes (stored class by class, as the CIFAR-10 JPEGs are), one value per domain."""
    images = np.full((40, 4, 4, 3), DOMAINS.index(name) * 10, dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(40)  # each image tells its index
    return images, np.repeat(np.arange(4), 10)


def load_at(name: str, severity: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = load(name)
    images = images.copy()
    images[:, 0, 0, 1] = severity  # each image tells its severity
    return images, labels


# ------------------------------------------------------------------------------------------ continual
def test_continual_streams_each_domain_whole_in_order_and_shuffled_within() -> None:
    rows = streams.continual([40, 30, 20], seed=0)
    assert rows[:, 0].tolist() == [0] * 40 + [1] * 30 + [2] * 20  # one after another, never mixed
    for domain, size in enumerate([40, 30, 20]):
        own = rows[rows[:, 0] == domain, 1]
        assert sorted(own) == list(range(size)) and not np.array_equal(own, np.arange(size))
    np.testing.assert_array_equal(rows, streams.continual([40, 30, 20], seed=0))
    assert not np.array_equal(rows, streams.continual([40, 30, 20], seed=1))
    first, second = rows[rows[:, 0] == 0, 1], rows[rows[:, 0] == 1, 1][:30]
    assert not np.array_equal(first[:30], second)  # each domain has an order of its own


def test_a_continual_stream_over_images_is_not_class_ordered() -> None:
    stream = build_stream(spec(), load, mixed_domains=DOMAINS)
    assert stream.names == DOMAINS and len(stream.rows) == 120 and stream.evaluated.all()
    labels = stream.domains[0][1][stream.rows[:40, 1]]
    assert (np.diff(labels) != 0).sum() > 10  # a class-ordered set arrives shuffled
    with pytest.raises(ValueError, match="mixed_domains"):
        build_stream(spec(), load)


# ------------------------------------------------------------------------------------------ gradual
def test_gradual_moves_each_corruption_up_to_five_and_back_in_legs_of_equal_length() -> None:
    assert streams.gradual_leg(100_000, 15) == 740
    picks = streams.gradual(domain_size=40, leg=7, seed=0, corruption=2)
    assert len(picks) == 9 * 7
    assert picks[::7, 0].tolist() == [1, 2, 3, 4, 5, 4, 3, 2, 1]
    for severity in (1, 2, 3, 4):  # the way up and the way down see different images
        up, down = (picks[picks[:, 0] == severity, 1][half * 7 : half * 7 + 7] for half in (0, 1))
        assert not set(up) & set(down)
    np.testing.assert_array_equal(picks, streams.gradual(40, 7, 0, 2))
    assert not np.array_equal(picks, streams.gradual(40, 7, 1, 2))
    assert not np.array_equal(picks, streams.gradual(40, 7, 0, 3))


def test_a_gradual_stream_over_images_follows_the_severities_and_keeps_the_labels() -> None:
    stream = build_stream(
        spec("gradual", "gradual", stream_length=9 * 3 * 5), load, mixed_domains=DOMAINS, load_at=load_at
    )
    assert stream.names == DOMAINS and len(stream.rows) == 135  # 5 images a leg
    severities, labels = [], []
    for domain, index in stream.rows:
        image = stream.domains[domain][0][index]
        severities.append(int(image[0, 0, 1]))
        labels.append(stream.domains[domain][1][index])
        assert image[0, 1, 0] == domain * 10  # the corruption in turn
        assert load(DOMAINS[domain])[1][image[0, 0, 0]] == labels[-1]  # the label of the image shown
    assert severities[:45:5] == [1, 2, 3, 4, 5, 4, 3, 2, 1] and severities[45:90:5] == severities[:45:5]
    with pytest.raises(ValueError, match="load_at"):
        build_stream(spec("gradual", "gradual"), load, mixed_domains=DOMAINS)


# ------------------------------------------------------------------------------------------ CCC
def test_ccc_keeps_the_corruptions_that_reach_its_target() -> None:
    names = ["gaussian_noise", "contrast", "brightness", "jpeg_compression", "fog"]
    assert streams.ccc_corruptions(50, names) == ["gaussian_noise", "contrast", "jpeg_compression", "fog"]
    assert streams.ccc_corruptions(25, names) == ["gaussian_noise", "contrast", "fog"]
    assert streams.ccc_corruptions(10, names) == ["gaussian_noise", "contrast"]


def _is_a_walk(walk: list[tuple[int, int]], top: int) -> bool:
    steps = all((b == (a[0] - 1, a[1])) or (b == (a[0], a[1] + 1)) for a, b in itertools.pairwise(walk))
    return (
        walk[0][1] == 0 and walk[0][0] >= 1 and walk[-1][0] == 0 and steps and max(p[1] for p in walk) <= top
    )


def test_the_best_walk_is_the_one_nearest_the_target_of_all_walks() -> None:
    rng = np.random.default_rng(0)
    grid = np.sort(rng.uniform(10, 90, (6, 6)), axis=None)[::-1].reshape(6, 6)
    every = streams._walks(5)
    assert all(_is_a_walk(walk, 5) for walk in every) and len(every) == len({tuple(w) for w in every})
    for target in (15.0, 40.0, 60.0, 85.0):
        chosen = streams.best_walk(grid, target)
        gap = abs(np.mean([grid[p] for p in chosen]) - target)
        assert _is_a_walk(chosen, 5)
        assert gap <= min(abs(np.mean([grid[p] for p in walk]) - target) for walk in every) + 1e-12
    with pytest.raises(ValueError, match="square grid"):
        streams.best_walk(np.zeros((6, 5)), 50)


def test_ccc_chains_its_walks_from_where_the_last_ended() -> None:
    pairs = streams.ccc_pairs(corruptions=4, count=30, seed=0)
    assert all(a != b for a, b in pairs)
    assert all(second == first for (_, second), (first, _) in itertools.pairwise(pairs))
    assert pairs == streams.ccc_pairs(4, 30, 0) and pairs != streams.ccc_pairs(4, 30, 1)
    assert {c for pair in pairs for c in pair} == {0, 1, 2, 3}


def test_a_ccc_stream_walks_point_by_point_at_its_speed() -> None:
    walk = [(2, 0), (1, 0), (1, 1), (0, 1)]
    rows = streams.ccc(clean_size=50, walk=lambda a, b: walk, corruptions=3, seed=0, length=1_000, speed=30)
    assert rows.shape == (1_000, 5)
    points = [tuple(rows[start, :4]) for start in range(0, 1_000, 30)]
    pairs = streams.ccc_pairs(3, 1_000 // 30 + 1, 0)
    assert points == [(a, s1, b, s2) for a, b in pairs for s1, s2 in walk][: len(points)]
    assert all(len(set(rows[start : start + 30, 4])) == 30 for start in range(0, 990, 30))  # no repeat
    np.testing.assert_array_equal(rows, streams.ccc(50, lambda a, b: walk, 3, 0, 1_000, 30))


def test_a_ccc_stream_over_images_applies_the_first_corruption_then_the_second() -> None:
    names = ["gaussian_noise", "shot_noise", "impulse_noise", "contrast"]
    applied = []

    def corrupt(images: np.ndarray, name: str, severity: int, first: int) -> np.ndarray:
        applied.append((name, severity, first))
        out = images.copy()
        out[:, 1, 1, 0] = out[:, 1, 1, 0] * 10 + names.index(name) + 1  # a trace of the order applied
        return out

    clean = load("fog")
    source = CCCSource(clean, corrupt, lambda a, b: [(1, 0), (1, 1), (0, 1)])
    stream = build_stream(
        spec("ccc", "ccc", stream_length=3_000, target=15), load, mixed_domains=names, ccc=source
    )
    assert stream.names == ["ccc"] and len(stream.rows) == 3_000 and stream.evaluated.all()
    images, labels = stream.domains[0]
    assert [first for _, _, first in applied][:4] == [0, 1_000, 1_000, 2_000]  # each point's first image
    traces = images[1_000:2_000, 1, 1, 0]
    assert len(set(traces)) == 1 and traces[0] // 10 >= 1 and traces[0] % 10 >= 1  # two corruptions, in order
    np.testing.assert_array_equal(labels, clean[1][images[:, 0, 0, 0]])  # each image keeps its label
    with pytest.raises(ValueError, match="CCCSource"):
        build_stream(spec("ccc", "ccc"), load, mixed_domains=names)
