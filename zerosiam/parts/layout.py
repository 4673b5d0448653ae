"""The one seam between one stream and B stacked streams: every per-stream reduction, in one place.

A learner adapts one stream, or B independent streams stacked in each batch (``zerosiam.parts.streams``:
stream-major rows, one copy of each adapted weight per stream). Parts are written once for both: where a
part reduces over the batch or over the weights, or must know whether a stream moved, it asks the
batch's or the learner's ``layout`` instead of branching on B. ``OneStream`` computes exactly what a
lone adapter always computed (the same operations, so the same bits); ``StackedStreams`` computes the
same per stream. The shapes are one contract for both: a per-stream value is 0-d for one stream and
``[B]`` for B; per-stream flags are boolean tensors of that shape.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from zerosiam.parts.streams import HeldRows, StreamNorms, by_stream, check_streams, stack_predictor


class Layout(ABC):
    """How a batch's rows and a weight's rows belong to streams, and whether a step may read the device.

    ``reads_device`` True is the eager path: a step may ask the device whether any sample was kept or a
    gradient is finite, and skip what it need not do. False is the fixed-shape path a captured step needs
    (``zerosiam.methods.capture``): every decision is device work on tensors of fixed shapes, every step
    runs whole, and the streams that must not move are put back after it (``HeldRows``).
    """

    count: int
    reads_device: bool = True

    def rows(self, values: Tensor) -> Tensor:
        """``[B·n, ...]`` rows as ``[B, n, ...]`` (``[1, n, ...]`` for one stream)."""
        return by_stream(values, self.count)

    @abstractmethod
    def value(self, per_stream: Tensor) -> Tensor:
        """A ``[B]`` tensor (or ``[B, ...]``) as this layout's per-stream value: 0-d for one stream."""

    @abstractmethod
    def pick(self, per_stream: list[Any]) -> Any:
        """A list of one item per stream as this layout's per-stream value: the item for one stream."""

    def kept(self, mask: Tensor) -> Tensor:
        """Per stream, whether any of its rows is kept."""
        return self.value(self.rows(mask).any(-1))

    @abstractmethod
    def masked_mean(self, values: Tensor, mask: Tensor) -> Tensor:
        """Per stream, the mean of ``values`` over the kept rows; NaN for a stream that kept none."""

    @abstractmethod
    def loss(self, per_sample: Tensor, mask: Tensor, filtered: bool) -> tuple[Tensor, Tensor]:
        """The scalar to descend and its value per stream: each stream's mean over its kept rows (0
        where it kept none), summed, so that every stream gets exactly its own gradient."""

    @abstractmethod
    def weight_sum(self, values: Tensor) -> Tensor:
        """Per stream, the sum of a weight-shaped tensor (stream first when stacked)."""

    @abstractmethod
    def gradient_norm(self, grads: Sequence[Tensor]) -> Tensor:
        """Per stream, the L2 norm of all gradients together (SAM's ‖g‖)."""

    @abstractmethod
    def per_row(self, per_stream: Tensor, param: Tensor) -> Tensor:
        """A per-stream factor laid out to multiply ``param`` (stream first when stacked)."""

    @abstractmethod
    def skips(self, held: Tensor) -> bool:
        """Whether holding back the ``held`` streams means the step as a whole did not move; stacked,
        the learner instead puts the held streams' rows back after a step that moved the others."""

    @abstractmethod
    def forwarded(self, kept: Tensor) -> Tensor | None:
        """The rows a second forward must take to score the ``kept`` ones (DeYO's shuffled view); None:
        every row, as they are (the fixed-shape path)."""

    def follow_kept(
        self, mean: Tensor | None, values: Tensor, mask: Tensor, momentum: float
    ) -> Tensor | None:
        """A running mean, per stream, of the kept rows' mean (EATA's redundancy mean); a stream that
        kept none leaves its own unchanged, and a stream's first kept rows start it (all on the device;
        a lone eager stream gathers its kept rows instead)."""
        return _follow_kept_rows(self.rows(values), self.rows(mask), mean, momentum)

    def hold_rows(self, optimizer: torch.optim.Optimizer) -> HeldRows | None:
        """What the optimizer's tensors were before a step, when the streams that keep no sample must
        be put back after it (stacked, or fixed-shape); None when such a step moves nothing anyway (a
        lone eager stream)."""
        return HeldRows(optimizer)

    @abstractmethod
    def own_norms(self, model: nn.Module, modules: Sequence[tuple[str, nn.Module]]) -> StreamNorms | None:
        """Each stream its own copy of the norm layers' affine parameters (None: the layers' own)."""

    @abstractmethod
    def predictor(self, predictor: nn.Module) -> nn.Module:
        """ZeroSiam's predictor, one per stream."""

    def all_streams(self, device: torch.device | None = None) -> Tensor:
        """Per-stream flags, every stream marked."""
        return self.value(torch.ones(self.count, dtype=torch.bool, device=device))


