"""One benchmark run: the spec, the protocol's stream over the benchmark's data, and the measured result."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.bench.conftest import TinyLN, fake_load
from zerosiam import corruptions
from zerosiam.bench import mistakes, runner
from zerosiam.bench.checkpoint import RunCheckpoint
from zerosiam.bench.memory import reset_peak
from zerosiam.bench.runner import RunSpec, stream_for
from zerosiam.bench.store import run_id_for
from zerosiam.protocols import streams


def _spec(**changes) -> RunSpec:
    values = dict(
        model="resnet20", dataset="cifar10c", corruption="fog", severity=5, protocol="mild", method="tent"
    )
    return RunSpec(**{**values, **changes})


def test_the_runner_streams_the_cached_split_of_its_spec(fake_domains) -> None:
    stream = stream_for(_spec(seed=3, severity=2, limit=20))
    images, labels = fake_load("cifar10c", "fog", 2)
    keep = np.sort(np.random.default_rng(3).permutation(50)[:20])  # the seeded ``limit`` subset
    np.testing.assert_array_equal(stream.domains[0][0], images[keep])
    np.testing.assert_array_equal(stream.rows[:, 1], streams.mild(labels[keep], 3))


def test_the_mixed_protocol_streams_the_benchmark_corruptions(fake_domains) -> None:
    stream = stream_for(_spec(protocol="mixed", corruption="mixed"))
    assert stream.names == list(corruptions.BENCHMARK)
    assert np.bincount(stream.rows[:, 0]).tolist() == [50] * 15


def test_the_blind_spot_needs_the_source_model(fake_domains) -> None:
    with pytest.raises(ValueError, match="source model"):
        stream_for(_spec(protocol="blind_spot"))


def test_blind_spot_scores_the_frozen_model_on_the_whole_set(fake_domains, tiny_model):
    result = runner.run(_spec(protocol="blind_spot", method="tent", hparams={"lr": 1e-2}))
    unadapted = runner.run(_spec(protocol="blind_spot", method="noadapt")).metrics["accuracy"]
    assert unadapted == runner.run(_spec(protocol="mild", method="noadapt")).metrics["accuracy"]
    mistakes_made = round(50 * (1 - unadapted))
    assert result.metrics["samples"] == 50 and result.metrics["steps"] == mistakes_made  # one pass
    assert all(math.isnan(v) for v in result.curves["accuracy"])  # nothing is scored while adapting
    longer = runner.run(_spec(protocol="blind_spot", method="tent", stream_length=50, hparams={"lr": 1e-2}))
    assert longer.metrics["steps"] == 50  # the earlier stream, asked for by name


def test_the_blind_spot_reports_its_frozen_pass_as_steps_after_the_streams(fake_domains, tiny_model):
    heard: list[tuple[int, int]] = []
    specs = [_spec(protocol="blind_spot", corruption=name, hparams={"lr": 1e-2}) for name in ("fog", "snow")]
    results = runner.run_stacked(specs, report=lambda done, total: heard.append((done, total)))
    steps, frozen = max(r.metrics["steps"] for r in results), 1  # the longest pass; 50 images, one batch
    assert heard == [(done, steps + frozen) for done in range(1, steps + frozen + 1)]


def test_the_blind_spot_finds_the_source_models_mistakes_once(fake_domains, tiny_model, monkeypatch):
    passes = []
    find = mistakes.source_mistakes
    monkeypatch.setattr(mistakes, "source_mistakes", lambda *args: passes.append(1) or find(*args))
    first = runner.run(_spec(protocol="blind_spot", method="tent", hparams={"lr": 1e-2}))
    again = runner.run(_spec(protocol="blind_spot", method="zerosiam", hparams={"lr": 1e-2}))
    assert len(passes) == 1 and first.metrics["steps"] == again.metrics["steps"] > 0
    kept = list((Path(os.environ["ZEROSIAM_CACHE"]) / mistakes.FOLDER).glob("*.npy"))
    assert len(kept) == 1
    kept[0].write_bytes(b"damaged")  # a damaged file is found again, not trusted
    runner.run(_spec(protocol="blind_spot", method="noadapt"))
    runner.run(_spec(protocol="blind_spot", method="noadapt", seed=1))  # another order: another file
    assert len(passes) == 3


def test_another_model_of_the_same_name_has_mistakes_of_its_own(fake_domains, monkeypatch):
    models = [TinyLN(), TinyLN()]
    with torch.no_grad():
        models[1].fc.bias += 1.0  # other weights, the same name
    monkeypatch.setattr(runner.zerosiam, "load_model", lambda name: models.pop(0))
    for _ in range(2):
        runner.run(_spec(protocol="blind_spot", method="noadapt"))
    assert len(list((Path(os.environ["ZEROSIAM_CACHE"]) / mistakes.FOLDER).glob("*.npy"))) == 2


def test_spec_validation_and_stable_ids():
    with pytest.raises(ValueError, match="unknown protocol"):
        _spec(protocol="wild")
    with pytest.raises(ValueError, match="mixed"):
        _spec(protocol="mixed")
    assert _spec().run_id == _spec().run_id != _spec(seed=1).run_id
    assert _spec(hparams={"lr": 1e-3}).run_id != _spec(hparams={"lr": 1e-4}).run_id


def test_a_trained_zoo_model_names_its_weights_in_the_run_id(monkeypatch):
    """Retrained weights keep the model's name; the run id must still change, or an old store would be
    resumed with results of the old weights."""
    assert runner.shipped_sha256("resnet20") is None  # a fixed asset, not trained here
    assert len(runner.shipped_sha256("resnet26_gn")) == 64
    spec = _spec(model="resnet26_gn")
    shipped = spec.run_id
    monkeypatch.setattr("zerosiam.bench.spec.shipped_sha256", lambda model: "0" * 64)
    assert spec.run_id != shipped
    monkeypatch.setattr("zerosiam.bench.spec.shipped_sha256", lambda model: None)  # resnet20: a fixed asset
    assert spec.run_id != shipped


def test_accuracy_is_a_fraction_and_nan_free_curves_are_kept(fake_domains, tiny_model):
    result = runner.run(_spec(method="zerosiam", batch_size=10, hparams={"lr": 1e-3, "predictor_lr": 1e-2}))
    assert 0.0 <= result.metrics["accuracy"] <= 1.0 and result.metrics["samples"] == 50
    assert len(result.curves["accuracy"]) == 5 and "divergence" in result.curves
    assert not any(math.isnan(v) for v in result.curves["predictor_drift"])
    assert result.metrics["peak_rss_scope"] == ("run" if reset_peak() else "process")


def test_a_prelude_adapts_first_and_is_scored_apart(fake_domains, tiny_model):
    """Tent takes the first 2 batches, then NoAdapt keeps what Tent left: only the later batches count
    towards the accuracy, the earlier ones are ``prelude_accuracy``; the curve covers both."""
    prelude = {"method": "tent", "steps": 2, "lr": 1e-2}
    result = runner.run(_spec(method="noadapt", batch_size=10, prelude=prelude))
    metrics, curve = result.metrics, result.curves["accuracy"]
    assert len(curve) == 5 and metrics["steps"] == 5 and metrics["samples"] == 30
    assert metrics["accuracy"] == pytest.approx(sum(curve[2:]) / 3)
    assert metrics["prelude_accuracy"] == pytest.approx(sum(curve[:2]) / 2)
    assert metrics["updates"] == 2  # Tent's two steps; NoAdapt's frozen ones update nothing


def test_a_prelude_is_checked_and_an_empty_one_keeps_old_run_ids():
    for prelude, message in (
        ({"steps": 3}, "needs a method"),
        ({"method": "tnet", "steps": 3}, "unknown method"),
        ({"method": "tent", "steps": 0}, "positive integer"),
    ):
        with pytest.raises(ValueError, match=message):
            _spec(prelude=prelude)
    spec = _spec()
    before = {k: v for k, v in spec.as_dict().items() if k not in ("prelude", "guard", "replica", "target")}
    assert spec.run_id == run_id_for(before)  # runs stored before the field existed resume
    assert _spec(prelude={"method": "tent", "steps": 3}).run_id != spec.run_id


@pytest.mark.parametrize(
    "protocol, method",
    [
        ("bs1", "zerosiam"),
        ("label_shift_bs1", "zerosiam"),
        ("bs1", "sar"),
        ("blind_spot", "tent"),
        ("blind_spot", "zerosiam"),
        ("blind_spot", "noadapt"),
    ],
)
def test_stacked_runs_give_each_run_what_it_gets_alone(fake_domains, tiny_model, protocol, method):
    """Three corruptions and two seeds as four streams of one adapter: every run's accuracy, counts and
    curves are those of the run on its own, also where the streams differ in length (the blind spot's one
    pass) and where one corruption is streamed in two seeded orders."""
    shared = dict(method=method, protocol=protocol, batch_size=1, hparams={"lr": 0.05})
    pairs = (("fog", 0), ("snow", 0), ("frost", 1), ("fog", 1))
    specs = [_spec(**shared, corruption=name, seed=seed) for name, seed in pairs]
    stacked = runner.run_stacked(specs)
    for spec, result in zip(specs, stacked, strict=True):
        alone = runner.run(spec)
        assert result.spec == spec and result.metrics["streams"] == 4
        for key in ("accuracy", "samples", "steps", "updates"):
            assert result.metrics[key] == pytest.approx(alone.metrics[key]), key
        assert result.curves.keys() == alone.curves.keys()
        for key, curve in alone.curves.items():
            assert result.curves[key] == pytest.approx(curve, rel=1e-4, abs=1e-5, nan_ok=True), key
    final = [r.curves["entropy"][-1] for r in stacked]
    assert len(set(final)) == 4  # four streams that adapted apart
    if protocol == "blind_spot":
        assert len({r.metrics["steps"] for r in stacked}) > 1  # passes of different lengths were stacked


def test_runs_that_cannot_share_an_adapter_are_refused(fake_domains, tiny_model):
    fog, snow = _spec(batch_size=1, protocol="bs1"), _spec(batch_size=1, protocol="bs1", corruption="snow")
    with pytest.raises(ValueError, match=r"differ in corruption, seed, replica only, not in \['method'\]"):
        runner.run_stacked([fog, dataclasses.replace(snow, method="zerosiam")])
    with pytest.raises(ValueError, match="do not stack"):
        runner.run_stacked(
            [dataclasses.replace(s, prelude={"method": "tent", "steps": 2}) for s in (fog, snow)]
        )
    mlp = {"predictor": "mlp"}
    with pytest.raises(ValueError, match="MLPPredictor predictor does not stack"):
        runner.run_stacked([dataclasses.replace(s, method="zerosiam", hparams=mlp) for s in (fog, snow)])


class _Stop(Exception):
    """A stand-in for the signal that ends a session part-way through a run."""


def _stopped_at(step: int):
    def report(done: int, total: int) -> None:
        if done == step:
            raise _Stop

    return report


class _Confident(TinyLN):
    """TinyLN made sure of itself (the filtering methods then learn), with a norm before the final one
    (SAR's, DeYO's and COME's parameters leave the final norm alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.LayerNorm(48)
        with torch.no_grad():
            self.fc.weight.mul_(20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.stem(x.flatten(1))))


