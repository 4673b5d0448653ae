"""``benchmarks/train_sources.py`` runs, so that the script the source models were trained with cannot rot.

On the CPU, one tiny architecture, 256 real training images and one epoch: the path a GPU run takes
(the probe, the epoch choice, ``zerosiam train-source`` in its own process, the export), minus the GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_train_sources_probes_then_trains_and_exports(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/train_sources.py", "--device", "cpu", "--archs", "tiny_gn",
               "--limit-train", "256", "--min-epochs", "1", "--budget-s", "1", "--probe-steps", "1",
               "--out", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tiny_gn: " in result.stdout and "ms/step while sharing → 1 epochs" in result.stdout
    sidecar = json.loads((tmp_path / "weights" / "tiny_gn.json").read_text())
    assert sidecar["epochs"] == 1 and sidecar["steps"] == 2 and sidecar["device"] == "cpu"
    assert "--epochs 1 --device cpu" in sidecar["command"]
