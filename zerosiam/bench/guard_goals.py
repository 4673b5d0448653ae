"""How a guard is judged, from the runs of a guard grid: the four goals of ``docs/guard.md``.

A *cell* is one adapting run's setting without its guard (model, method, rates, stream, corruption,
seed, ...); its NoAdapt is the unguarded, non-adapting run of the same stream. Per guard:

* **lost**: the cells that end below their NoAdapt by more than :data:`LOSS` points and more than the
  cell's noise (``zerosiam.bench.noise``: the band of one run against NoAdapt) (the goal: none);
* **gain kept**: where the unguarded method beats NoAdapt, the guarded gain summed over those cells as a
  share of the unguarded gain summed over them (the goal: at least 95 %);
* **false alarms**: on the mild streams (nothing collapses there at the chosen rates), the guard's
  triggers per 100 batches (the goal: under 1);
* **mean below NoAdapt**: NoAdapt's accuracy less the guard's, averaged over the cells, in points
  (negative where the guard ends above NoAdapt on average): how far its losses go, where the count of
  lost cells says only how many there are.

The third goal, ahead of the guards people use, is the comparison of these rows.

A guard that never acts on a run leaves it as it was. ``rdumb`` resets on a clock, every
:data:`RDUMB_EVERY` steps, so on a stream of fewer steps it never acts; ``sar``'s rule, replayed on an
unguarded run's objective (its ``sar_guard_fires`` metric), may never fire on it; ``auto``, watching an
unguarded run (its ``auto_guard_fires`` metric, where ``zerosiam bench`` watched it), may never fire
either. Where a store has no run of such a guard on such a cell (a grid leaves ``rdumb`` off the short
streams, ``zerosiam bench`` does not run what a stored unguarded run already shows), the unguarded run
stands in for it (counted apart, in ``stand_ins``), so that every guard is judged on the same cells
without runs that could only repeat the unguarded ones. A stand-in is the unguarded run itself: the same
device and execution, and a guard that watches without acting changes no computation (the twins of
``benchmarks/divergence.py`` agree in every bit).

A cell is judged only where all of its guards' runs ran on one device (:func:`device_of`): an online run's
number moves with its rounding, so a guarded run on a GPU against its unguarded twin on a CPU compares
executions, not guards. A guard that never acts on the unguarded run is judged on it even where its own
run was made on another device (the stand-in is that run on the unguarded run's device). The cells still
set aside are counted (``GuardScore.across_devices``) and listed by ``cells_markdown``; ``zerosiam bench
--one-device`` makes their runs again on one machine.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zerosiam.bench.names import method_name
from zerosiam.bench.noise import Noise
from zerosiam.bench.spec import NO_GUARD, without_later_defaults
from zerosiam.bench.tables import BASELINE, COLUMN_NAMES, device_of, format_value
from zerosiam.parts.guards import AUTO, GUARDS, RDUMB, RDUMB_EVERY, SAR, guard_settings, never_acts

LOSS = 1.0  # points below NoAdapt that count as a loss
MILD = "mild"
# The guards an unguarded run stands in for where they never act on it (``never_acts``), and where that is.
STOOD_IN = {
    RDUMB: f"streams of fewer than {RDUMB_EVERY:,} steps, where its reset never comes",
    SAR: "runs on which its rule, replayed on their objective, never fires",
    AUTO: "runs it watched and never fired on",
}
# Spec fields that do not change the stream a NoAdapt run sees.
NOT_THE_STREAM = frozenset({"method", "hparams", "guard", "prelude"})


@dataclass(frozen=True)
class GuardScore:
    """One guard's goals over the cells it ran: see the module docstring."""

    guard: str
    cells: int
    lost: tuple[str, ...]
    gained: float  # the unguarded gains over NoAdapt summed where there are gains, in points
    kept: float  # this guard's gains over NoAdapt summed over the same cells, in points
    mild_batches: int
    mild_triggers: int
    stand_ins: int = 0  # cells judged on the unguarded run, where this guard never acts on it
    stood_in_lost: tuple[str, ...] = ()  # the lost cells among those, listed with the unguarded losses
    mean_below: float | None = None  # NoAdapt less the guard, averaged over the cells, in points
    across_devices: int = 0  # cells set aside: their guards' runs ran on different devices
    other_settings: int = 0  # runs left out: made at settings other than the guard's present ones

    @property
    def gain_kept(self) -> float | None:
        """The share of the unguarded gains this guard keeps; None where the unguarded method gained
        nowhere."""
        return self.kept / self.gained if self.gained else None

    @property
    def alarms_per_100(self) -> float | None:
        """None without mild runs, and for no guard, which cannot trigger."""
        if self.guard == NO_GUARD or not self.mild_batches:
            return None
        return 100 * self.mild_triggers / self.mild_batches