def _same_runs(resumed: list[runner.Result], straight: list[runner.Result]) -> None:
    """Equal to the last bit: every count, accuracy and curve (NaN where the other has NaN)."""
    for mine, theirs in zip(resumed, straight, strict=True):
        for key in ("accuracy", "samples", "steps", "updates", "recoveries", "per_domain"):
            assert mine.metrics.get(key) == theirs.metrics.get(key), key
        assert mine.curves.keys() == theirs.curves.keys()
        for key, curve in theirs.curves.items():
            np.testing.assert_array_equal(mine.curves[key], curve, err_msg=key)


@pytest.mark.parametrize(
    "method, protocol, corruptions",
    [
        ("tent", "mild", ["fog"]),
        ("zerosiam", "label_shift", ["fog"]),
        ("sar", "mild", ["fog"]),  # its EMA and resets
        ("eata", "mild", ["fog"]),  # its moving mean of kept predictions
        ("deyo", "mild", ["fog"]),  # its random patch shuffles
        ("come", "mild", ["fog"]),
        ("zerosiam", "bs1", ["fog", "snow"]),  # stacked streams
        ("tent", "blind_spot", ["fog", "snow"]),  # and the frozen pass after the stream
    ],
)
def test_a_stopped_run_goes_on_from_its_checkpoint_to_the_result_of_one_never_stopped(
    fake_domains, monkeypatch, tmp_path, method, protocol, corruptions
):
    monkeypatch.setattr(runner.zerosiam, "load_model", lambda name: _Confident())
    batch = 1 if protocol in runner.STACKED_PROTOCOLS else 8
    specs = [
        _spec(method=method, protocol=protocol, corruption=name, batch_size=batch, hparams={"lr": 0.05})
        for name in corruptions
    ]
    straight = runner.run_stacked(specs)
    assert all(r.metrics["updates"] > 0 for r in straight)
    ids = tuple(spec.run_id for spec in specs)
    with pytest.raises(_Stop):
        runner.run_stacked(specs, report=_stopped_at(4), checkpoint=RunCheckpoint(tmp_path, ids, every=0))
    checkpoint = RunCheckpoint(tmp_path, ids, every=3600)
    assert checkpoint.path.exists()
    heard: list[tuple[int, int]] = []
    resumed = runner.run_stacked(specs, checkpoint=checkpoint, report=lambda *step: heard.append(step))
    _same_runs(resumed, straight)
    assert heard[0][0] == 5 and heard[-1][0] == heard[-1][1]  # the steps after the checkpoint's, to the end
    assert all(r.metrics["resumed_from_step"] == 4 for r in resumed)
    assert "resumed_from_step" not in straight[0].metrics


def test_autos_watch_says_something_only_of_a_run_it_saw_from_its_first_step_to_its_last(
    fake_domains, monkeypatch, tmp_path
):
    """A run stopped and resumed under the watch says what the run never stopped says; one watched only
    before or only after its checkpoint says nothing (``auto`` could have acted where it did not look)."""
    monkeypatch.setattr(runner.zerosiam, "load_model", lambda name: _Confident())
    spec = _spec(batch_size=8, hparams={"lr": 0.05})
    straight = runner.run_stacked([spec], watch=True)[0]
    assert (
        "auto_guard_fires" in straight.metrics
        and "auto_guard_fires" not in runner.run_stacked([spec])[0].metrics
    )

    def resumed(before: bool, after: bool) -> runner.Result:
        checkpoint = RunCheckpoint(tmp_path / f"{before}-{after}", (spec.run_id,), every=0)
        with pytest.raises(_Stop):
            runner.run_stacked([spec], report=_stopped_at(4), checkpoint=checkpoint, watch=before)
        return runner.run_stacked([spec], checkpoint=checkpoint, watch=after)[0]

    again = resumed(True, True)
    _same_runs([again], [straight])
    assert again.metrics["auto_guard_fires"] == straight.metrics["auto_guard_fires"]
    for before, after in ((True, False), (False, True)):
        part = resumed(before, after)
        assert (
            part.metrics["accuracy"] == straight.metrics["accuracy"]
            and "auto_guard_fires" not in part.metrics
        )


