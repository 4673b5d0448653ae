"""Copy a study store into the committed one, with the curves the figures draw and no others.

    python benchmarks/study_export.py /tmp/study.db docs/results/study.db

A batch-64 run's per-step curves take about 20 kB and a batch-1 run's about 1 MB, so a store of the whole
study would be hundreds of MB. The committed store (docs/RESULTS.md) keeps every run's spec, metrics and
environment, and only the curves the figures draw (``drawn``): the seed-0 Gaussian-noise runs under label
shift and mild (the diagnostics), the runs of a finite imbalance ratio (the imbalance figure) and those
with a prelude (the collapsed model). Rerunning a grid into a fresh store brings back every curve.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from zerosiam.bench.store import ResultStore

FIGURE_CORRUPTION = "gaussian_noise"
FIGURE_PROTOCOLS = ("label_shift", "mild")


def drawn(spec: dict[str, Any]) -> bool:
    """Whether a figure of docs/RESULTS.md draws this run's curves."""
    diagnostics = (
        spec.get("corruption") == FIGURE_CORRUPTION
        and spec.get("protocol") in FIGURE_PROTOCOLS
        and spec.get("seed") == 0
    )
    imbalance = math.isfinite(spec.get("imbalance_ratio", math.inf))
    return diagnostics or imbalance or bool(spec.get("prelude"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args()
    if not args.source.is_file():
        parser.error(f"no store at {args.source}")
    new = ResultStore(args.source).copy_to(ResultStore(args.target), keep_curves=drawn)
    print(f"{new} new run(s) copied into {args.target}")


if __name__ == "__main__":
    main()
