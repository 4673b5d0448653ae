"""Copy a study store into the committed one, with the curves the figures draw and no others.

    python benchmarks/study_export.py /tmp/study.db docs/results/study.db

A batch-64 run's per-step curves take about 20 kB and a batch-1 run's about 1 MB, so a store of the whole
study would be hundreds of MB. The committed store (docs/RESULTS.md) keeps every run's spec, metrics and
environment, and the curves of the seed-0 Gaussian-noise runs under label shift and mild only (``drawn``):
those are what the diagnostics figures draw. Rerunning a grid into a fresh store brings back every curve.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from zerosiam.bench.store import ResultStore

FIGURE_CORRUPTION = "gaussian_noise"
FIGURE_PROTOCOLS = ("label_shift", "mild")


def drawn(spec: dict[str, Any]) -> bool:
    """Whether a figure of docs/RESULTS.md draws this run's curves."""
    return (
        spec.get("corruption") == FIGURE_CORRUPTION
        and spec.get("protocol") in FIGURE_PROTOCOLS
        and spec.get("seed") == 0
    )


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
