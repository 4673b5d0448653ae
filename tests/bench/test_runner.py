"""The benchmark harness: streams per protocol, grid expansion, the store-backed resume and the backends."""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import needs_assets
from zerosiam import corruptions
from zerosiam.bench import grid as grid_module
from zerosiam.bench import runner
from zerosiam.bench.grid import Grid, execute
from zerosiam.bench.runner import RunSpec, build_stream
from zerosiam.bench.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_domains(monkeypatch):
    """Replace data loading by small labelled arrays: 50 images of 5 classes per corruption."""

    def load(dataset, corruption, severity, cache=None, progress=False):
        seed = sum(map(ord, corruption)) + severity
        images = np.random.default_rng(seed).integers(0, 256, (50, 4, 4, 3), dtype=np.uint8)
        return images, np.repeat(np.arange(5), 10)

    monkeypatch.setattr(runner, "load_corrupted", load)
    monkeypatch.setattr(grid_module, "load_corrupted", load)


class TinyLN(torch.nn.Module):
    """A LayerNorm classifier for the fake 4×4 images."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.LayerNorm(48)
        self.fc = torch.nn.Linear(48, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x.flatten(1)))


@pytest.fixture
def tiny_model(monkeypatch):
    monkeypatch.setattr(runner.zerosiam, "load_model", lambda name: TinyLN())


def _spec(**changes) -> RunSpec:
    values = dict(
        model="resnet20", dataset="cifar10c", corruption="fog", severity=5, protocol="mild", method="tent"
    )
    return RunSpec(**{**values, **changes})


def test_mild_stream_visits_every_image_once(fake_domains):
    stream = build_stream(_spec(seed=3))
    assert sorted(stream.rows[:, 1]) == list(range(50)) and stream.evaluated.all()
    assert not np.array_equal(stream.rows[:, 1], build_stream(_spec(seed=4)).rows[:, 1])


def test_label_shift_stream_is_class_ordered(fake_domains):
    stream = build_stream(_spec(protocol="label_shift"))
    labels = stream.domains[0][1][stream.rows[:, 1]]
    assert len(labels) == 50 and (np.diff(labels) != 0).sum() == 4  # five contiguous class runs


def test_mixed_stream_covers_every_corruption_once(fake_domains):
    stream = build_stream(_spec(protocol="mixed", corruption="mixed"))
    assert stream.names == list(corruptions.BENCHMARK)
    assert np.bincount(stream.rows[:, 0]).tolist() == [50] * 15


def test_noise_prefix_and_epochs_evaluate_only_their_part(fake_domains):
    stream = build_stream(_spec(protocol="noise_prefix", noise=20))
    assert stream.evaluated.sum() == 50 and not stream.evaluated[:20].any()
    noise = stream.domains[0][0].astype(float)
    assert abs(noise.mean() - 127.5) < 3 and 55 < noise.std() < 64  # Gaussian, a little clipped
    stream = build_stream(_spec(protocol="epochs", epochs=3))
    assert len(stream.rows) == 150 and stream.evaluated.sum() == 50 and stream.evaluated[-50:].all()


def test_bs1_protocols_stream_single_images(fake_domains):
    assert build_stream(_spec(protocol="bs1")).batch_size == 1
    assert build_stream(_spec(protocol="label_shift_bs1")).batch_size == 1


class Oracle(torch.nn.Module):
    """Right on the first 20 of the fake domain's 50 images, wrong on the rest (whatever their order)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        load = runner.load_corrupted("cifar10c", "fog", 5)
        wanted = {img.tobytes(): int(lab) for img, lab in zip(*load, strict=True)}
        index = {img.tobytes(): i for i, img in enumerate(load[0])}
        logits = torch.zeros(len(x), 5)
        for row, image in enumerate(x.permute(0, 2, 3, 1).mul(255).round().to(torch.uint8).numpy()):
            key = image.tobytes()
            logits[row, wanted[key] if index[key] < 20 else (wanted[key] + 1) % 5] = 1.0
        return logits


def test_blind_spot_adapts_on_the_source_models_mistakes_only(fake_domains):
    stream = build_stream(_spec(protocol="blind_spot"), source_model=Oracle())
    assert stream.batch_size == 1 and len(stream.rows) == 50 and not stream.evaluated.any()
    assert set(stream.rows[:, 1]) == set(range(20, 50))  # 30 mistakes, repeated and topped up to 50
    assert sorted(stream.frozen_rows[:, 1]) == list(range(50))
    with pytest.raises(ValueError, match="source_model"):
        build_stream(_spec(protocol="blind_spot"))


def test_blind_spot_scores_the_frozen_model_on_the_whole_set(fake_domains, tiny_model):
    result = runner.run(_spec(protocol="blind_spot", method="tent", hparams={"lr": 1e-2}))
    assert result.metrics["samples"] == 50 and result.metrics["steps"] == 50
    assert all(math.isnan(v) for v in result.curves["accuracy"])  # nothing is scored while adapting
    unadapted = runner.run(_spec(protocol="blind_spot", method="noadapt")).metrics["accuracy"]
    assert unadapted == runner.run(_spec(protocol="mild", method="noadapt")).metrics["accuracy"]


def test_spec_validation_and_stable_ids():
    with pytest.raises(ValueError, match="unknown protocol"):
        _spec(protocol="wild")
    with pytest.raises(ValueError, match="mixed"):
        _spec(protocol="mixed")
    assert _spec().run_id == _spec().run_id != _spec(seed=1).run_id
    assert _spec(hparams={"lr": 1e-3}).run_id != _spec(hparams={"lr": 1e-4}).run_id


