"""Paper-style accuracy tables from benchmark result rows: which rows, which lines and columns, which cells.

A *row* is one run as returned by ``ResultStore.rows()``: a dict with ``spec``, ``metrics`` and ``curves``
already decoded. Rows are grouped into one :class:`Table` per (dataset, model, protocol, severity), with
one line per method (NoAdapt first, ZeroSiam and its compositions last, as in the paper) and one column
per corruption in the paper's order, or per corruption group, plus the average. This module builds the
tables' data; ``bench/report.py`` writes them as Markdown, CSV and LaTeX.

Conventions (also in docs/report.md):

* accuracy is shown in %, one decimal; with several seeds a cell is the mean over seeds and, when more than
  one seed is present, ``± sample std`` (ddof = 1);
* a cell below NoAdapt's in the same table and column is marked (compared before rounding, on the seeds
  both lines have; ties are not marked);
* a missing cell is shown as ``–``; a group mean or the average is computed only when **every** member
  corruption of that method is present, otherwise it is ``–`` too and a note says why: a mean over a
  different subset of corruptions would not be comparable with the other lines;
* the mixed protocol (one run over all corruptions) reads its per-corruption accuracy from
  ``metrics.per_domain`` and adds an ``Overall`` column with the whole stream's accuracy;
* ``by_seed`` turns the columns into seeds: each seed's average over the corruptions, then the mean of
  the complete seeds with its std, so that a reader sees whether an ordering holds in every seed, not
  only in the mean;
* a note under the table counts, per line, the resets of a recovery rule (SAR's) and the triggers of a
  guard over the line's runs, so that a reader sees which lines were put back and how often.
"""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zerosiam.bench.names import DATASET_NAMES, method_name, method_rank
from zerosiam.bench.spec import LATER_FIELDS, without_later_defaults
from zerosiam.corruptions import BENCHMARK, GROUPS
from zerosiam.protocols.build import SEQUENCES

if TYPE_CHECKING:  # noise.py reads rows through this module: only the type is needed here
    from zerosiam.bench.noise import Noise

BASELINE = "noadapt"
MIXED = "mixed"
AVERAGE = "avg"
SHOWN_MEAN = "mean"  # a table of some corruptions: the mean of those it shows
OVERALL = "overall"
SEED_COLUMN = "Seed "  # a by-seed table's column of one seed: "Seed 0", "Seed 1", ...
MISSING = "–"  # a cell with no result
UNRECORDED_CPU = "a CPU not recorded"  # the device of a run stored before runs named their CPU
WORSE_MARK = "↓"  # a cell below NoAdapt's, beyond the noise rule's band
# Metrics counting times a run was put back, and how a note names them.
EVENTS: tuple[tuple[str, str], ...] = (("recoveries", "reset"), ("guard_triggers", "guard trigger"))
_NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:e-?\d+)?)")

COLUMN_NAMES: dict[str, str] = {
    "gaussian_noise": "Gauss.",
    "shot_noise": "Shot",
    "impulse_noise": "Impul.",
    "defocus_blur": "Defoc.",
    "glass_blur": "Glass",
    "motion_blur": "Motion",
    "zoom_blur": "Zoom",
    "snow": "Snow",
    "frost": "Frost",
    "fog": "Fog",
    "brightness": "Brit.",
    "contrast": "Contr.",
    "elastic_transform": "Elastic",
    "pixelate": "Pixel",
    "jpeg_compression": "JPEG",
    "noise": "Noise",
    "blur": "Blur",
    "weather": "Weather",
    "digital": "Digital",
    AVERAGE: "Avg.",
    SHOWN_MEAN: "Mean",
    OVERALL: "Overall",
}
# One line's results: seed -> column (a corruption, or ``overall``) -> accuracy in %.
PerSeed = Mapping[Any, Mapping[str, float]]
# Spec fields that place a run in a table or a column; every other field (and every hparam) that differs
# between runs of one method makes them separate lines of the table.
_PLACEMENT_FIELDS = frozenset({"dataset", "model", "protocol", "severity", "corruption", "method", "seed"})


