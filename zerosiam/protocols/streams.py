"""The test streams of the paper's protocols (sections 4.1 and 4.3) as pure functions (``docs/data.md``).

Each function maps (labels or sizes, seed, protocol parameters) to int64 index arrays, so every method
sees the very same samples in the very same order for a given seed, and the streams can be tested on
their properties without a model. Nothing here touches images. Every draw takes its generator from
``zerosiam.protocols.seeding.rng(seed, purpose)``, which says which purposes keep the legacy streams.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from zerosiam.protocols import seeding

NOISE, DATA = 0, 1  # the domain column of ``noise_prefix``
LABEL_SHIFT_LENGTH_FACTOR = 2  # T = 2 × dataset size: the ImageNet choice (100,000 steps for 50,000 images)

ArrayLike = np.ndarray | Sequence[int]


# ---------------------------------------------------------------------------------------------- checks
def _labels(labels: ArrayLike) -> np.ndarray:
    array = np.asarray(labels)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {array.dtype}")
    return array


def _count(value: int, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------- mild
def mild(labels: ArrayLike, seed: int) -> np.ndarray:
    """Every sample once, in a seeded random order (the ``mild`` and ``bs1`` protocols)."""
    return seeding.rng(seed).permutation(len(_labels(labels))).astype(np.int64)


def epoch_order(labels: ArrayLike, seed: int, epoch: int) -> np.ndarray:
    """Every sample once, in the order of pass ``epoch`` of the epochs protocol.

    Seeded by ``(seed, EPOCH_ORDER, epoch)`` rather than ``seed + epoch``, so no pass of one run replays a
    pass of another (with ``seed + epoch``, run 1's first pass was run 0's second).
    """
    index = _count(epoch, "epoch")
    return seeding.rng(seed, seeding.EPOCH_ORDER, index).permutation(len(_labels(labels))).astype(np.int64)


# ---------------------------------------------------------------------------------------------- label shift
def visited_probability(imbalance_ratio: float, num_classes: int) -> float:
    """Chance that a step draws the class being visited: ``IR / (IR + C − 1)`` (1 for IR = ∞)."""
    if math.isinf(imbalance_ratio):
        return 1.0
    return imbalance_ratio / (imbalance_ratio + num_classes - 1)


def label_shift_schedule(num_classes: int, length: int, seed: int) -> np.ndarray:
    """The class visited at each of ``length`` steps: classes in a seeded random order, each for a run of
    ``length / C`` consecutive steps (runs differ by at most one step when ``C`` does not divide it).

    Classes are given as positions 0..C−1; ``label_shift`` maps them to the label values.
    """
    order = seeding.rng(seed).permutation(num_classes)
    segment = np.arange(length, dtype=np.int64) * num_classes // length
    return order[segment]


def label_shift(
    labels: ArrayLike, imbalance_ratio: float, seed: int, length: int | None = None
) -> np.ndarray:
    """SAR's class-imbalanced online stream (the paper, section 4.1).

    ``length`` steps (default ``2 × len(labels)``) visit the C classes in a seeded random order,
    ``length / C`` consecutive steps each. Each step draws a class from ``q`` (the visited class with
    probability ``IR / (IR + C − 1)``, each other class ``1 / (IR + C − 1)``), then an image of that class
    uniformly *with replacement*. ``imbalance_ratio = math.inf`` gives a purely class-ordered stream.
    """
    labels = _labels(labels)
    if not (isinstance(imbalance_ratio, int | float | np.number) and imbalance_ratio > 0):
        raise ValueError(f"imbalance_ratio must be a positive number or math.inf, got {imbalance_ratio!r}")
    classes, inverse = np.unique(labels, return_inverse=True)
    num_classes = len(classes)
    steps = LABEL_SHIFT_LENGTH_FACTOR * len(labels) if length is None else _count(length, "length", 1)
    if steps < num_classes:
        raise ValueError(f"length {steps} is shorter than the number of classes {num_classes}")
    visited = label_shift_schedule(num_classes, steps, seed)
    rng = seeding.rng(seed, seeding.LABEL_SHIFT_DRAWS)  # a stream independent of the schedule's
    drawn = _draw_classes(visited, visited_probability(float(imbalance_ratio), num_classes), num_classes, rng)
    return _draw_members(inverse, drawn, num_classes, rng)


def _draw_classes(
    visited: np.ndarray, p_visit: float, num_classes: int, rng: np.random.Generator
) -> np.ndarray:
    """Per step: the visited class with probability ``p_visit``, else a uniformly chosen other class."""
    if num_classes == 1 or p_visit >= 1.0:
        return visited.copy()
    stay = rng.random(len(visited)) < p_visit
    other = rng.integers(0, num_classes - 1, size=len(visited))
    other += other >= visited  # skip the visited class: uniform over the C − 1 others
    return np.where(stay, visited, other)


def _draw_members(
    inverse: np.ndarray, drawn: np.ndarray, num_classes: int, rng: np.random.Generator
) -> np.ndarray:
    """For each step, a uniformly drawn sample index (with replacement) of the drawn class."""
    by_class = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=num_classes)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pick = starts[drawn] + rng.integers(0, counts[drawn])
    return by_class[pick].astype(np.int64)


# ---------------------------------------------------------------------------------------------- mixed
def mixed(domain_sizes: Sequence[int], seed: int) -> np.ndarray:
    """All samples of several domains (e.g. the 15 corruptions) concatenated and shuffled together.

    Returns an ``(M, 2)`` int64 array of ``(domain, index within domain)`` rows, ``M = sum(domain_sizes)``.
    """
    sizes = [_count(s, "each domain size") for s in domain_sizes]
    if not sizes:
        raise ValueError("mixed needs at least one domain")
    domain = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    index = np.concatenate([np.arange(s, dtype=np.int64) for s in sizes])
    order = seeding.rng(seed, seeding.MIXED_ORDER).permutation(len(domain))
    return np.stack([domain[order], index[order]], axis=1)


# ---------------------------------------------------------------------------------------------- batching
def batches(indices: ArrayLike | int, batch_size: int) -> np.ndarray:
    """Batch boundaries: batch ``i`` is ``indices[b[i]:b[i + 1]]``; the last batch may be smaller.

    ``indices`` may also be the stream length. Online accuracy counts every sample, so nothing is dropped.
    """
    size = _count(batch_size, "batch_size", 1)
    n = _count(indices, "stream length") if isinstance(indices, int | np.integer) else len(indices)
    return np.append(np.arange(0, n, size, dtype=np.int64), np.int64(n)) if n else np.zeros(1, dtype=np.int64)


# ---------------------------------------------------------------------------------------------- blind spot
def blind_spot(wrong_mask: ArrayLike, length: int | None, seed: int) -> np.ndarray:
    """The blind-spot adaptation stream: the samples the unadapted model gets wrong, in a seeded random
    order, each once (``length`` None: the paper's protocol, one pass over the mistakes).

    An explicit ``length`` shortens the pass or, past the number of mistakes, repeats it and tops it up
    with a random remainder drawn without replacement (the project's earlier, harsher stream was
    ``length`` = the dataset size: about three passes on a 70 % model). Every length starts with the
    same pass, so a repeated stream's first pass is the one-pass stream.
    """
    mask = np.asarray(wrong_mask)
    if mask.ndim != 1 or mask.dtype != np.bool_:
        raise ValueError(f"wrong_mask must be a 1-D boolean array, got {mask.dtype} of shape {mask.shape}")
    wrong = np.flatnonzero(mask)
    steps = len(wrong) if length is None else _count(length, "length")
    rng = seeding.rng(seed, seeding.BLIND_SPOT_DRAWS)
    if steps == 0:
        return np.zeros(0, dtype=np.int64)
    if len(wrong) == 0:
        raise ValueError("the unadapted model got nothing wrong, so the blind-spot stream is empty")
    order = rng.permutation(wrong)
    if len(order) >= steps:
        return order[:steps].astype(np.int64)
    repeats, remainder = divmod(steps, len(order))
    top_up = rng.permutation(wrong)[:remainder]
    return np.concatenate([*([order] * repeats), top_up]).astype(np.int64)


# ---------------------------------------------------------------------------------------------- noise prefix
def noise_prefix(labels: ArrayLike, num_noise: int, seed: int) -> np.ndarray:
    """``num_noise`` pure-noise images, then the ``mild`` stream of ``labels``.

    Returns ``(M, 2)`` rows of ``(domain, index)``: domain ``NOISE`` (0) rows number the noise images
    0..num_noise−1 (the caller generates them), domain ``DATA`` (1) rows index the dataset. Only the
    ``DATA`` part is evaluated.
    """
    count = _count(num_noise, "num_noise")
    data = mild(labels, seed)
    head = np.stack([np.full(count, NOISE, dtype=np.int64), np.arange(count, dtype=np.int64)], axis=1)
    tail = np.stack([np.full(len(data), DATA, dtype=np.int64), data], axis=1)
    return np.concatenate([head, tail])


# ---------------------------------------------------------------------------------------------- epochs
def epochs(indices: ArrayLike | Callable[[int], ArrayLike], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The stream played ``k`` times: returns (concatenated indices, pass boundaries of length k + 1).

    ``indices`` is either one fixed order, repeated as is, or a function of the pass number 0..k−1 (e.g.
    ``lambda e: epoch_order(labels, seed, e)`` to reshuffle each pass). The k-th pass, the one evaluated, is
    ``stream[bounds[-2]:bounds[-1]]``.
    """
    passes = _count(k, "k", 1)
    if callable(indices):
        rounds = [np.asarray(indices(e), dtype=np.int64) for e in range(passes)]
    else:
        rounds = [np.asarray(indices, dtype=np.int64)] * passes
    if any(r.ndim != 1 for r in rounds):
        raise ValueError("each pass must be a 1-D index array")
    bounds = np.concatenate([[0], np.cumsum([len(r) for r in rounds])]).astype(np.int64)
    return np.concatenate(rounds), bounds


# ---------------------------------------------------------------------------------------------- continual
def continual(domain_sizes: Sequence[int], seed: int) -> np.ndarray:
    """CoTTA's continual stream: the domains one after another in the order given (the model is never
    reset between them), each whole and shuffled in an order of its own.

    The order within a domain is seeded by ``(seed, CONTINUAL_ORDER, domain)``: a set stored class by
    class (the CIFAR-10 JPEGs are) would otherwise arrive as a class-ordered stream, which is the label
    shift protocol, not this one. Returns ``(M, 2)`` rows of ``(domain, index within domain)``.
    """
    sizes = [_count(s, "each domain size") for s in domain_sizes]
    if not sizes:
        raise ValueError("continual needs at least one domain")
    parts = [
        np.stack([np.full(size, d, dtype=np.int64), _order(seed, seeding.CONTINUAL_ORDER, d, size)], axis=1)
        for d, size in enumerate(sizes)
    ]
    return np.concatenate(parts)


def _order(seed: int, purpose: int, index: int, size: int) -> np.ndarray:
    return seeding.rng(seed, purpose, index).permutation(size).astype(np.int64)


# ---------------------------------------------------------------------------------------------- gradual
GRADUAL_SEVERITIES = (1, 2, 3, 4, 5, 4, 3, 2, 1)  # each corruption's legs (mariodoebler's ``gradual``)
GRADUAL_LENGTH = 100_000  # the stream's default length: 740 images a leg over 15 corruptions


def gradual_leg(length: int, corruptions: int) -> int:
    """Images per leg: ``length`` spread over ``corruptions × 9`` legs (at least one each)."""
    legs = _count(corruptions, "corruptions", 1) * len(GRADUAL_SEVERITIES)
    return max(1, _count(length, "length", 1) // legs)


def gradual(domain_size: int, leg: int, seed: int, corruption: int) -> np.ndarray:
    """One corruption's part of the gradual stream: ``leg`` images at each severity of
    ``GRADUAL_SEVERITIES`` in turn (1 → 5 → 1), as ``(K, 2)`` rows of ``(severity, index)``.

    The two legs at one severity draw different images of the severity's set (without replacement,
    seeded by ``(seed, GRADUAL_DRAWS, corruption, severity)``), so no image is seen twice by one run
    unless a leg needs more than half the set.
    """
    size, per = _count(domain_size, "domain_size", 1), _count(leg, "leg", 1)
    drawn: dict[int, np.ndarray] = {}
    used: dict[int, int] = defaultdict(int)
    rows = []
    for severity in GRADUAL_SEVERITIES:
        if severity not in drawn:
            visits = GRADUAL_SEVERITIES.count(severity)
            rng = seeding.rng(seed, seeding.GRADUAL_DRAWS, corruption, severity)
            drawn[severity] = np.concatenate([rng.permutation(size) for _ in range(-(-visits * per // size))])
        start = used[severity]
        used[severity] += per
        index = drawn[severity][start : start + per].astype(np.int64)
        rows.append(np.stack([np.full(per, severity, dtype=np.int64), index], axis=1))
    return np.concatenate(rows)


# ---------------------------------------------------------------------------------------------- CCC
CCC_LENGTH = 100_000  # images of a CCC stream by default (CCC itself streams 7.5 million)
CCC_SPEED = 1_000  # images at each point of a walk: CCC's fastest transition speed
CCC_SEVERITIES = 6  # 0 (not applied) to 5: the severities a walk moves through
CCC_HARDEST = ("gaussian_noise", "shot_noise", "impulse_noise", "contrast")  # below 20 %: these only


def ccc_corruptions(target: float, names: Sequence[str]) -> list[str]:
    """The corruptions CCC walks between at a ``target`` source accuracy (%): those that can bring a model
    down near it. CCC's rule, by its thresholds: at 40 or more all but brightness; from 20, also without
    JPEG; below, the three noises and contrast (the others cannot reach so low)."""
    if target >= 40:
        dropped = {"brightness"}
    elif target >= 20:
        dropped = {"brightness", "jpeg_compression"}
    else:
        return [
            name for name in names if name in ("gaussian_noise", "shot_noise", "impulse_noise", "contrast")
        ]
    return [name for name in names if name not in dropped]


def best_walk(accuracy: np.ndarray, target: float) -> list[tuple[int, int]]:
    """CCC's walk from one corruption to the next over a calibrated grid ``accuracy[s1, s2]`` (the source
    model's accuracy, %, with the first corruption at severity ``s1`` and the second at ``s2``, 0 = not
    applied): from ``(s1, 0)`` with ``s1 ≥ 1``, each point lowers ``s1`` or raises ``s2`` by one, until
    ``s1`` is 0. Of all such walks, the one whose mean accuracy is nearest ``target`` (CCC searches them
    greedily; here every walk is tried, there are a few hundred); the shorter one on a tie.
    """
    grid = np.asarray(accuracy, dtype=float)
    if grid.ndim != 2 or grid.shape[0] < 2 or grid.shape[0] != grid.shape[1]:
        raise ValueError(f"accuracy must be a square grid of severities 0..n, got shape {grid.shape}")
    best: tuple[float, int, list[tuple[int, int]]] | None = None
    for walk in _walks(grid.shape[0] - 1):
        gap = abs(float(np.mean([grid[point] for point in walk])) - target)
        if best is None or (gap, len(walk)) < best[:2]:
            best = (gap, len(walk), walk)
    assert best is not None
    return best[2]


def _walks(top: int) -> list[list[tuple[int, int]]]:
    """Every walk from ``(s1, 0)``, ``1 ≤ s1 ≤ top``, to ``s1 = 0`` by steps that lower ``s1`` or raise
    ``s2`` (``s2 ≤ top``), in a fixed order."""
    found: list[list[tuple[int, int]]] = []

    def extend(walk: list[tuple[int, int]]) -> None:
        s1, s2 = walk[-1]
        if s1 == 0:
            found.append(walk)
            return
        extend([*walk, (s1 - 1, s2)])
        if s2 < top:
            extend([*walk, (s1, s2 + 1)])

    for start in range(1, top + 1):
        extend([(start, 0)])
    return found


def ccc_pairs(corruptions: int, count: int, seed: int) -> list[tuple[int, int]]:
    """The corruptions of ``count`` successive walks, as CCC chains them: a random pair first, then each
    walk starts from where the last one ended and goes to another corruption drawn at random."""
    n = _count(corruptions, "corruptions", 2)
    rng = seeding.rng(seed, seeding.CCC_DRAWS)
    first = int(rng.integers(n))
    pairs = []
    for _ in range(_count(count, "count")):
        second = int(rng.integers(n - 1))
        second += second >= first  # any corruption but the one the walk starts from
        pairs.append((first, second))
        first = second
    return pairs


def ccc(
    clean_size: int,
    walk: Callable[[int, int], Sequence[tuple[int, int]]],
    corruptions: int,
    seed: int,
    length: int = CCC_LENGTH,
    speed: int = CCC_SPEED,
) -> np.ndarray:
    """A CCC stream of ``length`` images: walks between pairs of corruptions (``ccc_pairs``), ``speed``
    images at each point of a walk, ``walk(first, second)`` giving the points ``(s1, s2)`` (calibrated by
    the caller: ``best_walk``). Each point draws its images from the ``clean_size`` clean ones, without
    replacement within the point (CCC shuffles its source set for each). Returns ``(length, 5)`` rows of
    ``(first corruption, s1, second corruption, s2, clean index)``.
    """
    total, per = _count(length, "length", 1), _count(speed, "speed", 1)
    size = _count(clean_size, "clean_size", 1)
    rng = seeding.rng(seed, seeding.CCC_DRAWS, 1)
    rows: list[np.ndarray] = []
    made = 0
    pairs = iter(ccc_pairs(corruptions, total // per + 1, seed))  # a walk has at least one point
    while made < total:
        first, second = next(pairs)
        for s1, s2 in walk(first, second):
            count = min(per, total - made)
            index = np.concatenate([rng.permutation(size) for _ in range(-(-count // size))])[:count]
            point = np.array([first, s1, second, s2], dtype=np.int64)
            rows.append(np.column_stack([np.tile(point, (count, 1)), index.astype(np.int64)]))
            made += count
            if made == total:
                break
    return np.concatenate(rows)
