"""``zerosiam report``: paper-style tables (and optionally figures) from a benchmark results database."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerosiam.cli._db import check_readable_db
from zerosiam.cli._errors import PROGRAM, UsageError

if (
    TYPE_CHECKING
):  # the benchmark (and torch) load in the functions that report: `zerosiam --help` needs neither
    from zerosiam.bench import report, summary
    from zerosiam.bench.noise import Noise
    from zerosiam.bench.spec import RunSpec


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``report`` and its filters and outputs."""
    parser = subparsers.add_parser("report", help="accuracy tables and diagnostic figures from results")
    parser.add_argument(
        "--db",
        required=True,
        metavar="PATH",
        help="results: a SQLite file written by the benchmark, or a text store folder (docs/results/study)",
    )
    parser.add_argument("--dataset", metavar="D", help="keep only this dataset (e.g. cifar10c)")
    parser.add_argument("--model", metavar="M", help="keep only this model (e.g. resnet20)")
    parser.add_argument(
        "--protocol", metavar="P", help="keep only this protocol (e.g. mild, label_shift, mixed)"
    )
    parser.add_argument("--severity", type=int, metavar="S", help="keep only this severity (1-5)")
    parser.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="keep only this seed: its accuracy on each corruption (the streams behind a --by-seed column)",
    )
    parser.add_argument(
        "--methods", metavar="M1,M2", help="keep only these methods (e.g. noadapt,tent,zerosiam)"
    )
    parser.add_argument(
        "--grid",
        action="append",
        metavar="YAML",
        help="keep only the runs of this grid file (as `zerosiam bench` ran it); repeat it for the union of "
        "several grids",
    )
    columns = parser.add_mutually_exclusive_group()
    columns.add_argument("--groups", action="store_true", help="Noise/Blur/Weather/Digital means as columns")
    columns.add_argument(
        "--by-seed",
        action="store_true",
        help="one column per seed (its average over the corruptions), then the average over seeds",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="folder for table.md, table.csv, table.tex and the figures"
    )
    parser.add_argument("--plot", action="store_true", help="diagnostics figure per table (needs --out)")
    parser.add_argument(
        "--plot-corruption",
        metavar="C",
        help="corruption whose runs --plot draws (default: mixed for the mixed protocol, else the first "
        "benchmark corruption present)",
    )
    parser.add_argument(
        "--heatmap", action="store_true", help="heat map of each learning-rate sweep (needs --out)"
    )
    parser.add_argument(
        "--caption",
        action="store_true",
        help="each table's title as a bold line instead of a ### heading (for a page embedding many tables)",
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        help="instead of the tables, one scenario x model grid of ZeroSiam - NoAdapt and ZeroSiam's rank "
        "among the adapting methods (summary.md and, with --plot, summary.png under --out)",
    )
    parser.add_argument(
        "--noise",
        action="store_true",
        help="instead of the tables, the noise floor per model and protocol: how far one spec's number "
        "moves over its replicas, beside the seeds' spread (zerosiam.bench.noise)",
    )
    parser.add_argument(
        "--guards",
        action="store_true",
        help="instead of the tables, each guard's goals over the rows (docs/guard.md): cells more than a "
        "point below NoAdapt, the mean below it, the share of the unguarded gain kept, triggers per 100 "
        "mild batches",
    )
    parser.add_argument(
        "--cells",
        action="store_true",
        help="with --guards, also one line per cell: NoAdapt and each guard's accuracy with its triggers "
        "(auto's by bar), and where SAR's rule and auto's watch would have fired on the unguarded run",
    )
    parser.add_argument(
        "--selections", action="store_true", help="the learning rates `zerosiam select-lr` chose, instead"
    )
    parser.add_argument(
        "--data-free",
        action="store_true",
        help="the data-free η_h choices of `zerosiam select-lr --data-free`, with each candidate's "
        "label-shift accuracy, instead",
    )
    parser.set_defaults(func=run_report)


def _load_rows(db: str) -> list[dict[str, Any]]:
    """All vision rows of the database (imported here so that ``--help`` works without the store)."""
    from zerosiam.bench.textstore import open_store

    return open_store(db).rows(kind="vision")


def refused(message: str) -> int:
    """Say why the report cannot be made, in the one line of a bad input, and give its exit code (2)."""
    print(f"{PROGRAM}: error: {message}", file=sys.stderr)
    return 2