def stream_key(spec: Mapping[str, Any]) -> str:
    """The stream a run sees, shared by every run whose NoAdapt reference is the same run: the same
    images in the same order through the same source model (:data:`NOT_THE_STREAM` left out)."""
    return _key(spec, NOT_THE_STREAM)


def cell_key(spec: Mapping[str, Any]) -> str:
    """A guard cell: the run less its guard, shared by a guarded run and its unguarded twin."""
    return _key(spec, {"guard"})


def _key(spec: Mapping[str, Any], drop: Iterable[str]) -> str:
    """``spec`` less the fields in ``drop``, as text; a field younger than the stores counts as absent at
    its default, as in the runs stored before it existed (the study's first label-shift runs have no
    ``prelude``)."""
    dropped = set(drop)
    kept = {k: v for k, v in without_later_defaults(spec).items() if k not in dropped}
    return json.dumps(kept, sort_keys=True, default=str)


def _label(spec: Mapping[str, Any]) -> str:
    """A cell as a reader names it: model, method and its settings, stream, corruption."""
    settings = ", ".join(f"{k}={format_value(v)}" for k, v in sorted((spec.get("hparams") or {}).items()))
    method = method_name(spec["method"]) + (f" ({settings})" if settings else "")
    corruption = COLUMN_NAMES.get(spec["corruption"], spec["corruption"])
    return f"{spec['model']} {method}, {spec['protocol']}, {corruption}"


def loss_bar(spec: Mapping[str, Any], noise: Noise | None) -> float:
    """How far below NoAdapt a run must end to count as lost: :data:`LOSS`, or the run's noise band
    against NoAdapt where that is wider."""
    if noise is None:
        return LOSS
    band = noise.band(spec["model"], spec["protocol"], (spec["method"], BASELINE))
    return max(LOSS, band)


def guard_scores(
    rows: Iterable[Mapping[str, Any]], worn: Iterable[str] = (), noise: Noise | None = None
) -> list[GuardScore]:
    """The goals of every guard among ``rows`` (vision rows of one store) and in ``worn`` (a grid's guards),
    ``none`` first. Cells without a NoAdapt run of their stream, or whose guards ran on different devices,
    are left out; accuracies are compared in points, a loss only beyond ``noise``. When any guard ran or is
    worn, its missing runs where it never acts are stood in for by the unguarded ones (module docstring): a
    grid whose guarded runs were all spared is judged all the same."""
    found = _cells(rows, worn)
    reference, specs, stand_ins = found.reference, found.specs, found.stand_ins
    accuracy = {
        guard: {cell: 100 * row["metrics"]["accuracy"] for cell, row in runs.items()}
        for guard, runs in found.runs.items()
    }
    mild: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # guard → [batches, triggers]
    for guard, runs in found.runs.items():
        for cell, row in runs.items():
            if specs[cell]["protocol"] == MILD:
                mild[guard][0] += int(row["metrics"].get("steps") or 0)
                mild[guard][1] += int(row["metrics"].get("guard_triggers") or 0)
    unguarded = accuracy.get(NO_GUARD, {})
    scores = []
    for guard in _in_order(accuracy.keys() | found.other_settings.keys()):
        ran = accuracy.get(guard, {})
        judged = {cell: value for cell, value in ran.items() if reference[cell] is not None}
        ordered = sorted(judged, key=lambda cell: _label(specs[cell]))
        lost = [cell for cell in ordered if judged[cell] < reference[cell] - loss_bar(specs[cell], noise)]
        stood_in = {cell for worn, cell in stand_ins if worn == guard} & judged.keys()
        gaining = [cell for cell in judged if cell in unguarded and unguarded[cell] > reference[cell]]
        gained = sum(unguarded[cell] - reference[cell] for cell in gaining)
        kept = sum(judged[cell] - reference[cell] for cell in gaining)
        batches, triggers = mild[guard]
        shortfall = [reference[cell] - value for cell, value in judged.items()]
        text = {
            cell: f"{_label(specs[cell])}: {judged[cell]:.1f} (NoAdapt {reference[cell]:.1f})"
            for cell in lost
        }
        scores.append(
            GuardScore(
                guard,
                len(judged),
                tuple(text[cell] for cell in lost),
                gained,
                kept,
                batches,
                triggers,
                len(stood_in),
                tuple(text[cell] for cell in lost if cell in stood_in),
                statistics.fmean(shortfall) if shortfall else None,
                len(found.across_devices),
                found.other_settings.get(guard, 0),
            )
        )
    return scores


