"""The forward's numeric precision: float32 as in the paper, or bfloat16/float16 autocast for speed.

``tf32`` keeps float32 tensors but lets matrix products and convolutions, forward and backward, run on
TF32 tensor cores (inputs rounded to a 10-bit mantissa, sums in float32), as PyTorch did by default
for matrix products until 1.12 and for convolutions still does. On an Ampere or Hopper GPU it is several
times faster than strict ``fp32``; elsewhere it is ``fp32``.

Only the model's forward runs in the lower precision. Logits are cast back to float32 before any loss
sees them, so entropies, divergences, the selection rules and the optimizer (whose parameters stay
float32) work at full precision: a test-time update is small, and rounding it away would change the
method, not just its speed. float16 runs without loss scaling, as TTA losses are O(1); prefer bfloat16.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

PRECISIONS: dict[str, torch.dtype | None] = {
    "fp32": None,
    "tf32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision


@contextlib.contextmanager
def forward_precision(precision: str, device: torch.device) -> Iterator[None]:
    """Autocast the block to ``precision`` on ``device`` (``tf32``: tensor cores; ``fp32``: nothing)."""
    dtype = PRECISIONS[check_precision(precision)]
    if dtype is None:
        with tensor_cores(precision):
            yield
        return
    # torch asks for autocast's cache of cast weights to be off while a CUDA graph is being captured
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    with torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=not capturing):
        yield


@contextlib.contextmanager
def tensor_cores(precision: str) -> Iterator[None]:
    """For ``tf32``, allow TF32 matrix products and convolutions inside the block (the whole step, so the
    backward too), then restore torch's settings; every other precision leaves them as they are."""
    if check_precision(precision) != "tf32":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
