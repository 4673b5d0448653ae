"""The blind spot's source-model mistakes, found once per model and domain and kept on disk.

A blind-spot run adapts on what the unadapted model gets wrong, so each one starts with a frozen pass of
the source model over the whole domain. That pass is the same for every method and slow on a CPU (a
large model's forward over every image of every corruption of the task), and each of the seven methods'
tasks repeated it.
The mask depends on the model's weights, the images, the scoring order (the seed's mild order, its batch
size) and the arithmetic (precision, device type), so all of them name the file; a different value finds
another file, never a wrong one. The weights are named by a hash of the model's own tensors, not by its
name: a name can stand for other weights (a user's checkpoint, a test's tiny model).

Only the project's own dataset builds are cached: they never change once made. A folder of the user's
(ImageNet-C on disk) could be edited between runs, so its mistakes are found again each time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from zerosiam.assets.files import atomic_file
from zerosiam.assets.store import cache_dir
from zerosiam.bench import datasets
from zerosiam.bench.spec import RunSpec
from zerosiam.bench.store import run_id_for
from zerosiam.protocols.build import Domain, Predict, source_mistakes

FOLDER = "blind_spot_mistakes"


def cached_mistakes(
    spec: RunSpec, model: nn.Module, predict: Predict, device: torch.device, domain: Domain
) -> np.ndarray:
    """``source_mistakes`` of the unadapted ``model`` (``predict`` runs it) on ``domain``, read from the
    cache when an earlier run found them."""
    if not datasets.is_cached(spec.dataset):
        return source_mistakes(spec, domain, predict, device)
    path = _file(_identity(spec, model, device))
    known = _read(path, len(domain[1]))
    if known is not None:
        return known
    found = source_mistakes(spec, domain, predict, device)
    with atomic_file(path) as handle:  # two workers finding it at once write the same bytes; either wins
        np.save(handle, found, allow_pickle=False)
    return found


def _file(identity: dict[str, Any]) -> Path:
    """Where the mask of ``identity`` (everything it depends on) is kept in the cache."""
    return cache_dir() / FOLDER / f"{run_id_for(identity)}.npy"


def _identity(spec: RunSpec, model: nn.Module, device: torch.device) -> dict[str, Any]:
    """Everything the source model's mistakes depend on: not the method, its rates or the stream length."""
    return {
        "weights": weights_fingerprint(model),
        "dataset": spec.dataset,
        "corruption": spec.corruption,
        "severity": spec.severity,
        "limit": spec.limit,
        "seed": spec.seed,
        "batch_size": spec.batch_size,
        "precision": spec.precision,
        "device": device.type,
    }


def weights_fingerprint(model: nn.Module) -> str:
    """sha256 of the model's class and every tensor of its state, by name: the same only for the same
    network with the same weights (one read of the weights' bytes, cheap beside the pass over the domain
    that the cache saves)."""
    digest = hashlib.sha256(type(model).__qualname__.encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().reshape(-1).cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _read(path: Path, images: int) -> np.ndarray | None:
    """The cached mask if it is whole and fits the domain; a missing or damaged file is found again."""
    try:
        mask = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    return mask if mask.dtype == bool and mask.shape == (images,) else None
