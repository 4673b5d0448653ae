"""Inputs ``zerosiam bench`` and ``zerosiam report`` refuse in one line (``zerosiam: error: …``, exit code 2)
before any work and before anything is written, and the model output a benchmark can be told to read.

Every grid here runs on the fake 4×4 data of ``fake_domains`` with the toy models of ``tests/cli/toys.py``
and the inline backend, so a check that let a bad input through would cost a second, not a benchmark.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.cli.toys import TOY_OPTIONS
from zerosiam.bench.store import ResultStore
from zerosiam.cli import main

TOY = "builder:tests.cli.toys:flat_ln"
AXES = ["--corruptions", "fog", "--protocols", "mild", "--backend", "inline", "--no-report"]


def bench(db: Path, *flags: str, model: str = TOY, options: list[str] = TOY_OPTIONS) -> list[str]:
    """The argv of ``zerosiam bench`` on ``model`` over the fake data, writing into ``db``."""
    return ["bench", "--model", model, *options, *AXES, "--db", str(db), *flags]


def refused(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    """The one line a command refuses ``argv`` with (exit code 2, nothing on standard output)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    out, err = capsys.readouterr()
    assert stop.value.code == 2, err
    assert err.startswith("zerosiam: error: ") and err.count("\n") == 1 and out == "", err
    return err


