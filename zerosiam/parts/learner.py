"""The gradient half of a learner, written once for the image and the language adapter.

A test-time update must never poison the weights: a non-finite loss or gradient (a collapsing model
reaches them) skips the step and says why, instead of writing NaN into the model. Steps (a plain step,
SAM's two passes) and recovery rules act through these members only, so SAM, SAR's recovery and the
finiteness checks behave the same on every modality.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor, nn

from zerosiam.parts.contract import Closure, Evaluation, Recovery, Step


class GradientLearner(ABC):
    """``backward``, ``descend``, ``skip`` and one adaptation step, over ``self.optimizer``.

    A subclass sets ``model``, ``params`` and ``optimizer`` and says how to ``restore_source``.
    """

    model: nn.Module
    params: dict[str, nn.Parameter]
    optimizer: torch.optim.Optimizer
    recipe: Any  # what it runs: the parts, the step, the recovery (``zerosiam.methods.recipe.Recipe``)
    streams: int = 1  # independent streams stacked in each batch (``zerosiam.parts.streams``)
    _skipped: str | None = None
    _held: tuple[tuple[str, Tensor], ...] = ()  # this step's streams held back, and why (``hold``)

    def prepare_parts(self, extras: dict[str, Any]) -> None:
        """Let parts that need more than the test stream (EATA's Fisher needs clean data) set themselves
        up on the configured model; each ``prepare`` receives only the keywords it declares."""
        for part in self.recipe.parts().values():
            prepare = getattr(part, "prepare", None)
            if callable(prepare):
                accepted = keyword_options(prepare)
                prepare(self, **{key: value for key, value in extras.items() if key in accepted})

    def stateful_parts(self) -> dict[str, Any]:
        """The recipe's parts that keep state (moving averages, EMAs), by their stable keys."""
        return {key: part for key, part in self.recipe.parts().items() if hasattr(part, "reset")}

    @property
    def trainable(self) -> list[nn.Parameter]:
        """Every parameter the optimizer moves, in its parameter groups' order."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def backward(self, loss: Tensor) -> bool:
        """Gradients of ``loss`` in the trainable parameters; False, recorded as the step's ``skipped``
        reason and with no gradient left, when the loss or a gradient is not finite."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not self.finite(loss):  # one read from the device per step, for the loss and every gradient
            self.optimizer.zero_grad(set_to_none=True)
            self.skip("non-finite loss" if not torch.isfinite(loss) else "non-finite gradient")
            return False
        return True

    def descend(self, loss: Tensor) -> bool:
        """Backpropagate ``loss`` and take one optimizer step, unless the loss or a gradient is not finite."""
        if not self.backward(loss):
            return False
        self.optimizer.step()
        return True

    def finite(self, loss: Tensor) -> bool:
        """Whether ``loss`` and every gradient are finite, decided on the device and read once."""
        checks = [torch.isfinite(loss).all()]
        checks += [torch.isfinite(p.grad).all() for p in self.trainable if p.grad is not None]
        return bool(torch.stack(checks).all())

    def skip(self, reason: str) -> None:
        """Mark the current step as not taken; the first reason given stands."""
        if self._skipped is None:
            self._skipped = reason

    def hold(self, reason: str, streams: Tensor) -> None:
        """Stacked streams: the marked ``streams`` stay where they were in this step, for ``reason``
        (a stream running alone would have skipped it); the others step."""
        self._held += ((reason, streams),)

    @property
    def skipped(self) -> str | None:
        """Why the current step moved nothing, or None."""
        return self._skipped

    def take_step(
        self, step: Step, recover: Recovery | None, closure: Closure
    ) -> tuple[list[Evaluation], bool]:
        """One adaptation step by ``step`` on ``closure``; then, if ``recover`` says the model has
        collapsed, back to the source weights. Returns the step's evaluations and whether it recovered."""
        self._skipped, self._held = None, ()
        with torch.enable_grad():
            evaluations = step(self, closure)
        recovered = bool(recover is not None and recover(evaluations))
        if recovered:
            self.restore_source()
        return evaluations, recovered

    @abstractmethod
    def restore_source(self) -> None:
        """Put the adapted weights (and the optimizer) back to where adaptation started."""


def keyword_options(function: Any) -> set[str]:
    """The keyword-only parameters of ``function``: the options a part's ``prepare`` takes."""
    parameters = inspect.signature(function).parameters.values()
    return {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
