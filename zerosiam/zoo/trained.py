"""The project's own GroupNorm / LayerNorm source models, trained on the CIFAR-10 training JPEGs.

Weights live as ``weights/<name>.safetensors`` beside this file, each with a JSON sidecar that records its
sha256 and how it was made (command, seed, epochs, wall time, clean accuracy on the CIFAR-10 (JPEG q75)
test set). safetensors is used because loading it runs no pickle, and the sha256 is checked before the
weights are read, so a truncated or swapped file fails loudly instead of silently giving another model.

``build(name)`` gives the architecture (random weights) and ``load_trained(name)`` the trained model; both
take float images in [0, 1] ``(N, 3, 32, 32)`` and normalize inside, like every model of the zoo.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from zerosiam.assets.files import atomic_write, sha256_file
from zerosiam.zoo.architectures import ARCHITECTURES, build_architecture

if TYPE_CHECKING:
    from zerosiam.zoo import ModelEntry

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
TEST_SET = "CIFAR-10 (JPEG q75) test, 10,000 images"

PathLike = str | os.PathLike[str]


class TrainedWeightsMissingError(FileNotFoundError):
    """The weights (or their sidecar) are not there yet; the message says how to train them."""


class WeightsIntegrityError(ValueError):
    """The weights file does not match its sidecar (sha256 or architecture)."""


def build(name: str, *, normalized: bool = True) -> nn.Module:
    """The architecture ``name`` with fresh weights; ``normalized`` puts the CIFAR mean/std inside it so it
    takes images in [0, 1] (what training and the benchmark feed it)."""
    net = build_architecture(name)
    if not normalized:
        return net
    from zerosiam.zoo import Normalized  # lazy: zerosiam.zoo may import this module to register models

    return Normalized(net, CIFAR10_MEAN, CIFAR10_STD)


def default_path(name: str) -> Path:
    return WEIGHTS_DIR / f"{name}.safetensors"


def sidecar_path(weights: PathLike) -> Path:
    return Path(weights).with_suffix(".json")


def _bare(model: nn.Module) -> nn.Module:
    """The network inside a ``Normalized`` wrapper (its mean/std are constants, not weights)."""
    return getattr(model, "wrapped_model", model)


def save_trained(model: nn.Module, name: str, path: PathLike, meta: dict[str, Any]) -> dict[str, Any]:
    """Write the weights as safetensors, then the sidecar (sha256, normalization, ``meta``); return it."""
    from safetensors.torch import save

    net = _bare(model)
    state = {key: value.detach().contiguous() for key, value in net.state_dict().items()}
    blob = save(state, metadata={"arch": name})
    path = Path(path)
    atomic_write(path, blob)
    sidecar = {
        "arch": name,
        "weights": path.name,
        "sha256": hashlib.sha256(blob).hexdigest(),
        "format": "safetensors; state dict of the bare network (inputs normalized with mean/std below)",
        "input": "float RGB in [0, 1], (N, 3, 32, 32); normalization happens inside the loaded model",
        "mean": list(CIFAR10_MEAN),
        "std": list(CIFAR10_STD),
        "num_classes": 10,
        "parameters": sum(p.numel() for p in net.parameters()),
        "test_set": TEST_SET,
        **meta,
    }
    atomic_write(sidecar_path(path), (json.dumps(sidecar, indent=2) + "\n").encode())
    return sidecar


def how_to_train(name: str) -> str:
    return (
        f"Train them with `zerosiam train-source --arch {name} --out runs/{name} "
        f"--export-dir zerosiam/zoo/weights` (the epochs and timings are in docs/source_models.md)."
    )


def shipped_sha256(name: str) -> str | None:
    """The sha256 the sidecar of the shipped weights of ``name`` records, or None when there are none.

    Cheap (the file is not hashed: loading it checks the hash), so that a benchmark run can name the
    weights it was made with in its identity, and a store written with other weights is never resumed.
    """
    sidecar = sidecar_path(default_path(name))
    if name not in ARCHITECTURES or not sidecar.is_file():
        return None
    return json.loads(sidecar.read_text()).get("sha256")


def read_sidecar(name: str, path: PathLike) -> dict[str, Any]:
    """The sidecar of ``path``, after checking that it describes ``name`` and that the sha256 matches."""
    path, sidecar = Path(path), sidecar_path(path)
    for needed in (path, sidecar):
        if not needed.is_file():
            raise TrainedWeightsMissingError(
                f"no trained weights for {name!r}: {needed} does not exist. " + how_to_train(name)
            )
    info = json.loads(sidecar.read_text())
    if info.get("arch") != name:
        raise WeightsIntegrityError(f"{sidecar} describes architecture {info.get('arch')!r}, not {name!r}")
    actual = sha256_file(path)
    if actual != info.get("sha256"):
        raise WeightsIntegrityError(
            f"{path} has sha256 {actual}, but its sidecar {sidecar.name} says {info.get('sha256')}: "
            "the file is corrupt or was replaced. " + how_to_train(name)
        )
    return info


def load_trained(name: str, path: PathLike | None = None, *, normalized: bool = True) -> nn.Module:
    """The trained model ``name`` in eval mode, its sha256 verified before the weights are read.

    ``path`` defaults to ``zerosiam/zoo/weights/<name>.safetensors``; the sidecar is the same path with
    ``.json``. Raises ``TrainedWeightsMissingError`` (saying how to train them) when they are not there.
    """
    from safetensors.torch import load_file

    if name not in ARCHITECTURES and path is None:
        raise ValueError(f"unknown trained model {name!r}; available: {', '.join(ARCHITECTURES)}")
    path = Path(path) if path is not None else default_path(name)
    read_sidecar(name, path)
    model = build(name, normalized=normalized)
    _bare(model).load_state_dict(load_file(path))
    return model.eval()


def available_trained() -> list[str]:
    """The architectures whose weights (and sidecar) are present in ``WEIGHTS_DIR``."""
    return [n for n in ARCHITECTURES if default_path(n).is_file() and sidecar_path(default_path(n)).is_file()]


def model_entries() -> dict[str, ModelEntry]:
    """Zoo entries for the three trained models, to be merged into ``zerosiam.zoo.MODELS``.

    Each entry builds the bare network (``load_model`` adds the CIFAR normalization from the entry), so
    listing the entries needs no weights; building one without weights raises the how-to-train error.
    """
    from zerosiam.zoo import ModelEntry

    return {
        name: ModelEntry(
            build=lambda name=name: load_trained(name, normalized=False),
            input_size=32,
            num_classes=10,
            mean=CIFAR10_MEAN,
            std=CIFAR10_STD,
            dataset="cifar10",
        )
        for name in ARCHITECTURES
    }
