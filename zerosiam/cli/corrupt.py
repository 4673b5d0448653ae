"""``zerosiam corrupt``: build a -C dataset from a clean source into the standard on-disk layout.

    zerosiam corrupt --dataset cifar10c --out data/CIFAR-10-C            # <name>.npy + labels.npy
    zerosiam corrupt --dataset imagenetc --out data/ImageNet-C-sample    # <name>/<severity>/<wnid>/*.JPEG

Resumable: a rerun skips finished files and completes the rest; no file is ever left half-written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zerosiam.cli._errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "corrupt",
        help="build CIFAR-10-C or ImageNet-C (sample) on disk",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", choices=("cifar10c", "imagenetc"), default="cifar10c")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--corruptions",
        default="benchmark",
        help="comma-separated names, 'benchmark' (15) or 'all' (15 + 4 extra)",
    )
    parser.add_argument("--cache", type=Path, help="cache of corrupted arrays (default $ZEROSIAM_CACHE)")
    parser.set_defaults(func=main)


def _names(text: str) -> list[str]:
    """The corruptions ``--corruptions`` names; an unknown one is a usage error naming the choices."""
    from zerosiam import corruptions

    if text == "benchmark":
        return list(corruptions.BENCHMARK)
    if text == "all":
        return list(corruptions.BENCHMARK) + list(corruptions.EXTRA)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = set(names) - set(corruptions.BENCHMARK) - set(corruptions.EXTRA)
    if unknown:
        choices = ", ".join([*corruptions.BENCHMARK, *corruptions.EXTRA])
        raise UsageError(f"unknown corruption(s) {', '.join(sorted(unknown))}; choose from {choices}")
    return names


def main(args: argparse.Namespace) -> int:
    from zerosiam.corruptions.datasets import build_cifar10c, build_imagenet_c

    names = _names(args.corruptions)
    if args.dataset == "cifar10c":
        written = build_cifar10c(args.out, names, cache=args.cache)
        print(f"CIFAR-10-C: {len(written)} files in {args.out}")
    else:
        build_imagenet_c(args.out, names, cache=args.cache)
        print(f"ImageNet-C (sample): {len(names)} corruptions × 5 severities in {args.out}")
    return 0
