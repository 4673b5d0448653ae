"""What each numeric option of ``adapt`` may be, checked before anything is built.

A learning rate of NaN, a negative one or a string read from a config file does not fail where it is
given: SGD takes it, and the first step writes NaN into the weights, or the run adapts with a rate nobody
chose. So every numeric option is checked by its name, for every method alike, when ``adapt`` is called:
the right type (a whole number where one is counted), finite, in its range. The rules live in one table,
``NUMBERS``; an option a recipe gains with a numeric type must get a rule there
(``tests/methods/test_misuse.py`` checks that every method's numeric options have one).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["NUMBERS", "Number", "check_numbers"]


@dataclass(frozen=True)
class Number:
    """A finite number (an integer when ``whole``) from ``low`` (excluded when ``above``) to ``high``
    (excluded when ``below``); None too where ``default`` says what None means."""

    low: float
    above: bool = False
    high: float = math.inf
    below: bool = False
    whole: bool = False
    default: str | None = None  # what None stands for; None: None is not allowed

    @property
    def allowed(self) -> str:
        """The rule in words, e.g. ``a finite number ≥ 0, or None (the paper's rate for the model)``."""
        if self.whole and self.low == 1 and not self.above and not math.isfinite(self.high):
            return "a positive integer"  # a count: batch size, streams
        kind = "an integer" if self.whole else "a finite number"
        lower = f"{'>' if self.above else '≥'} {self.low:g}"
        upper = f" and {'<' if self.below else '≤'} {self.high:g}" if math.isfinite(self.high) else ""
        none = f", or None ({self.default})" if self.default is not None else ""
        return f"{kind} {lower}{upper}{none}"

    def takes_type(self, value: Any) -> bool:
        """Whether ``value`` is of a type the option takes (a bool is not a number here: ``lr=True`` is a
        mistake, not 1.0)."""
        if value is None:
            return self.default is not None
        kind = numbers.Integral if self.whole else numbers.Real
        return isinstance(value, kind) and not isinstance(value, bool)

    def takes_value(self, value: float | None) -> bool:
        if value is None:
            return True
        if not math.isfinite(value):
            return False
        low_ok = value > self.low if self.above else value >= self.low
        high_ok = value < self.high if self.below else value <= self.high
        return low_ok and high_ok


_PAPERS_RATE = "the paper's rate for the model and batch size"

NUMBERS: dict[str, Number] = {
    # 0 is allowed: the study's BatchNorm control, which moves no weight and only normalizes by the batch.
    "lr": Number(0.0, default=_PAPERS_RATE),
    "predictor_lr": Number(0.0, default=_PAPERS_RATE),
    "lr_scale": Number(0.0, above=True),
    # SGD's momentum: at 1 the velocity never forgets a gradient and the step grows without bound.
    "momentum": Number(0.0, high=1.0, below=True),
    "batch_size": Number(1, whole=True),
    "streams": Number(1, whole=True),
    "alpha": Number(0.0),  # ZeroSiam's alignment weight; 0 is the ablation without alignment
}


def check_numbers(options: Mapping[str, Any]) -> None:
    """Refuse, in one line naming the option, its value and what is allowed, the first numeric option
    of ``options`` that breaks its rule in ``NUMBERS``; options without a rule are not numbers."""
    for name, value in options.items():
        rule = NUMBERS.get(name)
        if rule is None:
            continue
        if not rule.takes_type(value):
            raise TypeError(f"{name}={value!r} is a {type(value).__name__}: {name} must be {rule.allowed}")
        if not rule.takes_value(value):
            raise ValueError(f"{name}={value!r} is not allowed: {name} must be {rule.allowed}")
