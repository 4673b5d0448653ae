"""The forward's numeric precision: float32 as in the paper, or bfloat16/float16 autocast for speed.

Only the model's forward runs in the lower precision. Logits are cast back to float32 before any loss
sees them, so entropies, divergences, the selection rules and the optimizer (whose parameters stay
float32) work at full precision: a test-time update is small, and rounding it away would change the
method, not just its speed. float16 runs without loss scaling, as TTA losses are O(1); prefer bfloat16.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision


@contextlib.contextmanager
def forward_precision(precision: str, device: torch.device) -> Iterator[None]:
    """Autocast the block to ``precision`` on ``device`` (nothing changes for ``fp32``)."""
    dtype = PRECISIONS[check_precision(precision)]
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield
