"""Which parameters test-time adaptation moves: the affine weight and bias of normalization layers.

Normalization layers are recognised by type (torch's BatchNorm, GroupNorm, LayerNorm, RMSNorm and their
subclasses such as timm's LayerNorm2d) and, for libraries that define their own, by class name
(timm's RmsNorm, Hugging Face's LlamaRMSNorm). Name patterns select a subset, as SAR needs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

log = logging.getLogger(__name__)

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


_FINAL_NORMS = ("norm", "fc_norm", "bn2", "head.norm")  # timm ViT/Swin, ViT avg-pool, EfficientNet, ConvNeXt
# Hugging Face classifiers keep their network in ``base_model`` (``vit``, ``convnext``, ...): transformer
# blocks (ViT, DeiT, BEiT: ``layers``; DINOv2: ``encoder.layer``) or stages (ConvNeXt, ResNet:
# ``encoder.stages``; Swin: ``encoder.layers``), then a final ``layernorm`` (BEiT's mean pooling: in its
# ``pooler``).
_HF_BLOCKS = ("layers", "encoder.layer")
_HF_STAGES = ("encoder.stages", "encoder.layers")
_HF_FINAL_NORMS = ("layernorm", "pooler.layernorm")


def last_stage(model: nn.Module) -> nn.Module | None:
    """The last stage of a backbone, where SAR freezes the norms; None when no stage can be told apart.

    ResNet-50 ``layer4`` and ViT blocks 9–11 are SAR's own choice. For the others, the same idea:
    timm's ``stages[-1]`` (ConvNeXt and most timm CNNs), Swin's ``layers[-1]``, the CIFAR ResNets'
    ``layer3`` (they have three stages), EfficientNet's ``blocks[-1]``, and for any transformer with a
    ``blocks`` list its last quarter (blocks 9–11 of 12); the same for Hugging Face's classifiers.
    """
    model = getattr(model, "wrapped_model", model)
    backbone = _hugging_face_backbone(model)
    if backbone is not None:
        return _hugging_face_last_stage(backbone)
    for name in ("stages", "layers"):
        stages = getattr(model, name, None)
        if isinstance(stages, (nn.Sequential, nn.ModuleList)) and len(stages):
            return stages[-1]
    for name in ("layer4", "layer3"):
        if isinstance(getattr(model, name, None), nn.Module):
            return getattr(model, name)
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.Sequential, nn.ModuleList)) and len(blocks):
        if hasattr(model, "patch_embed"):
            return nn.ModuleList(blocks[len(blocks) - max(1, len(blocks) // 4) :])
        return blocks[-1]
    return None


def final_norms(model: nn.Module) -> list[nn.Module]:
    """The norms after the last stage (before the classifier), e.g. a ViT's ``norm``."""
    model = getattr(model, "wrapped_model", model)
    backbone = _hugging_face_backbone(model)
    if backbone is not None:
        model, names = backbone, _HF_FINAL_NORMS
    else:
        names = _FINAL_NORMS
    found = []
    for name in names:
        try:
            found.append(model.get_submodule(name))
        except AttributeError:
            continue
    return [module for module in found if is_norm(module)]  # BEiT's unused ``layernorm`` is an Identity


def _hugging_face_backbone(model: nn.Module) -> nn.Module | None:
    """The network inside a Hugging Face classifier (its ``base_model``), or None for other models."""
    backbone = getattr(model, "base_model", None)
    return backbone if isinstance(backbone, nn.Module) and hasattr(model, "config") else None


def _hugging_face_last_stage(backbone: nn.Module) -> nn.Module | None:
    """The last quarter of a Hugging Face transformer's blocks, or its last stage."""
    for path in (*_HF_BLOCKS, *_HF_STAGES):
        try:
            found = backbone.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(found, (nn.Sequential, nn.ModuleList)) and len(found):
            if path in _HF_BLOCKS:
                return nn.ModuleList(found[len(found) - max(1, len(found) // 4) :])
            return found[-1]
    return None


@dataclass(frozen=True)
class WithoutLastStage(NormSelector):
    """Norm parameters except those in the last stage and the final norm (SAR's, and DeYO's, subset)."""

    def modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        stage = last_stage(model)
        if stage is None:
            _say_no_last_stage(type(getattr(model, "wrapped_model", model)))  # the network, not the wrapper
        frozen = {id(m) for m in (stage.modules() if stage is not None else ())}
        frozen |= {id(m) for m in final_norms(model)}
        return [(name, module) for name, module in super().modules(model) if id(module) not in frozen]


_STAGELESS_SAID: set[type] = set()
"""Model classes already told to have no last stage: said once per process, not at every look."""


def _say_no_last_stage(network: type) -> None:
    if network not in _STAGELESS_SAID:
        _STAGELESS_SAID.add(network)
        log.warning("no last stage found in %s; only the final norm is frozen", network.__name__)


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
