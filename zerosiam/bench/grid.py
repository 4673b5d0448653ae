"""Grids: a YAML file or CLI flags expand into run specs, which execute locally or on Ray.

Each run executes in a fresh worker process (a local pool sized to the cores, or a Ray task), and only the
driver writes to the SQLite store, one atomic row per finished run. A grid that is interrupted, even by
``kill -9``, therefore resumes by skipping the runs whose rows exist: none is lost, none is duplicated.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from tqdm import tqdm

from zerosiam import corruptions
from zerosiam.bench import datasets
from zerosiam.bench.checkpoint import CHECKPOINT_EVERY, Checkpointing
from zerosiam.bench.device import resolve_device
from zerosiam.bench.memory import fix_mmap_threshold
from zerosiam.bench.runner import STACKED_PROTOCOLS, Report, Result, RunSpec, check_prelude, run_stacked
from zerosiam.bench.store import Failure, ResultStore, run_id_for, signals_deferred
from zerosiam.corruptions.datasets import SEVERITIES, load_corrupted
from zerosiam.methods import get_recipe, options_of
from zerosiam.parts.precision import PRECISIONS
from zerosiam.parts.streams import STACKED_PREDICTORS
from zerosiam.protocols import MIXED, PROTOCOLS
from zerosiam.zoo import MODELS, model_info
from zerosiam.zoo.specs import MODEL_OPTIONS, SYNTAX, is_spec

KIND = "vision"
RATES = ("paper", "selected")  # where each method's learning rates come from
RATE_OPTIONS = ("lr", "predictor_lr", "lr_scale")
# the RunSpec fields a grid's ``stream:`` may sweep: label shift's imbalance ratio and length, the
# noise-prefix length, the passes of the epochs protocol
STREAM_FIELDS = ("imbalance_ratio", "stream_length", "noise", "epochs")


class GridError(ValueError):
    """A grid that cannot run as asked; the message names the value and the choices."""


def _check_model_options(model: str, options: dict[str, Any]) -> None:
    """Model options go to a ``timm:``/``builder:``/``torchscript:`` model; a zoo entry takes none."""
    if model in MODELS and options:
        raise GridError(f"model {model!r} is a zoo entry and takes no model options (got {sorted(options)})")
    unknown = sorted(set(options) - set(MODEL_OPTIONS))
    if unknown:
        raise GridError(f"unknown model option(s) {unknown}; choose from {', '.join(MODEL_OPTIONS)}")
    if is_spec(model):
        try:  # what the spec needs (mean and std, an importable builder, a readable checkpoint)
            model_info(model, **options)
        except (ValueError, TypeError, ImportError, OSError) as error:
            raise GridError(f"model {model!r}: {error}") from None


def _choose(what: str, values: Iterable[Any], choices: Iterable[Any]) -> None:
    choices = list(choices)
    for value in values:
        if value not in choices:
            raise GridError(f"unknown {what} {value!r}; choose one of {', '.join(map(str, choices))}")


@dataclass
class Grid:
    """The axes of a grid; every combination is one run. ``sweep`` maps an hparam to a list of values
    (e.g. ``{"lr": [1e-3, 1e-4], "predictor_lr": [1e-2]}``), crossed with every method that accepts it;
    a method that does not runs once without it."""

    models: list[str]
    methods: list[str]
    corruptions: list[str] = field(default_factory=lambda: list(corruptions.BENCHMARK))
    severities: list[int] = field(default_factory=lambda: [5])
    protocols: list[str] = field(default_factory=lambda: ["mild"])
    seeds: list[int] = field(default_factory=lambda: [0])
    dataset: str = "cifar10c"
    batch_size: int = 64
    limit: int | None = None
    precision: str = "fp32"
    model_options: dict[str, Any] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    sweep: dict[str, list[Any]] = field(default_factory=dict)
    rates: str = "paper"  # or "selected": each method's rates as `zerosiam select-lr` chose them
    stream: dict[str, list[Any]] = field(default_factory=dict)  # a protocol's parameters, swept
    prelude: dict[str, Any] = field(default_factory=dict)  # another method first (RunSpec.prelude)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> Grid:
        """From a parsed YAML mapping; ``corruptions: benchmark`` means the 15 benchmark corruptions."""
        values = dict(values)
        if values.get("corruptions") in ("benchmark", "all"):
            values["corruptions"] = list(corruptions.BENCHMARK)
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown grid keys {sorted(unknown)}; allowed: {sorted(cls.__dataclass_fields__)}"
            )
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: Path) -> Grid:
        import yaml

        return cls.from_mapping(yaml.safe_load(Path(path).read_text()) or {})

    def validate(self) -> None:
        """Refuse, in one line naming the value and the choices, anything that would fail only once
        workers run: unknown names, out-of-range numbers, options a method does not take."""
        for model in self.models:
            if model not in MODELS and not is_spec(model):
                specs = ", ".join(SYNTAX)
                raise GridError(
                    f"unknown model {model!r}; choose one of {', '.join(MODELS)} or a spec: {specs}"
                )
        for method in self.methods:
            try:
                get_recipe(method)
            except ValueError as error:
                raise GridError(str(error)) from None
        _choose("precision", [self.precision], PRECISIONS)
        _choose("rates", [self.rates], RATES)
        for model in self.models:
            _check_model_options(model, self.model_options)
        try:
            datasets.parse(self.dataset)
        except ValueError as error:
            raise GridError(str(error)) from None
        _choose("corruption", self.corruptions, corruptions.ALL)
        _choose("protocol", self.protocols, PROTOCOLS)
        _choose("severity", self.severities, SEVERITIES)
        for name, value in (("batch size", self.batch_size), ("limit", self.limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise GridError(f"{name} must be a positive integer, got {value!r}")
        _choose("stream parameter", self.stream, STREAM_FIELDS)
        for name, values in self.stream.items():
            if not values or not all(_non_negative(value) for value in values):
                raise GridError(f"stream parameter {name!r} takes non-negative numbers, got {values!r}")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise GridError(f"seeds must be non-negative integers, got {self.seeds}")
        for method in self.methods:
            _check_options(method, self.hparams, "option")
        for option in sorted(self.sweep):
            if not any(option in options_of(method) for method in self.methods):
                methods = ", ".join(self.methods)
                raise GridError(f"swept option {option!r} applies to none of the grid's methods ({methods})")
        if self.prelude:
            self._validate_prelude()

    def _validate_prelude(self) -> None:
        try:
            check_prelude(self.prelude)
        except ValueError as error:
            raise GridError(str(error)) from None
        options = set(self.prelude) - {"method", "steps"}
        _check_options(self.prelude["method"], options, "prelude option")

    def specs(self) -> list[RunSpec]:
        """Every run of the grid, in a stable order; a method without a predictor ignores η_h, and one
        that does not adapt (NoAdapt) every rate, so a rate sweep runs it once."""
        out = []
        axes = (
            self.models,
            self.protocols,
            self.severities,
            _points(self.stream),
            self.seeds,
            self.methods,
            _points(self.sweep),
        )
        for model, protocol, severity, stream, seed, method, point in itertools.product(*axes):
            accepted = options_of(method)
            hparams = {**self.hparams, **{key: value for key, value in point.items() if key in accepted}}
            for option in _ignored_rates(method):
                hparams.pop(option, None)
            for corruption in [MIXED] if protocol == MIXED else self.corruptions:
                out.append(
                    RunSpec(
                        model=model,
                        dataset=self.dataset,
                        corruption=corruption,
                        severity=severity,
                        protocol=protocol,
                        method=method,
                        seed=seed,
                        batch_size=self.batch_size,
                        limit=self.limit,
                        precision=self.precision,
                        model_options=self.model_options,
                        hparams=hparams,
                        prelude=self.prelude,
                        **stream,
                    )
                )
        return _unique(out)


def _check_options(method: str, options: Iterable[str], what: str) -> None:
    """Refuse the first of ``options`` that ``method`` does not take, naming the ones it does."""
    accepted = options_of(method)
    for option in sorted(set(options) - accepted):
        takes = ", ".join(sorted(accepted))
        raise GridError(f"{what} {option!r} does not apply to method {method!r}; it takes {takes}")


def _non_negative(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _points(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the values of ``axes`` (one empty point when there are none)."""
    names = sorted(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(axes[n] for n in names))]


