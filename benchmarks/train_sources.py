"""Train the shipped GN/LN source models side by side on one GPU, inside a time budget.

    PYTHONPATH=. python benchmarks/train_sources.py --device cuda --budget-s 300 --out runs/sources

Each model is trained by ``zerosiam train-source`` in its own process (the command its sidecar records,
so any one of them can be rerun alone, and resumes from its checkpoint after an interruption). Small
CIFAR models leave most of a large GPU idle, so the three share it. The epochs are chosen from the
budget: every model first times a few training steps while the others do the same (the speed it
will have while sharing), then gets as many epochs as fit, between ``--min-epochs`` and its recipe's
(``zerosiam.zoo.training.RECIPES``, the recipes of the shipped weights). When the budget runs out
first, the checkpoints stay: rerun the printed command (on any device) to finish.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

SHIPPED = ("resnet26_gn", "convnext_nano_ln", "vit_tiny_ln")
SLACK = 2.3
"""An epoch's cost over its probed steps: augmentation, the test evaluation, the checkpoint, and sharing
the GPU worse than the probes did (they end at different times). Measured on an H100, 2026-11-26: the
three models trained side by side at 1.5×, 2.3× and 1.8× their probed time per step (ResNet, ConvNeXt,
ViT); the ResNet alone at 0.9×. 1.3 let the budget stop two of the three before their last epoch."""


def _seconds_per_step(arch: str, device: str, steps: int) -> float:
    from zerosiam.zoo.training import recipe_config, time_steps

    batch = recipe_config(arch).batch_size
    return time_steps(arch, batch_size=batch, steps=steps, device=device)["wall_s"]


def probe(archs: list[str], device: str, steps: int) -> dict[str, float]:
    """Seconds per step of each architecture, all timed at once (each process on its own share of the GPU)."""
    with multiprocessing.get_context("spawn").Pool(len(archs)) as pool:
        times = pool.starmap(_seconds_per_step, [(arch, device, steps) for arch in archs])
    return dict(zip(archs, times, strict=True))


def epochs_for(seconds_per_step: float, steps_per_epoch: int, budget_s: float, least: int, most: int) -> int:
    return max(least, min(most, math.floor(budget_s / (seconds_per_step * steps_per_epoch * SLACK))))


def command(arch: str, epochs: int, device: str, out: Path, export_dir: Path, limit: int | None) -> list[str]:
    limit_args = ["--limit-train", str(limit)] if limit else []
    return [
        sys.executable, "-m", "zerosiam", "train-source", "--arch", arch, "--epochs", str(epochs),
        "--device", device, "--out", str(out / arch),
        "--export-dir", str(export_dir), "--log-every", "100", "--no-progress", *limit_args,
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=300.0, help="wall time for the trainings")
    parser.add_argument("--archs", default=",".join(SHIPPED))
    parser.add_argument("--min-epochs", type=int, default=30)
    parser.add_argument("--probe-steps", type=int, default=30)
    parser.add_argument("--limit-train", type=int, help="train on N images (a quick check of this script)")
    parser.add_argument("--out", type=Path, default=Path("runs/sources"))
    parser.add_argument("--export-dir", type=Path, help="default: <out>/weights")
    args = parser.parse_args()
    archs = args.archs.split(",")
    export_dir = args.export_dir or args.out / "weights"
    export_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    from zerosiam.data.sources import read_cifar10_jpeg
    from zerosiam.zoo.training import recipe_config

    train_images = len(read_cifar10_jpeg("train")[0])  # decoded once into the cache, as is the test set,
    read_cifar10_jpeg("test")  # before the trainings read them
    speeds = probe(archs, args.device, args.probe_steps)
    left = args.budget_s - (time.perf_counter() - started)
    epochs = {}
    for arch in archs:
        recipe = recipe_config(arch)
        steps_per_epoch = min(args.limit_train or train_images, train_images) // recipe.batch_size
        epochs[arch] = epochs_for(speeds[arch], steps_per_epoch, left, args.min_epochs, recipe.epochs)
    for arch in archs:
        print(f"{arch}: {1000 * speeds[arch]:.1f} ms/step while sharing → {epochs[arch]} epochs", flush=True)
    runs = {
        a: subprocess.Popen(command(a, epochs[a], args.device, args.out, export_dir, args.limit_train))
        for a in archs
    }
    codes = {arch: run.wait() for arch, run in runs.items()}
    for arch in archs:
        sidecar = export_dir / f"{arch}.json"
        if codes[arch] == 0 and sidecar.is_file():
            meta = json.loads(sidecar.read_text())
            print(
                f"{arch}: {100 * meta['test_accuracy']:.2f} % after {meta['epochs']} epochs, "
                f"{meta['wall_time_s'] / 60:.1f} min on {meta['device']}"
            )
        else:
            print(f"{arch}: exit {codes[arch]}; rerun its command to resume: {' '.join(runs[arch].args)}")
    return max(codes.values())


if __name__ == "__main__":
    raise SystemExit(main())
