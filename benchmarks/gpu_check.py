"""The GPU check: the benchmark's own code on a GPU, over an ImageNet-C folder, at fp32, tf32 and bf16.

Needs only the repository and what a standard CUDA PyTorch image has (torch, timm, numpy, pillow):

    PYTHONPATH=. python benchmarks/gpu_check.py                   # one GPU, about 5,000 images per run
    PYTHONPATH=. python benchmarks/gpu_check.py --device cpu --images 128 --models test_efficientnet_gn

It writes a synthetic ImageNet-C-layout folder (``gaussian_noise/5/<wnid>/*.JPEG``, 224², random pixels)
to a temporary folder, then runs each method on each timm model (random weights, 1,000 classes, the
head scaled ×50 so that predictions are confident and SAR's and DeYO's filters keep samples) through
``zerosiam.bench.runner.run`` (the code ``zerosiam bench --dataset imagenet-c:<root>`` runs), and
prints per method: images/s, peak memory (GPU, or resident on the CPU), the fraction of the loop's
wall time spent waiting for data, and time and memory as ratios to Tent in the same model and precision.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from zerosiam.bench.device import describe_device, resolve_device
from zerosiam.bench.runner import RunSpec, run
from zerosiam.data.sources import imagenet_wnids

CORRUPTION, SEVERITY = "gaussian_noise", 5
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def confident_timm(name: str) -> nn.Module:
    """A timm model with random weights and its head scaled ×50. Random weights alone predict almost
    uniformly (entropy near ln 1000, above SAR's and DeYO's thresholds), so those methods would keep no
    sample and never run their backward; a confident head makes them do the work they do on a trained
    model, as ``benchmarks/efficiency.py`` does on the CPU."""
    import timm

    model = timm.create_model(name, pretrained=False, num_classes=1000)
    with torch.no_grad():
        model.get_classifier().weight.mul_(50)
    return model


def write_folder(root: Path, images: int, seed: int = 0) -> None:
    """``images`` random 224² JPEGs (quality 85, as ImageNet-C) spread over the 1,000 class folders."""
    rng = np.random.default_rng(seed)
    wnids = imagenet_wnids()
    for index in range(images):
        folder = root / CORRUPTION / str(SEVERITY) / wnids[index % len(wnids)]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index:06d}.JPEG", quality=85)


def measure(
    root: Path,
    model: str,
    method: str,
    precision: str,
    device: torch.device,
    batch_size: int,
    limit: int | None = None,
) -> dict:
    spec = RunSpec(
        model="builder:benchmarks.gpu_check:confident_timm",  # random weights: speed and memory only
        model_options={
            "mean": IMAGENET_MEAN,
            "std": IMAGENET_STD,
            "dataset": "imagenet",
            "builder_kwargs": {"name": model},
        },
        dataset=f"imagenet-c:{root}",
        corruption=CORRUPTION,
        severity=SEVERITY,
        protocol="mild",
        method=method,
        precision=precision,
        batch_size=batch_size,
        limit=limit,
    )
    metrics = run(spec, device=device).metrics
    return {
        "images_per_s": metrics["samples"] / metrics["seconds"],
        "memory_mb": metrics.get("peak_gpu_mb", metrics["peak_rss_mb"]),
        "data_wait": metrics["data_wait_fraction"],
        "seconds": metrics["seconds"],
    }


def table(rows: dict[str, dict], memory: str) -> str:
    tent = rows["tent"]
    lines = [
        f"| method | images/s | peak {memory} (MB) | data wait | time ÷ Tent | memory ÷ Tent |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, row in rows.items():
        speed, memory_mb, wait = row["images_per_s"], row["memory_mb"], 100 * row["data_wait"]
        time_ratio, memory_ratio = row["seconds"] / tent["seconds"], memory_mb / tent["memory_mb"]
        cells = [method, f"{speed:,.0f}", f"{memory_mb:,.0f}", f"{wait:.1f} %", f"{time_ratio:.3f}"]
        lines.append("| " + " | ".join([*cells, f"{memory_ratio:.3f}"]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--images", type=int, default=5000, help="images in the synthetic folder")
    parser.add_argument("--models", default="vit_base_patch16_224,resnet50_gn", help="timm architectures")
    parser.add_argument("--methods", default="noadapt,tent,zerosiam,sar,deyo")
    parser.add_argument("--precisions", default="fp32,tf32,bf16")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    methods = args.methods.split(",")
    if "tent" not in methods:
        parser.error("--methods must include tent: the ratios are to Tent")
    device = resolve_device(args.device)
    print(f"device: {describe_device(device)}")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        root = Path(folder)
        start = time.perf_counter()
        write_folder(root, args.images)
        print(f"wrote {args.images} JPEGs in {time.perf_counter() - start:.1f} s")
        for model in args.models.split(","):
            for precision in args.precisions.split(","):
                # untimed: the first backward at a precision pays for cuBLAS/cuDNN's one-time set-up
                measure(root, model, "tent", precision, device, args.batch_size, limit=4 * args.batch_size)
                rows = {m: measure(root, model, m, precision, device, args.batch_size) for m in methods}
                memory = "GPU memory" if device.type == "cuda" else "resident memory"
                print(f"\n{model}, {precision}, {args.images} images, batch {args.batch_size}\n")
                print(table(rows, memory))


if __name__ == "__main__":
    main()