def refused_report(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    """``zerosiam report``'s refusal: the same one line and exit code 2, returned rather than raised (its
    functions give their exit code)."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("zerosiam: error: ") and err.count("\n") == 1 and out == "", err
    return err


# ------------------------------------------------------------------------------------------------ --db


def a_file_in_the_way(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("not a folder")
    return tmp_path / "notes.txt" / "results.db"


@pytest.mark.usefixtures("fake_domains")
def test_bench_refuses_a_db_that_is_a_folder_without_writing(tmp_path, capsys):
    folder = tmp_path / "runs"
    folder.mkdir()
    err = refused(capsys, bench(folder, "--methods", "noadapt"))
    assert f"--db {folder} is a folder" in err and list(folder.iterdir()) == []


@pytest.mark.usefixtures("fake_domains")
def test_bench_refuses_a_db_under_a_file(tmp_path, capsys):
    db = a_file_in_the_way(tmp_path)
    err = refused(capsys, bench(db, "--methods", "noadapt"))
    assert f"{tmp_path / 'notes.txt'} is a file, not a folder" in err
    assert (tmp_path / "notes.txt").read_text() == "not a folder"


@pytest.mark.usefixtures("fake_domains")
def test_bench_refuses_a_db_where_no_file_can_be_created(tmp_path, capsys):
    err = refused(capsys, bench(Path("/proc/zerosiam-test.db"), "--methods", "noadapt"))
    assert "--db /proc/zerosiam-test.db: cannot open or create a SQLite file there" in err
    assert not Path("/proc/zerosiam-test.db").exists()


@pytest.mark.usefixtures("fake_domains")
def test_bench_refuses_a_db_that_is_not_sqlite(tmp_path, capsys):
    db = tmp_path / "notes.db"
    db.write_text("my notes\n")
    err = refused(capsys, bench(db, "--methods", "noadapt"))
    assert f"--db {db} is not a SQLite file" in err and db.read_text() == "my notes\n"


def test_a_db_that_cannot_be_opened_leaves_nothing_it_made(tmp_path, monkeypatch):
    """What ``open_for_writing`` created for a store it then could not open (folders, the file) is removed
    again; a missing folder is created when the store opens, as ``runs/quick.db`` in a fresh clone needs."""
    import sqlite3

    from zerosiam.bench import store as store_module
    from zerosiam.cli._db import open_for_writing
    from zerosiam.cli._errors import UsageError

    store = open_for_writing(tmp_path / "new" / "deeper" / "quick.db")
    assert store.path.is_file() and store.rows("vision") == []

    def unopenable(self, path, timeout=60.0):
        Path(path).write_bytes(b"")  # what a failed open may leave behind
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(store_module.ResultStore, "__init__", unopenable)
    with pytest.raises(UsageError, match="cannot open or create a SQLite file there"):
        open_for_writing(tmp_path / "a" / "b" / "c.db")
    assert not (tmp_path / "a").exists()


@pytest.mark.usefixtures("fake_domains")
def test_bench_creates_the_missing_folders_of_its_db(tmp_path, capsys):
    db = tmp_path / "runs" / "nested" / "quick.db"
    assert main(bench(db, "--methods", "noadapt", "--limit", "20")) == 0
    assert [row["spec"]["method"] for row in ResultStore(db).rows("vision")] == ["noadapt"]


@pytest.mark.parametrize(
    ("place", "says"),
    [
        ("folder", "is a folder without runs.jsonl"),
        ("under a file", "is a file, not a folder"),
        ("proc", "does not exist"),
        ("not sqlite", "is not a SQLite file"),
    ],
)
def test_report_refuses_a_db_that_holds_no_store_in_one_line(tmp_path, capsys, place, says):
    db = {
        "folder": tmp_path,
        "under a file": a_file_in_the_way(tmp_path),
        "proc": Path("/proc/zerosiam-test.db"),
        "not sqlite": tmp_path / "notes.db",
    }[place]
    if place == "not sqlite":
        db.write_text("my notes\n")
    before = sorted(tmp_path.rglob("*"))
    err = refused_report(capsys, ["report", "--db", str(db)])
    assert says in err and sorted(tmp_path.rglob("*")) == before


# ------------------------------------------------------------------------------------ hf: weight files


def damaged(folder: Path, how: str) -> Path:
    """``folder``'s ``model.safetensors`` cut in half, or its header overwritten."""
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\xff" * 16 + data[16:])
    return weights


@pytest.mark.usefixtures("fake_domains")
@pytest.mark.parametrize("how", ["truncated", "overwritten"])
def test_a_damaged_weights_file_of_an_hf_folder_is_named_before_any_work(tmp_path, capsys, how):
    pytest.importorskip("transformers")
    from tests.zoo.test_hugging_face import save_classifier

    folder = save_classifier(tmp_path / "vit")
    weights = damaged(folder, how)
    db = tmp_path / "x.db"
    err = refused(capsys, bench(db, "--methods", "noadapt,tent", model=f"hf:{folder}", options=[]))
    assert f"weights file {weights} is damaged" in err and not db.exists()
    err = refused(capsys, ["select-lr", "--model", f"hf:{folder}", "--lr", "1e-3", "--db", str(db)])
    assert f"weights file {weights} is damaged" in err and not db.exists()


# --------------------------------------------------------------------------------------- --set numbers


@pytest.mark.usefixtures("fake_domains")
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--set", "lr=nan"], "lr=nan is not allowed: lr must be a finite number ≥ 0"),
        (["--set", "lr=inf"], "lr=inf is not allowed: lr must be a finite number ≥ 0"),
        (["--set", "lr=abc"], "lr='abc' is a str: lr must be a finite number ≥ 0"),
        (["--set", "lr=-1e-3"], "lr=-0.001 is not allowed: lr must be a finite number ≥ 0"),
        (["--set", "momentum=1"], "momentum=1 is not allowed: momentum must be a finite number ≥ 0 and < 1"),
        (["--sweep", "lr=1e-3,nan"], "lr=nan is not allowed"),
    ],
)
def test_a_bad_number_for_adapt_is_refused_before_any_work(tmp_path, capsys, flags, says):
    db = tmp_path / "x.db"
    err = refused(capsys, bench(db, "--methods", "tent", *flags))
    assert says in err and not db.exists()


def test_one_device_on_a_ray_cluster_is_refused_before_any_work(tmp_path, capsys):
    """``--one-device`` makes runs again on this machine's device: Ray could place them elsewhere."""
    db = tmp_path / "x.db"
    err = refused(capsys, bench(db, "--methods", "tent", "--one-device", "--backend", "ray"))
    assert "--one-device makes runs again on this machine" in err and not db.exists()


def test_decoding_on_the_device_without_image_files_is_refused_before_any_work(tmp_path, capsys):
    """``--decode-on-device`` has the device decode a folder's JPEG files; the project's builds are arrays."""
    db = tmp_path / "x.db"
    err = refused(capsys, bench(db, "--methods", "tent", "--decode-on-device"))
    assert "--decode-on-device decodes image files, not cifar10c" in err and not db.exists()


