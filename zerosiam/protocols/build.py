"""The protocols' streams over real images: which images, in which order, and which of them are scored.

``zerosiam.protocols.streams`` gives index arrays; this module joins them to the images. It imports
nothing from the benchmark, the methods, the corruptions or the zoo: the caller passes what a protocol
needs (``load``, one domain's images by name; the mixed protocol's domain names; the source model's
``predict`` for the blind spot). So the layers stay in order (the benchmark builds on the protocols, the
protocols on plain arrays) and a stream can be built and tested on any data without a model zoo.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from zerosiam.data.sources import EncodedBatch
from zerosiam.data.tensors import decode_on, to_input
from zerosiam.protocols import seeding, streams

BLIND_SPOT = "blind_spot"
MIXED = "mixed"
CONTINUAL, GRADUAL, CCC = "continual", "gradual", "ccc"
# the protocols that stream a whole sequence of domains in one run: their runs' corruption is their name
SEQUENCES = (MIXED, CONTINUAL, GRADUAL, CCC)
PROTOCOLS = (
    "mild", "label_shift", MIXED, "bs1", "label_shift_bs1", BLIND_SPOT, "noise_prefix", "epochs",
    CONTINUAL, GRADUAL, CCC,
)  # fmt: skip
CCC_TARGET = 50.0  # the source accuracy (%) a CCC stream holds unless a run names another
FROZEN_BATCH = 64  # the smallest batch the frozen scoring uses: no gradients, so bigger is just faster

Domain = tuple[np.ndarray, np.ndarray]  # uint8 (N, H, W, 3) images and their (N,) labels
Load = Callable[[str], Domain]
LoadAt = Callable[[str, int], Domain]  # one domain at a severity: the gradual stream moves through them
Corrupt = Callable[[np.ndarray, str, int, int], np.ndarray]  # images, corruption, severity, first index
Predict = Callable[[torch.Tensor], torch.Tensor]
FindMistakes = Callable[[Domain], np.ndarray]  # a domain to the bool mask of what the source model gets wrong


class StreamSpec(Protocol):
    """What a protocol's stream depends on; ``zerosiam.bench.runner.RunSpec`` has it all.

    ``corruption`` names the domain ``load`` is asked for (``"mixed"`` for the mixed protocol, which asks
    for each of its domains instead); ``limit`` keeps a seeded subsample of each domain; ``stream_length``
    sets T for label shift (default: the domain's size), the blind spot's length (default: one pass
    over the mistakes) and the length of the gradual and CCC streams (default 100,000); ``noise`` is the
    noise-prefix length, ``epochs`` the passes of the epochs protocol and ``target`` the source accuracy
    (%) a CCC stream holds.
    """

    @property
    def protocol(self) -> str: ...
    @property
    def corruption(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def limit(self) -> int | None: ...
    @property
    def imbalance_ratio(self) -> float: ...
    @property
    def stream_length(self) -> int | None: ...
    @property
    def noise(self) -> int: ...
    @property
    def epochs(self) -> int: ...
    @property
    def target(self) -> float: ...


@dataclass(frozen=True)
class CCCSource:
    """What a CCC stream is made of, given by the caller (the protocols know no corruption nor model):
    the clean images, the corruption engine (``corrupt(images, name, severity, first)`` corrupts uint8
    images, the first being the stream's image number ``first``, so each image draws its own noise) and
    the walk from one corruption to another that holds the source model near the run's target
    (``streams.best_walk`` over the model's calibrated accuracies)."""

    clean: Domain
    corrupt: Corrupt
    walk: Callable[[str, str], Sequence[tuple[int, int]]]


@dataclass
class Stream:
    """A run's data: domains of (images, labels), the ``(domain, index)`` rows in stream order, which
    rows count towards accuracy, and the batch size. ``frozen_rows``, when set, are scored after the
    stream by the adapted model without further updates (the blind-spot protocol), and only they count.
    """

    domains: list[Domain]
    names: list[str]
    rows: np.ndarray
    evaluated: np.ndarray
    batch_size: int
    frozen_rows: np.ndarray | None = None


def subsample(images: np.ndarray, labels: np.ndarray, limit: int | None, seed: int, *purpose: int) -> Domain:
    """A seeded subset of ``limit`` samples, kept in their original order (all of them when ``limit`` is
    None or not smaller). Without a ``purpose`` it is the run's ``limit`` draw, ``default_rng(seed)`` as
    it always was (``seeding``); other subsets pass their own purpose so they do not pick the same images.
    """
    if limit is None or limit >= len(labels):
        return images, labels
    keep = np.sort(seeding.rng(seed, *purpose).permutation(len(labels))[:limit])
    return images[keep], labels[keep]


def _domain(spec: StreamSpec, load: Load, name: str) -> Domain:
    return subsample(*load(name), spec.limit, spec.seed)


def _single(order: np.ndarray) -> np.ndarray:
    """Rows of a one-domain stream."""
    return np.stack([np.zeros_like(order), order], axis=1)


def build_stream(
    spec: StreamSpec,
    load: Load,
    *,
    mixed_domains: Sequence[str] = (),
    predict: Predict | None = None,
    mistakes: FindMistakes | None = None,
    device: torch.device | str = "cpu",
    load_at: LoadAt | None = None,
    ccc: CCCSource | None = None,
) -> Stream:
    """The stream of ``spec.protocol`` (``docs/benchmark.md``, "Protocols") over the images ``load`` gives.

    ``load(name)`` returns one domain's uint8 ``(N, H, W, 3)`` images and labels. The mixed protocol
    shuffles the ``mixed_domains`` together. The blind-spot stream is made of what the unadapted source
    model gets wrong, so it needs that model's ``predict`` (float images in [0, 1] to logits, run on
    ``device``); a caller that keeps those mistakes between runs passes ``mistakes(domain)`` instead,
    which returns them (``source_mistakes``'s mask). No other protocol needs either.

    The continual protocols stream ``mixed_domains`` too, in the order given: ``continual`` each whole
    at ``spec``'s severity; ``gradual`` each through severities 1 → 5 → 1, read with ``load_at(name,
    severity)``; ``ccc`` walks between them (those ``streams.ccc_corruptions`` keeps for the target),
    made from ``ccc``'s clean images as the stream goes (``CCCSource``).
    """
    if spec.protocol in SEQUENCES and not mixed_domains:
        raise ValueError(f"the {spec.protocol} protocol streams several domains: pass mixed_domains")
    if spec.protocol == MIXED:
        domains = [_domain(spec, load, name) for name in mixed_domains]
        rows = streams.mixed([len(labels) for _, labels in domains], spec.seed)
        return Stream(domains, list(mixed_domains), rows, np.ones(len(rows), bool), spec.batch_size)
    if spec.protocol == CONTINUAL:
        domains = [_domain(spec, load, name) for name in mixed_domains]
        rows = streams.continual([len(labels) for _, labels in domains], spec.seed)
        return Stream(domains, list(mixed_domains), rows, np.ones(len(rows), bool), spec.batch_size)
    if spec.protocol == GRADUAL:
        if load_at is None:
            raise ValueError("the gradual stream reads each corruption at every severity: pass load_at")
        return _gradual_stream(spec, mixed_domains, load_at)
    if spec.protocol == CCC:
        if ccc is None:
            raise ValueError("a CCC stream is made from clean images as it goes: pass ccc (a CCCSource)")
        return _ccc_stream(spec, mixed_domains, ccc)
    domain = _domain(spec, load, spec.corruption)
    labels = domain[1]
    batch_size = 1 if spec.protocol.endswith("bs1") else spec.batch_size
    if spec.protocol == BLIND_SPOT:
        wrong = mistakes(domain) if mistakes else source_mistakes(spec, domain, predict, device)
        return _blind_spot_stream(spec, domain, wrong)
    if spec.protocol.startswith("label_shift"):
        length = spec.stream_length or len(labels)
        rows = _single(streams.label_shift(labels, spec.imbalance_ratio, spec.seed, length=length))
        return Stream([domain], [spec.corruption], rows, np.ones(len(rows), bool), batch_size)
    if spec.protocol == "noise_prefix":
        noise = pure_noise(spec.noise, domain[0].shape[1:], spec.seed)
        rows = streams.noise_prefix(labels, spec.noise, spec.seed)
        noise_domain = (noise, np.full(spec.noise, -1))
        return Stream(
            [noise_domain, domain], ["noise", spec.corruption], rows, rows[:, 0] == streams.DATA, batch_size
        )
    if spec.protocol == "epochs":
        order, bounds = streams.epochs(lambda e: streams.epoch_order(labels, spec.seed, e), spec.epochs)
        evaluated = np.arange(len(order)) >= bounds[-2]
        return Stream([domain], [spec.corruption], _single(order), evaluated, batch_size)
    rows = _shuffled(domain, spec.seed)
    return Stream([domain], [spec.corruption], rows, np.ones(len(rows), bool), batch_size)


def _gradual_stream(spec: StreamSpec, names: Sequence[str], load_at: LoadAt) -> Stream:
    """Each corruption in turn through severities 1 → 5 → 1 (``streams.gradual``), never reset. A
    corruption's legs are gathered into one domain of its own (a few thousand images), so the run's
    accuracy is told per corruption as the continual stream's is."""
    leg = streams.gradual_leg(spec.stream_length or streams.GRADUAL_LENGTH, len(names))
    domains = []
    for number, name in enumerate(names):
        sets = {severity: load_at(name, severity) for severity in sorted(set(streams.GRADUAL_SEVERITIES))}
        picks = streams.gradual(len(sets[1][1]), leg, spec.seed, number)
        parts = [(sets[s][0][i], sets[s][1][i]) for s, i in _legs(picks)]
        domains.append((np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])))
    rows = np.concatenate([_single(np.arange(len(labels))) + [d, 0] for d, (_, labels) in enumerate(domains)])
    return Stream(domains, list(names), rows, np.ones(len(rows), bool), spec.batch_size)


def _legs(picks: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``(severity, image indices)`` of each run of equal severities in ``(severity, index)`` rows."""
    bounds = np.flatnonzero(np.diff(picks[:, 0])) + 1
    return [(int(block[0, 0]), block[:, 1]) for block in np.split(picks, bounds)]


def _ccc_stream(spec: StreamSpec, names: Sequence[str], source: CCCSource) -> Stream:
    """A CCC stream (``streams.ccc``) made into images: each point of a walk corrupts its clean images
    with the first corruption at ``s1``, then the second at ``s2`` (0: not applied), as CCC does."""
    kept = streams.ccc_corruptions(spec.target, names)
    images, labels = subsample(*source.clean, spec.limit, spec.seed)
    rows = streams.ccc(
        len(labels),
        lambda a, b: source.walk(kept[a], kept[b]),
        len(kept),
        spec.seed,
        spec.stream_length or streams.CCC_LENGTH,
    )
    made = np.empty((len(rows), *images.shape[1:]), dtype=np.uint8)
    bounds = np.flatnonzero(np.any(np.diff(rows[:, :4], axis=0) != 0, axis=1)) + 1
    for start, end in itertools.pairwise([0, *bounds.tolist(), len(rows)]):
        first, s1, second, s2 = (int(v) for v in rows[start, :4])
        x = np.ascontiguousarray(images[rows[start:end, 4]])
        for name, severity in ((kept[first], s1), (kept[second], s2)):
            if severity:
                x = source.corrupt(x, name, severity, start)
        made[start:end] = x
    domain = (made, np.asarray(labels)[rows[:, 4]])
    return Stream([domain], [CCC], _single(np.arange(len(rows))), np.ones(len(rows), bool), spec.batch_size)


def pure_noise(count: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The paper's "pure Gaussian noise" images: every pixel N(127.5, 64²) grey levels, i.i.d., clipped to
    uint8 (the paper gives no scale; ±2σ spans the 0–255 range, so about 5 % of values are clipped)."""
    values = seeding.rng(seed, seeding.NOISE_IMAGES).normal(127.5, 64.0, (count, *shape))
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def source_mistakes(
    spec: StreamSpec, domain: Domain, predict: Predict | None, device: torch.device | str = "cpu"
) -> np.ndarray:
    """Which of ``domain``'s images (in its own order) the unadapted model ``predict`` gets wrong, scored
    frozen in the ``mild`` order of ``spec.seed``: the blind spot's raw material. One pass over the whole
    domain, the same for every method, so a caller running many methods may compute it once and pass
    it to ``build_stream`` as ``mistakes``."""
    if predict is None:
        raise ValueError("the blind-spot stream is made of the source model's mistakes: pass it as predict")
    shuffled = _shuffled(domain, spec.seed)
    source = Stream([domain], [spec.corruption], shuffled, np.ones(len(shuffled), bool), spec.batch_size)
    wrong = np.zeros(len(domain[1]), bool)
    wrong[shuffled[:, 1]] = ~frozen_hits(predict, source, shuffled, device)
    return wrong


def _shuffled(domain: Domain, seed: int) -> np.ndarray:
    """The mild protocol's rows: the domain shuffled by ``seed`` (also the blind spot's scoring order)."""
    return _single(streams.mild(domain[1], seed))


def _blind_spot_stream(spec: StreamSpec, domain: Domain, mistakes: np.ndarray) -> Stream:
    """Adapt one image at a time on the source model's ``mistakes`` only (one pass, unless
    ``spec.stream_length`` asks for another length), then score the whole set frozen.

    The whole set is scored in the ``mild`` order, the same one a mild run of this seed sees.
    """
    if mistakes.shape != domain[1].shape or mistakes.dtype != bool:
        raise ValueError(
            f"mistakes must be one bool per image of {spec.corruption!r} ({len(domain[1])}), "
            f"got {mistakes.dtype} of shape {mistakes.shape}"
        )
    rows = _single(streams.blind_spot(mistakes, spec.stream_length, spec.seed))
    shuffled = _shuffled(domain, spec.seed)
    return Stream([domain], [spec.corruption], rows, np.zeros(len(rows), bool), 1, frozen_rows=shuffled)


def frozen_hits(
    predict: Predict, stream: Stream, rows: np.ndarray, device: torch.device | str = "cpu"
) -> np.ndarray:
    """Which of ``rows`` ``predict`` classifies correctly: no gradients, batches of at least 64 images,
    scored on ``device`` and read back once."""
    return stacked_frozen_hits(predict, [stream], [rows], device)[0]


def frozen_batches(stream: Stream, rows: np.ndarray) -> list[tuple[int, int]]:
    """The bounds in ``rows`` of the batches that frozen scoring forwards: the stream's batch size, or
    ``FROZEN_BATCH`` if larger."""
    return list(itertools.pairwise(streams.batches(rows, max(stream.batch_size, FROZEN_BATCH))))


def stacked_frozen_hits(
    predict: Predict,
    stacked: Sequence[Stream],
    rows: Sequence[np.ndarray],
    device: torch.device | str = "cpu",
    scored: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """``frozen_hits`` of several streams at once, for a ``predict`` of stacked streams: each batch holds
    every stream's next rows, stream-major. The streams must have as many rows to score. ``scored(n)``
    hears when the first ``n`` of the ``frozen_batches`` are done: over 15 corruptions this pass is
    150,000 images, long enough that a progress bar should show it."""
    if len({len(r) for r in rows}) > 1:
        raise ValueError(f"stacked streams score as many rows each, got {sorted({len(r) for r in rows})}")
    hits = []
    with torch.no_grad():
        for done, (a, b) in enumerate(frozen_batches(stacked[0], rows[0]), 1):
            gathered = [gather_batch(stream, own[a:b]) for stream, own in zip(stacked, rows, strict=True)]
            x, y = to_device(
                *(torch.cat(parts) for parts in zip(*gathered, strict=True)), torch.device(device)
            )
            hits.append((predict(x).argmax(1) == y).view(len(stacked), -1))
            if scored is not None:
                scored(done)
    if not hits:
        return [np.zeros(0, bool) for _ in stacked]
    return list(torch.cat(hits, 1).cpu().numpy())


def gather_batch(stream: Stream, rows: np.ndarray) -> tuple[torch.Tensor | EncodedBatch, torch.Tensor]:
    """The images of ``rows`` as uint8 ``(B, H, W, 3)`` (or, from ``EncodedFiles``, the files' bytes) and
    their labels, on the host: what travels to the device (a quarter of float32's bytes), to be made
    model input there (``to_device``)."""
    if len(stream.domains) == 1:
        images, labels = stream.domains[0]
        index = rows[:, 1]
        pixels, targets = images[index], labels[index]
    else:
        pixels = _joined([stream.domains[d][0][i] for d, i in rows])
        targets = np.array([stream.domains[d][1][i] for d, i in rows])
    if not isinstance(pixels, EncodedBatch):
        pixels = torch.from_numpy(np.ascontiguousarray(pixels))
    return pixels, torch.from_numpy(np.asarray(targets, dtype=np.int64))


def _joined(images: list) -> np.ndarray | EncodedBatch:
    """One image from each domain of a stream's rows, as one batch: stacked, or the files of a domain read
    for the device to decode (``EncodedFiles``) one after another."""
    if images and isinstance(images[0], EncodedBatch):
        return EncodedBatch.joined(images)
    return np.stack(images)


def to_device(
    pixels: torch.Tensor | EncodedBatch, labels: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``(B, H, W, 3)`` images and labels onto ``device`` (through pinned memory for a GPU, without
    waiting), then float ``(B, 3, H, W)`` in [0, 1] there; the model normalizes inside. Encoded files
    are decoded there (``decode_on``)."""
    if isinstance(pixels, EncodedBatch):  # files read for the device to decode
        return decode_on(pixels, device), labels.to(device, non_blocking=True)
    if device.type == "cuda":
        pixels, labels = pixels.pin_memory(), labels.pin_memory()
    pixels = pixels.to(device, non_blocking=True)
    return to_input(pixels), labels.to(device, non_blocking=True)
