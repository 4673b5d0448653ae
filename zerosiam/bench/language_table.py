"""The paper's math-reasoning table in Markdown: one row per method, one column per dataset.

Rows come from ``ResultStore.rows(kind="llm")`` (spec + metrics). A cell is the mean over the runs
that share (method, dataset) — several seeds, say — with their count when more than one, so a reader
never mistakes a one-seed number for an average. Methods keep the paper's order (NoAdapt first,
ZeroSiam last, as every report: ``bench.names``); datasets keep the order given or the paper's.
Rows stored before the language runs took the image runs' names are read under the new names.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zerosiam.bench.names import DATASET_NAMES, method_name, method_rank

DATASET_ORDER = ("math500", "collegemath", "aime24", "minerva", "gsm8k")
# Keys of language rows renamed to the image runs' names (old → new). Stored rows keep the names they
# were written with; ``current_names`` reads every row under the new ones.
RENAMED = {
    "lr_predictor": "predictor_lr",  # spec: η_h
    "final_predictor_distance": "final_predictor_drift",  # metrics: ‖θ_h − I‖_F after the last question
    "predictor_distance": "predictor_drift",  # curves: ‖θ_h − I‖_F after each question
}
# Spec fields under their first names in a run's identity, so that stored runs keep their ids
STORED_SPEC_NAMES = {"predictor_lr": "lr_predictor"}


def current_names(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored language row with the keys of its spec, metrics and curves under today's names."""
    renamed = dict(row)
    for part in ("spec", "metrics", "curves"):
        if isinstance(row.get(part), Mapping):
            renamed[part] = {RENAMED.get(key, key): value for key, value in row[part].items()}
    return renamed


def _ordered(present: Iterable[str], order: Sequence[str]) -> list[str]:
    present = set(present)
    return [name for name in order if name in present] + sorted(present - set(order))


def collect(rows: Iterable[dict[str, Any]], metric: str) -> dict[tuple[str, str], list[float]]:
    """Values of ``metric`` grouped by (method, dataset)."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in map(current_names, rows):
        spec, metrics = row["spec"], row["metrics"]
        if metric not in metrics:
            raise KeyError(f"run {row.get('run_id')} has no metric {metric!r}")
        cells[(spec["method"], spec["dataset"])].append(float(metrics[metric]))
    return cells


def format_cell(values: Sequence[float], scale: float, digits: int) -> str:
    if not values:
        return "–"
    mean = sum(values) / len(values)
    text = "nan" if math.isnan(mean) else f"{mean * scale:.{digits}f}"
    return text if len(values) == 1 else f"{text} (n={len(values)})"


def markdown_table(
    rows: Iterable[dict[str, Any]],
    metric: str = "accuracy",
    scale: float = 100.0,
    digits: int = 1,
    datasets: Sequence[str] | None = None,
) -> str:
    """Markdown table of ``metric`` (accuracy in % by default), methods × datasets, plus the average
    over the datasets shown when there are several."""
    cells = collect(rows, metric)
    if not cells:
        return "(no results)"
    methods = sorted({m for m, _ in cells}, key=method_rank)
    columns = list(datasets) if datasets else _ordered({d for _, d in cells}, DATASET_ORDER)
    average = len(columns) > 1
    header = ["Method", *(DATASET_NAMES.get(d, d) for d in columns)] + (["Average"] if average else [])
    rule = "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|"
    lines = ["| " + " | ".join(header) + " |", rule]
    for method in methods:
        values = [cells.get((method, d), []) for d in columns]
        row = [method_name(method), *(format_cell(v, scale, digits) for v in values)]
        if average:
            means = [sum(v) / len(v) for v in values if v]
            complete = len(means) == len(columns)
            row.append(format_cell([sum(means) / len(means)], scale, digits) if complete else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
