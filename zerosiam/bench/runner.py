"""One benchmark run: (model, dataset, corruption, severity, protocol, method, hyper-parameters, seed).

A run builds a fresh source model (the model is reset per corruption and severity, as protocols.md says),
streams the protocol's batches through the adapter, and returns the online accuracy, the per-step
diagnostic curves, wall time and peak memory. It is a pure function of its spec, so the same spec gives
the same numbers in a local process, a pool worker or a Ray task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

import zerosiam
from zerosiam import corruptions, streams
from zerosiam.bench.memory import peak_mb, reset_peak
from zerosiam.data.corrupted import load_corrupted
from zerosiam.methods.adapter import prepare_options

PROTOCOLS = ("mild", "label_shift", "mixed", "bs1", "label_shift_bs1", "blind_spot", "noise_prefix", "epochs")
BLIND_SPOT = "blind_spot"
MIXED = "mixed"
CURVE_KEYS = (
    "logit_norm",
    "centre_dominance",
    "predictor_drift",
    "entropy",
    "objective",
    "divergence",
    "loss",
)


@dataclass(frozen=True)
class RunSpec:
    """Everything that determines a run's result. ``hparams`` are ``adapt`` overrides (lr, predictor_lr, …).

    ``corruption`` is ``"mixed"`` for the mixed protocol, which streams all 15 corruptions in one run.
    ``stream_length`` sets T for label shift and the length of the blind-spot stream (default: the
    dataset size); ``noise`` the noise-prefix length; ``epochs`` the passes of the epochs protocol.
    """

    model: str
    dataset: str
    corruption: str
    severity: int
    protocol: str
    method: str
    seed: int = 0
    batch_size: int = 64
    limit: int | None = None
    imbalance_ratio: float = math.inf
    stream_length: int | None = None
    noise: int = 1000
    epochs: int = 1
    hparams: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; choose one of {PROTOCOLS}")
        if (self.protocol == MIXED) != (self.corruption == MIXED):
            raise ValueError("the mixed protocol runs with corruption='mixed', and only it does")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def run_id(self) -> str:
        """A stable identity: the sha256 of the spec's canonical JSON (first 16 hex digits)."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunSpec:
        return cls(**values)


@dataclass
class Result:
    spec: RunSpec
    metrics: dict[str, Any]
    curves: dict[str, list[float]]
    env: dict[str, Any]


@dataclass
class Stream:
    """A run's data: domains of (images, labels), the ``(domain, index)`` rows in stream order, which
    rows count towards accuracy, and the batch size. ``frozen_rows``, when set, are scored after the
    stream by the adapted model without further updates (the blind-spot protocol), and only they count.
    """

    domains: list[tuple[np.ndarray, np.ndarray]]
    names: list[str]
    rows: np.ndarray
    evaluated: np.ndarray
    batch_size: int
    frozen_rows: np.ndarray | None = None


def _subsample(images: np.ndarray, labels: np.ndarray, limit: int | None, seed: int):
    if limit is None or limit >= len(labels):
        return images, labels
    keep = np.sort(np.random.default_rng(seed).permutation(len(labels))[:limit])
    return images[keep], labels[keep]


