"""The package's layers (docs/ARCHITECTURE.md): imports point down, and a layer loads nothing above it.

``lint-imports`` checks the layers contract of pyproject.toml over every import, ``TYPE_CHECKING`` ones
included; the README's test command runs it, and so does this test, so that ``pytest`` alone catches a
wrong dependency too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter is not installed")
def test_the_layers_contract_holds():
    result = subprocess.run(["lint-imports"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize(
    ("layer", "above"),
    [
        ("zerosiam.parts", ("zerosiam.methods", "zerosiam.llm", "zerosiam.bench", "zerosiam.zoo")),
        ("zerosiam.assets", ("zerosiam.data", "zerosiam.parts", "zerosiam.corruptions", "zerosiam.methods")),
        ("zerosiam.protocols", ("zerosiam.bench", "zerosiam.methods", "zerosiam.corruptions")),
    ],
)
def test_importing_a_layer_loads_nothing_above_it(layer, above):
    code = f"import sys, {layer}; print(sorted(m for m in sys.modules if m.startswith({above!r})))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
