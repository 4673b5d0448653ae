"""Relay: one method adapts for the first batches of a stream, then another takes the adapted model over.

The paper's appendix "saving a collapsed model" runs Tent on an imbalanced stream until it has collapsed
and then lets ZeroSiam, with a randomly initialised predictor, adapt the collapsed weights. A relay is
that hand-over: it behaves like one ``Adapter`` (call it on each batch; ``steps``, ``history`` and
``predict`` span both legs) and builds the second adapter only when the first has taken its steps, so
the second starts from the weights the first left, not from the source model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from zerosiam.methods.adapter import Adapter


class Relay:
    """``first`` adapts for ``steps`` batches; then ``then(model)`` builds the adapter for the rest."""

    def __init__(self, first: Adapter, steps: int, then: Callable[[nn.Module], Adapter]) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"a relay hands over after a positive whole number of steps, got {steps!r}")
        self.first = first
        self.handover = steps
        self._then = then
        self.second: Adapter | None = None

    @property
    def current(self) -> Adapter:
        """The adapter that takes the next batch."""
        return self.first if self.second is None else self.second

    def __call__(self, x: Tensor) -> Tensor:
        """The prediction for ``x``, then one adaptation step, by whichever leg's turn it is."""
        if self.second is None and self.first.steps >= self.handover:
            self.second = self._then(self.first.release(keep_adapted=True))
        return self.current(x)

    def predict(self, x: Tensor) -> Tensor:
        return self.current.predict(x)

    @property
    def steps(self) -> int:
        return self.first.steps + (0 if self.second is None else self.second.steps)

    @property
    def history(self) -> list[dict[str, Any]]:
        """Both legs' per-step diagnostics, in stream order."""
        return self.first.history + ([] if self.second is None else self.second.history)
