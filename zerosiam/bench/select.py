"""Choosing learning rates without looking at the benchmark.

``select_on_held_out`` sweeps learning rates on the four extra corruptions only (speckle noise, Gaussian
blur, spatter, saturate), a held-out set fair to the benchmark (``docs/benchmark.md``, "Choosing learning
rates without the benchmark"), and picks the best mean online accuracy; the 15 benchmark corruptions are
never touched. Candidates within the selection's noise of the best (``zerosiam.bench.noise``: two means
over the four corruptions) are a tie, and a tie goes to the smallest rate (:func:`tie_broken`): a larger
rate that wins by less than rounding moves one spec's number is a bet on that rounding, and the larger
rate is the one that collapses. A selection made wearing a guard (``guard="auto"``) is recorded apart:
it answers which rate to take with that guard, while a grid's ``rates: selected`` always takes the
unguarded choice, so that a guard is judged at the rates its method would run at without it.

``data_free_predictor_lr`` is the paper's appendix recipe for η_h: adapt on pure Gaussian-noise images
and keep the η_h under which the model's mean prediction entropy changes least, i.e. the rate that is
least disruptive when there is nothing to learn.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import zerosiam
from zerosiam import corruptions
from zerosiam.bench.execution import Execution, execute
from zerosiam.bench.grid import Grid, scaled
from zerosiam.bench.noise import noise_of
from zerosiam.bench.spec import KIND, NO_GUARD, RunSpec
from zerosiam.bench.store import ResultStore, run_id_for
from zerosiam.data.tensors import to_input
from zerosiam.methods import get_recipe
from zerosiam.parts.losses import entropy
from zerosiam.protocols.build import pure_noise

SELECTION_KIND = "lr_selection"
DATA_FREE_KIND = "data_free_selection"  # the data-free η_h choices: |ΔH| per candidate, not accuracies


@dataclass(frozen=True)
class Choice:
    method: str
    hparams: dict[str, Any]
    accuracy: float
    table: dict[str, float]  # every candidate's mean accuracy, keyed by its hparams as text


def select_on_held_out(
    model: str,
    methods: list[str],
    sweep: dict[str, list[float]],
    store: ResultStore,
    *,
    dataset: str = "cifar10c",
    severity: int = 5,
    protocol: str = "mild",
    limit: int | None = None,
    seed: int = 0,
    guard: str = NO_GUARD,
    **execution: Any,
) -> list[Choice]:
    """Run the sweep on the extra corruptions, every method wearing ``guard``, record and return the best
    hparams of each method (the best mean online accuracy over the four; candidates within the store's
    noise of it are a tie, which goes to the smallest rate: :func:`tie_broken`). ``execution`` holds the
    fields of an ``Execution`` (backend, workers, device, ...)."""
    grid = Grid(
        models=[model],
        methods=methods,
        corruptions=list(corruptions.EXTRA),
        severities=[severity],
        protocols=[protocol],
        seeds=[seed],
        dataset=dataset,
        limit=limit,
        sweep=sweep,
        guards=[guard],
    )
    specs = grid.specs()
    assert not {s.corruption for s in specs} & set(corruptions.BENCHMARK)  # held out by construction
    _, failures = execute(specs, store, Execution(**execution))
    if failures:
        raise RuntimeError(
            f"{len(failures)} selection run(s) failed, e.g. {failures[0].error}; see the store"
        )
    wanted = {s.run_id for s in specs}
    accuracies: dict[tuple[str, str], list[float]] = defaultdict(list)
    hparams_of: dict[str, dict[str, Any]] = {}
    for row in store.rows(KIND):
        if row["run_id"] in wanted:
            key = _label(row["spec"]["hparams"])
            hparams_of[key] = row["spec"]["hparams"]
            accuracies[(row["spec"]["method"], key)].append(row["metrics"]["accuracy"])
    noise = noise_of(store.rows(KIND))
    choices = []
    for method in methods:
        listed = dict.fromkeys(_label(s.hparams) for s in specs if s.method == method)
        table = {key: float(np.mean(accuracies[method, key])) for key in listed}
        runs = len(corruptions.EXTRA)
        best = tie_broken(table, noise.band(model, protocol, (method, method), (runs, runs)))
        choice = Choice(method, hparams_of[best], table[best], table)
        _record(store, model, dataset, severity, protocol, limit, seed, guard, choice)
        choices.append(choice)
    return choices


def tied(table: dict[str, float], band: float) -> list[str]:
    """The candidates (labels of ``table``: mean accuracies, fractions) within ``band`` points of the
    best, the best included, in the order of their rates."""
    best = max(table.values())
    return sorted((key for key, value in table.items() if 100 * (best - value) <= band), key=_rates)


def tie_broken(table: dict[str, float], band: float) -> str:
    """The chosen candidate: the smallest rate among those :func:`tied` with the best."""
    return tied(table, band)[0]


def _rates(label: str) -> tuple[float, ...]:
    """A candidate's rates from its label (``lr_scale=0.3``; ``lr=1e-3, predictor_lr=0.01``), in the
    label's order of options: what "the smaller rate" compares."""
    if label == "defaults":
        return ()
    return tuple(float(part.partition("=")[2]) for part in label.split(", "))


