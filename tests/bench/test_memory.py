"""The memory helpers of ``zerosiam.bench.memory``."""

from __future__ import annotations

import mmap
import platform

import numpy as np
import pytest

from zerosiam.bench.memory import fix_mmap_threshold, peak_mb, reset_peak, status_kb

MIB = 2**20


def _resident_mb() -> float:
    return status_kb("VmRSS") / 1024


def _fresh_pages(megabytes: float) -> mmap.mmap:
    """A mapping of its own, every page written: unlike a ``malloc``'d block, which the allocator may
    serve from pages the process already holds, it adds its whole size to the resident memory."""
    pages = mmap.mmap(-1, int(megabytes * MIB))
    np.frombuffer(pages, dtype=np.uint8)[:] = 1
    return pages


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_mmap_threshold_is_fixed_on_glibc() -> None:
    assert fix_mmap_threshold() is True


def test_the_peak_follows_an_allocation_that_passes_it() -> None:
    """Holds whether or not the kernel lets the mark be reset: the block is sized to pass the peak so far
    (which, without a reset, is the whole process's)."""
    reset_peak()
    before = peak_mb()
    pages = _fresh_pages(before - _resident_mb() + 96)
    assert peak_mb() >= before + 60
    pages.close()


def test_a_reset_brings_the_peak_down_to_the_memory_in_use() -> None:
    _fresh_pages(256).close()  # unmapped: the peak stays, the resident memory falls
    if not reset_peak():
        pytest.skip("this kernel does not let a process reset its peak (/proc/self/clear_refs)")
    assert peak_mb() < _resident_mb() + 32
