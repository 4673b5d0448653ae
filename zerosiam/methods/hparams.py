"""Learning rates by model family and batch size, resolved when an adapter is built.

The numbers are the authors' at batch size 64 (the paper, appendix C.2, and each method's own paper);
each row says where it comes from. Families are recognised from the model's classes, so a user's own timm
or torchvision model gets the paper's setting when it has one, and a stated fallback otherwise. The
language models' rates, one per math dataset, are here too (``LANGUAGE_RATES``): every learning rate
the paper gives lives in this one file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from zerosiam.parts.norms import is_batch_norm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rates:
    """Learning rates: η_f for what the model learns (norm parameters; LoRA on a language model), η_h
    for ZeroSiam's predictor. Image rates are at batch size 64, language rates at one question."""

    lr: float
    predictor_lr: float = 0.0


# Tent (and SAR/EATA/DeYO, which reuse Tent's rates): paper appendix, ImageNet scale, batch size 64.
TENT_RATES = {
    "resnet50_gn": Rates(2.5e-4),
    "vit_base": Rates(1e-3),
    "vit_small": Rates(1e-4),
    "convnext_tiny": Rates(2.5e-5),
    "swin_tiny": Rates(5e-5),
    # Project choice (not in the paper) for BatchNorm models (the CIFAR ResNets, EfficientNet-Lite0):
    # SGD at 1e-3, the rate Tent's own CIFAR-10-C code uses (with Adam there).
    "batchnorm": Rates(1e-3),
}

# ZeroSiam: authors' code, batch size 64 (η_f, η_h).
ZEROSIAM_RATES = {
    "resnet50_gn": Rates(2.5e-3, 2.5e-2),
    "vit_base": Rates(5e-3, 5e-3),
    "vit_small": Rates(1e-3, 1e-2),
    "convnext_tiny": Rates(2.5e-4, 2.5e-3),
    "swin_tiny": Rates(5e-4, 2.5e-3),
    # Project choice: Tent's rate for η_f and the paper's usual η_h = 10·η_f.
    "batchnorm": Rates(1e-3, 1e-2),
}

# Language models (LoRA and ZeroSiam's predictor, one question at a time), per math dataset: paper
# appendix, with η_h = η_f as in the paper. ``zerosiam.llm.math_data`` reads them: each dataset's default.
LANGUAGE_RATES = {
    "math500": Rates(7.5e-6, 7.5e-6),
    "collegemath": Rates(5e-6, 5e-6),
    "aime24": Rates(1.25e-5, 1.25e-5),
    "minerva": Rates(5e-6, 5e-6),
    # Project choice: GSM8K is not in the paper; it is easier than MATH-500, so MATH-500's rate.
    "gsm8k": Rates(7.5e-6, 7.5e-6),
}

TABLES = {"tent": TENT_RATES, "zerosiam": ZEROSIAM_RATES}
FALLBACK = "resnet50_gn"
# Hugging Face's classes of the paper's families, as the timm classes they match (ViT's width is its
# config's hidden_size).
_HUGGING_FACE_AS_TIMM = {
    "ViTForImageClassification": "VisionTransformer",
    "DeiTForImageClassification": "VisionTransformer",
    "ConvNextForImageClassification": "ConvNeXt",
    "SwinForImageClassification": "SwinTransformer",
}


def model_family(model: nn.Module) -> str | None:
    """The family whose published rates apply to ``model``, or None when the paper has none.

    A model may declare its family in a ``rate_family`` attribute (the project's own CIFAR GN/LN models
    do: they are small members of the paper's families, not timm or torchvision classes); otherwise the
    family is recognised from the classes it is built of.
    """
    model = getattr(model, "wrapped_model", model)  # look through the zoo's normalization wrapper
    declared = getattr(model, "rate_family", None)
    if declared is not None:
        if declared not in TENT_RATES:
            raise ValueError(f"rate_family {declared!r} is not one of {sorted(TENT_RATES)}")
        return declared
    names = {type(m).__name__ for m in model.modules()}
    top = _HUGGING_FACE_AS_TIMM.get(type(model).__name__, type(model).__name__)
    if top == "VisionTransformer":
        config = getattr(model, "config", None)  # a Hugging Face model's
        width = getattr(model, "embed_dim", None) or getattr(config, "hidden_size", None)
        return {768: "vit_base", 384: "vit_small"}.get(width)
    if top == "ConvNeXt":
        return "convnext_tiny"
    if top == "SwinTransformer":
        return "swin_tiny"
    if top == "ResNet" and "GroupNorm" in names:
        return "resnet50_gn"
    if any(is_batch_norm(m) for m in model.modules()):
        return "batchnorm"
    return None


def batch_scale(batch_size: int, family: str, double_at_one: bool) -> float:
    """The authors' code scales rates linearly with batch size (ResNet-50-GN twice as much below 32)
    and doubles them again at batch size 1 for SAR and ZeroSiam."""
    scale = batch_size / 64
    if family == "resnet50_gn" and batch_size < 32:
        scale *= 2
    if double_at_one and batch_size == 1:
        scale *= 2
    return scale


_NOTICES_GIVEN: set[tuple[type, str]] = set()
"""(model class, notice) pairs already logged: a notice about a class is said once per process, not once
per adapter (a grid builds hundreds)."""


def resolve_rates(
    model: nn.Module,
    table: str,
    batch_size: int,
    double_at_one: bool,
    *,
    defaulted: Sequence[str] = ("lr", "predictor_lr"),
) -> Rates:
    """The paper's rates for ``model``'s family at ``batch_size``, from ``table``; a family the paper has
    no rate for takes the fallback's, and ``defaulted``, the rates the caller takes from here (none when
    it gave its own), says whether that is worth a notice."""
    family = model_family(model)
    if family is None:
        _say_fallback(type(getattr(model, "wrapped_model", model)), defaulted)  # the network, not the wrapper
        family = FALLBACK
    base = TABLES[table][family]
    scale = batch_scale(batch_size, family, double_at_one)
    return Rates(base.lr * scale, base.predictor_lr * scale)


def _say_fallback(network: type, defaulted: Sequence[str]) -> None:
    """Log, once per process and model class, that a rate the caller did not give is the fallback's."""
    if "lr" in defaulted:
        notice = (
            "no published learning rate for %s; using the %s rates. Pass lr= (and predictor_lr=) to choose."
        )
    elif "predictor_lr" in defaulted:
        notice = (
            "lr given for %s but no predictor_lr: using the %s predictor rate. Pass predictor_lr= to choose."
        )
    else:
        return
    if (network, notice) not in _NOTICES_GIVEN:
        _NOTICES_GIVEN.add((network, notice))
        log.warning(notice, network.__name__, FALLBACK)
