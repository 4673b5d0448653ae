"""Time per batch and peak memory of every method, each as a ratio to Tent measured in the same run.

    PYTHONPATH=. python benchmarks/efficiency.py --model resnet20 --rounds 3 --out docs/efficiency_log.md

Time is reported twice: the wall-clock time per batch and the CPU time the process spent on it
(``time.process_time``). With one torch thread per worker (the default) the CPU time is the work the
method does, and it stays meaningful on a shared machine where other jobs stretch the wall clock.

Every (method, round) runs in a fresh subprocess, so that one method's allocations cannot hide in
another's high-water mark, and the methods run in a new shuffled order each round, so that a change in
the machine's load during the run spreads over all of them instead of biasing one. A method's ratio is
the median over rounds of (its time / Tent's time in the same round).

Memory is the peak growth of the process's resident set size while it adapts: after the model, data
and adapter are built, the kernel's high-water mark is reset (``/proc/self/clear_refs`` ← 5, Linux ≥ 4.0)
and the RSS noted; at the end, ``VmHWM`` − that RSS is everything torch's CPU allocator and Python held
at the worst moment of the steps (activations kept for backward, gradients, SAM's second graph, DeYO's
second view, the predictor). It is measured on ``--memory-batches`` further batches after the timed
ones, with glibc's mmap threshold fixed and its heap trimmed first, so that memory freed earlier (EATA's
Fisher pass, the timed batches) is neither reused unseen nor counted. ``tracemalloc`` cannot be used:
it does not see torch's allocator. Where ``clear_refs`` is unavailable the worker falls back to
``ru_maxrss`` minus the RSS before those batches, and says so in its output.

Inputs: for the CIFAR ResNets, CIFAR-10 test images with Gaussian noise (σ = 0.1, about CIFAR-10-C's
severity 5), so the baselines' filters keep a realistic share of each batch (their cost depends on it);
EATA's clean data is 4 batches of the clean test images. For timm models (``--model timm:<name>``),
random weights and random images at 224×224 with the head scaled ×50 so that predictions are confident
and the filters keep samples (time and memory do not depend on the weights' values, but the filters'
choices do).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from zerosiam.bench.memory import max_rss_kb, reset_peak, status_kb

ROOT = Path(__file__).resolve().parents[1]


# --- the worker: one method, one fresh process -----------------------------------------------------


def _exact_rss_accounting() -> None:
    """Make RSS follow what is really held: glibc raises its mmap threshold after large frees and then
    keeps later large tensors on its heap, never returned; fix the thresholds at 128 KiB (``mallopt``)
    and trim what set-up and the timed batches freed (``malloc_trim``). Done only after timing, since
    mapping every large tensor afresh costs page faults that would distort the times."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
        libc.malloc_trim(0)


def _build(model_name: str, batch_size: int, batches: int) -> tuple[torch.nn.Module, list, list]:
    """The model, the test batches and EATA's clean batches."""
    import zerosiam

    generator = torch.Generator().manual_seed(0)
    if model_name.startswith("timm:"):
        import timm

        model = timm.create_model(model_name.removeprefix("timm:"), pretrained=False)
        with torch.no_grad():
            model.get_classifier().weight.mul_(50)
        stream = [torch.rand(batch_size, 3, 224, 224, generator=generator) for _ in range(batches)]
        clean = [torch.rand(batch_size, 3, 224, 224, generator=generator) for _ in range(2)]
        return model, stream, clean
    from zerosiam.data.sources import read_cifar10_jpeg
    from zerosiam.data.tensors import to_input

    model = zerosiam.load_model(model_name)
    images, _, _ = read_cifar10_jpeg(split="test")
    order = torch.randperm(len(images), generator=generator)
    images = to_input(images)[order]
    chunks = images[: batch_size * (batches + 4)].split(batch_size)
    noisy = [(x + 0.1 * torch.randn(x.shape, generator=generator)).clamp(0, 1) for x in chunks[:batches]]
    return model, noisy, list(chunks[batches:])


def worker(args: argparse.Namespace) -> dict:
    import zerosiam

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, stream, clean = _build(args.model, args.batch_size, args.warmup + args.timed)
    extras = {"clean_data": clean} if args.method.startswith("eata") else {}
    adapter = zerosiam.adapt(model, args.method, batch_size=args.batch_size, **extras)
    times, cpu_times = [], []
    for i, x in enumerate(stream):
        begin, begin_cpu = time.perf_counter(), time.process_time()
        adapter(x)
        if i >= args.warmup:
            times.append(time.perf_counter() - begin)
            cpu_times.append(time.process_time() - begin_cpu)
    rows = adapter.history[args.warmup :]
    # Memory is measured after timing, on a few more batches, with glibc set to hand large blocks back.
    gc.collect()
    _exact_rss_accounting()
    start_rss = status_kb("VmRSS")
    exact = reset_peak()
    for x in stream[: args.memory_batches]:
        adapter(x)
    peak_kb = status_kb("VmHWM") if exact else max_rss_kb()
    return {
        "method": args.method,
        "median_s": statistics.median(times),
        "cpu_s": statistics.median(cpu_times),
        "peak_mb": (peak_kb - start_rss) / 1024,
        "memory": "VmHWM after clear_refs" if exact else "ru_maxrss (includes set-up peaks)",
        "selected": statistics.mean(float(r.get("selected") or 0) for r in rows),
        "updated": statistics.mean(float(bool(r.get("updated"))) for r in rows),
    }


