"""Time to build CIFAR-10-C (15 corruptions × 5 severities × 10,000 images, 32×32) with zerosiam.corruptions.

    python benchmarks/corruptions.py                 # 1,000 real test images per cell, ×10 extrapolated
    python benchmarks/corruptions.py --images 10000  # the full build, measured rather than extrapolated

The images are the real CIFAR-10 (JPEG q75) test images, a class-balanced subset when --images < 10,000.
Every cell is one ``corruptions.apply`` call, timed with ``perf_counter`` (wall) and ``process_time``
(CPU of this process, all threads) after one warm-up call per
corruption (which loads the frost textures and fills the small caches); the extrapolation is linear in
the number of images, which holds because every corruption works in fixed-size chunks of images.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from zerosiam import corruptions
from zerosiam.data.sources import read_cifar10_jpeg

FULL = 10_000


def cifar_subset(count: int) -> np.ndarray:
    """``count`` real CIFAR-10 test images, spread evenly over the class-ordered test set."""
    images, _, _ = read_cifar10_jpeg("test")
    return images[np.linspace(0, len(images) - 1, count).astype(int)]


def time_cells(images: np.ndarray, names: list[str]) -> tuple[dict[str, list[float]], float]:
    """Wall seconds per (corruption, severity) to corrupt ``images`` with the CIFAR constants, and the
    process CPU seconds of all cells together (less sensitive to other jobs on a shared machine)."""
    seconds: dict[str, list[float]] = {}
    cpu = 0.0
    for name in names:
        corruptions.apply(images[:8], name, 1, "cifar")  # warm-up: textures, cached matrices
        seconds[name] = []
        for severity in corruptions.SEVERITIES:
            start, start_cpu = time.perf_counter(), time.process_time()
            corruptions.apply(images, name, severity, "cifar", seed=0)
            seconds[name].append(time.perf_counter() - start)
            cpu += time.process_time() - start_cpu
    return seconds, cpu


def report(seconds: dict[str, list[float]], cpu: float, count: int) -> None:
    """Print the per-corruption table extrapolated to 10,000 images, the total and the slowest ones."""
    scale = FULL / count
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} logical CPUs (shared)"
    )
    print(f"numpy {np.__version__}; timed on {count} real CIFAR-10 test images per cell, scaled ×{scale:g}\n")
    print("| corruption | s1 | s2 | s3 | s4 | s5 | total (s) |")
    print("|---|---|---|---|---|---|---|")
    totals = {}
    for name, cells in seconds.items():
        scaled = [t * scale for t in cells]
        totals[name] = sum(scaled)
        print(f"| {name} | " + " | ".join(f"{t:.1f}" for t in scaled) + f" | {totals[name]:.1f} |")
    total = sum(totals.values())
    cells = f"{len(seconds)} corruptions × 5 severities × {FULL} images"
    print(f"\ntotal for {cells}: {total:.0f} s wall ({total / 60:.1f} min)")
    print(f"process CPU time for the same work: {cpu * scale:.0f} s ({cpu * scale / 60:.1f} min)")
    slowest = sorted(totals, key=totals.get, reverse=True)[:3]
    print(
        "slowest: " + ", ".join(f"{n} ({totals[n]:.0f} s, {100 * totals[n] / total:.0f}%)" for n in slowest)
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=1000, help="images per cell (at most 10,000)")
    parser.add_argument(
        "--corruptions", default="benchmark", help="'benchmark', 'all' or comma-separated names"
    )
    args = parser.parse_args()
    if args.corruptions == "benchmark":
        names = list(corruptions.BENCHMARK)
    elif args.corruptions == "all":
        names = list(corruptions.ALL)
    else:
        names = [n.strip() for n in args.corruptions.split(",") if n.strip()]
    images = cifar_subset(min(args.images, FULL))
    seconds, cpu = time_cells(images, names)
    report(seconds, cpu, len(images))


if __name__ == "__main__":
    main()
