"""The online adapter for a causal LM: answer one question with the current weights, then adapt on it.

Per question: greedy generation by the target branch (base + LoRA, no predictor), then one update
from a second forward, with gradients, over the prompt and the first k generated tokens. By causality
the logits at the first k generated positions depend on nothing after them, so that forward stops at
token k instead of re-reading the whole answer (same values, a fraction of the cost).

Trained: the LoRA parameters and, for ZeroSiam, the predictor; AdamW (β 0.9/0.999, weight decay 0)
with one learning rate each (η_f for LoRA, η_h for h; the paper uses the same value for both).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from zerosiam.llm.model import DEFAULT_LORA_TARGETS, TwoBranchLM, add_lora
from zerosiam.llm.objectives import (
    E0_LANGUAGE,
    TLM_LAMBDA,
    TLM_LOG_PERPLEXITY,
    Evaluation,
    LMMethod,
    View,
    get_method,
)
from zerosiam.parts.losses import entropy, symmetric_kl
from zerosiam.parts.predictor import build_predictor, distance_from_identity
from zerosiam.parts.sam import ascend, descend_back


@dataclass
class LMConfig:
    """Hyper-parameters of one language-model TTA run (defaults: the paper's appendix)."""

    lr: float = 7.5e-6  # η_f; MATH-500's rate (per-dataset rates: math_data.DATASETS)
    lr_predictor: float | None = None  # η_h; None = same as lr, as in the paper
    k: int = 8  # first k generated tokens
    alpha: float = 1.0
    predictor: str = "identity"
    lora_rank: int = 8
    lora_alpha: float | None = None
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    max_new_tokens: int = 256
    e0: float = E0_LANGUAGE
    tlm_log_p0: float = TLM_LOG_PERPLEXITY
    tlm_lambda: float = TLM_LAMBDA
    sar_reset_below: float | None = None  # SAR's model recovery (0.2 in its code); off on language

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise ValueError(f"k must be positive, got {self.k}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.lr < 0 or (self.lr_predictor is not None and self.lr_predictor < 0):
            raise ValueError("learning rates must be non-negative")


@dataclass
class StepRecord:
    """Diagnostics of one update (NaN where a quantity does not apply to the method)."""

    loss: float = math.nan
    entropy: float = math.nan
    divergence: float = math.nan
    predictor_distance: float = math.nan
    updated: bool = False
    stats: dict[str, float] = field(default_factory=dict)


def _method_options(method: LMMethod, config: LMConfig) -> dict[str, Any]:
    """The objective's keyword arguments taken from the config, by method."""
    return {
        "zerosiam": {"alpha": config.alpha},
        "sar": {"e0": config.e0},
        "eata": {"e0": config.e0},
        "tlm": {"log_p0": config.tlm_log_p0, "lam": config.tlm_lambda},
    }.get(method.name, {})


class LMAdapter:
    """A causal LM adapted online by one method. ``answer`` generates, ``adapt`` updates."""

    def __init__(self, model: nn.Module, method: str | LMMethod, config: LMConfig | None = None) -> None:
        self.config = config or LMConfig()
        self.method = get_method(method) if isinstance(method, str) else method
        hidden = model.get_output_embeddings().in_features
        predictor = build_predictor(self.config.predictor, hidden) if self.method.uses_predictor else None
        if predictor is not None:
            predictor.to(next(model.parameters()).dtype)
        lora = add_lora(model, self.config.lora_rank, self.config.lora_alpha, self.config.lora_targets)
        self.net = TwoBranchLM(lora, predictor)
        self.lora_params = [p for p in lora.parameters() if p.requires_grad]
        self.predictor_params = [p for p in predictor.parameters() if p.requires_grad] if predictor else []
        self.objective = (
            functools.partial(self.method.objective, **_method_options(self.method, self.config))
            if self.method.objective is not None
            else None
        )
        self.optimizer = self._build_optimizer()
        self._initial = self._snapshot()
        self._sar_ema: float | None = None
        self.resets = 0

    @property
    def trainable(self) -> list[nn.Parameter]:
        return self.lora_params + self.predictor_params

    def _build_optimizer(self) -> torch.optim.Optimizer:
        groups = [{"params": self.lora_params, "lr": self.config.lr}]
        if self.predictor_params:
            lr_h = self.config.lr if self.config.lr_predictor is None else self.config.lr_predictor
            groups.append({"params": self.predictor_params, "lr": lr_h})
        return torch.optim.AdamW(groups, betas=(0.9, 0.999), weight_decay=0.0)

    def _snapshot(self) -> list[Tensor]:
        return [p.detach().clone() for p in self.trainable]

    def reset(self) -> None:
        """Back to the source model (LoRA B = 0, h = its initial value) with a fresh optimizer."""
        with torch.no_grad():
            for param, initial in zip(self.trainable, self._initial, strict=True):
                param.copy_(initial)
        self.optimizer = self._build_optimizer()
        self._sar_ema = None

    def answer(self, prompt_ids: Tensor, eos_token_id: int | list[int] | None = None) -> Tensor:
        """Greedy answer tokens [n] of the target branch (no predictor) with the current weights."""
        return self.net.generate(prompt_ids, self.config.max_new_tokens, eos_token_id)

    def _view(self, prompt_ids: Tensor, generated: Tensor, restrict: Tensor | None = None) -> View:
        """One forward with gradients: the logits the objective needs (first k generated positions,
        or the whole prompt for TLM)."""
        if self.method.uses_prompt:
            branches = self.net.branches(prompt_ids, keep=0)
            return View(prompt_logits=branches.target[0], prompt_ids=prompt_ids[0], restrict=restrict)
        k = min(self.config.k, generated.numel())
        # positions L-1 … L+k-2 predict generated tokens 0 … k-1; the k-th token itself is not needed
        ids = torch.cat([prompt_ids, generated[: k - 1].view(1, -1).to(prompt_ids)], dim=1)
        branches = self.net.branches(ids, keep=k)
        online = None if branches.online is None else branches.online[0]
        return View(target=branches.target[0], online=online, restrict=restrict)

    def adapt(self, prompt_ids: Tensor, generated: Tensor) -> StepRecord:
        """One update on this question; returns its diagnostics. No-op for noadapt / empty answers."""
        record = StepRecord(predictor_distance=self.predictor_distance())
        if self.objective is None or (generated.numel() == 0 and not self.method.uses_prompt):
            return record
        view = self._view(prompt_ids, generated)
        first = self.objective(view)
        self._describe(view, first, record)
        if first.loss is None:
            return record
        if self.method.sam_rho is None:
            record.updated = self._plain_step(first.loss)
        else:
            record.updated = self._sam_step(first, prompt_ids, generated)
        record.predictor_distance = self.predictor_distance()
        return record

    def _describe(self, view: View, evaluation: Evaluation, record: StepRecord) -> None:
        if view.target is not None:
            record.entropy = entropy(view.target.detach()).mean().item()
        if view.online is not None and view.target is not None:
            record.divergence = symmetric_kl(view.online.detach(), view.target.detach()).mean().item()
        if evaluation.loss is not None:
            record.loss = evaluation.loss.item()
        record.stats = dict(evaluation.stats)

    def _backward(self, loss: Tensor) -> bool:
        """Gradients of ``loss``; False (and none kept) when the loss or a gradient is not finite."""
        self.optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            return False
        loss.backward()
        if any(p.grad is not None and not torch.isfinite(p.grad).all() for p in self.trainable):
            self.optimizer.zero_grad(set_to_none=True)
            return False
        return True

    def _plain_step(self, loss: Tensor) -> bool:
        ready = self._backward(loss)
        if ready:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return ready

    def _sam_step(self, first: Evaluation, prompt_ids: Tensor, generated: Tensor) -> bool:
        """SAR: gradient at θ, ascend to θ + ρ·g/‖g‖, entropy again on the first pass's selection,
        back to θ, AdamW step with the second gradient; optional recovery when its EMA gets too low."""
        if first.loss is None or not self._backward(first.loss):
            return False
        moves = ascend(self.trainable, self.method.sam_rho)
        try:
            second = self.objective(self._view(prompt_ids, generated, restrict=first.mask))
            ready = second.loss is not None and self._backward(second.loss)
        finally:
            descend_back(self.trainable, moves)
        if ready:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if second.loss is not None:
            self._track_sar_ema(second.loss.item())
        return ready

    def _track_sar_ema(self, value: float) -> None:
        self._sar_ema = value if self._sar_ema is None else 0.9 * self._sar_ema + 0.1 * value
        if self.config.sar_reset_below is not None and self._sar_ema < self.config.sar_reset_below:
            self.reset()
            self.resets += 1

    def predictor_distance(self) -> float:
        """‖θ_h − I‖_F (NaN for methods without a predictor)."""
        return math.nan if self.net.predictor is None else distance_from_identity(self.net.predictor)
