"""A TTA method as a recipe: a few orthogonal choices over shared parts.

Which parameters move (``params``), what per-sample objective is minimized (``objective``), which
samples count (``select``) and how much (``weight``), what regularizer applies (``regularizer``), how
the optimizer steps (``step``), when the model is recovered (``recover``), what guards it after each
step (``guard``), and whether the prediction is split into ZeroSiam's asymmetric online/target pair
(``asymmetry``). Tent, ZeroSiam and the
baselines are short recipes; the paper's ablations and compositions are ``recipe.with_(...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from zerosiam.parts.contract import (
    MODALITIES,
    Batch,
    BatchObjective,
    Evaluation,
    Modality,
    Recovery,
    Regularizer,
    Rule,
    Step,
    Weighting,
    plain_step,
)
from zerosiam.parts.guards import Guard
from zerosiam.parts.losses import DIVERGENCES, OBJECTIVES, PerSample, resolve
from zerosiam.parts.norms import NormSelector


@dataclass(frozen=True)
class Asymmetry:
    """ZeroSiam's asymmetric pair: online branch g(h(z)) aligned to the stop-gradient target g(z).

    ``predictor`` is ``"identity"`` (learned, the method), ``"random"`` (fixed I + 0.1·W),
    ``"random_learned"`` (learned from I + 0.1·W) or ``"mlp"``;
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


@dataclass(frozen=True)
class Recipe:
    """A method's choices. Learning rates are not here: they depend on the model and batch size and are
    resolved when the adapter is built (see ``zerosiam.methods.hparams``)."""

    name: str
    objective: str | PerSample | BatchObjective = "entropy"
    select: Sequence[Rule] = ()
    weight: Weighting | None = None
    regularizer: Regularizer | None = None
    step: Step = plain_step
    recover: Recovery | None = None
    guard: Guard | None = None  # watches after each step and may put streams back (parts.guards)
    params: NormSelector = NormSelector()
    asymmetry: Asymmetry | None = None
    lr_family: str = "tent"  # which learning-rate table of hparams.py applies
    double_lr_at_bs1: bool = False  # SAR's and ZeroSiam's code double their rates at batch size 1
    adapts: bool = True

    def with_(self, **changes) -> Recipe:
        return dataclasses.replace(self, **changes)

    def per_sample_objective(self, batch: Batch) -> Tensor:
        """The objective of every sample of ``batch`` (a named or callable loss of the logits, or an
        objective that reads more of the batch)."""
        if hasattr(self.objective, "per_sample"):
            return self.objective.per_sample(batch)
        return resolve(OBJECTIVES, self.objective, "objective")(batch.logits)

    @property
    def positions(self) -> str:
        """Which positions of a language model are this recipe's samples: the first generated tokens,
        or the prompt (TLM)."""
        return getattr(self.objective, "positions", "generated")

    def parts(self) -> dict[str, Any]:
        """The parts that may keep state or need preparing, by a stable key (used in checkpoints)."""
        candidates = {f"select{i}": rule for i, rule in enumerate(self.select)}
        candidates.update(
            weight=self.weight,
            regularizer=self.regularizer,
            step=self.step,
            recover=self.recover,
            guard=self.guard,
        )
        return {key: part for key, part in candidates.items() if part is not None}

    @property
    def modalities(self) -> tuple[Modality, ...]:
        """The modalities every part of the recipe works on (a part may declare ``modalities``)."""
        parts = [self.objective, *self.parts().values()]
        return tuple(m for m in MODALITIES if all(m in getattr(p, "modalities", MODALITIES) for p in parts))

    def evaluate(self, batch: Batch, restrict: Tensor | None = None) -> Evaluation:
        """The recipe's loss on one forward: selected, weighted objective (+ alignment, + regularizer)."""
        mask = torch.ones(batch.logits.shape[0], dtype=torch.bool, device=batch.logits.device)
        filtered = restrict is not None or bool(self.select)
        if restrict is not None:
            mask &= restrict
        for rule in self.select:
            batch.kept = mask.clone()
            mask &= rule(batch)
        batch.kept = mask
        per_sample = self.per_sample_objective(batch)
        layout = batch.layout
        terms = {"objective": layout.masked_mean(per_sample.detach(), mask)}
        if self.weight is not None:
            per_sample = per_sample * self.weight(batch).detach()
        if self.asymmetry is not None:
            alignment = self.asymmetry.align(batch.logits, batch.target)
            terms["divergence"] = layout.masked_mean(alignment.detach(), mask)
            per_sample = per_sample + alignment
        loss, per_stream = layout.loss(per_sample, mask, filtered)
        if self.regularizer is not None:
            regularization = self.regularizer(batch.learner)
            terms["regularizer"] = regularization.detach()
            loss, per_stream = loss + regularization.sum(), per_stream + regularization
        for rule in self.select:
            if hasattr(rule, "observe"):
                rule.observe(batch, mask)
        terms["loss"] = per_stream.detach()
        return Evaluation(loss, mask, batch, terms, filtered)
