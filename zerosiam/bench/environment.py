"""What a result row records of the machine and software that made it, for vision and language runs.

Numbers are only comparable when one knows what produced them: the Python, torch and zerosiam versions,
the CPU and the threads torch used, and for language runs the transformers and peft versions. An online
run amplifies rounding (``docs/RESULTS.md``, "One spec, several numbers"), so the record names what
decides it: the CPU's model, the vector extensions torch dispatches its kernels to (``cpu_capability``) and
those the CPU has, and the threads; the runner adds the GPU and the run's place in a stack of streams.
The environment is recorded beside a run, never part of its identity: the same spec on another machine is
the same run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import zerosiam


def environment(packages: Sequence[str] = ()) -> dict[str, Any]:
    """The machine and versions of this process, plus the installed versions of ``packages``."""
    found: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "zerosiam": zerosiam.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_vector": vector_extensions(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
    }
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


# The x86 and Arm vector extensions that change which kernels (and so which roundings) a CPU runs.
VECTOR_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "neon", "asimd", "sve", "sve2",
)  # fmt: skip
_CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo_field(*names: str) -> str | None:
    """The first value of the first of ``names`` in ``/proc/cpuinfo`` (Linux), or ``None``."""
    try:
        lines = _CPUINFO.read_text().splitlines()
    except OSError:
        return None
    for name in names:
        for line in lines:
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    return None


def cpu_model() -> str:
    """The CPU's model name (``AMD EPYC``, ``Intel(R) Xeon(R) ...``); ``platform.processor()`` where
    ``/proc/cpuinfo`` does not say (macOS, Windows)."""
    return _cpuinfo_field("model name", "Model", "Hardware") or platform.processor() or platform.machine()


def vector_extensions() -> list[str]:
    """Which of :data:`VECTOR_FLAGS` the CPU reports, in that order (empty where it cannot be read)."""
    flags = set((_cpuinfo_field("flags", "Features") or "").split())
    return [flag for flag in VECTOR_FLAGS if flag in flags]