def _label(hparams: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(hparams.items())) or "defaults"


def _record(
    store: ResultStore,
    model: str,
    dataset: str,
    severity: int,
    protocol: str,
    limit: int | None,
    seed: int,
    guard: str,
    choice: Choice,
) -> None:
    spec: dict[str, Any] = {
        "model": model,
        "dataset": dataset,
        "severity": severity,
        "protocol": protocol,
        "limit": limit,
        "seed": seed,
        "method": choice.method,
        "corruptions": list(corruptions.EXTRA),
        "candidates": sorted(choice.table),
    }
    if guard != NO_GUARD:  # an unguarded selection keeps the id it always had
        spec["guard"] = guard
    metrics = {"chosen": choice.hparams, "accuracy": choice.accuracy, "candidates": choice.table}
    store.put(run_id_for(spec), SELECTION_KIND, spec, metrics, {}, {}, replace=True)


def selected_hparams(store: ResultStore, model: str, dataset: str, method: str) -> dict[str, Any]:
    """The rates ``select-lr`` chose for ``method`` on ``model`` and ``dataset`` without a guard, read
    from the store.

    Raises a ``ValueError`` naming the command to run when there is no choice, and when the store holds
    several selections that disagree (say, made on two protocols): a table must say which it used.
    """
    return _chosen(store.rows(SELECTION_KIND), store.path, model, dataset, method)


