"""The image Adapter computes what it computed before its modes were taken apart.

Goldens written before the change (``tests/methods/goldens.py``): for every method on two real source
models and real corrupted streams, single and three stacked, the predicted classes must be identical at
every step, after adapting (frozen) and after ``reset()``; logit sums and every diagnostic must agree to
1e-5 relative. That bound is float32 rounding across CPUs, not slack: on the machine that wrote them the
digests (every logit's bytes) are reproduced exactly (``python -m tests.methods.goldens --compare``).
"""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import needs_assets
from tests.methods.goldens import GOLDENS, compute

pytestmark = [needs_assets(), pytest.mark.slow]


@pytest.fixture(scope="module")
def recomputed() -> dict:
    return compute()


def _close(expected, actual, where: str) -> None:
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            _close(e, a, f"{where}[{i}]")
    elif isinstance(expected, float) and not isinstance(actual, bool):
        assert actual is not None and math.isclose(expected, actual, rel_tol=1e-5, abs_tol=1e-5), where
    else:
        assert expected == actual, where


@pytest.mark.parametrize("case", sorted(json.loads(GOLDENS.read_text())))
def test_the_adapter_reproduces_its_goldens(recomputed, case):
    expected, actual = json.loads(GOLDENS.read_text())[case], recomputed[case]
    for step, (e, a) in enumerate(zip(expected["steps"], actual["steps"], strict=True)):
        assert e["classes"] == a["classes"], f"{case}: step {step}'s predictions changed"
        _close(e["logits_sum"], a["logits_sum"], f"{case}: step {step}'s logits")
        assert sorted(e["history"]) == sorted(a["history"]), f"{case}: step {step}'s diagnostics"
        for key, value in e["history"].items():
            _close(value, a["history"][key], f"{case}: step {step}'s {key}")
    for when in ("frozen", "after_reset"):
        assert expected[when]["classes"] == actual[when]["classes"], f"{case}: {when}"
        _close(expected[when]["logits_sum"], actual[when]["logits_sum"], f"{case}: {when}")