def run_report(args: argparse.Namespace) -> int:
    """Print the Markdown tables; with ``--out`` also write them as Markdown, CSV and LaTeX, and the PNGs."""
    if (args.plot or args.heatmap) and not args.out:
        return refused("--plot and --heatmap write files; give --out DIR")
    if args.cells and not args.guards:
        return refused("--cells lists the cells of --guards; give --guards too")
    refusal = _store_refusal(args.db)
    if refusal is not None:
        return refusal
    from zerosiam.bench import report
    from zerosiam.bench.noise import noise_of

    if args.selections:
        return _print_selections(args)
    if args.data_free:
        return _print_data_free(args)
    filters = {
        "dataset": args.dataset,
        "model": args.model,
        "protocol": args.protocol,
        "severity": args.severity,
        "seed": args.seed,
        "methods": args.methods.split(",") if args.methods else None,
    }
    every = _load_rows(args.db)
    if args.noise:
        return _print_noise(report.select_rows(every, **filters, replica=None))
    rows = report.select_rows(every, **filters)
    worn: set[str] = set()  # the guards the grid files wear
    if args.grid:
        specs = _grids_specs(args.grid, args.db)
        if specs is None:
            return 2
        wanted = {spec.run_id for spec in specs}
        worn = {spec.guard for spec in specs}
        rows = [row for row in rows if row["run_id"] in wanted]
    if args.summary:
        return _print_summary(rows, args, noise_of(every))  # the rule from all the store's replicas
    if args.guards:
        return _print_guards(rows, worn, args.cells, noise_of(every))
    tables = report.build_tables(rows, groups=args.groups, by_seed=args.by_seed, noise=noise_of(every))
    if not tables:
        print("no vision results match these filters", file=sys.stderr)
        return 1
    print(report.to_markdown(tables, caption=args.caption), end="")
    if args.out:
        for path in _write_outputs(tables, rows, args):
            print(f"wrote {path}")
    return 0


def _store_refusal(db: str) -> int | None:
    """Open the store ``--db`` names (a text store is rebuilt here, once, into the cache the readers use);
    the exit code of a refusal when it cannot be opened, else None. Nothing is written before the path is
    known to hold a store: a folder, a missing path, a file that is not SQLite are refused first."""
    import sqlite3

    from zerosiam.bench.textstore import open_store

    try:
        check_readable_db(Path(db))
        open_store(db)
    except UsageError as error:
        return refused(str(error))
    except (ValueError, OSError, sqlite3.Error) as error:
        return refused(f"--db {db}: {error}")
    return None


def _grids_specs(paths: Sequence[str], db: str) -> list[RunSpec] | None:
    """The runs of several grid files (a study split into one grid per protocol); None when one of them
    cannot be read."""
    wanted: list[RunSpec] = []
    for path in paths:
        found = _grid_specs(path, db)
        if found is None:
            return None
        wanted += found
    return wanted


def _print_noise(rows: Sequence[Mapping[str, Any]]) -> int:
    """Print the noise table of ``rows`` (replicas included)."""
    from zerosiam.bench.noise import noise_cells
    from zerosiam.bench.noise import to_markdown as noise_markdown

    cells = noise_cells(rows)
    if not cells:
        print("no replicated runs match these filters (zerosiam bench --replicas 1,2)", file=sys.stderr)
        return 1
    print(noise_markdown(cells), end="")
    return 0


def _print_summary(rows: Sequence[Mapping[str, Any]], args: argparse.Namespace, noise: Noise) -> int:
    """Print the summary grid of ``rows``; with ``--out`` also write ``summary.md`` (and with ``--plot``
    ``summary.png``). An ambiguous cell is a usage error: the user narrows the rows, not the summary."""
    from zerosiam.bench import summary

    if args.groups or args.by_seed or args.heatmap:
        return refused("--summary has its own columns; drop --groups, --by-seed and --heatmap")
    try:
        found = summary.build_summary(rows, noise)
    except summary.AmbiguousCell as error:
        return refused(f"{error}; narrow it with --grid or --methods")
    if not found.cells:
        print("no vision results match these filters", file=sys.stderr)
        return 1
    text = summary.to_markdown(found)
    print(text, end="")
    if args.out:
        for path in _write_summary(found, text, Path(args.out), args.plot):
            print(f"wrote {path}")
    return 0


def _print_guards(rows: Sequence[Mapping[str, Any]], worn: set[str], cells: bool, noise: Noise) -> int:
    """Print the guards' goals over ``rows`` (a guard grid's, with ``--grid``), judging the guards the
    grids wear (``worn``) even where none of their runs had to be made, a loss only beyond ``noise``;
    with ``cells``, each cell too."""
    from zerosiam.bench.guard_goals import cells_markdown, guard_scores, to_markdown

    scores = guard_scores(rows, worn, noise)
    if not scores:
        print("no adapting runs match these filters", file=sys.stderr)
        return 1
    print(to_markdown(scores), end="")
    if cells:
        print("\n" + cells_markdown(rows, worn, noise), end="")
    return 0