def test_grid_expands_axes_and_sweeps():
    sweep = {"lr": [1e-3, 1e-4], "predictor_lr": [1e-2, 1e-3]}
    grid = Grid(models=["resnet20"], methods=["tent", "zerosiam"], corruptions=["fog", "snow"],
                protocols=["mild", "mixed"], sweep=sweep)  # fmt: skip
    specs = grid.specs()
    tent = [s for s in specs if s.method == "tent"]
    siam = [s for s in specs if s.method == "zerosiam"]
    assert (
        len(tent) == 2 * 3 and len(siam) == 4 * 3
    )  # (fog, snow, mixed) × sweep points; η_h only for ZeroSiam
    assert all("predictor_lr" not in s.hparams for s in tent)
    assert {s.corruption for s in specs if s.protocol == "mixed"} == {"mixed"}
    with pytest.raises(ValueError, match="unknown grid keys"):
        Grid.from_mapping({"models": ["resnet20"], "methods": ["tent"], "corruption": ["fog"]})
    assert (
        len(Grid.from_mapping({"models": ["m"], "methods": ["tent"], "corruptions": "benchmark"}).corruptions)
        == 15
    )


# --- real runs through the store --------------------------------------------------------------------

SMALL = ["--model", "resnet20", "--corruptions", "gaussian_noise", "--protocols", "mild,label_shift",
         "--methods", "noadapt,tent,zerosiam", "--limit", "128", "--workers", "1", "--no-report"]  # fmt: skip


def _rows(db: Path) -> dict[str, tuple]:
    """Each run's deterministic content (timings and memory excluded)."""
    rows = {}
    for row in ResultStore(db).rows(kind="vision"):
        metrics = {k: v for k, v in row["metrics"].items() if k not in ("seconds", "peak_rss_mb")}
        rows[row["run_id"]] = (metrics, row["curves"])
    return rows


def _bench(db: Path, *extra: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "zerosiam.cli", "bench", *SMALL, "--db", str(db), *extra]
    return subprocess.Popen(command, env=env, cwd=ROOT, **popen)


@needs_assets()
def test_a_killed_grid_resumes_without_lost_or_duplicated_runs(tmp_path):
    reference = tmp_path / "reference.db"
    assert _bench(reference).wait(timeout=600) == 0
    expected = _rows(reference)
    assert len(expected) == 6

    interrupted = tmp_path / "interrupted.db"
    process = _bench(
        interrupted, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and _count(interrupted) < 2:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    done_before = _count(interrupted)
    assert 2 <= done_before < 6, "the grid should have been killed part-way"

    assert _bench(interrupted).wait(timeout=600) == 0
    assert _count(interrupted) == 6
    assert _rows(interrupted) == expected


def _count(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as connection:
            return connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    except sqlite3.OperationalError:  # the table is not created yet
        return 0


@needs_assets()
def test_ray_backend_gives_the_same_results_as_the_local_pool(tmp_path):
    pytest.importorskip("ray")
    specs = Grid(models=["resnet20"], methods=["tent", "zerosiam"], corruptions=["gaussian_noise"],
                 limit=128).specs()  # fmt: skip
    local, distributed = ResultStore(tmp_path / "local.db"), ResultStore(tmp_path / "ray.db")
    assert execute(specs, local, backend="local", workers=1, progress=False) == 2
    assert execute(specs, distributed, backend="ray", workers=2, progress=False) == 2
    assert _rows(tmp_path / "local.db") == _rows(tmp_path / "ray.db")
    assert execute(specs, distributed, backend="ray", progress=False) == 0  # nothing left to run


def test_accuracy_is_a_fraction_and_nan_free_curves_are_kept(fake_domains, tiny_model):
    result = runner.run(_spec(method="zerosiam", batch_size=10, hparams={"lr": 1e-3, "predictor_lr": 1e-2}))
    assert 0.0 <= result.metrics["accuracy"] <= 1.0 and result.metrics["samples"] == 50
    assert len(result.curves["accuracy"]) == 5 and "divergence" in result.curves
    assert not any(math.isnan(v) for v in result.curves["predictor_drift"])


def test_learning_rates_are_selected_on_the_extra_corruptions_only(fake_domains, tiny_model, tmp_path):
    from zerosiam.bench.select import SELECTION_KIND, select_on_held_out

    store = ResultStore(tmp_path / "select.db")
    sweep = {"lr": [1e-4, 1e-1], "predictor_lr": [1e-2]}
    choices = select_on_held_out("tiny", ["tent", "zerosiam"], sweep, store, backend="inline", progress=False)
    runs = store.rows("vision")
    assert {row["spec"]["corruption"] for row in runs} == set(corruptions.EXTRA)
    assert len(runs) == 4 * 2 * 2
    for choice in choices:
        assert choice.accuracy == max(choice.table.values())
        assert len(choice.table) == 2
    recorded = store.rows(SELECTION_KIND)
    assert [row["metrics"]["chosen"] for row in recorded] == [c.hparams for c in choices]


def test_data_free_predictor_lr_prefers_the_least_disruptive_rate(tiny_model, monkeypatch):
    from zerosiam.bench import select

    monkeypatch.setattr(select.zerosiam, "load_model", lambda name: TinyLN())
    candidates = [0.0, 1e-2, 10.0]
    chosen, changes = select.data_free_predictor_lr("tiny", candidates, lr=5e-2, images=256, input_size=4)
    assert list(changes) == candidates and chosen == min(changes, key=changes.get)
    assert len({round(v, 9) for v in changes.values()}) == 3  # η_h reaches the model through the norms
    assert all(v > 0 for v in changes.values())
