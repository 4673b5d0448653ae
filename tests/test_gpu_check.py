"""``benchmarks/gpu_check.py`` runs, so that the script a GPU session is lent for cannot rot.

On the CPU with 128 images and a tiny timm model (the default models take minutes per method there);
the script's code path is the one a GPU run takes, through ``zerosiam.bench.runner.run``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("timm")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_and_prints_its_tables():
    command = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--images", "128",
               "--models", "test_efficientnet_gn", "--methods", "tent,zerosiam,sar",
               "--precisions", "fp32,bf16"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrote 128 JPEGs" in result.stdout
    for precision in ("fp32", "bf16"):
        assert f"test_efficientnet_gn, {precision}, 128 images, batch 64" in result.stdout
    assert result.stdout.count("| tent | ") == 2 and result.stdout.count("| zerosiam | ") == 2
