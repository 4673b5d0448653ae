"""One spec, one number: determinism, replicas, the environment that decides rounding, and the noise rule."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tests.bench.test_guard_goals import guarded
from tests.bench.test_report import make_row, report_main
from tests.bench.test_summary import cell_rows
from zerosiam.bench import runner, summary
from zerosiam.bench.environment import cpu_model, environment, vector_extensions
from zerosiam.bench.grid import Grid, GridError
from zerosiam.bench.guard_goals import guard_scores
from zerosiam.bench.noise import NOISE_BANDS, Noise, noise_cells, noise_of
from zerosiam.bench.replica import ROUNDING_STEP, jittered
from zerosiam.bench.runner import RunSpec
from zerosiam.parts.guards import SourceProbe, guard_settings

UNTIMED = ("seconds", "peak_rss_mb", "data_wait_fraction")  # what may differ between two executions


def _spec(**changes: Any) -> RunSpec:
    values = dict(
        model="resnet20", dataset="cifar10c", corruption="fog", severity=5, protocol="bs1", method="zerosiam"
    )
    return RunSpec(**{**values, "batch_size": 1, "hparams": {"lr": 0.05}, **changes})


def _computed(result: runner.Result) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """What a run computed: its metrics less the clock and memory, and its curves."""
    return {k: v for k, v in result.metrics.items() if k not in UNTIMED}, result.curves


def _same_bits(a: runner.Result, b: runner.Result) -> None:
    (metrics_a, curves_a), (metrics_b, curves_b) = _computed(a), _computed(b)
    assert metrics_a == metrics_b
    assert curves_a.keys() == curves_b.keys()
    for key, curve in curves_a.items():  # NaN == NaN here: the same bits
        assert torch.equal(
            torch.tensor(curve).nan_to_num(7.0), torch.tensor(curves_b[key]).nan_to_num(7.0)
        ), key


# ------------------------------------------------------------------------------------------ determinism


@pytest.mark.parametrize("protocol", ["bs1", "blind_spot", "mild"])
def test_one_spec_run_twice_on_one_machine_gives_the_same_bits(fake_domains, tiny_model, protocol):
    spec = _spec(protocol=protocol, batch_size=1 if protocol != "mild" else 8)
    _same_bits(runner.run(spec), runner.run(spec))


def test_stacked_runs_repeat_bit_for_bit_too(fake_domains, tiny_model):
    specs = [_spec(corruption=name) for name in ("fog", "snow", "frost")]
    for first, second in zip(runner.run_stacked(specs), runner.run_stacked(specs), strict=True):
        _same_bits(first, second)


@pytest.mark.slow
def test_a_real_model_on_real_images_repeats_bit_for_bit():
    """The project's ResNet-26 on the real corrupted CIFAR-10, 256 images one at a time at ten times
    ZeroSiam's chosen rate: two executions of one spec on one machine are one number."""
    spec = RunSpec(
        model="resnet26_gn",
        dataset="cifar10c",
        corruption="impulse_noise",
        severity=5,
        protocol="bs1",
        method="zerosiam",
        batch_size=1,
        limit=256,
        hparams={"lr_scale": 10.0},
    )
    _same_bits(runner.run(spec), runner.run(spec))


# ---------------------------------------------------------------------------------------------- replicas


def test_a_replica_moves_each_input_value_by_at_most_one_rounding_step():
    x = torch.rand(4, 3, 8, 8) + 0.01
    assert jittered(x, [0], 5) is x  # replica 0: the run itself
    moved = jittered(x, [1], 5)
    relative = ((moved - x) / x).abs()
    assert 0 < relative.max() <= 2.01 * ROUNDING_STEP and (moved == x).any()
    assert torch.equal(moved, jittered(x, [1], 5))  # the same replica and step: the same pattern
    assert not torch.equal(moved, jittered(x, [2], 5)) and not torch.equal(moved, jittered(x, [1], 6))


