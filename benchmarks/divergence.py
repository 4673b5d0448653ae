"""Where two executions of one spec part: twins stepped side by side, compared at every step.

    PYTHONPATH=. python benchmarks/divergence.py --model resnet26_gn --method zerosiam \
        --protocol blind_spot --corruption impulse_noise --pair alone/stack:4 --pair alone/threads:2 \
        --pair alone/guard:sar --pair alone/replica:1 --out docs/results/noise/divergence_resnet26.json

The spec is the store's run (``--db``; seed 0, unguarded, at the rates it ran with). Each twin is that run
under one execution: ``alone`` (one stream, one thread, no guard, replica 0), or ``alone`` changed by
``stack:B`` (the stream's batch at the first place of B stacked streams: on the CPUs measured, what the
other streams hold does not change a sample's rounding, only whether it is alone), ``threads:N``,
``guard:G`` (a guard worn), ``replica:R`` (``zerosiam.bench.replica``) or ``draws:K`` (the methods'
random draws, DeYO's and COME's patch orders, from another seed: what a GPU's generator did before
their orders were drawn on the CPU); ``+`` joins changes. Both
twins of a pair see the same batches in the same order and step in turn in one process, so the first step
whose predictions differ, and the gap in logits and adapted weights after it, are read directly. The
blind spot's final score (the adapted model frozen, on the whole set) is made for each twin at the end.

Writes one JSON file: per pair, the first step whose logits differ in any bit, the first whose
predictions differ, and at log-spaced steps the largest logit gap, the adapted weights' L2 gap (beside
their L2 distance from the source), the predictions that differed so far and both twins' running
accuracies; with ``--plot``, a PNG beside it.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import zerosiam
from zerosiam.bench.batches import StreamBatches
from zerosiam.bench.replica import jittered
from zerosiam.bench.runner import _method_extras, stream_for
from zerosiam.bench.spec import NO_GUARD, RunSpec
from zerosiam.bench.textstore import open_store
from zerosiam.data.tensors import to_input
from zerosiam.protocols.build import stacked_frozen_hits


@dataclass(frozen=True)
class Execution:
    """One twin's execution: how many streams share its forward, its threads, its guard, its replica."""

    streams: int = 1
    threads: int = 1
    guard: str = NO_GUARD
    replica: int = 0
    draws: int = 0
    name: str = "alone"

    @classmethod
    def parse(cls, text: str) -> Execution:
        """``alone`` or ``+``-joined changes of it: ``stack:B``, ``threads:N``, ``guard:G``, ``replica:R``,
        ``draws:K``."""
        fields: dict[str, Any] = {"name": text}
        for change in text.split("+"):
            if change == "alone":
                continue
            key, _, value = change.partition(":")
            if key not in ("stack", "threads", "guard", "replica", "draws") or not value:
                raise SystemExit(
                    f"unknown execution {change!r}; "
                    "use alone, stack:B, threads:N, guard:G, replica:R, draws:K"
                )
            fields["streams" if key == "stack" else key] = value if key == "guard" else int(value)
        return cls(**fields)


@dataclass
class Twin:
    """A twin's adapter and what it has done so far."""

    execution: Execution
    adapter: Any
    source: torch.Tensor
    correct: int = 0
    seen: int = 0

    def step(self, pixels: torch.Tensor, index: int, seed: int) -> torch.Tensor:
        """The twin's logits for ``pixels`` (its own stream's uint8 rows) after one online step under its
        execution; the methods' draws of this step are seeded by the run's seed, the step and the twin's
        ``draws``. The input is made as the runner makes it, stacked as uint8 rows and then turned into
        floats (``to_input``: a permuted, channels-last view), because the memory layout of the input
        decides which kernels run, and so the rounding, too."""
        torch.manual_seed((seed + 7919 * self.execution.draws) * 1_000_003 + index)
        torch.set_num_threads(self.execution.threads)
        x = to_input(pixels.repeat(self.execution.streams, 1, 1, 1))
        x = jittered(x, [self.execution.replica] * self.execution.streams, index)
        return self.adapter(x)[: len(pixels)]

    def weights(self) -> torch.Tensor:
        """The adapted weights of the twin's own stream (the first of a stack), as one vector."""
        stacked = self.execution.streams > 1
        return torch.cat([(p[0] if stacked else p).detach().flatten() for p in self.adapter.trainable])


