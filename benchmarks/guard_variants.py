"""``auto`` with other settings, on some models' cells of the guard grids, judged as the grid judges it.

    PYTHONPATH=. python benchmarks/guard_variants.py --model convnext_nano_ln \
        --variant min_agreement=0.6,max_narrowing=0.3
    PYTHONPATH=. python benchmarks/guard_variants.py --model convnext_nano_ln --variant escalate=false \
        --grids guard_blind_spot.yaml

Each ``--variant`` is ``SourceProbe`` with some of its settings changed (``NAME=VALUE`` pairs, the values
in JSON), run as a guard of its own, ``auto[...]``, on the cells of the models named (``--model``, one or
more, comma-separated) in the grids named (those where methods gain and where they fall by default),
then judged with the unguarded runs, SAR's reset and ``auto`` on the same cells of the committed store by
the grid's goals (``zerosiam.bench.guard_goals``). Batch-1 streams run stacked, as the study ran them.

The variant's runs go into a store of their own (``--db``, SQLite; the study's store is never written):
a run already there is not run again, so a stopped process goes on where it stopped, and processes may
share it: one variant each, or one variant split by ``--shard I/N`` (every N-th run from the I-th;
``benchmarks/study_gpu.sh`` with ``VARIANT`` runs one shard a core on a GPU, ``--device cuda``). Where
a variant has not reached all its cells (stopped, or still running), every guard is judged on the cells
it reached, so that the table compares like with like.
``--export FOLDER`` adds them to a committed text store (``docs/results/guard_variants``, with only the
curves the study's store keeps, ``study_export.drawn``, so that a variant's run can stand in for
``auto``'s there, figures and all), which ``--db`` also reads, so that a judged table can be computed
again from git alone:

    PYTHONPATH=. python benchmarks/guard_variants.py --model resnet26_gn \
        --variant relative=false,escalate=false --db docs/results/guard_variants --judge-only

``--where-auto-fired`` (formerly ``--repeats-only``) is for a variant that can change a run only where
``auto`` fired: ``escalate=false`` changes only a trigger right after another, so a cell whose ``auto`` run
fired at most once runs under it exactly as under ``auto``; ``shrink`` and ``recover`` (the step's size
after a trigger, and when the full step comes back) change nothing before the first, and a looser bar (a
lower ``min_agreement``, a higher ``max_narrowing``) fires later or not at all, so a cell where ``auto``
never fired runs under any of them as under ``auto``; a finite ``max_widening`` only excuses triggers the
agreement bar made alone, so a cell whose every trigger crossed the narrowing bar runs under it as under
``auto``. Only the other cells are run, and the rest are
judged on ``auto``'s runs (as ``rdumb``'s idle cells are judged on the unguarded runs). A stricter bar,
or ``relative=false`` (a higher agreement bar), may fire where ``auto`` never did: it runs everywhere.

``--cells`` lists every judged cell under the table, as ``zerosiam report --guards --cells`` does: each
guard's accuracy with its triggers (by the bar each crossed, where a run counted them).

``--where-auto-lost`` runs a variant only on the cells where ``auto``'s stored run ends more than a point
below NoAdapt, and judges every guard on those cells alone: whether a setting saves what ``auto`` loses,
not what it costs elsewhere (``--protocols mild`` shows its false alarms, ``--protocols`` naming the
grids' streams to run and judge).

Until 2026-12-05 ``auto`` ran with ``relative`` and ``escalate`` off; its runs of that time are in
``docs/results/guard_variants`` as ``auto[relative=false,escalate=false]``, and the variants run then
are named there with both settings, so that each name still says what ran. Where a variant of that time
was judged on ``auto``'s runs (``escalate=true``'s cells where ``auto`` fired at most once), those runs
are stored under its name too, so that every judged table of ``docs/guard_log.md`` is computed again by
``--judge-only`` alone.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.study_export import drawn
from zerosiam.bench.execution import execute, same_as_unguarded
from zerosiam.bench.grid import Grid
from zerosiam.bench.guard_goals import LOSS, cells_markdown, guard_scores, to_markdown
from zerosiam.bench.select import grid_specs
from zerosiam.bench.spec import KIND, RunSpec
from zerosiam.bench.store import ResultStore
from zerosiam.bench.tasks import Execution
from zerosiam.bench.textstore import is_text_store, open_store, write_text
from zerosiam.cli._args import csv_list, device_name
from zerosiam.parts.guards import AUTO, GUARDS, SourceProbe

GRIDS = Path("docs/results/grids")
COMPARED = ["none", "sar", "auto"]
DEFAULTS = {name: p.default for name, p in inspect.signature(SourceProbe).parameters.items()}
LOOSER = {"min_agreement": -1, "max_narrowing": +1, "max_widening": -1}  # where a bar lets more through
AGREEMENT_ALONE = {"max_widening"}  # settings that can drop only a trigger the agreement bar made alone


def settings_of(variant: str) -> dict[str, Any]:
    """``NAME=VALUE,...`` as ``SourceProbe`` settings, the values read as JSON."""
    return {name: json.loads(value) for name, value in (pair.split("=") for pair in variant.split(","))}


def variant_guard(variant: str) -> str:
    """Register ``auto`` with the settings ``NAME=VALUE,...`` under a name of its own; return the name."""
    settings = settings_of(variant)
    SourceProbe(**settings)  # an unknown setting fails here, naming it, before any run
    name = f"auto[{variant}]"
    GUARDS[name] = lambda: SourceProbe(**settings)
    return name


def variant_store(path: Path) -> ResultStore:
    """The variants' runs: a SQLite file (made if need be, to run into) or a committed text store (read)."""
    if is_text_store(path):
        return open_store(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return ResultStore(path)


def cells(grids: list[str], models: list[str], guards: list[str], store: ResultStore) -> list[RunSpec]:
    """The grids' runs for these models and guards, at the rates the store selected."""
    specs = []
    for name in grids:
        grid = Grid.from_yaml(GRIDS / name).with_values({"models": models, "guards": guards})
        specs += grid_specs(grid, store)
    return specs


def as_auto(spec: RunSpec) -> RunSpec:
    return RunSpec.from_dict({**spec.as_dict(), "guard": AUTO})


def fired_before_change(name: str, value: Any) -> float | None:
    """How often ``auto`` must have fired in a cell before setting ``name`` to ``value`` can change its run
    there (never, at ``auto``'s own value), or None if it can change any run: ``escalate`` acts only on a
    trigger right after another, ``shrink`` and ``recover`` only after a trigger; a looser bar fires later
    than ``auto``'s or not at all, so not where ``auto`` never fired; a stricter bar, or ``relative=false``
    (a higher agreement bar), anywhere."""
    if value == DEFAULTS[name]:
        return math.inf
    if name == "escalate":
        return 2
    if name in ("shrink", "recover"):  # the step after a trigger: the same run until the first
        return 1
    if name in LOOSER and (value - DEFAULTS[name]) * LOOSER[name] > 0:
        return 1
    return None


def triggers_that_count(metrics: dict[str, Any], agreement_alone: bool) -> int:
    """``auto``'s triggers in a stored run, or with ``agreement_alone`` only those the agreement bar made
    alone (a trigger that crossed the narrowing bar fires under a setting that excuses only the agreement
    bar's): all of them where the run did not count its triggers by bar."""
    triggers = int(metrics.get("guard_triggers") or 0)
    if agreement_alone and "guard_triggers_on_narrowing" in metrics:
        return triggers - int(metrics["guard_triggers_on_narrowing"])
    return triggers


def quiet_auto_run(
    spec: RunSpec, committed: ResultStore, fired_below: float, agreement_alone: bool = False
) -> dict[str, Any] | None:
    """``auto``'s run of this cell if it fired fewer than ``fired_below`` times (counted as
    ``triggers_that_count``), else None: its stored run, or where none was made because ``auto``'s watch
    showed that it never acts there, the watched unguarded run (which ``auto``'s would have been, step for
    step)."""
    auto = as_auto(spec)
    if auto.run_id in committed:
        row = committed.get(auto.run_id)
        return row if triggers_that_count(row["metrics"], agreement_alone) < fired_below else None
    return committed.get(unguarded(spec)) if same_as_unguarded(auto, committed) else None


def stand_ins(
    specs: list[RunSpec], quiet: dict[str, dict[str, Any]], store: ResultStore
) -> list[dict[str, Any]]:
    """``auto``'s rows (``quiet``, by the variant's run id) as the variant's, for the cells that
    ``--where-auto-fired`` did not run."""
    unrun = [spec for spec in specs if spec.run_id in quiet and spec.run_id not in store]
    return [{**quiet[spec.run_id], "run_id": spec.run_id, "spec": spec.as_dict()} for spec in unrun]


def unguarded(spec: RunSpec, **changes: Any) -> str:
    """The run id of ``spec``'s cell without a guard (with ``changes``): what runs of one cell share."""
    return RunSpec.from_dict({**spec.as_dict(), "guard": "none", **changes}).run_id


def not_adapting(spec: RunSpec) -> str:
    """The run id of NoAdapt on ``spec``'s stream."""
    return unguarded(spec, method="noadapt", hparams={})


def lost_by_auto(spec: RunSpec, committed: ResultStore) -> bool:
    """Whether ``auto``'s stored run of this cell ends more than a point below NoAdapt on its stream."""
    auto, reference = as_auto(spec).run_id, not_adapting(spec)
    if auto not in committed or reference not in committed:
        return False
    accuracy = committed.get(auto)["metrics"]["accuracy"], committed.get(reference)["metrics"]["accuracy"]
    return 100 * (accuracy[1] - accuracy[0]) > LOSS


def judged_rows(
    grids: list[str], models: list[str], variants: list[RunSpec], store: ResultStore, committed: ResultStore
) -> list[dict[str, Any]]:
    """The rows the goals are judged on: the compared guards' runs of the variants' cells and NoAdapt's of
    their streams, from the committed store, and the variants'."""
    judged = {unguarded(spec) for spec in variants} | {not_adapting(spec) for spec in variants}
    guarded = cells(grids, models, COMPARED, committed)
    compared = {spec.run_id for spec in guarded if unguarded(spec) in judged}
    mine = {spec.run_id for spec in variants}
    return [row for row in committed.rows(KIND) if row["run_id"] in compared] + [
        row for row in store.rows(KIND) if row["run_id"] in mine
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=csv_list, default=["convnext_nano_ln"], help="one or more, commas")
    parser.add_argument("--methods", type=csv_list, help="only these of the grids' methods, commas")
    parser.add_argument("--protocols", type=csv_list, help="only these of the grids' streams, commas")
    parser.add_argument("--corruptions", type=csv_list, help="only these of the grids' corruptions, commas")
    parser.add_argument("--variant", action="append", required=True, help="NAME=VALUE,...; repeatable")
    parser.add_argument("--grids", type=csv_list, default=["guard_gains.yaml", "guard_falls.yaml"])
    parser.add_argument("--db", type=Path, default=Path("runs/guard_variants.db"), help="the variants' runs")
    parser.add_argument("--committed", type=Path, default=Path("docs/results/study"))
    parser.add_argument("--export", type=Path, help="add the variants' runs to this text store")
    parser.add_argument("--shard", default="0/1", help="I/N: run every N-th run from the I-th")
    parser.add_argument("--judge-only", action="store_true", help="run nothing, judge what is stored")
    parser.add_argument("--device", type=device_name, default="cpu", help="auto, cpu, cuda or cuda:N")
    where = "run only where auto's run could change"
    parser.add_argument("--where-auto-fired", "--repeats-only", action="store_true", help=where)
    lost = "run and judge only the cells auto's stored run ends more than a point below NoAdapt"
    parser.add_argument("--where-auto-lost", action="store_true", help=lost)
    parser.add_argument(
        "--cells", action="store_true", help="also every judged cell, as report --guards --cells"
    )
    args = parser.parse_args()
    fired = [fired_before_change(*pair) for variant in args.variant for pair in settings_of(variant).items()]
    if args.where_auto_fired and None in fired:
        parser.error(
            "--where-auto-fired takes only escalate, shrink, recover, a lower min_agreement, a higher "
            "max_narrowing, a finite max_widening"
        )
    if not args.judge_only and is_text_store(args.db):
        parser.error(f"--db {args.db} is a committed text store: give --judge-only, or run into a .db")
    names = [variant_guard(variant) for variant in args.variant]
    committed, store = open_store(args.committed), variant_store(args.db)
    variants = cells(args.grids, args.model, names, committed)  # NoAdapt wears no guard: not here
    variants = [spec for spec in variants if not args.methods or spec.method in args.methods]
    variants = [spec for spec in variants if not args.protocols or spec.protocol in args.protocols]
    variants = [spec for spec in variants if not args.corruptions or spec.corruption in args.corruptions]
    if args.where_auto_lost:
        variants = [spec for spec in variants if lost_by_auto(spec, committed)]
    quiet = {}  # the cells judged on auto's runs: by the variant's run id, auto's row
    if args.where_auto_fired:
        fired_below = min(fired, default=math.inf)
        alone = all(set(settings_of(variant)) <= AGREEMENT_ALONE for variant in args.variant)
        quiet = {s.run_id: row for s in variants if (row := quiet_auto_run(s, committed, fired_below, alone))}
    if not args.judge_only:
        first, count = (int(value) for value in args.shard.split("/"))
        runs = [s for s in variants if s.run_id not in quiet]
        execute(runs[first::count], store, Execution(backend="inline", stack=True, device=args.device))
    if args.export:
        new = write_text(store, args.export, keep_curves=lambda row: drawn(row["spec"]))
        print(f"{new} new run(s) in {args.export}")
    ran = [spec for spec in variants if spec.run_id in store or spec.run_id in quiet]
    if len(ran) < len(variants):  # a stopped or partial run: judge every guard on the cells it reached
        print(f"judged on the {len(ran)} of {len(variants)} variant cells stored")
    rows = judged_rows(args.grids, args.model, ran, store, committed)
    if args.where_auto_fired:
        rows += stand_ins(variants, quiet, store)
    print(to_markdown(guard_scores(rows)), end="")
    if args.cells:
        print("\n" + cells_markdown(rows), end="")


if __name__ == "__main__":
    main()
