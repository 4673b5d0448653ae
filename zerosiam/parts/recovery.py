"""Model recovery: when to put a collapsing model back to its source weights.

SAR watches the loss of its reliable samples: entropy minimization that has collapsed to confident
nonsense drives that loss towards zero, so a moving average below a floor is read as collapse and the
learner is reset (the ``Recovery`` of the recipe; the learner restores its weights when it returns True).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from zerosiam.parts.contract import Evaluation


class EmaBelow:
    """SAR's model recovery: reset when the moving average of the second pass's loss falls below a floor.

    The tracked value is the mean objective (the entropy) over the samples the last evaluation kept;
    a step that kept none leaves the average unchanged. Returning True clears the average, so the next
    collapse is measured from the fresh model. (SAR's released code reassigns the old average right
    after resetting, so there it is not cleared; we follow the paper's description.)
    """

    def __init__(self, floor: float = 0.2, momentum: float = 0.9) -> None:  # methods.md: SAR code
        self.floor = floor
        self.momentum = momentum
        self.ema: float | list[float | None] | None = None  # one per stream for stacked streams

    def __call__(self, evaluations: list[Evaluation]) -> bool | Tensor:
        last = evaluations[-1]
        objective = last.terms.get("objective", math.nan)
        if torch.is_tensor(objective) and objective.ndim == 1:  # stacked streams: one per stream
            return self._per_stream(objective)
        value = float(objective)
        if last.selected and math.isfinite(value):
            self.ema = self._follow(self.ema, value)
        if self.ema is not None and self.ema < self.floor:
            self.ema = None
            return True
        return False

    def _follow(self, ema: float | None, value: float) -> float:
        return value if ema is None else self.momentum * ema + (1 - self.momentum) * value

    def _per_stream(self, objective: Tensor) -> Tensor:
        """Stacked streams: one average per stream (a stream that kept nothing has a NaN objective and
        leaves its own unchanged); the flags of the streams to reset."""
        values = objective.tolist()
        emas = self.ema if isinstance(self.ema, list) else [None] * len(values)
        emas = [e if not math.isfinite(v) else self._follow(e, v) for e, v in zip(emas, values, strict=True)]
        collapsed = [e is not None and e < self.floor for e in emas]
        self.ema = [None if c else e for e, c in zip(emas, collapsed, strict=True)]
        return torch.tensor(collapsed, device=objective.device)

    def reset(self) -> None:
        self.ema = None

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = state["ema"]


def ema_below(floor: float = 0.2) -> EmaBelow:  # methods.md: SAR, reset when ema < 0.2
    return EmaBelow(floor)