def current_selections(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The selection ``rows`` that no other one supersedes. A selection is superseded by one of the same
    model, dataset and method whose candidates include all of its own and more: extending the candidates
    past a choice at the edge of the grid (``--lr-scale ...,30,100``) replaces the earlier choice."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return row["spec"]["model"], row["spec"]["dataset"], row["spec"]["method"], selection_guard(row)

    def candidates(row: dict[str, Any]) -> set[str]:
        return set(row["metrics"].get("candidates", ()))

    return [
        row
        for row in rows
        if not any(key(other) == key(row) and candidates(row) < candidates(other) for other in rows)
    ]


def selection_guard(row: dict[str, Any]) -> str:
    """The guard a selection's runs wore (``none`` for every selection recorded before guards)."""
    return row["spec"].get("guard", NO_GUARD)


def _chosen(rows: list[dict[str, Any]], path: Path, model: str, dataset: str, method: str) -> dict[str, Any]:
    """``selected_hparams`` over already-read selection ``rows`` of the store at ``path`` (the unguarded
    selections only)."""
    wanted = (model, dataset, method, NO_GUARD)
    chosen = {
        _label(row["metrics"]["chosen"]): row["metrics"]["chosen"]
        for row in current_selections(rows)
        if (*(row["spec"][k] for k in ("model", "dataset", "method")), selection_guard(row)) == wanted
    }
    if not chosen:
        raise ValueError(
            f"no learning rate selected for {method!r} on {model!r} ({dataset}) in {path}; "
            f"run `zerosiam select-lr --model {model} --methods {method} --db {path} ...` first"
        )
    if len(chosen) > 1:
        raise ValueError(
            f"{path} holds {len(chosen)} different selections for {method!r} on {model!r} "
            f"({dataset}): {sorted(chosen)}; keep one"
        )
    return next(iter(chosen.values()))


def grid_specs(grid: Grid, store: ResultStore) -> list[RunSpec]:
    """The grid's runs as they execute: with ``rates: selected``, each with the rates ``select-lr``
    recorded in ``store`` (a ``ValueError`` names a missing choice)."""
    specs = grid.specs()
    specs = with_selected_rates(specs, store) if grid.rates == "selected" else specs
    return scaled(specs, grid.rate_factors)


def with_selected_rates(specs: list[RunSpec], store: ResultStore) -> list[RunSpec]:
    """Each spec with the rates selected for its (model, dataset, method) added to its hparams; methods
    that take no rate (NoAdapt) are left alone. Options the spec sets itself win (an ablation keeps the
    selected rate of its method unless it sweeps the rate). The store's choices are read once."""
    rows = store.rows(SELECTION_KIND)
    out = []
    for spec in specs:
        if not get_recipe(spec.method).adapts:
            out.append(spec)
            continue
        chosen = _chosen(rows, store.path, spec.model, spec.dataset, spec.method)
        out.append(dataclasses.replace(spec, hparams={**chosen, **spec.hparams}))
    return out


def data_free_predictor_lr(
    model_name: str,
    candidates: list[float],
    *,
    lr: float | None = None,
    images: int = 6400,
    batch_size: int = 64,
    seed: int = 0,
    input_size: int | None = None,
    device: torch.device | str = "cpu",
    store: ResultStore | None = None,
) -> tuple[float, dict[float, float]]:
    """The η_h whose adaptation on Gaussian noise changes the mean prediction entropy least.

    Returns the chosen η_h and, for every candidate, |H_after − H_before| (nats) measured on the noise:
    ``images`` pure-noise images, the same the noise-prefix protocol streams. With a ``store``, the
    choice is recorded there (kind ``data_free_selection``) for ``zerosiam report --data-free``.
    """
    size = input_size or _input_size(model_name)
    pixels = torch.from_numpy(pure_noise(images, (size, size, 3), seed))
    batches = to_input(pixels.to(device)).split(batch_size)
    changes = {}
    for predictor_lr in candidates:
        adapter = zerosiam.adapt(
            zerosiam.load_model(model_name).to(device),
            "zerosiam",
            lr=lr,
            predictor_lr=predictor_lr,
            batch_size=batch_size,
        )
        before = _mean_entropy(adapter.model, batches)  # measured in the adapter's normalization mode
        for x in batches:
            adapter(x)
        changes[predictor_lr] = abs(_mean_entropy(adapter.model, batches) - before)
    chosen = min(changes, key=changes.get)
    if store is not None:
        spec = {"model": model_name, "lr": adapter.settings.lr, "images": images, "batch_size": batch_size,
                "seed": seed, "candidates": list(candidates)}  # fmt: skip
        metrics = {"chosen": chosen, "entropy_change": {f"{c:g}": change for c, change in changes.items()}}
        store.put(run_id_for(spec), DATA_FREE_KIND, spec, metrics, {}, {}, replace=True)
    return chosen, changes


def _mean_entropy(model: torch.nn.Module, batches: tuple[torch.Tensor, ...]) -> float:
    with torch.no_grad():
        return float(torch.cat([entropy(model(x)) for x in batches]).mean())


def _input_size(model_name: str) -> int:
    from zerosiam.zoo import MODELS

    entry = MODELS.get(model_name)
    return entry.input_size if entry is not None else 224
