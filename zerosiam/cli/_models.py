"""The checks of a command's models, and of the data it will feed them, made before any work starts."""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerosiam.cli._errors import UsageError

if TYPE_CHECKING:
    from zerosiam.zoo import ModelEntry

HF = "hf:"
BUILT_FOR_THE_CHECK = ("builder:", "torchscript:")  # the user's own models, which only a build can inspect


def describe(model: str, model_options: Mapping[str, Any]) -> ModelEntry:
    """What ``model`` names (its class count, input size, normalization), or a ``UsageError`` saying what
    is wrong with it: an unknown name, a spec missing what it needs (an ``hf:`` folder without its
    preprocessor config, a builder without its normalization), an unreadable file, a damaged weights file
    in an ``hf:`` folder."""
    from zerosiam.zoo import MODELS, model_info

    try:
        entry = model_info(model, **({} if model in MODELS else dict(model_options)))
        if model.startswith(HF):
            check_weight_files(model.removeprefix(HF))
    except (ValueError, TypeError, ImportError, OSError) as error:
        raise UsageError(f"model {model!r}: {error}") from None
    return entry


def check_weight_files(path: str) -> None:
    """Refuse an ``hf:`` folder with a damaged weights file, naming it: a truncated copy or a file that is
    not what its name says would otherwise be found by every run's worker, one failure per run. Each
    safetensors file's header is parsed and its size checked against it; a ``.bin`` zip archive must be
    readable to its central directory (at its end, so a truncated one is not)."""
    from zerosiam.zoo.hugging_face import model_folder

    folder = model_folder(path)
    for file in sorted([*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]):
        problem = _safetensors_problem(file) if file.suffix == ".safetensors" else _archive_problem(file)
        if problem is not None:
            raise ValueError(f"weights file {file} is damaged ({problem}); save the model again")


def _safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file (header, sizes), or None when it reads whole."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="numpy"):
            return None
    except (SafetensorError, OSError) as error:
        return str(error)


def _archive_problem(file: Path) -> str | None:
    """What is wrong with a ``torch.save`` zip archive, or None; a file of the older pickle format is left
    to the loader."""
    with file.open("rb") as handle:
        if handle.read(2) != b"PK":
            return None
    try:
        with zipfile.ZipFile(file):
            return None
    except (zipfile.BadZipFile, OSError) as error:
        return str(error)


def check_adaptable_models(
    models: Iterable[str], model_options: Mapping[str, Any], methods: Iterable[str]
) -> None:
    """Refuse, in one line saying what the method needs, a user's model (``builder:``, ``torchscript:``)
    that an adapting method of the grid finds nothing to adapt in: a TorchScript file, a model without
    norm layers (``zerosiam.methods.check_adaptable``). Such a model is built once for the check; the zoo's
    models, timm's and Hugging Face's all have norm layers and are not built here."""
    from zerosiam.methods import check_adaptable, get_recipe

    adapting = [method for method in dict.fromkeys(methods) if get_recipe(method).adapts]
    for model in models:
        if not adapting or not model.startswith(BUILT_FOR_THE_CHECK):
            continue
        built = _load(model, model_options)
        for method in adapting:
            try:
                check_adaptable(built, method)
            except (TypeError, ValueError) as error:
                raise UsageError(f"model {model!r} cannot run {method!r}: {error}") from None


def _load(model: str, model_options: Mapping[str, Any]) -> Any:
    """The model as a run loads it; an error in loading is the one line ``describe`` gives."""
    from zerosiam.zoo import load_model

    try:
        return load_model(model, **dict(model_options))
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
