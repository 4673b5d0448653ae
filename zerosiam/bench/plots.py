"""The paper's diagnostic figures from benchmark rows, as PNG files.

* :func:`plot_diagnostics`: one panel per quantity the paper tracks over the stream (online accuracy as a
  running mean, mean logit norm, centre dominance, ``‖θ_h − I‖_F``, the entropy and the divergence terms),
  one line per run, a triangle on the accuracy line wherever a guard put the run back;
* :func:`plot_lr_heatmap`: accuracy of a learning-rate sweep on a grid (rows ``η_f``, columns ``η_h``);
* :func:`plot_streams`: accuracy along the long continual streams (continual, gradual, CCC), a window's
  mean at each point, one panel per stream, the stream's domains marked, a triangle where a guard acted;
* :func:`plot_summary`: the scenario × model grid of ZeroSiam − NoAdapt with ZeroSiam's rank in each cell,
  its one-seed cells, its cells past the colour scale and its cells with methods missing marked.

Figures are drawn on a bare :class:`matplotlib.figure.Figure` attached to the Agg canvas, never through
``pyplot``: no window, no global backend switch, and nothing left open in a long-running process.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from zerosiam.bench.names import method_name, method_rank
from zerosiam.bench.summary import Summary
from zerosiam.bench.tables import MISSING, run_labels

# (curve key, panel title, y-axis label) in the order of the paper's diagnostics.
PANELS: tuple[tuple[str, str, str], ...] = (
    ("accuracy", "Online accuracy (running mean)", "accuracy (%)"),
    ("logit_norm", "Mean logit norm", r"$\|u\|_2$"),
    ("centre_dominance", "Centre dominance", r"$\|\bar u\| \,/\, \overline{\|u\|}$"),
    ("predictor_drift", "Predictor drift", r"$\|\theta_h - I\|_F$"),
    ("entropy", "Entropy term", "entropy (nats)"),
    ("divergence", "Divergence term", "divergence (nats)"),
)


def running_mean(values: Sequence[float]) -> np.ndarray:
    """Cumulative mean of the finite values so far (NaN until the first finite one). Every batch counts
    once, whatever its size: the per-batch accuracies are all a row keeps."""
    array = np.asarray(values, dtype=float)
    finite = np.isfinite(array)
    totals = np.cumsum(np.where(finite, array, 0.0))
    counts = np.cumsum(finite)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, totals / np.maximum(counts, 1), np.nan)


def _curve(row: Mapping[str, Any], key: str) -> np.ndarray | None:
    """A run's curve as floats (``None`` for a missing or all-NaN curve); accuracy becomes its running
    mean in %."""
    values = (row.get("curves") or {}).get(key)
    if not values:
        return None
    array = np.asarray([math.nan if v is None else v for v in values], dtype=float)
    if not np.isfinite(array).any():
        return None
    return 100.0 * running_mean(array) if key == "accuracy" else array


def _line_labels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Method labels, with the seed appended where two plotted runs would otherwise share a label."""
    labels = run_labels(rows)
    plain = [labels[row["run_id"]] for row in rows]
    return [
        f"{label} (seed {row['spec'].get('seed')})" if plain.count(label) > 1 else label
        for label, row in zip(plain, rows, strict=True)
    ]


def _save(figure: Figure, path: str | Path) -> Path:
    """Render ``figure`` with Agg into a PNG at ``path`` (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=120)
    return path


def plot_diagnostics(
    rows: Sequence[Mapping[str, Any]], path: str | Path, *, title: str | None = None
) -> Path:
    """Write a 2×3 figure of the paper's diagnostics for ``rows`` (one line per run, methods in table
    order) to ``path``; a panel no run has data for says so instead of staying blank."""
    if not rows:
        raise ValueError("plot_diagnostics needs at least one run")
    rows = sorted(rows, key=lambda row: method_rank(row["spec"]["method"]))
    labels = _line_labels(rows)
    figure = Figure(figsize=(14, 7.5), layout="constrained")
    axes = figure.subplots(2, 3, sharex=True).ravel()
    for ax, (key, panel_title, ylabel) in zip(axes, PANELS, strict=True):
        drawn = _draw_panel(ax, rows, labels, key)
        ax.set_title(panel_title)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in axes[3:]:
        ax.set_xlabel("step (batch)")
    handles, names = axes[0].get_legend_handles_labels()
    columns = 6 if max(map(len, names)) <= 24 else 3  # long labels (a sweep's settings) fit fewer abreast
    figure.legend(handles, names, loc="outside lower center", ncols=min(len(names), columns), frameon=False)
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def _draw_panel(ax: Any, rows: Sequence[Mapping[str, Any]], labels: Sequence[str], key: str) -> bool:
    """Draw one line per run with data for ``key``; colours follow the run so that panels agree."""
    drawn = False
    for index, (row, label) in enumerate(zip(rows, labels, strict=True)):
        values = _curve(row, key)
        if values is None:
            # an invisible entry keeps the shared legend (taken from the first panel) complete
            ax.plot([], [], color=f"C{index % 10}", label=label)
            continue
        steps = np.arange(1, len(values) + 1)
        ax.plot(steps, values, color=f"C{index % 10}", label=label, linewidth=1.3)
        if key == "accuracy":
            _mark_triggers(ax, row, steps, values, f"C{index % 10}")
        drawn = True
    return drawn


def _mark_triggers(
    ax: Any, row: Mapping[str, Any], steps: np.ndarray, values: np.ndarray, colour: str
) -> None:
    """A triangle on the run's line at every step where its guard put a stream back."""
    fired = np.asarray((row.get("curves") or {}).get("guard") or [], dtype=float)
    at = np.flatnonzero(np.nan_to_num(fired[: len(values)]) > 0)
    if at.size:
        ax.plot(steps[at], values[at], linestyle="none", marker="v", markersize=7, color=colour)