def test_stacked_streams_are_each_moved_by_their_own_replica():
    x = torch.rand(6, 3, 4, 4) + 0.01
    moved = jittered(x, [0, 1, 2], 3)
    assert torch.equal(moved[:2], x[:2])
    assert torch.equal(moved[2:4], jittered(x[2:4], [1], 3)) and torch.equal(
        moved[4:], jittered(x[4:], [2], 3)
    )


def test_replica_zero_keeps_the_run_id_and_a_replica_is_a_run_of_its_own(fake_domains, tiny_model):
    assert _spec(replica=0).run_id == _spec().run_id  # every run stored before replicas keeps its id
    assert _spec(replica=1).run_id != _spec().run_id
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="replica"):
            _spec(replica=bad)
    alone, replica = runner.run(_spec()), runner.run(_spec(replica=1))
    assert alone.curves["entropy"] != replica.curves["entropy"]  # another rounding, from the first step
    assert alone.curves["entropy"] == pytest.approx(replica.curves["entropy"], rel=1e-3, nan_ok=True)


def test_replicas_stack_and_each_gets_what_it_gets_alone(fake_domains, tiny_model):
    specs = [_spec(replica=1), _spec(replica=2), _spec(corruption="snow", replica=1)]
    for spec, stacked in zip(specs, runner.run_stacked(specs), strict=True):
        assert stacked.metrics["accuracy"] == pytest.approx(runner.run(spec).metrics["accuracy"])


def test_a_grid_makes_each_adapting_run_once_per_replica_and_noadapt_once():
    grid = Grid(models=["resnet20"], methods=["noadapt", "tent"], corruptions=["fog"], replicas=[0, 1, 2])
    specs = grid.specs()
    assert sorted((s.method, s.replica) for s in specs) == [
        ("noadapt", 0),
        ("tent", 0),
        ("tent", 1),
        ("tent", 2),
    ]
    for bad in ([], [-1], [0.5]):
        with pytest.raises(GridError, match="replicas"):
            Grid(models=["resnet20"], methods=["tent"], replicas=bad).validate()


# ------------------------------------------------------------------------------------------- environment


def test_the_environment_names_what_decides_rounding(fake_domains, tiny_model):
    env = environment()
    assert env["cpu_model"] == cpu_model() and env["cpu_model"]
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["cpu_vector"] == vector_extensions() and env["threads"] == torch.get_num_threads()
    specs = [_spec(corruption=name) for name in ("fog", "snow")]
    assert [r.env["stack"] for r in runner.run_stacked(specs)] == [
        {"streams": 2, "place": 0},
        {"streams": 2, "place": 1},
    ]
    assert runner.run(specs[0]).env["stack"] == {"streams": 1, "place": 0}


def test_a_guarded_run_records_the_settings_its_guard_ran_with(fake_domains, tiny_model):
    recorded = runner.run(_spec(guard="auto")).env["guard_settings"]
    assert recorded == guard_settings("auto") and recorded["min_agreement"] == SourceProbe().min_agreement
    assert recorded["max_widening"] == "inf" and recorded["rows"] is None  # JSON has no infinity: a string
    assert guard_settings("rdumb") == {"every": 1000}
    assert "guard_settings" not in runner.run(_spec()).env


def test_vector_extensions_are_read_from_the_cpus_flags(tmp_path, monkeypatch):
    from zerosiam.bench import environment as module

    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Test CPU 9000\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f\n")
    monkeypatch.setattr(module, "_CPUINFO", info)
    assert (cpu_model(), vector_extensions()) == (
        "Test CPU 9000",
        ["sse4_2", "avx", "avx2", "fma", "avx512f"],
    )


# ------------------------------------------------------------------------------------------- noise rule


