"""One benchmark run: (model, dataset, corruption, severity, protocol, method, hyper-parameters, seed).

A run builds a fresh source model (the model is reset per corruption and severity, as protocols.md says),
streams the protocol's batches through the adapter, and returns the online accuracy, the per-step
diagnostic curves, wall time and peak memory. It is a pure function of its spec, so the same spec gives
the same numbers in a local process, a pool worker or a Ray task.

The streams themselves are built by ``zerosiam.protocols``; this module supplies them with the benchmark's
data (the cached corrupted splits and the benchmark's corruptions) and the source model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

import zerosiam
from zerosiam import corruptions
from zerosiam.bench import datasets
from zerosiam.bench.checkpoint import RunCheckpoint, random_state, restore_random_state
from zerosiam.bench.device import describe_device
from zerosiam.bench.environment import environment
from zerosiam.bench.memory import peak_gpu_mb, peak_mb, reset_peak
from zerosiam.bench.mistakes import cached_mistakes
from zerosiam.bench.store import run_id_for
from zerosiam.corruptions.datasets import load_corrupted
from zerosiam.data.tensors import to_input
from zerosiam.methods.adapter import Adapter, prepare_options
from zerosiam.methods.relay import Relay
from zerosiam.parts.precision import check_precision, forward_precision
from zerosiam.parts.streams import put_rows
from zerosiam.protocols import seeding, streams
from zerosiam.protocols.build import (
    MIXED,
    PROTOCOLS,
    Stream,
    build_stream,
    frozen_batches,
    gather_batch,
    stacked_frozen_hits,
    subsample,
    to_device,
)
from zerosiam.zoo.trained import shipped_sha256

CURVE_KEYS = (
    "logit_norm",
    "centre_dominance",
    "predictor_drift",
    "entropy",
    "objective",
    "divergence",
    "loss",
)


LATER_FIELDS = ("prelude",)  # RunSpec fields younger than the stores: not in a run's identity while empty


def check_prelude(prelude: dict[str, Any]) -> None:
    """A prelude names a known method and a positive number of steps (its other keys are that method's
    options); anything else is refused in one line before the run starts."""
    if "method" not in prelude or "steps" not in prelude:
        raise ValueError(f"a prelude needs a method and a number of steps, got {sorted(prelude)}")
    zerosiam.get_recipe(prelude["method"])  # a ValueError naming the methods if it is unknown
    steps = prelude["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"a prelude's steps must be a positive integer, got {steps!r}")


@dataclass(frozen=True)
class RunSpec:
    """Everything that determines a run's result. ``hparams`` are ``adapt`` overrides (lr, predictor_lr, …).

    ``corruption`` is ``"mixed"`` for the mixed protocol, which streams all 15 corruptions in one run.
    ``stream_length`` sets T for label shift (default: the dataset size) and the length of the blind-spot
    stream (default: one pass over the source model's mistakes, as the paper); ``noise`` the noise-prefix
    length; ``epochs`` the passes of the epochs protocol.
    ``precision`` is the forward's (``fp32``, ``bf16``, ``fp16``); ``model_options`` go to
    ``zerosiam.load_model`` (mean, std, checkpoint, … of a ``timm:``/``builder:``/``torchscript:`` model).
    ``prelude`` (``{"method": "tent", "steps": 100, "lr_scale": 10}``) lets another method adapt the
    stream's first ``steps`` batches before ``method`` takes the adapted model over (a ``Relay``); those
    batches are scored apart, as ``prelude_accuracy``. The device is not here: it is where a run
    computes, not what it computes.
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
    precision: str = "fp32"
    model_options: dict[str, Any] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    prelude: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if self.prelude:
            check_prelude(self.prelude)
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; choose one of {PROTOCOLS}")
        if (self.protocol == MIXED) != (self.corruption == MIXED):
            raise ValueError("the mixed protocol runs with corruption='mixed', and only it does")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def run_id(self) -> str:
        """A stable identity: the sha256 of the spec's canonical JSON, as for every row of the store.

        A zoo model trained by this project (``resnet26_gn``, ...) adds its shipped weights' sha256: the
        name stays when the weights are retrained, and a store written with the old ones must not be
        resumed as if it held results of the new ones. A field added after stores were written
        (``LATER_FIELDS``) is left out while empty, so the runs stored before it keep their ids.
        """
        identity = {
            key: value for key, value in self.as_dict().items() if not (key in LATER_FIELDS and not value)
        }
        weights = shipped_sha256(self.model)
        if weights is not None:
            identity["weights_sha256"] = weights
        return run_id_for(identity)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunSpec:
        return cls(**values)


@dataclass
class Result:
    spec: RunSpec
    metrics: dict[str, Any]
    curves: dict[str, list[float]]
    env: dict[str, Any]


def stream_for(
    spec: RunSpec, source_model: nn.Module | None = None, device: torch.device | None = None
) -> Stream:
    """The protocol's stream for ``spec`` over the benchmark's data: the cached corrupted split of
    ``spec.dataset`` at ``spec.severity`` (the 15 benchmark corruptions for the mixed protocol). The
    blind-spot stream is made of what the unadapted ``source_model`` gets wrong, so it needs it."""
    device = device or torch.device("cpu")
    predict = mistakes = None
    if source_model is not None:
        predict = functools.partial(_frozen_forward, source_model, spec.precision)
        mistakes = functools.partial(cached_mistakes, spec, source_model, predict, device)
    return build_stream(
        spec,
        lambda corruption: datasets.open_domain(spec.dataset, corruption, spec.severity),
        mixed_domains=corruptions.BENCHMARK,
        predict=predict,
        mistakes=mistakes,
        device=device,
    )


def _frozen_forward(model: nn.Module, precision: str, x: torch.Tensor) -> torch.Tensor:
    with forward_precision(precision, x.device):
        return model(x).float()


def _method_extras(method: str, spec: RunSpec) -> dict[str, Any]:
    """Inputs a method needs besides the stream: EATA's clean in-distribution samples for its Fisher."""
    if "clean_data" not in prepare_options(zerosiam.get_recipe(method)):
        return {}
    clean = load_corrupted(datasets.clean_source(spec.dataset), "clean", spec.severity)
    images, _ = subsample(*clean, 2000, spec.seed, seeding.CLEAN_SUBSET)
    x = to_input(images)
    return {"clean_data": list(x.split(spec.batch_size))}


Report = Callable[[int, int], None]  # steps done, steps in all


def run(spec: RunSpec, progress: bool = False, device: str | torch.device = "cpu") -> Result:
    """Execute one run on ``device`` and measure it.

    The loop asks the host as little as it can: batches are gathered (or decoded) ahead by the loader,
    travel to the device as uint8 and become model input there, predictions are scored there, and the
    per-step diagnostics are read back once at the end. (What still reads the device each step: the
    adapter's finiteness check of the update and, for filtering methods, whether any sample was kept.)
    """
    return run_stacked([spec], progress, device)[0]


def run_stacked(
    specs: Sequence[RunSpec],
    progress: bool = False,
    device: str | torch.device = "cpu",
    report: Report | None = None,
    checkpoint: RunCheckpoint | None = None,
) -> list[Result]:
    """Execute runs that differ only in their corruption as stacked streams of one adapter
    (``zerosiam.adapt(..., streams=B)``): one forward per step serves every run, which is what makes
    the batch-size-1 protocols affordable. Each run's result is what ``run`` gives it, up to float
    rounding; its ``seconds`` are its share of the wall time and ``streams`` says how many shared it.
    ``report(done, total)`` hears of every step, and of every batch of the blind spot's final frozen
    pass (counted as steps after the stream's): such a task can run for an hour, and a grid's workers
    tell their driver how far along they are.

    With a ``checkpoint``, the task's progress is written every few minutes and a task started again
    goes on from the last one, to the same result (its ``resumed_from_step`` says where it went on).
    Runs with a prelude do not checkpoint: a relay's two legs have no one state to save.
    """
    device = torch.device(device)
    spec = check_stackable(specs)
    own_peak = reset_peak(device)  # a pool worker runs many specs: each reports its own peak, where it can
    torch.manual_seed(spec.seed)
    model = zerosiam.load_model(spec.model, **spec.model_options).to(device)
    stacked = [stream_for(one, source_model=model, device=device) for one in specs]
    ends = [len(StreamBatches(stream)) for stream in stacked]
    length = max(ends)
    batches = [StreamBatches(padded(stream, length)) for stream in stacked]
    adapter = _adapter(spec, model, stacked[0].batch_size, streams=len(specs))
    aside = SetAside(adapter, ends)
    scores = [_Score(stream, spec.prelude.get("steps", 0), device) for stream in stacked]
    if isinstance(adapter, Relay):
        checkpoint = None
    saved = checkpoint.load(device) if checkpoint is not None else None
    first, spent, waited = _resume(saved, adapter, scores, aside) if saved is not None else (0, 0.0, 0.0)
    start = time.perf_counter() - spent
    loaders = [iter(b.loader(device, shared_by=len(specs), start=first)) for b in batches]
    if saved is not None:  # after the loaders, which draw their seeds from it
        restore_random_state(saved["random"], device)
    steps = tqdm(
        range(first, length), initial=first, total=length, desc=spec.method, leave=False, disable=not progress
    )
    frozen_rows = [s.frozen_rows for s in stacked if s.frozen_rows is not None]
    total = length + (len(frozen_batches(stacked[0], frozen_rows[0])) if frozen_rows else 0)
    for index in steps:
        asked = time.perf_counter()
        data = [next(loader) for loader in loaders]  # decoded ahead by the loaders' workers, in order
        waited += time.perf_counter() - asked
        x, y = to_device(torch.cat([d[0] for d in data]), torch.cat([d[1] for d in data]), device)
        hits = (adapter(x).argmax(1) == y).float().view(len(specs), -1)
        for score, stream_batches, stream_hits, end in zip(scores, batches, hits, ends, strict=True):
            if index < end:
                score.add(index, *stream_batches.bounds[index], stream_hits)
        aside.after(index + 1)
        if checkpoint is not None and checkpoint.due():
            spent = time.perf_counter() - start
            checkpoint.save(_checkpoint_state(index + 1, adapter, scores, aside, spent, waited, device))
        if report is not None:
            report(index + 1, total)
    if frozen_rows:  # the blind spot: the adapted models frozen, on the whole sets
        aside.put_back()
        scored = None if report is None else lambda done: report(length + done, total)
        frozen = stacked_frozen_hits(adapter.predict, stacked, frozen_rows, device, scored)
        for score, hits in zip(scores, frozen, strict=True):
            score.frozen(hits)
    seconds = (time.perf_counter() - start) / len(specs)
    return _results(specs, scores, adapter, ends, seconds, waited / len(specs), first, own_peak, device)


def _results(
    specs: Sequence[RunSpec],
    scores: list[_Score],
    adapter: Adapter | Relay,
    ends: list[int],
    seconds: float,
    waited: float,
    first: int,
    own_peak: bool,
    device: torch.device,
) -> list[Result]:
    """Each run's result from its score and its stream's record up to its own ``end``; ``seconds`` and
    ``waited`` are each run's share, ``first`` the step a resumed task went on from, and ``own_peak``
    whether the peak memory mark was reset for this task (where the kernel refuses, the peak is the whole
    process's)."""
    spec = specs[0]
    env = {**environment(), **describe_device(device), "weights_sha256": shipped_sha256(spec.model)}
    results = []
    for number, (one, score, end) in enumerate(zip(specs, scores, ends, strict=True)):
        history = (adapter.stream_history(number) if len(specs) > 1 else adapter.history)[:end]
        metrics = _metrics(score, seconds, len(history), history, device)
        metrics["data_wait_fraction"] = waited / seconds if seconds > 0 else 0.0
        metrics["peak_rss_scope"] = "run" if own_peak else "process"
        if len(specs) > 1:
            metrics["streams"] = len(specs)
        if spec.prelude:
            metrics["prelude_accuracy"] = score.prelude_accuracy
        if first:
            metrics["resumed_from_step"] = first
        results.append(Result(one, metrics, _curves(history, score.curve()), env))
    return results


def _checkpoint_state(
    step: int,
    adapter: Adapter,
    scores: list[_Score],
    aside: SetAside,
    spent: float,
    waited: float,
    device: torch.device,
) -> dict[str, Any]:
    """What a checkpoint holds after ``step`` batches: everything the next step reads, and the clock."""
    return {
        "step": step,
        "seconds": spent,
        "waited": waited,
        "adapter": adapter.state_dict(),
        "scores": [score.state_dict() for score in scores],
        "set_aside": aside.state_dict(),
        "random": random_state(device),
    }


def _resume(
    saved: dict[str, Any], adapter: Adapter, scores: list[_Score], aside: SetAside
) -> tuple[int, float, float]:
    """Put a checkpoint's state back; the step to go on from, and the seconds spent and waited so far."""
    adapter.load_state_dict(saved["adapter"])
    for score, state in zip(scores, saved["scores"], strict=True):
        score.load_state_dict(state)
    aside.load_state_dict(saved.get("set_aside", {}))  # checkpoints of streams of one length had none
    return saved["step"], saved["seconds"], saved["waited"]


def padded(stream: Stream, length: int) -> Stream:
    """``stream`` brought to ``length`` steps by playing its rows again: the stacked streams of one task
    step together, so one that ends first fills the steps after its end with filler. Nothing of those
    steps is scored or kept (``SetAside``). Only one-sample steps are padded: a filler row must not join
    a stream's own last batch."""
    missing = length - len(stream.rows)
    if missing <= 0:
        return stream
    if stream.batch_size != 1:
        raise ValueError(f"stacked streams of batch size {stream.batch_size} must be of one length")
    return dataclasses.replace(
        stream,
        rows=np.concatenate([stream.rows, np.resize(stream.rows, (missing, stream.rows.shape[1]))]),
        evaluated=np.concatenate([stream.evaluated, np.zeros(missing, bool)]),
    )


class SetAside:
    """Each stacked stream's adapted weights as they were after its own last step.

    Stacked streams step together for as long as the longest, so a stream whose stream ended earlier
    (the blind spot's one pass over a corruption with fewer mistakes) keeps adapting on filler. Its
    weights at its own end are set aside here and put back before the frozen scoring, which reads only
    the adapted weights (``Adapter.predict`` forwards the model, not the predictor). Streams of one
    length set nothing aside.
    """

    def __init__(self, adapter: Adapter | Relay, ends: list[int]) -> None:
        self.ends = ends
        self.adapter = adapter
        early = any(end < max(ends) for end in ends) and adapter.recipe.adapts  # NoAdapt keeps no weights
        self.kept = {name: p.detach().clone() for name, p in adapter.params.items()} if early else {}

    def after(self, step: int) -> None:
        """Set aside the weights of the streams whose last step was ``step`` (counted from 1)."""
        if not self.kept or step not in self.ends:
            return
        for name, param in self.adapter.params.items():
            done = torch.tensor([end == step for end in self.ends], device=param.device)
            put_rows(self.kept[name], param.detach(), done)

    def put_back(self) -> None:
        """Every stream's weights as they were at its own end (the longest's are its current ones)."""
        if not self.kept:
            return
        self.after(max(self.ends))
        with torch.no_grad():
            for name, param in self.adapter.params.items():
                param.copy_(self.kept[name])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.kept.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in state.items():
            self.kept[name].copy_(tensor)


STACKED_PROTOCOLS = ("bs1", "label_shift_bs1", "blind_spot")  # one-sample steps


def check_stackable(specs: Sequence[RunSpec]) -> RunSpec:
    """The runs' common spec if they may share one stacked adapter: the same run but for the corruption,
    no prelude (a relay hands one model over) and not the mixed protocol (one stream already); otherwise
    a one-line error."""
    if not specs:
        raise ValueError("no runs to stack")
    first = specs[0]
    if len(specs) == 1:
        return first
    common = {field: value for field, value in first.as_dict().items() if field != "corruption"}
    for spec in specs[1:]:
        values = spec.as_dict()
        differing = [field for field, value in common.items() if values[field] != value]
        if differing:
            raise ValueError(f"stacked runs may differ in their corruption only, not in {differing}")
    if first.prelude or first.corruption == MIXED:
        raise ValueError(
            f"runs with a prelude or of the mixed protocol do not stack (protocol {first.protocol!r}, "
            f"prelude {first.prelude or 'none'})"
        )
    return first


class _Score:
    """One run's online accuracy, per domain, with the prelude's batches scored apart, and its curve."""

    def __init__(self, stream: Stream, prelude_steps: int, device: torch.device) -> None:
        self.stream = stream
        self.prelude_steps = prelude_steps
        self.device = device
        self.counts = torch.zeros(4, len(stream.domains), device=device)  # right, seen; prelude's too
        self._curve: list[torch.Tensor] = []

    def add(self, index: int, a: int, b: int, hits: torch.Tensor) -> None:
        """Score batch ``index``, the stream's rows ``a:b``, whose predictions hit or missed as ``hits``."""
        counted = np.flatnonzero(self.stream.evaluated[a:b])  # known on the host: no question to the device
        if not len(counted):
            self._curve.append(torch.tensor(math.nan, device=self.device))
            return
        where = torch.from_numpy(counted).to(self.device, non_blocking=True)
        domain = torch.from_numpy(self.stream.rows[a:b][counted, 0]).to(self.device, non_blocking=True)
        right, total = self.counts[:2] if index >= self.prelude_steps else self.counts[2:]
        right.index_add_(0, domain, hits[where])
        total.index_add_(0, domain, torch.ones_like(hits[where]))
        self._curve.append(hits[where].mean())

    def state_dict(self) -> dict[str, torch.Tensor]:
        curve = torch.stack(self._curve) if self._curve else torch.empty(0, device=self.device)
        return {"counts": self.counts.clone(), "curve": curve}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.counts.copy_(state["counts"])
        self._curve = list(state["curve"].unbind())

    def frozen(self, hits: np.ndarray) -> None:
        """The blind spot: only the frozen rows, scored by the adapted model after the stream, count."""
        self.counts[:2, 0] = torch.tensor([hits.sum(), len(hits)], device=self.counts.device)

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        counts = self.counts[:2].cpu().double().numpy()  # whole counts: exact
        return counts[0], counts[1]

    @property
    def prelude_accuracy(self) -> float:
        return float(self.counts[2].sum() / self.counts[3].sum().clamp_min(1))

    def curve(self) -> list[float]:
        return torch.stack(self._curve).tolist() if self._curve else []


def _adapter(spec: RunSpec, model: nn.Module, batch_size: int, streams: int = 1) -> Adapter | Relay:
    """The run's adapter on ``model``; with a prelude, a relay from the prelude's method to the run's."""

    def build(model: nn.Module, method: str, hparams: dict[str, Any]) -> Adapter:
        extras = _method_extras(method, spec)
        return zerosiam.adapt(
            model,
            method,
            batch_size=batch_size,
            precision=spec.precision,
            streams=streams,
            **hparams,
            **extras,
        )

    if not spec.prelude:
        return build(model, spec.method, spec.hparams)
    prelude = dict(spec.prelude)
    method, steps = prelude.pop("method"), prelude.pop("steps")
    return Relay(
        build(model, method, prelude), steps, lambda adapted: build(adapted, spec.method, spec.hparams)
    )


class StreamBatches(torch.utils.data.Dataset):
    """A stream's batches, in order, as a ``Dataset`` of uint8 images and labels: a ``DataLoader`` then
    gathers (for files: decodes) them in worker processes ahead of the loop, in exactly the stream's
    order, and hands them over in pinned memory for a GPU."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        bounds = streams.batches(stream.rows, stream.batch_size)
        self.bounds = list(zip(bounds[:-1], bounds[1:], strict=True))

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.bounds[index]
        return gather_batch(self.stream, self.stream.rows[a:b])

    def loader(self, device: torch.device, shared_by: int = 1, start: int = 0) -> torch.utils.data.DataLoader:
        """The loader of the batches from ``start`` on; ``shared_by`` stacked streams split the machine's
        decoding workers between them."""
        workers = max((datasets.loader_workers(images) for images, _ in self.stream.domains), default=0)
        workers = -(-workers // shared_by)  # rounded up: a stream that decodes files keeps one
        return torch.utils.data.DataLoader(
            torch.utils.data.Subset(self, range(start, len(self))) if start else self,
            batch_size=None,
            shuffle=False,
            num_workers=workers,
            pin_memory=device.type == "cuda",
            prefetch_factor=4 if workers else None,
        )


def _metrics(
    score: _Score, seconds: float, steps: int, history: list[dict[str, Any]], device: torch.device
) -> dict[str, Any]:
    stream = score.stream
    correct, seen = score.totals()
    metrics = {
        "accuracy": float(correct.sum() / max(seen.sum(), 1)),
        "samples": int(seen.sum()),
        "seconds": seconds,
        "steps": steps,
        "updates": sum(bool(row.get("updated")) for row in history),
        "recoveries": sum(bool(row.get("recovered")) for row in history),
        "peak_rss_mb": peak_mb(),
    }
    if device.type == "cuda":
        metrics["peak_gpu_mb"] = peak_gpu_mb(device)
    if len(stream.domains) > 1:
        metrics["per_domain"] = {
            name: float(c / n) for name, c, n in zip(stream.names, correct, seen, strict=True) if n > 0
        }
    return metrics


def _curves(history: list[dict[str, Any]], accuracy_curve: list[float]) -> dict[str, list[float]]:
    curves = {"accuracy": accuracy_curve}
    for key in CURVE_KEYS:
        values = [float(row.get(key, math.nan)) for row in history]
        if not all(math.isnan(v) for v in values):
            curves[key] = values
    return curves
