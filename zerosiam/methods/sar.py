"""SAR (Niu et al., ICLR 2023): sharpness-aware and reliable entropy minimization.

Three changes to Tent keep it from collapsing in the wild (mixed shifts, batch size 1, label shift):
  1. reliable samples only: drop samples with entropy ≥ E0 = 0.4·ln C, whose gradients are noisy;
  2. a flat minimum: a SAM step (ρ = 0.05), the second pass again restricted to reliable samples;
  3. model recovery: an exponential moving average of the second pass's loss; when it falls below 0.2
     the model has collapsed to confident nonsense and is reset to the source weights.
It moves the normalization parameters except those of the last stage and the final norm, which carry
the most class-specific information and are the first to degrade.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from zerosiam.methods.recipe import Evaluation
from zerosiam.methods.tent import tent
from zerosiam.parts.norms import NormSelector
from zerosiam.parts.sam import sam
from zerosiam.parts.selection import entropy_below

log = logging.getLogger(__name__)

_FINAL_NORMS = ("norm", "fc_norm", "bn2", "head.norm")  # timm ViT/Swin, ViT avg-pool, EfficientNet, ConvNeXt


def last_stage(model: nn.Module) -> nn.Module | None:
    """The last stage of a backbone, where SAR freezes the norms; None when no stage can be told apart.

    ResNet-50 ``layer4`` and ViT blocks 9–11 are SAR's own choice. For the others, the same idea:
    timm's ``stages[-1]`` (ConvNeXt and most timm CNNs), Swin's ``layers[-1]``, the CIFAR ResNets'
    ``layer3`` (they have three stages), EfficientNet's ``blocks[-1]``, and for any transformer with a
    ``blocks`` list its last quarter (blocks 9–11 of 12).
    """
    model = getattr(model, "wrapped_model", model)
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
    found = []
    for name in _FINAL_NORMS:
        try:
            found.append(model.get_submodule(name))
        except AttributeError:
            continue
    return found


@dataclass(frozen=True)
class WithoutLastStage(NormSelector):
    """Norm parameters except those in the last stage and the final norm (SAR's, and DeYO's, subset)."""

    def modules(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        stage = last_stage(model)
        if stage is None:
            log.warning("SAR: no last stage found in %s; only the final norm is frozen", type(model).__name__)
        frozen = {id(m) for m in (stage.modules() if stage is not None else ())}
        frozen |= {id(m) for m in final_norms(model)}
        return [(name, module) for name, module in super().modules(model) if id(module) not in frozen]


class EmaBelow:
    """SAR's model recovery: reset when the moving average of the second pass's loss falls below a floor.

    The tracked value is the mean objective (the entropy) over the samples the last evaluation kept;
    a step that kept none leaves the average unchanged. Returning True clears the average, so the next
    collapse is measured from the fresh model. (SAR's released code reassigns the old average right
    after resetting, so there it is not cleared; we follow the paper's description.)
    """

    def __init__(self, floor: float = 0.2, momentum: float = 0.9) -> None:  # methods.md: SAR code
        self.floor = floor
        self.momentum = momentum
        self.ema: float | None = None

    def __call__(self, evaluations: list[Evaluation]) -> bool:
        last = evaluations[-1]
        value = last.terms.get("objective", math.nan)
        if last.selected and math.isfinite(value):
            self.ema = value if self.ema is None else self.momentum * self.ema + (1 - self.momentum) * value
        if self.ema is not None and self.ema < self.floor:
            self.ema = None
            return True
        return False

    def reset(self) -> None:
        self.ema = None

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = state["ema"]


def ema_below(floor: float = 0.2) -> EmaBelow:  # methods.md: SAR, reset when ema < 0.2
    return EmaBelow(floor)


sar = tent.with_(
    name="sar",
    select=[entropy_below(0.4)],  # methods.md: SAR E0 = 0.4·ln C
    step=sam(rho=0.05),  # methods.md: SAR code, ρ = 0.05
    recover=ema_below(0.2),  # methods.md: SAR, ema < 0.2 → reset
    params=WithoutLastStage(),
    lr_family="tent",  # methods.md: learning rates as Tent's
    double_lr_at_bs1=True,  # methods.md: SAR's code doubles them at batch size 1
)
