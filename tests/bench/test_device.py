"""Where a run computes and at what precision: the same loop on every device, nothing created elsewhere,
diagnostics read back in bulk, and neither the device nor the host-side details in a run's identity."""

from __future__ import annotations

import math

import pytest
import torch

import zerosiam
from tests.conftest import TinyGN
from tests.toys import DEVICES
from zerosiam.bench import runner
from zerosiam.bench.device import describe_device, resolve_device
from zerosiam.bench.runner import RunSpec

IMAGE_METHODS = [name for name, supported in zerosiam.available_methods().items() if "image" in supported]


def test_device_names_are_checked_in_one_line():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device 'gpu'; choose one of auto, cpu, cuda, cuda:N"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here"):
            resolve_device("cuda:0")
    assert describe_device(torch.device("cpu")) == {"device": "cpu"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", IMAGE_METHODS)
def test_every_method_adapts_on_the_models_device(device, method):
    torch.manual_seed(0)
    model = TinyGN().to(device)
    extras = {"clean_data": [torch.rand(4, 3, 8, 8, device=device)]} if method.startswith("eata") else {}
    adapter = zerosiam.adapt(model, method, **extras)
    for _ in range(3):
        logits = adapter(torch.rand(6, 3, 8, 8, device=device))
        assert logits.device.type == device and logits.dtype == torch.float32
    for tensor in [
        *adapter.model.parameters(),
        *(adapter.predictor.parameters() if adapter.predictor else []),
    ]:
        assert tensor.device.type == device
    for state in adapter.optimizer.state.values() if adapter.recipe.adapts else []:
        assert all(v.device.type == device for v in state.values() if torch.is_tensor(v) and v.ndim)
    assert all(isinstance(v, int | float | bool | str | type(None)) for v in adapter.last.values())


def test_diagnostics_stay_on_the_device_until_read_then_come_back_in_bulk():
    torch.manual_seed(0)
    adapter = zerosiam.adapt(TinyGN(), "zerosiam")
    for _ in range(3):
        adapter(torch.rand(6, 3, 8, 8))
    raw = adapter.log._rows
    assert torch.is_tensor(raw[0]["entropy"]) and torch.is_tensor(raw[2]["divergence"])  # not read yet
    history = adapter.history
    assert history is raw and all(isinstance(row["entropy"], float) for row in history)
    assert [row["selected"] for row in history] == [6, 6, 6] and all(
        row["updated"] is True for row in history
    )
    assert history[0]["divergence"] == pytest.approx(0.0, abs=1e-6) and history[2]["predictor_drift"] > 0


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_lower_precision_forward_keeps_losses_and_weights_in_float32(precision):
    torch.manual_seed(0)
    model = TinyGN()
    adapter = zerosiam.adapt(model, "zerosiam", precision=precision, lr=1e-2)
    logits = adapter(torch.rand(6, 3, 8, 8))
    assert logits.dtype == torch.float32 and model.gn.weight.dtype == torch.float32
    assert adapter.last["updated"] and math.isfinite(adapter.last["loss"])
    with pytest.raises(ValueError, match="unknown precision 'fp8'; choose one of fp32, tf32, bf16, fp16"):
        zerosiam.adapt(TinyGN(), "tent", precision="fp8")


def test_precision_and_model_options_are_part_of_a_runs_identity_and_the_device_is_not():
    spec = dict(
        model="resnet20", dataset="cifar10c", corruption="fog", severity=5, protocol="mild", method="tent"
    )
    base = RunSpec(**spec)
    assert base.run_id != RunSpec(**spec, precision="bf16").run_id
    assert base.run_id != RunSpec(**spec, model_options={"mean": 0.5}).run_id
    assert "device" not in base.as_dict()


@pytest.mark.parametrize("device", DEVICES)
def test_a_run_scores_the_same_on_every_device_path(fake_domains, tiny_model, device):
    spec = RunSpec(model="tiny", dataset="cifar10c", corruption="fog", severity=5, protocol="mild",
                   method="zerosiam", hparams={"lr": 1e-2})  # fmt: skip
    reference = runner.run(spec)
    result = runner.run(spec, device=device)
    assert result.metrics["accuracy"] == pytest.approx(reference.metrics["accuracy"], abs=0.05)
    assert result.env["device"].startswith(device) and len(result.curves["accuracy"]) == 1


def test_without_diagnostics_a_step_records_its_counts_only():
    torch.manual_seed(0)
    adapter = zerosiam.adapt(TinyGN(), "zerosiam", diagnostics=False)
    adapter(torch.rand(6, 3, 8, 8))
    assert set(adapter.last) == {"step", "selected", "updated", "skipped", "recovered"}
    assert adapter.last["updated"] is True and adapter.last["selected"] == 6
