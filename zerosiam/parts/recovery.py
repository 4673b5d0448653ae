"""Model recovery: when to put a collapsing model back to its source weights.

SAR watches the loss of its reliable samples: entropy minimization that has collapsed to confident
nonsense drives that loss towards zero, so a moving average below a floor is read as collapse and the
learner is reset (the ``Recovery`` of the recipe: it returns per-stream flags, and the learner restores
the flagged streams' weights).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from zerosiam.parts.contract import Evaluation
from zerosiam.parts.hostsync import kept_in_place, none_yet


class EmaBelow:
    """SAR's model recovery: reset when the moving average of the second pass's loss falls below a floor.

    The tracked value is the mean objective (the entropy) over the samples the last evaluation kept;
    a step that kept none leaves the average unchanged. Returning True clears the average, so the next
    collapse is measured from the fresh model. (SAR's released code reassigns the old average right
    after resetting, so there it is not cleared; we follow the paper's description.)
    """

    state_in_place = True  # a captured step can replay it (``zerosiam.parts.hostsync.kept_in_place``)

    def __init__(self, floor: float = 0.2, momentum: float = 0.9) -> None:  # methods.md: SAR code
        self.floor = floor
        self.momentum = momentum
        # a list of one per stream when stacked; a tensor (NaN: none yet) on the fixed-shape path
        self.ema: float | list[float | None] | Tensor | None = None

    def __call__(self, evaluations: list[Evaluation]) -> Tensor:
        """Per-stream flags of the streams to reset (the objective is a per-stream value: a stream that
        kept no sample has a NaN one and leaves its average unchanged)."""
        objective = evaluations[-1].terms.get("objective")
        if objective is None:  # a recipe whose evaluation reports no objective never collapses by it
            return torch.tensor(False)
        batch = evaluations[-1].batch
        if batch is not None and not batch.layout.reads_device:
            return self._follow_on_device(objective)
        values = objective.reshape(-1).tolist()
        emas = self.ema if isinstance(self.ema, list) else [self.ema] * len(values)
        emas = [e if not math.isfinite(v) else self._follow(e, v) for e, v in zip(emas, values, strict=True)]
        collapsed = [e is not None and e < self.floor for e in emas]
        emas = [None if c else e for e, c in zip(emas, collapsed, strict=True)]
        self.ema = emas if objective.ndim else emas[0]
        return torch.tensor(collapsed, device=objective.device).view(objective.shape)

    def _follow(self, ema: float | None, value: float) -> float:
        return value if ema is None else self.momentum * ema + (1 - self.momentum) * value

    def _follow_on_device(self, objective: Tensor) -> Tensor:
        """``__call__`` on the fixed-shape path: the averages kept on the device in float64, the host's
        float, so that they round as the host's do and fire at the same step; NaN for none yet."""
        value = objective.detach().double()
        ema = self.ema if isinstance(self.ema, Tensor) else torch.full_like(value, math.nan)
        followed = torch.where(ema.isnan(), value, self.momentum * ema + (1 - self.momentum) * value)
        ema = torch.where(value.isfinite(), followed, ema)
        collapsed = ema < self.floor  # False where NaN: no average yet
        self.ema = kept_in_place(self.ema, torch.where(collapsed, math.nan, ema))
        return collapsed

    def first_fire(self, objectives: Iterable[float]) -> int | None:
        """The step (counted from 1) at which this rule, fresh, would first fire on one stream's
        ``objectives``, a value a step as ``__call__`` reads it (NaN: no sample kept); None if never.
        Until a reset fires a run is the same with the rule or without it, so this says, from a run
        made without it, whether a run with it would have differed at all."""
        ema = None
        for step, value in enumerate(objectives, start=1):
            if math.isfinite(value):
                ema = self._follow(ema, value)
                if ema < self.floor:
                    return step
        return None

    def reset(self) -> None:
        self.ema = none_yet(self.ema)

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema.clone() if isinstance(self.ema, Tensor) else self.ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["ema"]
        if saved is None:
            self.ema = none_yet(self.ema)
        else:
            self.ema = kept_in_place(self.ema, saved.clone() if isinstance(saved, Tensor) else saved)


def ema_below(floor: float = 0.2) -> EmaBelow:  # methods.md: SAR, reset when ema < 0.2
    return EmaBelow(floor)