def _ignored_rates(method: str) -> tuple[str, ...]:
    """The rate options ``method`` has no use for: all of them when it does not adapt, η_h when it has
    no predictor."""
    recipe = get_recipe(method)
    if not recipe.adapts:
        return RATE_OPTIONS
    return ("predictor_lr",) if recipe.asymmetry is None else ()


def _unique(specs: Iterable[RunSpec]) -> list[RunSpec]:
    seen: dict[str, RunSpec] = {}
    for spec in specs:
        seen.setdefault(spec.run_id, spec)
    return list(seen.values())


Outcome = tuple[dict[str, Any], dict, dict, dict] | Failure
Sink = Callable[[Outcome], None]
Task = list[dict[str, Any]]  # what a worker runs at once: one spec, or specs stacked as streams


@dataclass(frozen=True)
class Progress:
    """How far a running task is: ``done`` of its ``total`` steps. A stacked batch-size-1 task or a
    mixed run stores nothing for up to an hour; without this the grid's bar would not move."""

    done: int
    total: int

    def __str__(self) -> str:
        return f"{self.done:,}/{self.total:,} steps"


Show = Callable[[list[Progress]], None]  # the running tasks' progress, to display
REPORT_EVERY = 2.0  # seconds between a task's progress messages


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


@dataclass(frozen=True)
class Execution:
    """Where and how a grid's runs execute; none of it is part of a run's identity."""

    backend: str = "local"
    workers: int | None = None  # parallel runs (default: cores / threads, or one per GPU)
    threads: int = 1  # torch intra-op threads per run
    address: str | None = None  # a Ray cluster
    device: str = "cpu"  # auto, cpu, cuda, cuda:N
    gpus_per_run: float = 0.0  # Ray's GPU resources per run (fractions share a GPU)
    checkpointing: Checkpointing | None = None  # where tasks save their progress, if they do


