"""Properties of the protocol streams: determinism, class order, imbalance, coverage, blind spot."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerosiam.protocols import streams

SEEDS = st.integers(0, 2**32 - 1)
FAST = settings(max_examples=40, deadline=None, database=None)  # no .hypothesis/ folder in the tree


@st.composite
def label_arrays(draw: st.DrawFn, min_classes: int = 1, max_classes: int = 12) -> np.ndarray:
    """Labels with arbitrary (non-contiguous) class values and unequal class sizes, in any order."""
    values = draw(st.lists(st.integers(-5, 1000), min_size=min_classes, max_size=max_classes, unique=True))
    sizes = draw(st.lists(st.integers(1, 30), min_size=len(values), max_size=len(values)))
    labels = np.repeat(np.array(values, dtype=np.int64), sizes)
    return np.random.default_rng(draw(SEEDS)).permutation(labels)


def runs(sequence: np.ndarray) -> list[int]:
    """The values of maximal runs of equal consecutive elements."""
    starts = np.flatnonzero(np.diff(sequence, prepend=sequence[0] - 1))
    return sequence[starts].tolist()


# ---------------------------------------------------------------------------------------------- mild
@FAST
@given(label_arrays(), SEEDS)
def test_mild_is_a_seeded_permutation(labels: np.ndarray, seed: int) -> None:
    order = streams.mild(labels, seed)
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(len(labels)))
    assert np.array_equal(order, streams.mild(labels, seed))


def test_mild_depends_on_the_seed() -> None:
    labels = np.zeros(100, dtype=np.int64)
    assert not np.array_equal(streams.mild(labels, 0), streams.mild(labels, 1))


# ---------------------------------------------------------------------------------------------- label shift
@FAST
@given(label_arrays(), SEEDS, st.sampled_from([math.inf, 1.0, 7.5, 1000]))
def test_label_shift_is_deterministic_and_indexes_the_data(labels, seed, ratio) -> None:
    stream = streams.label_shift(labels, ratio, seed)
    assert stream.dtype == np.int64 and len(stream) == 2 * len(labels)  # documented default length
    assert stream.min() >= 0 and stream.max() < len(labels)
    assert np.array_equal(stream, streams.label_shift(labels, ratio, seed))


@FAST
@given(label_arrays(min_classes=2), SEEDS, st.integers(0, 200))
def test_infinite_ratio_gives_one_contiguous_run_per_class(labels, seed, extra) -> None:
    classes = np.unique(labels)
    length = len(classes) + extra
    visited = labels[streams.label_shift(labels, math.inf, seed, length=length)]
    order = runs(visited)
    assert sorted(order) == classes.tolist()  # every class exactly once, as one run
    run_lengths = np.bincount(np.searchsorted(classes, visited))
    assert run_lengths.max() - run_lengths.min() <= 1  # T/C consecutive steps each


@FAST
@given(SEEDS, SEEDS)
def test_infinite_ratio_class_order_follows_the_seed(seed_a, seed_b) -> None:
    labels = np.repeat(np.arange(10), 5)
    order_a = runs(labels[streams.label_shift(labels, math.inf, seed_a)])
    order_b = runs(labels[streams.label_shift(labels, math.inf, seed_b)])
    assert order_a == runs(labels[streams.label_shift(labels, math.inf, seed_a)])
    if seed_a != seed_b:  # two seeds share an order of 10 classes with chance 1/10! ≈ 2.8e-7
        assert order_a != order_b


@settings(max_examples=15, deadline=None, database=None)
@given(SEEDS, st.sampled_from([1.0, 2.0, 10.0, 50.0]), st.integers(2, 20))
def test_finite_ratio_share_of_the_visited_class(seed, ratio, num_classes) -> None:
    """The share of steps drawing the visited class is Binomial(T, p)/T with p = IR/(IR + C − 1);
    the tolerance is 5 binomial standard deviations (a false alarm has probability below 1e-6)."""
    labels = np.repeat(np.arange(num_classes), 40)
    length = 20_000
    stream = streams.label_shift(labels, ratio, seed, length=length)
    visited = streams.label_shift_schedule(num_classes, length, seed)
    share = np.mean(labels[stream] == visited)
    p = ratio / (ratio + num_classes - 1)
    assert abs(share - p) <= 5 * math.sqrt(p * (1 - p) / length)


def test_finite_ratio_draws_the_other_classes_uniformly() -> None:
    labels = np.repeat(np.arange(5), 10)
    length = 50_000
    stream = streams.label_shift(labels, 3.0, 0, length=length)
    visited = streams.label_shift_schedule(5, length, 0)
    others = labels[stream][labels[stream] != visited]
    offsets = (others - visited[labels[stream] != visited]) % 5  # 1..4: which of the other classes
    counts = np.bincount(offsets, minlength=5)[1:]
    expected = len(others) / 4
    assert np.all(np.abs(counts - expected) <= 5 * math.sqrt(expected))


def test_label_shift_bad_input() -> None:
    labels = np.arange(4)
    for ratio in (0, -1.0, float("nan"), "inf"):
        with pytest.raises(ValueError, match="imbalance_ratio"):
            streams.label_shift(labels, ratio, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shorter than the number of classes"):
        streams.label_shift(labels, math.inf, 0, length=3)
    with pytest.raises(ValueError, match="seed"):
        streams.label_shift(labels, math.inf, -1)
    with pytest.raises(ValueError, match="integers"):
        streams.label_shift(np.array([0.5, 1.5]), math.inf, 0)


# ---------------------------------------------------------------------------------------------- mixed
@FAST
@given(st.lists(st.integers(0, 40), min_size=1, max_size=15), SEEDS)
def test_mixed_covers_every_domain_sample_once(sizes, seed) -> None:
    pairs = streams.mixed(sizes, seed)
    assert pairs.shape == (sum(sizes), 2) and pairs.dtype == np.int64
    expected = {(d, i) for d, size in enumerate(sizes) for i in range(size)}
    assert {tuple(p) for p in pairs.tolist()} == expected
    assert np.array_equal(pairs, streams.mixed(sizes, seed))


def test_mixed_interleaves_domains() -> None:
    pairs = streams.mixed([500] * 3, 0)
    assert len(runs(pairs[:, 0])) > 500  # not played domain after domain


# ------------------------------------------------------------------------------------- batches, epochs
@FAST
@given(st.integers(0, 300), st.integers(1, 70))
def test_batches_cover_the_stream(length, batch_size) -> None:
    bounds = streams.batches(np.arange(length), batch_size)
    assert bounds[0] == 0 and bounds[-1] == length
    sizes = np.diff(bounds)
    assert np.all(sizes[:-1] == batch_size) and (len(sizes) == 0 or 1 <= sizes[-1] <= batch_size)
    assert np.array_equal(streams.batches(length, batch_size), bounds)


def test_batches_bad_input() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        streams.batches(10, 0)


def test_epochs_repeat_or_reshuffle() -> None:
    labels = np.zeros(6, dtype=np.int64)
    fixed, bounds = streams.epochs(streams.mild(labels, 0), 3)
    assert bounds.tolist() == [0, 6, 12, 18] and np.array_equal(fixed[:6], fixed[12:])
    fresh, bounds = streams.epochs(lambda e: streams.mild(labels, 100 + e), 2)
    assert np.array_equal(fresh[bounds[-2] :], streams.mild(labels, 101))
    with pytest.raises(ValueError, match="k must"):
        streams.epochs(fixed, 0)


@FAST
@given(label_arrays(), SEEDS, st.integers(0, 50))
def test_epoch_order_is_a_seeded_permutation(labels: np.ndarray, seed: int, epoch: int) -> None:
    order = streams.epoch_order(labels, seed, epoch)
    assert order.dtype == np.int64 and np.array_equal(np.sort(order), np.arange(len(labels)))
    assert np.array_equal(order, streams.epoch_order(labels, seed, epoch))


def test_no_pass_of_one_seed_replays_a_pass_of_another() -> None:
    """With ``seed + pass`` seeding, seed 1's pass 0 was seed 0's pass 1; each (seed, pass) is its own."""
    labels = np.zeros(64, dtype=np.int64)
    assert not np.array_equal(streams.epoch_order(labels, 1, 0), streams.epoch_order(labels, 0, 1))
    orders = {streams.epoch_order(labels, seed, e).tobytes() for seed in range(4) for e in range(4)}
    mild = {streams.mild(labels, seed).tobytes() for seed in range(8)}
    assert len(orders) == 16 and not orders & mild
    with pytest.raises(ValueError, match="epoch"):
        streams.epoch_order(labels, 0, -1)


# ---------------------------------------------------------------------------------------------- blind spot
@FAST
@given(st.lists(st.booleans(), min_size=1, max_size=80).filter(any), st.integers(0, 300), SEEDS)
def test_blind_spot_has_only_wrong_samples_and_the_length(mask, length, seed) -> None:
    mask = np.array(mask)
    stream = streams.blind_spot(mask, length, seed)
    assert len(stream) == length and stream.dtype == np.int64
    assert np.all(mask[stream])
    wrong = np.flatnonzero(mask)
    counts = np.bincount(stream, minlength=len(mask))[wrong]
    assert counts.max() - counts.min() <= 1  # whole list repeated, remainder without replacement
    assert np.array_equal(stream, streams.blind_spot(mask, length, seed))


def test_blind_spot_defaults_to_one_pass_and_rejects_nothing_wrong() -> None:
    mask = np.zeros(50, dtype=bool)
    mask[[3, 7, 20]] = True
    one_pass = streams.blind_spot(mask, None, 0)
    assert sorted(one_pass) == [3, 7, 20]  # each mistake once, as the paper
    repeated = streams.blind_spot(mask, 50, 0)  # the earlier, harsher stream: the set's size
    assert len(repeated) == 50 and np.array_equal(repeated[:3], one_pass)
    with pytest.raises(ValueError, match="nothing wrong"):
        streams.blind_spot(np.zeros(5, dtype=bool), 5, 0)
    with pytest.raises(ValueError, match="boolean"):
        streams.blind_spot(np.array([0, 1]), 5, 0)


# ---------------------------------------------------------------------------------------------- noise prefix
def test_noise_prefix_puts_noise_first_then_the_mild_stream() -> None:
    labels = np.arange(20)
    rows = streams.noise_prefix(labels, 5, 3)
    assert rows.shape == (25, 2)
    assert rows[:5].tolist() == [[streams.NOISE, i] for i in range(5)]
    assert np.all(rows[5:, 0] == streams.DATA) and np.array_equal(rows[5:, 1], streams.mild(labels, 3))
