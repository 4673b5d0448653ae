"""What a guard may do to an adapter, stream by stream: snapshot its weights, roll back to one, shrink its
step, and ask what the source model predicts (the ``GuardedLearner`` of ``parts/contract.py``).

A mixin of ``Adapter``, which supplies ``params`` (the adapted norm parameters, one row per stream when
stacked), ``predictor``, ``optimizer``, ``layout``, ``trainable``, the source copy ``_source`` and the
forward ``_forward``. Nothing here runs unless a guard asks: an unguarded adapter computes what it did.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from zerosiam.parts.hostsync import kept_in_place
from zerosiam.parts.layout import Layout
from zerosiam.parts.streams import put_rows, zero_momentum_rows

Weights = dict[str, dict[str, Tensor]]  # {"params": {name: tensor}, "predictor": {name: tensor}}


class Guardable:
    """Snapshots, roll-backs, a per-stream step scale and the source's prediction, for guards."""

    params: dict[str, nn.Parameter]
    predictor: nn.Module | None
    optimizer: torch.optim.Optimizer
    layout: Layout
    trainable: list[nn.Parameter]
    _source: dict[str, Tensor]
    _step_scale: Tensor | None = None  # per stream; None until a guard first shrinks a step
    _scale_hooks: list[RemovableHandle]
    _scale_kept = False  # the scale stays in one tensor, its hooks on (a captured step reads it)

    def snapshot(self) -> Weights:
        """A copy of the adapted weights (norm parameters and predictor), for a guard to roll back to."""
        predictor = self.predictor.named_parameters() if self.predictor is not None else ()
        return {
            "params": {name: p.detach().clone() for name, p in self.params.items()},
            "predictor": {name: p.detach().clone() for name, p in predictor},
        }

    def roll_back(self, snapshot: Weights, streams: Tensor) -> None:
        """The flagged streams back to a ``snapshot``'s weights (those it names: a guard may put back some
        of them), with no momentum."""
        if self.trainable:  # the flags onto the device once: each copy of host flags waits for the device
            streams = streams.to(self.trainable[0].device)
        self._put_weights(snapshot, streams)
        zero_momentum_rows(self.optimizer, streams)

    def source_prediction(self, x: Tensor) -> Tensor:
        """What the source model predicts for ``x`` (the adapted weights are put back after). Every stream
        is swapped, so the weights go in and out whole, one multi-tensor copy each way. Swapped by a
        roll-back's masked puts, a probe cost 8 operations a tensor (432 on the ResNet-26, beside its
        forward's 175 with gradients) and, on a GPU, a blocking copy of the host's flags per tensor, each
        waiting for the queued steps: 2.3-2.6 steps of the ResNet-26 at batch 64 on an H200."""
        params = list(self.params.values())
        with torch.no_grad():
            adapted = [p.clone() for p in params]
            torch._foreach_copy_(params, [self._source[name] for name in self.params])
            try:
                return self._forward(x)
            finally:
                torch._foreach_copy_(params, adapted)

    def shrink(self, streams: Tensor, factor: float) -> None:
        """Scale the flagged streams' future steps by ``factor`` (their gradients, so every part of the
        step, SAM's included, sees the smaller step; with momentum zeroed by a roll-back it is exactly a
        smaller learning rate for those streams)."""
        scale = self._step_scale if self._step_scale is not None else self.layout.all_streams().float()
        self._set_scale(torch.where(streams.to(scale.device), scale * factor, scale))

    def full_step(self, streams: Tensor) -> None:
        """The flagged streams' future steps back to their full size (a guard that slowed them and
        found them healthy since)."""
        if self._step_scale is not None:
            scale = self._step_scale
            self._set_scale(torch.where(streams.to(scale.device), torch.ones_like(scale), scale))

    def _set_scale(self, scale: Tensor) -> None:
        """Every later gradient scaled per stream by ``scale``, kept beside the weights (on the host it
        was copied to the device once a trainable tensor a step: 54 copies a step on the ResNet-26), and
        written into the tensor already there, which a captured step reads."""
        scale = scale.to(self.trainable[0].device) if self.trainable else scale
        if self._step_scale is None:  # the first shrink: from now on every gradient passes the scale
            self._scale_hooks = [p.register_hook(self._scaled) for p in self.trainable]
        self._step_scale = kept_in_place(self._step_scale, scale.float())

    def keep_scale(self) -> None:
        """From now on scale every step by a per-stream factor (ones until a guard shrinks a stream),
        kept in one tensor with its hooks on, a reset included: a captured step reads that tensor, so a
        guard's ``shrink`` and ``full_step`` must write into it rather than add hooks or replace it."""
        if self._step_scale is None:
            self._set_scale(self.layout.all_streams().float())
        self._scale_kept = True

    def _scaled(self, grad: Tensor) -> Tensor:
        return grad * self.layout.per_row(self._step_scale.to(grad.device), grad)

    def _put_weights(self, weights: Weights, streams: Tensor) -> None:
        """The flagged streams' rows of the parameters ``weights`` names (all, or some) put in place."""
        for name, value in weights["params"].items():
            put_rows(self.params[name], value, streams)
        for name, param in self.predictor.named_parameters() if weights["predictor"] else ():
            put_rows(param, weights["predictor"][name].to(param.device), streams)

    def forget(self) -> None:
        """The record cleared, and every stream's step back to its full size (``reset``)."""
        self._unscale()
        super().forget()

    def _unscale(self) -> None:
        """Every stream's step back to its full size: the scale and its hooks gone, or, kept
        (``keep_scale``), the scale set to ones in place."""
        if self._scale_kept and self._step_scale is not None:
            self._step_scale.fill_(1.0)
            return
        for hook in getattr(self, "_scale_hooks", []):
            hook.remove()
        self._step_scale, self._scale_hooks = None, []

    def state_dict(self) -> dict[str, Any]:
        scale = self._step_scale.clone() if self._step_scale is not None else None
        return {**super().state_dict(), "step_scale": scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._unscale()
        scale = state.get("step_scale")  # checkpoints of old had none
        if scale is not None:
            self._set_scale(scale.clone())

    def release(self, keep_adapted: bool = False) -> nn.Module:
        self._scale_kept = False
        self._unscale()
        return super().release(keep_adapted)
