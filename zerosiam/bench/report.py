"""Paper-style accuracy tables written as Markdown, CSV and LaTeX, and the learning-rate choices as
Markdown.

The tables' data (which rows, lines, columns and cells) is built by ``bench/tables.py``; this module
renders it, and re-exports what callers have always imported from here (``build_tables``, ``Table``,
``select_rows``, ``run_labels``, ...). The conventions of the cells are in ``tables``' docstring and in
docs/report.md.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zerosiam.bench.names import DATASET_NAMES, method_name, method_rank
from zerosiam.bench.spec import NO_GUARD
from zerosiam.bench.tables import (
    AVERAGE,
    BASELINE,
    COLUMN_NAMES,
    MISSING,
    MIXED,
    OVERALL,
    SEED_COLUMN,
    SHOWN_MEAN,
    WORSE_MARK,
    Cell,
    Table,
    build_tables,
    format_value,
    natural_key,
    run_labels,
    seed_columns,
    select_rows,
    table_columns,
)
from zerosiam.corruptions import BENCHMARK, GROUPS

# What callers import from here: the writers, and the tables' data that lived here before.
__all__ = [
    "AVERAGE",
    "BASELINE",
    "BENCHMARK",
    "COLUMN_NAMES",
    "CSV_FIELDS",
    "GROUPS",
    "MISSING",
    "MIXED",
    "OVERALL",
    "SEED_COLUMN",
    "SHOWN_MEAN",
    "WORSE_MARK",
    "Cell",
    "Table",
    "build_tables",
    "data_free_markdown",
    "format_cell",
    "latex_escape",
    "run_labels",
    "seed_columns",
    "select_rows",
    "selections_markdown",
    "table_columns",
    "title_line",
    "to_csv",
    "to_latex",
    "to_markdown",
]

CSV_FIELDS: tuple[str, ...] = (
    "dataset",
    "model",
    "protocol",
    "severity",
    "method",
    "column",
    "accuracy",
    "std",
    "seeds",
    "worse_than_noadapt",
)


def format_cell(cell: Cell, *, mark: str = "", plus_minus: str = " ± ") -> str:
    """``73.4``, ``73.4 ± 0.2``, with ``mark`` appended when the cell is below NoAdapt; ``–`` if missing."""
    if cell.mean is None:
        return MISSING
    text = f"{cell.mean:.1f}"
    if cell.std is not None:
        text += f"{plus_minus}{cell.std:.1f}"
    return text + (mark if cell.worse else "")


def title_line(title: str, caption: bool = False) -> str:
    """A table's title: a ``###`` heading, or with ``caption`` a bold line, for a page that embeds many
    tables and would otherwise repeat one heading (and its link anchor) many times."""
    return f"**{title}**" if caption else f"### {title}"


def to_markdown(tables: Sequence[Table], *, caption: bool = False) -> str:
    """All tables as Markdown: a title (see :func:`title_line`), the table, and its notes under it."""
    blocks = []
    for table in tables:
        header = ["Method"] + [COLUMN_NAMES.get(c, c) for c in table.columns]
        lines = [title_line(table.title, caption), ""]
        lines += [_md_row(header), _md_row(["---"] + ["---:"] * len(table.columns))]
        for method in table.methods:
            cells = [format_cell(table.cell(method, c), mark=f" {WORSE_MARK}") for c in table.columns]
            lines.append(_md_row([method] + cells))
        lines += [
            "",
            f"{WORSE_MARK} = below NoAdapt in the same column (beyond the noise); {MISSING} = no result.",
        ]
        lines += [f"- {note}" for note in table.notes]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def selections_markdown(rows: Iterable[Mapping[str, Any]], *, caption: bool = False) -> str:
    """The learning rates ``zerosiam select-lr`` chose (rows of kind ``lr_selection``), one Markdown table
    per (dataset, protocol, severity): a line per model and method with every candidate's mean accuracy
    on the held-out corruptions, the chosen one in bold."""
    by_setting: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        spec = row["spec"]
        by_setting[spec["dataset"], spec["protocol"], spec["severity"]].append(row)
    blocks = []
    for (dataset, protocol, severity), members in sorted(by_setting.items()):
        candidates = list(dict.fromkeys(key for row in members for key in row["metrics"]["candidates"]))
        candidates.sort(key=natural_key)
        title = f"Learning rates chosen on {DATASET_NAMES.get(dataset, dataset)}'s held-out corruptions"
        title += f", protocol {protocol}, severity {severity}: mean accuracy (%)"
        lines = [title_line(title, caption), ""]
        lines += [
            _md_row(["Model", "Method", *candidates]),
            _md_row(["---", "---"] + ["---:"] * len(candidates)),
        ]
        members.sort(key=lambda row: (row["spec"]["model"], method_rank(row["spec"]["method"])))
        for row in members:
            metrics = row["metrics"]
            chosen = ", ".join(f"{k}={format_value(v)}" for k, v in sorted(metrics["chosen"].items()))
            cells = []
            for key in candidates:
                value = metrics["candidates"].get(key)
                text = MISSING if value is None else f"{100 * value:.1f}"
                cells.append(f"**{text}**" if key == chosen else text)
            method = method_name(row["spec"]["method"])
            guard = row["spec"].get("guard", NO_GUARD)
            method += f" (guard={guard})" if guard != NO_GUARD else ""
            lines.append(_md_row([row["spec"]["model"], method, *cells]))
        corruptions = ", ".join(members[0]["spec"]["corruptions"])
        lines += ["", f"Bold: the chosen rate. Mean online accuracy over {corruptions}."]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def data_free_markdown(
    choices: Iterable[Mapping[str, Any]], runs: Iterable[Mapping[str, Any]], *, caption: bool = False
) -> str:
    """The data-free η_h choices (rows of kind ``data_free_selection``) as the paper's Table V: per model,
    each candidate's entropy change on pure noise (the chosen one in bold) above its label-shift accuracy,
    the mean over the ZeroSiam runs in ``runs`` that set exactly that η_f and η_h."""
    accuracies: dict[tuple, list[float]] = defaultdict(list)
    corruptions: dict[str, set[str]] = defaultdict(set)
    for row in runs:
        spec, hparams = row["spec"], row["spec"].get("hparams") or {}
        if (
            spec["method"] == "zerosiam"
            and spec["protocol"] == "label_shift"
            and set(hparams) == {"lr", "predictor_lr"}
        ):
            key = (spec["model"], hparams["lr"], hparams["predictor_lr"])
            accuracies[key].append(100.0 * row["metrics"]["accuracy"])
            corruptions[spec["model"], hparams["lr"]].add(spec["corruption"])
    blocks = []
    for row in sorted(choices, key=lambda row: row["spec"]["model"]):
        spec, metrics = row["spec"], row["metrics"]
        model, lr, candidates = spec["model"], spec["lr"], spec["candidates"]
        changes = [f"{metrics['entropy_change'][f'{c:g}']:.4f}" for c in candidates]
        changes = [
            f"**{text}**" if c == metrics["chosen"] else text
            for c, text in zip(candidates, changes, strict=True)
        ]
        scope = sorted(corruptions[model, lr])
        cells = [_partial_mean(accuracies.get((model, lr, c), []), len(scope)) for c in candidates]
        title = (f"Data-free η_h for ZeroSiam on {model} (η_f = {lr:g}): entropy change on "
                 f"{spec['images']:,} pure-noise images, and label-shift accuracy")  # fmt: skip
        lines = [title_line(title, caption), "", _md_row(["", *(f"η_h = {c:g}" for c in candidates)]),
                 _md_row(["---"] + ["---:"] * len(candidates)),
                 _md_row(["|ΔH| (nats)", *changes]), _md_row(["accuracy (%)", *cells]), "",
                 f"Bold: the data-free choice (least |ΔH|). Accuracy: mean over "
                 f"{', '.join(scope) or 'no run yet'}; (k/n) where only k of them ran."]  # fmt: skip
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _partial_mean(values: Sequence[float], expected: int) -> str:
    """The mean of ``values`` to one decimal, marked ``(k/n)`` when fewer than ``expected`` ran."""
    if not values:
        return MISSING
    text = f"{statistics.fmean(values):.1f}"
    return text if len(values) >= expected else f"{text} ({len(values)}/{expected})"


def _md_row(cells: Sequence[str]) -> str:
    """One Markdown table row; a ``|`` inside a label would split the cell, so it is escaped."""
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def to_csv(tables: Sequence[Table]) -> str:
    """All tables as one long CSV: a line per (table, method, column) with the accuracy (% , one decimal,
    empty if missing), its std, the number of seeds and a 0/1 ``worse_than_noadapt`` flag."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for table in tables:
        for method in table.methods:
            for column in table.columns:
                cell = table.cell(method, column)
                writer.writerow(
                    {
                        "dataset": table.dataset,
                        "model": table.model,
                        "protocol": table.protocol,
                        "severity": table.severity,
                        "method": method,
                        "column": column,
                        "accuracy": "" if cell.mean is None else f"{cell.mean:.1f}",
                        "std": "" if cell.std is None else f"{cell.std:.1f}",
                        "seeds": cell.seeds,
                        "worse_than_noadapt": int(cell.worse),
                    }
                )
    return buffer.getvalue()


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters so that model and method names compile verbatim."""
    return "".join(_LATEX_SPECIAL.get(char, char) for char in text)


def _latex_cell(cell: Cell) -> str:
    """A LaTeX cell: ``--`` if missing, std in small type, red when below NoAdapt."""
    if cell.mean is None:
        return "--"
    text = f"{cell.mean:.1f}"
    if cell.std is not None:
        text += rf"{{\scriptsize$\pm${cell.std:.1f}}}"
    return rf"\textcolor{{red}}{{{text}}}" if cell.worse else text


def _latex_group_header(columns: Sequence[str]) -> list[str]:
    """The paper's second header line naming the corruption groups, only when corruptions are columns."""
    if columns[0] not in BENCHMARK:
        return []
    spans, rules, start = [""], [], 2
    for group, members in GROUPS.items():
        spans.append(rf"\multicolumn{{{len(members)}}}{{c}}{{{COLUMN_NAMES[group]}}}")
        rules.append(rf"\cmidrule(lr){{{start}-{start + len(members) - 1}}}")
        start += len(members)
    spans += [""] * (len(columns) - len(BENCHMARK))
    return [" & ".join(spans) + r" \\", " ".join(rules)]


def to_latex(tables: Sequence[Table]) -> str:
    """All tables as LaTeX ``table`` environments (needs ``\\usepackage{booktabs,xcolor}``); cells below
    NoAdapt are red, notes become a footnote-size paragraph under the tabular."""
    blocks = []
    for table in tables:
        lines = [
            r"% requires \usepackage{booktabs,xcolor}",
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{latex_escape(table.title)}}}",
            r"\setlength{\tabcolsep}{3pt}",
            rf"\begin{{tabular}}{{l{'c' * len(table.columns)}}}",
            r"\toprule",
            *_latex_group_header(table.columns),
            " & ".join(["Method"] + [COLUMN_NAMES.get(c, c) for c in table.columns]) + r" \\",
            r"\midrule",
        ]
        for method in table.methods:
            cells = [_latex_cell(table.cell(method, column)) for column in table.columns]
            lines.append(" & ".join([latex_escape(method)] + cells) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}"]
        notes = ["Red: below NoAdapt in the same column; --: no result."] + table.notes
        lines.append(r"\par\footnotesize " + " ".join(latex_escape(note) for note in notes))
        lines.append(r"\end{table}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
