"""Grids: expansion into specs, the store-backed resume after ``kill -9``, and the Ray backend."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import needs_assets
from zerosiam.bench import backends
from zerosiam.bench.grid import Execution, Grid, Progress, execute, tasks_of, throttled
from zerosiam.bench.store import Failure, ResultStore
from zerosiam.bench.tasks import run_ids_of

ROOT = Path(__file__).resolve().parents[2]


def test_grid_expands_axes_and_sweeps():
    sweep = {"lr": [1e-3, 1e-4], "predictor_lr": [1e-2, 1e-3]}
    grid = Grid(models=["resnet20"], methods=["noadapt", "tent", "zerosiam"], corruptions=["fog", "snow"],
                protocols=["mild", "mixed"], sweep=sweep)  # fmt: skip
    specs = grid.specs()
    noadapt = [s for s in specs if s.method == "noadapt"]
    assert len(noadapt) == 3 and all(s.hparams == {} for s in noadapt)  # no rate: run once, not per point
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
        metrics = {
            k: v
            for k, v in row["metrics"].items()
            if k not in ("seconds", "peak_rss_mb", "data_wait_fraction")
        }
        rows[row["run_id"]] = (metrics, row["curves"])
    return rows


def _bench(db: Path, *extra: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "zerosiam.cli", "bench", *SMALL, "--db", str(db), *extra]
    return subprocess.Popen(command, env=env, cwd=ROOT, **popen)


@needs_assets()
@pytest.mark.slow
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
@pytest.mark.slow
def test_ray_backend_gives_the_same_results_as_the_local_pool(tmp_path):
    pytest.importorskip("ray")
    specs = Grid(models=["resnet20"], methods=["tent", "zerosiam"], corruptions=["gaussian_noise"],
                 limit=128).specs()  # fmt: skip
    local, distributed = ResultStore(tmp_path / "local.db"), ResultStore(tmp_path / "ray.db")
    assert execute(specs, local, Execution(backend="local", workers=1, progress=False)) == (2, [])
    assert execute(specs, distributed, Execution(backend="ray", workers=2, progress=False)) == (2, [])
    assert _rows(tmp_path / "local.db") == _rows(tmp_path / "ray.db")
    assert execute(specs, distributed, Execution(backend="ray", progress=False)) == (0, [])  # nothing to run


def test_a_grid_sweeps_a_protocols_stream_parameters():
    import yaml

    values = yaml.safe_load(
        "models: [resnet20]\nmethods: [tent]\ncorruptions: [fog]\nprotocols: [label_shift]\n"
        "stream:\n  imbalance_ratio: [1, 10, .inf]\n"
    )
    grid = Grid.from_mapping(values)
    grid.validate()
    assert [spec.imbalance_ratio for spec in grid.specs()] == [1, 10, math.inf]
    assert (
        Grid(models=["resnet20"], methods=["tent"], corruptions=["fog"]).specs()[0].imbalance_ratio
        == math.inf
    )
    for bad, message in (({"noisy": [1]}, "unknown stream parameter"), ({"noise": [-1]}, "non-negative")):
        with pytest.raises(ValueError, match=message):
            Grid(models=["resnet20"], methods=["tent"], corruptions=["fog"], stream=bad).validate()


@needs_assets()
def test_a_swept_option_reaches_only_the_methods_that_take_it():
    grid = Grid(models=["resnet20"], methods=["noadapt", "tent", "zerosiam"], corruptions=["fog"],
                sweep={"predictor": ["identity", "random_learned"]})  # fmt: skip
    grid.validate()
    assert sorted((s.method, s.hparams.get("predictor", "-")) for s in grid.specs()) == [
        ("noadapt", "-"), ("tent", "-"), ("zerosiam", "identity"), ("zerosiam", "random_learned")
    ]  # fmt: skip
    with pytest.raises(ValueError, match="'alpha' applies to none of the grid's methods"):
        Grid(models=["resnet20"], methods=["tent"], corruptions=["fog"], sweep={"alpha": [1.0]}).validate()


@needs_assets()
def test_a_grids_prelude_goes_to_every_run_and_is_checked():
    prelude = {"method": "tent", "steps": 5, "lr_scale": 10}
    grid = Grid(models=["resnet20"], methods=["noadapt", "zerosiam"], corruptions=["fog"], prelude=prelude)
    grid.validate()
    assert all(spec.prelude == prelude for spec in grid.specs())
    for bad, message in (
        ({"method": "tent"}, "needs a method and a number of steps"),
        (
            {"method": "tent", "steps": 5, "alpha": 2},
            "prelude option 'alpha' does not apply to method 'tent'",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            Grid(models=["resnet20"], methods=["tent"], corruptions=["fog"], prelude=bad).validate()


def test_a_grids_guards_are_an_axis_and_an_unknown_one_is_refused_before_any_run():
    grid = Grid.from_mapping(
        {
            "models": ["resnet20"],
            "methods": ["noadapt", "tent", "zerosiam"],
            "corruptions": ["fog"],
            "guards": ["none", "auto"],
        }
    )
    grid.validate()
    assert sorted((s.method, s.guard) for s in grid.specs()) == [
        ("noadapt", "none"),
        ("tent", "auto"),
        ("tent", "none"),
        ("zerosiam", "auto"),
        ("zerosiam", "none"),
    ]  # NoAdapt has nothing to guard: once
    assert Grid(models=["resnet20"], methods=["tent"]).guards == ["none"]
    with pytest.raises(ValueError, match="guard 'oracle'"):
        Grid(models=["resnet20"], methods=["tent"], guards=["oracle"]).validate()


def test_rate_factors_scale_each_methods_rate_and_leave_factor_one_runs_as_they_were():
    from zerosiam.bench.grid import scaled

    grid = Grid(models=["resnet20"], methods=["noadapt", "tent"], corruptions=["fog"], hparams={})
    plain = grid.specs()
    specs = scaled(
        [s if s.method == "noadapt" else dataclasses.replace(s, hparams={"lr_scale": 0.3}) for s in plain],
        [1, 10],
    )
    assert sorted((s.method, s.hparams.get("lr_scale")) for s in specs) == [
        ("noadapt", None), ("tent", 0.3), ("tent", 3.0)
    ]  # fmt: skip
    assert scaled(plain, [1]) == plain
    with pytest.raises(ValueError, match="rate_factors must be positive numbers"):
        Grid(models=["resnet20"], methods=["tent"], rate_factors=[0]).validate()


def test_stacking_groups_batch1_runs_that_differ_only_in_corruption_and_seed():
    grid = Grid(models=["resnet26_gn"], methods=["noadapt", "tent", "sar", "zerosiam"],
                corruptions=["fog", "snow", "frost"], protocols=["bs1", "mild"], seeds=[0, 1])  # fmt: skip
    specs = grid.specs()
    assert [[values] for values in (s.as_dict() for s in specs)] == tasks_of(specs, stack=False)
    tasks = tasks_of(specs, stack=True, most=4)
    assert sorted(run_id for task in tasks for run_id in run_ids_of(task)) == sorted(s.run_id for s in specs)
    stacked = [task for task in tasks if len(task) > 1]
    assert sorted(len(task) for task in stacked) == [2] * 4 + [4] * 4  # 6 runs of each method: 4 + 2
    for task in stacked:
        assert {values["protocol"] for values in task} == {"bs1"}
        shared = [{k: v for k, v in values.items() if k not in ("corruption", "seed")} for values in task]
        assert all(one == shared[0] for one in shared)
    assert {values["seed"] for task in stacked for values in task} == {0, 1}
    assert all(len(task) == 1 for task in tasks if task[0]["protocol"] == "mild")
    mlp = Grid(models=["resnet26_gn"], methods=["zerosiam"], corruptions=["fog", "snow"], protocols=["bs1"],
               hparams={"predictor": "mlp"}).specs()  # fmt: skip
    assert len(tasks_of(mlp, stack=True)) == 2  # the MLP predictor does not stack


def test_a_stacked_grid_stores_what_the_unstacked_one_does(fake_domains, tiny_model, tmp_path):
    specs = Grid(models=["resnet20"], methods=["noadapt", "zerosiam", "sar"], corruptions=["fog", "snow"],
                 protocols=["bs1"], hparams={"lr": 0.05}).specs()  # fmt: skip
    stacked, alone = ResultStore(tmp_path / "stacked.db"), ResultStore(tmp_path / "alone.db")
    assert execute(specs, stacked, Execution(backend="inline", progress=False, stack=True)) == (6, [])
    assert execute(specs, alone, Execution(backend="inline", progress=False)) == (6, [])
    for spec in specs:
        mine, theirs = stacked.get(spec.run_id), alone.get(spec.run_id)
        assert mine["metrics"]["accuracy"] == pytest.approx(theirs["metrics"]["accuracy"])
        assert mine["metrics"]["streams"] == 2 and "streams" not in theirs["metrics"]


def test_a_task_reports_its_first_and_last_step_and_one_per_period_between():
    sent: list[Progress] = []
    report = throttled(sent.append, every=3600)
    for done in range(1, 101):
        report(done, 100)
    assert sent == [Progress(1, 100), Progress(100, 100)]
    every_step: list[Progress] = []
    report = throttled(every_step.append, every=0)
    for done in range(1, 4):
        report(done, 3)
    assert every_step == [Progress(1, 3), Progress(2, 3), Progress(3, 3)]
    assert str(Progress(2500, 10000)) == "2,500/10,000 steps"


def _steps_shown(shown: list[list[Progress]]) -> list[Progress]:
    return [progress for running in shown for progress in running]


def test_an_inline_grid_shows_each_tasks_steps_and_clears_them_when_it_ends(fake_domains, tiny_model):
    specs = Grid(models=["resnet20"], methods=["tent"], corruptions=["fog", "snow"],
                 protocols=["bs1", "mild"], hparams={"lr": 0.05}).specs()  # fmt: skip
    shown: list[list[Progress]] = []
    outcomes: list = []
    tasks = tasks_of(specs, stack=True)
    backends.run_inline(tasks, Execution(backend="inline"), outcomes.append, shown.append)
    assert len(outcomes) == 4 and not any(isinstance(o, Failure) for o in outcomes)
    steps = _steps_shown(shown)
    bs1, mild = 50, 1  # 50 fake images: one image a step, or one batch of 64
    assert steps[0] == Progress(1, bs1) and Progress(bs1, bs1) in steps
    assert steps.count(Progress(1, mild)) == 2  # the two mild runs, one step each
    assert shown[-1] == []  # nothing is running at the end


@needs_assets()
@pytest.mark.slow
def test_local_workers_send_their_steps_to_the_driver(tmp_path):
    """The real pipe between the driver and a spawned worker: the stacked task's steps arrive in order,
    the last before its results."""
    specs = Grid(models=["resnet26_gn"], methods=["tent"], corruptions=["gaussian_noise", "shot_noise"],
                 protocols=["bs1"], limit=40).specs()  # fmt: skip
    shown: list[list[Progress]] = []
    outcomes: list = []
    backends.run_local(tasks_of(specs, stack=True), Execution(workers=1), outcomes.append, shown.append)
    assert len(outcomes) == 2 and not any(isinstance(o, Failure) for o in outcomes)
    steps = _steps_shown(shown)
    assert steps[0] == Progress(1, 40) and steps[-1] == Progress(40, 40)
    assert [p.done for p in steps] == sorted(p.done for p in steps)
    assert shown[-1] == []


@pytest.mark.parametrize("guard", ["sar", "auto"])
def test_a_guarded_run_that_its_unguarded_run_shows_to_be_that_run_is_not_made(
    fake_domains, tiny_model, tmp_path, guard
):
    """SAR's rule replayed on a stored unguarded run (its ``sar_guard_fires``), or ``auto`` watching it as
    it ran (``auto_guard_fires``), spares the guarded run where it never fires: the guard would never have
    acted. Where it fires, the guarded run is made."""
    from zerosiam.bench.guard_goals import guard_scores

    specs = Grid(models=["resnet20"], methods=["noadapt", "tent"], corruptions=["fog", "snow"],
                 protocols=["bs1"], guards=["none", guard], sweep={"lr": [1e-4, 1000.0]}).specs()  # fmt: skip
    store = ResultStore(tmp_path / "guards.db")
    assert execute(specs, store, Execution(backend="inline", progress=False)) == (8, [])  # of 10: 2 spared
    spared = [s for s in specs if not store.has(s.run_id)]
    assert [(s.guard, s.hparams["lr"]) for s in spared] == [(guard, 1e-4)] * 2
    made = [store.get(s.run_id)["metrics"] for s in specs if s.guard == guard and store.has(s.run_id)]
    assert len(made) == 2 and all(m["guard_triggers"] for m in made)
    worn = [s for s in specs if s.guard == guard]
    unguarded = [store.get(dataclasses.replace(s, guard="none").run_id)["metrics"] for s in worn]
    fires = {
        (s.hparams["lr"], metrics[f"{guard}_guard_fires"]) for s, metrics in zip(worn, unguarded, strict=True)
    }
    assert fires == {(1e-4, False), (1000.0, True)}
    alone = ResultStore(tmp_path / "alone.db")  # no unguarded run there: the spared runs are made
    assert execute(spared, alone, Execution(backend="inline", progress=False)) == (2, [])
    for spec in spared:
        unguarded = store.get(dataclasses.replace(spec, guard="none").run_id)
        worn = alone.get(spec.run_id)
        assert worn["metrics"]["guard_triggers"] == 0
        assert worn["metrics"]["accuracy"] == unguarded["metrics"]["accuracy"]
        assert worn["curves"]["accuracy"] == unguarded["curves"]["accuracy"]
    score = next(score for score in guard_scores(store.rows("vision")) if score.guard == guard)
    assert (score.cells, score.stand_ins) == (4, 2)  # judged on every cell, 2 of them by the unguarded run


def test_runs_stored_from_another_device_are_made_again_here_and_replace_their_rows(
    fake_domains, tiny_model, tmp_path
):
    """``--remake-from``: a guard cell whose runs came from two devices is brought onto this one; the runs
    of other devices, and every run without ``remake``, stay as stored."""
    from zerosiam.bench.execution import made_on

    specs = Grid(models=["resnet20"], methods=["noadapt", "tent"], corruptions=["fog", "snow"],
                 protocols=["mild"]).specs()  # fmt: skip
    store = ResultStore(tmp_path / "remake.db")
    assert execute(specs, store, Execution(backend="inline", progress=False)) == (4, [])
    tent = next(s for s in specs if s.method == "tent" and s.corruption == "fog")
    row = store.get(tent.run_id)
    gpu_env = {**row["env"], "gpu": "NVIDIA H200"}
    store.put(
        tent.run_id, "vision", row["spec"], {**row["metrics"], "accuracy": 0.123}, {}, gpu_env, replace=True
    )
    assert made_on(store.get(tent.run_id), "gpu") and made_on(store.get(tent.run_id), "h200")
    assert not made_on(store.get(tent.run_id), "cpu")
    assert execute(specs, store, Execution(backend="inline", progress=False)) == (0, [])
    assert execute(specs, store, Execution(backend="inline", progress=False), remake="H200") == (1, [])
    again = store.get(tent.run_id)
    assert "gpu" not in again["env"] and again["metrics"]["accuracy"] == row["metrics"]["accuracy"]
    assert execute(specs, store, Execution(backend="inline", progress=False), remake="H200") == (0, [])


def test_one_device_makes_again_only_what_keeps_a_guard_cell_off_one_device(
    fake_domains, tiny_model, tmp_path
) -> None:
    """``--one-device``: of the cells whose guards' runs ran on different devices, the runs not made here
    are made again here, the unguarded first; a guard that a remade unguarded run shows never acting is
    judged on it, its own run (elsewhere) not made again. Cells on one device, or judged on one with a
    stand-in, are left as they are."""
    from zerosiam.bench.execution import device_here, off_device
    from zerosiam.bench.guard_goals import guard_scores

    specs = Grid(models=["resnet20"], methods=["noadapt", "tent"], corruptions=["fog", "snow"],
                 protocols=["bs1"], guards=["none", "sar"], sweep={"lr": [1e-4, 1000.0]}).specs()  # fmt: skip
    store = ResultStore(tmp_path / "one.db")
    inline = Execution(backend="inline", progress=False)
    assert execute(specs, store, inline) == (8, [])
    tent = {(s.corruption, s.hparams["lr"], s.guard): s for s in specs if s.method == "tent"}

    def move(spec, env: dict, drop: str | None = None) -> None:
        row = store.get(spec.run_id)
        metrics = {k: v for k, v in row["metrics"].items() if k != drop}
        store.put(spec.run_id, "vision", row["spec"], metrics, {}, {**row["env"], **env}, replace=True)

    gpu = {"gpu": "NVIDIA H200"}
    move(tent["fog", 1000.0, "sar"], gpu)  # SAR's reset fires here: its run must come here
    move(tent["snow", 1000.0, "none"], gpu)  # the unguarded run must come here
    quiet = tent["snow", 1e-4, "none"]
    move(quiet, gpu, drop="sar_guard_fires")  # it cannot tell whether SAR's reset acts ...
    row = store.get(quiet.run_id)
    spare = dataclasses.replace(quiet, guard="sar")  # ... beside a SAR run on an unnamed CPU
    store.put(spare.run_id, "vision", spare.as_dict(), row["metrics"], {}, {"device": "cpu"})
    assert len(off_device(specs, store, device_here("cpu"))) == 4
    assert execute(specs, store, inline, one_device=True) == (3, [])
    here = device_here("cpu")
    assert all(store.get(tent[key].run_id)["env"].get("cpu_model") for key in
               [("fog", 1000.0, "sar"), ("snow", 1000.0, "none"), ("snow", 1e-4, "none")])  # fmt: skip
    assert store.get(spare.run_id)["env"] == {"device": "cpu"}  # not made again: the new twin shows it
    assert off_device(specs, store, here) == set()
    assert execute(specs, store, inline, one_device=True) == (0, [])
    sar = next(score for score in guard_scores(store.rows("vision")) if score.guard == "sar")
    assert (sar.cells, sar.across_devices) == (4, 0)