@dataclass(frozen=True)
class Cell:
    """One table entry: accuracy in % (``None`` if missing), its std over seeds and whether it is below
    NoAdapt."""

    mean: float | None
    std: float | None = None
    seeds: int = 0
    worse: bool = False


@dataclass
class Table:
    """One paper-style table: a fixed (dataset, model, protocol, severity), lines = methods, columns =
    corruptions or groups plus the average (and ``overall`` for the mixed protocol)."""

    dataset: str
    model: str
    protocol: str
    severity: int | None
    columns: list[str]
    methods: list[str]
    cells: dict[tuple[str, str], Cell]
    notes: list[str] = field(default_factory=list)

    def cell(self, method: str, column: str) -> Cell:
        """The cell of ``method`` (its display label) in ``column`` (a key such as ``"fog"`` or ``"avg"``)."""
        return self.cells.get((method, column), Cell(None))

    @property
    def title(self) -> str:
        """A caption naming what is fixed in this table (plain ASCII, so that LaTeX needs no extra font)."""
        dataset = DATASET_NAMES.get(str(self.dataset), str(self.dataset))
        return f"{dataset}, {self.model}, protocol {self.protocol}, severity {self.severity}: accuracy (%)"


def device_of(row: Mapping[str, Any]) -> str:
    """What a run computed on, as far as its record says: the GPU's name, or the CPU's model (for runs
    stored before the model was recorded, a CPU that cannot be told from any other)."""
    env = row.get("env") or {}
    return str(env.get("gpu") or env.get("cpu_model") or UNRECORDED_CPU)


# ----------------------------------------------------------------------------------------- selecting rows


def select_rows(
    rows: Iterable[Mapping[str, Any]],
    *,
    model: str | None = None,
    protocol: str | None = None,
    severity: int | None = None,
    dataset: str | None = None,
    methods: Sequence[str] | None = None,
    seed: int | None = None,
    replica: int | None = 0,
) -> list[Mapping[str, Any]]:
    """The vision rows that match every given filter (``None`` = any; ``methods``: any of them), oldest
    first so that a later rerun of the same run wins where rows collide. ``seed`` keeps one seed: each
    cell is then that seed's stream, which a by-seed table only shows averaged over the corruptions.
    ``replica`` keeps the runs themselves (0) by default: the replicas of the noise study
    (``zerosiam.bench.replica``) are read by ``zerosiam.bench.noise``, never as lines of a table."""
    wanted = {"model": model, "protocol": protocol, "severity": severity, "dataset": dataset, "seed": seed}
    kept = []
    for row in rows:
        if row.get("kind", "vision") != "vision":
            continue
        spec = row.get("spec") or {}
        if methods is not None and spec.get("method") not in methods:
            continue
        if replica is not None and spec.get("replica", 0) != replica:
            continue
        if all(value is None or spec.get(key) == value for key, value in wanted.items()):
            kept.append(row)
    return sorted(kept, key=_created_key)


def _created_key(row: Mapping[str, Any]) -> tuple[int, float, str]:
    """Sort key of a row's ``created``: the store writes epoch seconds, hand-made rows may use text."""
    created = row.get("created")
    if isinstance(created, int | float):
        return 0, float(created), ""
    return 1, 0.0, str(created or "")