def replicated(method: str, corruption: str, accuracies: list[float], **kwargs: Any) -> list[dict[str, Any]]:
    """The run (replica 0) and its replicas 1, 2, ... at ``accuracies``."""
    rows = []
    for replica, accuracy in enumerate(accuracies):
        row = make_row(method, corruption, accuracy, **kwargs)
        if replica:
            row["spec"]["replica"] = replica
            row["run_id"] += f"-r{replica}"
        rows.append(row)
    return rows


def test_the_noise_table_has_the_replica_and_the_seed_spread():
    rows = replicated("tent", "fog", [0.50, 0.52, 0.56]) + replicated("tent", "snow", [0.60, 0.60, 0.61])
    rows += [make_row("tent", "fog", value, seed=seed) for seed, value in ((1, 0.40), (2, 0.45))]
    rows += replicated("tent", "fog", [0.5, 0.6], protocol="label_shift")  # two executions: too few
    (cell,) = noise_cells(rows)
    assert (cell.model, cell.protocol, cell.replicas.groups) == ("resnet20", "mild", 2)
    assert cell.replicas.largest_range == pytest.approx(6.0)
    fog, snow = torch.tensor([50.0, 52, 56]).var(), torch.tensor([60.0, 60, 61]).var()
    assert cell.replicas.pooled_std == pytest.approx(math.sqrt((fog + snow) / 2))
    assert (cell.seeds.groups, cell.seeds.largest_range) == (1, pytest.approx(10.0))  # seeds 0–2 of fog


def test_a_difference_counts_only_beyond_the_noise():
    noise = Noise(
        {("resnet20", "mild"): 1.0, ("resnet20", "label_shift"): 3.0, ("resnet20", "blind_spot"): 9}
    )
    assert noise.of_run("resnet20", "mild", "noadapt") == 0.0
    assert noise.of_run("resnet20", "mixed", "tent") == 3.0  # unmeasured: the model's largest at batch 64
    assert noise.of_run("resnet20", "bs1", "tent") == 9.0  # and at batch 1
    assert noise.of_run("vit", "mild", "tent") == 3.0  # unmeasured model: the largest at its batch size
    assert noise.band("resnet20", "mild", ("tent", "noadapt")) == pytest.approx(NOISE_BANDS)
    assert noise.band("resnet20", "mild", ("tent", "zerosiam"), (4, 4)) == pytest.approx(
        NOISE_BANDS * math.sqrt(0.5)
    )
    assert noise.beyond(2.1, "resnet20", "mild", ("tent", "noadapt"))
    assert not noise.beyond(-1.9, "resnet20", "mild", ("tent", "noadapt"))


def test_the_summary_ranks_and_marks_only_beyond_the_noise():
    rows = cell_rows({"noadapt": 0.60, "tent": 0.64, "zerosiam": 0.66})
    quiet = summary.build_summary(rows).cell("mild", "resnet20")
    assert quiet.text == "+6.0 (1/2)"  # one seed, a 2-point lead over Tent counts without noise
    # σ = 4 points per run: over 15 corruptions a mean's band is 2·√(2·16/15) = 2.9; Tent's 2 is inside it
    noisy = summary.build_summary(rows, Noise({("resnet20", "mild"): 4.0})).cell("mild", "resnet20")
    assert noisy.text == "+6.0 (1–2/2)"
    drowned = summary.build_summary(rows, Noise({("resnet20", "mild"): 20.0})).cell("mild", "resnet20")
    assert drowned.text == "≈+6.0 (1–2/2)"  # even NoAdapt is level with it


