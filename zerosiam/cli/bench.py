"""``zerosiam bench``: run a grid of the paper's protocols and print the table.

    zerosiam bench --model resnet20 --corruptions gaussian_noise,fog --protocols mild,label_shift \\
        --methods noadapt,tent,zerosiam --db runs/results.db
    zerosiam bench --grid grid.yaml --backend ray
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerosiam.cli._args import csv_list, device_name, int_list, non_negative_float, positive_int
from zerosiam.cli._db import check_writable_db, open_for_writing
from zerosiam.cli._errors import Interrupted, UsageError, interruptible, report_failures, resume_hint
from zerosiam.cli._models import check_adaptable_models, check_label_space

if TYPE_CHECKING:  # the commands import the benchmark lazily: torch only for the commands that compute
    from zerosiam.bench.execution import Execution
    from zerosiam.bench.grid import Grid
    from zerosiam.bench.spec import RunSpec
    from zerosiam.bench.store import ResultStore


def _value(text: str) -> Any:
    """A Python literal (``1e-3``, ``True``, ``[1, 2]``), a float Python spells only as text (``nan``,
    ``inf``: so that ``--set lr=nan`` is refused as a number that is not finite, not as a word), else the
    text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return float(text) if text.strip().lower().lstrip("+-") in _NON_FINITE else text


_NON_FINITE = ("nan", "inf", "infinity")


