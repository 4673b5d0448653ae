"""Peak resident memory of this process, and peak GPU memory, per measurement window.

torch's CPU allocator is invisible to ``tracemalloc``, so memory is read from the kernel: ``VmHWM`` (the
resident high-water mark) after resetting it through ``/proc/self/clear_refs``. Where that is not
available (not Linux), the process-lifetime ``ru_maxrss`` is the fallback.
"""

from __future__ import annotations

import ctypes
import resource
import sys
from pathlib import Path

import torch

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # glibc's default starting value


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of ``size`` bytes or more by its own mapping, returned on free.

    By default glibc raises this threshold to the largest block freed so far (up to 32 MiB), so the
    megabyte temporaries of a CPU forward come from the heap; there they fragment it, and a long frozen
    pass grows the resident memory with every batch (a stacked blind-spot task of the ViT passed 11 GB).
    Fixing the threshold turns that off. False where the C library has no ``mallopt`` (not glibc).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, size))


def status_kb(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (e.g. ``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def max_rss_kb() -> int:
    """The process's lifetime peak resident memory in KiB (``ru_maxrss``, which macOS gives in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def reset_peak(device: torch.device | None = None) -> bool:
    """Reset the peak marks (host RSS, and ``device``'s allocator on a GPU) to the current use; False
    where the kernel does not allow resetting the host's."""
    if device is not None and device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_mb() -> float:
    """The peak resident memory since the last ``reset_peak`` (or since the process started), in MiB."""
    try:
        return status_kb("VmHWM") / 1024
    except (OSError, KeyError):
        return max_rss_kb() / 1024


def peak_gpu_mb(device: torch.device) -> float | None:
    """The peak memory torch allocated on a CUDA ``device`` since the last ``reset_peak``, in MiB."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
