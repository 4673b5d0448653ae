"""The checks of a command's models, and of the data it will feed them, made before any work starts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from zerosiam.cli._errors import UsageError

if TYPE_CHECKING:
    from zerosiam.zoo import ModelEntry


def describe(model: str, model_options: Mapping[str, Any]) -> ModelEntry:
    """What ``model`` names (its class count, input size, normalization), or a ``UsageError`` saying what
    is wrong with it: an unknown name, a spec missing what it needs (an ``hf:`` folder without its
    preprocessor config, a builder without its normalization), an unreadable file."""
    from zerosiam.zoo import MODELS, model_info

    try:
        return model_info(model, **({} if model in MODELS else dict(model_options)))
    except (ValueError, TypeError, ImportError, OSError) as error:
        raise UsageError(f"model {model!r}: {error}") from None


def check_label_space(models: Iterable[str], model_options: Mapping[str, Any], dataset: str) -> None:
    """Refuse, in one line, a model whose head has another number of classes than ``dataset``'s labels.

    Such a run would not fail: it would score a 1,000-way arg-max against 10 labels and report a wrong
    accuracy. The class count comes from the model's description (a Hugging Face config's ``num_labels``,
    timm's ``pretrained_cfg``, a zoo entry), the dataset's from ``CLASS_COUNTS``.
    """
    from zerosiam.bench.datasets import clean_source
    from zerosiam.corruptions.datasets import CLASS_COUNTS

    try:
        classes = CLASS_COUNTS[clean_source(dataset)]
    except ValueError as error:
        raise UsageError(str(error)) from None
    for model in models:
        found = describe(model, model_options).num_classes
        if found != classes:
            raise UsageError(
                f"model {model!r} has {found} classes but dataset {dataset!r} has {classes}: its "
                "predictions would be scored against labels it does not have; use a model with a "
                f"{classes}-class head or another --dataset"
            )
