"""The memory helpers of ``zerosiam.bench.memory``."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from zerosiam.bench.memory import fix_mmap_threshold, peak_mb, reset_peak


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_mmap_threshold_is_fixed_on_glibc() -> None:
    assert fix_mmap_threshold() is True


def test_the_peak_follows_a_large_allocation() -> None:
    reset_peak()
    before = peak_mb()
    block = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MiB, touched
    assert peak_mb() >= before + 60
    del block
