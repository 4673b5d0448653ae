"""The fixed-shape step (``fixed_shape=True``): no read of the device mid-step, and the eager step's results.

A step that a CUDA graph can capture decides nothing on the host. ``no_host_sync`` refuses every read on
any device, so the step of every method is checked here on a CPU: lone and stacked, the step runs
through without one, and adapts as the eager step does (to the bit on these batches, where a filtered
mean of a few samples rounds alike either way; the bar is float rounding).
"""

from __future__ import annotations

import copy

import pytest
import torch

import zerosiam
from tests.methods.test_streams import METHODS, STREAMS, _streams_of_batches
from zerosiam.methods.speed import Speed
from zerosiam.parts.hostsync import HostSyncError, no_host_sync
from zerosiam.parts.learner import NON_FINITE
from zerosiam.parts.recovery import ema_below
from zerosiam.parts.selection import entropy_below, plpd_above

ADAPTING = [(method, options) for method, options in METHODS if method != "noadapt"]


def _run(model, method, options, fixed: bool, streams: int = 1, audited: bool = False):
    """Every step's prediction and the record, over the streams' batches (the last steps under the audit)."""
    adapter = zerosiam.adapt(
        model, method, lr=0.5, predictor_lr=0.5, streams=streams, fixed_shape=fixed, **options
    )
    predictions = []
    for step, batch in enumerate(_streams_of_batches(per_stream=4)):
        x = batch[:streams].flatten(0, 1)
        if audited and step >= 3:
            with no_host_sync():
                prediction, _, record = adapter._step(x)
            adapter.log.add(prediction, adapter.predictor, record)
        else:
            prediction = adapter(x)
        predictions.append(prediction.detach())
    history = adapter.history
    adapter.release()
    return torch.stack(predictions), history


def test_the_audit_finds_the_eager_steps_reads(confident_gn):
    """The eager step asks the device whether its gradients are finite: the audit must say so."""
    adapter = zerosiam.adapt(confident_gn, "tent", lr=0.1)
    with pytest.raises(HostSyncError, match="_local_scalar_dense"), no_host_sync():
        adapter._step(_streams_of_batches()[0, 0])


@pytest.mark.parametrize(
    "read",
    [
        lambda t: bool(t.any()),
        lambda t: t[t > 0.5],
        lambda t: t.tolist(),
        lambda t: t.sum().item(),
        lambda t: t.nonzero(),
    ],
    ids=["bool", "mask-index", "tolist", "item", "nonzero"],
)
def test_the_audit_refuses_each_kind_of_read(read):
    t = torch.rand(5)
    with pytest.raises(HostSyncError), no_host_sync():
        read(t)
    with no_host_sync():  # what a fixed-shape step does instead
        torch.where(t > 0.5, t, 0.0).sum() / (t > 0.5).sum().clamp_min(1)
        t[torch.tensor([0, 2])]  # an index of positions reads nothing


