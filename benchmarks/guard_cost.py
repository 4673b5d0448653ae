"""What a guard costs: a step of Tent and ZeroSiam wearing each guard, against the unguarded step.

    PYTHONPATH=. python benchmarks/guard_cost.py --model resnet26_gn --steps 48 [--methods zerosiam]
        [--guards auto,asr]

Real corrupted CIFAR images (project CIFAR-10-C, gaussian_noise 5) at batch 64 and at batch 1 (the same
images one at a time, 8 times as many steps, so that ``auto`` with ``sample=8``, which probes a batch-1
stream every 128 steps, probes there as often as at batch 64); the median of interleaved repeats, so that
a busy machine slows every variant alike. A guarded step's time is given as a ratio to the unguarded one
measured beside it, beside the operations a step dispatches (counted apart, untimed): on a GPU a small
model's step waits for the host's dispatch, so the operations a guard adds are what it costs there. The
triggers column is how often the guard fired in that counted run: a stream put back (and, for ``auto``,
slowed) does more work after it than a probe alone, so a guard that fires is not timed against the same
work. The memory column is what the guard keeps beyond the adapter: ``auto``'s ring of snapshots of the
trainable weights, in copies of them (the adapter's own source copy is there with or without a guard).
``--guards`` measures only the named guards beside ``none`` (no variant of ``auto``). Then, where
``auto`` is measured, per method, where the batch-1 probe's cost goes: the steps of the cycle between two
probes, timed one by one, and one source forward of the probe's images timed alone.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import zerosiam
from benchmarks.diagnostics_overhead import seconds_per_step, setup
from zerosiam.cli._args import csv_list
from zerosiam.parts.guards import GUARDS, SourceProbe, Watch

METHODS = ("tent", "zerosiam")
SINGLE_STEPS = 8  # batch-1 steps for each batch-64 step
# "auto" probes a batch-64 stream every 4 steps in its first 32, then every 16: its cost over a short
# measurement is the warm-up's; "auto, after warm-up" is the same guard probing every 16 steps from the
# start. At batch 1 both judge every image, 16 every 16 steps. A guard that fires slows its stream after
# (every gradient scaled), which is not a probe's cost: the "probing only" variants probe, judge and
# keep snapshots as "after warm-up" does but never fire, with every image judged or one batch-1 step in
# 8 (the same guard at batch 64). "every=4, rows=16" probes a batch-64 stream every 4 steps on 16 of its
# images (``docs/guard_log.md``, Open): a quarter of the source forward four times as often; at batch 1 it is
# "auto" (``every`` and ``rows`` are for full steps). "watch" is ``auto``'s ``Watch``, which a grid wearing
# ``auto`` puts on its unguarded runs: ``auto``'s probe with its warm-up, no snapshots, acting on nothing.
NEVER = {"min_agreement": 0.0, "max_narrowing": math.inf}
OFTEN = {"every": 4, "rows": 16}
VARIANTS = {
    **{name: name for name in GUARDS},
    "auto, after warm-up": lambda: SourceProbe(warmup=0),
    "auto, probing only": lambda: SourceProbe(warmup=0, **NEVER),
    "auto, sample=8, probing only": lambda: SourceProbe(warmup=0, sample=8, **NEVER),
    "auto, every=4, rows=16, after warm-up": lambda: SourceProbe(warmup=0, **OFTEN),
    "auto, every=4, rows=16, probing only": lambda: SourceProbe(warmup=0, **OFTEN, **NEVER),
    "watch": Watch,
}


def guard_names(text: str) -> list[str]:
    """``--guards``: a comma list of guards by name, each one of ``GUARDS``."""
    names = csv_list(text)
    unknown = [name for name in names if name not in GUARDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown guard {unknown[0]!r}; choose from {', '.join(GUARDS)}")
    return names


def guard_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--guards", type=guard_names, help="only these guards beside none, no variant of auto"
    )


def measured(guards: list[str] | None) -> dict[str, str | Callable[[], object]]:
    """The variants to time: all of them, or ``none`` and the named ``guards``."""
    if guards is None:
        return VARIANTS
    return {name: VARIANTS[name] for name in dict.fromkeys(("none", *guards))}


def snapshot_copies(adapter: zerosiam.Adapter) -> float:
    """The weights an ``auto``-guarded adapter keeps after its stream, in copies of the trainable weights."""
    trainable = sum(p.numel() for p in adapter.trainable)
    snapshots = adapter.recipe.guard.snapshots  # the adapter's own copy of the guard
    kept = sum(t.numel() for snapshot in snapshots for part in snapshot.values() for t in part.values())
    return kept / trainable


def made(guard: str | Callable[[], object]) -> object:
    """A guard as ``adapt`` takes it: a name, or a fresh guard from a factory (a guard keeps state)."""
    return guard() if callable(guard) else guard


class _Operations(TorchDispatchMode):
    """Counts the operations dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def counted_run(model_name: str, method: str, batches: list, device, guard) -> tuple[zerosiam.Adapter, float]:
    """An adapter that has run ``batches``, and the operations a step dispatched, on average over the
    steps after the first (which builds state)."""
    adapter = zerosiam.adapt(zerosiam.load_model(model_name).to(device), method, guard=guard)
    adapter(batches[0])
    with _Operations() as counted:
        for x in batches[1:]:
            adapter(x)
    return adapter, counted.count / (len(batches) - 1)


