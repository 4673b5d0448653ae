"""A grid's work as workers see it: the runs grouped into tasks, what a worker does with one, and how far
along it is.

A *task* is what one worker runs at once: one run, or batch-size-1 runs that differ only in their
corruption and seed, stacked as streams of one adapter. Every backend (``bench/backends.py``) hands tasks
to the same entry point, ``attempt``, and gets back one *outcome* per run: its result, or a ``Failure``.
``Execution`` says where and how they run; none of it is part of a run's identity.

How the model's forward runs (``Execution.speed``: compile, channels-last) goes to every worker with its
tasks, as ``attempt``'s ``speed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zerosiam.bench.batches import STACKED_PROTOCOLS, unstacked
from zerosiam.bench.checkpoint import CHECKPOINT_EVERY, Checkpointing
from zerosiam.bench.device import resolve_device
from zerosiam.bench.memory import fix_mmap_threshold
from zerosiam.bench.runner import Report, Result, run_stacked
from zerosiam.bench.spec import RunSpec
from zerosiam.bench.store import Failure, run_id_for
from zerosiam.methods.speed import Speed
from zerosiam.parts.streams import STACKED_PREDICTORS

Outcome = tuple[dict[str, Any], dict, dict, dict] | Failure  # a run's spec, metrics, curves, environment
Sink = Callable[[Outcome], None]
Task = list[dict[str, Any]]  # what a worker runs at once: one spec, or specs stacked as streams


@dataclass(frozen=True)
class Execution:
    """Where and how a grid's runs execute; none of it is part of a run's identity."""

    backend: str = "local"  # local (worker processes), ray, or inline (this process: debugging, tests)
    workers: int | None = None  # parallel runs (default: cores / threads, or one per GPU)
    threads: int = 1  # torch intra-op threads per run
    address: str | None = None  # a Ray cluster
    device: str = "cpu"  # auto, cpu, cuda, cuda:N
    gpus_per_run: float = 0.0  # Ray's GPU resources per run (fractions share a GPU)
    stack: bool = False  # batch-size-1 runs that differ only in their corruption and seed share one adapter
    checkpoint_every: float | None = CHECKPOINT_EVERY  # seconds between a task's saves (None: never)
    progress: bool = True  # show a bar of the runs
    compile: bool | str = False  # torch.compile each run's model forward (True, or a mode)
    channels_last: bool = False  # convolution weights and inputs in channels-last memory format
    fixed_shape: bool = False  # every decision of a step on the device
    graph: bool = False  # the fixed-shape step captured as a CUDA graph
    attention: str | None = None  # a scaled-dot-product attention backend (math, efficient, flash, cudnn)
    frozen_bf16: bool = False  # frozen linear/convolution weights stored in bfloat16 (bf16 runs)
    decode_on_device: bool = False  # image files read by the loader's workers, decoded on the device
    watch: bool = False  # unguarded runs watched by ``auto`` (``parts.guards.Watch``): set by ``execute``

    @property
    def speed(self) -> Speed:
        """How each run's model forward and step run (``zerosiam.methods.speed``)."""
        return Speed(
            self.compile,
            self.channels_last,
            self.fixed_shape,
            self.graph,
            self.attention,
            self.frozen_bf16,
            self.decode_on_device,
        )


@dataclass(frozen=True)
class Progress:
    """How far a running task is: ``done`` of its ``total`` steps. A stacked batch-size-1 task or a
    mixed run stores nothing until it ends, a long while; without this the grid's bar would not move."""

    done: int
    total: int

    def __str__(self) -> str:
        return f"{self.done:,}/{self.total:,} steps"


Show = Callable[[list[Progress]], None]  # the running tasks' progress, to display
REPORT_EVERY = 2.0  # seconds between a task's progress messages
# The most runs one stacked task takes: the 15 corruptions of the benchmark under three seeds. On two CPU
# cores a 45-stream step costs 9-12 % less per image than a 15-stream one (docs/efficiency.md); a GPU's
# one-image step is mostly launch overhead, so there more streams should cost little more a step.
STACK_MOST = 45


def throttled(send: Callable[[Progress], None], every: float = REPORT_EVERY) -> Report:
    """A ``Report`` that passes a task's first step and its last, and otherwise one step per ``every``
    seconds, to ``send``: a message per step would cost more than some steps."""
    last = -float("inf")

    def report(done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if done in (1, total) or now - last >= every:
            last = now
            send(Progress(done, total))

    return report


def tasks_of(specs: list[RunSpec], stack: bool, most: int = STACK_MOST) -> list[Task]:
    """The runs as worker tasks: one run each, or with ``stack``, up to ``most`` batch-size-1 runs that
    differ only in their corruption and seed in one task."""
    groups: dict[str, Task] = {}
    tasks: list[Task] = []
    for spec in specs:
        values = spec.as_dict()
        if not (stack and _stacks(spec)):
            tasks.append([values])
            continue
        key = run_id_for(unstacked(values))
        group = groups.setdefault(key, [])
        if not group:
            tasks.append(group)
        group.append(values)
        if len(group) == most:
            del groups[key]
    return tasks


def run_ids_of(task: Task) -> tuple[str, ...]:
    return tuple(RunSpec.from_dict(values).run_id for values in task)


def _stacks(spec: RunSpec) -> bool:
    """Whether the run may share an adapter with its other corruptions: a batch-size-1 protocol, no
    prelude and a predictor that stacks (the MLP does not)."""
    return (
        spec.protocol in STACKED_PROTOCOLS
        and not spec.prelude
        and spec.hparams.get("predictor", "identity") in STACKED_PREDICTORS
    )


def run_task(
    task: Task,
    execution: Execution,
    report: Report | None = None,
    checkpointing: Checkpointing | None = None,
) -> list[Outcome]:
    """Worker entry point: one run, or runs stacked as streams, as ``execution`` says (its threads,
    device, speed and watch; picklable, for pools and Ray); ``report`` hears of its steps. With
    ``checkpointing`` the task saves its progress as it goes, and goes on from there if it was stopped
    before."""
    import torch

    torch.set_num_threads(execution.threads)
    fix_mmap_threshold()
    specs = [RunSpec.from_dict(values) for values in task]
    checkpoint = checkpointing.of(run_ids_of(task)) if checkpointing is not None else None
    results: list[Result] = run_stacked(
        specs,
        device=resolve_device(execution.device),
        report=report,
        checkpoint=checkpoint,
        speed=execution.speed,
        watch=execution.watch,
    )
    return [(values, r.metrics, r.curves, r.env) for values, r in zip(task, results, strict=True)]


def attempt(
    task: Task,
    execution: Execution,
    report: Report | None = None,
    checkpointing: Checkpointing | None = None,
) -> list[Outcome]:
    """``run_task``, with an exception turned into a ``Failure`` of each of the task's runs, so that one
    bad run never ends a grid (its checkpoint stays: a run killed by the machine goes on next time)."""
    try:
        return run_task(task, execution, report, checkpointing)
    except Exception as error:
        return [Failure.of(values, error) for values in task]
