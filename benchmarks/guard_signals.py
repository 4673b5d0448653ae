"""What a label-free guard can read on a stream, beside what it would need to know: an unguarded run,
probed every 4 steps.

    PYTHONPATH=. python benchmarks/guard_signals.py --model vit_tiny_ln --method zerosiam --lr-scale 30 \
        --corruptions gaussian_noise,impulse_noise,fog,contrast

The study's label-shift stream (CIFAR-10-C, severity 5, class-ordered, batch 64, seed 0). Every 4th step
the step's batch is also predicted at the source weights, as ``auto`` probes, and each window of 16 steps
prints the source's and the adapted model's accuracy on the probed images (labels no guard sees), how often
the two models agree on all of them (``auto``'s first signal) and on the half the source is more confident
of (a candidate: a model that gains should change the source's doubtful calls, not its sure ones), how
often the adapted call is among the source's 2 and 3 most probable classes (a candidate: a gain should
move a call to a class the source found likely too, a collapse anywhere), how much narrower the adapted
class histogram is than the source's (``auto``'s second signal), both models' mean entropy, and two logit
trends: the adapted model's mean logit norm and mean margin between its two largest logits, each as a
share of the source's on the same images (entropy minimization sharpens a model by growing its logits; a
collapse may grow them further than a gain does). A signal is of use to a guard where it parts the
windows that lose from those that gain.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import Tensor

import zerosiam
from zerosiam.bench.batches import StreamBatches
from zerosiam.bench.runner import stream_for
from zerosiam.bench.spec import RunSpec
from zerosiam.cli._args import csv_list
from zerosiam.parts.contract import Evaluation, GuardedLearner
from zerosiam.parts.losses import probability_entropy
from zerosiam.protocols.build import to_device

PROBE_EVERY = 4  # auto's warm-up schedule, kept for the whole stream
WINDOW = 4  # probes a printed row sums
TOPS = (2, 3)  # the source's k most probable classes an adapted call may fall among


class Watch:
    """A guard that never fires: it keeps the source's and the adapted model's logits every
    ``PROBE_EVERY`` steps."""

    def __init__(self) -> None:
        self.reset()

    def __call__(
        self, learner: GuardedLearner, x: Tensor, prediction: Tensor, evaluations: list[Evaluation]
    ) -> Tensor:
        self.steps += 1
        if self.steps % PROBE_EVERY == 0:
            with torch.no_grad():
                source = learner.source_prediction(x)
            self.probes.append((self.steps, source.detach().cpu(), prediction.detach().cpu()))
        return learner.layout.all_streams(prediction.device) & False

    def reset(self) -> None:
        self.steps = 0
        self.probes: list[tuple[int, Tensor, Tensor]] = []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def watched_run(spec: RunSpec) -> tuple[list[tuple[int, Tensor, Tensor]], list[Tensor], float]:
    """Run ``spec`` unguarded but watched: the probes, the labels of each probed step, the accuracy."""
    torch.manual_seed(spec.seed)
    model = zerosiam.load_model(spec.model)
    batches = StreamBatches(stream_for(spec))
    adapter = zerosiam.adapt(model, spec.method, batch_size=spec.batch_size, guard=Watch(), **spec.hparams)
    labels, hits = [], 0
    for step, (pixels, y) in enumerate(batches.loader(torch.device("cpu")), start=1):
        x, y = to_device(pixels, y, torch.device("cpu"))
        hits += int((adapter(x).argmax(-1) == y).sum())
        if step % PROBE_EVERY == 0:
            labels.append(y)
    return adapter.recipe.guard.probes, labels, hits / len(batches.stream.rows)


def entropy(classes: Tensor, count: int) -> float:
    """The entropy of the histogram of ``classes`` over ``count`` classes, in nats."""
    share = torch.bincount(classes.flatten(), minlength=count).float() / classes.numel()
    return float(probability_entropy(share))


def window_row(probes: list[tuple[int, Tensor, Tensor]], labels: list[Tensor]) -> str:
    """One window's line: accuracies, agreement on all and on the source's surer half, narrowing,
    entropies, logit trends."""
    source_logits = torch.cat([s for _, s, _ in probes])
    adapted_logits = torch.cat([a for _, _, a in probes])
    source, adapted = source_logits.softmax(-1), adapted_logits.softmax(-1)
    y = torch.cat(labels)
    said, changed = source.argmax(-1), adapted.argmax(-1)
    confidence = source.max(-1).values
    sure = torch.cat([c >= c.median() for c in confidence.split([len(s) for _, s, _ in probes])])
    agree = said == changed
    plausible = [float(in_top(source, changed, k).float().mean()) for k in TOPS]
    narrowing = entropy(said, source.shape[-1]) - entropy(changed, source.shape[-1])
    source_entropy, adapted_entropy = (float(probability_entropy(p).mean()) for p in (source, adapted))
    norm = float(adapted_logits.norm(dim=-1).mean() / source_logits.norm(dim=-1).mean())
    margin = float(top_margin(adapted_logits).mean() / top_margin(source_logits).mean())
    return (
        f"| {probes[0][0]}–{probes[-1][0]} | {100 * float((said == y).float().mean()):.1f} "
        f"| {100 * float((changed == y).float().mean()):.1f} | {float(agree.float().mean()):.2f} "
        f"| {float(agree[sure].float().mean()):.2f} | {' | '.join(f'{p:.2f}' for p in plausible)} "
        f"| {narrowing:+.2f} | {source_entropy:.2f} | {adapted_entropy:.2f} | {norm:.2f} | {margin:.2f} |"
    )


def top_margin(logits: Tensor) -> Tensor:
    """Each row's largest logit less its second: how sure a model is of its call, in logit units."""
    top = logits.topk(2, -1).values
    return top[:, 0] - top[:, 1]


def in_top(probabilities: Tensor, classes: Tensor, k: int) -> Tensor:
    """Whether each row's ``classes`` is among the ``k`` most probable of ``probabilities``."""
    return (probabilities.topk(k, -1).indices == classes.unsqueeze(-1)).any(-1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="vit_tiny_ln")
    parser.add_argument("--method", default="zerosiam")
    parser.add_argument("--lr-scale", type=float, default=30.0)
    parser.add_argument("--corruptions", type=csv_list, default=["gaussian_noise", "fog"])
    parser.add_argument("--protocol", default="label_shift")
    args = parser.parse_args()
    for corruption in args.corruptions:
        spec = RunSpec(args.model, "cifar10c", corruption, 5, args.protocol, args.method,
                       hparams={"lr_scale": args.lr_scale})  # fmt: skip
        probes, labels, accuracy = watched_run(spec)
        print(f"\n{args.model} {args.method} ×{args.lr_scale:g}, {args.protocol}, {corruption}: "
              f"accuracy {100 * accuracy:.1f}")  # fmt: skip
        tops = " | ".join(f"in the source's top {k}" for k in TOPS)
        print(f"| steps | source acc. | adapted acc. | agreement | on the source's surer half | {tops} "
              "| narrowing | source entropy | adapted entropy | logit norm, adapted ÷ source "
              "| top-2 logit margin, adapted ÷ source |")  # fmt: skip
        print("| --- |" + " ---: |" * (9 + len(TOPS)))
        for start in range(0, len(probes), WINDOW):
            print(window_row(probes[start : start + WINDOW], labels[start : start + WINDOW]))


if __name__ == "__main__":
    main()
