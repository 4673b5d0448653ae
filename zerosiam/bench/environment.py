"""What a result row records of the machine and software that made it, for vision and language runs.

Numbers are only comparable when one knows what produced them: the Python, torch and zerosiam versions,
the CPU and the threads torch used, and for language runs the transformers and peft versions. The
environment is recorded beside a run, never part of its identity: the same spec on another machine is
the same run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Sequence
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
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
    }
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found
