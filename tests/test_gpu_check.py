"""``benchmarks/gpu_check.py`` runs, so that the script a GPU session is lent for cannot rot.

On the CPU with 64 images at batch 16 and a tiny timm model (the default models take minutes per method
there); the script's code path is the one a GPU run takes, through ``zerosiam.bench.runner.run``, beside the
plain loop written in the script.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch.autograd import DeviceType

pytest.importorskip("timm")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_and_prints_its_tables():
    command = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu",
               "--images", "64", "--batch-size", "16", "--models", "test_efficientnet_gn",
               "--methods", "tent,zerosiam,sar",
               "--precisions", "fp32,bf16"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrote 64 JPEGs" in result.stdout
    for precision in ("fp32", "bf16"):
        assert f"test_efficientnet_gn, {precision}, 64 images, batch 16" in result.stdout
    assert result.stdout.count("| tent | ") == 2 and result.stdout.count("| zerosiam | ") == 2


@pytest.mark.slow
def test_the_gpu_check_puts_the_plain_loop_the_speed_options_mfu_and_a_profile_beside_the_harness(tmp_path):
    """The rows a GPU window is lent for, at tiny size: the plain Tent loop, a speed option's row (compile
    is left out: compiling this model on the CPU takes minutes), MFU, the profile and the files."""
    command = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu",
               "--images", "64", "--batch-size", "16", "--models", "test_efficientnet_gn",
               "--methods", "tent,zerosiam", "--precisions", "fp32",
               "--options", "channels_last", "--option-methods", "zerosiam", "--profile",
               "--profile-steps", "2", "--out", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| speed ÷ plain loop | GFLOP/image | TFLOP/s | MFU |" in result.stdout
    for row in ("| tent | eager | ", "| tent (plain loop) | eager | ", "| zerosiam | channels_last | "):
        assert result.stdout.count(row) == 1, row
    assert "| backward (and zero_grad) |" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [(row["method"], row["speed"]) for row in rows] == [
        ("tent", "eager"), ("zerosiam", "eager"), ("tent (plain loop)", "eager"),
        ("zerosiam", "channels_last"),
    ]  # fmt: skip
    assert all(row["images_per_s"] > 0 for row in rows)
    assert "| forward |" in (tmp_path / "profile_test_efficientnet_gn_fp32.md").read_text()
    assert "| tent (plain loop) | eager | " in (tmp_path / "gpu_check.md").read_text()


def _event(key: str, device_type: DeviceType, host_us: float, device_us: float, self_us: float) -> Any:
    return SimpleNamespace(key=key, device_type=device_type, count=2, cpu_time_total=host_us,
                           device_time_total=device_us, self_device_time_total=self_us)  # fmt: skip


def test_the_profile_reads_a_range_from_the_host_not_from_its_span_on_the_device():
    """On a GPU the profiler lists a labelled range twice under one name: the host's range, and its span
    on the device's timeline (no host time). The summary reads the host's; the span counts nowhere."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    averages = [
        _event("forward", cpu, host_us=8000, device_us=6000, self_us=0),
        _event("forward + loss", cpu, host_us=9000, device_us=7000, self_us=0),
        _event("aten::mm", cpu, host_us=3000, device_us=10000, self_us=10000),
        _event("forward", cuda, host_us=0, device_us=30000, self_us=30000),
        _event("forward + loss", cuda, host_us=0, device_us=2000, self_us=2000),
    ]  # fmt: skip
    summary = gpu_check.profile_summary(averages, steps=2, wall=0.010)
    assert "| forward | 4.00 | 3.00 |" in summary
    assert "| loss (and the recipe's rules) | 0.50 | 0.50 |" in summary
    assert "device kernels busy 5.00 ms per step (50 % of the wall time)" in summary