def _write_summary(found: summary.Summary, text: str, out: Path, plot: bool) -> list[Path]:
    """Write ``summary.md`` (exactly what was printed) and, when asked, the heat map ``summary.png``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text, encoding="utf-8")
    if not plot:
        return [out / "summary.md"]
    from zerosiam.bench.plots import plot_summary

    return [out / "summary.md", plot_summary(found, out / "summary.png")]


def _grid_specs(path: str, db: str) -> list[RunSpec] | None:
    """The runs of the grid file ``path``, their rates resolved from the store; None (said on stderr)
    when the grid cannot be read."""
    from zerosiam.bench.grid import Grid
    from zerosiam.bench.select import grid_specs
    from zerosiam.bench.textstore import open_store

    try:
        return grid_specs(Grid.from_yaml(Path(path)), open_store(db))
    except (OSError, ValueError) as error:
        refused(f"grid {path}: {error}")
        return None


def _print_selections(args: argparse.Namespace) -> int:
    """The ``lr_selection`` rows of the store as tables, filtered by model and dataset when given."""
    from zerosiam.bench import report
    from zerosiam.bench.noise import noise_of
    from zerosiam.bench.select import SELECTION_KIND, current_selections
    from zerosiam.bench.textstore import open_store

    rows = [
        row
        for row in current_selections(open_store(args.db).rows(SELECTION_KIND))
        if all(
            v is None or row["spec"].get(k) == v
            for k, v in (("model", args.model), ("dataset", args.dataset))
        )
    ]
    if not rows:
        print("no learning-rate selection matches these filters", file=sys.stderr)
        return 1
    print(report.selections_markdown(rows, caption=args.caption), end="")
    print(_ties_markdown(rows, noise_of(_load_rows(args.db))), end="")
    return 0


def _ties_markdown(selections: Sequence[Mapping[str, Any]], noise: Noise) -> str:
    """The selections whose chosen rate won by less than the noise: the candidates tied with it and the
    smallest of them, which the tie rule (``zerosiam.bench.select.tie_broken``) takes; empty when none."""
    from zerosiam.bench.names import method_name
    from zerosiam.bench.select import tied

    lines = []
    for row in selections:
        spec, metrics = row["spec"], row["metrics"]
        runs = len(spec["corruptions"])
        band = noise.band(spec["model"], spec["protocol"], (spec["method"], spec["method"]), (runs, runs))
        close = tied(metrics["candidates"], band)
        chosen = ", ".join(f"{k}={v:g}" for k, v in sorted(metrics["chosen"].items())) or "defaults"
        if close[0] != chosen:
            lines.append(
                f"| {spec['model']} | {method_name(spec['method'])} | {chosen} | {band:.2f} | "
                f"{', '.join(close)} | {close[0]} |"
            )
    if not lines:
        return ""
    header = [
        "",
        "Chosen inside the noise: candidates within the band of the best are a tie, which the smallest rate "
        "takes (zerosiam.bench.select); the study's runs are at the recorded choice.",
        "",
        "| Model | Method | Recorded | Band (points) | Tied | Tie rule |",
        "| --- | --- | --- | ---: | --- | --- |",
    ]
    return "\n".join(header + lines) + "\n"


def _print_data_free(args: argparse.Namespace) -> int:
    """The ``data_free_selection`` rows of the store beside the accuracy of each candidate's runs."""
    from zerosiam.bench import report
    from zerosiam.bench.select import DATA_FREE_KIND
    from zerosiam.bench.textstore import open_store

    store = open_store(args.db)
    choices = [row for row in store.rows(DATA_FREE_KIND) if args.model in (None, row["spec"]["model"])]
    if not choices:
        print(
            "no data-free choice matches these filters; run `zerosiam select-lr --data-free`", file=sys.stderr
        )
        return 1
    print(report.data_free_markdown(choices, _load_rows(args.db), caption=args.caption), end="")
    return 0


def _write_outputs(
    tables: Sequence[report.Table], rows: Sequence[Mapping[str, Any]], args: argparse.Namespace
) -> list[Path]:
    """Write the three table files and the requested figures; return their paths."""
    from zerosiam.bench import report

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (
        ("table.md", report.to_markdown(tables, caption=args.caption)),
        ("table.csv", report.to_csv(tables)),
        ("table.tex", report.to_latex(tables)),
    ):
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    if args.plot:
        written += write_diagnostics(rows, out, args.plot_corruption)
        written += write_streams(rows, out)
    if args.heatmap:
        written += write_heatmaps(rows, out)
    return written


def _slug(*parts: Any) -> str:
    """A file-name-safe join of ``parts``."""
    return re.sub(r"[^A-Za-z0-9.+=-]+", "_", "_".join(str(part) for part in parts)).strip("_")


