"""One benchmark run: (model, dataset, corruption, severity, protocol, method, hyper-parameters, seed).

A run builds a fresh source model (the model is reset per corruption and severity, as "A run" of
``docs/benchmark.md`` says), streams the protocol's batches through the adapter, and returns the online
accuracy, the per-step diagnostic curves, wall time and peak memory. It is a pure function of its spec, so
the same spec gives the same numbers in a local process, a pool worker or a Ray task.

The streams themselves are built by ``zerosiam.protocols``; this module supplies them with the benchmark's
data (the cached corrupted splits and the benchmark's corruptions) and the source model. What a run is
(``RunSpec``) lives in ``bench/spec.py``, the machinery of its batches (loading, stacking, scoring) in
``bench/batches.py``; both are importable from here as they always were.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

import zerosiam
from zerosiam import corruptions
from zerosiam.bench import datasets
from zerosiam.bench.batches import (
    STACKED_PROTOCOLS,
    Score,
    SetAside,
    StackedBatches,
    StreamBatches,
    check_stackable,
    encoded,
    padded,
)
from zerosiam.bench.ccc import ccc_source
from zerosiam.bench.checkpoint import RunCheckpoint, random_state, restore_random_state
from zerosiam.bench.device import describe_device
from zerosiam.bench.environment import environment
from zerosiam.bench.memory import peak_gpu_mb, peak_mb, reset_peak
from zerosiam.bench.mistakes import cached_mistakes
from zerosiam.bench.replica import jittered
from zerosiam.bench.spec import LATER_FIELDS, NO_GUARD, RunSpec, check_prelude
from zerosiam.corruptions.datasets import load_corrupted
from zerosiam.data.tensors import to_input
from zerosiam.methods.adapter import Adapter, prepare_options
from zerosiam.methods.relay import Relay
from zerosiam.methods.speed import Speed
from zerosiam.parts.guards import Watch, auto_watched, guard_settings, sar_replayed, triggers_by_bar
from zerosiam.parts.precision import forward_precision
from zerosiam.protocols import seeding
from zerosiam.protocols.build import (
    CCC,
    Stream,
    build_stream,
    frozen_batches,
    stacked_frozen_hits,
    subsample,
    to_device,
)
from zerosiam.zoo.trained import shipped_sha256

# What callers import from here, the names that moved to ``spec`` and ``batches`` included.
__all__ = [
    "CURVE_KEYS",
    "LATER_FIELDS",
    "STACKED_PROTOCOLS",
    "Report",
    "Result",
    "RunSpec",
    "SetAside",
    "StreamBatches",
    "check_prelude",
    "check_stackable",
    "padded",
    "run",
    "run_stacked",
    "stream_for",
]

CURVE_KEYS = (
    "logit_norm",
    "centre_dominance",
    "predictor_drift",
    "entropy",
    "objective",
    "divergence",
    "loss",
    "guard",
    "guard_agreement",
    "guard_narrowing",
    "guard_confidence",
    "guard_entropy",
    "guard_running",
    "guard_flips",
    "guard_scope",
)


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
    ``spec.dataset`` at ``spec.severity`` (the 15 benchmark corruptions for the mixed and continual
    protocols, at every severity for the gradual one). The blind-spot stream is made of what the
    unadapted ``source_model`` gets wrong, and a CCC stream is calibrated on it, so they need it."""
    device = device or torch.device("cpu")
    predict = mistakes = ccc = None
    if source_model is not None:
        predict = functools.partial(_frozen_forward, source_model, spec.precision)
        mistakes = functools.partial(cached_mistakes, spec, source_model, predict, device)
        if spec.protocol == CCC:
            ccc = ccc_source(spec, source_model, predict, device)
    return build_stream(
        spec,
        lambda corruption: datasets.open_domain(spec.dataset, corruption, spec.severity),
        mixed_domains=corruptions.BENCHMARK,
        predict=predict,
        mistakes=mistakes,
        device=device,
        load_at=lambda corruption, severity: datasets.open_domain(spec.dataset, corruption, severity),
        ccc=ccc,
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


def run(
    spec: RunSpec, progress: bool = False, device: str | torch.device = "cpu", speed: Speed | None = None
) -> Result:
    """Execute one run on ``device`` and measure it; ``speed`` (``zerosiam.methods.speed``: compile,
    channels-last) is how the model's forward runs, not part of the run's identity.

    The loop asks the host as little as it can: batches are gathered (or decoded) ahead by the loader,
    travel to the device as uint8 and become model input there, predictions are scored there, and the
    per-step diagnostics are read back once at the end. (What still reads the device each step: the
    adapter's finiteness check of the update and, for filtering methods, whether any sample was kept.)
    """
    return run_stacked([spec], progress, device, speed=speed)[0]


def run_stacked(
    specs: Sequence[RunSpec],
    progress: bool = False,
    device: str | torch.device = "cpu",
    report: Report | None = None,
    checkpoint: RunCheckpoint | None = None,
    speed: Speed | None = None,
    watch: bool = False,
) -> list[Result]:
    """Execute runs that differ only in their corruption and seed as stacked streams of one adapter
    (``zerosiam.adapt(..., streams=B)``): one forward per step serves every run, which is what makes
    the batch-size-1 protocols affordable. Each run's result is what ``run`` gives it, up to float
    rounding; its ``seconds`` are its share of the wall time and ``streams`` says how many shared it.
    Each stream is ordered by its own run's seed; the methods' own draws (DeYO's and COME's patch
    shuffles) come from one generator seeded by the first run's, the same law as alone, other draws.
    ``report(done, total)`` hears of every step, and of every batch of the blind spot's final frozen
    pass (counted as steps after the stream's): at a step per image over whole sets such a task runs
    long, and a grid's workers tell their driver how far along they are.

    With a ``checkpoint``, the task's progress is written every ``checkpoint.every`` seconds and a task
    started again goes on from the last one, to the same result (its ``resumed_from_step`` says where it
    went on). Runs with a prelude do not checkpoint: a relay's two legs have no one state to save.
    With ``speed`` other than eager, each result's environment says which (``speed``). With ``watch``,
    an unguarded run without a prelude wears ``auto``'s ``Watch``: it runs as it would, and its metrics
    say whether ``auto`` would have acted on it, and from which step (``auto_guard_fires``,
    ``auto_guard_first_step``), so that the run with ``auto`` need not be made where it would not.
    """
    device = torch.device(device)
    spec = check_stackable(specs)
    own_peak = reset_peak(device)  # a pool worker runs many specs: each reports its own peak, where it can
    torch.manual_seed(spec.seed)
    model = zerosiam.load_model(spec.model, **spec.model_options).to(device)
    stacked = [stream_for(one, source_model=model, device=device) for one in specs]
    ends = [len(StreamBatches(stream)) for stream in stacked]
    length = max(ends)
    speed = speed or Speed()
    loaded = [encoded(stream) for stream in stacked] if speed.decode_on_device else stacked
    batches = [StreamBatches(padded(stream, length)) for stream in loaded]
    adapter = _adapter(spec, model, stacked[0].batch_size, len(specs), speed, watch)
    aside = SetAside(adapter, ends)
    scores = [Score(stream, spec.prelude.get("steps", 0), device) for stream in stacked]
    if isinstance(adapter, Relay):
        checkpoint = None
    saved = checkpoint.load(device) if checkpoint is not None else None
    first, spent, waited = _resume(saved, adapter, scores, aside) if saved is not None else (0, 0.0, 0.0)
    start = time.perf_counter() - spent
    loader = iter(StackedBatches(batches).loader(device, start=first))
    if saved is not None:  # after the loader, which draws its seed from it
        restore_random_state(saved["random"], device)
    steps = tqdm(
        range(first, length), initial=first, total=length, desc=spec.method, leave=False, disable=not progress
    )
    frozen_rows = [s.frozen_rows for s in stacked if s.frozen_rows is not None]
    total = length + (len(frozen_batches(stacked[0], frozen_rows[0])) if frozen_rows else 0)
    replicas = [one.replica for one in specs]
    for index in steps:
        asked = time.perf_counter()
        x, y = next(loader)  # decoded ahead by the loader's workers, in order
        waited += time.perf_counter() - asked
        x, y = to_device(x, y, device)
        hits = (adapter(jittered(x, replicas, index)).argmax(1) == y).float().view(len(specs), -1)
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
    results = _results(specs, scores, adapter, ends, seconds, waited / len(specs), first, own_peak, device)
    if not speed.eager:
        for result in results:
            result.env["speed"] = speed.label
    return results


def _results(
    specs: Sequence[RunSpec],
    scores: list[Score],
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
    if settings := guard_settings(spec.guard):
        env["guard_settings"] = settings
    results = []
    for number, (one, score, end) in enumerate(zip(specs, scores, ends, strict=True)):
        history = (adapter.stream_history(number) if len(specs) > 1 else adapter.history)[:end]
        metrics = _metrics(score, seconds, len(history), history, device)
        metrics["data_wait_fraction"] = waited / seconds if seconds > 0 else 0.0
        metrics["peak_rss_scope"] = "run" if own_peak else "process"
        if len(specs) > 1:
            metrics["streams"] = len(specs)
        place = {"stack": {"streams": len(specs), "place": number}}  # a stack of one stream is a lone run
        if spec.prelude:
            metrics["prelude_accuracy"] = score.prelude_accuracy
        else:  # a relay's two legs each have their own guard: no one rule to replay over both
            metrics.update(sar_replayed(history) | auto_watched(history))
        if first:
            metrics["resumed_from_step"] = first
        results.append(Result(one, metrics, _curves(history, score.curve()), {**env, **place}))
    return results


def _checkpoint_state(
    step: int,
    adapter: Adapter,
    scores: list[Score],
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
    saved: dict[str, Any], adapter: Adapter, scores: list[Score], aside: SetAside
) -> tuple[int, float, float]:
    """Put a checkpoint's state back; the step to go on from, and the seconds spent and waited so far. A
    checkpoint of an unguarded run made under a ``Watch`` goes on without one (the grid no longer wears
    ``auto``): the watch's state is left behind, and its record of the steps before says nothing alone."""
    state = saved["adapter"]
    if adapter.recipe.guard is None and "guard" in state.get("parts", {}):
        state = {**state, "parts": {key: part for key, part in state["parts"].items() if key != "guard"}}
    adapter.load_state_dict(state)
    for score, state in zip(scores, saved["scores"], strict=True):
        score.load_state_dict(state)
    aside.load_state_dict(saved.get("set_aside", {}))  # checkpoints of streams of one length had none
    return saved["step"], saved["seconds"], saved["waited"]


def _adapter(
    spec: RunSpec, model: nn.Module, batch_size: int, streams: int, speed: Speed, watch: bool = False
) -> Adapter | Relay:
    """The run's adapter on ``model``; with a prelude, a relay from the prelude's method to the run's.
    ``speed`` gives each leg its options, unless a grid set them as hyper-parameters of its own; with
    ``watch``, an unguarded run without a prelude wears ``auto``'s ``Watch``."""
    options = speed.options
    guard = Watch() if watch and spec.guard == NO_GUARD and not spec.prelude else spec.guard

    def build(model: nn.Module, method: str, hparams: dict[str, Any]) -> Adapter:
        extras = _method_extras(method, spec)
        return zerosiam.adapt(
            model,
            method,
            batch_size=batch_size,
            precision=spec.precision,
            streams=streams,
            guard=guard,
            **{**options, **hparams},
            **extras,
        )

    if not spec.prelude:
        return build(model, spec.method, spec.hparams)
    prelude = dict(spec.prelude)
    method, steps = prelude.pop("method"), prelude.pop("steps")
    return Relay(
        build(model, method, prelude), steps, lambda adapted: build(adapted, spec.method, spec.hparams)
    )


def _metrics(
    score: Score, seconds: float, steps: int, history: list[dict[str, Any]], device: torch.device
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
        "guard_triggers": sum(bool(row.get("guard")) for row in history),
        "peak_rss_mb": peak_mb(),
    }
    metrics.update(triggers_by_bar(history))
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