# --- the driver ------------------------------------------------------------------------------------


def run_round(args: argparse.Namespace, methods: list[str], seed: int) -> list[dict]:
    order = methods[:]
    random.Random(seed).shuffle(order)
    results = []
    for method in order:
        command = [sys.executable, __file__, "--worker", "--method", method, *_shared_flags(args)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{method} failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        row = results[-1]
        print(
            f"  {method:>14}: {row['cpu_s'] * 1e3:8.1f} ms CPU {row['median_s'] * 1e3:8.1f} ms wall "
            f"{row['peak_mb']:7.1f} MB",
            flush=True,
        )
    return results


def _shared_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--model", args.model, "--batch-size", str(args.batch_size), "--warmup", str(args.warmup),
        "--timed", str(args.timed), "--threads", str(args.threads),
        "--memory-batches", str(args.memory_batches),
    ]  # fmt: skip


def summarize(rounds: list[list[dict]]) -> list[dict]:
    """Per method: median time and memory over rounds, and the median of its per-round ratios to Tent."""
    by_round = [{r["method"]: r for r in results} for results in rounds]
    summary = []
    for method in by_round[0]:
        pairs = [(results[method], results["tent"]) for results in by_round]

        def median(key: str, pairs=pairs) -> float:
            return statistics.median(row[key] for row, _ in pairs)

        def ratio(key: str, pairs=pairs) -> float:
            return statistics.median(row[key] / tent[key] for row, tent in pairs)

        summary.append(
            {
                "method": method,
                "cpu_ms": median("cpu_s") * 1000,
                "cpu_ratio": ratio("cpu_s"),
                "time_ms": median("median_s") * 1000,
                "time_ratio": ratio("median_s"),
                "peak_mb": median("peak_mb"),
                "memory_ratio": ratio("peak_mb"),
                "selected": statistics.mean(row["selected"] for row, _ in pairs),
                "updated": statistics.mean(row["updated"] for row, _ in pairs),
                "memory": pairs[0][0]["memory"],
            }
        )
    return summary


def markdown(summary: list[dict], args: argparse.Namespace, command: str, loads: tuple) -> str:
    lines = [
        f"### {args.model}, batch size {args.batch_size}",
        "",
        f"- Command: `{command}`",
        f"- Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores visible, "
        f"torch {torch.__version__} with {args.threads} thread(s) per worker, "
        f"Python {platform.python_version()}; "
        f"load average {loads[0]:.1f} at the start and {loads[1]:.1f} at the end (the machine was shared).",
        f"- {args.warmup} warm-up and {args.timed} timed batches per worker, {args.rounds} rounds; memory: "
        f"{summary[0]['memory']}.",
        "",
        "| method | CPU time / batch (ms) | CPU time ÷ Tent | wall time / batch (ms) | wall time ÷ Tent "
        "| peak memory growth (MB) | memory ÷ Tent | kept / batch | updated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary:
        lines.append(
            f"| {row['method']} | {row['cpu_ms']:.1f} | {row['cpu_ratio']:.2f} | {row['time_ms']:.1f} | "
            f"{row['time_ratio']:.2f} | {row['peak_mb']:.1f} | "
            f"{row['memory_ratio']:.2f} | {row['selected']:.1f} | {row['updated']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="resnet20", help="a zoo name, or timm:<name> (random weights, 224×224)"
    )
    parser.add_argument("--methods", default="all", help="comma-separated, or 'all' (tent is always added)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timed", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-batches", type=int, default=2, help="batches run for the memory peak")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per worker (1: steadier on a busy box)"
    )
    parser.add_argument("--out", type=Path, help="append the markdown table to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    import zerosiam

    image_methods = [name for name, supported in zerosiam.available_methods().items() if "image" in supported]
    methods = image_methods if args.methods == "all" else args.methods.split(",")
    methods = ["tent", *[m for m in methods if m != "tent"]]
    command = "PYTHONPATH=. python benchmarks/efficiency.py " + " ".join(sys.argv[1:])
    start_load = os.getloadavg()[0]
    rounds = []
    for index in range(args.rounds):
        print(f"round {index + 1}/{args.rounds}", flush=True)
        rounds.append(run_round(args, methods, seed=index))
    table = markdown(summarize(rounds), args, command, (start_load, os.getloadavg()[0]))
    print(table)
    if args.out:
        with args.out.open("a") as handle:
            handle.write("\n" + table)


if __name__ == "__main__":
    main()
