"""EATA's anti-forgetting regularizer: a Fisher-weighted pull back to the source weights.

Adapting on a shifted stream slowly erodes what the model knew about clean data. EATA estimates, on a
few clean in-distribution samples, how much each learnable parameter matters to the model's own
predictions (the diagonal Fisher information F, the squared gradient of the cross-entropy with the
model's argmax labels) and adds ``β Σ_j F_j (θ_j − θ0_j)²`` to the loss, so that important parameters
stay near their source values θ0 while unimportant ones move freely.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zerosiam.parts.contract import Learner


class MissingCleanDataError(ValueError):
    """EATA was asked for without the clean samples its Fisher regularizer is estimated on."""


def _images(batch: Any) -> Tensor:
    """A batch of a user's loader: a tensor, or a (images, labels, ...) tuple whose first item is used."""
    if isinstance(batch, (tuple, list)):
        batch = batch[0]
    if not isinstance(batch, Tensor):
        raise TypeError(
            f"clean_data must yield image tensors or (images, labels) pairs, got {type(batch).__name__}"
        )
    return batch


def estimate_fisher(
    model: nn.Module, params: dict[str, nn.Parameter], batches: Iterable[Any]
) -> dict[str, Tensor]:
    """Diagonal Fisher of ``params``: squared batch gradients of CE(model(x), argmax), averaged over batches.

    Uses ``torch.autograd.grad`` so that no ``.grad`` is left behind for the optimizer to see.
    """
    names = list(params)
    device = next(iter(params.values())).device
    total = {name: torch.zeros_like(p) for name, p in params.items()}
    count = 0
    for batch in batches:
        x = _images(batch).to(device)
        with torch.enable_grad():
            logits = model(x)
            loss = F.cross_entropy(logits, logits.argmax(-1).detach())
            grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        for name, grad in zip(names, grads, strict=True):
            if grad is not None:
                total[name] += grad.detach().pow(2)
        count += 1
    if count == 0:
        raise MissingCleanDataError("clean_data yielded no batch; EATA's Fisher needs clean samples")
    return {name: value / count for name, value in total.items()}


class FisherPenalty:
    """The regularizer ``β Σ F (θ − θ0)²`` over the adapter's norm parameters (not ZeroSiam's predictor);
    one per stream for stacked streams.

    ``prepare`` estimates F on the user's clean data once the adapter has configured the model (BatchNorm
    on batch statistics, as at test time) and anchors θ0 at the source weights. F is a property of the
    source model, not of the adaptation, so ``reset`` does not clear it.
    """

    def __init__(self, weight: float = 2000.0) -> None:  # methods.md: EATA β = 2000
        self.weight = weight
        self.fisher: dict[str, Tensor] = {}
        self.anchor: dict[str, Tensor] = {}

    def prepare(self, learner: Learner, *, clean_data: Iterable[Any] | None = None) -> None:
        if clean_data is None:
            raise MissingCleanDataError(
                "EATA needs clean in-distribution samples to estimate its Fisher regularizer: pass them as "
                "zerosiam.adapt(model, 'eata', clean_data=<iterable of image batches>) (the paper uses 2,000 "
                "images), or use 'eta', which is EATA without the regularizer."
            )
        self.fisher = estimate_fisher(learner.model, learner.params, clean_data)
        self.anchor = {name: p.detach().clone() for name, p in learner.params.items()}

    def __call__(self, learner: Learner) -> Tensor:
        if not self.fisher:
            raise MissingCleanDataError(
                "the Fisher regularizer was not prepared; build the adapter with clean_data="
            )
        terms = [
            learner.layout.weight_sum(self.fisher[n] * (p - self.anchor[n]).pow(2))
            for n, p in learner.params.items()
        ]
        return self.weight * torch.stack(terms).sum(0)


def fisher(weight: float = 2000.0) -> FisherPenalty:  # methods.md: EATA β = 2000
    return FisherPenalty(weight)
