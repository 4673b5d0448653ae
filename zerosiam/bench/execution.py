"""Executing a grid's runs: the ones with no stored result, on the backend an ``Execution`` names.

Each run executes in a worker (a local process or a Ray task), and only the driver writes to the SQLite
store, one atomic row per finished run. A grid that is interrupted, even by ``kill -9``, therefore resumes
by skipping the runs whose rows exist: none is lost, none is duplicated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tqdm import tqdm

from zerosiam import corruptions
from zerosiam.bench import datasets
from zerosiam.bench.backends import BACKENDS
from zerosiam.bench.checkpoint import Checkpointing
from zerosiam.bench.spec import KIND, RunSpec
from zerosiam.bench.store import Failure, ResultStore
from zerosiam.bench.tasks import Execution, Outcome, Progress, run_ids_of, tasks_of
from zerosiam.corruptions.datasets import load_corrupted
from zerosiam.protocols import MIXED

__all__ = ["Execution", "execute", "pending", "prepare_data"]


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
    specs: list[RunSpec], store: ResultStore, execution: Execution | None = None
) -> tuple[int, list[Failure]]:
    """Run the specs that have no row yet, writing each result as it finishes and each failure as it
    happens; returns how many ran and the failures. A failed run does not stop the others.

    ``execution`` (default: a local pool) says where and how: with ``stack``, batch-size-1 runs that differ
    only in their corruption and seed run as streams of one adapter (``tasks_of``): the same results, up to
    float rounding, in a fraction of the time. Every ``checkpoint_every`` seconds (None: never) a task saves
    its progress beside the store, so that a grid stopped part-way goes on with its unfinished runs from
    there; a task's checkpoint is removed once all its runs are stored."""
    execution = execution or Execution()
    todo = pending(specs, store)
    if not todo:
        return 0, []
    backend = BACKENDS.get(execution.backend)
    if backend is None:
        raise ValueError(f"unknown backend {execution.backend!r}; choose one of {sorted(BACKENDS)}")
    prepare_data(todo)
    tasks = tasks_of(todo, execution.stack)
    every = execution.checkpoint_every
    checkpointing = None if every is None else Checkpointing.beside(store.path, every)
    bar = tqdm(total=len(specs), initial=len(specs) - len(todo), desc="runs", disable=not execution.progress)
    task_of = {run_id: ids for ids in map(run_ids_of, tasks) for run_id in ids}
    driver = _Driver(store, task_of, checkpointing, bar)
    backend(tasks, execution, driver.store_outcome, driver.show, checkpointing)
    bar.close()
    return len(todo), driver.failures


@dataclass
class _Driver:
    """What the driver does with what its backend hands it: store each outcome, remove a task's checkpoint
    once all its runs are stored, and move the bar."""

    store: ResultStore
    task_ids: dict[str, tuple[str, ...]]  # each run's task, as its runs' ids
    checkpointing: Checkpointing | None
    bar: tqdm
    failures: list[Failure] = field(default_factory=list)

    def store_outcome(self, outcome: Outcome) -> None:
        """Called by the backend with signals deferred: a run that finished is stored, whatever comes."""
        if isinstance(outcome, Failure):
            self.store.put_failure(RunSpec.from_dict(outcome.spec).run_id, KIND, outcome)
            self.failures.append(outcome)
        else:
            spec_values, metrics, curves, env = outcome
            run_id = RunSpec.from_dict(spec_values).run_id
            self.store.put(run_id, KIND, spec_values, metrics, curves, env)
            ids = self.task_ids[run_id]
            if self.checkpointing is not None and all(map(self.store.has, ids)):
                self.checkpointing.of(ids).remove()
        self.bar.update(1)

    def show(self, running: list[Progress]) -> None:
        """The running tasks' progress beside the bar."""
        self.bar.set_postfix_str(", ".join(map(str, running)))
