"""What a guard costs: a step of Tent and ZeroSiam wearing each guard, against the unguarded step.

    PYTHONPATH=. python benchmarks/guard_cost.py --model resnet26_gn --steps 48 [--methods zerosiam]

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
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import zerosiam
from benchmarks.diagnostics_overhead import seconds_per_step, setup
from zerosiam.parts.guards import GUARDS, SourceProbe

METHODS = ("tent", "zerosiam")
SINGLE_STEPS = 8  # batch-1 steps for each batch-64 step
# "auto" probes a batch-64 stream every 4 steps in its first 32, then every 16: its cost over a short
# measurement is the warm-up's; "auto, after warm-up" is the same guard probing every 16 steps from the
# start. At batch 1 both judge every image, 16 every 16 steps. A guard that fires slows its stream after
# (every gradient scaled), which is not a probe's cost: the "probing only" variants probe, judge and
# keep snapshots as "after warm-up" does but never fire, with every image judged or one batch-1 step in
# 8 (the same guard at batch 64).
NEVER = {"min_agreement": 0.0, "max_narrowing": math.inf}
VARIANTS = {
    **{name: name for name in GUARDS},
    "auto, after warm-up": lambda: SourceProbe(warmup=0),
    "auto, probing only": lambda: SourceProbe(warmup=0, **NEVER),
    "auto, sample=8, probing only": lambda: SourceProbe(warmup=0, sample=8, **NEVER),
}


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


def main() -> None:
    args, device, batches = setup(__doc__, "resnet26_gn", 48, METHODS)
    singles = list(torch.cat(batches).split(1))[: SINGLE_STEPS * args.steps]
    columns = "method | batch | guard | ms/step | guarded ÷ none | ops/step | triggers | snapshots (copies)"
    print(f"\n| {columns} |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for method in args.methods:
        for size, stream in ((64, batches), (1, singles)):
            timings: dict[str, list[float]] = {name: [] for name in VARIANTS}
            for _ in range(args.repeats):
                for name, guard in VARIANTS.items():
                    seconds = seconds_per_step(args.model, method, stream, device, guard=made(guard))
                    timings[name].append(seconds)
            counted = {
                name: counted_run(args.model, method, stream, device, made(guard))
                for name, guard in VARIANTS.items()
            }
            plain = statistics.median(timings["none"])
            kept = snapshot_copies(counted["auto"][0])
            for guard in VARIANTS:
                step = statistics.median(timings[guard])
                copies = f"{kept:.0f}" if guard.startswith("auto") else "0"
                print(
                    f"| {method} | {size} | {guard} | {step * 1000:.1f} | {step / plain:.3f} "
                    f"| {counted[guard][1]:.0f} | {triggers(counted[guard][0])} | {copies} |"
                )


if __name__ == "__main__":
    main()
