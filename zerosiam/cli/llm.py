"""``zerosiam llm``: online test-time adaptation of a causal LM on math benchmarks.

    zerosiam llm --model smollm2-135m --dataset math500,gsm8k --methods noadapt,tent,zerosiam \\
        --limit 20 --seed 0 --max-new-tokens 256 --db runs/llm.db

Each (dataset, method) is one run, keyed in the result store by the hash of its spec: a run that is
already stored is skipped, so an interrupted command resumes where it stopped. Every run starts from
the same pristine model. The learning rate defaults to the paper's per-dataset rate. The old spelling
of ``--predictor-lr``, ``--lr-predictor``, still works for one release, with a notice.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zerosiam.cli._args import csv_list, device_name, positive_int
from zerosiam.cli._db import check_writable_db, open_for_writing
from zerosiam.cli._errors import PROGRAM, Interrupted, UsageError, interruptible, report_failures, resume_hint


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "llm",
        help="adapt a language model online on math benchmarks and print the accuracy table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m or a local Hugging Face folder")
    parser.add_argument("--dataset", "--datasets", dest="datasets", type=csv_list, default=["math500"])
    parser.add_argument("--methods", type=csv_list, default=["noadapt", "tent", "zerosiam"])
    parser.add_argument("--limit", type=positive_int, help="a seeded random subset of this many questions")
    parser.add_argument("--seed", type=int, default=0, help="subset draw and LoRA initialisation")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256)
    parser.add_argument("--lr", type=float, help="η_f (and η_h); default: the paper's rate for the dataset")
    parser.add_argument("--predictor-lr", type=float, help="η_h when it should differ from --lr")
    parser.add_argument(
        "--lr-predictor", dest="predictor_lr", type=float, action=_OldSpelling, help=argparse.SUPPRESS
    )
    parser.add_argument("--k", type=positive_int, default=8, help="adapt on the first k generated tokens")
    parser.add_argument("--lora-rank", type=positive_int, default=8)
    parser.add_argument("--lora-targets", type=csv_list, default=["q_proj", "v_proj"])
    parser.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--mirror", help="folder holding math/*.jsonl (default: the project's data mirror)")
    parser.add_argument("--device", type=device_name, default="cpu", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--db", type=Path, default=Path("runs/llm.db"))
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=main)


class _OldSpelling(argparse.Action):
    """An option's old spelling: sets the new option's value, with a one-line deprecation notice."""

    NEW = {"--lr-predictor": "--predictor-lr"}

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        new = self.NEW[str(option_string)]
        print(f"{PROGRAM}: warning: {option_string} is deprecated; use {new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def main(args: argparse.Namespace) -> int:
    import torch

    from zerosiam.bench.device import resolve_device
    from zerosiam.bench.language import KIND, LanguageRunSpec, execute
    from zerosiam.bench.language_table import markdown_table

    check_writable_db(args.db)
    try:
        specs = [LanguageRunSpec(**values) for values in _spec_values(args)]  # checked before the model loads
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.threads:
        torch.set_num_threads(args.threads)
    store = open_for_writing(args.db)
    pending = sum(not store.has(spec.run_id) for spec in specs)
    print(f"{pending} run(s) to do, {len(specs) - pending} already in {args.db}", file=sys.stderr)
    try:
        with interruptible():
            failures = execute(
                specs, store, args.mirror, progress=not args.no_progress, device=resolve_device(args.device)
            )
    except Interrupted as stop:
        print(resume_hint(stop, store, specs, args.db), file=sys.stderr)
        raise
    ids = {spec.run_id for spec in specs}
    rows = [row for row in store.rows(kind=KIND) if row["run_id"] in ids]
    print("Accuracy (%)\n")
    print(markdown_table(rows, datasets=args.datasets))
    print("\nSeconds per question (generation + update)\n")
    print(markdown_table(rows, metric="seconds_per_question", scale=1.0, digits=2, datasets=args.datasets))
    return report_failures(failures)


def _spec_values(args: argparse.Namespace) -> list[dict]:
    return [
        dict(
            model=args.model,
            dataset=dataset,
            method=method,
            limit=args.limit,
            seed=args.seed,
            max_new_tokens=args.max_new_tokens,
            lr=args.lr,
            predictor_lr=args.predictor_lr,
            k=args.k,
            lora_rank=args.lora_rank,
            lora_targets=tuple(args.lora_targets),
        )
        for dataset in args.datasets
        for method in args.methods
    ]
