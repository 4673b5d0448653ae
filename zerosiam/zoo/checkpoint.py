"""Reading a user's checkpoint file safely into a model.

A ``.pth``/``.pt``/``.th``/``.bin`` file is read with ``torch.load(weights_only=True)``, which refuses
pickled code, so a file from elsewhere can only hold tensors and plain containers. ``.safetensors``
files hold nothing else by design. An optional sha256 pins the exact file a result was produced with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from zerosiam.assets import ChecksumMismatchError, sha256_file

PathLike = str | os.PathLike[str]
# Keys under which training scripts commonly nest the weights (timm, torchvision references, Lightning).
_NESTED_KEYS = ("state_dict", "model", "model_state_dict", "state_dict_ema", "model_ema")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DataParallel / DistributedDataParallel, torch.compile


def existing_file(path: PathLike, what: str) -> Path:
    """``path`` as a Path, or a FileNotFoundError naming what it was meant to be."""
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise FileNotFoundError(f"{what} {resolved} does not exist")
    return resolved


def verify_sha256(path: Path, expected: str | None) -> None:
    """Raise :class:`ChecksumMismatchError` unless ``path`` hashes to ``expected`` (when one is given)."""
    if expected is None:
        return
    actual = sha256_file(path)
    if actual != expected.lower():
        raise ChecksumMismatchError(path.name, expected.lower(), {str(path): actual}, [str(path)])


def _unwrap(loaded: object, path: Path) -> Mapping[str, Tensor]:
    """The state dict inside a loaded checkpoint, looking into the usual nesting keys."""
    if isinstance(loaded, Mapping):
        for key in _NESTED_KEYS:
            inner = loaded.get(key)
            if isinstance(inner, Mapping) and inner and all(isinstance(v, Tensor) for v in inner.values()):
                return inner
        if all(isinstance(v, Tensor) for v in loaded.values()):
            return loaded
    raise ValueError(
        f"{path} holds no state dict (a mapping of names to tensors, possibly under one of {_NESTED_KEYS})"
    )


def _strip_prefixes(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Keys without the prefix a training wrapper adds, when every key carries it."""
    result = dict(state)
    for prefix in _WRAPPER_PREFIXES:
        if result and all(key.startswith(prefix) for key in result):
            result = {key.removeprefix(prefix): value for key, value in result.items()}
    return result


def read_state_dict(path: PathLike, sha256: str | None = None) -> dict[str, Tensor]:
    """The tensors of a checkpoint file, never unpickling code, after the optional checksum."""
    file = existing_file(path, "checkpoint")
    verify_sha256(file, sha256)
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return _strip_prefixes(load_file(str(file), device="cpu"))
    loaded = torch.load(file, map_location="cpu", weights_only=True)
    return _strip_prefixes(_unwrap(loaded, file))


def load_into(model: nn.Module, path: PathLike, sha256: str | None = None, strict: bool = True) -> nn.Module:
    """``model`` holding the checkpoint's weights.

    With ``strict`` every key must match both ways; ``strict=False`` tolerates extra keys in the file
    (an EMA copy, an auxiliary head) but never a missing one, since that would leave random weights.
    """
    result = model.load_state_dict(read_state_dict(path, sha256), strict=strict)
    if not strict and result.missing_keys:
        raise ValueError(f"checkpoint {path} lacks weights for: {', '.join(result.missing_keys[:10])}")
    return model
