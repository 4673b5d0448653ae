"""The one grid a reader takes in first: per scenario (protocol) and model, how far ZeroSiam is above or below
not adapting, and where it ranks among the adapting methods.

Every number comes from :func:`zerosiam.bench.tables.build_tables`, so the summary never disagrees with the
tables of the same runs: a method's score in a cell is its table line's average over the 15 benchmark
corruptions (the mean of its seed-means, blank unless every corruption is present) or, for the mixed
protocol, its ``Overall`` column, taken over the seeds that every method of the cell has complete. A cell is
only summarised when it is unambiguous: one dataset and severity, and one line per method; otherwise
:class:`AmbiguousCell` names the cell and what differs, and the caller narrows the rows (a grid, a method
list) rather than the summary silently picking one line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zerosiam.bench.names import DATASET_NAMES, method_name
from zerosiam.bench.noise import Noise
from zerosiam.bench.tables import (
    AVERAGE,
    BASELINE,
    MISSING,
    MIXED,
    OVERALL,
    Cell,
    build_tables,
    run_labels,
    select_rows,
)
from zerosiam.corruptions import BENCHMARK

TARGET = "zerosiam"
# Rows: the batch-64 streams, their one-image versions, then the harder scenarios. A protocol missing here
# (a new one) goes after these, alphabetically.
SCENARIOS: tuple[str, ...] = (
    "mild", "label_shift", "bs1", "label_shift_bs1", "mixed", "blind_spot", "noise_prefix", "epochs",
    "continual", "gradual", "ccc",
)  # fmt: skip
# The rubric of docs/RESULTS.md: a lead counts when it is at least COUNTS_AT points and larger than the two
# lines' seed standard deviations added, or at least COUNTS_AT_ONE_SEED points where one seed was run, and
# in either case beyond the two results' noise (``zerosiam.bench.noise``).
COUNTS_AT = 0.5
COUNTS_AT_ONE_SEED = 1.0
LEVEL = "≈"  # before a difference from NoAdapt that does not count
_ROUNDING = 1e-9  # so that a difference of exactly the bar, computed in floating point, still counts
CAPTION = (
    "ZeroSiam − NoAdapt on {scope}, in accuracy points: mean over the 15 corruptions and the seeds "
    "that every method of the cell has complete (for mixed, the whole stream's accuracy); (k/n) = "
    "ZeroSiam's rank among the n adapting methods with a complete result, (k–m/n) where the methods "
    f"ranked k to m are within a margin that does not count (under {COUNTS_AT} point or the seed stds "
    f"added; under {COUNTS_AT_ONE_SEED} with one seed; or within the noise of one spec's number); "
    f"{LEVEL} before a difference: within that margin of NoAdapt; "
    f"{MISSING} = no complete result for NoAdapt or ZeroSiam."
)


class AmbiguousCell(ValueError):
    """A (scenario, model) cell holds several lines of one method, or several datasets or severities:
    any one number for it would hide a choice, so the rows must be narrowed first."""


@dataclass(frozen=True)
class SummaryCell:
    """ZeroSiam − NoAdapt in points (``None`` when either lacks a complete result) and ZeroSiam's rank
    among the ``ranked`` adapting methods that have one: ``rank`` counts only the methods whose lead over it
    counts, ``lowest`` every method but those it leads by a margin that counts, so that a rank is never
    read from a difference inside the seeds' spread nor the noise. ``level``: the difference from NoAdapt
    does not count; ``seeds``: how many seeds the cell compares on."""

    difference: float | None = None
    rank: int | None = None
    ranked: int = 0
    lowest: int | None = None
    level: bool = False
    seeds: int = 0

    @property
    def text(self) -> str:
        """``+2.9 (1/6)``, or ``+2.9 (1–3/6)`` when ZeroSiam is level with others: signed difference, one
        decimal (after ``≈`` when it does not count), then the rank; ``–`` when missing."""
        if self.difference is None:
            return MISSING
        difference = round(self.difference, 1) + 0.0  # + 0.0: no "-0.0" for a tiny loss
        ranks = str(self.rank) if self.lowest in (None, self.rank) else f"{self.rank}–{self.lowest}"
        return f"{LEVEL if self.level else ''}{difference:+.1f} ({ranks}/{self.ranked})"


@dataclass
class Summary:
    """The grid: rows = scenarios present (in :data:`SCENARIOS` order), columns = models present; ``scope``
    names the datasets and severities behind it, for the caption."""

    scenarios: list[str]
    models: list[str]
    cells: dict[tuple[str, str], SummaryCell]
    scope: str

    def cell(self, scenario: str, model: str) -> SummaryCell:
        """The cell of ``scenario`` × ``model``; a pair never run is a missing cell."""
        return self.cells.get((scenario, model), SummaryCell())


def build_summary(rows: Iterable[Mapping[str, Any]], noise: Noise | None = None) -> Summary:
    """The summary of every vision row given on the 15 corruptions or the mixed stream (filter the rows
    first), its comparisons counting only beyond ``noise`` (``noise_of`` the store; none: rounding is
    taken as exact). Raises :class:`AmbiguousCell` for a cell that cannot be one number."""
    kept = [row for row in select_rows(rows) if row["spec"].get("corruption") in (*BENCHMARK, MIXED)]
    by_cell: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for row in kept:
        by_cell[str(row["spec"].get("protocol")), str(row["spec"].get("model"))].append(row)
    cells = {key: _summarise(key, members, noise or Noise()) for key, members in by_cell.items()}
    return Summary(
        scenarios=sorted({scenario for scenario, _ in by_cell}, key=scenario_rank),
        models=sorted({model for _, model in by_cell}),
        cells=cells,
        scope=_scope(kept),
    )


def scenario_rank(protocol: str) -> tuple[int, str]:
    """Sort key putting protocols in :data:`SCENARIOS` order, any other one after them by name."""
    return (SCENARIOS.index(protocol), "") if protocol in SCENARIOS else (len(SCENARIOS), protocol)


def _summarise(key: tuple[str, str], rows: Sequence[Mapping[str, Any]], noise: Noise) -> SummaryCell:
    """One cell, compared on its shared seeds; no shared seed, no comparison."""
    shared = on_shared_seeds(rows)
    if not shared:
        return SummaryCell()
    protocol, model = key
    corruptions = 1 if protocol == MIXED else len(BENCHMARK)

    def band(a: str, b: str, cells: Mapping[str, Cell]) -> float:
        runs = (corruptions * cells[a].seeds, corruptions * cells[b].seeds)
        return noise.band(model, protocol, (a, b), runs)

    return compare(method_scores(key, shared), band)


def on_shared_seeds(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``rows`` of the seeds on which every method with a complete result (all of the cell's
    corruptions for that seed) has one. A three-seed mean ranked against a one-seed one compares different
    streams: under label shift the seed orders the classes, and a method whose rate was retuned may not
    have its other seeds yet. Methods with no complete seed do not narrow the cell (they are blank)."""
    expected = {MIXED} if any(row["spec"].get("corruption") == MIXED for row in rows) else set(BENCHMARK)
    covered: dict[tuple[str, Any], set[str]] = defaultdict(set)
    for row in rows:
        covered[row["spec"]["method"], row["spec"].get("seed")].add(str(row["spec"].get("corruption")))
    complete: dict[str, set[Any]] = defaultdict(set)
    for (method, seed), found in covered.items():
        if expected <= found:
            complete[method].add(seed)
    if not complete:
        return list(rows)
    shared = set.intersection(*complete.values())
    return [row for row in rows if row["spec"].get("seed") in shared]


