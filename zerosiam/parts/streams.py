"""Independent streams in one forward: every stream its own copy of the adapted norm parameters.

The batch-size-1 protocols take 10,000 one-image steps per corruption, and a one-image step is mostly
overhead on any machine (kernel launches on a GPU, the framework's per-operator cost on a CPU). Stacking
B streams makes one step serve all B: the batch holds each stream's samples in stream-major order
(``B × n`` rows), the frozen backbone is shared, and each normalization layer normalizes every sample
alone (GroupNorm and LayerNorm do; BatchNorm would mix the streams and is refused) before scaling it by
its own stream's affine parameters, kept as one ``[B, ...]`` tensor. A loss summed over the streams then
gives every stream exactly its own gradient, and an element-wise optimizer (SGD with momentum) moves
every stream as if it ran alone.

What a method does per stream, it does here per stream too: the loss is each stream's mean over the
samples it kept; a stream that kept none does not step (``HeldRows`` puts its weights and momentum
back); SAM's perturbation is normalized per stream; EATA's redundancy filter keeps a mean per stream
and its Fisher penalty is summed per stream; SAR's recovery averages and resets each stream alone
(``put_rows``). Two differences remain. DeYO's shuffled view is drawn for all of a step's samples at
once, so its random patch orders differ from a lone stream's (the same law, other draws). And a
non-finite loss or gradient in one stream skips the step of every stream, where alone only that stream's
would be skipped (the finiteness check is one read of the device per step; a collapsing model is the only
one that reaches it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from zerosiam.parts.norms import is_batch_norm

_AFFINE = ("weight", "bias")


def check_streams(streams: int) -> int:
    """``streams`` if it is a positive integer; otherwise a one-line error."""
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise ValueError(f"streams must be a positive integer, got {streams!r}")
    return streams


def by_stream(rows: Tensor, streams: int) -> Tensor:
    """A stacked batch's ``[B·n, ...]`` rows as ``[B, n, ...]``: one block per stream."""
    return rows.view(streams, -1, *rows.shape[1:])


def channel_first(module: nn.Module) -> bool:
    """Whether ``module`` scales dimension 1 of its output (GroupNorm, timm's ``LayerNorm2d``) rather than
    its trailing dimensions (``LayerNorm`` over tokens or channels-last maps, RMSNorm)."""
    return isinstance(module, nn.GroupNorm) or type(module).__name__.endswith("2d")


