"""The language path computes what it computed before it moved onto the shared recipes.

Goldens written before the move (``tests/llm/goldens.py``): for every language method, on the tiny
random Llama, the generated token ids must be identical and the per-step losses agree to 1e-5 relative.
That bound is float32 rounding, not slack: on an AMD EPYC the same code moved losses of 2.3-4.4 by up
to 2.6e-6 (1.3e-6 relative, a few ulps) from the goldens written on another CPU, while any change to an
objective, a filter or an update moves them by far more.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.llm.goldens import GOLDENS, compute  # noqa: E402


@pytest.fixture(scope="module")
def now() -> dict:
    return compute()


@pytest.mark.parametrize("case", list(json.loads(GOLDENS.read_text())))
def test_tokens_and_losses_match_the_goldens(now, case):
    golden = json.loads(GOLDENS.read_text())[case]
    steps, expected = now[case]["steps"], golden["steps"]
    assert [s["tokens"] for s in steps] == [s["tokens"] for s in expected]
    assert [s["updated"] for s in steps] == [s["updated"] for s in expected]
    for mine, theirs in zip(steps, expected, strict=True):
        if theirs["loss"] is None:
            assert mine["loss"] is None
        else:
            assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5, abs=0)
