"""A speed option against its bar (the same results as the eager path), and its step time beside it.

    PYTHONPATH=. python benchmarks/speed_equivalence.py --device cuda --options channels_last,compile
    PYTHONPATH=. python benchmarks/speed_equivalence.py --timing --steps 20 --repeats 3 --device cpu

Equivalence (the default): the eager path and each option run the benchmark's own run
(``zerosiam.bench.runner.run``, what ``zerosiam bench --compile --channels-last`` runs) over the project's
CIFAR-10-C, gaussian_noise at severity 5 (10,000 images, protocol mild, batch 64). An option passes when
its online accuracy differs from the eager path's by no more than the noise rule allows
(``zerosiam.bench.noise``: the band of two executions of one spec, the model's σ under the mild protocol
from the replicas of ``--noise-db``, with a floor of 0.1 point, as the rule's callers add floors: at
batch 64 the replicas of a cell often agree to the digit, σ 0, where another kernel still flips a few of
the 10,000 predictions) and it made the same number of updates; the script exits with 1 when one does
not. On the 2-core development machine a run
takes about a minute (ResNet-26-GN), and compiling 1-2 minutes more; on a GPU, seconds and the compiling.

Timing (``--timing``): a step's wall time and CPU time on real batches of 64 already in memory, after a
warm-up step (the compilation), the record's bulk read included; the median of interleaved repeats, each
with a fresh model and adapter, so that a busy machine slows every option alike; then each option's
time ÷ eager.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import zerosiam
from benchmarks.diagnostics_overhead import real_batches
from zerosiam.bench.device import describe_device, resolve_device
from zerosiam.bench.runner import RunSpec, run
from zerosiam.methods.speed import Speed

ACCURACY_POINTS = 0.1  # the floor of the bar, and the bar where no store gives the noise rule


def accuracy_bar(args: argparse.Namespace) -> tuple[float, str]:
    """The largest accuracy difference (points) an option may show: the noise rule's band for two runs of
    the model under the mild protocol, from the replicas of ``--noise-db``, at least ``ACCURACY_POINTS``."""
    from pathlib import Path

    from zerosiam.bench.noise import noise_of
    from zerosiam.bench.textstore import open_store

    if not Path(args.noise_db).exists():
        return ACCURACY_POINTS, f"{ACCURACY_POINTS} point (no store at {args.noise_db})"
    noise = noise_of(open_store(args.noise_db).rows(kind="vision"))
    band = noise.band(args.model, "mild", (args.method, args.method))
    bar = max(band, ACCURACY_POINTS)
    return bar, f"{bar:.2f} points (the band {band:.3f} from {args.noise_db}, at least {ACCURACY_POINTS})"


def equivalence(args: argparse.Namespace, options: list[Speed], device: torch.device) -> bool:
    """Run eager and each option on the stream; print a row each; whether every option passes."""
    bar, source = accuracy_bar(args)
    print(f"bar: accuracy within {source}, the same number of updates")
    spec = RunSpec(
        model=args.model, dataset="cifar10c", corruption="gaussian_noise", severity=5, protocol="mild",
        method=args.method, batch_size=args.batch_size, limit=args.images, precision=args.precision,
    )  # fmt: skip
    eager = run(spec, device=device).metrics
    print("\n| speed | accuracy (%) | updates | seconds | accuracy − eager (points) | passes |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    print(f"| eager | {100 * eager['accuracy']:.2f} | {eager['updates']} | {eager['seconds']:.1f} | | |")
    passed = True
    for speed in options:
        metrics = run(spec, device=device, speed=speed).metrics
        points = 100 * (metrics["accuracy"] - eager["accuracy"])
        ok = abs(points) <= bar and metrics["updates"] == eager["updates"]
        passed &= ok
        cells = f"{100 * metrics['accuracy']:.2f} | {metrics['updates']} | {metrics['seconds']:.1f}"
        print(f"| {speed.label} | {cells} | {points:+.2f} | {'yes' if ok else 'NO'} |")
    return passed


def step_seconds(
    args: argparse.Namespace, batches: list, device: torch.device, speed: Speed
) -> tuple[float, float]:
    """A step's mean wall time and CPU time (this process's) after a warm-up step, on a fresh model and
    adapter, the record's bulk read included. With one torch thread on a shared machine, the CPU time is
    the work the step does; the wall time also holds the waits for the other jobs."""
    model = zerosiam.load_model(args.model).to(device)
    adapter = zerosiam.adapt(model, args.method, precision=args.precision, **speed.options)
    adapter(batches[0])  # warm-up: the compilation, when compiled
    wall, cpu = time.perf_counter(), time.process_time()
    for x in batches[1:]:
        adapter(x)
    len(adapter.history)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    steps = len(batches) - 1
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def timing(args: argparse.Namespace, options: list[Speed], device: torch.device) -> None:
    """Interleaved repeats of every option's step; print the medians and their ratios to eager."""
    batches = real_batches("cifar10c", "gaussian_noise", args.steps, device)
    speeds = [Speed(), *options]
    seconds: dict[Speed, list[tuple[float, float]]] = {speed: [] for speed in speeds}
    for _ in range(args.repeats):
        for speed in speeds:
            seconds[speed].append(step_seconds(args, batches, device, speed))
    eager_wall, eager_cpu = (statistics.median(t[i] for t in seconds[Speed()]) for i in (0, 1))
    print("\n| speed | wall ms/step | wall ms/step, each repeat | wall ÷ eager | CPU ms/step | CPU ÷ eager |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for speed in speeds:
        wall, cpu = (statistics.median(t[i] for t in seconds[speed]) for i in (0, 1))
        each = ", ".join(f"{1000 * t[0]:.0f}" for t in seconds[speed])
        ratios = f"{wall / eager_wall:.3f} | {1000 * cpu:.1f} | {cpu / eager_cpu:.3f}"
        print(f"| {speed.label} | {1000 * wall:.1f} | {each} | {ratios} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="resnet26_gn", help="a zoo model of CIFAR-10")
    parser.add_argument("--method", default="zerosiam")
    parser.add_argument("--options", default="channels_last,compile", help="speed labels, comma-separated")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--images", type=int, default=10000, help="equivalence: the stream's length")
    parser.add_argument(
        "--noise-db", default="docs/results/study", help="equivalence: the store whose replicas give the bar"
    )
    parser.add_argument("--timing", action="store_true", help="time the step instead")
    parser.add_argument("--steps", type=int, default=20, help="timing: batches of 64 per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timing: interleaved repeats")
    args = parser.parse_args()
    options = [Speed.parse(label) for label in args.options.split(",")]
    device = resolve_device(args.device)
    what = f"{args.steps} steps × {args.repeats} repeats" if args.timing else f"{args.images} images"
    print(f"{args.model}, {args.method}, {args.precision}, batch {args.batch_size}, {what}")
    device_text = ", ".join(f"{key} {value}" for key, value in describe_device(device).items())
    print(f"{device_text}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    if args.timing:
        timing(args, options, device)
    elif not equivalence(args, options, device):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
