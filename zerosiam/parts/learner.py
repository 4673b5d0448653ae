"""The gradient half of a learner, written once for the image and the language adapter.

A test-time update must never poison the weights: a non-finite loss or gradient (a collapsing model
reaches them) skips the step and says why, instead of writing NaN into the model. Steps (a plain step,
SAM's two passes) and recovery rules act through these members only, so SAM, SAR's recovery and the
finiteness checks behave the same on every modality.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from zerosiam.parts.contract import Closure, Evaluation, Recovery, Step
from zerosiam.parts.layout import ONE_STREAM, Layout

NON_FINITE = "non-finite loss or gradient"
"""Why the fixed-shape path holds a step back: it cannot tell the two apart without reading the device."""


class GradientLearner(ABC):
    """``backward``, ``descend``, ``skip`` and one adaptation step, over ``self.optimizer``.

    A subclass sets ``model``, ``params`` and ``optimizer`` and says how to ``restore_source``; one that
    keeps a record of its steps says how to ``forget`` it.
    """

    model: nn.Module
    params: dict[str, nn.Parameter]
    optimizer: torch.optim.Optimizer
    recipe: Any  # what it runs: the parts, the step, the recovery (``zerosiam.methods.recipe.Recipe``)
    layout: Layout = ONE_STREAM  # one stream, or B stacked in each batch (``zerosiam.parts.layout``)
    _skipped: str | None = None
    _held: tuple[tuple[str, Tensor], ...] = ()  # this step's streams held back, and why (``hold``)

    @property
    def streams(self) -> int:
        """How many independent streams each batch stacks."""
        return self.layout.count

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
        reason and with no gradient left, when the loss or a gradient is not finite. On the fixed-shape
        path (``Layout.reads_device`` False) the device decides: the step goes on, and every stream is
        held back (put back after it) when the loss or a gradient is not finite."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not self.layout.reads_device:
            self.hold(NON_FINITE, self.layout.all_streams(loss.device) & ~self.finite_on_device(loss))
            return True
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
        return bool(self.finite_on_device(loss))

    def finite_on_device(self, loss: Tensor) -> Tensor:
        """Whether ``loss`` and every gradient are finite, as a 0-d flag on the device. Each gradient's
        largest magnitude (a NaN or an infinity propagates into it, and a maximum cannot overflow) comes
        from one foreach reduction over all of them, where a check per tensor made one small call per
        trainable tensor (54 on the ResNet-26), felt at batch size 1."""
        grads = [p.grad for p in self.trainable if p.grad is not None]
        peaks = torch._foreach_norm(grads, ord=math.inf) if grads else []  # stacked in one dtype by promotion
        return torch.isfinite(torch.stack([loss.detach(), *peaks])).all()

    def drawn(self, name: str, draw: Callable[[], Tensor]) -> Tensor:
        """A value a step draws at random on the host (DeYO's patch orders, ``name``): ``draw()`` here; a
        captured step replaces this by the graph's input of that name, drawn the same way before each
        replay (``zerosiam.methods.capture``)."""
        return draw()

    def skip(self, reason: str) -> None:
        """Mark the current step as not taken; the first reason given stands."""
        if self._skipped is None:
            self._skipped = reason

    def hold(self, reason: str, streams: Tensor) -> None:
        """The marked ``streams`` (per-stream flags) stay where they were in this step, for ``reason``:
        for one stream the step is skipped; stacked, the others step and the held ones are put back."""
        if self.layout.skips(streams):
            self.skip(reason)
        else:
            self._held += ((reason, streams),)

    @property
    def skipped(self) -> str | None:
        """Why the current step moved nothing, or None."""
        return self._skipped

    def take_step(
        self, step: Step, recover: Recovery | None, closure: Closure
    ) -> tuple[list[Evaluation], Tensor | None]:
        """One adaptation step by ``step`` on ``closure``, each stream as if it ran alone: a stream whose
        last evaluation kept no sample does not move (nor does its momentum). Then the streams that
        ``recover`` flags as collapsed go back to their source weights. Returns the step's evaluations
        and the recovery's per-stream flags (None without a recovery rule)."""
        self._skipped, self._held = None, ()
        eager = self.layout.reads_device
        held = self.layout.hold_rows(self.optimizer) if self.recipe.select or not eager else None
        with torch.enable_grad():
            evaluations = step(self, closure)
        if held is not None:
            held.put_back(self.held_streams(evaluations[-1].mask))
        if recover is None:
            return evaluations, None
        collapsed = recover(evaluations)
        if not eager or collapsed.any():  # eager: flags on the host already; most steps restore nothing
            self.restore_source(collapsed)
        return evaluations, collapsed

    def held_streams(self, last_mask: Tensor) -> Tensor:
        """Per-stream flags of the streams this step must leave where they were: those whose last
        evaluation kept no sample, and those held back for another reason (``held_back``)."""
        return ~self.layout.kept(last_mask) | self.held_back(last_mask.device)

    def held_back(self, device: torch.device) -> Tensor:
        """Per-stream flags, on ``device``, of the streams ``hold`` held back in this step (none: all
        False)."""
        flags = ~self.layout.all_streams(device)
        for _, marked in self._held:
            flags = flags | marked
        return flags

    @abstractmethod
    def restore_source(self, streams: Tensor | None = None) -> None:
        """Put the adapted weights (and the optimizer) back to where adaptation started: every stream,
        or those flagged in ``streams``."""

    def reset(self) -> None:
        """Back to the source model exactly: weights, optimizer, every rule's state and the record."""
        self.restore_source()
        for part in self.stateful_parts().values():
            part.reset()
        self.forget()

    def forget(self) -> None:  # noqa: B027 (an optional hook: most learners keep no record)
        """Clear the learner's record of its steps (a learner that keeps none has nothing to clear)."""


def keyword_options(function: Any) -> set[str]:
    """The keyword-only parameters of ``function``: the options a part's ``prepare`` takes."""
    parameters = inspect.signature(function).parameters.values()
    return {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