@pytest.mark.usefixtures("fake_domains")
def test_a_grid_files_bad_number_is_refused_too(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text("methods: [tent]\nhparams: {lr: .nan}\n")
    err = refused(capsys, bench(tmp_path / "x.db", "--grid", str(grid)))
    assert "lr=nan is not allowed" in err


# ---------------------------------------------------------------------------- models with nothing to adapt


@pytest.mark.usefixtures("fake_domains")
def test_a_model_without_norm_layers_is_refused_for_an_adapting_method(tmp_path, capsys):
    db = tmp_path / "x.db"
    err = refused(capsys, bench(db, "--methods", "noadapt,tent", model="builder:tests.cli.toys:no_norm"))
    assert "cannot run 'tent': tent adapts the weight and bias of norm layers" in err
    assert "Sequential has none" in err and "noadapt" in err and not db.exists()


@pytest.mark.usefixtures("fake_domains")
def test_a_torchscript_model_is_refused_for_an_adapting_method_and_scored_with_noadapt(tmp_path, capsys):
    import torch

    from tests.cli.toys import flat_ln

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch marks TorchScript deprecated
        torch.jit.save(torch.jit.script(flat_ln()), tmp_path / "net.pt")
    model, db = f"torchscript:{tmp_path / 'net.pt'}", tmp_path / "x.db"
    err = refused(capsys, bench(db, "--methods", "noadapt,zerosiam", model=model))
    assert "cannot run 'zerosiam'" in err and "a TorchScript model hides its layers" in err
    assert not db.exists()
    assert main(bench(db, "--methods", "noadapt", "--limit", "20", model=model)) == 0


# ------------------------------------------------------------------------------------------------ output


@pytest.mark.usefixtures("fake_domains")
def test_the_field_holding_the_logits_is_a_model_option_of_the_run(tmp_path, capsys):
    """A model returning a dict of two tensors runs once its field is named with ``--model-option
    output=``: the zoo's wrapper reads the logits where the model is loaded (for the class count, the
    source model's predictions and every run), and the choice is part of each run's identity."""
    model, db = "builder:tests.cli.toys:two_outputs", tmp_path / "x.db"
    err = refused(capsys, bench(db, "--methods", "noadapt,tent", model=model))
    assert "cannot tell which field" in err and "--model-option output=NAME" in err
    err = refused(capsys, bench(db, "--methods", "tent", "--set", "output=scores", model=model))
    assert "--model-option output=NAME" in err and not db.exists()
    flags = ["--methods", "noadapt,tent", "--limit", "20", "--model-option", "output=scores"]
    assert main(bench(db, *flags, model=model)) == 0
    rows = ResultStore(db).rows("vision")
    assert sorted(row["spec"]["method"] for row in rows) == ["noadapt", "tent"]
    assert all(row["spec"]["model_options"]["output"] == "scores" for row in rows)


def test_load_model_reads_the_named_field_as_the_logits():
    import torch

    import zerosiam

    model = zerosiam.load_model(
        "builder:tests.cli.toys:two_outputs", mean=0, std=1, input_size=4, output="aux"
    )
    assert model(torch.rand(2, 3, 4, 4)).shape == (2, 3)


# ------------------------------------------------------------------------------------------- no grid


def test_bench_with_nothing_to_run_shows_the_usage_and_the_quick_command(tmp_path, capsys, monkeypatch):
    from zerosiam.cli.bench import QUICK

    monkeypatch.chdir(tmp_path)
    for argv in (["bench"], ["bench", "--workers", "1", "--db", "x.db"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        out, err = capsys.readouterr()
        *usage, last = err.splitlines()
        assert stop.value.code == 2 and out == "" and usage[0].startswith("usage: zerosiam bench")
        assert last.startswith("zerosiam: error: no grid given") and last.endswith(QUICK)
    assert list(tmp_path.iterdir()) == []


def test_the_quick_command_is_the_readmes():
    from zerosiam.cli.bench import QUICK

    assert QUICK in (Path(__file__).resolve().parents[2] / "README.md").read_text()
