"""A TTA method as a recipe: a few orthogonal choices over shared parts.

Which parameters move (``params``), what per-sample objective is minimized (``objective``), which
samples count (``select``) and how much (``weight``), what regularizer applies (``regularizer``), how
the optimizer steps (``step``), when the model is recovered (``recover``), and whether the prediction
is split into ZeroSiam's asymmetric online/target pair (``asymmetry``). Tent, ZeroSiam and the
baselines are short recipes; the paper's ablations and compositions are ``recipe.with_(...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from zerosiam.parts.losses import DIVERGENCES, OBJECTIVES, PerSample, resolve
from zerosiam.parts.norms import NormSelector

if TYPE_CHECKING:
    from zerosiam.methods.adapter import Adapter


@dataclass
class Batch:
    """What selection rules, weights and objectives see of one forward.

    ``logits`` is the branch the objective acts on (the online branch under ZeroSiam, otherwise the
    model's output); ``target`` is the model's own output; ``entropy`` is the detached entropy of
    ``logits``; ``adapter`` gives rules that need it (DeYO's second view, EATA's Fisher) the model.
    ``kept`` is what the rules before the current one kept, so a costly rule (DeYO's second forward)
    can work on those samples only, as its authors' code does; ``cache`` holds per-forward values that
    a rule and a weight share (DeYO's PLPD) so they are computed once.
    """

    x: Tensor
    logits: Tensor
    target: Tensor
    entropy: Tensor
    adapter: Adapter
    kept: Tensor | None = None
    cache: dict[str, Tensor] = field(default_factory=dict)


class Rule(Protocol):
    """A sample-selection rule: a boolean mask over the batch. May keep state (``reset``/``observe``)."""

    def __call__(self, batch: Batch) -> Tensor: ...


Weighting = Callable[[Batch], Tensor]
Regularizer = Callable[["Adapter"], Tensor]


@dataclass
class Evaluation:
    """One loss evaluation: the scalar to minimize, the selected samples and what to report."""

    loss: Tensor
    mask: Tensor
    batch: Batch
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def selected(self) -> int:
        return int(self.mask.sum())


Closure = Callable[..., Evaluation]


class Step(Protocol):
    """How the optimizer moves given a loss closure; returns every evaluation it made."""

    def __call__(self, adapter: Adapter, closure: Closure) -> list[Evaluation]: ...


class Recovery(Protocol):
    """Decides from a step's evaluations whether the model must be reset to its source state."""

    def __call__(self, evaluations: list[Evaluation]) -> bool: ...


@dataclass(frozen=True)
class Asymmetry:
    """ZeroSiam's asymmetric pair: online branch g(h(z)) aligned to the stop-gradient target g(z).

    ``predictor`` is ``"identity"`` (learned, the method), ``"random"`` (fixed I + 0.1·W) or ``"mlp"``;
    ``divergence`` is a name in ``DIVERGENCES`` or a callable; ``stop_gradient=False`` is the ablation
    that lets the alignment term pull the target branch too.
    """

    predictor: str = "identity"
    divergence: str | Callable[[Tensor, Tensor], Tensor] = "skl"
    alpha: float = 1.0  # paper §3: α fixed to 1
    stop_gradient: bool = True

    def align(self, online: Tensor, target: Tensor) -> Tensor:
        """Per-sample α·D(p_o ‖ sg[p_r])."""
        divergence = resolve(DIVERGENCES, self.divergence, "divergence")
        return self.alpha * divergence(online, target.detach() if self.stop_gradient else target)


def plain_step(adapter: Adapter, closure: Closure) -> list[Evaluation]:
    """One gradient step on one evaluation; skipped when no sample is selected."""
    evaluation = closure()
    if evaluation.selected:
        adapter.descend(evaluation.loss)
    return [evaluation]


@dataclass(frozen=True)
class Recipe:
    """A method's choices. Learning rates are not here: they depend on the model and batch size and are
    resolved when the adapter is built (see ``zerosiam.methods.hparams``)."""

    name: str
    objective: str | PerSample = "entropy"
    select: Sequence[Rule] = ()
    weight: Weighting | None = None
    regularizer: Regularizer | None = None
    step: Step = plain_step
    recover: Recovery | None = None
    params: NormSelector = NormSelector()
    asymmetry: Asymmetry | None = None
    lr_family: str = "tent"  # which learning-rate table of hparams.py applies
    double_lr_at_bs1: bool = False  # SAR's and ZeroSiam's code double their rates at batch size 1
    adapts: bool = True

    def with_(self, **changes) -> Recipe:
        return dataclasses.replace(self, **changes)

    @property
    def objective_fn(self) -> PerSample:
        return resolve(OBJECTIVES, self.objective, "objective")

    def evaluate(self, batch: Batch, restrict: Tensor | None = None) -> Evaluation:
        """The recipe's loss on one forward: selected, weighted objective (+ alignment, + regularizer)."""
        mask = torch.ones(batch.logits.shape[0], dtype=torch.bool, device=batch.logits.device)
        if restrict is not None:
            mask &= restrict
        for rule in self.select:
            batch.kept = mask.clone()
            mask &= rule(batch)
        batch.kept = mask
        per_sample = self.objective_fn(batch.logits)
        terms = {"objective": _masked_mean(per_sample.detach(), mask)}
        if self.weight is not None:
            per_sample = per_sample * self.weight(batch).detach()
        if self.asymmetry is not None:
            alignment = self.asymmetry.align(batch.logits, batch.target)
            terms["divergence"] = _masked_mean(alignment.detach(), mask)
            per_sample = per_sample + alignment
        loss = per_sample[mask].mean() if mask.any() else per_sample.sum() * 0.0
        if self.regularizer is not None:
            regularization = self.regularizer(batch.adapter)
            terms["regularizer"] = float(regularization.detach())
            loss = loss + regularization
        for rule in self.select:
            if hasattr(rule, "observe"):
                rule.observe(batch, mask)
        terms["loss"] = float(loss.detach())
        return Evaluation(loss, mask, batch, terms)


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    return float(values[mask].mean()) if mask.any() else float("nan")
