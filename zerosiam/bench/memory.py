"""Peak resident memory of this process, per measurement window.

torch's CPU allocator is invisible to ``tracemalloc``, so memory is read from the kernel: ``VmHWM`` (the
resident high-water mark) after resetting it through ``/proc/self/clear_refs``. Where that is not
available (not Linux), the process-lifetime ``ru_maxrss`` is the fallback.
"""

from __future__ import annotations

import resource
from pathlib import Path


def status_kb(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (e.g. ``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> bool:
    """Reset the peak mark to the current RSS; False where the kernel does not allow it."""
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
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
