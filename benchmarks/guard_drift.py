"""ZeroSiam's own signals, beside what a guard would need to know: from the curves the study's store keeps.

    PYTHONPATH=. python benchmarks/guard_drift.py --db docs/results/study

ZeroSiam records at every step how far its predictor has moved from the identity (``predictor_drift``,
‖θ_h − I‖_F) and its alignment term (``divergence``). Either could be a guard's signal, for ZeroSiam only:
a collapse might move h further, or the two branches further apart, than a gain does. This reads every
unguarded ZeroSiam run at its default settings (a rate scale only) on the guard grid's three models whose
curves are stored, sets each beside NoAdapt's curve on the same stream, and cuts it into windows of 16
steps: each window's gain over the source (labels no guard sees), the drift at its end and its mean
divergence. It prints each run's accuracy against NoAdapt's with its drift after the first window, its
largest drift and its largest window divergence (``--windows``: every window under its run). A signal is
of use where it parts the windows that lose from those that gain: the summary gives, per model, each
signal's range over the windows that gain more than 5 points, that stay within 5, and that lose more
than 5. Nothing is run.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from typing import Any

from zerosiam.bench.guard_goals import stream_key
from zerosiam.bench.textstore import open_store
from zerosiam.cli._args import csv_list

WINDOW = 16  # steps a row sums, as benchmarks/guard_signals.py
MARGIN = 5.0  # points above or below the source that make a window a gain or a loss
SIGNALS = ("predictor_drift", "divergence")
OUTCOMES = (("gains", lambda g: g > MARGIN), ("within", lambda g: abs(g) <= MARGIN),
            ("loses", lambda g: g < -MARGIN))  # fmt: skip


def rate(spec: dict[str, Any]) -> float:
    return spec["hparams"].get("lr_scale", 1.0)


def protocol(spec: dict[str, Any]) -> str:
    """The protocol, with its imbalance where a label-shift stream is not class-ordered."""
    ratio = float(spec.get("imbalance_ratio", math.inf))
    return spec["protocol"] + ("" if math.isinf(ratio) else f", imbalance {ratio:g}")


def default_zerosiam(spec: dict[str, Any], models: list[str]) -> bool:
    """An unguarded ZeroSiam run at its default settings but for the rate, on one of ``models``."""
    return (
        spec["method"] == "zerosiam"
        and spec.get("guard") in (None, "none")
        and set(spec["hparams"]) <= {"lr_scale"}
        and spec["model"] in models
    )


def windows(adapted: dict[str, list[float]], source: list[float]) -> Iterator[dict[str, float]]:
    """Each whole window's gain over the source in points, drift at its end and mean divergence."""
    accuracy = adapted["accuracy"]
    for start in range(0, len(accuracy) - WINDOW + 1, WINDOW):
        end = start + WINDOW
        gain = 100 * (sum(accuracy[start:end]) - sum(source[start:end])) / WINDOW
        divergence = adapted["divergence"][start:end]
        yield {"start": start, "gain": gain, "predictor_drift": adapted["predictor_drift"][end - 1],
               "divergence": sum(divergence) / len(divergence)}  # fmt: skip


Pair = tuple[dict[str, Any], dict[str, Any]]  # a ZeroSiam run, NoAdapt's run on its stream


def paired_runs(rows: list[dict[str, Any]], models: list[str]) -> Iterator[Pair]:
    """Each default ZeroSiam run with both signals' curves, with NoAdapt's accuracy curve on its stream;
    one run a (stream, rate) where a cell was run twice (on a CPU and on a GPU)."""
    source = {
        stream_key(row["spec"]): row
        for row in rows
        if row["spec"]["method"] == "noadapt" and row.get("curves", {}).get("accuracy")
    }
    cells = set()
    for row in rows:
        curves, stream = row.get("curves") or {}, stream_key(row["spec"])
        cell = (stream, rate(row["spec"]))
        if not (default_zerosiam(row["spec"], models) and all(curves.get(s) for s in SIGNALS)):
            continue
        if (
            cell not in cells
            and stream in source
            and len(curves["accuracy"]) == len(source[stream]["curves"]["accuracy"])
        ):
            cells.add(cell)
            yield row, source[stream]


def spread(values: list[float]) -> str:
    """A signal's range, or a dash where no window has that outcome."""
    return f"{min(values):.2f}–{max(values):.2f}" if values else "–"


def run_line(row: dict[str, Any], source: dict[str, Any], found: list[dict[str, float]]) -> str:
    """A run's accuracy against NoAdapt's on its stream, and its signals: the drift after the first
    window and at its largest, the largest window's mean divergence."""
    spec = row["spec"]
    return (
        f"| {spec['model']} | {protocol(spec)} | {spec['corruption']} | {rate(spec):g}× "
        f"| {100 * row['metrics']['accuracy']:.1f} | {100 * source['metrics']['accuracy']:.1f} "
        f"| {found[0]['predictor_drift']:.2f} | {max(w['predictor_drift'] for w in found):.2f} "
        f"| {max(w['divergence'] for w in found):.3f} |"
    )


def window_line(window: dict[str, float]) -> str:
    return (
        f"|  | steps {window['start']}–{window['start'] + WINDOW - 1} | gain {window['gain']:+.1f} | | | "
        f"| {window['predictor_drift']:.2f} | | {window['divergence']:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="docs/results/study")
    parser.add_argument("--model", type=csv_list, default=["resnet26_gn", "convnext_nano_ln", "vit_tiny_ln"])
    parser.add_argument("--windows", action="store_true", help="print each window under its run")
    args = parser.parse_args()
    seen: dict[str, list[dict[str, float]]] = {model: [] for model in args.model}
    print("| model | protocol | corruption | rate | accuracy | NoAdapt | ‖θ_h − I‖, step 16 "
          "| ‖θ_h − I‖, largest | divergence, largest window |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    pairs = paired_runs(open_store(args.db).rows("vision"), args.model)
    for row, source in sorted(
        pairs, key=lambda pair: (stream_key(pair[0]["spec"]), pair[0]["spec"]["hparams"].get("lr_scale", 1.0))
    ):
        found = list(windows(row["curves"], source["curves"]["accuracy"]))
        seen[row["spec"]["model"]] += found
        print(run_line(row, source, found))
        for window in found if args.windows else ():
            print(window_line(window))
    print(f"\n| model | windows gaining/within/losing {MARGIN:g} points "
          f"| {' | '.join(f'{s}, {name}' for name, _ in OUTCOMES for s in SIGNALS)} |")  # fmt: skip
    print("| --- | ---: |" + " --- |" * len(OUTCOMES) * len(SIGNALS))
    for model, found in seen.items():
        ranges = [spread([w[s] for w in found if keep(w["gain"])]) for _, keep in OUTCOMES for s in SIGNALS]
        counts = "/".join(str(sum(keep(w["gain"]) for w in found)) for _, keep in OUTCOMES)
        print(f"| {model} | {counts} | {' | '.join(ranges)} |")


if __name__ == "__main__":
    main()