@dataclass
class Record:
    """What a pair's comparison has found so far."""

    first_logit_step: int | None = None
    first_prediction_step: int | None = None
    differing: int = 0
    rows: list[dict[str, float]] = field(default_factory=list)


def stored_spec(
    db: str, model: str, method: str, protocol: str, corruption: str, lr_scale: float | None
) -> RunSpec:
    """The store's seed-0 unguarded run of this cell at its default stream and one pass, as a spec; where
    it holds several rates, the one at ``lr_scale``."""
    found = {}
    for row in open_store(db).rows("vision"):
        spec = row["spec"]
        if (
            (spec["model"], spec["method"], spec["protocol"], spec["corruption"])
            == (model, method, protocol, corruption)
            and spec["seed"] == 0
            and spec.get("guard", NO_GUARD) == NO_GUARD
            and not spec.get("prelude")
            and not spec.get("replica", 0)
            and spec.get("stream_length") is None
            and spec.get("epochs", 1) == 1
            and spec.get("imbalance_ratio") in (None, math.inf, "inf", "Infinity")
        ):
            found[spec["hparams"].get("lr_scale", 1.0)] = spec
    if lr_scale is not None:
        found = {rate: spec for rate, spec in found.items() if rate == lr_scale}
    if len(found) != 1:
        raise SystemExit(
            f"{len(found)} stored seed-0 runs of {model} {method} {protocol} {corruption} in {db} "
            f"(rates {sorted(found)}); name one with --lr-scale"
        )
    return RunSpec.from_dict(found.popitem()[1])


def make_twin(spec: RunSpec, model: torch.nn.Module, execution: Execution, batch_size: int) -> Twin:
    adapter = zerosiam.adapt(
        copy.deepcopy(model),
        spec.method,
        batch_size=batch_size,
        streams=execution.streams,
        guard=execution.guard,
        **spec.hparams,
        **_method_extras(spec.method, spec),
    )
    twin = Twin(execution, adapter, torch.zeros(0))
    twin.source = twin.weights().clone()
    return twin


def compare(spec: RunSpec, pairs: list[tuple[Execution, Execution]], steps: int | None) -> dict[str, Any]:
    """Step every pair's twins side by side over the spec's stream and record where they part."""
    torch.manual_seed(spec.seed)
    model = zerosiam.load_model(spec.model, **spec.model_options)
    stream = stream_for(spec, source_model=model)
    batches = StreamBatches(stream)
    length = len(batches) if steps is None else min(steps, len(batches))
    checkpoints = sorted({min(length, round(10 ** (k / 8))) for k in range(0, 8 * 6)} | {length})
    twins = [[make_twin(spec, model, e, stream.batch_size) for e in pair] for pair in pairs]
    records = [Record() for _ in pairs]
    device = torch.device("cpu")
    for index in range(length):
        pixels, y = batches[index]
        for (a, b), record in zip(twins, records, strict=True):
            logits_a = a.step(pixels, index, spec.seed)
            logits_b = b.step(pixels, index, spec.seed)
            _observe(record, index, logits_a, logits_b, y, a, b, index + 1 in checkpoints)
    out: dict[str, Any] = {"spec": spec.as_dict(), "steps": length, "pairs": []}
    for (a, b), record in zip(twins, records, strict=True):
        entry = {
            "twins": [a.execution.name, b.execution.name],
            "first_logit_step": record.first_logit_step,
            "first_prediction_step": record.first_prediction_step,
            "differing_predictions": record.differing,
            "online_accuracy": [a.correct / max(a.seen, 1), b.correct / max(b.seen, 1)],
            "curve": record.rows,
        }
        if stream.frozen_rows is not None:
            entry["final_accuracy"] = [_frozen_accuracy(t, stream, device) for t in (a, b)]
        out["pairs"].append(entry)
    return out


