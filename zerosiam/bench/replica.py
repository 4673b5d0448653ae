"""Replicas: executions of one spec that differ by no more than float rounding, to measure its noise.

A run adapts online, thousands of updates in a row, each on what the previous ones made: a difference in
the last bit of one step can grow into points of accuracy by the stream's end. Another machine, another
thread count or another place in a stack of streams is such a difference, but on one machine there are
few of them (measured on the 2-core AMD EPYC: 1 and 2 threads round alike, and so do every place and
size of a stack above one stream), too few to measure a spread with. A replica ``r`` ≥ 1 makes one on
purpose: before each adapting step it moves every input value by about one float32 rounding step
(a relative ``ROUNDING_STEP``), up, down or not at all, in a pattern drawn from ``r`` and the step. Replica
0 is the run untouched, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ROUNDING_STEP = 2.0**-23  # float32's machine epsilon: one rounding step of a value in [1, 2)
_SEED_STRIDE = 1_000_003  # a prime, so that (replica, step) pairs never share a seed over any real stream


def jittered(x: torch.Tensor, replicas: Sequence[int], step: int) -> torch.Tensor:
    """``x`` (stream-major rows of ``len(replicas)`` stacked streams) with each stream of replica ≥ 1
    moved by one rounding step where its pattern says; ``x`` itself when every replica is 0."""
    if not any(replicas):
        return x
    rows = x.shape[0] // len(replicas)
    parts = []
    for number, replica in enumerate(replicas):
        part = x[number * rows : (number + 1) * rows]
        parts.append(part if replica == 0 else part * (1 + ROUNDING_STEP * _signs(part, replica, step)))
    return torch.cat(parts)


def _signs(x: torch.Tensor, replica: int, step: int) -> torch.Tensor:
    """-1, 0 or +1 for every value of ``x``, the same for the same replica and step on one device (a
    resumed run draws what it would have drawn); the global random state is left alone."""
    generator = torch.Generator(x.device).manual_seed(replica * _SEED_STRIDE + step)
    return torch.randint(-1, 2, x.shape, generator=generator, device=x.device).to(x.dtype)