def _assignments(items: list[str], many: bool) -> dict[str, Any]:
    """``key=value`` (or ``key=v1,v2`` for a sweep) into a mapping of Python literals."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"expected key=value, got {item!r}")
        out[key.strip()] = [_value(v) for v in csv_list(value)] if many else _value(value)
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run a benchmark grid and print its table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--grid", type=Path, help="a YAML file with the grid's axes (flags below override it)"
    )
    parser.add_argument("--model", "--models", dest="models", type=csv_list)
    parser.add_argument("--methods", type=csv_list)
    parser.add_argument("--dataset")
    parser.add_argument("--corruptions", help="comma-separated names, or 'benchmark' for all 15")
    parser.add_argument("--severity", "--severities", dest="severities", type=int_list)
    parser.add_argument("--protocols", type=csv_list)
    parser.add_argument("--seeds", type=int_list)
    parser.add_argument(
        "--replicas",
        type=int_list,
        help="executions of each run that differ by one rounding step (0: the run itself; docs/benchmark.md)",
    )
    parser.add_argument("--batch-size", type=positive_int)
    parser.add_argument(
        "--limit", type=positive_int, help="use this many images of each corruption (seeded subset)"
    )
    parser.add_argument(
        "--set",
        dest="hparams",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an adapt() option for every run, e.g. --set lr=1e-3",
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="sweep an option, e.g. --sweep predictor_lr=1e-3,1e-2",
    )
    parser.add_argument(
        "--stream",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a protocol's parameter, swept: target (CCC's source accuracy, %%), stream_length, noise, "
        "epochs, imbalance_ratio, e.g. --stream target=50,20",
    )
    parser.add_argument(
        "--model-option",
        dest="model_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of a timm:/builder:/torchscript:/hf: model, e.g. --model-option mean=0.5",
    )
    parser.add_argument(
        "--precision", help="the forward's precision: fp32 (default, as the paper), tf32, bf16, fp16"
    )
    parser.add_argument(
        "--guard",
        dest="guards",
        type=csv_list,
        help="the guard every method wears, or a comma list to compare: "
        "none (default), rdumb, sar, auto, asr",
    )
    parser.add_argument(
        "--rates",
        help="paper (default: each method's published rates) or selected (the choice `zerosiam "
        "select-lr` recorded in --db for each model and method)",
    )
    parser.add_argument(
        "--device",
        type=device_name,
        default="cpu",
        help="auto, cpu, cuda or cuda:N (not part of a run's identity)",
    )
    parser.add_argument(
        "--compile",
        nargs="?",
        const=True,
        default=False,
        metavar="MODE",
        help="torch.compile each run's model forward and its backward, in torch's default mode or MODE "
        "(reduce-overhead, max-autotune, ...); off by default (not part of a run's identity)",
    )
    parser.add_argument(
        "--channels-last",
        action="store_true",
        help="convolution weights and inputs in channels-last memory format (not part of a run's identity)",
    )
    parser.add_argument(
        "--fixed-shape",
        action="store_true",
        help="every decision of a step on the device, no read of it mid-step (not part of a run's identity)",
    )
    parser.add_argument(
        "--attention",
        metavar="BACKEND",
        help="scaled-dot-product attention on one backend: math, efficient, flash or cudnn (not part of a "
        "run's identity)",
    )
    parser.add_argument(
        "--frozen-bf16",
        action="store_true",
        help="bf16 runs: frozen linear and convolution weights stored in bfloat16 (not part of a run's "
        "identity)",
    )
    parser.add_argument(
        "--decode-on-device",
        action="store_true",
        help="image files (imagenet-c:PATH) read by the loader's workers and decoded on the device, a GPU's "
        "JPEG decoder (not part of a run's identity)",
    )
    parser.add_argument(
        "--graph",
        action="store_true",
        help="capture each step as a CUDA graph and replay it (a GPU; not with --guard asr; not part of a "
        "run's identity)",
    )
    parser.add_argument(
        "--gpus-per-run", type=float, default=0.0, help="Ray: GPU resources per run (0.5 shares)"
    )
    parser.add_argument("--db", type=Path, default=Path("runs/results.db"))
    parser.add_argument(
        "--remake-from",
        metavar="DEVICE",
        help="make the grid's runs stored from DEVICE again here, replacing them: cpu, gpu, or part of a "
        "device's name (H200, AMD EPYC); how a table or a guard cell comes onto one device",
    )
    parser.add_argument(
        "--one-device",
        action="store_true",
        help="make again here the runs of the grid's guard cells whose guards ran on different devices "
        "(those not made here; `zerosiam report --guards --cells` lists them), so each is judged on one",
    )
    parser.add_argument("--backend", choices=("local", "ray", "inline"), default="local")
    parser.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    parser.add_argument("--workers", type=positive_int, help="parallel runs (default: cores / threads)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads per run")
    parser.add_argument("--no-report", action="store_true", help="do not print the table at the end")
    parser.add_argument(
        "--checkpoint-every",
        type=non_negative_float,
        metavar="SECONDS",
        help="how often an unfinished run saves its progress beside --db, to go on from there if the grid "
        "is stopped (default: 300; 0: never)",
    )
    parser.add_argument(
        "--stack",
        action="store_true",
        help="run the batch-size-1 runs that differ only in corruption and seed as streams of one adapter "
        "(the same results, many times faster): any method with a linear predictor or none (not "
        "predictor=mlp), without a prelude, on a GroupNorm/LayerNorm model; other runs go alone",
    )
    parser.set_defaults(func=main, usage=parser.format_usage)


# The grid's models and methods when neither the file nor a flag names them.
DEFAULTS = {"models": ["resnet20"], "methods": ["noadapt", "tent", "zerosiam"]}
# The flags that say what to run (the rest say where and how): without any, there is no grid to run.
GRID_FLAGS = ("grid", "models", "methods", "dataset", "corruptions", "severities", "protocols", "seeds",
              "replicas", "batch_size", "limit", "hparams", "sweep", "stream", "model_options", "precision",
              "guards", "rates")  # fmt: skip
# The README's quick benchmark: what a user who asked for nothing is pointed to.
QUICK = (
    "zerosiam bench --model resnet26_gn --corruptions gaussian_noise --severity 5 --protocols label_shift "
    "--methods noadapt,tent,zerosiam --workers 3 --db runs/quick.db --no-report"
)


def refuse_an_unchosen_grid(args: argparse.Namespace) -> None:
    """Stop ``zerosiam bench`` given nothing to run, with the usage and the README's quick command: the
    defaults alone are 45 runs (resnet20 with noadapt, tent and zerosiam on every image of the 15
    benchmark corruptions), hours of work nobody asked for by name."""
    if any(getattr(args, name) not in (None, []) for name in GRID_FLAGS):
        return
    sys.stderr.write(args.usage())
    raise UsageError(
        "no grid given: name what to run with --grid FILE or flags (--model, --methods, --corruptions, ...), "
        f"or start with the quick benchmark: {QUICK}"
    )


def grid_from_args(args: argparse.Namespace) -> Grid:
    """The grid the flags (over the YAML file, if any) ask for, checked: a bad value is a ``UsageError``."""
    from zerosiam.bench.grid import Grid

    if args.grid and not args.grid.is_file():
        raise UsageError(f"grid file {str(args.grid)!r} does not exist")
    try:
        grid = Grid.from_yaml(args.grid, DEFAULTS) if args.grid else Grid.from_mapping({}, DEFAULTS)
        grid = grid.with_values(_flag_values(args, grid))
        grid.validate()
    except ValueError as error:
        raise UsageError(str(error)) from None
    check_label_space(grid.models, grid.model_options, grid.dataset)
    prelude = [grid.prelude["method"]] if grid.prelude else []
    check_adaptable_models(grid.models, grid.model_options, [*grid.methods, *prelude])
    return grid


def _flag_values(args: argparse.Namespace, grid: Grid) -> dict[str, Any]:
    """The grid's keys the flags set: each given flag replaces the file's value, except ``--set``,
    ``--sweep``, ``--stream`` and ``--model-option``, whose entries join the file's (a flag's entry
    wins)."""
    corruptions = args.corruptions
    flags = {
        "models": args.models,
        "methods": args.methods,
        "dataset": args.dataset,
        "corruptions": corruptions if corruptions in (None, "benchmark") else csv_list(corruptions),
        "severities": args.severities,
        "protocols": args.protocols,
        "seeds": args.seeds,
        "replicas": args.replicas,
        "batch_size": args.batch_size,
        "limit": args.limit,
        "precision": args.precision,
        "rates": args.rates,
        "guards": args.guards,
    }
    values = {key: value for key, value in flags.items() if value is not None}
    values["hparams"] = {**grid.hparams, **_assignments(args.hparams, many=False)}
    values["sweep"] = {**grid.sweep, **_assignments(args.sweep, many=True)}
    values["stream"] = {**grid.stream, **_assignments(args.stream, many=True)}
    values["model_options"] = {**grid.model_options, **_assignments(args.model_options, many=False)}
    return values


def _every(asked: float | None, default: float) -> float | None:
    """The checkpoint interval: the default when not asked, None (never) when asked for 0."""
    return default if asked is None else asked or None


def main(args: argparse.Namespace) -> int:
    from zerosiam.bench import datasets
    from zerosiam.bench.execution import execute, same_as_unguarded
    from zerosiam.bench.spec import KIND

    check_writable_db(args.db)
    refuse_an_unchosen_grid(args)
    grid = grid_from_args(args)  # everything is checked before a worker starts or a row is written
    if args.gpus_per_run < 0 or (args.gpus_per_run and args.backend != "ray"):
        raise UsageError(f"--gpus-per-run {args.gpus_per_run} needs --backend ray and a non-negative number")
    if args.one_device and args.backend == "ray":
        raise UsageError("--one-device makes runs again on this machine; use --backend local or inline")
    execution = _execution(args)
    if args.decode_on_device and not datasets.streams_files(grid.dataset):
        raise UsageError(f"--decode-on-device decodes image files, not {grid.dataset}: give imagenet-c:PATH")
    store = open_for_writing(args.db)  # the first write
    specs = _specs(grid, store)
    try:
        with interruptible():
            ran, failures = execute(specs, store, execution, args.remake_from, args.one_device)
    except Interrupted as stop:
        print(resume_hint(stop, store, specs, args.db), file=sys.stderr)
        raise
    failed = f", {len(failures)} failed" if failures else ""
    same = sum(not store.has(spec.run_id) and same_as_unguarded(spec, store) for spec in specs)
    spared = f", {same} the same as their stored unguarded run (their guard never acts on it)" if same else ""
    stored = len(specs) - ran - same
    remade = f" (those stored from {args.remake_from} made again)" if args.remake_from else ""
    remade += " (the runs of guard cells on several devices made again here)" if args.one_device else ""
    print(f"{ran - len(failures)} run(s) executed{remade}{failed}, {stored} already in {args.db}{spared}")
    if not args.no_report:
        from zerosiam.bench.report import build_tables, to_markdown

        wanted = {spec.run_id for spec in specs}
        print(to_markdown(build_tables([row for row in store.rows(KIND) if row["run_id"] in wanted])))
    return report_failures(failures)


def _specs(grid: Grid, store: ResultStore) -> list[RunSpec]:
    """The grid's runs; with ``rates: selected``, each with the rates ``select-lr`` recorded in ``store``
    (a method with none is a ``UsageError``), times each of ``rate_factors``."""
    from zerosiam.bench.select import grid_specs

    try:
        return grid_specs(grid, store)
    except ValueError as error:  # no learning rate selected for a method, or two that disagree
        raise UsageError(str(error)) from None


def _execution(args: argparse.Namespace) -> Execution:
    """Where and how the flags ask the runs to execute; an unknown compile mode is a ``UsageError``."""
    from zerosiam.bench.checkpoint import CHECKPOINT_EVERY
    from zerosiam.bench.execution import Execution
    from zerosiam.methods.speed import Speed

    try:
        speed = Speed(
            args.compile, args.channels_last, args.fixed_shape, args.graph, args.attention, args.frozen_bf16
        )  # an unknown mode or backend, or options that do not go together, stop here, before any run
    except ValueError as error:
        raise UsageError(f"--compile, --attention, --graph: {error}") from None
    return Execution(
        backend=args.backend,
        workers=args.workers,
        threads=args.threads,
        address=args.address,
        device=args.device,
        gpus_per_run=args.gpus_per_run,
        stack=args.stack,
        checkpoint_every=_every(args.checkpoint_every, CHECKPOINT_EVERY),
        decode_on_device=args.decode_on_device,
        **speed.options,
    )
