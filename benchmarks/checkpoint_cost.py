"""What a run's checkpoint costs: writing and reading one, against a step of the same run.

    PYTHONPATH=. python benchmarks/checkpoint_cost.py --model resnet26_gn --steps 50

A grid's run writes its progress every ``--checkpoint-every`` seconds (default 300): the adapter's
state and its per-step record (read back from the device for it), the scores and the random state.
This adapts the model for ``--steps`` real batches of 64 (project CIFAR-10-C, gaussian_noise 5) with
each method, then times the write of the adapter's checkpoint (``Adapter.state_dict`` and an atomic
``RunCheckpoint.save``) and its read (``RunCheckpoint.load`` and ``Adapter.load_state_dict``); the
median of ``--repeats``. The record grows by one row a step, so a later checkpoint is a larger one.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import zerosiam
from benchmarks.diagnostics_overhead import real_batches, setup
from zerosiam.bench import datasets
from zerosiam.bench.checkpoint import CHECKPOINT_EVERY, RunCheckpoint, random_state
from zerosiam.methods.adapter import prepare_options

METHODS = ("tent", "zerosiam", "sar", "eata", "deyo", "come")


def median_seconds(action, repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def measure(model: str, method: str, batches: list, folder: Path, repeats: int, device) -> dict[str, float]:
    extras = {}
    if "clean_data" in prepare_options(zerosiam.get_recipe(method)):  # EATA's Fisher information
        extras["clean_data"] = real_batches(datasets.clean_source("cifar10c"), "clean", 4, device)
    adapter = zerosiam.adapt(zerosiam.load_model(model).to(device), method, **extras)
    start = time.perf_counter()
    for x in batches:
        adapter(x)
    len(adapter.history)  # the step's own bulk read, so that the write below reads nothing extra
    step = (time.perf_counter() - start) / len(batches)
    checkpoint = RunCheckpoint(folder, (f"{model}-{method}",))

    def write() -> None:
        checkpoint.save({"adapter": adapter.state_dict(), "random": random_state(device)})

    def read() -> None:
        adapter.load_state_dict(checkpoint.load(device)["adapter"])

    return {
        "step": step,
        "write": median_seconds(write, repeats),
        "read": median_seconds(read, repeats),
        "kb": checkpoint.path.stat().st_size / 1024,
    }


def main() -> None:
    args, device, batches = setup(__doc__, "resnet26_gn", 50)
    print(
        "\n| method | s/step | write ms | read ms | KB | write ÷ step | write ÷ "
        f"{CHECKPOINT_EVERY:.0f} s |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    with tempfile.TemporaryDirectory() as folder:
        for method in METHODS:
            m = measure(args.model, method, batches, Path(folder), args.repeats, device)
            print(
                f"| {method} | {m['step']:.3f} | {m['write'] * 1000:.1f} | {m['read'] * 1000:.1f} | "
                f"{m['kb']:.0f} | {m['write'] / m['step']:.3f} | {m['write'] / CHECKPOINT_EVERY:.1e} |"
            )


if __name__ == "__main__":
    main()
