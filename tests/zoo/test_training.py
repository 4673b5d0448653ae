"""The GN/LN source models and their training loop: architectures, augmentation, schedule, bit-exact resume
after an exception or a real SIGKILL, and the sha256-verified weights files."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.toys import DEVICES
from zerosiam.parts.split import FeatureTap, find_head
from zerosiam.zoo.architectures import ARCHITECTURES
from zerosiam.zoo.trained import (
    TrainedWeightsMissingError,
    WeightsIntegrityError,
    build,
    load_trained,
    sidecar_path,
)
from zerosiam.zoo.training import (
    CHECKPOINT_NAME,
    LOG_NAME,
    TrainConfig,
    augment,
    epoch_plan,
    evaluate,
    load_checkpoint_model,
    lr_at,
    read_log,
    recipe_config,
    train,
)

ROOT = Path(__file__).resolve().parents[2]
EXPECTED_NORM = {"resnet26_gn": nn.GroupNorm, "vit_tiny_ln": nn.LayerNorm, "convnext_nano_ln": nn.LayerNorm}
_OTHER_NORMS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)


# ---------------------------------------------------------------------------------------------- architectures
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_architecture_maps_images_to_logits_through_a_findable_head(name: str) -> None:
    torch.manual_seed(0)
    model = build(name).eval()
    x = torch.rand(2, 3, 32, 32)
    tap = FeatureTap(model)  # fails unless the head found by name produces the model's output itself
    logits, feature = tap.forward(x)
    assert logits.shape == (2, 10)
    assert torch.isfinite(logits).all()
    head = find_head(model)
    assert isinstance(head, nn.Linear) and head.out_features == 10
    assert head is getattr(model.wrapped_model, "head", None) or head is getattr(
        model.wrapped_model, "fc", None
    )
    assert feature.shape == (2, head.in_features)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_architecture_uses_only_its_norm_type(name: str) -> None:
    modules = list(build(name).modules())
    norms = [m for m in modules if isinstance(m, nn.GroupNorm | nn.LayerNorm)]
    assert norms and all(isinstance(m, EXPECTED_NORM[name]) for m in norms)
    assert not any(isinstance(m, _OTHER_NORMS) for m in modules)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_architecture_is_small(name: str) -> None:
    parameters = sum(p.numel() for p in build(name).parameters())
    assert 2e5 < parameters < 3e6  # a few MB of float32: trainable on a 2-core CPU


def test_normalization_is_inside_the_model() -> None:
    torch.manual_seed(0)
    model = build("tiny_gn").eval()
    x = torch.rand(2, 3, 32, 32)
    mean, std = torch.tensor([0.4914, 0.4822, 0.4465]), torch.tensor([0.2470, 0.2435, 0.2616])
    expected = model.wrapped_model((x - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1))
    torch.testing.assert_close(model(x), expected)


# ---------------------------------------------------------------------------------------------- augmentation
def _hand_made(n: int = 1) -> torch.Tensor:
    """Images whose pixel (r, c, k) holds a value unique within the image (never 0, the padding value)."""
    r, c, k = torch.meshgrid(torch.arange(32), torch.arange(32), torch.arange(3), indexing="ij")
    image = (1 + (r * 7 + c * 3 + k * 80) % 250).to(torch.uint8)
    return image.expand(n, 32, 32, 3).clone()


def test_centre_offset_without_flip_is_the_identity() -> None:
    image = _hand_made()
    out = augment(image, torch.tensor([[4, 4]]), torch.tensor([False]))
    assert torch.equal(out, image)


def test_crop_shifts_and_pads_with_zeros() -> None:
    image = _hand_made(2)
    out = augment(image, torch.tensor([[0, 0], [8, 6]]), torch.tensor([False, False]))
    # offset (0, 0): the image moves 4 pixels down and right; the top rows / left columns are padding
    assert torch.equal(out[0, 4:, 4:], image[0, :28, :28])
    assert (out[0, :4] == 0).all() and (out[0, :, :4] == 0).all()
    # offset (8, 6): 4 pixels up and 2 left; padding at the bottom and the right
    assert torch.equal(out[1, :28, :30], image[1, 4:, 2:])
    assert (out[1, 28:] == 0).all() and (out[1, :, 30:] == 0).all()


def test_flip_mirrors_left_right_after_the_crop() -> None:
    image = _hand_made(2)
    out = augment(image, torch.tensor([[4, 4], [4, 0]]), torch.tensor([True, True]))
    assert torch.equal(out[0], image[0].flip(1))
    shifted = augment(image[1:], torch.tensor([[4, 0]]), torch.tensor([False]))
    assert torch.equal(out[1], shifted[0].flip(1))


def test_epoch_plan_is_a_function_of_seed_and_epoch() -> None:
    a, b = epoch_plan(3, 5, 1000), epoch_plan(3, 5, 1000)
    assert (
        torch.equal(a.order, b.order) and torch.equal(a.offsets, b.offsets) and torch.equal(a.flips, b.flips)
    )
    assert torch.equal(a.order.sort().values, torch.arange(1000))
    assert a.offsets.min() == 0 and a.offsets.max() == 8
    assert 400 < int(a.flips.sum()) < 600
    assert not torch.equal(a.order, epoch_plan(3, 6, 1000).order)
    assert not torch.equal(a.order, epoch_plan(4, 5, 1000).order)


def test_learning_rate_warms_up_then_anneals_to_zero() -> None:
    rates = [lr_at(s, 100, 0.1, 0.1) for s in range(100)]
    assert rates[0] == pytest.approx(0.01) and rates[9] == pytest.approx(0.1)
    assert all(later <= earlier for earlier, later in zip(rates[9:], rates[10:], strict=False))
    assert rates[-1] < 1e-4


# ---------------------------------------------------------------------------------------------- resume
N_IMAGES, BATCH, CHECKPOINT_EVERY = 256, 32, 3  # 8 steps per epoch, 2 epochs = 16 steps


def _data(n: int = N_IMAGES, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=generator)
    images = torch.randint(0, 256, (n, 32, 32, 3), generator=generator, dtype=torch.uint8)
    images[..., 0] = (labels * 25).to(torch.uint8)[:, None, None]  # learnable: red channel encodes the class
    return images, labels


def _config(**changes: object) -> TrainConfig:
    base = recipe_config(
        "tiny_gn",
        epochs=2,
        batch_size=BATCH,
        checkpoint_every=CHECKPOINT_EVERY,
        log_every=2,
        threads=1,
        seed=7,
    )
    return dataclasses.replace(base, **changes)


def _run(out: Path, callback: object = None) -> object:
    return train(_config(), _data(), out, test_set=_data(64, seed=1), progress_bar=False, callback=callback)


class Killed(RuntimeError):
    pass


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    _run(out)
    return out


def _assert_same_run(a: Path, b: Path) -> None:
    weights_a, _ = load_checkpoint_model(a / CHECKPOINT_NAME)
    weights_b, _ = load_checkpoint_model(b / CHECKPOINT_NAME)
    state_a, state_b = weights_a.state_dict(), weights_b.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)  # bit for bit
    assert read_log(a / LOG_NAME, drop_wall_clock=True) == read_log(b / LOG_NAME, drop_wall_clock=True)
    sidecar_a = json.loads(sidecar_path(a / "tiny_gn.safetensors").read_text())
    sidecar_b = json.loads(sidecar_path(b / "tiny_gn.safetensors").read_text())
    assert sidecar_a["sha256"] == sidecar_b["sha256"]
    assert sidecar_a["test_accuracy"] == sidecar_b["test_accuracy"]


def test_uninterrupted_run_learns_and_logs(uninterrupted: Path) -> None:
    records = read_log(uninterrupted / LOG_NAME)
    epochs = [r for r in records if r["kind"] == "epoch"]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    assert [r["global_step"] for r in steps] == list(range(2, 17, 2))
    assert epochs[1]["train_loss"] < epochs[0]["train_loss"]
    sidecar = json.loads(sidecar_path(uninterrupted / "tiny_gn.safetensors").read_text())
    assert sidecar["epochs"] == 2 and sidecar["seed"] == 7 and sidecar["steps"] == 16
    assert sidecar["test_accuracy"] == epochs[1]["test_acc"]


def test_resume_after_an_exception_reproduces_the_uninterrupted_run(
    uninterrupted: Path, tmp_path: Path
) -> None:
    def die_at_step_five(progress: object) -> None:
        if progress.global_step == 5:  # checkpoint at 3; steps 4 and 5 (and their log line) must be redone
            raise Killed

    with pytest.raises(Killed):
        _run(tmp_path, die_at_step_five)
    seen: list[int] = []
    _run(tmp_path, lambda progress: seen.append(progress.global_step))
    assert seen[0] == 4 and seen[-1] == 16  # it resumed from the checkpoint rather than starting over
    _assert_same_run(uninterrupted, tmp_path)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
@pytest.mark.slow
def test_resume_after_sigkill_reproduces_the_uninterrupted_run(uninterrupted: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.zoo.test_training import _run
        from pathlib import Path

        def kill_at_step_eleven(progress):
            if progress.global_step == 11:  # in epoch 2, after the checkpoint of step 9
                os.kill(os.getpid(), signal.SIGKILL)

        _run(Path({str(tmp_path)!r}), kill_at_step_eleven)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert not (tmp_path / "tiny_gn.safetensors").exists()
    assert len(read_log(tmp_path / LOG_NAME)) == 6  # 5 step records + epoch 0; one more than at step 9
    seen: list[int] = []
    _run(tmp_path, lambda progress: seen.append(progress.global_step))
    assert seen[0] == 10
    _assert_same_run(uninterrupted, tmp_path)


def test_resume_refuses_another_configuration_or_other_data(uninterrupted: Path) -> None:
    with pytest.raises(ValueError, match="another configuration"):
        train(_config(lr=0.5), _data(), uninterrupted, progress_bar=False)
    images, labels = _data()
    with pytest.raises(ValueError, match="training data"):
        train(_config(), (images, labels.roll(1)), uninterrupted, progress_bar=False)


def test_resume_may_change_threads_or_device(uninterrupted: Path) -> None:
    """Where a run computes is not part of what it computes: a GPU run may be finished on the CPU."""
    result = train(_config(threads=2, device="cpu:0"), _data(), uninterrupted, progress_bar=False)
    assert result.progress.global_step == 16


@pytest.mark.parametrize("device", DEVICES)
def test_training_runs_on_the_device_and_exports_cpu_weights(device: str, tmp_path: Path) -> None:
    config = _config(epochs=1, device=device, checkpoint_every=0)
    result = train(config, _data(), tmp_path, test_set=_data(64, seed=1), progress_bar=False)
    assert result.progress.global_step == 8 and result.test_accuracy is not None
    assert all(p.device.type == "cpu" for p in result.model.parameters())
    sidecar = json.loads(sidecar_path(result.weights).read_text())
    assert sidecar["config"]["device"] == device
    assert (sidecar["device"] == "cpu") == (device == "cpu")


def test_finished_run_only_re_exports(uninterrupted: Path) -> None:
    seen: list[int] = []
    result = train(_config(), _data(), uninterrupted, progress_bar=False, callback=lambda p: seen.append(1))
    assert seen == [] and result.progress.global_step == 16


# ---------------------------------------------------------------------------------------------- weights
def test_load_trained_verifies_sha256(uninterrupted: Path, tmp_path: Path) -> None:
    weights = uninterrupted / "tiny_gn.safetensors"
    model = load_trained("tiny_gn", weights)
    trained, _ = load_checkpoint_model(uninterrupted / CHECKPOINT_NAME)
    images, labels = _data(64, seed=1)
    assert evaluate(model, images, labels) == evaluate(trained, images, labels)
    tampered = tmp_path / "tiny_gn.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    tampered.write_bytes(bytes(blob))
    sidecar_path(tampered).write_text(sidecar_path(weights).read_text())
    with pytest.raises(WeightsIntegrityError, match="sha256"):
        load_trained("tiny_gn", tampered)
    with pytest.raises(WeightsIntegrityError, match="architecture"):
        load_trained("resnet26_gn", weights)


def test_missing_weights_say_how_to_train(tmp_path: Path) -> None:
    with pytest.raises(TrainedWeightsMissingError, match="zerosiam train-source --arch vit_tiny_ln"):
        load_trained("vit_tiny_ln", tmp_path / "vit_tiny_ln.safetensors")


def test_cli_registers_train_source_with_the_recipe_defaults() -> None:
    from zerosiam.cli import build_parser
    from zerosiam.cli.train_source import config_from_args

    args = build_parser().parse_args(
        ["train-source", "--arch", "vit_tiny_ln", "--epochs", "3", "--seed", "2"]
    )
    config = config_from_args(args)
    assert config.optimizer == "adamw" and config.epochs == 3 and config.seed == 2
    assert config.lr == recipe_config("vit_tiny_ln").lr