def method_scores(key: tuple[str, str], rows: Sequence[Mapping[str, Any]]) -> dict[str, Cell]:
    """Each method's score in one cell, read from its table: the average over the 15 corruptions (the
    ``Overall`` accuracy where the table has one: the mixed stream) with its seed spread; a cell with no
    mean where the table leaves it blank."""
    _require_one_setting(key, rows)
    labels_of = _labels_by_method(key, rows)
    (table,) = build_tables(rows)
    column = OVERALL if OVERALL in table.columns else AVERAGE
    return {method: table.cell(label, column) for method, label in labels_of.items()}


def _require_one_setting(key: tuple[str, str], rows: Sequence[Mapping[str, Any]]) -> None:
    """One dataset and severity per cell: averages over different data are not one number."""
    settings = sorted({_setting(row["spec"]) for row in rows})
    if len(settings) > 1:
        names = ", ".join(settings)
        raise AmbiguousCell(f"summary cell {_name(key)} is ambiguous: several settings ({names})")


def _setting(spec: Mapping[str, Any]) -> str:
    """What a summary cell must hold one of: ``cifar10c severity 5``."""
    return f"{spec.get('dataset')} severity {spec.get('severity')}"


def _labels_by_method(key: tuple[str, str], rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The one table line of each method, by the tables' own labelling; a method with several lines (a
    sweep, another stream setting) makes the cell ambiguous."""
    labels = run_labels(rows)
    found: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        found[row["spec"]["method"]].add(labels[row["run_id"]])
    for method, variants in found.items():
        if len(variants) > 1:
            raise AmbiguousCell(
                f"summary cell {_name(key)} is ambiguous: {method_name(method)} has several variants "
                f"({', '.join(sorted(variants))})"
            )
    return {method: variants.pop() for method, variants in found.items()}


Band = Callable[[str, str, Mapping[str, Cell]], float]  # the noise band between two methods' cells


def compare(scores: Mapping[str, Cell], band: Band | None = None) -> SummaryCell:
    """ZeroSiam's difference from NoAdapt and its rank among the adapting methods (all but NoAdapt) with
    a score: first after every method that leads it by a margin that :func:`counts`, last before every
    method it leads by such a margin; ``band(a, b, scores)`` is the noise between methods a and b."""
    target, baseline = scores.get(TARGET, Cell(None)), scores.get(BASELINE, Cell(None))
    if target.mean is None or baseline.mean is None:
        return SummaryCell()

    def noise(a: str, b: str) -> float:
        return band(a, b, scores) if band is not None else 0.0

    adapting = [m for m, cell in scores.items() if m != BASELINE and cell.mean is not None]
    above = sum(counts(scores[m], target, noise(m, TARGET)) for m in adapting)
    below = sum(counts(target, scores[m], noise(TARGET, m)) for m in adapting)
    level = not (
        counts(target, baseline, noise(TARGET, BASELINE)) or counts(baseline, target, noise(BASELINE, TARGET))
    )
    return SummaryCell(
        target.mean - baseline.mean, 1 + above, len(adapting), len(adapting) - below, level, target.seeds
    )


def counts(leader: Cell, other: Cell, noise: float = 0.0) -> bool:
    """Whether ``leader`` is ahead of ``other`` by a margin that counts: at least :data:`COUNTS_AT` and more
    than their seed stds added where both have a spread, at least :data:`COUNTS_AT_ONE_SEED` otherwise, and
    in either case more than ``noise`` (the band of ``zerosiam.bench.noise``'s rule, in points)."""
    if leader.mean is None or other.mean is None:
        return False
    lead = leader.mean - other.mean
    if lead <= noise:
        return False
    if leader.std is None or other.std is None:
        return lead >= COUNTS_AT_ONE_SEED - _ROUNDING
    return lead >= COUNTS_AT - _ROUNDING and lead > leader.std + other.std


def _name(key: tuple[str, str]) -> str:
    """A cell as the user reads it: ``label_shift × resnet20``."""
    return f"{key[0]} × {key[1]}"


def _scope(rows: Sequence[Mapping[str, Any]]) -> str:
    """The datasets and severities behind the summary, e.g. ``CIFAR-10-C, severity 5``."""
    datasets = sorted({str(row["spec"].get("dataset")) for row in rows})
    severities = sorted({str(row["spec"].get("severity")) for row in rows})
    names = ", ".join(DATASET_NAMES.get(name, name) for name in datasets)
    return f"{names}, severit{'y' if len(severities) == 1 else 'ies'} {', '.join(severities)}"


def to_markdown(summary: Summary) -> str:
    """The caption line, then the grid as a Markdown table: a line per scenario, a column per model."""
    lines = [CAPTION.format(scope=summary.scope), ""]
    lines += [_row(["Scenario", *summary.models]), _row(["---"] + ["---:"] * len(summary.models))]
    for scenario in summary.scenarios:
        lines.append(_row([scenario, *(summary.cell(scenario, m).text for m in summary.models)]))
    return "\n".join(lines) + "\n"


def _row(cells: Sequence[str]) -> str:
    """One Markdown table row (a model name holding ``|`` would split its cell, so it is escaped)."""
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