def _in_order(guards: Iterable[str]) -> list[str]:
    """The guards as the goals' table and the cells' columns list them: ``none`` first, then by name."""
    return sorted(guards, key=lambda name: (name != NO_GUARD, name))


@dataclass(frozen=True)
class _Cells:
    """A guard grid's rows by cell: each guard's run of it (stand-ins included), its spec, and its
    NoAdapt accuracy in points (None without a NoAdapt run of its stream)."""

    runs: dict[str, dict[str, Mapping[str, Any]]]  # guard → cell → row
    specs: dict[str, Mapping[str, Any]]
    reference: dict[str, float | None]
    stand_ins: set[tuple[str, str]]  # (guard, cell): judged on the unguarded run
    across_devices: dict[str, set[str]]  # cell set aside → the devices its guards' runs ran on
    other_settings: dict[str, int]  # guard → its runs left out, made at settings other than its present ones


def _cells(rows: Iterable[Mapping[str, Any]], worn: Iterable[str]) -> _Cells:
    """``rows`` by cell, with the stand-ins of the guards ``worn`` (:func:`_with_stand_ins`), less the cells
    whose guards' runs ran on different devices (set aside, with those devices)."""
    rows, other_settings = _at_present_settings(rows)
    rows, stand_ins = _with_stand_ins(rows, set(worn))
    baseline: dict[str, float] = {}
    runs: dict[str, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    specs: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        spec = row["spec"]
        if spec["method"] == BASELINE:
            baseline[stream_key(spec)] = 100 * row["metrics"]["accuracy"]
            continue
        cell = cell_key(spec)
        runs[spec.get("guard", NO_GUARD)][cell], specs[cell] = row, spec
    devices: dict[str, set[str]] = defaultdict(set)
    for by_cell in runs.values():
        for cell, row in by_cell.items():
            devices[cell].add(device_of(row))
    across = {cell: found for cell, found in devices.items() if len(found) > 1}
    for by_cell in runs.values():
        for cell in across:
            by_cell.pop(cell, None)
    reference = {cell: baseline.get(stream_key(spec)) for cell, spec in specs.items() if cell not in across}
    return _Cells(dict(runs), specs, reference, stand_ins, across, other_settings)


def _at_present_settings(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], dict[str, int]]:
    """``rows`` less the guarded runs that recorded settings other than their guard's present ones, and
    how many each guard lost: under one name, a run made at other settings is another guard (``auto``
    changed twice before ``docs/guard.md`` named it frozen). A run that recorded none was made before runs
    recorded them, and is kept; so is a guard this process does not know (a variant's name)."""
    present: dict[str, dict[str, Any]] = {}
    kept, left_out = [], defaultdict(int)
    for row in rows:
        guard, recorded = row["spec"].get("guard", NO_GUARD), (row.get("env") or {}).get("guard_settings")
        if recorded is not None and guard in GUARDS:
            if guard not in present:
                present[guard] = guard_settings(guard)
            if recorded != present[guard]:
                left_out[guard] += 1
                continue
        kept.append(row)
    return kept, dict(left_out)


