"""The continual protocols as runs: their specs, grids, tables, and CCC's calibration on a real model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.conftest import needs_assets
from zerosiam import corruptions
from zerosiam.bench import plots, runner
from zerosiam.bench.ccc import Calibration, ccc_source
from zerosiam.bench.execution import splits_of
from zerosiam.bench.grid import Grid
from zerosiam.bench.report import build_tables
from zerosiam.bench.runner import RunSpec, run
from zerosiam.bench.spec import without_later_defaults
from zerosiam.cli.report import write_streams
from zerosiam.protocols import streams


def _spec(**changes) -> RunSpec:
    values = dict(
        model="resnet26_gn", dataset="cifar10c", corruption="continual", severity=5, protocol="continual",
        method="tent",
    )  # fmt: skip
    return RunSpec(**{**values, **changes})


def test_a_continual_protocol_runs_under_its_own_name_and_only_ccc_takes_a_target() -> None:
    with pytest.raises(ValueError, match="their own name"):
        _spec(corruption="fog")
    with pytest.raises(ValueError, match="their own name"):
        _spec(protocol="mild", corruption="ccc")
    with pytest.raises(ValueError, match="only the ccc protocol takes a target"):
        _spec(target=15)
    with pytest.raises(ValueError, match="between 0 and 100"):
        _spec(protocol="ccc", corruption="ccc", target=0)
    ccc = _spec(protocol="ccc", corruption="ccc", target=15)
    assert ccc.run_id == _spec(protocol="ccc", corruption="ccc", target=15.0).run_id
    assert ccc.run_id != _spec(protocol="ccc", corruption="ccc").run_id
    assert "target" not in without_later_defaults(_spec().as_dict())  # older runs keep their ids


def test_a_grid_gives_each_continual_protocol_one_run_and_ccc_one_per_target() -> None:
    protocols = ["continual", "gradual", "ccc", "mild"]
    grid = Grid(
        models=["resnet26_gn"], methods=["noadapt", "tent"], protocols=protocols, corruptions=["fog"],
        stream={"target": [50, 15]},
    )  # fmt: skip
    specs = grid.specs()
    by = {(s.protocol, s.method, s.target) for s in specs}
    assert {s.corruption for s in specs if s.protocol != "mild"} == {"continual", "gradual", "ccc"}
    assert ("ccc", "tent", 15.0) in by and ("ccc", "tent", 50.0) in by
    assert len([s for s in specs if s.protocol in ("continual", "gradual", "mild")]) == 6  # no target


def test_each_protocol_prepares_the_splits_it_reads() -> None:
    assert splits_of(_spec()) == {("cifar10c", name, 5) for name in corruptions.BENCHMARK}
    assert len(splits_of(_spec(protocol="gradual", corruption="gradual"))) == 15 * 5
    assert splits_of(_spec(protocol="ccc", corruption="ccc")) == {("cifar10c", "clean", 1)}


def test_continual_and_gradual_runs_tell_their_accuracy_per_corruption(fake_domains, tiny_model) -> None:
    continual = run(_spec(model="resnet20", method="noadapt"))
    assert continual.metrics["samples"] == 15 * 50
    assert sorted(continual.metrics["per_domain"]) == sorted(corruptions.BENCHMARK)
    gradual = run(_spec(model="resnet20", protocol="gradual", corruption="gradual", stream_length=15 * 9 * 4))
    assert gradual.metrics["samples"] == 15 * 9 * 4 and gradual.metrics["updates"] > 0
    rows = [
        {"run_id": str(n), "spec": r.spec.as_dict(), "metrics": r.metrics, "env": r.env}
        for n, r in enumerate([continual, gradual])
    ]
    tables = build_tables(rows)
    assert {table.protocol for table in tables} == {"continual", "gradual"}
    assert all("overall" in table.columns and "fog" in table.columns for table in tables)


@pytest.mark.slow
@needs_assets()
@pytest.mark.parametrize(("target", "within"), [(50, 12), (10, 10)])
def test_a_ccc_stream_holds_the_source_model_near_its_calibrated_accuracy(target, within) -> None:
    """The realised accuracy of the unadapted ResNet-26 on a CCC stream is what its calibration
    promised (the walks' grids read at each image's point), and near the target: near chance (10 %) at
    the lowest, which CIFAR-10-C's own constants could not reach (``ccc.CCC_PRESETS``)."""
    spec = _spec(protocol="ccc", corruption="ccc", method="noadapt", stream_length=3_000, target=target)
    torch.manual_seed(0)
    result = run(spec)
    model = runner.zerosiam.load_model(spec.model)
    predict = lambda x: model(x)  # noqa: E731
    calibration = Calibration(spec, model, predict, torch.device("cpu"))  # the grids the run kept
    kept = streams.ccc_corruptions(spec.target, corruptions.BENCHMARK)
    clean = len(ccc_source(spec, model, predict, torch.device("cpu")).clean[1])
    rows = streams.ccc(clean, lambda a, b: calibration.walk(kept[a], kept[b]), len(kept), 0, 3_000)
    promised = np.mean([calibration.grid(kept[a], kept[b])[s1, s2] for a, s1, b, s2, _ in rows])
    realised = 100 * result.metrics["accuracy"]
    assert abs(realised - promised) < 6, (realised, promised)
    assert abs(realised - spec.target) < within, realised


def test_a_windowed_mean_tells_the_accuracy_there_not_since_the_start() -> None:
    values = [1.0] * 10 + [0.0] * 10
    window = plots.windowed_mean(values, 4)
    assert window[3] == 1.0 and window[-1] == 0.0 and window[11] == 0.5
    assert plots.windowed_mean([math.nan, 1.0, 0.0], 2)[-1] == 0.5  # a batch with nothing scored is skipped


def test_the_stream_figure_has_a_panel_per_stream_and_target(tmp_path) -> None:
    def row(protocol: str, target: float = 50.0, guard: str = "none") -> dict:
        spec = _spec(protocol=protocol, corruption=protocol, target=target if protocol == "ccc" else 50.0)
        curves = {"accuracy": list(np.linspace(0.9, 0.2, 50)), "guard": [0.0] * 49 + [1.0]}
        metrics = {"accuracy": 0.5, "per_domain": {name: 0.5 for name in corruptions.BENCHMARK}}
        return {"run_id": protocol + guard, "spec": {**spec.as_dict(), "guard": guard}, "metrics": metrics,
                "curves": curves}  # fmt: skip

    rows = [row("continual"), row("gradual"), row("ccc", 20), row("ccc", 20, "auto"), row("ccc", 50)]
    written = write_streams(rows, tmp_path)
    assert written == [tmp_path / "streams.png"] and written[0].stat().st_size > 10_000
    assert {plots.stream_panel(r["spec"]) for r in rows} == {
        "continual", "gradual", "CCC, target 20 %", "CCC, target 50 %"
    }  # fmt: skip
    assert (
        write_streams([{**rows[0], "spec": _spec(protocol="mild", corruption="fog").as_dict()}], tmp_path)
        == []
    )
