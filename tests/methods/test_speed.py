"""The speed options (``zerosiam.methods.speed``) change how fast a step runs, not what it computes.

Each option the CPU supports runs beside the eager path on the project's ResNet-26-GN (shipped weights)
over real corrupted CIFAR-10 batches (``tests/methods/goldens.py``'s stream), for Tent and for ZeroSiam
(whose online branch reads the feature through a hook on the head): every step's predicted classes must
be the same, its logits and losses equal to float rounding, and every step must update alike. The
issue's bar (a 10,000-image stream: accuracy within 0.1 point, the same number of updates) is
``benchmarks/speed_equivalence.py``, too long for a unit test. ``compile`` needs a C++ compiler on the
CPU (TorchInductor writes C++) and a minute or two to compile cold, so it is a slow test.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import replace

import pytest
import torch

import zerosiam
from tests.conftest import TinyGN, needs_assets
from zerosiam.methods.speed import Speed

STEPS = 4
# float32 rounding of a reordered reduction (a fused or channels-last kernel), over STEPS updates
LOGIT_TOLERANCE, LOSS_TOLERANCE = 1e-3, 1e-4
HAS_COMPILER = any(shutil.which(name) for name in ("g++", "c++", "clang++"))


def _steps(method: str, speed: Speed) -> tuple[torch.Tensor, list[dict]]:
    """Every step's logits and record, adapting the zoo's ResNet-26-GN on the real stream."""
    from tests.methods import goldens

    torch.manual_seed(0)
    model = zerosiam.load_model("resnet26_gn")
    adapter = zerosiam.adapt(
        model, method, batch_size=goldens.PER_STEP, lr_scale=10.0, compile=speed.compile,
        channels_last=speed.channels_last,
    )  # fmt: skip
    batches = goldens.stream("gaussian_noise")[:STEPS]
    logits = torch.stack([adapter(x).detach() for x in batches])
    history = adapter.history
    adapter.release()
    return logits, history


def _assert_equivalent(method: str, speed: Speed) -> None:
    eager_logits, eager_history = _steps(method, Speed())
    logits, history = _steps(method, speed)
    assert torch.equal(logits.argmax(-1), eager_logits.argmax(-1))
    assert (logits - eager_logits).abs().max() <= LOGIT_TOLERANCE
    assert [row["updated"] for row in history] == [row["updated"] for row in eager_history]
    for row, eager in zip(history, eager_history, strict=True):
        assert row["loss"] == pytest.approx(eager["loss"], abs=LOSS_TOLERANCE)


@needs_assets()
@pytest.mark.parametrize("method", ["tent", "zerosiam"])
def test_channels_last_predicts_what_the_eager_path_predicts(method):
    _assert_equivalent(method, Speed(channels_last=True))


@needs_assets()
@pytest.mark.slow
@pytest.mark.skipif(not HAS_COMPILER, reason="torch.compile on the CPU needs a C++ compiler")
def test_compile_predicts_what_the_eager_path_predicts():
    """ZeroSiam: the head's feature hook is traced into the compiled graph, and the backward through the
    feature must reach the norms as the eager one does."""
    _assert_equivalent("zerosiam", Speed(compile=True))


def test_options_off_leave_the_model_as_it_is(tiny_gn: TinyGN):
    adapter = zerosiam.adapt(tiny_gn, "zerosiam", lr=1e-3, predictor_lr=1e-3)
    assert "forward" not in vars(tiny_gn) and not tiny_gn._forward_pre_hooks
    assert "release" not in vars(adapter)  # the class's own release
    assert tiny_gn.conv.weight.is_contiguous()


def test_channels_last_is_taken_off_by_release(tiny_gn: TinyGN, images):
    before = tiny_gn(images)
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=0.0, channels_last=True)
    assert tiny_gn.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not tiny_gn.conv.weight.is_contiguous()
    seen = []
    tiny_gn.conv.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    adapter(images)
    assert seen[0].is_contiguous(memory_format=torch.channels_last) and not seen[0].is_contiguous()
    assert adapter.release() is tiny_gn
    assert tiny_gn.conv.weight.is_contiguous() and not tiny_gn._forward_pre_hooks
    torch.testing.assert_close(tiny_gn(images), before)


def test_compile_is_taken_off_by_release(tiny_gn: TinyGN):
    """Compiling is lazy: nothing is compiled until a forward, so this costs nothing."""
    adapter = zerosiam.adapt(tiny_gn, "noadapt", compile="reduce-overhead")
    assert "forward" in vars(tiny_gn)
    adapter.release()
    assert "forward" not in vars(tiny_gn)


def test_an_unknown_compile_mode_is_refused_before_any_work(tiny_gn: TinyGN):
    with pytest.raises(ValueError, match="torch.compile mode"):
        zerosiam.adapt(tiny_gn, "tent", compile="fastest")
    assert "forward" not in vars(tiny_gn)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.script is deprecated
def test_a_torchscript_model_is_refused_and_handed_back(tiny_gn: TinyGN, images):
    scripted = torch.jit.script(tiny_gn)
    with pytest.raises(ValueError, match="TorchScript"):
        zerosiam.adapt(scripted, "noadapt", channels_last=True)
    assert zerosiam.adapt(scripted, "noadapt")(images).shape == (len(images), 5)


@pytest.mark.parametrize(
    ("speed", "label"),
    [
        (Speed(), "eager"),
        (Speed(channels_last=True), "channels_last"),
        (Speed(compile=True), "compile"),
        (Speed("reduce-overhead", True), "compile:reduce-overhead+channels_last"),
    ],
)
def test_a_label_names_the_options_and_reads_back(speed: Speed, label: str):
    assert speed.label == label and Speed.parse(label) == speed
    assert Speed("default") == Speed(True)


def test_an_unknown_label_is_refused():
    with pytest.raises(ValueError, match="unknown speed option 'fast'"):
        Speed.parse("compile+fast")


def test_the_bench_carries_the_options_to_its_workers(monkeypatch):
    """``zerosiam bench --compile --channels-last`` sets ``Execution``; every backend hands it to the
    workers with their tasks, and the worker its speed and watch to the runner."""
    from zerosiam.bench import tasks
    from zerosiam.cli import bench as command

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--compile", "--channels-last"])
    execution = command._execution(args)
    assert execution.speed == Speed(True, True)
    assert command._execution(parser.parse_args(["bench"])).speed == Speed()
    heard = []

    def run_stacked(specs, **options):
        heard.append((options["speed"], options["watch"]))
        return []

    monkeypatch.setattr(tasks, "run_stacked", run_stacked)
    threads = torch.get_num_threads()
    tasks.run_task([], replace(execution, threads=threads, watch=True))
    tasks.run_task([], tasks.Execution(threads=threads))
    assert heard == [(Speed(True, True), True), (Speed(), False)]


def test_an_unknown_compile_mode_on_the_command_line_is_a_usage_error():
    from zerosiam.cli import bench as command
    from zerosiam.cli._errors import UsageError

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    with pytest.raises(UsageError, match="--compile"):
        command._execution(parser.parse_args(["bench", "--compile", "fastest"]))


@pytest.mark.parametrize("method", ["tent", "zerosiam"])
def test_frozen_bf16_gives_the_bf16_forwards_predictions_to_the_bit(tiny_gn: TinyGN, images, method):
    """Autocast casts a frozen float32 weight to bfloat16 at every forward; stored in bfloat16 once, the
    forward sees the same values, so every step predicts and adapts alike."""
    start = {k: v.clone() for k, v in tiny_gn.state_dict().items()}

    def predictions(**options) -> torch.Tensor:
        tiny_gn.load_state_dict(start)
        adapter = zerosiam.adapt(tiny_gn, method, lr=0.5, predictor_lr=0.5, precision="bf16", **options)
        steps = torch.stack([adapter(images + 0.1 * step).detach() for step in range(3)])
        if options:
            assert tiny_gn.conv.weight.dtype == torch.bfloat16 and tiny_gn.gn.weight.dtype == torch.float32
        adapter.release()
        assert tiny_gn.conv.weight.dtype == torch.float32 and tiny_gn.fc.bias.dtype == torch.float32
        return steps

    assert torch.equal(predictions(frozen_bf16=True), predictions())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"method": "tent", "frozen_bf16": True}, "precision is fp32"),
        ({"method": "deyo", "frozen_bf16": True, "precision": "bf16"}, "frozen_bf16 does not take deyo"),
        ({"method": "tent", "attention": "fastest"}, "unknown attention backend 'fastest'"),
    ],
)
def test_what_the_forward_options_cannot_do_is_refused_in_one_line(tiny_gn: TinyGN, options, message):
    options = dict(options)
    with pytest.raises(ValueError, match=message):
        zerosiam.adapt(tiny_gn, options.pop("method"), lr=0.1, **options)
    assert tiny_gn.conv.weight.dtype == torch.float32 and "forward" not in vars(tiny_gn)
    zerosiam.adapt(tiny_gn, "tent", lr=0.1).release()  # handed back: no longer held


def test_attention_runs_every_forward_on_the_backend_named():
    """A transformer's attention under ``attention:math`` computes what ``sdpa_kernel(MATH)`` computes,
    bit for bit, and ``release`` takes the choice off."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, norm_first=True, dropout=0.0)
    model = torch.nn.Sequential(layer, torch.nn.Flatten(), torch.nn.Linear(16 * 4, 3)).eval()
    x = torch.rand(5, 4, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        expected = model(x)
    adapter = zerosiam.adapt(model, "noadapt", attention="math")
    assert torch.equal(adapter(x), expected)
    adapter.release()
    assert "forward" not in vars(model)


@pytest.mark.parametrize(
    ("speed", "label"),
    [(Speed(attention="math"), "attention:math"), (Speed(frozen_bf16=True), "frozen_bf16")],
)
def test_the_forward_options_have_labels_that_read_back(speed: Speed, label: str):
    assert speed.label == label and Speed.parse(label) == speed and not speed.eager
