"""Sharpness-aware minimization (SAM) as a recipe's optimizer step, as SAR uses it.

Entropy minimization on noisy test batches can land in sharp minima where a small weight change flips
predictions; SAM instead minimizes the loss at the worst nearby point. It takes the gradient g at θ,
moves to θ + e with e = ρ·g/‖g‖ (the steepest ascent of length ρ, ‖·‖ over all learnable parameters
together), takes the gradient there, returns to θ and steps with that second gradient.

The second evaluation is restricted to the samples the first one selected (SAR's S2 ⊆ S1), through the
closure's ``restrict`` argument; the recipe's rules then filter them again at θ + e.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zerosiam.parts.contract import Closure, Evaluation, Learner
from zerosiam.parts.layout import ONE_STREAM, Layout


def ascend(params: list[nn.Parameter], rho: float, layout: Layout = ONE_STREAM) -> list[Tensor]:
    """Move every parameter by e = ρ·g/‖g‖ (global L2 norm of all gradients) and return the moves.

    Parameters without a gradient do not move. The 1e-12 keeps a zero gradient from dividing by zero
    (SAR's code uses the same guard). With stacked streams (every parameter stream first) the norm is
    each stream's own.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return [torch.zeros_like(p) for p in params]
    scale = rho / (layout.gradient_norm(grads) + 1e-12)
    moves = []
    with torch.no_grad():
        for p in params:
            move = p.grad * layout.per_row(scale, p) if p.grad is not None else torch.zeros_like(p)
            p.add_(move)
            moves.append(move)
    return moves


def descend_back(params: list[nn.Parameter], moves: list[Tensor]) -> None:
    """Undo ``ascend``: return every parameter to θ."""
    with torch.no_grad():
        for p, move in zip(params, moves, strict=True):
            p.sub_(move)


NONE_AT_THE_PERTURBED_WEIGHTS = "no sample selected at the perturbed weights"


@dataclass(frozen=True)
class SAM:
    """The two-pass step: gradient at θ, ascent to θ + e, gradient there, back to θ, optimizer step.

    Nothing moves when the first pass selects no sample or its gradient is not finite, and the
    optimizer does not step when the second pass selects none (SAR's code would still apply its
    momentum there; skipping keeps "no reliable sample, no update" true for every recipe). Stream by
    stream, the learner holds back those whose second pass kept nothing (for one stream: the step).
    """

    rho: float = 0.05  # methods.md: SAR code, ρ = 0.05

    def __call__(self, learner: Learner, closure: Closure) -> list[Evaluation]:
        layout = learner.layout
        eager = layout.reads_device  # else both passes run whole; the learner puts back what must not move
        first = closure()
        if eager and not first.selected:
            return [first]
        if not learner.backward(first.loss):
            return [first]
        params = learner.trainable
        moves = ascend(params, self.rho, layout)
        try:
            second = closure(restrict=first.mask)
            ready = (not eager or second.selected > 0) and learner.backward(second.loss)
        finally:
            descend_back(params, moves)
        if ready:
            learner.optimizer.step()
        learner.hold(NONE_AT_THE_PERTURBED_WEIGHTS, layout.kept(first.mask) & ~layout.kept(second.mask))
        learner.optimizer.zero_grad(set_to_none=True)
        return [first, second]


def sam(rho: float = 0.05) -> SAM:
    """Deprecated: use ``SAM(rho)``, the step itself (``docs/methods.md`` once showed ``sam(rho=…)``)."""
    warnings.warn(
        "zerosiam.parts.sam.sam(rho) is deprecated; use zerosiam.parts.sam.SAM(rho)",
        DeprecationWarning,
        stacklevel=2,
    )
    return SAM(rho)
