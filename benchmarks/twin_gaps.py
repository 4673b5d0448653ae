"""How far the store's zero-trigger guarded runs end from their unguarded twins, by what differs.

    PYTHONPATH=. python benchmarks/twin_gaps.py --db docs/results/study

A guarded run whose guard never acted computes what its unguarded twin computes, so any gap between the
two is the execution's: another device, another stack, and for DeYO and COME other random draws (their
patch orders came from the device's generator until 2026-12-07, and a stack draws all its streams' at
once). One row per (batch-1 or batch-64 protocol, same device or not, DeYO/COME or not): the pairs, how
many differ by 0.1 point or more and by 1 point or more, and the largest gap.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from zerosiam.bench.batches import STACKED_PROTOCOLS
from zerosiam.bench.guard_goals import cell_key, device_of
from zerosiam.bench.spec import NO_GUARD
from zerosiam.bench.textstore import open_store

RANDOM_DRAWS = ("deyo", "come")  # the methods that draw patch orders


def gaps(rows: list[Mapping[str, Any]]) -> dict[tuple[str, bool, bool], list[float]]:
    """The gaps in points, by (protocol kind, same device, a method with random draws)."""
    unguarded = {cell_key(r["spec"]): r for r in rows if r["spec"].get("guard", NO_GUARD) == NO_GUARD}
    found: dict[tuple[str, bool, bool], list[float]] = defaultdict(list)
    for row in rows:
        spec, metrics = row["spec"], row["metrics"]
        if spec.get("guard", NO_GUARD) == NO_GUARD or metrics.get("guard_triggers"):
            continue
        twin = unguarded.get(cell_key(spec))
        if twin is None:
            continue
        kind = "batch 1" if spec["protocol"] in STACKED_PROTOCOLS else "batch 64"
        key = (kind, device_of(row) == device_of(twin), spec["method"] in RANDOM_DRAWS)
        found[key].append(100 * abs(metrics["accuracy"] - twin["metrics"]["accuracy"]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="docs/results/study")
    args = parser.parse_args()
    found = gaps(open_store(args.db).rows("vision"))
    print("| protocols | devices | methods | pairs | ≥ 0.1 point | ≥ 1 point | largest |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for (kind, same, draws), values in sorted(found.items()):
        devices = "same" if same else "GPU vs CPU"
        methods = "DeYO, COME" if draws else "the others"
        wide = sum(v >= 0.1 for v in values)
        wider = sum(v >= 1.0 for v in values)
        print(f"| {kind} | {devices} | {methods} | {len(values)} | {wide} | {wider} | {max(values):.1f} |")


if __name__ == "__main__":
    main()
