"""Hugging Face image classifiers: ``hf:<folder>``, a folder written by ``save_pretrained``.

The folder holds the model (``config.json`` and its weights, loaded offline with
``transformers.AutoModelForImageClassification``) and its image processor's ``preprocessor_config.json``.
The processor is what says how the model sees an image, so the zoo reads it rather than asking: the input
size (``crop_size`` when it centre-crops, else ``size``), the interpolation it resizes with
(``resample``) and the normalization (``image_mean``/``image_std``, after its ``rescale_factor``).
``mean``, ``std`` and ``input_size`` options override them. A folder without a processor config is
refused unless all three are given: a guessed normalization silently costs accuracy.

Images of another size are resized inside the wrapper to the input size, as the processor would resize
them (the crop a processor makes around it, such as ConvNeXt's ``crop_pct``, is not made: the benchmark's
images are already framed). The class count is the config's ``num_labels``, read without building the
model. Loading is strict: a weight the folder lacks (which ``transformers`` would initialize at random
with a warning) is an error, and so is an extra one unless ``strict=False``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from zerosiam.zoo.base import ModelEntry, Options, UnknownModelError, check_normalization, dataset_for
from zerosiam.zoo.checkpoint import verify_sha256

CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # a single-file checkpoint, as save_pretrained writes
# PIL's resampling filters as processors record them (``resample``), as torch interpolations; torch has
# no Lanczos, box or Hamming filter, and bicubic stands in for them.
_INTERPOLATIONS = {0: "nearest", 2: "bilinear", 3: "bicubic"}


@dataclass(frozen=True)
class Preprocessing:
    """What the processor does to an image before the model sees it, in the zoo's terms."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    input_size: int
    resize: str | None  # the interpolation, or None when the processor does not resize


def hugging_face_entry(path: str, options: Options) -> ModelEntry:
    """The entry of ``hf:<path>`` with ``options`` applied, read from the folder's JSON files: nothing is
    built until ``build`` is called."""
    folder = model_folder(path)
    if options.checkpoint is not None:
        raise ValueError(f"hf:{path} holds its own weights; checkpoint= does not apply to it")
    num_classes = _num_labels(folder)
    if options.num_classes is not None and options.num_classes != num_classes:
        raise ValueError(
            f"hf:{path} has {num_classes} classes (its config's num_labels), "
            f"not num_classes={options.num_classes}"
        )
    seen = preprocessing(folder, options)
    kwargs = dict(options.builder_kwargs)

    def build() -> nn.Module:
        verify_sha256(_weights_file(folder, options.checkpoint_sha256), options.checkpoint_sha256)
        return _from_pretrained(folder, kwargs, options.strict)

    return ModelEntry(
        build=build,
        input_size=seen.input_size,
        num_classes=num_classes,
        mean=seen.mean,
        std=seen.std,
        dataset=dataset_for(num_classes, options.dataset),
        source=f"transformers AutoModelForImageClassification from {folder}",
        licence="that of the model in the folder",
        resize=seen.resize,
    )


def model_folder(path: str) -> Path:
    """``path`` as a folder holding a model's ``config.json``; a one-line error otherwise."""
    folder = Path(path).expanduser()
    if not (folder / CONFIG).is_file():
        what = "does not exist" if not folder.exists() else f"has no {CONFIG}"
        raise UnknownModelError(f"hf:{path} {what}; hf: takes a folder written by save_pretrained")
    return folder


def preprocessing(folder: Path, options: Options) -> Preprocessing:
    """The processor's input size, interpolation and normalization, each overridden by its option."""
    file = folder / PREPROCESSOR
    if not file.is_file():
        return _without_processor(folder, options)
    config = json.loads(file.read_text())
    mean, std = _normalization(config)
    mean, std = check_normalization(
        options.mean if options.mean is not None else mean, options.std if options.std is not None else std
    )
    input_size = int(options.input_size) if options.input_size is not None else _input_size(config, file)
    return Preprocessing(mean, std, input_size, _interpolation(config))


def _without_processor(folder: Path, options: Options) -> Preprocessing:
    """All three values from the options, since the folder does not say them; a one-line refusal when
    one is missing, rather than a guess."""
    if options.mean is None or options.std is None or options.input_size is None:
        raise ValueError(
            f"hf:{folder} has no {PREPROCESSOR}, so its input size, mean and std are unknown: save the "
            "image processor into the folder too (processor.save_pretrained), or pass mean=, std= "
            "and input_size="
        )
    mean, std = check_normalization(options.mean, options.std)
    return Preprocessing(mean, std, int(options.input_size), "bilinear")


def _interpolation(config: dict[str, Any]) -> str | None:
    """The torch interpolation of the processor's ``resample`` filter; None when it does not resize."""
    if not config.get("do_resize", True):
        return None
    return _INTERPOLATIONS.get(config.get("resample", 2), "bicubic")


def _normalization(config: dict[str, Any]) -> tuple[Any, Any]:
    """The processor's mean and std for images in [0, 1], as the zoo feeds them. A processor rescales
    pixels by ``rescale_factor`` (1/255: to [0, 1]) before normalizing; any other factor is folded in."""
    mean, std = (config.get("image_mean"), config.get("image_std"))
    if not config.get("do_normalize", True) or mean is None or std is None:
        mean, std = 0.0, 1.0
    factor = config.get("rescale_factor", 1 / 255) if config.get("do_rescale", True) else 1.0
    scale = 255 * factor
    if math.isclose(scale, 1.0):
        return mean, std
    mean_t, std_t = check_normalization(mean, std)
    return tuple(m / scale for m in mean_t), tuple(s / scale for s in std_t)


def _input_size(config: dict[str, Any], file: Path) -> int:
    """The square side the processor hands the model: its crop when it centre-crops, else its size."""
    size = config.get("crop_size") if config.get("do_center_crop") else config.get("size")
    if isinstance(size, int):
        return size
    size = size or {}
    if "height" in size and size["height"] == size.get("width"):
        return int(size["height"])
    if "shortest_edge" in size:
        return int(size["shortest_edge"])
    raise ValueError(f"{file}: cannot read a square input size from {size!r}; pass input_size=")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError("hf: models need transformers: pip install 'zerosiam[hf]'") from None
    return transformers


def _num_labels(folder: Path) -> int:
    """The class count of the model's config (``num_labels``, from its ``id2label``)."""
    return int(_transformers().AutoConfig.from_pretrained(folder, local_files_only=True).num_labels)


def _weights_file(folder: Path, sha256: str | None) -> Path | None:
    """The single weights file ``checkpoint_sha256`` pins; None when nothing is pinned."""
    if sha256 is None:
        return None
    for name in WEIGHTS:
        if (folder / name).is_file():
            return folder / name
    raise ValueError(
        f"checkpoint_sha256 pins one weights file, and hf:{folder} has none of {', '.join(WEIGHTS)}"
    )


def _from_pretrained(folder: Path, kwargs: dict[str, Any], strict: bool) -> nn.Module:
    """The classifier with every weight from the folder; missing weights are an error, extra ones too
    unless ``strict`` is False."""
    transformers = _transformers()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a bar per run's model would clutter a grid's output
    try:
        model, info = transformers.AutoModelForImageClassification.from_pretrained(
            folder, local_files_only=True, output_loading_info=True, **kwargs
        )
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    missing, extra = sorted(info.get("missing_keys", ())), sorted(info.get("unexpected_keys", ()))
    if missing or (strict and extra):
        problem = f"lacks weights {missing[:5]}" if missing else f"has unexpected weights {extra[:5]}"
        raise ValueError(f"hf:{folder} {problem} for {type(model).__name__}")
    return model
