"""Guards: parts that keep an adapting model from ending below the model it started from, without labels.

Entropy minimization can collapse on a stream nobody chose (a class-ordered stream at a large rate, a
long stream, noise), and a deployed model has no labels to notice. A guard watches after each step and
may put some streams back; any recipe can wear one (``recipe.with_(guard=...)``, ``adapt(model, method,
guard="auto")``), and every trigger is recorded in the step's diagnostics (``guard``).

* ``rdumb`` (``Periodic``): back to the source every 1,000 steps, whatever happens (RDumb, Press et al.,
  NeurIPS 2023: the simple baseline that beats most continual TTA methods).
* ``sar`` (``OnRecovery``): SAR's reset (the moving average of the objective below 0.2), for any method.
* ``auto`` (``SourceProbe``): the project's guard. Every ``every`` steps it predicts the step's batch
  with the source weights as well (one extra forward without gradients; at batch 1, on the last 16
  images) and compares, per stream, the adapted model with the source on the same images: how often they
  agree, and how spread the adapted model's predictions are against the source's (a class-ordered stream
  has a narrow marginal for both; a collapse narrows only the adapted model's). While both are healthy it
  keeps a snapshot of the adapted weights; when one is not, it rolls the stream back to the snapshot
  before the unhealthy window, or to the source if the stream was rolled back at the probe before.
* ``asr`` (``AdaptiveSelectiveReset``, ``zerosiam/parts/asr.py``): ASR (Lim, Hwang and Lee, ICLR 2026).
  When the entropy of the batch's mean prediction falls below its running value it puts the output side
  of the adapted parameters back to the source (more of them the further it fell), and from then on
  pulls the weights toward what the resets erased, weighted by their Fisher information.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from zerosiam.parts.asr import AdaptiveSelectiveReset
from zerosiam.parts.contract import Evaluation, GuardedLearner, Recovery
from zerosiam.parts.losses import probability_entropy
from zerosiam.parts.recovery import EmaBelow, ema_below

RDUMB_EVERY = 1000  # RDumb (Press et al., 2023): reset every 1,000 steps
RDUMB, SAR, AUTO, ASR = "rdumb", "sar", "auto", "asr"  # the guards by name (``GUARDS``)


class Periodic:
    """RDumb: every stream back to its source weights after every ``every`` steps."""

    def __init__(self, every: int = RDUMB_EVERY) -> None:
        self.every = every
        self.steps = 0

    def __call__(
        self, learner: GuardedLearner, x: Tensor, prediction: Tensor, evaluations: list[Evaluation]
    ) -> Tensor:
        self.steps += 1
        due = self.steps % self.every == 0
        flags = learner.layout.all_streams(prediction.device) & due
        if due:
            learner.restore_source(flags)
        return flags

    def reset(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]


class OnRecovery:
    """A recovery rule (SAR's EMA of the objective below a floor) as a guard for any method."""

    def __init__(self, recovery: Recovery) -> None:
        self.recovery = recovery

    def __call__(
        self, learner: GuardedLearner, x: Tensor, prediction: Tensor, evaluations: list[Evaluation]
    ) -> Tensor:
        flags = self.recovery(evaluations)
        if flags.any():
            learner.restore_source(flags)
        return flags

    def reset(self) -> None:
        self.recovery.reset()

    def state_dict(self) -> dict[str, Any]:
        return self.recovery.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recovery.load_state_dict(state)


@dataclass
class Health:
    """What a probe measures per stream: agreement with the source, and both marginals' entropies."""

    agreement: Tensor
    adapted_spread: Tensor
    source_spread: Tensor
    source_confidence: Tensor


class SourceProbe:
    """The project's guard: the adapted model against the source model on the same images, per stream.

    Every ``every`` steps (every ``warmup_every`` in the first ``warmup`` steps, where a rate that is far
    too large collapses a model within a few steps) the step's batch is predicted at the source weights
    too: a schedule of the step count alone, so stacked streams are probed as lone ones. Per stream it
    follows moving averages (``momentum`` per probe) of the agreement between the two models' predicted
    classes and of both models' class histograms. A stream is unhealthy when the agreement falls below
    ``min_agreement`` or the adapted histogram's entropy falls ``max_narrowing`` nats below the source's.
    An unhealthy stream is rolled back to the oldest of the last ``ring`` snapshots (probes ago, so before
    the averages, which lag, could notice), or to the source in the warm-up (a rate that trips the guard
    that early was too large from the first step: its snapshots, a few steps apart, already carry the
    damage that shows only later, as Tent's at 3× on the first class of a class-ordered stream), and its
    averages restart; then the weights, all of which have now passed, are the newest snapshot; its steps
    are then scaled by ``shrink``, a decade down by default (a rate that collapsed the stream once would
    again; halving it left Tent at 10× the paper's rate 1.4 points below NoAdapt on the ResNet-26's
    class-ordered Gaussian noise, a tenth 0.7). With ``recover`` a slowed stream takes its full step back
    once it has passed that many probes in a row (not the default: ``docs/guard_log.md``, Open). Every stream
    is judged, rolled back, slowed and given its step back alone.

    A probe judges at least ``probe_images`` images a stream. A step with that many rows or more (batch
    64) is judged on its own batch, on the schedule above, or with ``rows`` on that many of its images a
    stream, evenly spaced (a smaller source forward, so that probes may come more often at the same
    cost; not the default, ``docs/guard_log.md``). Smaller steps (batch 1) lend their images to
    the probe, one step in ``sample``, beside the adapted model's calls on them as they were made; once
    ``probe_images`` are kept, they are predicted at the source weights in one forward, judged and
    dropped, so a call judged after a trigger was made after it. Judged on one image, a single
    disagreement took the agreement from 1.0 to 0.8, under the bar, so that at batch 1 the guard fired on
    any probe whose image the adapted model called differently from the source. Judging every image (the
    default) costs a batch-1 step on a CPU a quarter more (a source forward for each forward and
    backward); ``sample=8`` costs 5 % but judges a stream every 128 steps instead of 16, and on the
    ResNet-26's blind spot left 11 of 24 cells more than a point below not adapting, against 6 (both with
    the first settings below; ``docs/efficiency_log.md``, ``docs/guard.md``).

    With ``escalate`` (the default since 2026-12-05), a stream found unhealthy again at the probe right
    after it was rolled back goes back to the source instead: the snapshot it was rolled back to was
    already inside the trouble, and rolling a stream that has moved far from the source back to a snapshot
    as far away only slows it (on the ConvNeXt's blind spot 567 of the first settings' 1,060 triggers came
    at the probe right after another; DeYO's fog fired 285 times and ended 10 points below not adapting).

    With ``relative`` (the default since 2026-12-05), the agreement bar is ``min_agreement`` times the
    source's mean confidence on the probe images (its top probability, followed like the agreement): how
    often a model that keeps the source's right calls agrees with it depends on how often the source is
    right, and a model that gains on fog, where the ConvNeXt's source is right on 45 % of the images,
    parts from more than 15 % of its calls. Under shift the confidence overstates the accuracy (0.77–0.81
    there), so the bar falls less than the accuracy does. A lower bar fires later or not at all, so a
    stream on which the fixed bar never fired runs as it did.

    Until then ``auto`` ran with both off (its runs kept as ``auto[relative=false,escalate=false]``).
    Over the 307 cells of the guard grid where ``auto`` is run, both on leave 32 cells more than a point
    below not adapting against 51 and keep 77 % of the gains against 57 %, firing on 0.22 of 100 mild
    batches against 0.45; they lose more on the ResNet-26 (11 of its 86 falls, gains and noise-prefix
    cells against 8), where a lower bar catches a collapse later (``docs/guard_log.md``).

    Two more settings, both off (``docs/guard_log.md``, 2026-12-07), were tried for the gains the agreement
    bar takes on the ConvNeXt's five passes, and each lost collapses it catches. With ``max_widening`` a
    probe under the agreement bar is excused where the adapted histogram's entropy is more than that many
    nats above the source's (a model taking apart a source whose calls crowd into few classes): but a
    class-ordered collapse of ZeroSiam spreads its calls first, by 0.3–0.9 nats, before it gathers them.
    With ``weighted`` each image counts in the agreement by the source's confidence on it: but a gaining
    model parts from the source's sure calls too.

    These defaults are ``auto`` frozen for its held-out grid (``docs/guard.md``, "``auto``, frozen"; a test
    holds them to that page): a change to one is a new guard under a new name.
    """

    def __init__(
        self,
        every: int = 16,
        min_agreement: float = 0.85,
        max_narrowing: float = 0.05,
        momentum: float = 0.8,
        ring: int = 3,
        shrink: float = 0.1,
        warmup: int = 32,
        warmup_every: int = 4,
        probe_images: int = 16,
        sample: int = 1,
        escalate: bool = True,
        relative: bool = True,
        rows: int | None = None,
        recover: int = 0,
        max_widening: float = math.inf,
        weighted: bool = False,
    ) -> None:
        self.every = every
        self.probe_images, self.sample, self.rows = probe_images, sample, rows
        self.warmup, self.warmup_every = warmup, warmup_every
        self.min_agreement = min_agreement
        self.max_narrowing = max_narrowing
        self.max_widening = max_widening
        self.weighted = weighted
        self.momentum = momentum
        self.ring = ring
        self.shrink, self.recover = shrink, recover
        self.escalate = escalate
        self.relative = relative
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.signals: dict[str, Tensor] = {}  # this step's probe, for the record: agreement, narrowing
        self.agreement: Tensor | None = None
        self.adapted: Tensor | None = None  # per stream, a moving class histogram
        self.source: Tensor | None = None
        self.confidence: Tensor | None = None  # per stream, the source's moving mean top probability
        self.snapshots: list[dict[str, dict[str, Tensor]]] = []
        self.gathered: list[tuple[Tensor, Tensor]] = []  # small steps since the last probe: (images, calls)
        self.put_back: Tensor | None = None  # per stream, whether the last probe put it back
        self.passed: Tensor | None = None  # per stream, probes passed since it was slowed; -1 at full step

    def __call__(
        self, learner: GuardedLearner, x: Tensor, prediction: Tensor, evaluations: list[Evaluation]
    ) -> Tensor:
        unhealthy = self.judge(learner, x, prediction)
        if unhealthy is None:
            return learner.layout.all_streams(prediction.device) & False
        flags = learner.layout.value(unhealthy)
        if bool(unhealthy.any()):
            self._put_back(learner, unhealthy)
            if self.shrink != 1.0:
                learner.shrink(flags, self.shrink)
            self._restart(unhealthy)
        if self.recover:
            self._give_back_steps(learner, unhealthy)
        self.put_back = unhealthy
        # every stream's weights now passed this probe (or were put back): the newest snapshot
        self.snapshots = [*self.snapshots, learner.snapshot()][-self.ring :]
        return flags

    def judge(self, learner: GuardedLearner, x: Tensor, prediction: Tensor) -> Tensor | None:
        """One step looked at, acting on nothing: on a probe, each stream's health (``[B]`` flags, True
        where unhealthy), the averages moved and ``signals`` set; None on a step that is not probed."""
        self.steps += 1
        layout = learner.layout
        self.signals = {}
        adapted = layout.rows(prediction.argmax(-1))
        if len(prediction) // layout.count < self.probe_images:  # a small step: gather, probe when enough
            probe = self._gather(layout.rows(x), adapted)
        else:
            probe = self._spread(layout.rows(x), adapted) if self._due() else None
        if probe is None:
            return None
        images, adapted = probe
        with torch.no_grad():
            source = learner.source_prediction(images)
        confidence = layout.rows(source.softmax(-1).amax(-1))
        health = self._follow(adapted, layout.rows(source.argmax(-1)), confidence, prediction.shape[-1])
        narrowing = health.source_spread - health.adapted_spread
        parted = (health.agreement < self._agreement_bar(health)) & (narrowing >= -self.max_widening)
        narrowed = narrowing > self.max_narrowing
        self.signals = {
            "agreement": layout.value(health.agreement),
            "narrowing": layout.value(narrowing),
            "confidence": layout.value(health.source_confidence),
            "below_agreement": layout.value(parted),  # which bar a trigger crossed: both may
            "narrowed": layout.value(narrowed),
        }
        return parted | narrowed

    def _put_back(self, learner: GuardedLearner, unhealthy: Tensor) -> None:
        """The ``unhealthy`` streams (``[B]`` flags) back to the oldest snapshot; to the source in the
        warm-up and, with ``escalate``, those the last probe put back too."""
        value = learner.layout.value
        if not self.snapshots or self.steps <= self.warmup:
            learner.restore_source(value(unhealthy))
        elif not self.escalate or self.put_back is None:
            learner.roll_back(self.snapshots[0], value(unhealthy))
        else:
            again = unhealthy & self.put_back
            learner.roll_back(self.snapshots[0], value(unhealthy & ~again))
            learner.restore_source(value(again))

    def _give_back_steps(self, learner: GuardedLearner, unhealthy: Tensor) -> None:
        """Count the probes each slowed stream has passed since its last trigger (``unhealthy``, ``[B]``
        flags, restarts the count); after ``recover`` of them, its full step back."""
        passed = self.passed if self.passed is not None else torch.full_like(unhealthy, -1, dtype=torch.long)
        passed = torch.where(unhealthy, 0, torch.where(passed >= 0, passed + 1, passed))
        back = passed >= self.recover
        if bool(back.any()):
            learner.full_step(learner.layout.value(back))
            passed = torch.where(back, -1, passed)
        self.passed = passed

    def _due(self) -> bool:
        """Whether this step of full batches is probed: every ``warmup_every`` steps in the warm-up,
        every ``every`` after."""
        return self.steps % (self.warmup_every if self.steps <= self.warmup else self.every) == 0

    def _spread(self, images: Tensor, calls: Tensor) -> tuple[Tensor, Tensor]:
        """A full step's images (``[B, n, ...]``) and calls (``[B, n]``) as a probe takes them: all of
        them, or with ``rows`` that many a stream, evenly spaced over its batch (a smaller forward, so
        that probes can come more often at the same cost)."""
        count = calls.shape[-1]
        if self.rows is not None and self.rows < count:
            keep = torch.arange(0, count, count // self.rows, device=calls.device)[: self.rows]
            images, calls = images[:, keep], calls[:, keep]
        return images.flatten(0, 1), calls

    def _gather(self, images: Tensor, calls: Tensor) -> tuple[Tensor, Tensor] | None:
        """Keep a small step's images (``[B, n, ...]``) and the adapted calls on them (``[B, n]``) if
        it is one in ``sample``; once ``probe_images`` a stream are kept, hand them all over as
        stream-major rows (as a step's ``x``) with their calls, and start gathering afresh."""
        if self.steps % self.sample:
            return None
        self.gathered = [*self.gathered, (images, calls)]
        if sum(kept.shape[-1] for _, kept in self.gathered) < self.probe_images:
            return None
        images = torch.cat([rows for rows, _ in self.gathered], dim=1).flatten(0, 1)
        calls = torch.cat([kept for _, kept in self.gathered], dim=-1)
        self.gathered = []
        return images, calls

    def _agreement_bar(self, health: Health) -> Tensor | float:
        """The agreement below which a stream is unhealthy: ``min_agreement``, or with ``relative`` that
        share of the source's mean confidence (about how often the source is right, so about how often
        a model that keeps the source's right calls agrees with it)."""
        return self.min_agreement * health.source_confidence if self.relative else self.min_agreement

    def _follow(self, adapted: Tensor, source: Tensor, confidence: Tensor, classes: int) -> Health:
        """Move the averages by one probe: ``adapted``, ``source`` are ``[B, n]`` predicted classes and
        ``confidence`` the source's top probabilities."""
        agree = (adapted == source).float()
        agreement = _weighted_mean(agree, confidence) if self.weighted else agree.mean(-1)
        self.agreement = self._blend(self.agreement, agreement)
        self.confidence = self._blend(self.confidence, confidence.mean(-1))
        self.adapted = self._blend(self.adapted, _histogram(adapted, classes))
        self.source = self._blend(self.source, _histogram(source, classes))
        spreads = probability_entropy(self.adapted), probability_entropy(self.source)
        return Health(self.agreement, *spreads, self.confidence)

    def _blend(self, average: Tensor | None, value: Tensor) -> Tensor:
        """One probe into a moving average; a stream whose average is NaN (restarted) takes the value."""
        if average is None:
            return value
        return torch.where(average.isnan(), value, self.momentum * average + (1 - self.momentum) * value)

    def _restart(self, streams: Tensor) -> None:
        """Forget the averages of the streams put back (their next probe starts them afresh)."""
        rows = streams.view(-1, 1)
        self.agreement = torch.where(streams, torch.nan, self.agreement)
        self.confidence = torch.where(streams, torch.nan, self.confidence)
        self.adapted = torch.where(rows, torch.nan, self.adapted)
        self.source = torch.where(rows, torch.nan, self.source)

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "agreement": self.agreement,
            "adapted": self.adapted,
            "source": self.source,
            "confidence": self.confidence,
            "snapshots": self.snapshots,
            "gathered": self.gathered,
            "put_back": self.put_back,
            "passed": self.passed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]
        self.agreement, self.adapted, self.source = state["agreement"], state["adapted"], state["source"]
        self.confidence = state.get("confidence")  # checkpoints of old did not follow it
        self.snapshots = state["snapshots"]
        self.gathered = state.get("gathered", [])  # checkpoints of old gathered nothing
        self.put_back = state.get("put_back")  # nor knew what the last probe put back
        self.passed = state.get("passed")  # nor gave a step back


# What a watch keeps of a probe's signals: the curves, not which bar a trigger crossed (it triggers nothing)
WATCHED_SIGNALS = ("agreement", "narrowing", "confidence")


class Watch:
    """A guard's judgement without its actions, for an unguarded run: it changes nothing, and records at
    every step, per stream, whether ``auto`` would first act there (``would_act``). Until then the run
    wearing ``auto`` is this run step for step (the guard has acted on nothing, and its probe predicts at
    the source weights beside the adapted ones); after it, the two differ, and the watch stops probing
    that stream. A run it watched from its first step to its last and never fired on need not be made
    with ``auto`` (``never_acts``); a run it saw only part of (resumed from a checkpoint made without it,
    or with it and then without) says nothing (``auto_watched``). Its cost is ``auto``'s probe, without
    the snapshots."""

    def __init__(self, probe: SourceProbe | None = None) -> None:
        self.probe = probe if probe is not None else SourceProbe()
        self.reset()

    def reset(self) -> None:
        self.probe.reset()
        self.fired: Tensor | None = None  # per stream, whether the probe has found it unhealthy yet
        self.signals: dict[str, Tensor] = {}

    def __call__(
        self, learner: GuardedLearner, x: Tensor, prediction: Tensor, evaluations: list[Evaluation]
    ) -> Tensor:
        quiet = learner.layout.all_streams(prediction.device) & False
        self.signals = {"would_act": quiet}
        if self.fired is not None and bool(self.fired.all()):
            return quiet
        unhealthy = self.probe.judge(learner, x, prediction)
        if unhealthy is not None:
            fired = self.fired if self.fired is not None else torch.zeros_like(unhealthy)
            self.signals = {key: self.probe.signals[key] for key in WATCHED_SIGNALS}
            self.signals["would_act"] = learner.layout.value(unhealthy & ~fired)
            self.fired = fired | unhealthy
        return quiet

    def state_dict(self) -> dict[str, Any]:
        return {"probe": self.probe.state_dict(), "fired": self.fired}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.probe.load_state_dict(state["probe"])
        self.fired = state["fired"]


def triggers_by_bar(history: list[dict[str, Any]]) -> dict[str, int]:
    """A run's ``auto`` triggers counted by the bar each crossed, for its metrics (a probe may cross both):
    which bar decides what the guard takes is a question of the run, not only of its per-step curves.
    Empty when no step of ``history`` (one stream's step records) recorded a probe."""
    if not any("guard_narrowed" in row for row in history):
        return {}
    fired = [row for row in history if row.get("guard")]
    return {
        "guard_triggers_on_agreement": sum(bool(row.get("guard_below_agreement")) for row in fired),
        "guard_triggers_on_narrowing": sum(bool(row.get("guard_narrowed")) for row in fired),
    }


def sar_replayed(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the ``sar`` guard would have fired on a run, and at which step, for its metrics: SAR's rule
    replayed on the objective each step of ``history`` (one stream's step records) recorded, as the guard
    reads it (``EmaBelow.first_fire``). Empty when no step recorded an objective."""
    objectives = [row.get("last_objective", row.get("objective")) for row in history]
    if all(value is None for value in objectives):
        return {}
    first = _sar_rule().first_fire(math.nan if value is None else float(value) for value in objectives)
    return {"sar_guard_fires": first is not None} | ({} if first is None else {"sar_guard_first_step": first})


def auto_watched(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether ``auto`` would have acted on a run that a ``Watch`` looked at, and at which step, for its
    metrics (``auto_guard_fires``, ``auto_guard_first_step``), from ``history`` (one stream's step
    records). Empty unless every step recorded the watch's verdict: a run not watched, or watched only
    from or up to a checkpoint, could have been acted on where the watch did not look."""
    if not history or not all("guard_would_act" in row for row in history):
        return {}
    first = next((step for step, row in enumerate(history, 1) if row.get("guard_would_act")), None)
    fires = {"auto_guard_fires": first is not None}
    return fires | ({} if first is None else {"auto_guard_first_step": first})


def never_acts(name: str, metrics: dict[str, Any]) -> bool:
    """Whether the guard ``name`` would never act on the unguarded run whose ``metrics`` these are, so
    that the run wearing it is that run step for step (a guard that has not acted has changed nothing):
    ``rdumb`` on fewer steps than its period, ``sar`` where its rule replayed on the run never fires,
    ``auto`` where it watched the run and never fired."""
    if name == RDUMB:
        return int(metrics.get("steps") or RDUMB_EVERY) < RDUMB_EVERY
    if name in (SAR, AUTO):
        return metrics.get(f"{name}_guard_fires") is False
    return False


def _sar_rule() -> EmaBelow:
    return ema_below(0.2)  # methods.md: SAR, reset when ema < 0.2


def _weighted_mean(values: Tensor, weights: Tensor) -> Tensor:
    """Per stream, the mean of ``values`` (``[B, n]``) with each row counted by its weight."""
    return (values * weights).sum(-1) / weights.sum(-1)


def _histogram(classes: Tensor, count: int) -> Tensor:
    """Per stream, the fraction of rows predicting each class: ``[B, n]`` → ``[B, count]``."""
    one_hot = torch.nn.functional.one_hot(classes, count).float()
    return one_hot.mean(1)


Guard = Callable[[GuardedLearner, Tensor, Tensor, list[Evaluation]], Tensor]

GUARDS: dict[str, Callable[[], Guard | None]] = {
    "none": lambda: None,
    RDUMB: Periodic,
    SAR: lambda: OnRecovery(_sar_rule()),
    AUTO: SourceProbe,
    ASR: AdaptiveSelectiveReset,
}


def guard_named(name: str) -> Guard | None:
    """A fresh guard by name (``none`` is no guard); a one-line error naming the choices otherwise."""
    if name not in GUARDS:
        raise ValueError(f"unknown guard {name!r}; choose one of {', '.join(GUARDS)}")
    return GUARDS[name]()


PLAIN = bool | int | float | str | None  # the settings a run's record keeps (JSON's scalars)


def guard_settings(name: str) -> dict[str, Any]:
    """The settings the guard ``name`` runs with, for a run's record: its constructor's arguments that are
    plain values, as a fresh one holds them ({} for ``none``). A name says which guard ran, not at which
    settings (``auto``'s changed twice before they were frozen), so a stored run keeps both."""
    guard = guard_named(name)
    if guard is None:
        return {}
    named = inspect.signature(type(guard)).parameters
    values = {key: getattr(guard, key) for key in named if hasattr(guard, key)}
    plain = {key: value for key, value in values.items() if isinstance(value, PLAIN)}
    return {key: str(value) if value in (math.inf, -math.inf) else value for key, value in plain.items()}
