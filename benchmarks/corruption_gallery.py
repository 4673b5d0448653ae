"""Pictures of every corruption (19 rows) at every severity (clean + 5 columns) on one real image.

    python benchmarks/corruption_gallery.py   # writes docs/corruptions_{cifar,imagenet}.png

One CIFAR-10 (JPEG q75) test image with the CIFAR constants and one ImageNet sample image (shorter side
256, centre crop 224) with the ImageNet constants, both corrupted with seed 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from zerosiam import corruptions
from zerosiam.data.sources import read_cifar10_jpeg, read_imagenet_sample

DOCS = Path(__file__).resolve().parents[1] / "docs"


def gallery(image: np.ndarray, preset: str, title: str, path: Path, cell: float) -> None:
    """Save one grid: a row per corruption (benchmark order, then the extras), a column per severity."""
    names = corruptions.ALL
    fig, axes = plt.subplots(len(names), 6, figsize=(6 * cell, len(names) * cell), squeeze=False)
    for row, name in enumerate(names):
        cells = [image] + [
            corruptions.apply(image[None], name, severity, preset, seed=0)[0]
            for severity in corruptions.SEVERITIES
        ]
        for col, picture in enumerate(cells):
            axis = axes[row, col]
            axis.imshow(picture, interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title("clean" if col == 0 else f"severity {col}", fontsize=9)
        extra = " (extra)" if name in corruptions.EXTRA else ""
        axes[row, 0].set_ylabel(name + extra, fontsize=8, rotation=0, ha="right", va="center")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.99))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cifar-index", type=int, default=7042, help="index in the class-ordered test set")
    parser.add_argument("--imagenet-index", type=int, default=948, help="index in the wnid-sorted sample")
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cifar, _, cifar_names = read_cifar10_jpeg("test")
    gallery(
        cifar[args.cifar_index],
        "cifar",
        f"CIFAR-10 (JPEG q75) test image {args.cifar_index}, CIFAR-10-C constants, seed 0",
        args.out / "corruptions_cifar.png",
        cell=1.3,
    )
    imagenet, labels, class_names = read_imagenet_sample()
    label = class_names[labels[args.imagenet_index]]
    gallery(
        imagenet[args.imagenet_index],
        "imagenet",
        f"ImageNet sample image {args.imagenet_index} ({label}), ImageNet-C constants, seed 0",
        args.out / "corruptions_imagenet.png",
        cell=2.0,
    )


if __name__ == "__main__":
    main()
