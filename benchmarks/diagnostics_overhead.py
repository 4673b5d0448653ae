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
from collections.abc import Callable

import torch

import zerosiam
from zerosiam.bench.device import describe_device, resolve_device
from zerosiam.cli._args import csv_list
from zerosiam.corruptions.datasets import load_corrupted
from zerosiam.data.tensors import to_input


def real_batches(dataset: str, corruption: str, count: int, device: torch.device) -> list[torch.Tensor]:
    """``count`` batches of 64 images of ``corruption`` at severity 5, as model input on ``device``."""
    images, _ = load_corrupted(dataset, corruption, 5)
    return list(to_input(torch.from_numpy(images[: 64 * count].copy()).to(device)).split(64))


def setup(
    description: str,
    model: str,
    steps: int,
    methods: tuple[str, ...] = (),
    min_steps: int = 1,
    more: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[argparse.Namespace, torch.device, list]:
    """A step benchmark's flags (``--model``, ``--steps``, at least ``min_steps``, ``--repeats``,
    ``--device``, and ``--methods`` when it measures several: a comma list of ``methods``, all by default;
    ``more`` adds the benchmark's own), its device and its batches (project CIFAR-10-C, gaussian_noise 5),
    with the line that says what it measures on."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=model)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto")
    if methods:
        choices = ", ".join(methods)
        parser.add_argument("--methods", type=csv_list, default=",".join(methods), help=f"of {choices}")
    if more is not None:
        more(parser)
    args = parser.parse_args()
    if args.steps < min_steps:
        parser.error(f"--steps {args.steps}: this benchmark needs at least {min_steps}")
    if methods:
        unknown = [name for name in args.methods if name not in methods]
        if unknown:
            parser.error(f"unknown method {unknown[0]!r}; choose from {choices}")
    device = resolve_device(args.device)
    batches = real_batches("cifar10c", "gaussian_noise", args.steps, device)
    threads = torch.get_num_threads()
    print(f"{args.model}, batch 64, {args.steps} steps, {describe_device(device)}, {threads} threads")
    return args, device, batches


def seconds_per_step(model_name: str, method: str, batches: list, device, **options) -> float:
    """A step's mean wall time after a warm-up step, the record's bulk read included; ``options`` go to
    ``zerosiam.adapt``."""
    adapter = zerosiam.adapt(zerosiam.load_model(model_name).to(device), method, **options)
    adapter(batches[0])  # warm-up
    start = time.perf_counter()
    for x in batches[1:]:
        adapter(x)
    len(adapter.history)  # the bulk read belongs to the cost
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / (len(batches) - 1)


def main() -> None:
    args, device, batches = setup(__doc__, "resnet20", 60)
    print("\n| method | ms/step with | ms/step without | with ÷ without |\n| --- | ---: | ---: | ---: |")
    for method in ("tent", "zerosiam"):
        timings = {True: [], False: []}
        for _ in range(args.repeats):
            for diagnostics in (True, False):
                timings[diagnostics].append(
                    seconds_per_step(args.model, method, batches, device, diagnostics=diagnostics)
                )
        on, off = (statistics.median(timings[flag]) * 1000 for flag in (True, False))
        print(f"| {method} | {on:.1f} | {off:.1f} | {on / off:.3f} |")


if __name__ == "__main__":
    main()