def _by_table(rows: Sequence[Mapping[str, Any]]) -> dict[tuple, list[Mapping[str, Any]]]:
    """Rows grouped by (dataset, model, protocol, severity), the key of a table."""
    groups: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        spec = row["spec"]
        groups[spec.get("dataset"), spec.get("model"), spec.get("protocol"), spec.get("severity")].append(row)
    return groups


def pick_plot_runs(rows: Sequence[Mapping[str, Any]], corruption: str | None) -> list[Mapping[str, Any]]:
    """The runs one diagnostics figure shows: those on ``corruption`` (default: the mixed stream if any,
    else the first benchmark corruption present), one per table line, at its lowest seed, latest rerun."""
    from zerosiam.bench import report

    present = {row["spec"].get("corruption") for row in rows}
    if corruption is None:
        ordered = [report.MIXED, *report.BENCHMARK, *sorted(map(str, present))]
        corruption = next(name for name in ordered if name in present)
    labels = report.run_labels(rows)
    chosen: dict[str, Mapping[str, Any]] = {}
    for row in rows:  # oldest first, so a later rerun replaces an earlier one
        if row["spec"].get("corruption") != corruption:
            continue
        label, seed = labels[row["run_id"]], row["spec"].get("seed") or 0
        if label not in chosen or seed <= (chosen[label]["spec"].get("seed") or 0):
            chosen[label] = row
    return list(chosen.values())


def write_diagnostics(rows: Sequence[Mapping[str, Any]], out: Path, corruption: str | None) -> list[Path]:
    """One diagnostics figure per table, for the runs :func:`pick_plot_runs` picks."""
    from zerosiam.bench.names import DATASET_NAMES
    from zerosiam.bench.plots import plot_diagnostics

    written = []
    for key, members in sorted(_by_table(rows).items(), key=lambda item: tuple(map(str, item[0]))):
        chosen = pick_plot_runs(members, corruption)
        if not chosen:
            continue
        name = chosen[0]["spec"].get("corruption")
        title = f"{DATASET_NAMES.get(key[0], key[0])}, {key[1]}, {key[2]}, severity {key[3]}: {name}"
        written.append(plot_diagnostics(chosen, out / f"diagnostics_{_slug(*key, name)}.png", title=title))
    return written


def _sweep_key(row: Mapping[str, Any]) -> tuple:
    """What must stay fixed within one heat map: the table key, the method and every other hparam."""
    spec = row["spec"]
    others = {k: v for k, v in (spec.get("hparams") or {}).items() if k not in ("lr", "predictor_lr")}
    return (
        spec.get("dataset"),
        spec.get("model"),
        spec.get("protocol"),
        spec.get("severity"),
        spec["method"],
        json.dumps(others, sort_keys=True),
    )


def write_streams(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """``streams.png``: accuracy along the continual, gradual and CCC streams of ``rows`` (none: nothing)."""
    from zerosiam.bench.plots import plot_streams, stream_panel

    drawn = [row for row in rows if stream_panel(row["spec"]) and (row.get("curves") or {}).get("accuracy")]
    return [plot_streams(drawn, out / "streams.png")] if drawn else []


def write_heatmaps(rows: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """A heat map for each group of runs (see :func:`_sweep_key`) that tried more than one pair of
    (``lr``, ``predictor_lr``); runs on several corruptions or seeds are averaged per cell. Runs that do not
    set both rates (method defaults, or a method without a predictor) are not part of any sweep."""
    from zerosiam.bench.names import DATASET_NAMES, method_name
    from zerosiam.bench.plots import plot_lr_heatmap

    groups: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        hparams = row["spec"].get("hparams") or {}
        if hparams.get("lr") is not None and hparams.get("predictor_lr") is not None:
            groups[_sweep_key(row)].append(row)
    written = []
    for key, members in sorted(groups.items(), key=lambda item: tuple(map(str, item[0]))):
        swept = [r["spec"].get("hparams") or {} for r in members]
        pairs = {(hparams.get("lr"), hparams.get("predictor_lr")) for hparams in swept}
        if len(pairs) < 2:
            continue
        corruptions = sorted({str(r["spec"].get("corruption")) for r in members})
        scope = corruptions[0] if len(corruptions) == 1 else f"mean over {len(corruptions)} corruptions"
        dataset = DATASET_NAMES.get(key[0], key[0])
        title = f"{method_name(key[4])} on {dataset}, {key[1]}, {key[2]}, severity {key[3]} ({scope})"
        path = out / f"heatmap_{_slug(*key[:5], len(written))}.png"
        written.append(plot_lr_heatmap(members, path, title=title))
    return written
