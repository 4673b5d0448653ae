"""Adapt the real CIFAR-10 ResNet-20 online on corrupted real CIFAR-10 (JPEG q75) test images.

Prints the online accuracy of NoAdapt, Tent and ZeroSiam on a mild (shuffled) stream and on a
label-shifted stream (imbalance ratio ∞, the paper's wild setting), batch size 64:

    python examples/adapt_cifar_resnet.py [--corruption gaussian_noise] [--severity 5] [--limit 10000]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from tqdm import tqdm

import zerosiam
from zerosiam import corruptions
from zerosiam.data.sources import read_cifar10_jpeg
from zerosiam.protocols import streams


def online_accuracy(method: str, model_name: str, images: np.ndarray, labels: np.ndarray, order: np.ndarray,
                    batch_size: int) -> float:  # fmt: skip
    """Stream ``images[order]`` through a fresh adapter; the share of correct online predictions."""
    adapter = zerosiam.adapt(zerosiam.load_model(model_name), method, batch_size=batch_size)
    correct = 0
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for index in tqdm(batches, desc=f"{method:>9}", leave=False):
        x = torch.from_numpy(images[index]).permute(0, 3, 1, 2).float().div_(255)
        correct += int((adapter(x).argmax(1).numpy() == labels[index]).sum())
    return correct / len(order)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20", choices=zerosiam.available_models())
    parser.add_argument(
        "--corruption", default="gaussian_noise", choices=corruptions.BENCHMARK + corruptions.EXTRA
    )
    parser.add_argument("--severity", type=int, default=5)
    parser.add_argument("--limit", type=int, default=10_000, help="number of test images to use")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--methods", default="noadapt,tent,zerosiam")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    clean, labels, _ = read_cifar10_jpeg("test")
    keep = np.random.default_rng(args.seed).permutation(len(labels))[: args.limit]
    images = corruptions.apply(clean[keep], args.corruption, args.severity, preset="cifar", seed=args.seed)
    labels = labels[keep]
    orders = {
        "mild": streams.mild(labels, args.seed),
        "label_shift": streams.label_shift(labels, math.inf, args.seed, length=len(labels)),
    }
    print(f"{args.model} on CIFAR-10 (JPEG q75) {args.corruption} severity {args.severity}, "
          f"{len(labels)} images, batch size {args.batch_size}, seed {args.seed}")  # fmt: skip
    print(f"| method | {' | '.join(orders)} | seconds |\n|---|{'---|' * len(orders)}---|")
    for method in args.methods.split(","):
        start = time.perf_counter()
        accuracies = [
            online_accuracy(method, args.model, images, labels, o, args.batch_size) for o in orders.values()
        ]
        cells = " | ".join(f"{100 * a:.1f}" for a in accuracies)
        print(f"| {method} | {cells} | {time.perf_counter() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