class OneStream(Layout):
    """A lone stream: the reductions a single adapter has always made."""

    count = 1

    def value(self, per_stream: Tensor) -> Tensor:
        return per_stream.squeeze(0)

    def pick(self, per_stream: list[Any]) -> Any:
        return per_stream[0]

    def kept(self, mask: Tensor) -> Tensor:
        return mask.any()

    def masked_mean(self, values: Tensor, mask: Tensor) -> Tensor:
        return torch.where(mask, values, 0.0).sum(-1) / mask.sum(-1)

    def loss(self, per_sample: Tensor, mask: Tensor, filtered: bool) -> tuple[Tensor, Tensor]:
        if not filtered:  # every sample counts: no need to ask the device whether any does
            loss = per_sample.mean()
        else:
            loss = per_sample[mask].mean() if mask.any() else per_sample.sum() * 0.0
        return loss, loss

    def weight_sum(self, values: Tensor) -> Tensor:
        return values.sum()

    def gradient_norm(self, grads: Sequence[Tensor]) -> Tensor:
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))

    def per_row(self, per_stream: Tensor, param: Tensor) -> Tensor:
        return per_stream

    def skips(self, held: Tensor) -> bool:
        return bool(held)

    def forwarded(self, kept: Tensor) -> Tensor:
        return kept

    def follow_kept(
        self, mean: Tensor | None, values: Tensor, mask: Tensor, momentum: float
    ) -> Tensor | None:
        if not mask.any():
            return mean
        current = values[mask].mean(0)
        if mean is None:
            return current
        # a NaN mean is none yet, as ``none_yet`` leaves it (the same bits as None where it is not)
        return torch.where(mean.isnan(), current, momentum * mean + (1 - momentum) * current)

    def hold_rows(self, optimizer: torch.optim.Optimizer) -> HeldRows | None:
        return None

    def own_norms(self, model: nn.Module, modules: Sequence[tuple[str, nn.Module]]) -> StreamNorms | None:
        return None

    def predictor(self, predictor: nn.Module) -> nn.Module:
        return predictor


class DeviceStream(OneStream):
    """A lone stream on the fixed-shape path: the reductions of ``StackedStreams`` for one stream, with
    the model's own norm parameters and predictor. A plain loss over every sample (Tent, ZeroSiam) is
    ``OneStream``'s to the bit; a filtered one sums over the kept rows in their places instead of
    gathering them, which rounds otherwise."""

    reads_device = False

    def loss(self, per_sample: Tensor, mask: Tensor, filtered: bool) -> tuple[Tensor, Tensor]:
        if not filtered:
            return super().loss(per_sample, mask, filtered)
        loss = torch.where(mask, per_sample, 0.0).sum() / mask.sum().clamp_min(1)
        return loss, loss

    def skips(self, held: Tensor) -> bool:
        return False

    def forwarded(self, kept: Tensor) -> Tensor | None:
        return None

    follow_kept = Layout.follow_kept  # on the device, as for stacked streams
    hold_rows = Layout.hold_rows


class StackedStreams(Layout):
    """B streams in one batch, each reduced alone (no read of the device where one stream needs none)."""

    def __init__(self, count: int, reads_device: bool = True) -> None:
        self.count = check_streams(count)
        self.reads_device = reads_device

    def value(self, per_stream: Tensor) -> Tensor:
        return per_stream

    def pick(self, per_stream: list[Any]) -> Any:
        return per_stream

    def masked_mean(self, values: Tensor, mask: Tensor) -> Tensor:
        kept, mask = self.rows(torch.where(mask, values, 0.0)), self.rows(mask)
        return kept.sum(-1) / mask.sum(-1)

    def loss(self, per_sample: Tensor, mask: Tensor, filtered: bool) -> tuple[Tensor, Tensor]:
        kept, mask = self.rows(torch.where(mask, per_sample, 0.0)), self.rows(mask)
        per_stream = kept.sum(-1) / mask.sum(-1).clamp_min(1)
        return per_stream.sum(), per_stream

    def weight_sum(self, values: Tensor) -> Tensor:
        return values.flatten(1).sum(1)

    def gradient_norm(self, grads: Sequence[Tensor]) -> Tensor:
        per_stream = [torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads]
        return torch.linalg.vector_norm(torch.stack(per_stream), dim=0)

    def per_row(self, per_stream: Tensor, param: Tensor) -> Tensor:
        return per_stream.view(-1, *[1] * (param.ndim - 1))

    def skips(self, held: Tensor) -> bool:
        return False

    def forwarded(self, kept: Tensor) -> Tensor | None:
        # the stacked norms take every stream's rows, in their places; the fixed-shape path takes them
        # without a mask (gathering by one reads the device)
        return torch.ones_like(kept) if self.reads_device else None

    def own_norms(self, model: nn.Module, modules: Sequence[tuple[str, nn.Module]]) -> StreamNorms | None:
        return StreamNorms(model, modules, self.count)

    def predictor(self, predictor: nn.Module) -> nn.Module:
        return stack_predictor(predictor, self.count)


def _follow_kept_rows(rows: Tensor, kept: Tensor, mean: Tensor | None, momentum: float) -> Tensor:
    """``follow_kept`` on ``[B, n, ...]`` rows, all on the device: a stream's mean of its kept rows
    (NaN where it kept none) starts or moves its running mean; one that kept none keeps its own."""
    kept = kept.unsqueeze(-1)
    count = kept.sum(1)
    current = torch.where(kept, rows, 0.0).sum(1) / count  # NaN where nothing was kept
    mean = mean if mean is not None else torch.full_like(current, math.nan)
    followed = torch.where(mean.isnan(), current, momentum * mean + (1 - momentum) * current)
    return torch.where(count > 0, followed, mean)


ONE_STREAM = OneStream()


def layout_for(streams: int, reads_device: bool = True) -> Layout:
    """The layout of ``streams`` streams (a positive integer, or a one-line error); ``reads_device``
    False: the fixed-shape path (``Layout``)."""
    if check_streams(streams) > 1:
        return StackedStreams(streams, reads_device)
    return ONE_STREAM if reads_device else DeviceStream()