def _execute(
    task: Task,
    threads: int,
    device: str,
    report: Report | None = None,
    checkpointing: Checkpointing | None = None,
) -> list[Outcome]:
    """Worker entry point: one run, or runs stacked as streams, with ``threads`` intra-op threads on
    ``device`` (picklable, for pools and Ray); ``report`` hears of its steps. With ``checkpointing``
    the task saves its progress as it goes, and goes on from there if it was stopped before."""
    import torch

    torch.set_num_threads(threads)
    fix_mmap_threshold()
    specs = [RunSpec.from_dict(values) for values in task]
    checkpoint = checkpointing.of(run_ids_of(task)) if checkpointing is not None else None
    results: list[Result] = run_stacked(
        specs, device=resolve_device(device), report=report, checkpoint=checkpoint
    )
    return [(values, r.metrics, r.curves, r.env) for values, r in zip(task, results, strict=True)]


def _attempt(
    task: Task,
    threads: int,
    device: str,
    report: Report | None = None,
    checkpointing: Checkpointing | None = None,
) -> list[Outcome]:
    """``_execute``, with an exception turned into a ``Failure`` of each of the task's runs, so that one
    bad run never ends a grid (its checkpoint stays: a run killed by the machine goes on next time)."""
    try:
        return _execute(task, threads, device, report, checkpointing)
    except Exception as error:
        return [Failure.of(values, error) for values in task]


def tasks_of(specs: list[RunSpec], stack: bool, most: int = 15) -> list[Task]:
    """The runs as worker tasks: one run each, or with ``stack``, up to ``most`` batch-size-1 runs that
    differ only in their corruption in one task."""
    groups: dict[str, Task] = {}
    tasks: list[Task] = []
    for spec in specs:
        values = spec.as_dict()
        if not (stack and _stacks(spec)):
            tasks.append([values])
            continue
        key = run_id_for({k: v for k, v in values.items() if k != "corruption"})
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


def prepare_data(specs: Iterable[RunSpec]) -> None:
    """Make every corrupted split the grid needs before workers start, so no two workers build one."""
    needed = set()
    for spec in (s for s in specs if datasets.is_cached(s.dataset)):  # folders on disk need no build
        names = corruptions.BENCHMARK if spec.corruption == MIXED else (spec.corruption,)
        needed.update((spec.dataset, name, spec.severity) for name in names)
    for dataset, name, severity in tqdm(sorted(needed), desc="data", leave=False):
        load_corrupted(dataset, name, severity, progress=False)


def pending(specs: Iterable[RunSpec], store: ResultStore) -> list[RunSpec]:
    """The runs with no stored result: never run, interrupted, or failed before."""
    return [spec for spec in specs if not store.has(spec.run_id)]


