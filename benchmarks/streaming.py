"""Streaming ImageNet-C from disk: memory flat in the folder's size, and the loop's wait for data.

    PYTHONPATH=. python benchmarks/streaming.py --sizes 1000,10000

1. Peak resident memory of a NoAdapt run over ImageNet-C-layout folders of each size (random 224²
   JPEGs, written to a temporary folder), through ``zerosiam.bench.runner.run``: flat in the size means
   no whole-folder decode and no whole-folder cache.
2. The fraction of the loop's wall time spent waiting for the next batch (``data_wait_fraction``), for a
   CIFAR model on the project's CIFAR-10-C (arrays in memory) and for a 224² model on the folder
   (JPEGs decoded by ``DataLoader`` workers while the model computes), Tent, batch 64.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.gpu_check import CORRUPTION, SEVERITY, write_folder
from zerosiam.bench.runner import RunSpec, run


def folder_run(root: Path, model: str, method: str, limit: int | None = None) -> dict:
    spec = RunSpec(model=model, dataset=f"imagenet-c:{root}", corruption=CORRUPTION, severity=SEVERITY,
                   protocol="mild", method=method, limit=limit)  # fmt: skip
    return run(spec).metrics


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000,10000", help="folder sizes (images) for the memory check")
    parser.add_argument(
        "--model", default="timm:test_efficientnet_gn@random", help="the cheap 224² model of step 1"
    )
    parser.add_argument("--wait-images", type=int, default=1000, help="images of the 224² data-wait run")
    args = parser.parse_args()
    print(f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs")
    print("\n| folder size | NoAdapt peak RSS (MB) | seconds | images/s | data wait |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(prefix="streaming-") as folder:
        for size in map(int, args.sizes.split(",")):
            root = Path(folder) / str(size)
            start = time.perf_counter()
            write_folder(root, size)
            written = time.perf_counter() - start
            metrics = folder_run(root, args.model, "noadapt")
            speed, wait = metrics["samples"] / metrics["seconds"], 100 * metrics["data_wait_fraction"]
            print(f"| {size:,} | {metrics['peak_rss_mb']:,.0f} | {metrics['seconds']:.1f} | {speed:,.0f} | "
                  f"{wait:.1f} % |  (folder written in {written:.0f} s)")  # fmt: skip
        wait_root = Path(folder) / str(args.wait_images)
        if not wait_root.exists():
            write_folder(wait_root, args.wait_images)
        print("\n| model | data | images/s | data wait |\n| --- | --- | ---: | ---: |")
        cifar = run(RunSpec(model="resnet20", dataset="cifar10c", corruption=CORRUPTION, severity=SEVERITY,
                            protocol="mild", method="tent")).metrics  # fmt: skip
        imagenet = folder_run(wait_root, "efficientnet_lite0", "tent")
        rows = (("resnet20 (32²)", "cifar10c, in memory", cifar),
                ("efficientnet_lite0 (224²)", "imagenet-c folder, streamed", imagenet))  # fmt: skip
        for name, data, metrics in rows:
            print(f"| {name} | {data} | {metrics['samples'] / metrics['seconds']:,.0f} | "
                  f"{100 * metrics['data_wait_fraction']:.1f} % |")  # fmt: skip


if __name__ == "__main__":
    main()
