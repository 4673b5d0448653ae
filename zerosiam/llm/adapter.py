"""The online adapter for a causal LM: answer one question with the current weights, then adapt on it.

Per question: greedy generation by the target branch (base + LoRA, no predictor), then one update
from a second forward, with gradients, over the prompt and the first k generated tokens. By causality
the logits at the first k generated positions depend on nothing after them, so that forward stops at
token k instead of re-reading the whole answer (same values, a fraction of the cost).

The update is a recipe's, the very objects the image ``Adapter`` runs: the k generated positions are the
samples its rules, weights and objective see (TLM's samples are the prompt's positions), and its step
(plain or SAM) and recovery act through the shared ``GradientLearner``. Trained: the LoRA parameters
and, for ZeroSiam, the predictor; AdamW (β 0.9/0.999, weight decay 0) with one learning rate each
(η_f for LoRA, η_h for h; the paper uses the same value for both).

The names are the image learner's: ``LMSettings`` as ``Settings``, ``predictor_lr`` for η_h and
``predictor_drift`` for ‖θ_h − I‖_F. The old ones (``LMConfig``, ``lr_predictor``,
``predictor_distance``) still work for one release, with a warning (``zerosiam.llm.deprecated``).
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from zerosiam.llm.deprecated import renamed_fields, warn_renamed
from zerosiam.llm.model import DEFAULT_LORA_TARGETS, TwoBranchLM, add_lora
from zerosiam.methods import Recipe, get_recipe
from zerosiam.methods.hparams import LANGUAGE_RATES
from zerosiam.parts.contract import Batch, Evaluation
from zerosiam.parts.learner import GradientLearner
from zerosiam.parts.losses import entropy, symmetric_kl
from zerosiam.parts.predictor import build_predictor, identity_drift


@renamed_fields(lr_predictor="predictor_lr")
@dataclass
class LMSettings:
    """How one language-model TTA run learns (defaults: the paper's appendix), as ``Settings`` says how
    the image adapter learns. What is learned, and from which samples, is the recipe's."""

    lr: float = LANGUAGE_RATES["math500"].lr  # η_f; per-dataset rates: methods.hparams.LANGUAGE_RATES
    predictor_lr: float | None = None  # η_h; None = same as lr, as in the paper
    k: int = 8  # first k generated tokens
    lora_rank: int = 8
    lora_alpha: float | None = None
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    max_new_tokens: int = 256

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise ValueError(f"k must be positive, got {self.k}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.lr < 0 or (self.predictor_lr is not None and self.predictor_lr < 0):
            raise ValueError("learning rates must be non-negative")


def __getattr__(name: str) -> Any:
    if name == "LMConfig":  # LMSettings' old name
        warn_renamed(f"{__name__}.LMConfig", "LMSettings")
        return LMSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@renamed_fields(predictor_distance="predictor_drift")
@dataclass
class StepRecord:
    """Diagnostics of one update (NaN where a quantity does not apply to the method)."""

    loss: float = math.nan
    entropy: float = math.nan
    divergence: float = math.nan
    predictor_drift: float = math.nan  # ‖θ_h − I‖_F after the update
    updated: bool = False
    stats: dict[str, float] = field(default_factory=dict)


class LMAdapter(GradientLearner):
    """A causal LM adapted online by one recipe. ``answer`` generates, ``adapt`` updates."""

    def __init__(
        self,
        model: nn.Module,
        method: str | Recipe,
        settings: LMSettings | None = None,
        *,
        config: LMSettings | None = None,
    ) -> None:
        if config is not None:  # the old name of ``settings``
            warn_renamed("LMAdapter(config=…)", "settings=")
            if settings is not None:
                raise TypeError("LMAdapter got both config= and its new name settings=")
            settings = config
        self.settings = settings or LMSettings()
        self.recipe = copy.deepcopy(get_recipe(method, "text"))  # rules keep state: one copy per adapter
        hidden = model.get_output_embeddings().in_features
        asymmetry = self.recipe.asymmetry
        predictor = build_predictor(asymmetry.predictor, hidden) if asymmetry is not None else None
        if predictor is not None:
            reference = next(model.parameters())
            predictor.to(device=reference.device, dtype=reference.dtype)
        self.model = add_lora(
            model, self.settings.lora_rank, self.settings.lora_alpha, self.settings.lora_targets
        )
        self.net = TwoBranchLM(self.model, predictor)
        self.params = {name: p for name, p in self.model.named_parameters() if p.requires_grad}
        self.predictor_params = [p for p in predictor.parameters() if p.requires_grad] if predictor else []
        self.optimizer = self._build_optimizer()
        self._initial = self._snapshot()
        self.resets = 0
        self.prepare_parts({})  # no clean data on language: EATA's Fisher would say so in one line

    def _build_optimizer(self) -> torch.optim.Optimizer:
        settings = self.settings
        groups = [{"params": list(self.params.values()), "lr": settings.lr}]
        if self.predictor_params:
            lr_h = settings.lr if settings.predictor_lr is None else settings.predictor_lr
            groups.append({"params": self.predictor_params, "lr": lr_h})
        return torch.optim.AdamW(groups, betas=(0.9, 0.999), weight_decay=0.0)

    @property
    def config(self) -> LMSettings:
        """Deprecated: ``settings``."""
        warn_renamed("LMAdapter.config", "LMAdapter.settings")
        return self.settings

    def _snapshot(self) -> list[Tensor]:
        return [p.detach().clone() for p in self.trainable]

    def restore_source(self, streams: Tensor | None = None) -> None:
        """LoRA B = 0 and h at its initial value again, with a fresh optimizer (a language model adapts
        one stream, so ``streams`` can only flag that one)."""
        with torch.no_grad():
            for param, initial in zip(self.trainable, self._initial, strict=True):
                param.copy_(initial)
        self.optimizer = self._build_optimizer()

    @property
    def device(self) -> torch.device:
        """Where the model computes; prompts are moved there."""
        return next(self.model.parameters()).device

    def answer(self, prompt_ids: Tensor, eos_token_id: int | list[int] | None = None) -> Tensor:
        """Greedy answer tokens [n] of the target branch (no predictor) with the current weights."""
        return self.net.generate(prompt_ids, self.settings.max_new_tokens, eos_token_id)

    def _evaluate(self, prompt_ids: Tensor, generated: Tensor, restrict: Tensor | None = None) -> Evaluation:
        """One forward with gradients and the recipe's loss on it: the closure that steps call (SAM
        calls it twice). The samples are the first k generated positions, or the prompt's for TLM."""
        if self.recipe.positions == "prompt":  # one sample: the prompt, each position predicting the next
            logits = self.net.branches(prompt_ids, keep=0).target[:, :-1]
            batch = self._batch(prompt_ids, logits, logits, tokens=prompt_ids[:, 1:])
        else:
            k = min(self.settings.k, generated.numel())
            # positions L-1 … L+k-2 predict generated tokens 0 … k-1; the k-th token itself is not needed
            ids = torch.cat([prompt_ids, generated[: k - 1].view(1, -1).to(prompt_ids)], dim=1)
            branches = self.net.branches(ids, keep=k)
            online = branches.target if branches.online is None else branches.online
            batch = self._batch(ids, online[0], branches.target[0])
        return self.recipe.evaluate(batch, restrict)

    def _batch(self, x: Tensor, logits: Tensor, target: Tensor, tokens: Tensor | None = None) -> Batch:
        """A text batch; a sample spanning several positions (a prompt) has their mean entropy."""
        per_sample = entropy(logits).detach()
        return Batch(
            x=x,
            logits=logits,
            target=target,
            entropy=per_sample.flatten(1).mean(1) if per_sample.ndim > 1 else per_sample,
            learner=self,
            modality="text",
            tokens=tokens,
        )

    def adapt(self, prompt_ids: Tensor, generated: Tensor) -> StepRecord:
        """One update on this question; returns its diagnostics. No-op for noadapt / empty answers."""
        record = StepRecord(predictor_drift=self.predictor_drift())
        reads_answer = self.recipe.positions == "generated"
        if not self.recipe.adapts or (reads_answer and generated.numel() == 0):
            return record
        closure = functools.partial(self._evaluate, prompt_ids, generated)
        evaluations, recovered = self.take_step(self.recipe.step, self.recipe.recover, closure)
        first = evaluations[0]
        self.resets += int(recovered is not None and bool(recovered))
        record.updated = first.selected > 0 and self.skipped is None
        terms = {key: float(value) for key, value in first.terms.items()}
        record.loss = terms["loss"] if first.selected else math.nan
        record.stats = {**terms, "selected": float(first.selected)}
        if reads_answer:
            target = first.batch.target.detach()
            record.entropy = entropy(target).mean().item()
            if self.net.predictor is not None:
                record.divergence = symmetric_kl(first.batch.logits.detach(), target).mean().item()
        record.predictor_drift = self.predictor_drift()
        return record

    def predictor_drift(self) -> float:
        """‖θ_h − I‖_F (NaN for methods without a predictor), as the image adapter's ``predictor_drift``."""
        return math.nan if self.net.predictor is None else float(identity_drift(self.net.predictor))

    def predictor_distance(self) -> float:
        """Deprecated: ``predictor_drift()``."""
        warn_renamed("LMAdapter.predictor_distance()", "LMAdapter.predictor_drift()")
        return self.predictor_drift()
