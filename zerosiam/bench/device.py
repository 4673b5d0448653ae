"""Where a run computes: ``--device auto|cpu|cuda|cuda:N``, and what the result row says about it.

The device is a run's setting, never part of its identity: the same spec on a GPU is the same run (its
numbers may differ in the last bits, which the environment record explains). ``auto`` takes the first
CUDA device when there is one, else the CPU.
"""

from __future__ import annotations

import re
from typing import Any

import torch

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def resolve_device(name: str) -> torch.device:
    """The torch device ``name`` stands for; a one-line ``ValueError`` when it is not there."""
    if not isinstance(name, str) or not _DEVICE.match(name):
        raise ValueError(f"unknown device {name!r}; choose one of {DEVICE_CHOICES}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but CUDA is not available here; use cpu or auto")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r} asked for, but there are {torch.cuda.device_count()} CUDA devices"
            )
    return device


def describe_device(device: torch.device) -> dict[str, Any]:
    """The device for the environment record: the GPU's name, CUDA and driver versions on CUDA."""
    if device.type != "cuda":
        return {"device": str(device)}
    properties = torch.cuda.get_device_properties(device)
    return {
        "device": str(device),
        "gpu": properties.name,
        "gpu_memory_gb": round(properties.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
        "cuda_driver": _driver_version(),
    }


def _driver_version() -> str | None:
    """The NVIDIA driver's version, from NVML when it can be read (it is not part of torch's API)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:
        return None
