"""SAR's model recovery: the moving average of the loss, and when it fires."""

from __future__ import annotations

import math

import pytest
import torch

from zerosiam.parts.contract import Evaluation
from zerosiam.parts.recovery import EmaBelow


def evaluation(value: float, selected: bool = True) -> Evaluation:
    mask = torch.tensor([selected])
    objective = torch.tensor(value if selected else math.nan)  # a per-stream value: 0-d for one stream
    return Evaluation(torch.tensor(value), mask, None, {"objective": objective})


def test_ema_recovery_fires_below_the_floor_and_only_then():
    recovery = EmaBelow(0.2)
    flags = recovery([evaluation(1.0), evaluation(0.5)])
    assert flags.shape == () and not flags and recovery.ema == 0.5  # one stream: one 0-d flag
    fired = []
    for _ in range(20):
        before = recovery.ema
        fired.append(bool(recovery([evaluation(1.0), evaluation(0.0)])))
        if not fired[-1]:
            assert recovery.ema == pytest.approx(0.9 * before)
        else:
            assert 0.9 * before < 0.2 <= before and recovery.ema is None
            break
    assert fired[-1] and not any(fired[:-1])  # 0.5·0.9^k first below 0.2 at k = 9
    assert len(fired) == 9
    recovery.ema = 0.3
    assert not recovery([evaluation(1.0), evaluation(0.0, selected=False)]) and recovery.ema == 0.3