def _settings(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec fields besides placement and hparams that a run sets (a stream parameter, a prelude, a
    guard). An empty value, or a younger field at its default, is no setting: rows stored before a field
    existed lack it, newer ones hold its default."""
    return {
        key: value
        for key, value in without_later_defaults(spec).items()
        if key not in _PLACEMENT_FIELDS | {"hparams"} and value not in (None, {}, [])
    }


_NAMED_DEFAULTS = {key: value for key, value in LATER_FIELDS.items() if value not in (None, {}, [])}


def _variant(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What, apart from placement, distinguishes a run: its settings and its hparams; a younger field
    with a named default (the guard ``none``) is named even in rows stored before it existed."""
    return {**_NAMED_DEFAULTS, **_settings(spec), **(spec.get("hparams") or {})}


def format_value(value: Any) -> str:
    """A compact rendering of an hparam value for a label (``0.001`` rather than ``0.0010``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _shown(variant: Mapping[str, Any], key: str) -> str:
    """A setting's value in a label; ``default`` where the run left it to the method (say, its paper
    rate beside runs at 3× and 10× of it)."""
    return format_value(variant[key]) if key in variant else "default"


def run_labels(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """A display label for every run id: the method's name, plus the settings that differ between runs of
    that method (e.g. ``ZeroSiam (lr=0.001)``), so that a sweep never gets averaged into one line."""
    by_method: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_method[row["spec"]["method"]].append(row)
    labels = {}
    for method, members in by_method.items():
        variants = [_variant(row["spec"]) for row in members]
        keys = sorted({key for variant in variants for key in variant})
        differing = [
            k for k in keys if len({json.dumps(v.get(k), sort_keys=True, default=str) for v in variants}) > 1
        ]
        for row, variant in zip(members, variants, strict=True):
            suffix = ", ".join(f"{key}={_shown(variant, key)}" for key in differing)
            labels[row["run_id"]] = method_name(method) + (f" ({suffix})" if suffix else "")
    return labels


# ---------------------------------------------------------------------------------------- building tables


def _accuracies(row: Mapping[str, Any]) -> dict[str, float]:
    """Accuracy in % per column key that this run provides (per corruption; ``overall`` for a run over
    a sequence of them: mixed, continual, gradual, CCC)."""
    spec, metrics = row["spec"], row.get("metrics") or {}
    accuracy = metrics.get("accuracy")
    if spec.get("corruption") in SEQUENCES:
        per_domain = (metrics.get("per_domain") or {}).items()
        found = {name: 100.0 * value for name, value in per_domain if name in BENCHMARK and value is not None}
        if accuracy is not None:
            found[OVERALL] = 100.0 * accuracy
        return {key: value for key, value in found.items() if math.isfinite(value)}
    if accuracy is None or not math.isfinite(accuracy):
        return {}
    return {spec.get("corruption"): 100.0 * accuracy}


def _summary(values: Sequence[float]) -> Cell:
    """Mean and sample std (only with two or more values) of per-seed accuracies."""
    if not values:
        return Cell(None)
    std = statistics.stdev(values) if len(values) > 1 else None
    return Cell(statistics.fmean(values), std, len(values))


def _complete_seed_means(per_seed: PerSeed, members: Sequence[str]) -> dict[Any, float]:
    """Each seed's mean over ``members``, for the seeds that have every one of them."""
    return {
        seed: statistics.fmean(values[m] for m in members)
        for seed, values in per_seed.items()
        if set(members) <= set(values)
    }


def _mean_cell(per_seed: PerSeed, members: Sequence[str]) -> Cell:
    """A group mean or the average: the mean of the members' seed-means, defined only when every member is
    present; its std is over the per-seed means of the seeds that have every member."""
    cells = [_summary([values[m] for values in per_seed.values() if m in values]) for m in members]
    if any(cell.mean is None for cell in cells):
        return Cell(None)
    complete = list(_complete_seed_means(per_seed, members).values())
    std = statistics.stdev(complete) if len(complete) > 1 else None
    return Cell(statistics.fmean(cell.mean for cell in cells), std, len(complete))


def table_columns(groups: bool, mixed: bool, present: Iterable[str] = BENCHMARK) -> list[str]:
    """Column keys: the 15 corruptions (or the 4 groups), then the average, then ``overall`` for mixed.

    A table whose runs cover only some of the 15 (``present``: an ablation on a subset, a diagnostics
    run) shows just those corruptions, and no group or average column, which could never be filled; with
    two or more of them, their mean (``Mean``), which is not the benchmark's average.
    """
    present = set(present)
    if not set(BENCHMARK) <= present:
        shown = [name for name in BENCHMARK if name in present]
        return shown + ([SHOWN_MEAN] if len(shown) > 1 else []) + ([OVERALL] if mixed else [])
    columns = list(GROUPS) if groups else list(BENCHMARK)
    return columns + [AVERAGE] + ([OVERALL] if mixed else [])