def test_a_checkpoint_that_cannot_be_used_is_a_warning_and_the_run_starts_over(
    fake_domains, tiny_model, tmp_path
):
    spec = _spec(batch_size=8, hparams={"lr": 0.05})
    straight = runner.run_stacked([spec])
    other = dataclasses.replace(spec, seed=1)
    theirs = RunCheckpoint(tmp_path, (other.run_id,), every=0)
    with pytest.raises(_Stop):
        runner.run_stacked([other], report=_stopped_at(3), checkpoint=theirs)
    mine = RunCheckpoint(tmp_path, (spec.run_id,), every=0)
    os.replace(theirs.path, mine.path)  # another run's progress under this run's name
    with pytest.warns(UserWarning, match="of other runs"):
        again = runner.run_stacked([spec], checkpoint=mine)
    _same_runs(again, straight)
    assert "resumed_from_step" not in again[0].metrics
    mine.path.write_bytes(b"cut short")
    with pytest.warns(UserWarning, match="unreadable"):
        _same_runs(runner.run_stacked([spec], checkpoint=mine), straight)


def test_a_run_with_a_prelude_runs_whole_and_leaves_no_checkpoint(fake_domains, tiny_model, tmp_path):
    spec = _spec(batch_size=8, prelude={"method": "tent", "steps": 2})
    checkpoint = RunCheckpoint(tmp_path, (spec.run_id,), every=0)
    runner.run_stacked([spec], checkpoint=checkpoint)
    assert not checkpoint.path.exists()


def test_a_checkpoint_write_that_fails_is_a_warning_and_the_run_goes_on(fake_domains, tiny_model, tmp_path):
    spec = _spec(batch_size=8, hparams={"lr": 0.05})
    blocked = tmp_path / "a file"
    blocked.write_text("not a folder")
    with pytest.warns(UserWarning, match="could not write checkpoint"):
        results = runner.run_stacked([spec], checkpoint=RunCheckpoint(blocked, (spec.run_id,), every=0))
    _same_runs(results, [runner.run(spec)])


def test_a_checkpoint_write_stopped_part_way_leaves_the_last_one_and_no_temporary_file(tmp_path, monkeypatch):
    checkpoint = RunCheckpoint(tmp_path, ("a run",), every=0)
    checkpoint.save({"step": 1})

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", stopped)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save({"step": 2})
    assert sorted(path.name for path in tmp_path.iterdir()) == [checkpoint.path.name]
    assert checkpoint.load(torch.device("cpu"))["step"] == 1
