"""``zerosiam train-source``: train, evaluate or time the GroupNorm / LayerNorm CIFAR-10 source models.

    zerosiam train-source --arch resnet26_gn --out runs/resnet26_gn --export-dir zerosiam/zoo/weights
    zerosiam train-source --evaluate zerosiam/zoo/weights/resnet26_gn.safetensors
    zerosiam train-source --benchmark --arch vit_tiny_ln

Training resumes by itself from ``<out>/checkpoint.pt``: rerun the same command after an interruption.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from zerosiam.cli._args import device_name

if TYPE_CHECKING:  # torch and the zoo load in the functions that train: `zerosiam --help` needs neither
    import torch

    from zerosiam.zoo.training import TrainConfig

# The names of zerosiam.zoo.architectures' ARCHITECTURES and TEST_ARCHITECTURES, written out so that the
# parser needs no torch (tests/cli/test_startup.py checks that they are the same).
ARCHITECTURE_NAMES = ("resnet26_gn", "vit_tiny_ln", "convnext_nano_ln", "tiny_gn")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``train-source``; options left unset take the architecture's recipe
    (``zerosiam.zoo.training.RECIPES``)."""
    parser = subparsers.add_parser(
        "train-source",
        help="train (resumably), evaluate or time a GN/LN CIFAR-10 source model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--arch", choices=ARCHITECTURE_NAMES, help="architecture to train or time")
    parser.add_argument("--out", type=Path, help="run folder: checkpoint.pt, log.jsonl (default runs/<arch>)")
    parser.add_argument("--export-dir", type=Path, help="where <arch>.safetensors + .json go (default --out)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--optimizer", choices=("sgd", "adamw"))
    parser.add_argument("--lr", type=float, help="peak learning rate")
    parser.add_argument("--weight-decay", type=float)
    parser.add_argument("--warmup", type=float, help="fraction of the steps spent warming up")
    parser.add_argument("--label-smoothing", type=float)
    parser.add_argument("--grad-clip", type=float, help="max gradient norm (0: off)")
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--checkpoint-every", type=int, help="also checkpoint every N steps (default: epochs)"
    )
    parser.add_argument("--log-every", type=int, help="steps between log records")
    parser.add_argument("--eval-every", type=int, help="epochs between test evaluations (0: last only)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--device",
        type=device_name,
        help="auto, cpu, cuda or cuda:N (default cpu; a run may resume on another)",
    )
    parser.add_argument("--limit-train", type=int, help="train on the first N images of a fixed shuffle")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--evaluate",
        type=Path,
        metavar="WEIGHTS",
        help="report clean top-1 of a .safetensors (with sidecar) or a checkpoint.pt",
    )
    parser.add_argument("--benchmark", action="store_true", help="time training steps on random data")
    parser.add_argument("--steps", type=int, default=3, help="steps to time with --benchmark")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.evaluate is not None:
        return run_evaluate(args.evaluate, args.arch, args.threads or 0)
    if args.arch is None:
        print("error: --arch is required to train or time a model", file=sys.stderr)
        return 2
    if args.benchmark:
        return run_benchmark(args)
    return run_train(args)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The training config: the architecture's recipe, overridden by every option given."""
    from zerosiam.zoo.training import config_fields, recipe_config

    overrides = {name: getattr(args, name, None) for name in config_fields() if name != "arch"}
    if overrides["device"] is not None:
        overrides["device"] = str(_device(args.device))
    return recipe_config(args.arch, **overrides)


def _device(name: str | None) -> torch.device:
    from zerosiam.bench.device import resolve_device

    return resolve_device(name or "cpu")


def _test_set() -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    from zerosiam.data.sources import read_cifar10_jpeg

    images, labels, _ = read_cifar10_jpeg("test")
    return torch.from_numpy(images), torch.from_numpy(labels)


def _train_set(limit: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    from zerosiam.data.sources import read_cifar10_jpeg

    images, labels, _ = read_cifar10_jpeg("train")
    images, labels = torch.from_numpy(images), torch.from_numpy(labels)
    if limit:  # the files are ordered by class: a fixed shuffle keeps a subset balanced
        keep = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:limit]
        images, labels = images[keep], labels[keep]
    return images, labels


def run_train(args: argparse.Namespace) -> int:
    from zerosiam.zoo.training import train

    config = config_from_args(args)
    out = args.out or Path("runs") / args.arch
    print(f"training {config}\n  run folder {out} (rerun the same command to resume)", file=sys.stderr)
    result = train(
        config,
        _train_set(args.limit_train),
        out,
        test_set=_test_set(),
        export_dir=args.export_dir,
        command=shlex.join(["zerosiam", *sys.argv[1:]]),
        progress_bar=not args.no_progress,
    )
    print(
        f"{args.arch}: clean top-1 {100 * (result.test_accuracy or 0):.2f} % on CIFAR-10 (JPEG q75) test; "
        f"{result.progress.wall_time / 60:.1f} min; weights {result.weights}"
    )
    return 0


def run_evaluate(path: Path, arch: str | None, threads: int = 0) -> int:
    """Clean top-1 of exported weights (sha256 checked against the sidecar) or of a training checkpoint."""
    import torch

    from zerosiam.zoo.trained import load_trained, sidecar_path
    from zerosiam.zoo.training import evaluate, load_checkpoint_model

    if path.suffix == ".safetensors":
        sidecar = sidecar_path(path)
        if arch is None and sidecar.is_file():
            arch = json.loads(sidecar.read_text())["arch"]
        if arch is None:
            print(f"error: {sidecar} is missing; it names the architecture and the sha256", file=sys.stderr)
            return 2
        model = load_trained(arch, path)
    else:
        model, config = load_checkpoint_model(path)
        arch = config.arch
    if threads:
        torch.set_num_threads(threads)
    accuracy = evaluate(model, *_test_set())
    print(f"{arch} ({path}): clean top-1 {100 * accuracy:.2f} % on CIFAR-10 (JPEG q75) test (10,000 images)")
    return 0


def run_benchmark(args: argparse.Namespace) -> int:
    from zerosiam.zoo.training import time_steps

    batch = args.batch_size or 128
    device = _device(args.device)
    threads = args.threads or 0
    timing = time_steps(args.arch, batch_size=batch, steps=args.steps, threads=threads, device=device)
    steps_per_epoch = 50_000 // batch
    print(
        f"{args.arch}: {timing['parameters'] / 1e6:.2f} M parameters; batch {batch}, {device}, "
        f"{int(timing['threads'])} threads: {timing['wall_s']:.2f} s/step wall, "
        f"{timing['cpu_s']:.2f} s/step CPU; "
        f"≈ {timing['wall_s'] * steps_per_epoch / 60:.1f} min/epoch at this wall time"
    )
    return 0
