"""Copy a study store into the committed one, with the curves the figures draw and no others.

    python benchmarks/study_export.py /tmp/study.db docs/results/study       # the committed text store
    python benchmarks/study_export.py /tmp/study.db /tmp/out/study.db        # a SQLite file (a .db target)

The committed store is text (``zerosiam.bench.textstore``: one line per run, sorted), so that an export
adds lines to the git history instead of another copy of a binary file; runs already there keep their
lines byte for byte, unless the store made them again later (a remake); a store older than the folder's
run never puts it back. A target named ``*.db`` is a SQLite file instead, as ``benchmarks/study_gpu.sh``
ships.

A batch-64 run's per-step curves take about 20 kB and a batch-1 run's about 1 MB, so a store of the whole
study would be hundreds of MB. The committed store (docs/RESULTS.md) keeps every run's spec, metrics and
environment, and only the curves the figures draw (``drawn``): the seed-0 Gaussian-noise runs under label
shift and mild (the diagnostics), the runs of a finite imbalance ratio (the imbalance figure) and those
with a prelude (the collapsed model), NoAdapt's on the continual, gradual and CCC streams (the source
model along them), every guard's on the held-out stream docs/guard.md draws (``GUARD_FIGURE``), and the
curves the target holds already. Rerunning a grid into a
fresh store brings back every curve. Failures are not results and are not exported to the text store.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from zerosiam.bench.store import ResultStore
from zerosiam.bench.textstore import write_text

FIGURE_CORRUPTION = "gaussian_noise"
FIGURE_PROTOCOLS = ("label_shift", "mild")
STREAM_PROTOCOLS = ("continual", "gradual", "ccc")  # docs/benchmark.md draws the source model along them
GUARD_FIGURE = {"model": "vit_tiny_ln", "protocol": "continual", "seed": 0}  # docs/guard.md draws every guard


def drawn(spec: dict[str, Any]) -> bool:
    """Whether a figure of docs/RESULTS.md draws this run's curves."""
    diagnostics = (
        spec.get("corruption") == FIGURE_CORRUPTION
        and spec.get("protocol") in FIGURE_PROTOCOLS
        and spec.get("seed") == 0
    )
    imbalance = math.isfinite(spec.get("imbalance_ratio", math.inf))
    source_along_streams = spec.get("protocol") in STREAM_PROTOCOLS and spec.get("method") == "noadapt"
    guards_along_stream = all(spec.get(key) == value for key, value in GUARD_FIGURE.items())
    stream = source_along_streams or guards_along_stream
    return diagnostics or imbalance or bool(spec.get("prelude")) or stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args()
    if not args.source.is_file():
        parser.error(f"no store at {args.source}")
    source = ResultStore(args.source)
    if args.target.suffix == ".db":
        new = source.copy_to(ResultStore(args.target), keep_curves=drawn)
    else:
        new = write_text(source, args.target, keep_curves=lambda row: drawn(row["spec"]))
    print(f"{new} new run(s) copied into {args.target}")


if __name__ == "__main__":
    main()
