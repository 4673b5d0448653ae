"""Which parameters test-time adaptation moves: the affine weight and bias of normalization layers.

Normalization layers are recognised by type (torch's BatchNorm, GroupNorm, LayerNorm, RMSNorm and their
subclasses such as timm's LayerNorm2d) and, for libraries that define their own, by class name
(timm's RmsNorm, Hugging Face's LlamaRMSNorm). Name patterns select a subset, as SAR needs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.GroupNorm,
    nn.LayerNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)
_NORM_NAME = re.compile(r"(Batch|Group|Layer|Instance|Rms|RMS)Norm")


def is_norm(module: nn.Module) -> bool:
    """True for a normalization layer of torch or of a library that names its classes ``*Norm``."""
    return isinstance(module, _NORM_TYPES) or bool(_NORM_NAME.search(type(module).__name__))


def is_batch_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.batchnorm._BatchNorm)


@dataclass(frozen=True)
class NormSelector:
    """Norm layers whose module name matches any ``include`` pattern (all when empty) and no ``exclude``.

    Patterns are regular expressions searched in the dotted module name, e.g. ``r"^layer4\\."``.
    """

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()

    def wants(self, name: str) -> bool:
        if self.include and not any(re.search(p, name) for p in self.include):
            return False
        return not any(re.search(p, name) for p in self.exclude)

    def modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(n, m) for n, m in model.named_modules() if is_norm(m) and self.wants(n)]

    def parameters(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """The affine parameters (weight, bias) of the selected norm layers, with their full names."""
        found = []
        for module_name, module in self.modules(model):
            for param_name, param in module.named_parameters(recurse=False):
                if param_name in ("weight", "bias"):
                    found.append((f"{module_name}.{param_name}" if module_name else param_name, param))
        return found


class BatchStatistics:
    """Makes BatchNorm layers normalize with the current batch's statistics, as Tent does.

    Running statistics are kept untouched (neither used nor updated): setting ``track_running_stats``
    to False while the layer is in training mode makes torch pass no buffers to the kernel. ``restore``
    puts back each layer's mode and flag, so the caller's model is left as it was.
    """

    def __init__(self, model: nn.Module) -> None:
        self.layers = [m for m in model.modules() if is_batch_norm(m)]
        self._saved = [(m.training, m.track_running_stats) for m in self.layers]
        for layer in self.layers:
            layer.train()
            layer.track_running_stats = False

    def check_batch(self, batch_size: int) -> None:
        """Refuse a single-sample batch: its batch variance says nothing about the data."""
        if self.layers and batch_size < 2:
            raise ValueError(
                f"batch size {batch_size} with BatchNorm: the model has {len(self.layers)} BatchNorm "
                "layers, which would normalize with the statistics of one sample. Use batches of 2 or "
                "more, or a model with GroupNorm/LayerNorm for batch size 1."
            )

    def restore(self) -> None:
        for layer, (training, tracking) in zip(self.layers, self._saved, strict=True):
            layer.train(training)
            layer.track_running_stats = tracking