def execute(
    specs: list[RunSpec],
    store: ResultStore,
    backend: str = "local",
    workers: int | None = None,
    threads: int = 1,
    address: str | None = None,
    progress: bool = True,
    device: str = "cpu",
    gpus_per_run: float = 0.0,
    stack: bool = False,
    checkpoint_every: float | None = CHECKPOINT_EVERY,
) -> tuple[int, list[Failure]]:
    """Run the specs that have no row yet, writing each result as it finishes and each failure as it
    happens; returns how many ran and the failures. A failed run does not stop the others. ``stack``
    runs batch-size-1 runs that differ only in their corruption as streams of one adapter
    (``tasks_of``): the same results, up to float rounding, in a fraction of the time. Every
    ``checkpoint_every`` seconds (None: never) a task saves its progress beside the store, so that a
    grid stopped part-way goes on with its unfinished runs from there; a task's checkpoint is removed
    once all its runs are stored."""
    todo = pending(specs, store)
    if not todo:
        return 0, []
    runner = BACKENDS.get(backend)
    if runner is None:
        raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS)}")
    prepare_data(todo)
    tasks = tasks_of(todo, stack)
    checkpointing = None if checkpoint_every is None else Checkpointing.beside(store.path, checkpoint_every)
    task_ids = {run_id: ids for ids in map(run_ids_of, tasks) for run_id in ids}
    failures = []
    bar = tqdm(total=len(specs), initial=len(specs) - len(todo), desc="runs", disable=not progress)

    def show(running: list[Progress]) -> None:
        bar.set_postfix_str(", ".join(map(str, running)))

    def store_outcome(outcome: Outcome) -> None:
        """Called by the backend with signals deferred: a run that finished is stored, whatever comes."""
        if isinstance(outcome, Failure):
            store.put_failure(RunSpec.from_dict(outcome.spec).run_id, KIND, outcome)
            failures.append(outcome)
        else:
            spec_values, metrics, curves, env = outcome
            run_id = RunSpec.from_dict(spec_values).run_id
            store.put(run_id, KIND, spec_values, metrics, curves, env)
            ids = task_ids[run_id]
            if checkpointing is not None and all(map(store.has, ids)):
                checkpointing.of(ids).remove()
        bar.update(1)

    execution = Execution(backend, workers, threads, address, device, gpus_per_run, checkpointing)
    runner(tasks, execution, store_outcome, show)
    bar.close()
    return len(todo), failures