STREAM_PANELS = ("continual", "gradual", "ccc")
STREAM_WINDOW = 2_000  # images each point of a stream figure averages over


def windowed_mean(values: Sequence[float], window: int) -> np.ndarray:
    """The mean of the last ``window`` finite values at each point (fewer at the start): how accurate a
    run is *there*, where a running mean from the start would hide a late fall."""
    array = np.asarray(values, dtype=float)
    finite = np.isfinite(array)
    totals = np.concatenate([[0.0], np.cumsum(np.where(finite, array, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    ends = np.arange(1, len(array) + 1)
    starts = np.maximum(ends - window, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (totals[ends] - totals[starts]) / (counts[ends] - counts[starts])


def stream_panel(spec: Mapping[str, Any]) -> str | None:
    """The panel of a stream figure a run belongs to (``None`` for a run of another protocol)."""
    protocol = spec.get("protocol")
    if protocol not in STREAM_PANELS:
        return None
    return f"CCC, target {spec.get('target', 50.0):g} %" if protocol == "ccc" else str(protocol)


def plot_streams(rows: Sequence[Mapping[str, Any]], path: str | Path, *, title: str | None = None) -> Path:
    """Write the accuracy along each continual stream of ``rows`` (a panel per protocol, and per target for
    CCC; a line per run, a window of ``STREAM_WINDOW`` images per point) to ``path``. A panel of a stream
    over the 15 corruptions marks where each one starts."""
    panels: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        panel = stream_panel(row["spec"])
        if panel is not None and _curve(row, "accuracy") is not None:
            panels[panel].append(row)
    if not panels:
        raise ValueError("plot_streams needs runs of the continual, gradual or ccc protocol with curves")
    names = sorted(panels, key=lambda name: (STREAM_PANELS.index(name.split(",")[0].lower()), name))
    figure = Figure(figsize=(14, 3.2 * len(names)), layout="constrained")
    axes = figure.subplots(len(names), 1, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=True):
        members = sorted(
            panels[name], key=lambda row: (row["spec"]["model"], method_rank(row["spec"]["method"]))
        )
        for index, row in enumerate(members):
            _draw_stream(ax, row, f"C{index % 10}")
        ax.set_title(name)
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", fontsize="small", ncols=3, frameon=False)
    axes[-1].set_xlabel("images seen")
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def _model_then_method(row: Mapping[str, Any]) -> tuple[str, int]:
    return row["spec"]["model"], method_rank(row["spec"]["method"])


def _draw_stream(ax: Any, row: Mapping[str, Any], colour: str) -> None:
    """One run's line: the windowed accuracy at each batch's last image, its guard's actions, and (for a
    stream of the 15 corruptions) a dotted line where each corruption starts."""
    spec = row["spec"]
    batch = spec.get("batch_size", 64)
    values = np.asarray([math.nan if v is None else v for v in row["curves"]["accuracy"]], dtype=float)
    points = 100 * windowed_mean(values, max(1, STREAM_WINDOW // batch))
    seen = np.arange(1, len(points) + 1) * batch
    guard = spec.get("guard", "none")
    label = f"{spec['model']} {method_name(spec['method'])}" + ("" if guard == "none" else f" + {guard}")
    ax.plot(seen, points, color=colour, linewidth=1.1, label=f"{label} ({_accuracy(row):.1f})")
    _mark_triggers(ax, row, seen, points, colour)
    per_domain = len((row.get("metrics") or {}).get("per_domain") or {})
    if per_domain > 1:
        for start in np.arange(1, per_domain) * seen[-1] / per_domain:
            ax.axvline(start, color="grey", linewidth=0.5, linestyle=":")


def _accuracy(row: Mapping[str, Any]) -> float | None:
    """A run's accuracy in %, ``None`` if it has none."""
    value = (row.get("metrics") or {}).get("accuracy")
    return None if value is None or not math.isfinite(value) else 100.0 * value


def _axis_key(value: Any) -> tuple[int, float, str]:
    """Sort key for sweep values: numbers ascending, anything else (e.g. ``None``) after them."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return 0, float(value), ""
    return 1, 0.0, str(value)


def lr_grid(
    rows: Sequence[Mapping[str, Any]], *, row_param: str = "lr", col_param: str = "predictor_lr"
) -> tuple[list[Any], list[Any], np.ndarray]:
    """The sweep as a grid: the distinct values of ``hparams[row_param]`` (ascending), those of
    ``hparams[col_param]`` and the mean accuracy (%) of the runs at each pair, NaN where none ran.
    Several runs at one pair (seeds, corruptions) are averaged with equal weight."""
    found: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    for row in rows:
        hparams = row["spec"].get("hparams") or {}
        accuracy = _accuracy(row)
        if accuracy is not None:
            found[hparams.get(row_param), hparams.get(col_param)].append(accuracy)
    row_values = sorted({r for r, _ in found}, key=_axis_key)
    col_values = sorted({c for _, c in found}, key=_axis_key)
    grid = np.full((len(row_values), len(col_values)), np.nan)
    for (r, c), values in found.items():
        grid[row_values.index(r), col_values.index(c)] = statistics.fmean(values)
    return row_values, col_values, grid


def _tick(value: Any) -> str:
    """Tick label of a sweep value: shortest exact form (``0.0025``, ``1e-05``), anything else as text."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def plot_lr_heatmap(
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    row_param: str = "lr",
    col_param: str = "predictor_lr",
    title: str | None = None,
) -> Path:
    """Write the accuracy heat map of a learning-rate sweep to ``path``: rows ``η_f`` (``row_param``),
    columns ``η_h`` (``col_param``), each cell coloured and annotated with its accuracy (%)."""
    row_values, col_values, grid = lr_grid(rows, row_param=row_param, col_param=col_param)
    if not grid.size:
        raise ValueError("plot_lr_heatmap needs at least one run with an accuracy")
    figure = Figure(figsize=(1.1 * len(col_values) + 3, 0.7 * len(row_values) + 2.2), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", aspect="auto", origin="lower")
    _annotate(ax, grid)
    ax.set_xticks(range(len(col_values)), [_tick(v) for v in col_values])
    ax.set_yticks(range(len(row_values)), [_tick(v) for v in row_values])
    ax.set_xlabel(rf"$\eta_h$ ({col_param})")
    ax.set_ylabel(rf"$\eta_f$ ({row_param})")
    figure.colorbar(image, ax=ax, label="accuracy (%)")
    methods = sorted({row["spec"]["method"] for row in rows}, key=method_rank)
    ax.set_title(title or f"{', '.join(map(method_name, methods))}: accuracy (%) over the sweep")
    return _save(figure, path)


def _annotate(ax: Any, grid: np.ndarray) -> None:
    """Write each cell's accuracy in it (``–`` where nothing ran), dark on light cells and vice versa."""
    finite = grid[np.isfinite(grid)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (i, j), value in np.ndenumerate(grid):
        text = "–" if not np.isfinite(value) else f"{value:.1f}"
        colour = "black" if np.isfinite(value) and value > middle else "white"
        ax.text(j, i, text, ha="center", va="center", color=colour if np.isfinite(value) else "grey")


SUMMARY_WIDTH = 7.5  # inches: 900 px at the 120 dpi of :func:`_save`, the width the results page shows
SUMMARY_RANK = "(k/n): ZeroSiam's rank among the n adapting methods, k–m if level; (n of N ran): not ranked"
SUMMARY_MARKS = "†: one seed; outlined: beyond ±{limit:g} points, where the colour saturates"
ONE_SEED = "†"
# Points past which the colour saturates: a BatchNorm model's ±25-point swings would otherwise pale the
# one-to-five-point differences that separate methods everywhere else (the cells keep their numbers, and
# an outline marks each cell past the scale).
SUMMARY_SATURATION = 10.0


def summary_grid(summary: Summary) -> np.ndarray:
    """ZeroSiam − NoAdapt per (scenario, model) as an array, NaN where the cell is missing."""
    return np.array(
        [
            [np.nan if (d := summary.cell(s, m).difference) is None else d for m in summary.models]
            for s in summary.scenarios
        ],
        dtype=float,
    ).reshape(len(summary.scenarios), len(summary.models))


def summary_methods(summary: Summary, scenario: str) -> int:
    """The adapting methods of ``scenario``: the most that have a complete result in any of its cells."""
    return max((summary.cell(scenario, model).ranked for model in summary.models), default=0)


def summary_text(summary: Summary, scenario: str, model: str) -> str:
    """A cell's two lines: the difference (``†`` after it where one seed was run) over ZeroSiam's rank,
    or, where some of the scenario's adapting methods have no complete result, how many ran: a rank among
    three of six says nothing about the other three."""
    cell = summary.cell(scenario, model)
    if cell.difference is None:
        return MISSING
    difference, _, rank = cell.text.partition(" ")
    if cell.seeds == 1:
        difference += ONE_SEED
    methods = summary_methods(summary, scenario)
    if cell.ranked < methods:
        rank = f"({cell.ranked} of {methods} ran)"
    return f"{difference}\n{rank}"


def summary_limit(grid: np.ndarray) -> float:
    """The colour scale's half-width: the largest difference, at least 1 point, at most
    :data:`SUMMARY_SATURATION`."""
    finite = np.abs(grid[np.isfinite(grid)])
    largest = float(finite.max()) if finite.size else 0.0
    return min(max(largest, 1.0), SUMMARY_SATURATION)  # a flat grid still gets a scale


def summary_clipped(grid: np.ndarray, limit: float) -> np.ndarray:
    """The cells whose difference lies beyond the colour scale (drawn in its end colour)."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(grid) & (np.abs(grid) > limit)


def plot_summary(
    summary: Summary,
    path: str | Path,
    *,
    title: str | None = None,
) -> Path:
    """Write the summary heat map to ``path``: colour = ZeroSiam − NoAdapt on a diverging map centred on 0
    (blue above, red below, limits symmetric so that equal gains and losses look equally strong, saturating
    at :data:`SUMMARY_SATURATION`), each cell annotated with :func:`summary_text`, missing cells grey, the
    cells beyond the scale outlined, the one-seed cells marked."""
    grid = summary_grid(summary)
    if not grid.size:
        raise ValueError("plot_summary needs at least one scenario and one model")
    limit = summary_limit(grid)
    clipped = summary_clipped(grid, limit)
    height = 0.55 * len(summary.scenarios) + 2.0
    figure = Figure(figsize=(SUMMARY_WIDTH, height), layout="constrained")
    ax = figure.subplots()
    cmap = colormaps["RdBu"].with_extremes(bad="lightgrey")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-limit, vmax=limit, aspect="auto")
    _annotate_summary(ax, summary, grid, limit)
    _outline(ax, clipped)
    tilted = len(summary.models) > 4 or max(map(len, summary.models)) > 12  # long names would overlap
    rotation, alignment = (30, "right") if tilted else (0, "center")
    ax.set_xticks(range(len(summary.models)), summary.models, rotation=rotation, ha=alignment)
    ax.set_yticks(range(len(summary.scenarios)), summary.scenarios)
    ax.set_xlabel("model")
    ax.set_ylabel("scenario")
    figure.colorbar(
        image, ax=ax, label="ZeroSiam − NoAdapt (points)", extend="both" if clipped.any() else "neither"
    )
    marks = SUMMARY_MARKS.format(limit=limit)
    ax.set_title(
        title or f"ZeroSiam − NoAdapt in accuracy points, {summary.scope}\n{SUMMARY_RANK}\n{marks}",
        fontsize=10,
    )
    return _save(figure, path)


def _annotate_summary(ax: Any, summary: Summary, grid: np.ndarray, limit: float) -> None:
    """Each cell's :func:`summary_text`, on two lines so that it fits six models in 900 px."""
    size = 10 if len(summary.models) <= 6 else 8
    for (i, j), value in np.ndenumerate(grid):
        text = summary_text(summary, summary.scenarios[i], summary.models[j])
        ax.text(j, i, text, ha="center", va="center", color=_text_colour(value, limit), fontsize=size)


def _outline(ax: Any, clipped: np.ndarray) -> None:
    """A thick frame inside each clipped cell, black with a white core so that it shows on either end
    of the colour map."""
    from matplotlib.patches import Rectangle

    for i, j in zip(*np.nonzero(clipped), strict=True):
        for colour, width in (("black", 4.0), ("white", 1.5)):
            frame = Rectangle((j - 0.46, i - 0.44), 0.92, 0.88, fill=False, edgecolor=colour, linewidth=width)
            ax.add_patch(frame)


def _text_colour(value: float, limit: float) -> str:
    """Grey on a missing (grey) cell, white on the dark ends of the colour map, black elsewhere."""
    if not np.isfinite(value):
        return "dimgrey"
    return "white" if abs(value) > 0.6 * limit else "black"