@pytest.mark.parametrize("method, options", ADAPTING, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("streams", [1, STREAMS])
def test_the_fixed_shape_step_reads_nothing_and_adapts_as_the_eager_one(
    confident_gn, method, options, streams
):
    start = {k: v.clone() for k, v in confident_gn.state_dict().items()}
    eager, eager_history = _run(confident_gn, method, options, fixed=False, streams=streams)
    confident_gn.load_state_dict(start)
    fixed, history = _run(confident_gn, method, options, fixed=True, streams=streams, audited=True)
    torch.testing.assert_close(fixed, eager, rtol=0, atol=1e-5)
    for row, eager_row in zip(history, eager_history, strict=True):
        assert row["updated"] == eager_row["updated"] and row["selected"] == eager_row["selected"]
        assert row["recovered"] == eager_row["recovered"]
    moved = [any(v) if isinstance(v, list) else v for v in (row["updated"] for row in history)]
    assert any(moved)  # the streams adapted: the comparison compares adapted weights


@pytest.mark.parametrize("method", ["tent", "zerosiam"])
def test_tent_and_zerosiam_take_the_eager_steps_to_the_bit(confident_gn, method):
    start = {k: v.clone() for k, v in confident_gn.state_dict().items()}
    eager, _ = _run(confident_gn, method, {}, fixed=False)
    confident_gn.load_state_dict(start)
    fixed, _ = _run(confident_gn, method, {}, fixed=True)
    assert torch.equal(fixed, eager)


@pytest.mark.parametrize("streams", [1, STREAMS])
def test_a_non_finite_step_is_held_back_on_the_device(confident_gn, streams):
    """An input large enough to overflow the forward (finite itself, so it is not refused) gives a NaN
    loss: the fixed-shape step runs whole, then puts every stream back and records why."""
    adapter = zerosiam.adapt(confident_gn, "tent", lr=0.1, streams=streams, fixed_shape=True)
    before = {name: p.detach().clone() for name, p in adapter.params.items()}
    x = torch.full((2 * streams, 3, 8, 8), 3e38)
    with no_host_sync():
        _, _, record = adapter._step(x)
    adapter.log.add(torch.zeros(2 * streams, 5), None, record)
    for name, param in adapter.params.items():
        assert torch.equal(param, before[name])
    row = adapter.last
    per_stream = (lambda v: v) if streams > 1 else (lambda v: [v])
    assert per_stream(row["updated"]) == [False] * streams
    assert per_stream(row["skipped"]) == [NON_FINITE] * streams
    adapter.release()


@pytest.mark.parametrize(
    ("speed", "label"),
    [
        (Speed(fixed_shape=True), "fixed_shape"),
        (Speed(graph=True), "graph"),
        (Speed(channels_last=True, graph=True), "channels_last+graph"),
    ],
)
def test_the_step_options_have_labels_that_read_back(speed, label):
    assert speed.label == label and Speed.parse(label) == speed and not speed.eager
    assert Speed(graph=True).fixed_shape  # the captured step is the fixed-shape one


def test_graph_and_compile_are_refused_together():
    with pytest.raises(ValueError, match="graph captures the eager step"):
        Speed(compile=True, graph=True)


def test_graph_off_a_gpu_is_refused_in_one_line_and_the_model_given_back(confident_gn):
    weight = confident_gn.gn.weight
    with pytest.raises(ValueError, match="graph captures CUDA graphs; the model is on cpu"):
        zerosiam.adapt(confident_gn, "zerosiam", lr=0.1, predictor_lr=0.1, graph=True)
    assert confident_gn.gn.weight is weight and weight.requires_grad  # as it came, and no longer held
    zerosiam.adapt(confident_gn, "noadapt", graph=True).release()  # NoAdapt has no step to capture


class ReplacesItsState:
    """A recovery rule that keeps state between steps by replacing it: a captured step would go stale."""

    def __init__(self) -> None:
        self.count = torch.zeros(())

    def __call__(self, evaluations):
        self.count = self.count + 1
        return torch.tensor(False)

    def reset(self) -> None:
        self.count = torch.zeros(())


@pytest.mark.parametrize("guard", [None, "rdumb", "sar", "auto"])
@pytest.mark.parametrize("method", ["tent", "zerosiam", "sar", "eata", "deyo", "come"])
def test_graph_takes_every_method_and_the_guards_between_steps(monkeypatch, confident_gn, method, guard):
    from zerosiam.methods import capture

    monkeypatch.setattr(capture, "_device_of", lambda adapter: torch.device("cuda"))  # as if on a GPU
    extras = {"clean_data": [torch.rand(4, 3, 8, 8)]} if method == "eata" else {}
    adapter = zerosiam.adapt(confident_gn, method, lr=0.1, graph=True, guard=guard, **extras)
    assert isinstance(adapter._step, capture.CapturedStep)
    assert (adapter._step_scale is not None) == (guard is not None)  # the scale in the graph from the start
    adapter.release()
    assert "_step" not in vars(adapter) and adapter._step_scale is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"guard": "asr"}, "graph does not take the AdaptiveSelectiveReset guard yet"),
        ({"recover": ReplacesItsState()}, "its recover replaces its state between steps"),
    ],
)
def test_graph_refuses_what_it_cannot_capture(monkeypatch, confident_gn, options, message):
    from zerosiam.methods import capture

    monkeypatch.setattr(capture, "_device_of", lambda adapter: torch.device("cuda"))  # as if on a GPU
    with pytest.raises(ValueError, match=message):
        zerosiam.adapt(confident_gn, "tent", lr=0.1, graph=True, **options)
    zerosiam.adapt(confident_gn, "tent", lr=0.1).release()  # given back: no longer held


