"""Executing a grid's runs: the ones with no stored result, on the backend an ``Execution`` names.

Each run executes in a worker (a local process or a Ray task), and only the driver writes to the SQLite
store, one atomic row per finished run. A grid that is interrupted, even by ``kill -9``, therefore resumes
by skipping the runs whose rows exist: none is lost, none is duplicated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm import tqdm

from zerosiam import corruptions
from zerosiam.bench import datasets
from zerosiam.bench.backends import BACKENDS
from zerosiam.bench.checkpoint import Checkpointing
from zerosiam.bench.device import describe_device, resolve_device
from zerosiam.bench.environment import environment
from zerosiam.bench.guard_goals import cell_key, set_aside
from zerosiam.bench.spec import KIND, NO_GUARD, RunSpec
from zerosiam.bench.store import Failure, ResultStore
from zerosiam.bench.tables import device_of
from zerosiam.bench.tasks import Execution, Outcome, Progress, run_ids_of, tasks_of
from zerosiam.corruptions.datasets import SEVERITIES, load_corrupted
from zerosiam.parts.guards import AUTO, never_acts
from zerosiam.protocols import SEQUENCES
from zerosiam.protocols.build import CCC, GRADUAL

__all__ = ["Execution", "execute", "pending", "prepare_data"]


def prepare_data(specs: Iterable[RunSpec]) -> None:
    """Make every corrupted split the grid needs before workers start, so no two workers build one."""
    needed = set()
    for spec in (s for s in specs if datasets.is_cached(s.dataset)):  # folders on disk need no build
        needed.update(splits_of(spec))
    for dataset, name, severity in tqdm(sorted(needed), desc="data", leave=False):
        load_corrupted(dataset, name, severity, progress=False)


def splits_of(spec: RunSpec) -> set[tuple[str, str, int]]:
    """The corrupted splits ``(dataset, corruption, severity)`` a run reads: a CCC stream corrupts clean
    images as it goes, the gradual one reads every severity."""
    if spec.protocol == CCC:
        return {(datasets.clean_source(spec.dataset), "clean", 1)}
    names = corruptions.BENCHMARK if spec.corruption in SEQUENCES else (spec.corruption,)
    severities = SEVERITIES if spec.protocol == GRADUAL else (spec.severity,)
    return {(spec.dataset, name, severity) for name in names for severity in severities}


def pending(
    specs: Iterable[RunSpec], store: ResultStore, remake: str | None = None, here: str | None = None
) -> list[RunSpec]:
    """The runs with no stored result (never run, interrupted, or failed before), less those that are
    their stored unguarded run (``same_as_unguarded``); with ``remake``, also the stored runs made on that
    device (``made_on``), to be made again here, guarded runs included: a guard cell is judged only on
    runs of one device. With ``here`` (this machine's device, ``device_here``), also the stored runs of the
    guard cells that cannot be judged on one device (``guard_goals.set_aside``) not made here."""
    specs = list(specs)
    off = off_device(specs, store, here) if here is not None else set()
    return [
        spec
        for spec in specs
        if (not store.has(spec.run_id) and not same_as_unguarded(spec, store))
        or (remake is not None and store.has(spec.run_id) and made_on(store.get(spec.run_id), remake))
        or spec.run_id in off
    ]


def device_here(device: str) -> str:
    """The device a run made here on ``device`` (``--device``) records, as ``device_of`` names it."""
    return device_of({"env": environment() | describe_device(resolve_device(device))})  # as a run records


def off_device(specs: Sequence[RunSpec], store: ResultStore, here: str) -> set[str]:
    """The stored runs among ``specs`` of the guard cells set aside across devices, not made on ``here``:
    made again here, they bring each such cell onto this one device."""
    rows = {spec.run_id: store.get(spec.run_id) for spec in specs if store.has(spec.run_id)}
    aside = set_aside(rows.values(), {spec.guard for spec in specs})
    return {
        run_id for run_id, row in rows.items() if cell_key(row["spec"]) in aside and device_of(row) != here
    }


def made_on(row: Mapping[str, Any], device: str) -> bool:
    """Whether a stored run computed on ``device``: ``cpu`` or ``gpu`` (any), else a part of its device's
    name as ``device_of`` gives it (``H200``, ``AMD EPYC``), in any case."""
    computed = device_of(row)
    on_gpu = bool((row.get("env") or {}).get("gpu"))
    wanted = device.strip().lower()
    if wanted in ("cpu", "gpu"):
        return on_gpu == (wanted == "gpu")
    return wanted in computed.lower()


def same_as_unguarded(spec: RunSpec, store: ResultStore) -> bool:
    """Whether ``spec`` wears a guard that never acts on its unguarded run, stored in ``store``
    (``zerosiam.parts.guards.never_acts``): its run would be that run step for step, so it is not made,
    and the guards' report judges the guard on the unguarded run (``guard_goals``)."""
    if spec.guard == NO_GUARD:
        return False
    unguarded = replace(spec, guard=NO_GUARD).run_id
    return store.has(unguarded) and never_acts(spec.guard, store.get(unguarded)["metrics"])


def execute(
    specs: list[RunSpec],
    store: ResultStore,
    execution: Execution | None = None,
    remake: str | None = None,
    one_device: bool = False,
) -> tuple[int, list[Failure]]:
    """Run the specs that have no row yet, writing each result as it finishes and each failure as it
    happens; returns how many ran and the failures. A failed run does not stop the others.

    ``execution`` (default: a local pool) says where and how: with ``stack``, batch-size-1 runs that differ
    only in their corruption and seed run as streams of one adapter (``tasks_of``): the same results, up to
    float rounding, in a fraction of the time. Every ``checkpoint_every`` seconds (None: never) a task saves
    its progress beside the store, so that a grid stopped part-way goes on with its unfinished runs from
    there; a task's checkpoint is removed once all its runs are stored. The unguarded runs go first: a
    guarded run that its unguarded run shows to be that run (``same_as_unguarded``) is not made. Where the
    grid wears ``auto``, its unguarded runs are watched by it (``Execution.watch``), which is how they show
    it: a watch costs a run ``auto``'s probe, where the run with ``auto`` would cost a whole run.

    ``remake`` (a device, as ``made_on`` reads it) makes the grid's runs stored from that device again
    on this one, each replacing its stored row: the way to bring a table or a guard cell onto one device.
    A remake stopped part-way and started again makes again what it had already remade, unless the device
    named is not this one. ``one_device`` makes again here only the runs of the guard cells that cannot
    be judged on one device, those not made here (``off_device``): the unguarded runs first, and a guard
    that a remade unguarded run shows never acting is judged on it, its own run not made again. Either
    way, a guarded run is not remade where its unguarded run shows it to be that run."""
    execution = execution or Execution()
    here = device_here(execution.device) if one_device else None
    todo = pending(specs, store, remake, here)
    if not todo:
        return 0, []
    execution = replace(execution, watch=execution.watch or any(spec.guard == AUTO for spec in specs))
    backend = BACKENDS.get(execution.backend)
    if backend is None:
        raise ValueError(f"unknown backend {execution.backend!r}; choose one of {sorted(BACKENDS)}")
    prepare_data(todo)
    every = execution.checkpoint_every
    checkpointing = None if every is None else Checkpointing.beside(store.path, every)
    bar = tqdm(total=len(specs), initial=len(specs) - len(todo), desc="runs", disable=not execution.progress)
    remade = {spec.run_id for spec in todo if store.has(spec.run_id)}
    driver = _Driver(store, {}, checkpointing, bar, remade)
    ran = 0
    for runs in _unguarded_first(todo):
        # less the guarded runs the first round's unguarded runs turned out to be (and the remade ones)
        left = [spec for spec in runs if spec.run_id in remade and not same_as_unguarded(spec, store)]
        left += pending([spec for spec in runs if spec.run_id not in remade], store)
        bar.update(len(runs) - len(left))
        if not left:
            continue
        tasks = tasks_of(left, execution.stack)
        driver.task_ids.update({run_id: ids for ids in map(run_ids_of, tasks) for run_id in ids})
        backend(tasks, execution, driver.store_outcome, driver.show, checkpointing)
        ran += len(left)
    bar.close()
    return ran, driver.failures


def _unguarded_first(specs: list[RunSpec]) -> list[list[RunSpec]]:
    """The runs in two rounds: the guarded runs whose unguarded run is among them last, so that where it
    shows the guard never acts, the guarded run is not made (``pending``)."""
    unguarded = {spec.run_id for spec in specs if spec.guard == NO_GUARD}
    waits = [spec.guard != NO_GUARD and replace(spec, guard=NO_GUARD).run_id in unguarded for spec in specs]
    first = [spec for spec, wait in zip(specs, waits, strict=True) if not wait]
    later = [spec for spec, wait in zip(specs, waits, strict=True) if wait]
    return [first, later] if later else [first]


@dataclass
class _Driver:
    """What the driver does with what its backend hands it: store each outcome, remove a task's checkpoint
    once all its runs are stored, and move the bar."""

    store: ResultStore
    task_ids: dict[str, tuple[str, ...]]  # each run's task, as its runs' ids
    checkpointing: Checkpointing | None
    bar: tqdm
    remade: set[str] = field(default_factory=set)  # stored runs made again: their new row replaces the old
    failures: list[Failure] = field(default_factory=list)

    def store_outcome(self, outcome: Outcome) -> None:
        """Called by the backend with signals deferred: a run that finished is stored, whatever comes."""
        if isinstance(outcome, Failure):
            self.store.put_failure(RunSpec.from_dict(outcome.spec).run_id, KIND, outcome)
            self.failures.append(outcome)
        else:
            spec_values, metrics, curves, env = outcome
            run_id = RunSpec.from_dict(spec_values).run_id
            self.store.put(run_id, KIND, spec_values, metrics, curves, env, replace=run_id in self.remade)
            ids = self.task_ids[run_id]
            if self.checkpointing is not None and all(map(self.store.has, ids)):
                self.checkpointing.of(ids).remove()
        self.bar.update(1)

    def show(self, running: list[Progress]) -> None:
        """The running tasks' progress beside the bar."""
        self.bar.set_postfix_str(", ".join(map(str, running)))