def seed_columns(seeds: Iterable[Any], shown: Sequence[str]) -> list[str]:
    """Column keys of a by-seed table: one per seed, then the average over the 15 corruptions (or, for a
    table of some of them, the mean of those ``shown``)."""
    average = AVERAGE if set(BENCHMARK) <= set(shown) else SHOWN_MEAN
    return [f"{SEED_COLUMN}{seed}" for seed in sorted(set(seeds), key=lambda s: natural_key(str(s)))] + [
        average
    ]


def _seed_line_cells(per_seed: PerSeed, columns: Sequence[str], members: Sequence[str]) -> dict[str, Cell]:
    """One line of a by-seed table: each seed's mean over ``members`` (blank unless that seed has all of
    them), then the mean ± std of exactly those seed means. A seed still under way counts in no average,
    so that the last column can be recomputed from the others on the page (the plain table's average,
    which lets a corruption's seeds stand for it, would show a number no column explains)."""
    cells = {column: Cell(None) for column in columns}
    means = _complete_seed_means(per_seed, members)
    for seed, mean in means.items():
        cells[f"{SEED_COLUMN}{seed}"] = Cell(mean, seeds=1)
    cells[columns[-1]] = _summary(list(means.values()))
    return cells


def natural_key(text: str) -> tuple:
    """A sort key that orders the numbers inside labels by value (``lr_scale=3`` before ``=10``)."""
    return tuple(
        (0, float(part), "") if part[:1].isdigit() else (1, 0.0, part) for part in _NUMBER.split(text)
    )


def _line_cells(per_seed: PerSeed, columns: Sequence[str]) -> dict[str, Cell]:
    """Every cell of one method's line, before marking."""
    members = {**GROUPS, AVERAGE: BENCHMARK, SHOWN_MEAN: [c for c in columns if c in BENCHMARK]}
    cells = {}
    for column in columns:
        if column in members:
            cells[column] = _mean_cell(per_seed, members[column])
        else:
            cells[column] = _summary([values[column] for values in per_seed.values() if column in values])
    return cells


def _shared(line: PerSeed, other: PerSeed) -> PerSeed:
    """The results of ``line`` on the (seed, corruption) pairs that ``other`` has too."""
    return {
        seed: {column: value for column, value in values.items() if column in other[seed]}
        for seed, values in line.items()
        if seed in other
    }


def _mark_worse(
    table: Table,
    baseline_of: Mapping[str, str],
    per_label: Mapping[str, PerSeed],
    line_cells: Callable[[PerSeed, Sequence[str]], dict[str, Cell]],
    band: Callable[[str, str, int], float] | None = None,
) -> None:
    """Flag every non-baseline cell whose mean is below its line's baseline in the same column by more
    than ``band(line, column, seeds)`` (the noise rule's, ``zerosiam.bench.noise``; none: any amount),
    the two compared on the (seed, corruption) results they share: a seed redraws a label-shifted stream,
    so a line still missing seeds is held to NoAdapt on the streams it has met, not to NoAdapt's mean
    over streams it has not. A note says when a line was compared on fewer seeds than it shows or than
    its baseline has, and how many cells below NoAdapt stay unmarked, within the noise."""
    if not baseline_of:
        table.notes.append("No NoAdapt line in this table, so no cell is marked.")
        return
    narrowed, within = [], 0
    for method in table.methods:
        baseline = baseline_of[method]
        if method == baseline:
            continue
        line, reference = per_label[method], per_label[baseline]
        if set(line) != set(reference):
            narrowed.append(method)
        ours = line_cells(_shared(line, reference), table.columns)
        noadapt = line_cells(_shared(reference, line), table.columns)
        for column in table.columns:
            cell, own, theirs = table.cells[method, column], ours[column].mean, noadapt[column].mean
            if None in (cell.mean, own, theirs) or own >= theirs:
                continue
            if band is not None and theirs - own <= band(method, column, ours[column].seeds or 1):
                within += 1
                continue
            table.cells[method, column] = Cell(cell.mean, cell.std, cell.seeds, worse=True)
    if within:
        table.notes.append(
            f"{within} cell(s) below NoAdapt by no more than the noise rule's band are not marked "
            "(docs/RESULTS.md, How a verdict is labelled)."
        )
    if narrowed:
        table.notes.append(
            f"Lines with other seeds than their NoAdapt ({', '.join(narrowed)}) are marked against it "
            "on the seeds both have."
        )


