"""Model recovery: when to put a collapsing model back to its source weights.

SAR watches the loss of its reliable samples: entropy minimization that has collapsed to confident
nonsense drives that loss towards zero, so a moving average below a floor is read as collapse and the
learner is reset (the ``Recovery`` of the recipe; the learner restores its weights when it returns True).
"""

from __future__ import annotations

import math
from typing import Any

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
        self.ema: float | None = None

    def __call__(self, evaluations: list[Evaluation]) -> bool:
        last = evaluations[-1]
        value = float(last.terms.get("objective", math.nan))
        if last.selected and math.isfinite(value):
            self.ema = value if self.ema is None else self.momentum * self.ema + (1 - self.momentum) * value
        if self.ema is not None and self.ema < self.floor:
            self.ema = None
            return True
        return False

    def reset(self) -> None:
        self.ema = None

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = state["ema"]


def ema_below(floor: float = 0.2) -> EmaBelow:  # methods.md: SAR, reset when ema < 0.2
    return EmaBelow(floor)
