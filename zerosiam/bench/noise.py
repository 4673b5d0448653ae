"""How far one spec's number moves, and the one rule that says when a difference is beyond it.

An online run amplifies rounding: two executions of one spec (another machine, a stack of streams, a
replica of ``zerosiam.bench.replica``) can end points apart. The noise study stores replicas of some runs
(``docs/results/grids/noise_replicas.yaml``); from them and from the seeds this module measures, per model
and protocol, two spreads of accuracy in points:

* the **replica spread**: over the executions of one spec (the run and its replicas), the range and the
  sample std; pooled over the cell's replicated runs as the root mean of their variances;
* the **seed spread**: over seeds 0, 1, 2 of the same runs (method, corruption, rates), the same two.

**The noise rule** (``docs/RESULTS.md``, "How a verdict is labelled"): the noise of one run of an adapting
method is ``σ``, the pooled replica std of its model and protocol (where that protocol has no replicas,
the largest σ measured on the model at the same batch size (batch 1 or a batch; the replicas show that
this decides it), else on the model, else on any model at that batch size); a frozen model (NoAdapt)
has none. A mean over ``n`` runs (corruptions × seeds) has ``σ / √n``, the executions of
different streams rounding apart independently. A difference between two results counts only when it is
larger than ``NOISE_BANDS`` times the noise of the difference, ``√(σ_a² + σ_b²)``, besides whatever floor
the caller adds (the seeds' stds, a point).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zerosiam.bench.batches import STACKED_PROTOCOLS
from zerosiam.bench.spec import without_later_defaults
from zerosiam.bench.store import run_id_for
from zerosiam.bench.tables import BASELINE, select_rows

NOISE_BANDS = 2.0  # a difference counts beyond two standard deviations of the difference (about 95 %)
REPLICAS_WANTED = 3  # executions of one spec a cell's replica spread needs (the run and two replicas)


@dataclass(frozen=True)
class Spread:
    """Accuracy spreads in points over groups of runs: the largest range and the pooled std."""

    groups: int
    largest_range: float
    pooled_std: float

    @classmethod
    def of(cls, groups: Sequence[Sequence[float]]) -> Spread | None:
        """The spread of ``groups`` of accuracies (fractions) with two or more members each; None if none."""
        groups = [group for group in groups if len(group) >= 2]
        if not groups:
            return None
        ranges = [100 * (max(group) - min(group)) for group in groups]
        variances = [statistics.variance([100 * value for value in group]) for group in groups]
        return cls(len(groups), max(ranges), math.sqrt(statistics.fmean(variances)))

    def text(self) -> str:
        return f"{self.largest_range:.2f} / {self.pooled_std:.2f} ({self.groups})"


@dataclass(frozen=True)
class NoiseCell:
    """One model × protocol: its replica spread (runs with at least ``REPLICAS_WANTED`` executions) and
    the seed spread of the same runs."""

    model: str
    protocol: str
    replicas: Spread | None
    seeds: Spread | None


@dataclass
class Noise:
    """The noise rule over a store's replicas: each model × protocol's σ, with its fallbacks."""

    sigma: dict[tuple[str, str], float] = field(default_factory=dict)

    def of_run(self, model: str, protocol: str, method: str) -> float:
        """σ of one run, in points: 0 for NoAdapt; the cell's, else the largest of the model's protocols
        of the same batch size, else the model's largest, else the largest of any model at that batch size,
        else any largest."""
        if method == BASELINE or not self.sigma:
            return 0.0
        if (model, protocol) in self.sigma:
            return self.sigma[model, protocol]
        batch_one = protocol in STACKED_PROTOCOLS
        same_batch = {key: v for key, v in self.sigma.items() if (key[1] in STACKED_PROTOCOLS) == batch_one}
        for alike in (
            [v for (m, _), v in same_batch.items() if m == model],
            [v for (m, _), v in self.sigma.items() if m == model],
            list(same_batch.values()),
        ):
            if alike:
                return max(alike)
        return max(self.sigma.values())

    def band(
        self, model: str, protocol: str, methods: tuple[str, str], runs: tuple[int, int] = (1, 1)
    ) -> float:
        """The smallest difference that counts between two results of ``model`` under ``protocol``: the
        means over ``runs`` runs of ``methods``."""
        variance = sum(
            self.of_run(model, protocol, method) ** 2 / max(count, 1)
            for method, count in zip(methods, runs, strict=True)
        )
        return NOISE_BANDS * math.sqrt(variance)

    def beyond(
        self,
        difference: float,
        model: str,
        protocol: str,
        methods: tuple[str, str],
        runs: tuple[int, int] = (1, 1),
    ) -> bool:
        """Whether ``difference`` (points) is beyond the noise of the two results it compares."""
        return abs(difference) > self.band(model, protocol, methods, runs)


def noise_cells(rows: Iterable[Mapping[str, Any]]) -> list[NoiseCell]:
    """Every model × protocol with replicated runs: the replica spread of the runs with at least
    ``REPLICAS_WANTED`` executions and the seed spread (replica 0) of the same runs, sorted."""
    rows = select_rows(rows, replica=None)
    executions: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    by_seed: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        spec = row["spec"]
        executions[_key(spec, "replica")].append(row)
        if spec.get("replica", 0) == 0:
            by_seed[_key(spec, "replica", "seed")].append(row["metrics"]["accuracy"])
    replicated: dict[tuple[str, str], list[list[float]]] = defaultdict(list)
    seeds: dict[tuple[str, str], list[list[float]]] = defaultdict(list)
    for members in executions.values():
        if len(members) < REPLICAS_WANTED:
            continue
        spec = members[0]["spec"]
        cell = (spec["model"], spec["protocol"])
        replicated[cell].append([row["metrics"]["accuracy"] for row in members])
        seeds[cell].append(by_seed[_key(spec, "replica", "seed")])
    return [
        NoiseCell(model, protocol, Spread.of(replicated[model, protocol]), Spread.of(seeds[model, protocol]))
        for model, protocol in sorted(replicated)
    ]


def noise_of(rows: Iterable[Mapping[str, Any]]) -> Noise:
    """The noise rule measured on ``rows`` (a store's rows, replicas included)."""
    return Noise({(c.model, c.protocol): c.replicas.pooled_std for c in noise_cells(rows) if c.replicas})


def to_markdown(cells: Sequence[NoiseCell]) -> str:
    """The noise table: per model × protocol, the replica and seed spreads and the band of one run."""
    lines = [
        "Accuracy spread in points: largest range / pooled std (runs). Replicas: the executions of one "
        f"spec (the run and its replicas, {REPLICAS_WANTED} or more); seeds: seeds 0–2 of the same runs. "
        f"A single run's difference from NoAdapt counts beyond {NOISE_BANDS:g} × the replica std.",
        "",
        "| model | protocol | replicas | seeds | band of one run |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for cell in cells:
        replicas = cell.replicas.text() if cell.replicas else "–"
        seeds = cell.seeds.text() if cell.seeds else "–"
        band = f"{NOISE_BANDS * cell.replicas.pooled_std:.2f}" if cell.replicas else "–"
        lines.append(f"| {cell.model} | {cell.protocol} | {replicas} | {seeds} | {band} |")
    return "\n".join(lines) + "\n"


def _key(spec: Mapping[str, Any], *without: str) -> str:
    """A spec's identity without the fields ``without`` (replica, seed): what its executions share."""
    kept = {key: value for key, value in without_later_defaults(spec).items() if key not in without}
    return run_id_for(kept)