def test_the_bench_flags_name_the_step_options():
    import argparse

    from zerosiam.cli import bench as command
    from zerosiam.cli._errors import UsageError

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    assert command._execution(parser.parse_args(["bench", "--fixed-shape"])).speed == Speed(fixed_shape=True)
    assert command._execution(parser.parse_args(["bench", "--graph"])).speed == Speed(graph=True)
    with pytest.raises(UsageError, match="graph captures the eager step"):
        command._execution(parser.parse_args(["bench", "--graph", "--compile"]))


def _named(value: object) -> str:
    return value if isinstance(value, str) else ""


CAPTURED = [("zerosiam", {}), ("sar", {"recover": ema_below(0.6)}), ("eta", {})]


@pytest.mark.parametrize("method, options", CAPTURED, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("stepped_before", [0, 2])
def test_the_warm_up_before_a_capture_is_undone_in_place(confident_gn, method, options, stepped_before):
    """A capture runs warm-up steps first; ``_put_back`` must leave the adapter where it was, in the very
    tensors a captured step will read (weights, predictor, momentum, the rules' running state), with every
    momentum buffer made: a zero one where there was none, which SGD's first step gives to the bit. The
    steps after it are then the steps of an adapter without the warm-up."""
    from zerosiam.methods import capture

    twin_model = copy.deepcopy(confident_gn)
    build = dict(lr=0.5, predictor_lr=0.5, fixed_shape=True, **options)
    adapter = zerosiam.adapt(confident_gn, method, **build)
    twin = zerosiam.adapt(twin_model, method, **copy.deepcopy(build))
    batches = _streams_of_batches(per_stream=4)[:, 0]
    for x in batches[:stepped_before]:
        adapter(x), twin(x)
    saved = capture._save(adapter)
    before = adapter.snapshot()
    tensors = [*adapter.trainable]
    for x in batches[stepped_before : stepped_before + 3]:  # the warm-up
        adapter._step(x)
    capture._put_back(adapter, saved)
    assert all(a is b for a, b in zip(tensors, adapter.trainable, strict=True))
    for part in ("params", "predictor"):
        for name, value in before[part].items():
            assert torch.equal(adapter.snapshot()[part][name], value)
    assert all(adapter.optimizer.state[p]["momentum_buffer"] is not None for p in adapter.trainable)
    for x in batches[stepped_before:]:
        assert torch.equal(adapter(x), twin(x))
    for name, value in twin.snapshot()["params"].items():
        assert torch.equal(adapter.snapshot()["params"][name], value)
    assert [row["recovered"] for row in adapter.history] == [row["recovered"] for row in twin.history]


@pytest.mark.parametrize("method, options", CAPTURED[1:], ids=lambda v: v if isinstance(v, str) else "")
def test_the_rules_state_stays_in_the_memory_a_capture_saw(confident_gn, method, options):
    """SAR's recovery average and EATA's redundancy mean are written in place from their first value on,
    through steps, a reset and a checkpoint loaded: a captured step goes on reading them."""
    adapter = zerosiam.adapt(confident_gn, method, lr=0.5, fixed_shape=True, **options)
    (part,) = adapter.stateful_parts().values()
    name = "ema" if hasattr(part, "ema") else "mean"
    batches = _streams_of_batches(per_stream=4)[:, 0]
    adapter(batches[0])
    state = getattr(part, name)
    saved = adapter.state_dict()
    for x in batches[1:]:
        adapter(x)
    adapter.reset()
    assert getattr(part, name) is state and state.isnan().all()
    adapter.load_state_dict(saved)
    (kept,) = saved["parts"].values()
    assert getattr(part, name) is state and torch.equal(state, kept[name])


class EmulatedCapture:
    """``CapturedStep`` with its two CUDA calls emulated on the CPU: the warm-up runs on the host's
    stream, and "recording" leaves the adapter as it was while a replay runs the step again and writes
    its results into the recorded outputs, as a graph's replay does. What this checks is the wrapper's
    own bookkeeping (warm-up undone, inputs drawn before each replay, outputs copied out, a graph per
    shape), not CUDA's capture."""

    @staticmethod
    def install(adapter):
        from zerosiam.methods import capture

        class Emulated(capture.CapturedStep):
            def _warm_up(self, x):
                for _ in range(capture.WARM_UP):
                    self.step(x)

            def _record(self, x):
                saved = capture._save(self.adapter)
                outputs = self.step(x)
                capture._put_back(self.adapter, saved)

                def replay():
                    prediction, _, record = self.step(x)
                    outputs[0].copy_(prediction)
                    for key, value in record.items():
                        if isinstance(value, torch.Tensor):
                            outputs[2][key].copy_(value)

                return replay, outputs

        adapter._step = Emulated(adapter, adapter._step)


# DeYO with a PLPD threshold every sample passes: on 8×8 images the patch shuffle barely moves the
# prediction, and the draws must still reach the weights (exp(PLPD)) for the comparison to mean something
DEYO_KEEPING = ("deyo", {"select": [entropy_below(0.5), plpd_above(-1.0)]})


@pytest.mark.parametrize("method, options", [*CAPTURED, DEYO_KEEPING], ids=_named)
def test_a_captured_run_is_the_fixed_shape_run(tiny_gn, method, options):
    """Emulated on the CPU, a captured adapter predicts what the fixed-shape one predicts, to the bit,
    step after step, through a last batch of another size (a second graph); DeYO's patch orders, drawn
    on the host before each replay, are the fixed-shape run's draws."""
    with torch.no_grad():
        tiny_gn.fc.weight.mul_(8.0)
    twin_model = copy.deepcopy(tiny_gn)
    build = dict(lr=0.5, predictor_lr=0.5, fixed_shape=True, **options)
    adapter = zerosiam.adapt(tiny_gn, method, **build)
    twin = zerosiam.adapt(twin_model, method, **copy.deepcopy(build))
    EmulatedCapture.install(adapter)
    batches = [*_streams_of_batches(per_stream=6)[:, 0], torch.rand(3, 3, 8, 8)]
    torch.manual_seed(7)
    captured = [adapter(x) for x in batches]
    torch.manual_seed(7)
    eager = [twin(x) for x in batches]
    for a, b in zip(captured, eager, strict=True):
        assert torch.equal(a, b)
    assert [row["updated"] for row in adapter.history] == [row["updated"] for row in twin.history]
    assert any(row["updated"] for row in adapter.history)
    assert len(adapter._step.graphs) == 2


@pytest.mark.parametrize("guard", ["rdumb", "auto"])
def test_a_guard_acts_on_a_captured_step_as_on_the_fixed_shape_one(tiny_gn, guard):
    """Emulated on the CPU: the guard runs after each replay on the step's evaluations; its resets write
    the weights in place (RDumb here every 2 steps), and a stream it slows keeps the scale the graph reads
    (a shrink to 0.3 at the third step, the full step back at the fifth), to the bit."""
    from zerosiam.parts.guards import Periodic

    with torch.no_grad():
        tiny_gn.fc.weight.mul_(8.0)
    twin_model = copy.deepcopy(tiny_gn)
    runs = []
    for model, captured in ((tiny_gn, True), (twin_model, False)):
        chosen = Periodic(every=2) if guard == "rdumb" else guard
        adapter = zerosiam.adapt(model, "zerosiam", lr=0.5, predictor_lr=0.5, fixed_shape=True, guard=chosen)
        if captured:
            adapter.keep_scale()
            EmulatedCapture.install(adapter)
        predictions = []
        for step, x in enumerate(_streams_of_batches(per_stream=6)[:, 0]):
            if step == 2:
                adapter.shrink(adapter.layout.all_streams(), 0.3)
            if step == 4:
                adapter.full_step(adapter.layout.all_streams())
            predictions.append(adapter(x))
        runs.append((torch.stack(predictions), [row["guard"] for row in adapter.history]))
    (captured, fired), (eager, eager_fired) = runs
    assert torch.equal(captured, eager) and fired == eager_fired
    assert guard != "rdumb" or fired == [False, True] * 3


def test_a_kept_scale_stays_in_one_tensor_through_shrinks_resets_and_checkpoints(tiny_gn, images):
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=0.1, guard="auto", fixed_shape=True)
    adapter.keep_scale()
    scale = adapter._step_scale
    assert torch.equal(scale, torch.tensor(1.0))
    adapter.shrink(adapter.layout.all_streams(), 0.1)
    saved = adapter.state_dict()
    adapter.reset()
    assert adapter._step_scale is scale and torch.equal(scale, torch.tensor(1.0))
    adapter.load_state_dict(saved)
    assert adapter._step_scale is scale and torch.equal(scale, torch.tensor(0.1))
    adapter.release()
    assert adapter._step_scale is None
