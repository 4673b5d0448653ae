"""Models named by a spec rather than a zoo entry: any timm architecture, a TorchScript file, or a
user's own builder function with a checkpoint.

Syntax (the part after the first ``@`` is a checkpoint path; architecture, module and function names
never contain ``@``, so a path may):

- ``timm:<architecture>[@<checkpoint>|@random]``, e.g. ``timm:resnet50_gn.a1h_in1k`` or
  ``timm:vit_small_patch16_224.augreg_in21k_ft_in1k@/ckpt/vit.safetensors``. Built with
  ``pretrained=False`` (nothing is downloaded); normalization and input size come from timm's
  ``pretrained_cfg`` for that name. The weights are the checkpoint given, else the name's pretrained
  weights in the user's Hugging Face cache (``models--timm--<name>``, as ``timm`` or ``huggingface-cli``
  left them), else an error that names the file it looked for; ``@random`` asks for random weights.
- ``torchscript:<path>``, a file saved with ``torch.jit.save``; ``mean=`` and ``std=`` are required.
- ``builder:<module>:<function>[@<checkpoint>]``, e.g. ``builder:mypkg.models:make_net``; the function
  (imported, then called with ``builder_kwargs``) returns an ``nn.Module``; ``mean=``/``std=`` required.
- ``hf:<folder>``, a Hugging Face image classifier saved with ``save_pretrained`` beside its image
  processor's config, which gives its input size and normalization (:mod:`zerosiam.zoo.hugging_face`).

A user's checkpoint is read with ``weights_only=True`` (or as safetensors) and can be pinned with
``checkpoint_sha256=``. A class count that is not given is read from one forward pass of zeros.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zerosiam.parts.split import OutputChoice, logits_of
from zerosiam.zoo.base import (
    DATASET_INPUT_SIZES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ModelEntry,
    Options,
    UnknownModelError,
    check_normalization,
    dataset_for,
)
from zerosiam.zoo.checkpoint import existing_file, load_into, verify_sha256
from zerosiam.zoo.hugging_face import hugging_face_entry

KINDS = ("timm", "torchscript", "builder", "hf")
RANDOM = "random"  # timm:<architecture>@random: random weights, said explicitly
SYNTAX = (
    "timm:<architecture>[@<checkpoint>]",
    "torchscript:<path.pt>",
    "builder:<module>:<function>[@<checkpoint>]",
    "hf:<folder of save_pretrained>",
)


MODEL_OPTIONS = tuple(Options.__dataclass_fields__)


def is_spec(name: str) -> bool:
    return name.partition(":")[0] in KINDS and ":" in name


def entry_for(name: str, options: Options) -> ModelEntry:
    """The entry a spec names, with the options applied; raises with the syntax when it is malformed."""
    kind, _, target = name.partition(":")
    if not target:
        raise UnknownModelError(f"{name!r} names no {kind} model; the syntax is one of: {', '.join(SYNTAX)}")
    if kind == "torchscript":
        return _torchscript_entry(target, options)
    if kind == "hf":
        return hugging_face_entry(target, options)
    target, options = _split_checkpoint(target, options)
    if kind == "timm":
        return _timm_entry(target, options)
    return _builder_entry(target, options)


def _split_checkpoint(target: str, options: Options) -> tuple[str, Options]:
    """``target@path`` → ``target`` with ``path`` as the checkpoint option (which must not also be set)."""
    target, at, path = target.partition("@")
    if not at:
        return target, options
    if options.checkpoint is not None:
        raise ValueError(f"checkpoint given twice: {path!r} in the name and {options.checkpoint!r}")
    return target, replace(options, checkpoint=path)


# ---------------------------------------------------------------------------------------------- timm
def _timm_entry(architecture: str, options: Options) -> ModelEntry:
    import timm
    from timm.models import get_pretrained_cfg

    if not timm.is_model(architecture):
        raise UnknownModelError(
            f"timm has no architecture {architecture!r} (timm {timm.__version__}); "
            f"see timm.list_models('*{architecture.split('.')[0][:8]}*')"
        )
    config = get_pretrained_cfg(architecture)
    num_classes = options.num_classes
    if num_classes is None:
        num_classes = config.num_classes if config and config.num_classes else 1000
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1 (the zoo returns logits), got {num_classes}")
    mean, std = check_normalization(
        options.mean if options.mean is not None else (config.mean if config else IMAGENET_MEAN),
        options.std if options.std is not None else (config.std if config else IMAGENET_STD),
    )
    input_size = options.input_size or (config.input_size[-1] if config else 224)
    options = _timm_weights(architecture, config, options)

    def build() -> nn.Module:
        model = timm.create_model(
            architecture, pretrained=False, num_classes=num_classes, **dict(options.builder_kwargs)
        )
        return _with_checkpoint(model, options)

    return ModelEntry(
        build=build,
        input_size=int(input_size),
        num_classes=int(num_classes),
        mean=mean,
        std=std,
        dataset=dataset_for(num_classes, options.dataset),
        source=f"timm {timm.__version__} '{architecture}' (pretrained=False){_weights_note(options)}",
        licence="that of the checkpoint" if options.checkpoint else "no weights (random initialization)",
    )


def _timm_weights(architecture: str, config: Any, options: Options) -> Options:
    """The options with the checkpoint a timm spec loads: the file given, none for ``@random``, else the
    pretrained weights of that name in the Hugging Face cache, found offline."""
    if options.checkpoint == RANDOM:
        return replace(options, checkpoint=None)
    if options.checkpoint is not None:
        return options
    repo = (
        config.hf_hub_id
        if config is not None and getattr(config, "hf_hub_id", None)
        else f"timm/{architecture}"
    )
    return replace(options, checkpoint=hugging_face_cached(repo, architecture))


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as ``huggingface_hub`` resolves it (no network, no import)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def hugging_face_cached(repo: str, architecture: str) -> Path:
    """The weights file of ``repo`` in the hub cache: its ``main`` revision's ``model.safetensors`` (or
    ``pytorch_model.bin``); a ``FileNotFoundError`` naming what was looked for when there is none."""
    folder = hub_cache() / f"models--{repo.replace('/', '--')}"
    main = folder / "refs" / "main"
    revisions = (
        [main.read_text().strip()] if main.is_file() else sorted(p.name for p in folder.glob("snapshots/*"))
    )
    for revision in revisions:
        for name in ("model.safetensors", "pytorch_model.bin"):
            candidate = folder / "snapshots" / revision / name
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(
        f"no weights for timm:{architecture}: looked for {folder}/snapshots/<revision>/model.safetensors "
        f"(the Hugging Face cache of {repo}); download it once where there is a network "
        f"(huggingface-cli download {repo}), or pass a file as timm:{architecture}@<path>, "
        f"or ask for random weights with timm:{architecture}@random"
    )


def _with_checkpoint(model: nn.Module, options: Options) -> nn.Module:
    if options.checkpoint is None:
        return model
    return load_into(model, options.checkpoint, options.checkpoint_sha256, options.strict)


def _weights_note(options: Options) -> str:
    return f", weights {options.checkpoint}" if options.checkpoint is not None else ""


# ---------------------------------------------------------------------------------------------- user models
def _torchscript_entry(path: str, options: Options) -> ModelEntry:
    if options.checkpoint is not None:
        raise ValueError("a TorchScript file holds its own weights; checkpoint= does not apply to it")
    file = existing_file(path, "TorchScript file")

    def build() -> nn.Module:
        verify_sha256(file, options.checkpoint_sha256)
        return torch.jit.load(str(file), map_location="cpu")

    return _user_entry(build, options, f"TorchScript file {file}")


def _builder_entry(target: str, options: Options) -> ModelEntry:
    function = _import_builder(target)
    kwargs = dict(options.builder_kwargs)

    def build() -> nn.Module:
        model = function(**kwargs)
        if not isinstance(model, nn.Module):
            raise TypeError(f"builder {target} returned {type(model).__name__}, not a torch.nn.Module")
        return _with_checkpoint(model, options)

    return _user_entry(build, options, f"builder {target}{_weights_note(options)}")


def _import_builder(target: str) -> Callable[..., Any]:
    """The function ``module:function`` names (the function part may be dotted, e.g. ``Net.create``)."""
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute:
        raise UnknownModelError(
            f"builder spec {target!r} must read <module>:<function>, e.g. mypkg.nets:make"
        )
    module = importlib.import_module(module_name)
    try:
        function = functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        raise UnknownModelError(f"module {module_name} has no attribute {attribute!r}") from None
    if not callable(function):
        raise TypeError(f"{target} is not callable")
    return function


def _user_entry(build: Callable[[], nn.Module], options: Options, source: str) -> ModelEntry:
    """An entry for a model the zoo knows nothing about: the user states its normalization.

    Guessing a normalization would silently cost accuracy, so ``mean``/``std`` are required. When the
    class count is not given the model is built once to read it, and that instance is handed out first.
    """
    if options.mean is None or options.std is None:
        raise ValueError(
            f"{source}: pass mean= and std= (the normalization the model was trained with; "
            "mean=0, std=1 if it takes [0, 1] images)"
        )
    mean, std = check_normalization(options.mean, options.std)
    input_size = _user_input_size(options)
    num_classes = options.num_classes
    if num_classes is None:
        probed = build()
        num_classes = count_classes(probed, input_size, options.output)
        build = _first_then(probed, build)
    return ModelEntry(
        build=build,
        input_size=input_size,
        num_classes=num_classes,
        mean=mean,
        std=std,
        dataset=dataset_for(num_classes, options.dataset),
        source=source,
        licence="the user's",
    )


def _user_input_size(options: Options) -> int:
    if options.input_size is not None:
        return int(options.input_size)
    if options.dataset in DATASET_INPUT_SIZES:
        return DATASET_INPUT_SIZES[options.dataset]
    raise ValueError(f"pass input_size= (or dataset= one of {sorted(DATASET_INPUT_SIZES)})")


def count_classes(model: nn.Module, input_size: int, output: OutputChoice = None) -> int:
    """The width of the model's logits for one image of zeros (read from its output by ``logits_of``, in
    the field ``output`` names), which must be a (1, classes) tensor."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = logits_of(model(torch.zeros(1, 3, input_size, input_size)), output)
    model.train(was_training)
    if logits.dim() != 2 or logits.shape[0] != 1:
        shape = tuple(logits.shape)
        raise ValueError(f"the model must return (N, classes) logits; for one image it returned {shape}")
    return int(logits.shape[1])


def _first_then(first: nn.Module, build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """A builder that returns ``first`` on its first call and fresh models afterwards."""
    pending = [first]

    def build_next() -> nn.Module:
        return pending.pop() if pending else build()

    return build_next