def _observe(
    record: Record,
    index: int,
    logits_a: torch.Tensor,
    logits_b: torch.Tensor,
    y: torch.Tensor,
    a: Twin,
    b: Twin,
    keep: bool,
) -> None:
    """Add one step's comparison to ``record``; a row of the curve at the log-spaced ``keep`` steps."""
    gap = (logits_a - logits_b).abs().max().item()
    predicted_a, predicted_b = logits_a.argmax(1), logits_b.argmax(1)
    differing = int((predicted_a != predicted_b).sum())
    if gap > 0 and record.first_logit_step is None:
        record.first_logit_step = index + 1
    if differing and record.first_prediction_step is None:
        record.first_prediction_step = index + 1
    record.differing += differing
    for twin, predicted in ((a, predicted_a), (b, predicted_b)):
        twin.correct += int((predicted == y).sum())
        twin.seen += len(y)
    if keep:
        weights_a, weights_b = a.weights(), b.weights()
        record.rows.append(
            {
                "step": index + 1,
                "logit_gap": gap,
                "weight_gap": float((weights_a - weights_b).norm()),
                "drift": float((weights_a - a.source).norm()),
                "differing": record.differing,
                "accuracy_a": a.correct / a.seen,
                "accuracy_b": b.correct / b.seen,
            }
        )


def _frozen_accuracy(twin: Twin, stream: Any, device: torch.device) -> float:
    """The blind spot's score: the twin's adapted model, frozen, on the whole set."""
    torch.set_num_threads(twin.execution.threads)
    streams = [stream] * twin.execution.streams
    hits = stacked_frozen_hits(
        twin.adapter.predict, streams, [stream.frozen_rows] * len(streams), device, None
    )
    return float(hits[0].mean())


FLOOR = 1e-12  # where a gap of exactly 0 is drawn on the log scale


def plot(result: dict[str, Any], path: Path) -> None:
    """Three panels over the stream: the weights' gap, the predictions that differed, the accuracy gap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for pair in result["pairs"]:
        steps = [row["step"] for row in pair["curve"]]
        label = " vs ".join(pair["twins"])
        axes[0].plot(steps, [max(row["weight_gap"], FLOOR) for row in pair["curve"]], label=label)
        axes[1].plot(steps, [row["differing"] for row in pair["curve"]], label=label)
        gaps = [100 * abs(row["accuracy_a"] - row["accuracy_b"]) for row in pair["curve"]]
        axes[2].plot(steps, gaps, label=label)
    spec = result["spec"]
    titles = (
        f"adapted weights: L2 gap ({FLOOR:g}: the same bits)",
        "predictions that differed (cumulative)",
        "online accuracy gap on the stream (points)",
    )
    for axis, title in zip(axes, titles, strict=True):
        axis.set_xscale("log")
        axis.set_xlabel("step")
        axis.set_title(title, fontsize=9)
    axes[0].set_yscale("log")
    axes[1].set_yscale("symlog")
    axes[1].set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    figure.suptitle(
        f"{spec['model']}, {spec['method']}, {spec['protocol']}, {spec['corruption']} 5, seed {spec['seed']}",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="docs/results/study")
    parser.add_argument("--model")
    parser.add_argument("--method")
    parser.add_argument("--protocol")
    parser.add_argument("--corruption")
    parser.add_argument("--pair", action="append", metavar="A/B", help="e.g. alone/stack:4")
    parser.add_argument("--lr-scale", type=float, help="the stored run's rate, where it holds several")
    parser.add_argument("--steps", type=int, help="stop after this many steps (default: the whole stream)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--plot", action="store_true", help="also write the figure, as a PNG beside it")
    parser.add_argument("--replot", action="store_true", help="only draw the figure of an existing --out")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.out.read_text()), args.out.with_suffix(".png"))
        return
    missing = [
        flag for flag in ("model", "method", "protocol", "corruption", "pair") if not getattr(args, flag)
    ]
    if missing:
        parser.error(f"give --{', --'.join(missing)} (or --replot)")
    pairs = []
    for text in args.pair:
        a, _, b = text.partition("/")
        pairs.append((Execution.parse(a), Execution.parse(b or "alone")))
    spec = stored_spec(args.db, args.model, args.method, args.protocol, args.corruption, args.lr_scale)
    result = compare(spec, pairs, args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.out.with_suffix(".png"))
    for pair in result["pairs"]:
        print(
            " vs ".join(pair["twins"]),
            f"logits first differ at step {pair['first_logit_step']},",
            f"predictions at {pair['first_prediction_step']};",
            f"{pair['differing_predictions']} predictions differed; online",
            " / ".join(f"{100 * a:.2f}" for a in pair["online_accuracy"]),
            *(
                ["; final", " / ".join(f"{100 * a:.2f}" for a in pair["final_accuracy"])]
                if "final_accuracy" in pair
                else []
            ),
        )


if __name__ == "__main__":
    main()
