"""``zerosiam bench`` on a user's own model: a builder function and its options from the command line."""

from __future__ import annotations

import pytest

from tests.cli.test_bench_faults import bench, finish
from tests.conftest import needs_assets
from zerosiam.bench.store import ResultStore

USER_MODEL = ["--model", "builder:tests.toys:cifar_toy", "--corruptions", "fog", "--protocols", "mild",
              "--methods", "noadapt,zerosiam", "--limit", "64"]  # fmt: skip


@needs_assets()
@pytest.mark.slow
def test_a_users_builder_runs_with_its_normalization_from_the_command_line(tmp_path):
    db = tmp_path / "user.db"
    code, out, err = finish(
        bench(
            db,
            *USER_MODEL,
            "--model-option",
            "mean=0",
            "--model-option",
            "std=1",
            "--model-option",
            "dataset=cifar10",
        )
    )
    assert code == 0, err[-2000:]
    assert "2 run(s) executed, 0 already in" in out
    rows = ResultStore(db).rows("vision")
    assert {row["spec"]["model_options"]["std"] for row in rows} == {1}
    assert all(row["metrics"]["samples"] == 64 for row in rows)


def test_a_builder_without_its_normalization_is_refused_before_any_work(tmp_path):
    code, out, err = finish(bench(tmp_path / "x.db", *USER_MODEL))
    assert code == 2 and err.startswith("zerosiam: error: model 'builder:tests.toys:cifar_toy'")
    assert "mean" in err and err.count("\n") == 1 and not (tmp_path / "x.db").exists()


def test_flags_override_the_grid_file_and_options_join_its_own(tmp_path):
    """``Grid.from_yaml`` reads the file; a given flag replaces its value, ``--set``/``--sweep`` entries join
    the file's, and a file that names no models or methods gets the command's defaults."""
    import argparse

    from zerosiam.cli import bench as command

    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text("methods: [tent]\ncorruptions: benchmark\nhparams: {lr: 0.001}\n")
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())

    def grid_of(*flags: str):
        return command.grid_from_args(parser.parse_args(["bench", "--grid", str(grid_file), *flags]))

    grid = grid_of("--set", "lr_scale=2")
    assert grid.models == ["resnet20"] and grid.methods == ["tent"] and len(grid.corruptions) == 15
    assert grid.hparams == {"lr": 0.001, "lr_scale": 2} and grid.rates == "paper"
    grid = grid_of("--methods", "zerosiam", "--corruptions", "fog", "--set", "lr=0.01")
    assert grid.methods == ["zerosiam"] and grid.corruptions == ["fog"] and grid.hparams == {"lr": 0.01}