def _domain(spec: RunSpec, corruption: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = load_corrupted(spec.dataset, corruption, spec.severity)
    return _subsample(images, labels, spec.limit, spec.seed)


def _single(order: np.ndarray) -> np.ndarray:
    """Rows of a one-domain stream."""
    return np.stack([np.zeros_like(order), order], axis=1)


def build_stream(spec: RunSpec, source_model: nn.Module | None = None) -> Stream:
    """The protocol's stream for ``spec`` (``shared/docs/protocols.md``). The blind-spot stream depends
    on what the unadapted ``source_model`` gets wrong, so it needs that model; no other protocol does."""
    if spec.protocol == MIXED:
        domains = [_domain(spec, name) for name in corruptions.BENCHMARK]
        rows = streams.mixed([len(labels) for _, labels in domains], spec.seed)
        return Stream(domains, list(corruptions.BENCHMARK), rows, np.ones(len(rows), bool), spec.batch_size)
    domain = _domain(spec, spec.corruption)
    labels = domain[1]
    batch_size = 1 if spec.protocol.endswith("bs1") else spec.batch_size
    if spec.protocol == BLIND_SPOT:
        return _blind_spot_stream(spec, domain, source_model)
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
        order, bounds = streams.epochs(lambda e: streams.mild(labels, spec.seed + e), spec.epochs)
        evaluated = np.arange(len(order)) >= bounds[-2]
        return Stream([domain], [spec.corruption], _single(order), evaluated, batch_size)
    rows = _single(streams.mild(labels, spec.seed))
    return Stream([domain], [spec.corruption], rows, np.ones(len(rows), bool), batch_size)


def pure_noise(count: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The paper's "pure Gaussian noise" images: every pixel N(127.5, 64²) grey levels, i.i.d., clipped to
    uint8 (the paper gives no scale; ±2σ spans the 0–255 range, so about 5 % of values are clipped)."""
    values = np.random.default_rng(seed).normal(127.5, 64.0, (count, *shape))
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def _blind_spot_stream(spec: RunSpec, domain, source_model: nn.Module | None) -> Stream:
    """Adapt one image at a time on the source model's mistakes only, then score the whole set frozen."""
    if source_model is None:
        raise ValueError("the blind-spot stream is made of the source model's mistakes: pass source_model")
    shuffled = _single(streams.mild(domain[1], spec.seed))
    source = Stream([domain], [spec.corruption], shuffled, np.ones(len(shuffled), bool), spec.batch_size)
    wrong = np.zeros(len(domain[1]), bool)
    wrong[shuffled[:, 1]] = ~_frozen_hits(source_model, source, shuffled)
    rows = _single(streams.blind_spot(wrong, spec.stream_length or len(wrong), spec.seed))
    return Stream([domain], [spec.corruption], rows, np.zeros(len(rows), bool), 1, frozen_rows=shuffled)


def _frozen_hits(predict, stream: Stream, rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` ``predict`` classifies correctly: no gradients, batches of at least 64 images."""
    hits = []
    with torch.no_grad():
        for a, b in itertools.pairwise(streams.batches(rows, max(stream.batch_size, 64))):
            x, y = gather_batch(stream, rows[a:b])
            hits.append(predict(x).argmax(1).numpy() == y)
    return np.concatenate(hits) if hits else np.zeros(0, bool)


def gather_batch(stream: Stream, rows: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    if len(stream.domains) == 1:
        images, labels = stream.domains[0]
        index = rows[:, 1]
        pixels, targets = images[index], labels[index]
    else:
        pixels = np.stack([stream.domains[d][0][i] for d, i in rows])
        targets = np.array([stream.domains[d][1][i] for d, i in rows])
    return torch.from_numpy(np.ascontiguousarray(pixels)).permute(0, 3, 1, 2).float().div_(255), targets


def _method_extras(spec: RunSpec) -> dict[str, Any]:
    """Inputs a method needs besides the stream: EATA's clean in-distribution samples for its Fisher."""
    if "clean_data" not in prepare_options(zerosiam.get_recipe(spec.method)):
        return {}
    images, _ = _subsample(*load_corrupted(spec.dataset, "clean", spec.severity), 2000, spec.seed)
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div_(255)
    return {"clean_data": list(x.split(spec.batch_size))}


def run(spec: RunSpec, progress: bool = False) -> Result:
    """Execute one run and measure it."""
    reset_peak()  # a pool worker runs many specs: each reports its own peak
    torch.manual_seed(spec.seed)
    model = zerosiam.load_model(spec.model)
    stream = build_stream(spec, source_model=model)
    adapter = zerosiam.adapt(
        model, spec.method, batch_size=stream.batch_size, **spec.hparams, **_method_extras(spec)
    )
    bounds = streams.batches(stream.rows, stream.batch_size)
    correct = np.zeros(len(stream.domains))
    seen = np.zeros(len(stream.domains))
    accuracy_curve = []
    start = time.perf_counter()
    for a, b in tqdm(
        list(zip(bounds[:-1], bounds[1:], strict=True)), desc=spec.method, leave=False, disable=not progress
    ):
        rows = stream.rows[a:b]
        x, y = gather_batch(stream, rows)
        hits = adapter(x).argmax(1).numpy() == y
        counted = stream.evaluated[a:b]
        np.add.at(correct, rows[counted, 0], hits[counted])
        np.add.at(seen, rows[counted, 0], 1)
        accuracy_curve.append(float(hits[counted].mean()) if counted.any() else math.nan)
    if stream.frozen_rows is not None:
        hits = _frozen_hits(adapter.predict, stream, stream.frozen_rows)
        correct[0], seen[0] = hits.sum(), len(hits)
    seconds = time.perf_counter() - start
    return Result(
        spec,
        _metrics(stream, correct, seen, seconds, adapter),
        _curves(adapter, accuracy_curve),
        environment(),
    )


def _metrics(
    stream: Stream, correct: np.ndarray, seen: np.ndarray, seconds: float, adapter
) -> dict[str, Any]:
    metrics = {
        "accuracy": float(correct.sum() / max(seen.sum(), 1)),
        "samples": int(seen.sum()),
        "seconds": seconds,
        "steps": adapter.steps,
        "updates": sum(bool(row.get("updated")) for row in adapter.history),
        "recoveries": sum(bool(row.get("recovered")) for row in adapter.history),
        "peak_rss_mb": peak_mb(),
    }
    if len(stream.domains) > 1:
        metrics["per_domain"] = {
            name: float(c / n) for name, c, n in zip(stream.names, correct, seen, strict=True) if n > 0
        }
    return metrics


def _curves(adapter, accuracy_curve: list[float]) -> dict[str, list[float]]:
    curves = {"accuracy": accuracy_curve}
    for key in CURVE_KEYS:
        values = [float(row.get(key, math.nan)) for row in adapter.history]
        if not all(math.isnan(v) for v in values):
            curves[key] = values
    return curves


def environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "zerosiam": zerosiam.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
    }
