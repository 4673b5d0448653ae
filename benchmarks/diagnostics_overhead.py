"""What the per-step diagnostics cost: a step of Tent and ZeroSiam with and without them.

    PYTHONPATH=. python benchmarks/diagnostics_overhead.py --model resnet20 --steps 60

The diagnostics (entropy, logit norm, centre dominance, ‖θ_h − I‖_F and the loss terms) are computed on
the model's device and read back in bulk when ``Adapter.history`` is read; this measures their compute.
Real corrupted CIFAR images (project CIFAR-10-C, gaussian_noise 5), batch 64; the median of interleaved
repeats, so that a busy machine slows both variants alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import zerosiam
from zerosiam.bench.device import describe_device, resolve_device
from zerosiam.corruptions.datasets import load_corrupted


def seconds_per_step(model_name: str, method: str, diagnostics: bool, batches: list, device) -> float:
    adapter = zerosiam.adapt(zerosiam.load_model(model_name).to(device), method, diagnostics=diagnostics)
    adapter(batches[0])  # warm-up
    start = time.perf_counter()
    for x in batches[1:]:
        adapter(x)
    len(adapter.history)  # the bulk read belongs to the cost
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / (len(batches) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = resolve_device(args.device)
    images, _ = load_corrupted("cifar10c", "gaussian_noise", 5)
    x = torch.from_numpy(images[: 64 * args.steps].copy()).permute(0, 3, 1, 2).float().div(255).to(device)
    batches = list(x.split(64))
    threads = torch.get_num_threads()
    print(f"{args.model}, batch 64, {args.steps} steps, {describe_device(device)}, {threads} threads")
    print("\n| method | ms/step with | ms/step without | with ÷ without |\n| --- | ---: | ---: | ---: |")
    for method in ("tent", "zerosiam"):
        timings = {True: [], False: []}
        for _ in range(args.repeats):
            for diagnostics in (True, False):
                timings[diagnostics].append(
                    seconds_per_step(args.model, method, diagnostics, batches, device)
                )
        on, off = (statistics.median(timings[flag]) * 1000 for flag in (True, False))
        print(f"| {method} | {on:.1f} | {off:.1f} | {on / off:.3f} |")


if __name__ == "__main__":
    main()