def _band(
    noise: Noise, table: Table, method_of: Mapping[str, str], label: str, column: str, seeds: int
) -> float:
    """The noise rule's band for a line's cell against NoAdapt's: a mean over ``seeds`` × the column's
    corruptions runs (NoAdapt, frozen, has no noise of its own)."""
    runs = seeds * len(_members(column, table.columns))
    return noise.band(table.model, table.protocol, (method_of[label], BASELINE), (runs, runs))


def _members(column: str, columns: Sequence[str]) -> Sequence[str]:
    """The corruptions a column's mean is over: a group's, the 15 for the average, the shown ones for a
    partial table's mean, else the column itself (a corruption, or a whole stream's ``overall``)."""
    if column in GROUPS:
        return GROUPS[column]
    if column == AVERAGE:
        return BENCHMARK
    if column == SHOWN_MEAN:
        return [c for c in columns if c in BENCHMARK]
    if column.startswith(SEED_COLUMN):  # a by-seed table's seed: its mean over the corruptions
        return BENCHMARK
    return [column]


def _devices_note(table: Table, rows: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> None:
    """A note naming the devices when a table's runs computed on more than one: two executions of one spec
    on two devices can end points apart (docs/RESULTS.md, One spec, several numbers), so a comparison
    across them is not within the noise rule alone."""
    lines: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        lines[device_of(row)].add(labels[row["run_id"]])
    if len(lines) > 1:
        each = "; ".join(
            f"{device}: {', '.join(sorted(found, key=natural_key))}"
            for device, found in sorted(lines.items())
        )
        table.notes.append(
            f"Runs from {len(lines)} devices ({each}); lines on two devices differ by their rounding too."
        )


def _baselines(table: Table, method_of: Mapping[str, str], setting_of: Mapping[str, str]) -> dict[str, str]:
    """Each line's NoAdapt: the one run with the same settings (the same stream, the same prelude) when
    there is one, else the first; empty without a NoAdapt line. A note says how lines were compared."""
    noadapt = [label for label in table.methods if method_of[label] == BASELINE]
    if not noadapt:
        return {}
    by_setting = {setting_of[label]: label for label in noadapt}
    baseline_of = {label: by_setting.get(setting_of[label], noadapt[0]) for label in table.methods}
    if len(noadapt) > 1:
        if all(setting_of[label] in by_setting for label in table.methods):
            table.notes.append("Several NoAdapt lines; each line is compared with the one of its settings.")
        else:
            table.notes.append(
                f"Several NoAdapt lines; a line without one of its settings is compared with {noadapt[0]}."
            )
    return baseline_of


def _missing_notes(table: Table, per_label: Mapping[str, PerSeed], covered: Sequence[str]) -> None:
    """One note per line whose means are blank because some of the ``covered`` corruptions (those any line
    has; all 15 when none has any) are missing."""
    covered = list(covered) or list(BENCHMARK)
    for method in table.methods:
        present = {column for values in per_label[method].values() for column in values}
        missing = [name for name in covered if name not in present]
        if len(missing) == len(covered):
            table.notes.append(f"{method}: no per-corruption result; its means are left blank.")
        elif missing:
            names = ", ".join(COLUMN_NAMES[name] for name in missing)
            table.notes.append(f"{method}: no result for {names}; the means that need them are left blank.")


def _events_note(table: Table, rows: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> None:
    """One note counting, per line, its runs' resets and guard triggers (:data:`EVENTS`); none when no
    run of the table was put back."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        metrics = row.get("metrics") or {}
        for key, _ in EVENTS:
            counts[labels[row["run_id"]]][key] += int(metrics.get(key) or 0)
    parts = []
    for method in table.methods:
        found = [_count_of(counts[method][key], name) for key, name in EVENTS if counts[method][key]]
        if found:
            parts.append(f"{method} {' and '.join(found)}")
    if parts:
        table.notes.append("Put back, summed over each line's runs: " + "; ".join(parts) + ".")


def _count_of(count: int, name: str) -> str:
    return f"{count} {name}" if count == 1 else f"{count} {name}s"


def _build_table(
    key: tuple, rows: Sequence[Mapping[str, Any]], groups: bool, by_seed: bool, noise: Noise | None
) -> Table:
    """The table of one (dataset, model, protocol, severity) from its rows. Runs on the extra corruptions
    (e.g. a sweep on the held-out set) are left out before labelling, so that they neither add empty lines
    nor lengthen the labels of the lines that stay."""
    kept = [row for row in rows if row["spec"].get("corruption") in (*BENCHMARK, *SEQUENCES)]
    ignored, rows = len(rows) - len(kept), kept
    labels = run_labels(rows)
    method_of = {labels[row["run_id"]]: row["spec"]["method"] for row in rows}
    setting_of = {labels[row["run_id"]]: json.dumps(_settings(row["spec"]), sort_keys=True) for row in rows}
    per_label: dict[str, dict[Any, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        per_label[labels[row["run_id"]]][row["spec"].get("seed")].update(_accuracies(row))
    mixed = any(row["spec"].get("corruption") in SEQUENCES for row in rows)
    present = {column for seeds in per_label.values() for values in seeds.values() for column in values}
    shown = [name for name in BENCHMARK if name in present]
    if by_seed:
        columns = seed_columns({seed for seeds in per_label.values() for seed in seeds}, shown)
        line_cells = functools.partial(_seed_line_cells, members=shown)
    else:
        columns, line_cells = table_columns(groups, mixed, present), _line_cells
    methods = sorted(per_label, key=lambda label: (method_rank(method_of[label]), natural_key(label)))
    cells = {(m, c): cell for m in methods for c, cell in line_cells(per_label[m], columns).items()}
    table = Table(*key, columns=columns, methods=methods, cells=cells)
    band = functools.partial(_band, noise, table, method_of) if noise else None
    _mark_worse(table, _baselines(table, method_of, setting_of), per_label, line_cells, band)
    _devices_note(table, rows, labels)
    _missing_notes(table, per_label, shown)
    _events_note(table, rows, labels)
    if ignored:
        table.notes.append(f"{ignored} run(s) on corruptions outside the 15 of the benchmark are not shown.")
    return table


def build_tables(
    rows: Iterable[Mapping[str, Any]],
    *,
    groups: bool = False,
    by_seed: bool = False,
    noise: Noise | None = None,
    **filters: Any,
) -> list[Table]:
    """One :class:`Table` per (dataset, model, protocol, severity) among the rows that pass the filters
    (those of :func:`select_rows`), in sorted order, leaving out settings with no run on the 15.
    ``groups=True`` gives the Noise/Blur/Weather/Digital means instead of the corruptions; ``by_seed=True``
    one column per seed (its average), then the average over seeds. With ``noise`` (``noise_of`` the
    store), a cell is marked below NoAdapt only beyond the noise rule's band.
    """
    selected = select_rows(rows, **filters)
    by_key: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for row in selected:
        spec = row["spec"]
        by_key[spec.get("dataset"), spec.get("model"), spec.get("protocol"), spec.get("severity")].append(row)
    ordered = sorted(by_key, key=lambda k: tuple(map(str, k)))
    tables = [_build_table(key, by_key[key], groups, by_seed, noise) for key in ordered]
    return [table for table in tables if table.methods]  # a setting run only on the extra corruptions
