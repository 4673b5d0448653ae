"""``zerosiam select-lr``: choose learning rates on the 4 held-out extra corruptions, never the benchmark.

zerosiam select-lr --model resnet20 --methods tent,zerosiam --lr 1e-4,1e-3,1e-2 --predictor-lr 1e-3,1e-2
zerosiam select-lr --model resnet26_gn --methods tent,sar,zerosiam --lr-scale 0.3,1,3,10
zerosiam select-lr --model resnet20 --data-free --predictor-lr 1e-4,1e-3,1e-2,1e-1
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zerosiam.cli._args import device_name, positive_int
from zerosiam.cli._db import check_writable_db, open_for_writing
from zerosiam.cli._errors import UsageError
from zerosiam.cli._models import check_label_space, describe


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "select-lr",
        help="pick learning rates on held-out corruptions (or data-free for η_h)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--methods", default="tent,zerosiam")
    parser.add_argument("--lr", type=_floats, help="candidate η_f values")
    parser.add_argument("--predictor-lr", type=_floats, help="candidate η_h values (ZeroSiam)")
    parser.add_argument(
        "--lr-scale",
        type=_floats,
        help="candidate multiples of each method's published rates (both of ZeroSiam's): the same "
        "candidates for every method",
    )
    parser.add_argument("--dataset", default="cifar10c")
    parser.add_argument("--severity", type=int, default=5)
    parser.add_argument("--protocol", default="mild")
    parser.add_argument("--limit", type=positive_int, help="images per corruption (seeded subset)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--guard",
        default="none",
        help="the guard every candidate wears: none (default), rdumb, sar, auto; a guarded choice is "
        "recorded apart and never used by a grid's `rates: selected`",
    )
    parser.add_argument("--db", type=Path, default=Path("runs/results.db"))
    parser.add_argument("--workers", type=positive_int)
    parser.add_argument("--device", type=device_name, default="cpu", help="auto, cpu, cuda or cuda:N")
    parser.add_argument(
        "--data-free",
        action="store_true",
        help="choose η_h by adapting on Gaussian noise (the paper's appendix)",
    )
    parser.set_defaults(func=main)


def check_guard(name: str, data_free: bool) -> None:
    """One line naming the choices for an unknown guard; the data-free choice adapts on noise, which a
    guard has no business judging."""
    from zerosiam.bench.spec import NO_GUARD
    from zerosiam.parts.guards import guard_named

    try:
        guard_named(name)  # the one place that knows the guards' names
    except ValueError as error:
        raise UsageError(str(error)) from None
    if data_free and name != NO_GUARD:
        raise UsageError("--data-free adapts on pure noise, unguarded; drop --guard")


def main(args: argparse.Namespace) -> int:
    from zerosiam.bench.device import resolve_device
    from zerosiam.bench.select import data_free_predictor_lr, select_on_held_out

    check_writable_db(args.db)
    device = resolve_device(args.device)  # checked when the flags were read
    check_guard(args.guard, data_free=args.data_free)
    if args.data_free:
        describe(args.model, {})  # noise needs no labels, but the model must load
        if not args.predictor_lr:
            raise UsageError("--data-free needs --predictor-lr candidates")
        lr = args.lr[0] if args.lr else None
        store = open_for_writing(args.db)
        chosen, changes = data_free_predictor_lr(
            args.model, args.predictor_lr, lr=lr, seed=args.seed, device=device, store=store
        )
        for candidate, change in changes.items():
            print(f"predictor_lr={candidate:g}: |ΔH| = {change:.4f} nats")
        print(f"chosen predictor_lr = {chosen:g}")
        return 0
    candidates = (("lr", args.lr), ("predictor_lr", args.predictor_lr), ("lr_scale", args.lr_scale))
    sweep = {key: values for key, values in candidates if values}
    if not sweep:
        raise UsageError("give candidates with --lr, --predictor-lr or --lr-scale")
    check_label_space([args.model], {}, args.dataset)
    store = open_for_writing(args.db)
    choices = select_on_held_out(
        args.model,
        args.methods.split(","),
        sweep,
        store,
        dataset=args.dataset,
        severity=args.severity,
        protocol=args.protocol,
        limit=args.limit,
        seed=args.seed,
        guard=args.guard,
        workers=args.workers,
        device=args.device,
    )
    for choice in choices:
        print(
            f"{choice.method}: {choice.hparams} (mean accuracy on the extra corruptions "
            f"{100 * choice.accuracy:.1f} %)"
        )
        for label, accuracy in sorted(choice.table.items()):
            print(f"    {label}: {100 * accuracy:.1f} %")
    return 0
