"""Grids: a YAML file or CLI flags expand into run specs, which execute locally or on Ray.

Each run executes in a fresh worker process (a local pool sized to the cores, or a Ray task), and only the
driver writes to the SQLite store, one atomic row per finished run. A grid that is interrupted, even by
``kill -9``, therefore resumes by skipping the runs whose rows exist: none is lost, none is duplicated.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from zerosiam import corruptions
from zerosiam.bench.runner import Result, RunSpec, run
from zerosiam.bench.store import ResultStore
from zerosiam.corruptions.datasets import load_corrupted
from zerosiam.methods import get_recipe
from zerosiam.protocols import MIXED

KIND = "vision"


@dataclass
class Grid:
    """The axes of a grid; every combination is one run. ``sweep`` maps an hparam to a list of values
    (e.g. ``{"lr": [1e-3, 1e-4], "predictor_lr": [1e-2]}``), crossed with every method that accepts it."""

    models: list[str]
    methods: list[str]
    corruptions: list[str] = field(default_factory=lambda: list(corruptions.BENCHMARK))
    severities: list[int] = field(default_factory=lambda: [5])
    protocols: list[str] = field(default_factory=lambda: ["mild"])
    seeds: list[int] = field(default_factory=lambda: [0])
    dataset: str = "cifar10c"
    batch_size: int = 64
    limit: int | None = None
    hparams: dict[str, Any] = field(default_factory=dict)
    sweep: dict[str, list[Any]] = field(default_factory=dict)

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

    def specs(self) -> list[RunSpec]:
        """Every run of the grid, in a stable order; a method without a predictor ignores η_h."""
        out = []
        axes = (self.models, self.protocols, self.severities, self.seeds, self.methods, self._sweep_points())
        for model, protocol, severity, seed, method, point in itertools.product(*axes):
            hparams = {**self.hparams, **point}
            if get_recipe(method).asymmetry is None:
                hparams.pop("predictor_lr", None)
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
                        hparams=hparams,
                    )
                )
        return _unique(out)

    def _sweep_points(self) -> list[dict[str, Any]]:
        names = sorted(self.sweep)
        return [
            dict(zip(names, values, strict=True))
            for values in itertools.product(*(self.sweep[n] for n in names))
        ]


def _unique(specs: Iterable[RunSpec]) -> list[RunSpec]:
    seen: dict[str, RunSpec] = {}
    for spec in specs:
        seen.setdefault(spec.run_id, spec)
    return list(seen.values())


def _execute(spec_values: dict[str, Any], threads: int) -> tuple[dict[str, Any], dict, dict, dict]:
    """Worker entry point: one run with ``threads`` intra-op threads (picklable, for pools and Ray)."""
    import torch

    torch.set_num_threads(threads)
    result: Result = run(RunSpec.from_dict(spec_values))
    return spec_values, result.metrics, result.curves, result.env


def prepare_data(specs: Iterable[RunSpec]) -> None:
    """Make every corrupted split the grid needs before workers start, so no two workers build one."""
    needed = set()
    for spec in specs:
        names = corruptions.BENCHMARK if spec.corruption == MIXED else (spec.corruption,)
        needed.update((spec.dataset, name, spec.severity) for name in names)
    for dataset, name, severity in tqdm(sorted(needed), desc="data", leave=False):
        load_corrupted(dataset, name, severity, progress=False)


def pending(specs: Iterable[RunSpec], store: ResultStore) -> list[RunSpec]:
    return [spec for spec in specs if not store.has(spec.run_id)]


def execute(
    specs: list[RunSpec],
    store: ResultStore,
    backend: str = "local",
    workers: int | None = None,
    threads: int = 1,
    address: str | None = None,
    progress: bool = True,
) -> int:
    """Run the specs that have no row yet; return how many ran. Rows are written as runs finish."""
    todo = pending(specs, store)
    if not todo:
        return 0
    prepare_data(todo)
    runner = BACKENDS.get(backend)
    if runner is None:
        raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS)}")
    bar = tqdm(total=len(specs), initial=len(specs) - len(todo), desc="runs", disable=not progress)
    for spec_values, metrics, curves, env in runner(todo, workers, threads, address):
        store.put(RunSpec.from_dict(spec_values).run_id, KIND, spec_values, metrics, curves, env)
        bar.update(1)
    bar.close()
    return len(todo)


def default_workers(threads: int) -> int:
    return max(1, (os.cpu_count() or 1) // threads)


def _run_local(
    todo: list[RunSpec], workers: int | None, threads: int, _address: str | None
) -> Iterator[tuple]:
    """A spawn-based pool (no fork of a threaded torch); each run resets the peak-memory mark it reports."""
    context = multiprocessing.get_context("spawn")
    size = min(workers or default_workers(threads), len(todo))
    with ProcessPoolExecutor(size, mp_context=context) as pool:
        futures = {pool.submit(_execute, spec.as_dict(), threads) for spec in todo}
        while futures:
            done, futures = wait(futures, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()


def _run_ray(todo: list[RunSpec], workers: int | None, threads: int, address: str | None) -> Iterator[tuple]:
    """One Ray task per run; the driver collects results as they finish and writes them."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray backend needs Ray: pip install 'zerosiam[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(
            address=address,
            num_cpus=None if address else (workers or default_workers(threads)) * threads,
            include_dashboard=False,
            log_to_driver=False,
        )
    try:
        task = ray.remote(num_cpus=threads, max_retries=2)(_execute)
        refs = [task.remote(spec.as_dict(), threads) for spec in todo]
        while refs:
            done, refs = ray.wait(refs, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started_here:
            ray.shutdown()


def _run_inline(todo: list[RunSpec], _workers: int | None, threads: int, _address: str | None) -> Iterator:
    """Runs one after another in this process: for debugging and tests (peak memory is the process's)."""
    for spec in todo:
        yield _execute(spec.as_dict(), threads)


BACKENDS = {"local": _run_local, "ray": _run_ray, "inline": _run_inline}
