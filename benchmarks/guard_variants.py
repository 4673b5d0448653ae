"""``auto`` with other settings, on one model's cells of the guard grids, judged as the grid judges it.

    PYTHONPATH=. python benchmarks/guard_variants.py --model convnext_nano_ln \
        --variant min_agreement=0.6,max_narrowing=0.3
    PYTHONPATH=. python benchmarks/guard_variants.py --model convnext_nano_ln --variant escalate=true \
        --grids guard_blind_spot.yaml

Each ``--variant`` is ``SourceProbe`` with some of its settings changed (``NAME=VALUE`` pairs, the values
in JSON), run as a guard of its own, ``auto[...]``, on the model's cells of the grids named (those where
methods gain and where they fall by default) into a scratch store copied from the committed one
(``--db``; the study's store is never written), then judged with the unguarded runs, SAR's reset and
``auto`` on the same cells by the grid's goals (``zerosiam.bench.guard_goals``). Batch-1 streams run
stacked, as the study ran them. A run already in the scratch store is not run again, so a stopped process
goes on where it stopped, and processes may share the store: one variant each, or one variant split by
``--shard I/N`` (every N-th run from the I-th).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from zerosiam.bench.execution import execute
from zerosiam.bench.grid import Grid
from zerosiam.bench.guard_goals import guard_scores, to_markdown
from zerosiam.bench.select import grid_specs
from zerosiam.bench.spec import KIND, RunSpec
from zerosiam.bench.store import ResultStore
from zerosiam.bench.tasks import Execution
from zerosiam.bench.textstore import open_store
from zerosiam.cli._args import csv_list
from zerosiam.parts.guards import GUARDS, SourceProbe

GRIDS = Path("docs/results/grids")
COMPARED = ["none", "sar", "auto"]


def variant_guard(variant: str) -> str:
    """Register ``auto`` with the settings ``NAME=VALUE,...`` under a name of its own; return the name."""
    settings = {name: json.loads(value) for name, value in (pair.split("=") for pair in variant.split(","))}
    SourceProbe(**settings)  # an unknown setting fails here, naming it, before any run
    name = f"auto[{variant}]"
    GUARDS[name] = lambda: SourceProbe(**settings)
    return name


def scratch_store(path: Path, committed: Path) -> ResultStore:
    """A SQLite copy of the committed text store at ``path`` (made once; later calls add to it)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(open_store(committed).path, path)
    return ResultStore(path)


def cells(grids: list[str], model: str, guards: list[str], store: ResultStore) -> list[RunSpec]:
    """The grids' runs for one model and these guards, at the rates the store selected."""
    specs = []
    for name in grids:
        grid = Grid.from_yaml(GRIDS / name).with_values({"models": [model], "guards": guards})
        specs += grid_specs(grid, store)
    return specs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="convnext_nano_ln")
    parser.add_argument("--variant", action="append", required=True, help="NAME=VALUE,...; repeatable")
    parser.add_argument("--grids", type=csv_list, default=["guard_gains.yaml", "guard_falls.yaml"])
    parser.add_argument("--db", type=Path, default=Path("runs/guard_variants.db"))
    parser.add_argument("--committed", type=Path, default=Path("docs/results/study"))
    parser.add_argument("--shard", default="0/1", help="I/N: run every N-th run from the I-th")
    parser.add_argument("--judge-only", action="store_true", help="run nothing, judge what is stored")
    args = parser.parse_args()
    names = [variant_guard(variant) for variant in args.variant]
    store = scratch_store(args.db, args.committed)
    if not args.judge_only:
        first, count = (int(value) for value in args.shard.split("/"))
        shard = cells(args.grids, args.model, names, store)[first::count]
        execute(shard, store, Execution(backend="inline", stack=True))
    wanted = {spec.run_id for spec in cells(args.grids, args.model, COMPARED + names, store)}
    rows = [row for row in store.rows(KIND) if row["run_id"] in wanted]
    print(to_markdown(guard_scores(rows)), end="")


if __name__ == "__main__":
    main()