def default_workers(threads: int) -> int:
    return max(1, (os.cpu_count() or 1) // threads)


def _worker(
    connection: Connection, threads: int, device: str, checkpointing: Checkpointing | None = None
) -> None:
    """A local worker process: runs the tasks it is sent, one at a time, and sends back the ``Progress``
    of each, then its outcomes. Ctrl-C reaches the whole process group; the driver handles it and stops
    the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(EOFError, BrokenPipeError):  # the driver is gone (even killed): so is the work
        while (task := connection.recv()) is not None:
            connection.send(_attempt(task, threads, device, throttled(connection.send), checkpointing))


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    connection: Connection
    task: Task | None = None  # what it is running now
    progress: Progress | None = None  # how far it is, as it last said


def _run_local(todo: list[Task], execution: Execution, sink: Sink, show: Show) -> None:
    """Worker processes (spawned: no fork of a threaded torch), each handed one task at a time; with
    ``device="cuda"`` and several GPUs, worker i computes on GPU i (one worker per visible GPU).

    The driver knows which runs each worker holds, so a worker that dies (SIGKILL, out of memory) fails
    exactly those; a fresh worker takes its place and the grid goes on. Only the wait for workers can
    be interrupted (Ctrl-C, SIGTERM): what has arrived is stored first. On any exit the workers stop.
    """
    context = multiprocessing.get_context("spawn")
    queue = deque(todo)
    devices = worker_devices(execution)
    size = min(execution.workers or len(devices) or default_workers(execution.threads), len(todo))

    def start(index: int) -> _Worker:
        ours, theirs = context.Pipe()
        device = devices[index % len(devices)] if devices else execution.device
        # not a daemon: its run may start DataLoader workers of its own; it ends with the driver's pipe
        args = (theirs, execution.threads, device, execution.checkpointing)
        process = context.Process(target=_worker, args=args)
        process.start()
        theirs.close()
        return _Worker(process, ours)

    pool: list[_Worker] = []
    try:
        pool.extend(start(index) for index in range(size))
        while queue or any(w.task is not None for w in pool):
            for index, worker in enumerate(pool):
                if worker.task is None and queue:
                    if not worker.process.is_alive():  # died between runs: nothing of ours was lost
                        _stop(worker)
                        pool[index] = worker = start(index)
                    worker.task, worker.progress = queue.popleft(), None
                    worker.connection.send(worker.task)
            busy = [w for w in pool if w.task is not None]
            wait([*(w.connection for w in busy), *(w.process.sentinel for w in busy)])
            with signals_deferred():
                for index, worker in enumerate(pool):
                    outcomes = _collect(worker)
                    if outcomes is None:
                        continue
                    worker.task = None
                    if not worker.process.is_alive():
                        worker.connection.close()
                        pool[index] = start(index)
                    for outcome in outcomes:
                        sink(outcome)
            show([w.progress for w in pool if w.task is not None and w.progress is not None])
    finally:
        for worker in pool:
            _stop(worker)


def _collect(worker: _Worker) -> list[Outcome] | None:
    """The outcomes of the worker's task if they are there now: its results, or a ``Failure`` of each
    of its runs if it died. A ``Progress`` message is kept on the worker."""
    if worker.task is None:
        return None
    try:
        if worker.connection.poll():
            message = worker.connection.recv()
            if not isinstance(message, Progress):
                return message
            worker.progress = message
            return None
    except (EOFError, OSError):
        pass
    else:
        if worker.process.is_alive():
            return None
    worker.process.join()
    died = f"the worker process died ({_death(worker.process.exitcode)})"
    return [Failure(values, died, "") for values in worker.task]


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return f"killed by {name}" + (", out of memory?" if name == "SIGKILL" else "")
    return f"exit code {exitcode}"


def _stop(worker: _Worker) -> None:
    if worker.process.is_alive():
        with contextlib.suppress(OSError, BrokenPipeError):
            worker.connection.send(None)
        worker.process.join(timeout=0 if worker.task is not None else 5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
    worker.connection.close()


def _run_ray(todo: list[Task], execution: Execution, sink: Sink, show: Show) -> None:
    """One Ray task per task of runs; the driver collects results as they finish and writes them. A task
    that raises, or whose worker dies, is a ``Failure`` of each of its runs. Ray tasks do not report
    their steps (``show`` is not called)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray backend needs Ray: pip install 'zerosiam[ray]'") from None
    started_here = not ray.is_initialized()
    threads, address = execution.threads, execution.address
    if started_here:
        ray.init(
            address=address,
            num_cpus=None if address else (execution.workers or default_workers(threads)) * threads,
            include_dashboard=False,
            log_to_driver=False,
        )
    try:
        # with GPU resources, Ray makes the run's GPU the task's only visible one: "cuda" is that GPU
        device = "cuda" if execution.gpus_per_run > 0 else execution.device
        task = ray.remote(num_cpus=threads, num_gpus=execution.gpus_per_run, max_retries=0)(_attempt)
        tasks = {task.remote(runs, threads, device, None, execution.checkpointing): runs for runs in todo}
        refs = list(tasks)
        while refs:
            done, refs = ray.wait(refs, num_returns=1)
            with signals_deferred():
                try:
                    outcomes = ray.get(done[0])
                except Exception as error:  # the task's worker died (ray.exceptions.WorkerCrashedError, ...)
                    outcomes = [Failure.of(values, error) for values in tasks[done[0]]]
                for outcome in outcomes:
                    sink(outcome)
    finally:
        if started_here:
            ray.shutdown()


def _run_inline(todo: list[Task], execution: Execution, sink: Sink, show: Show) -> None:
    """Tasks one after another in this process: for debugging and tests (peak memory is the process's)."""
    report = throttled(lambda progress: show([progress]))
    for task in todo:
        outcomes = _attempt(task, execution.threads, execution.device, report, execution.checkpointing)
        with signals_deferred():
            for outcome in outcomes:
                sink(outcome)
        show([])


def worker_devices(execution: Execution) -> list[str]:
    """One device per local worker when the grid runs on every visible GPU (``device="cuda"`` or
    ``"auto"`` with several GPUs); empty when every worker uses ``execution.device``."""
    import torch

    if execution.device in ("cuda", "auto") and torch.cuda.device_count() > 1:
        return [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return []


BACKENDS = {"local": _run_local, "ray": _run_ray, "inline": _run_inline}
