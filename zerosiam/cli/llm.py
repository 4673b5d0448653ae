"""``zerosiam llm``: online test-time adaptation of a causal LM on math benchmarks.

    zerosiam llm --model smollm2-135m --dataset math500,gsm8k --methods noadapt,tent,zerosiam \\
        --limit 20 --seed 0 --max-new-tokens 256 --db runs/llm.db

Each (dataset, method) is one run, keyed in the result store by the hash of its spec: a run that is
already stored is skipped, so an interrupted command resumes where it stopped. Every run starts from
the same pristine model. The learning rate defaults to the paper's per-dataset rate.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
from pathlib import Path
from typing import Any

from zerosiam.cli._args import csv_list


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


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
    parser.add_argument("--limit", type=_positive, help="a seeded random subset of this many questions")
    parser.add_argument("--seed", type=int, default=0, help="subset draw and LoRA initialisation")
    parser.add_argument("--max-new-tokens", type=_positive, default=256)
    parser.add_argument("--lr", type=float, help="η_f (and η_h); default: the paper's rate for the dataset")
    parser.add_argument("--lr-predictor", type=float, help="η_h when it should differ from --lr")
    parser.add_argument("--k", type=_positive, default=8, help="adapt on the first k generated tokens")
    parser.add_argument("--lora-rank", type=_positive, default=8)
    parser.add_argument("--lora-targets", type=csv_list, default=["q_proj", "v_proj"])
    parser.add_argument("--threads", type=_positive, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--mirror", help="folder holding math/*.jsonl (default: the project's data mirror)")
    parser.add_argument("--db", type=Path, default=Path("runs/llm.db"))
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=main)


def run_spec(args: argparse.Namespace, dataset: str, method: str) -> dict[str, Any]:
    """Everything that determines a run's numbers (and hence its identity in the store)."""
    from zerosiam.llm.math_data import get_dataset

    return {
        "model": args.model,
        "dataset": dataset,
        "method": method,
        "limit": args.limit,
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "lr": args.lr if args.lr is not None else get_dataset(dataset).learning_rate,
        "lr_predictor": args.lr_predictor,
        "k": args.k,
        "alpha": 1.0,
        "lora_rank": args.lora_rank,
        "lora_targets": list(args.lora_targets),
        "e0": 0.4,
    }


def environment(threads: int | None) -> dict[str, Any]:
    import peft
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "threads": threads or torch.get_num_threads(),
    }


def execute_run(spec: dict[str, Any], base: Any, tokenizer: Any, mirror: str | None, progress: bool) -> tuple:
    """One (dataset, method) run from a copy of the pristine model; returns (metrics, curves)."""
    import torch
    from tqdm import tqdm

    from zerosiam.llm.adapter import LMAdapter, LMConfig
    from zerosiam.llm.loop import run_online, summarise
    from zerosiam.llm.math_data import load_problems

    problems = load_problems(spec["dataset"], limit=spec["limit"], seed=spec["seed"], mirror=mirror)
    config = LMConfig(
        lr=spec["lr"],
        lr_predictor=spec["lr_predictor"],
        k=spec["k"],
        alpha=spec["alpha"],
        lora_rank=spec["lora_rank"],
        lora_targets=tuple(spec["lora_targets"]),
        max_new_tokens=spec["max_new_tokens"],
        e0=spec["e0"],
    )
    torch.manual_seed(spec["seed"])
    adapter = LMAdapter(copy.deepcopy(base), spec["method"], config)
    label = f"{spec['method']}/{spec['dataset']}"
    with tqdm(total=len(problems), desc=label, disable=not progress, file=sys.stderr) as bar:
        records = run_online(adapter, tokenizer, problems, progress=bar)
    return summarise(records)


def main(args: argparse.Namespace) -> int:
    import torch

    from zerosiam.bench.store import ResultStore, run_id_for
    from zerosiam.llm.adapter import LMConfig
    from zerosiam.llm.math_data import get_dataset
    from zerosiam.llm.model import load_causal_lm
    from zerosiam.llm.objectives import get_method
    from zerosiam.llm.table import markdown_table

    for name in args.datasets:
        get_dataset(name)
    for name in args.methods:
        get_method(name)
    LMConfig(k=args.k, max_new_tokens=args.max_new_tokens)  # validates before the slow model load
    if args.threads:
        torch.set_num_threads(args.threads)
    args.db.parent.mkdir(parents=True, exist_ok=True)
    store = ResultStore(args.db)
    specs = [run_spec(args, d, m) for d in args.datasets for m in args.methods]
    todo = [spec for spec in specs if not store.has(run_id_for(spec))]
    print(f"{len(todo)} run(s) to do, {len(specs) - len(todo)} already in {args.db}", file=sys.stderr)
    if todo:
        base, tokenizer = load_causal_lm(args.model)
        env = environment(args.threads)
        for spec in todo:
            metrics, curves = execute_run(spec, base, tokenizer, args.mirror, not args.no_progress)
            store.put(run_id_for(spec), "llm", spec, metrics, curves, env)
    ids = {run_id_for(spec) for spec in specs}
    rows = [row for row in store.rows(kind="llm") if row["run_id"] in ids]
    print("Accuracy (%)\n")
    print(markdown_table(rows, datasets=args.datasets))
    print("\nSeconds per question (generation + update)\n")
    print(markdown_table(rows, metric="seconds_per_question", scale=1.0, digits=2, datasets=args.datasets))
    return 0