def test_a_guard_loses_a_cell_only_beyond_its_noise_and_never_across_devices():
    rows = [
        make_row("noadapt", "fog", 0.60),
        make_row("noadapt", "snow", 0.60),
        make_row("tent", "fog", 0.585),
        guarded("tent", "fog", 0.57, "auto"),  # 3 points below: beyond a band of 2·1.2
        make_row("tent", "snow", 0.60),
        guarded("tent", "snow", 0.50, "auto"),
    ]
    rows[-1]["env"] = {"gpu": "NVIDIA H200"}  # its unguarded twin ran on a CPU
    scores = {score.guard: score for score in guard_scores(rows, noise=Noise({("resnet20", "mild"): 1.2}))}
    none, auto = scores["none"], scores["auto"]
    assert (none.cells, none.lost, auto.cells, auto.across_devices) == (1, (), 1, 1)
    assert len(auto.lost) == 1 and "57.0" in auto.lost[0]
    scores = {score.guard: score for score in guard_scores(rows, noise=Noise({("resnet20", "mild"): 2.0}))}
    assert scores["auto"].lost == ()  # 3 points are inside a band of 4


def test_a_guard_that_never_acts_is_judged_on_the_unguarded_run_where_its_own_ran_elsewhere():
    """A guarded run on another device gives way to the unguarded run where that run shows the guard
    never acting on it (the stand-in is the guard's run on the unguarded run's device); where it would
    act, the cell stays set aside."""
    quiet = make_row("tent", "fog", 0.70)
    quiet["metrics"]["sar_guard_fires"] = False
    fires = make_row("tent", "snow", 0.40)
    fires["metrics"]["sar_guard_fires"] = True
    rows = [
        make_row("noadapt", "fog", 0.60),
        make_row("noadapt", "snow", 0.60),
        quiet,
        guarded("tent", "fog", 0.65, "sar"),
        fires,
        guarded("tent", "snow", 0.55, "sar"),
    ]
    for row in rows[3::2]:
        row["env"] = {"gpu": "NVIDIA H200"}  # both guarded runs on a GPU, their twins on a CPU
    sar = next(score for score in guard_scores(rows) if score.guard == "sar")
    assert (sar.cells, sar.stand_ins, sar.across_devices, sar.kept) == (1, 1, 1, pytest.approx(10.0))


def test_report_noise_prints_the_table_and_the_summary_uses_the_stores_noise(tmp_path, capsys):
    from zerosiam.bench.store import ResultStore

    rows = replicated("tent", "fog", [0.50, 0.52, 0.56]) + cell_rows({"noadapt": 0.60, "zerosiam": 0.615})
    store = ResultStore(tmp_path / "results.db")
    for row in rows:
        store.put(row["run_id"], row["kind"], row["spec"], row["metrics"], row["curves"], row["env"])
    assert report_main(["--db", str(tmp_path / "results.db"), "--noise"]) == 0
    printed = capsys.readouterr().out
    assert "| resnet20 | mild | 6.00 / 3.06 (1) | – |" in printed
    assert noise_of(rows).sigma == {("resnet20", "mild"): pytest.approx(3.055, abs=1e-3)}
    assert (
        report_main(["--db", str(tmp_path / "results.db"), "--summary", "--methods", "noadapt,zerosiam"]) == 0
    )
    # one seed: 1.5 points would count (over 1.0), but not beyond a band of 2 · 3.06 / √15 = 1.58
    assert "| mild | ≈+1.5 (1/1) |" in capsys.readouterr().out


def test_a_selection_inside_the_noise_goes_to_the_smallest_rate():
    from zerosiam.bench.select import tie_broken, tied

    table = {"lr_scale=0.3": 0.5900, "lr_scale=1": 0.6025, "lr_scale=3": 0.6034, "lr_scale=10": 0.6037}
    assert tie_broken(table, 0.0) == "lr_scale=10"  # no noise: the best, as before
    assert tied(table, 0.05) == ["lr_scale=3", "lr_scale=10"]
    assert tie_broken(table, 0.2) == "lr_scale=1"  # 10× wins by 0.12 point, inside a band of 0.2
    assert tie_broken({"lr=0.001, predictor_lr=0.01": 0.6, "lr=0.001, predictor_lr=0.001": 0.6}, 0.0) == (
        "lr=0.001, predictor_lr=0.001"
    )