def _with_stand_ins(
    rows: list[Mapping[str, Any]], worn: set[str]
) -> tuple[list[Mapping[str, Any]], set[tuple[str, str]]]:
    """``rows`` and, for each unguarded adapting run and each guard of :data:`STOOD_IN` that never acts on
    it and has no run of its own in that cell on the same device, that run as the guard's; with the
    (guard, cell) pairs stood in for. A guard's own run on another device gives way to the stand-in (it is
    left out): the stand-in is what the guard would make on the unguarded run's device, bit for bit, and
    judging there keeps the cell on one device. Only when some guard ran or is ``worn``: a store of
    unguarded runs compares no guards."""
    guarded = ({row["spec"].get("guard", NO_GUARD) for row in rows} | worn) - {NO_GUARD}
    if not guarded:
        return rows, set()
    ran_on = {_worn_cell(row): device_of(row) for row in rows}
    stand_ins: dict[tuple[str, str], Mapping[str, Any]] = {}  # (guard, cell) → the unguarded row, worn
    for row in rows:
        spec = row["spec"]
        if spec.get("guard", NO_GUARD) != NO_GUARD or spec["method"] == BASELINE:
            continue
        cell = cell_key(spec)
        for guard in STOOD_IN:
            if ran_on.get((guard, cell)) != device_of(row) and never_acts(guard, row["metrics"]):
                stand_ins[guard, cell] = _as_worn(row, guard)
    kept = [row for row in rows if _worn_cell(row) not in stand_ins]
    return kept + list(stand_ins.values()), set(stand_ins)


def _worn_cell(row: Mapping[str, Any]) -> tuple[str, str]:
    """A run's guard and cell."""
    return row["spec"].get("guard", NO_GUARD), cell_key(row["spec"])


def set_aside(rows: Iterable[Mapping[str, Any]], worn: Iterable[str] = ()) -> dict[str, set[str]]:
    """The guard cells among ``rows`` that cannot be judged on one device, even with the stand-ins: cell →
    the devices its guards' runs ran on (what ``zerosiam bench --one-device`` makes again)."""
    return _cells(rows, worn).across_devices


def _as_worn(row: Mapping[str, Any], guard: str) -> dict[str, Any]:
    """An unguarded ``row`` as the run wearing ``guard`` that it equals, the guard never acting on it."""
    return {
        **row,
        "spec": {**row["spec"], "guard": guard},
        "metrics": {**row["metrics"], "guard_triggers": 0},
    }