def per_sample(param: Tensor, output: Tensor, first: bool) -> Tensor:
    """The stacked ``[B, ...]`` parameter laid out to multiply a ``[B·n, ...]`` output row by row."""
    rows = param.repeat_interleave(output.shape[0] // param.shape[0], dim=0)
    if first:
        return rows.view(rows.shape[0], -1, *[1] * (output.ndim - 2))
    return rows.view(rows.shape[0], *[1] * (output.ndim - param.ndim), *param.shape[1:])


class StreamNorms:
    """Gives each of ``modules`` (norm layers of ``model``) ``streams`` copies of its affine weight and bias.

    The layer itself then normalizes without affine; a forward hook applies each sample's stream's copy.
    ``params`` are the stacked parameters by the layers' parameter names, started at the source values;
    ``restore`` puts the layers' own parameters back, untouched, and removes the hooks.
    """

    def __init__(self, model: nn.Module, modules: Sequence[tuple[str, nn.Module]], streams: int) -> None:
        check_streams(streams)
        batch_norms = [name for name, module in model.named_modules() if is_batch_norm(module)]
        if batch_norms:
            raise ValueError(
                f"{batch_norms[0]} is a BatchNorm layer ({len(batch_norms)} in the model): batch "
                "statistics would mix the streams; stacked streams need GroupNorm/LayerNorm models"
            )
        self.streams = streams
        self.params: dict[str, nn.Parameter] = {}
        self._saved: list[tuple[nn.Module, dict[str, nn.Parameter | None]]] = []
        self._hooks: list[RemovableHandle] = []
        for name, module in modules:
            self._stack(name, module)

    def _stack(self, name: str, module: nn.Module) -> None:
        own = {key: getattr(module, key, None) for key in _AFFINE}
        stacked = {}
        for key, param in own.items():
            if param is None:
                continue
            stacked[key] = nn.Parameter(param.detach().unsqueeze(0).repeat(self.streams, *[1] * param.ndim))
            self.params[f"{name}.{key}" if name else key] = stacked[key]
            module.register_parameter(key, None)
        self._saved.append((module, own))
        self._hooks.append(module.register_forward_hook(_affine_hook(stacked, channel_first(module))))

    def restore(self) -> None:
        """The layers as they were: their own affine parameters back, the hooks removed."""
        for hook in self._hooks:
            hook.remove()
        for module, own in self._saved:
            for key, param in own.items():
                module.register_parameter(key, param)
        self._hooks.clear()
        self._saved.clear()


def _affine_hook(stacked: dict[str, nn.Parameter], first: bool) -> Callable[..., Tensor]:
    """A forward hook that scales and shifts each output row by its stream's copy of the affine."""

    def apply(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor:
        if "weight" in stacked:
            output = output * per_sample(stacked["weight"], output, first)
        if "bias" in stacked:
            output = output + per_sample(stacked["bias"], output, first)
        return output

    return apply


class StackedLinear(nn.Module):
    """A bias-free linear predictor per stream, ``[B, d, d]``, applied to each stream's rows."""

    def __init__(self, linear: nn.Linear, streams: int) -> None:
        super().__init__()
        weight = linear.weight.detach().unsqueeze(0).repeat(streams, 1, 1)
        self.weight = nn.Parameter(weight, requires_grad=linear.weight.requires_grad)

    def forward(self, z: Tensor) -> Tensor:
        rows = by_stream(z, self.weight.shape[0])
        return torch.bmm(rows, self.weight.transpose(1, 2)).flatten(0, 1)


STACKED_PREDICTORS = ("identity", "random", "random_learned")  # the linear ones


def stack_predictor(predictor: nn.Module, streams: int) -> nn.Module:
    """``predictor`` once per stream; only bias-free linear predictors (``STACKED_PREDICTORS``) stack."""
    if not isinstance(predictor, nn.Linear) or predictor.bias is not None:
        raise ValueError(
            f"a {type(predictor).__name__} predictor does not stack over streams; use a linear one "
            "(identity, random, random_learned)"
        )
    return StackedLinear(predictor, streams)


def put_rows(target: Tensor, source: Tensor | float, streams: Tensor) -> None:
    """Overwrite the rows of ``target`` (stream-first) of the streams marked in ``streams`` by ``source``."""
    rows = streams.to(target.device).view(-1, *[1] * (target.ndim - 1))
    with torch.no_grad():
        target.copy_(torch.where(rows, source, target))


class HeldRows:
    """The optimizer's tensors (parameters and momentum) as they were before a step, so that the streams
    that must not move (no sample selected) can be put back after it: a stream that ran alone would have
    skipped the step, momentum included."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.saved = [
            (p, p.detach().clone(), _momentum(optimizer, p))
            for group in optimizer.param_groups
            for p in group["params"]
        ]

    def put_back(self, streams: Tensor) -> None:
        for param, value, momentum in self.saved:
            put_rows(param, value, streams)
            now = _momentum(self.optimizer, param, clone=False)
            if now is not None:  # a buffer born in this step starts, for the held streams, at zero
                put_rows(now, momentum if momentum is not None else 0.0, streams)


def _momentum(optimizer: torch.optim.Optimizer, param: Tensor, clone: bool = True) -> Tensor | None:
    buffer = optimizer.state.get(param, {}).get("momentum_buffer")
    return buffer.detach().clone() if clone and buffer is not None else buffer


def zero_momentum_rows(optimizer: torch.optim.Optimizer, streams: Tensor) -> None:
    """Fresh optimizer state for the marked streams (a zero momentum is what no momentum does)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            buffer = _momentum(optimizer, param, clone=False)
            if buffer is not None:
                put_rows(buffer, 0.0, streams)
