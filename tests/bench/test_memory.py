"""The memory helpers of ``zerosiam.bench.memory``."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from zerosiam.bench.memory import fix_mmap_threshold, peak_mb, reset_peak, status_kb

MIB = 2**20


def _resident_mb() -> float:
    return status_kb("VmRSS") / 1024


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_mmap_threshold_is_fixed_on_glibc() -> None:
    assert fix_mmap_threshold() is True


def test_the_peak_follows_an_allocation_that_passes_it() -> None:
    """Holds whether or not the kernel lets the mark be reset: the block is sized to pass the peak so far
    (which, without a reset, is the whole process's)."""
    reset_peak()
    before = peak_mb()
    block = np.ones(int((before - _resident_mb() + 96) * MIB), dtype=np.uint8)  # touched
    assert peak_mb() >= before + 60
    del block


def test_a_reset_brings_the_peak_down_to_the_memory_in_use() -> None:
    block = np.ones(256 * MIB, dtype=np.uint8)
    del block  # a block this large has a mapping of its own, handed back on free
    if not reset_peak():
        pytest.skip("this kernel does not let a process reset its peak (/proc/self/clear_refs)")
    assert peak_mb() < _resident_mb() + 32