def to_markdown(scores: Sequence[GuardScore]) -> str:
    """The goals as one table, then the cells each guard lost (the unguarded losses are counted only)."""
    lines = [
        f"| Guard | Cells | Lost (over {LOSS:.1f} and the noise) | Mean below NoAdapt | Gain kept "
        "| Triggers per 100 batches (mild) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for score in scores:
        kept = (
            "–"
            if score.gain_kept is None
            else f"{100 * score.gain_kept:.0f} % ({score.kept:.1f} of {score.gained:.1f})"
        )
        alarms = score.alarms_per_100
        alarm_text = (
            "–" if alarms is None else f"{alarms:.2f} ({score.mild_triggers} in {score.mild_batches})"
        )
        below = "–" if score.mean_below is None else f"{score.mean_below:.2f}"
        lines.append(
            f"| {score.guard} | {score.cells} | {len(score.lost)} | {below} | {kept} | {alarm_text} |"
        )
    lines += [
        "",
        "Mean below NoAdapt: NoAdapt's accuracy less the guard's, averaged over the cells, in points "
        "(negative: above NoAdapt on average). Gain kept: over the cells where the unguarded method beats "
        "NoAdapt, the guarded gain summed as a share of the unguarded gain summed (the two sums in points, "
        "in brackets).",
    ]
    if scores and scores[0].across_devices:
        lines.append(
            f"\n{scores[0].across_devices} cells set aside: their guards' runs ran on different devices "
            "(`zerosiam bench --grid ... --one-device` makes them again on one)."
        )
    lines += [
        f"\n`{score.guard}`: {score.other_settings} of its runs left out, made at settings other than its "
        "present ones (`docs/guard.md` names them)."
        for score in scores
        if score.other_settings
    ]
    lines += [
        f"\n`{score.guard}`: {score.stand_ins} of its {score.cells} cells are the unguarded runs "
        f"({STOOD_IN[score.guard]}; their losses are not listed)."
        for score in scores
        if score.stand_ins
    ]
    for score in scores:
        own = [cell for cell in score.lost if cell not in score.stood_in_lost]
        if own and score.guard != NO_GUARD:
            lines += ["", f"Lost with `{score.guard}`:", *(f"- {cell}" for cell in own)]
    return "\n".join(lines) + "\n"


def cells_markdown(
    rows: Iterable[Mapping[str, Any]], worn: Iterable[str] = (), noise: Noise | None = None
) -> str:
    """One line per judged cell: NoAdapt, then each guard's accuracy and what it did there, so that a
    reader can see which cells a count is made of and which bar fired (the goals' table sums them away).
    A guarded run shows its triggers, ``auto``'s by the bar each crossed where the run recorded them; a
    cell judged on the unguarded run shows ``= none``; the unguarded run shows where SAR's rule replayed
    on it and ``auto``'s watch would first have fired, where it recorded them. A cell lost (more than
    :func:`loss_bar` below its NoAdapt) is in bold. The cells set aside across devices follow."""
    found = _cells(rows, worn)
    guards = _in_order(found.runs)
    judged = sorted(
        (cell for cell, value in found.reference.items() if value is not None),
        key=lambda cell: _label(found.specs[cell]),
    )
    lines = [
        "| Cell | NoAdapt | " + " | ".join(guards) + " |",
        "| --- | ---: |" + " ---: |" * len(guards),
    ]
    for cell in judged:
        reference = found.reference[cell]
        bar = loss_bar(found.specs[cell], noise)
        entries = [
            _cell_entry(found.runs[guard].get(cell), reference, bar, (guard, cell) in found.stand_ins)
            for guard in guards
        ]
        lines.append(f"| {_label(found.specs[cell])} | {reference:.1f} | " + " | ".join(entries) + " |")
    if found.across_devices:
        lines += ["", "Set aside, their guards' runs on different devices:"]
        lines += [
            f"- {_label(found.specs[cell])}: {', '.join(sorted(devices))}"
            for cell, devices in sorted(
                found.across_devices.items(), key=lambda item: _label(found.specs[item[0]])
            )
        ]
    return "\n".join(lines) + "\n"


def _cell_entry(row: Mapping[str, Any] | None, reference: float, bar: float, stood_in: bool) -> str:
    """A guard's accuracy on one cell (bold where lost: more than ``bar`` below NoAdapt) and, in brackets,
    what it did there."""
    if row is None:
        return "–"
    points = 100 * row["metrics"]["accuracy"]
    accuracy = f"**{points:.1f}**" if points < reference - bar else f"{points:.1f}"
    if stood_in:
        return f"{accuracy} (= none)"
    done = _what_the_guard_did(row["spec"].get("guard", NO_GUARD), row["metrics"])
    return f"{accuracy} ({done})" if done else accuracy


def _what_the_guard_did(guard: str, metrics: Mapping[str, Any]) -> str:
    """A guarded run's triggers (``auto``'s by bar); an unguarded run's first steps where SAR's rule and
    ``auto``'s watch would have fired (or ``never``), where it recorded them."""
    if guard != NO_GUARD:
        triggers = int(metrics.get("guard_triggers") or 0)
        bars = [
            f"{metrics[f'guard_triggers_on_{bar}']} {bar}"
            for bar in ("agreement", "narrowing")
            if f"guard_triggers_on_{bar}" in metrics
        ]
        counted = f"{triggers} trigger" + ("" if triggers == 1 else "s")
        return counted + (f": {', '.join(bars)}" if bars and triggers else "")
    watched = [
        f"{name} at step {metrics[f'{name}_guard_first_step']}"
        if metrics[f"{name}_guard_fires"]
        else f"{name} never"
        for name in (SAR, AUTO)
        if f"{name}_guard_fires" in metrics
    ]
    return ", ".join(watched)
