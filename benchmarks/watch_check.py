"""Stored unguarded runs made again under ``auto``'s watch, against what the store holds of them.

    PYTHONPATH=. python benchmarks/watch_check.py --db docs/results/study --model resnet26_gn \
        --protocol epochs tent:gaussian_noise tent:fog

``zerosiam bench`` puts ``auto``'s ``Watch`` (``zerosiam.parts.guards``) on a grid's unguarded runs where
the grid wears ``auto``, and does not make an ``auto`` run whose watched unguarded run says it would never
act. That rests on two claims, checked here on real runs: the watch changes nothing (the run made again
watched ends where the stored unguarded run did, to the last digit), and where it says ``auto`` never acts,
the stored ``auto`` run, if there is one, ends there too with no trigger. Each ``METHOD:CORRUPTION`` case
is the one stored unguarded run of that method, corruption, model and protocol (at its seed, rate and
stream); one row each, as it finishes.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from zerosiam.bench.runner import run_stacked
from zerosiam.bench.spec import NO_GUARD, RunSpec
from zerosiam.bench.textstore import open_store


def stored_runs(db: str, model: str, protocol: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The store's runs of ``model`` under ``protocol``, by (method, corruption, guard)."""
    runs = {}
    for row in open_store(db).rows("vision"):
        spec = row["spec"]
        if spec["model"] == model and spec["protocol"] == protocol:
            runs[spec["method"], spec["corruption"], spec.get("guard", NO_GUARD)] = row
    return runs


def check(case: str, runs: dict[tuple[str, str, str], dict[str, Any]]) -> str:
    """One case made again watched, as a table row beside its stored unguarded and ``auto`` runs."""
    method, corruption = case.split(":")
    unguarded = runs[method, corruption, NO_GUARD]
    watched = run_stacked([RunSpec.from_dict(unguarded["spec"])], watch=True)[0].metrics
    auto = runs.get((method, corruption, "auto"))
    first = watched.get("auto_guard_first_step", "never")
    stored_auto = (
        "–" if auto is None else f"{auto['metrics']['accuracy']:.4f} ({auto['metrics']['guard_triggers']})"
    )
    return (
        f"| {method} | {corruption} | {unguarded['metrics']['accuracy']:.4f} | {watched['accuracy']:.4f} "
        f"| {first} | {stored_auto} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cases", nargs="+", metavar="METHOD:CORRUPTION")
    parser.add_argument("--db", default="docs/results/study", help="the study's store (text or SQLite)")
    parser.add_argument("--model", default="resnet26_gn")
    parser.add_argument("--protocol", default="epochs")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = stored_runs(args.db, args.model, args.protocol)
    missing = [case for case in args.cases if (*case.split(":", 1), NO_GUARD) not in runs]
    if missing:
        parser.error(f"no stored unguarded {args.model} {args.protocol} run for {', '.join(missing)}")
    columns = (
        "method | corruption | stored unguarded | made again, watched | auto would act from | stored auto"
    )
    print(f"| {columns} (triggers) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |", flush=True)
    for case in args.cases:
        print(check(case, runs), flush=True)


if __name__ == "__main__":
    main()