def triggers(adapter: zerosiam.Adapter) -> int:
    """How many steps of the adapter's run its guard fired on (SAR's own resets are not a guard's)."""
    return sum(bool(row.get("guard")) for row in adapter.history)


def seconds(call: Callable[[], object], device) -> float:
    """The wall time of one ``call``, the device's queue included."""
    start = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def step_times(model_name: str, method: str, stream: list, device, guard) -> list[float]:
    """Each step's wall time after a warm-up step (``stream[0]``), in seconds."""
    adapter = zerosiam.adapt(zerosiam.load_model(model_name).to(device), method, guard=guard)
    adapter(stream[0])
    return [seconds(lambda x=x: adapter(x), device) for x in stream[1:]]


def source_forward_seconds(model_name: str, method: str, images, device, repeats: int) -> float:
    """The median time of one forward of ``images`` at the source weights, as a probe makes it."""
    adapter = zerosiam.adapt(zerosiam.load_model(model_name).to(device), method)
    adapter(images[:1])
    return statistics.median(
        seconds(lambda: adapter.source_prediction(images), device) for _ in range(repeats)
    )


def print_breakdown(args, method: str, singles: list, device) -> None:
    """Where a batch-1 probe's cost goes: ``auto`` probing only (every image judged, 16 at a time) step
    by step against the unguarded steps, by place in the cycle between two probes (the median of each
    place over the stream and the repeats, so a stray slow step weighs nothing), beside one source
    forward of the probe's images timed alone: the least a probe that judges every image can cost."""
    cycle = SourceProbe().probe_images  # one image a step: a probe every this many steps
    timed: dict[str, list[list[float]]] = {"none": [], "auto, probing only": []}
    for _ in range(args.repeats):
        for name in timed:
            timed[name].append(step_times(args.model, method, singles, device, made(VARIANTS[name])))
    # step k of the stream probes when k % cycle == 0; the warm-up is step 1, so times[i] is step i + 2
    by_place = {
        name: [
            1000
            * statistics.median(t for times in runs for i, t in enumerate(times) if (i + 2) % cycle == place)
            for place in range(cycle)
        ]
        for name, runs in timed.items()
    }
    rows = {"the probing step": [0], "each of the 3 after it": [1, 2, 3], f"each of the other {cycle - 4}":
            list(range(4, cycle)), "a step on average over the cycle": list(range(cycle))}  # fmt: skip
    print(f"\n| {method}, batch 1, the {cycle}-step cycle | none ms | probing only ms | extra ms |")
    print("| --- | ---: | ---: | ---: |")
    for label, places in rows.items():
        plain, probed = (statistics.mean(by_place[name][p] for p in places) for name in timed)
        print(f"| {label} | {plain:.2f} | {probed:.2f} | {probed - plain:+.2f} |")
    plain, probed = (statistics.mean(by_place[name]) for name in timed)
    forward = 1000 * source_forward_seconds(
        args.model, method, torch.cat(singles[:cycle]), device, args.repeats
    )
    print(
        f"\nProbing only ÷ none over the cycle: {probed / plain:.3f}. One source forward of {cycle} images "
        f"alone: {forward:.1f} ms, {forward / (cycle * plain):.3f} of the cycle's unguarded time."
    )


def main() -> None:
    # the breakdown times every place of a batch-1 probe's cycle after the first (warm-up) step
    fewest = math.ceil((SourceProbe().probe_images + 1) / SINGLE_STEPS)
    args, device, batches = setup(__doc__, "resnet26_gn", 48, METHODS, min_steps=fewest, more=guard_flag)
    variants = measured(args.guards)
    singles = list(torch.cat(batches).split(1))[: SINGLE_STEPS * args.steps]
    columns = "method | batch | guard | ms/step | guarded ÷ none | ops/step | triggers | snapshots (copies)"
    print(f"\n| {columns} |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for method in args.methods:
        for size, stream in ((64, batches), (1, singles)):
            timings: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.repeats):
                for name, guard in variants.items():
                    seconds = seconds_per_step(args.model, method, stream, device, guard=made(guard))
                    timings[name].append(seconds)
            counted = {
                name: counted_run(args.model, method, stream, device, made(guard))
                for name, guard in variants.items()
            }
            plain = statistics.median(timings["none"])
            kept = snapshot_copies(counted["auto"][0]) if "auto" in counted else 0
            for guard in variants:
                step = statistics.median(timings[guard])
                copies = f"{kept:.0f}" if guard.startswith("auto") else "0"
                print(
                    f"| {method} | {size} | {guard} | {step * 1000:.1f} | {step / plain:.3f} "
                    f"| {counted[guard][1]:.0f} | {triggers(counted[guard][0])} | {copies} |"
                )
    if "auto" in variants:
        for method in args.methods:
            print_breakdown(args, method, singles, device)


if __name__ == "__main__":
    main()
