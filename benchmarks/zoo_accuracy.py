"""Top-1 accuracy of the zoo's entries on the real data they were trained for (the numbers in docs/zoo.md).

    python benchmarks/zoo_accuracy.py                     # every entry, full data, a markdown table
    python benchmarks/zoo_accuracy.py resnet20 --limit 1000 --threads 2

CIFAR-10 models on the CIFAR-10 (JPEG q75) test set (10,000 images); ImageNet models on the ImageNet
sample (1 image per class, shorter side 256, centre crop 224). Inputs are [0, 1] images: each model
normalizes inside, exactly as the benchmark runner feeds it.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable

import numpy as np
import torch

import zerosiam
from zerosiam.data.sources import Dataset, read_cifar10_jpeg, read_imagenet_sample
from zerosiam.data.tensors import to_input
from zerosiam.zoo import model_info

READERS: dict[str, Callable[[], Dataset]] = {
    "cifar10": lambda: read_cifar10_jpeg("test"),
    "imagenet": read_imagenet_sample,
}
DATA_NAMES = {
    "cifar10": "CIFAR-10 (JPEG q75) test",
    "imagenet": "ImageNet sample (1 image per class)",
}


def accuracy(model: torch.nn.Module, images: np.ndarray, labels: np.ndarray, batch: int) -> float:
    """Fraction of ``images`` (uint8, N×H×W×3) whose arg-max logit is the label, in batches, no gradient."""
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(images), batch):
            x = to_input(images[start : start + batch])
            correct += int((model(x).argmax(1).numpy() == labels[start : start + batch]).sum())
    return correct / len(images)


def measure(name: str, data: Dataset, limit: int | None, batch: int) -> dict[str, object]:
    info = model_info(name)
    images, labels, _ = data
    if limit is not None:  # an evenly spread subset: the readers sort images by class
        chosen = np.linspace(0, len(images) - 1, min(limit, len(images))).round().astype(int)
        images, labels = images[chosen], labels[chosen]
    model = zerosiam.load_model(name)
    start = time.perf_counter()
    top1 = accuracy(model, images, labels, batch)
    return {
        "model": name,
        "data": DATA_NAMES[info.dataset],
        "images": len(images),
        "top1": round(100 * top1, 2),
        "params": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("models", nargs="*", default=zerosiam.available_models())
    parser.add_argument("--limit", type=int, default=None, help="evaluate on this many images per model")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", action="store_true", help="print one JSON line per model instead")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    datasets: dict[str, Dataset] = {}
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads")
    if not args.json:
        print("| model | data | images | top-1 (%) | params | seconds |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name in args.models:
        dataset = model_info(name).dataset
        if dataset not in datasets:
            datasets[dataset] = READERS[dataset]()
        row = measure(name, datasets[dataset], args.limit, args.batch)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            cells = [
                row["model"],
                row["data"],
                row["images"],
                row["top1"],
                f"{row['params']:,}",
                row["seconds"],
            ]
            print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
