"""ASR, Adaptive and Selective Reset: reset when the batch's mean prediction narrows, as far as it does.

Lim, Hwang and Lee, "When and Where to Reset Matters for Long-Term Test-Time Adaptation" (ICLR 2026);
their code, ``github.com/YonseiML/asr`` (built on ``mariodoebler/test-time-adaptation``): the signals and
the reset in ``methods/base.py``, the pull where ``methods/eata.py`` and ``methods/roid.py`` add it to
their loss, the constants in ``conf.py``. A collapsing model predicts few classes for every input, so the
entropy of a batch's mean prediction falls. RDumb resets everything every 1,000 steps, whatever happens;
ASR resets when that entropy falls below its running value, puts back only the parameters nearest the
output when it falls a little and all of them when it falls far, and pulls the adapted weights toward
what its resets erased, weighted by how much each weight mattered. After every step, per stream:

1. **Two signals.** The entropy ``H`` of the batch's mean prediction (the code's ``Entropy`` of the mean
   logits: the softmax of the batch-mean logit vector) and ``flips``, the share of the batch on which the
   adapted model's class differs from the frozen source model's on the same images (one source forward
   a judged batch, the code's ``self.src``).
2. **When.** A reset when ``H`` is below the running value ``R``; otherwise ``R ← m·R + (1 − m)·H`` with
   ``m = M0·flips + 1 − M0``: the more the model disagrees with the source, the slower ``R`` follows
   (not at all when every call differs). ``R`` moves only when ``H ≥ R``, so it climbs toward the
   stream's entropies and the first batch below it fires: on a stationary stream too, once ``R`` has
   climbed into the spread of its batches' entropies, mostly by a small gap and so with a partial reset
   (resets are meant to be frequent and cheap: what they erase, the pull brings back). ``R`` starts,
   and restarts after each reset, at ``log(A0·C)`` for ``C`` classes (``log 2`` nats below uniform).
3. **Where.** The reset keeps the adapted values of the first ``scope`` share of the adapted parameters in
   the model's order (``i < scope·n``: the input side) and puts the rest, the output side, back to the
   source, ``scope = max(R0 − R1·(R − H), 0)``: half kept when ``H`` only touches ``R``, nothing once it
   is ``R0/R1 = 0.025`` nats below. The optimizer's state is fresh (the code reloads its initial state;
   here the stream's momentum is zeroed, which is what no momentum does for SGD).
4. **What comes back.** Every step, the squared gradient of the method's own loss and the weights before
   the step are summed; at a reset their means since the stream's last reset become the estimates ``F``
   and ``θ̄`` (the first time) or move them a tenth of the way (``0.9·old + 0.1·new``,
   ``ESTIMATE_MOMENTUM``). From the first reset on, every step's loss carries ``P0·flips²·Σ F·(θ − θ̄)²``
   with the flips of the last judged batch: a pull toward the weights the resets erased, strongest on the
   weights that mattered and when the model has moved furthest from the source. A guard acts after the
   step and cannot add to the method's loss, so the pull enters where the loss's gradient does: before
   each optimizer step its gradient, ``2·P0·flips²·F·(θ − θ̄)``, is added to each adapted weight's (a hook
   on the optimizer), and the step and its momentum carry it as they carry the loss term's in the code.

Where this departs from the code, and why:

* **The judged images.** The code judges each batch, 64 images in every configuration of the paper. A step
  with ``window`` (64) images a stream or more is judged on its own batch, as there; smaller steps (batch
  1) lend their images, and the adapted model's logits on them as the calls were made, until 64 are kept,
  judged then in one source forward. Judged alone, the entropy of one image's mean prediction is that
  image's entropy, below ``log(A0·C)`` for any confident call, so that most steps of batch 1 fired and
  reset everything (the code applies ASR to batches only: its batch-1 path has none). The constants then
  read statistics of as many images as those they were set on.
* **Ten classes.** The constants are the paper's, set on ImageNet-scale runs (ImageNet-C, CCC,
  ImageNet-D109: 1,000 or 109 classes); none is tuned here. They carry to CIFAR-10's 10 as they stand:
  the restart ``log(A0·C)`` is ``log 2`` below the uniform entropy for any ``C``, the gap that sets the
  scope is in nats and the flips are a share. On a class-ordered stream a batch's mean prediction is
  narrow for the source model too, so ASR reads it as a collapse and resets, as its code would (``auto``
  compares the two models' narrowing instead, ``guards.SourceProbe``).
* **Which weights.** The code's are the normalization layers' affine weights (ETA, ROID), in the model's
  order; here, the method's adapted weights (``learner.params``) in the same order, so for SAR and DeYO,
  which leave the last stage out, the output side ends before it. ZeroSiam's predictor, the layer nearest
  the output, always goes back to the identity on a reset (``scope`` keeps at most ``R0``, half) and is
  not pulled (the code has none).
* **The first step.** The hook goes on the optimizer at the guard's first call, after the first step: that
  step enters the sums with the source weights (kept by ``prepare``) and the gradient it left, which SAM's
  two passes clear (there it enters with none). A step that did not move (no sample kept, a non-finite
  loss) enters with its weights and no gradient, where the code would sum the gradient of an empty loss,
  NaN, into every later estimate.
* **What a reset leaves.** The method's own rules keep their state (EATA's redundancy mean), as under the
  other guards here; the code's ETA and ROID clear theirs.

Its cost: a source forward a judged batch (as the code's), two multi-tensor sums a step (three more once
it pulls), four copies of the adapted weights, and at a reset a copy of those it keeps.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from zerosiam.parts.contract import Evaluation, GuardedLearner
from zerosiam.parts.losses import entropy

M0 = 0.15  # conf.py, ASR.M0: the running entropy's momentum is M0·flips + 1 − M0
P0 = 5.0  # conf.py, ASR.P0: the pull's strength, P0·flips²
A0 = 0.5  # conf.py, ASR.A0: the running entropy (re)starts at log(A0·classes)
R0 = 0.5  # conf.py, ASR.R0: the largest share of the adapted parameters (input side) a reset keeps
R1 = 20.0  # conf.py, ASR.R1: the share kept falls by R1 per nat of entropy below the running value
ESTIMATE_MOMENTUM = 0.9  # methods/base.py: register_ewc_params(self.asr_step, momentum=0.9)
WINDOW = 64  # images judged at once: the paper's batch (TEST.BATCH_SIZE 64 in every cfgs/ file)


class ResettableLearner(GuardedLearner, Protocol):
    """What ASR uses of the learner beyond a guard's own: the adapted weights, their optimizer (to add the
    pull to its step) and whether the step was skipped."""

    params: dict[str, nn.Parameter]
    optimizer: torch.optim.Optimizer

    @property
    def skipped(self) -> str | None: ...


class AdaptiveSelectiveReset:
    """ASR as a guard for any image method (the module's docstring tells the algorithm and its sources).

    Per stream it keeps the running entropy, the pull's strength, the steps since its last reset and the
    sums and estimates of the squared gradients and weights; every stream is judged, reset and pulled
    alone. A judged step records ``entropy``, ``running`` (the value it was compared with), ``flips`` and
    ``scope`` (NaN where it did not fire) as the step's ``guard_*`` diagnostics.
    """

    hooks_the_step = True  # its pull is added inside the optimizer's step (a captured step cannot take it)

    def __init__(
        self,
        m0: float = M0,
        p0: float = P0,
        a0: float = A0,
        r0: float = R0,
        r1: float = R1,
        window: int = WINDOW,
    ) -> None:
        self.m0, self.p0, self.a0, self.r0, self.r1 = m0, p0, a0, r0, r1
        self.window = window
        self._learner: ResettableLearner | None = None  # the learner prepared for, to hook a resumed run
        self._source: dict[str, Tensor] = {}  # the adapted weights before the first step (``prepare``)
        self._handle: RemovableHandle | None = None
        self.reset()

    # --- set-up -------------------------------------------------------------------------------------
    def prepare(self, learner: ResettableLearner) -> None:
        """Keep the source weights (the first step's weights before it) and the learner (so that a run
        resumed from a checkpoint is hooked before its next step)."""
        self._learner = learner
        self._source = {name: p.detach().clone() for name, p in learner.params.items()}

    def reset(self) -> None:
        """Forget everything the stream taught (``adapter.reset()``): the learner's weights go back to
        the source by its own reset, and the hook comes off until the next first call."""
        if self._handle is not None:
            self._handle.remove()
        self._handle = None
        self._params: list[nn.Parameter] = []
        self._stepped = False  # whether the hook saw this step's optimizer step
        self.steps = 0
        self.signals: dict[str, Tensor] = {}
        self.running: Tensor | None = None  # per stream (host, float64), the running entropy R
        self.strength: Tensor | None = None  # per stream (host, float64), the pull's P0·flips²
        self.count: Tensor | None = None  # per stream (host, float64), steps since its last reset
        self.anchored: Tensor | None = None  # per stream (host), whether it has estimates yet
        self.squares: list[Tensor] = []  # per weight, Σ g² since the stream's last reset
        self.weights: list[Tensor] = []  # per weight, Σ θ (before each step) since then
        self.fisher: list[Tensor] = []  # per weight, the estimate F (0 where no stream has one)
        self.anchor: list[Tensor] = []  # per weight, the estimate θ̄
        self.gathered: list[tuple[Tensor, Tensor]] = []  # small steps since the last judgement
        self._pull: list[Tensor] | None = None  # per weight, 2·P0·flips²·F: None before any estimate

    def __getstate__(self) -> dict[str, Any]:
        """A copy (a recipe's, a checkpoint's) carries no learner, hook or weights of one."""
        return {**self.__dict__, "_learner": None, "_handle": None, "_params": [], "_source": {}}

    # --- after each step ----------------------------------------------------------------------------
    def __call__(
        self, learner: ResettableLearner, x: Tensor, prediction: Tensor, evaluations: list[Evaluation]
    ) -> Tensor:
        layout = learner.layout
        self._memorise(learner, evaluations)
        self._attach(learner)
        self.steps += 1
        self.signals = {}
        judged = self._judged(layout.rows(x), layout.rows(prediction.detach().float()))
        if judged is None:
            return layout.all_streams(prediction.device) & False
        spread, flips, classes = self._measure(learner, *judged)
        restart = math.log(self.a0 * classes)
        running = self.running if self.running is not None else torch.full_like(spread, restart)
        fired = spread < running
        scope = (self.r0 - self.r1 * (running - spread)).clamp_min(0.0)
        self.strength = self.p0 * flips**2
        if bool(fired.any()):
            self._estimate(learner, fired)
            self._reset_selectively(learner, fired, scope)
        momentum = self.m0 * flips + 1 - self.m0
        self.running = torch.where(fired, restart, momentum * running + (1 - momentum) * spread)
        self._pull = self._pulls(learner)
        values = torch.stack([fired.double(), spread, running, flips, torch.where(fired, scope, math.nan)])
        values = values.to(prediction.device)  # the record stays on the model's device, as every step's
        names = ("entropy", "running", "flips", "scope")
        self.signals = {name: layout.value(v.float()) for name, v in zip(names, values[1:], strict=True)}
        return layout.value(values[0].bool())

    def _measure(
        self, learner: ResettableLearner, images: Tensor, logits: Tensor
    ) -> tuple[Tensor, Tensor, int]:
        """Per stream (host, float64), the entropy of the mean of the adapted ``logits`` (``[B, n, C]``)
        and the share of them whose class differs from the source model's on the same ``images``; and
        the number of classes."""
        with torch.no_grad():
            source = learner.layout.rows(learner.source_prediction(images))
        flips = (logits.argmax(-1) != source.argmax(-1)).float().mean(-1)
        spread, flips = torch.stack([entropy(logits.mean(1)), flips]).cpu().double()  # one read a judgement
        return spread, flips, logits.shape[-1]

    def _judged(self, images: Tensor, logits: Tensor) -> tuple[Tensor, Tensor] | None:
        """The images (stream-major rows) and the adapted logits (``[B, n, C]``) to judge now: a step's
        own with ``window`` images a stream or more; smaller steps' gathered until ``window`` are."""
        if logits.shape[1] >= self.window:
            return images.flatten(0, 1), logits
        self.gathered = [*self.gathered, (images, logits)]
        if sum(kept.shape[1] for _, kept in self.gathered) < self.window:
            return None
        images = torch.cat([rows for rows, _ in self.gathered], dim=1).flatten(0, 1)
        logits = torch.cat([kept for _, kept in self.gathered], dim=1)
        self.gathered = []
        return images, logits

    # --- the estimates ------------------------------------------------------------------------------
    def _attach(self, learner: ResettableLearner) -> None:
        """Hook the optimizer's step (once): each step's gradient and weights summed, the pull added."""
        if self._handle is None:
            self._params = list(learner.params.values())
            self._handle = learner.optimizer.register_step_pre_hook(self._before_step)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Before an optimizer step: sum the loss's squared gradient and the weights, then add the pull's
        gradient ``2·P0·flips²·F·(θ − θ̄)`` to each weight's."""
        with torch.no_grad():
            params = [p.detach() for p in self._params]
            self._sum(params, [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params])
            if self._pull is not None:
                pulls = torch._foreach_sub(params, self.anchor)
                torch._foreach_mul_(pulls, self._pull)
                for param, pull in zip(self._params, pulls, strict=True):
                    if param.grad is None:  # a weight the loss did not reach: the pull's is its gradient
                        param.grad = pull
                    else:
                        param.grad.add_(pull)
        self._stepped = True

    def _memorise(self, learner: ResettableLearner, evaluations: list[Evaluation]) -> None:
        """Count the step just taken into the sums, where the hook did not: the first step since the
        guard was built or reset (its weights before it, the source; its gradient, the one it left, if it
        moved), or a step that did not move (its weights, no gradient)."""
        params = [p.detach() for p in learner.params.values()]
        if not self.squares:
            self.squares = [torch.zeros_like(p) for p in params]
            self.weights = [torch.zeros_like(p) for p in params]
            self.fisher = [torch.zeros_like(p) for p in params]
            self.anchor = [torch.zeros_like(p) for p in params]
        if not self._stepped:
            grads = [torch.zeros_like(p) for p in params]
            if self._handle is None:  # the first step: taken before the hook could see it
                before = (self._source.get(name) for name in learner.params)
                params = [p if b is None else b.expand_as(p) for p, b in zip(params, before, strict=True)]
                if _moved(learner, evaluations):  # the gradient the step left is its own
                    left = [p.grad for p in learner.params.values()]
                    grads = [z if g is None else g.detach() for z, g in zip(grads, left, strict=True)]
            self._sum(params, grads)
        self._stepped = False
        streams = learner.layout.count
        count = self.count if self.count is not None else torch.zeros(streams, dtype=torch.float64)
        self.count = count + 1

    def _sum(self, params: list[Tensor], grads: list[Tensor]) -> None:
        torch._foreach_addcmul_(self.squares, grads, grads)
        torch._foreach_add_(self.weights, params)

    def _estimate(self, learner: ResettableLearner, fired: Tensor) -> None:
        """The ``fired`` streams' estimates from their sums since their last reset, which restart."""
        layout = learner.layout
        device = self.squares[0].device
        rows = fired.to(device)
        count = self.count.to(device=device, dtype=self.squares[0].dtype)
        anchored = (self.anchored if self.anchored is not None else torch.zeros_like(fired)).to(device)
        for estimates, sums in ((self.fisher, self.squares), (self.anchor, self.weights)):
            for i, total in enumerate(sums):
                segment = total / layout.per_row(layout.value(count), total)
                moved = ESTIMATE_MOMENTUM * estimates[i] + (1 - ESTIMATE_MOMENTUM) * segment
                update = torch.where(layout.per_row(layout.value(anchored), total), moved, segment)
                fresh = layout.per_row(layout.value(rows), total)
                estimates[i] = torch.where(fresh, update, estimates[i])
                sums[i] = torch.where(fresh, 0.0, total)
        self.anchored = fired | (self.anchored if self.anchored is not None else torch.zeros_like(fired))
        self.count = torch.where(fired, 0.0, self.count)

    def _pulls(self, learner: ResettableLearner) -> list[Tensor] | None:
        """Per weight, the factor of ``θ − θ̄`` in the pull's gradient, ``2·P0·flips²·F`` (F is 0 for a
        stream without estimates); None until some stream has them."""
        if self.anchored is None or not bool(self.anchored.any()):
            return None
        layout = learner.layout
        device = self.fisher[0].device
        strength = layout.value((2 * self.strength).to(device=device, dtype=self.fisher[0].dtype))
        return [layout.per_row(strength, fisher) * fisher for fisher in self.fisher]

    # --- the reset ----------------------------------------------------------------------------------
    def _reset_selectively(self, learner: ResettableLearner, fired: Tensor, scope: Tensor) -> None:
        """The ``fired`` streams' weights: the first ``scope`` share of the adapted parameters (``i <
        scope·n``, in the model's order) keep their values, the rest (and ZeroSiam's predictor) go back
        to the source, and the optimizer's state is fresh. Only the parameters some stream keeps are
        copied and put back after the source (none at a full reset)."""
        layout = learner.layout
        params = learner.params
        device = next(iter(params.values())).device
        keeps = {name: fired & (i < scope * len(params)) for i, name in enumerate(params)}  # which streams
        adapted = {name: params[name].detach().clone() for name, keep in keeps.items() if bool(keep.any())}
        flags = layout.value(fired.to(device))
        learner.restore_source(flags)
        if adapted:
            merged = {
                name: torch.where(
                    layout.per_row(layout.value(keeps[name].to(device)), value), value, params[name].detach()
                )
                for name, value in adapted.items()
            }
            learner.roll_back({"params": merged, "predictor": {}}, flags)

    # --- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "running": self.running,
            "strength": self.strength,
            "count": self.count,
            "anchored": self.anchored,
            "squares": self.squares,
            "weights": self.weights,
            "fisher": self.fisher,
            "anchor": self.anchor,
            "gathered": self.gathered,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()
        self.steps = state["steps"]
        self.running, self.strength, self.count = state["running"], state["strength"], state["count"]
        self.anchored = state["anchored"]
        self.squares, self.weights = list(state["squares"]), list(state["weights"])
        self.fisher, self.anchor = list(state["fisher"]), list(state["anchor"])
        self.gathered = list(state["gathered"])
        if self._learner is not None and self.steps > 0:  # hooked, as the run it resumes was
            self._attach(self._learner)
            self._pull = self._pulls(self._learner)


def _moved(learner: ResettableLearner, evaluations: list[Evaluation]) -> bool:
    """Whether the step just taken moved some stream (so the gradients it left are its own)."""
    if learner.skipped is not None or not evaluations:
        return False
    return bool(learner.layout.kept(evaluations[-1].mask).any())
