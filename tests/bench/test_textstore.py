"""The committed text form of a result store: exact round trips, sorted lines, diff-friendly exports, a
cached rebuild, and the commands that read it (``report``) or refuse it (``bench``, ``select-lr``,
``llm``)."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from zerosiam.bench.store import Failure, ResultStore, canonical_json, run_id_for
from zerosiam.bench.textstore import CURVES, RUNS, open_store, write_text


def spec(method: str, corruption: str, seed: int = 0) -> dict:
    return {"model": "resnet20", "dataset": "cifar10c", "corruption": corruption, "severity": 5,
            "protocol": "mild", "method": method, "hparams": {}, "seed": seed, "batch_size": 64,
            "limit": None}  # fmt: skip


def put(store: ResultStore, run_spec: dict, accuracy: float, curves: dict | None = None, kind="vision"):
    metrics = {"accuracy": accuracy, "samples": 10, "steps": 1, "tiny": 1e-300, "third": 1 / 3}
    env = {"torch": "2.x", "note": "a line\u2028separator"}  # U+2028: a line break to str.splitlines
    store.put(run_id_for(run_spec), kind, run_spec, metrics, curves, env)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A cache of this test's own, where the rebuilds of text stores go."""
    monkeypatch.setenv("ZEROSIAM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "text_stores"


@pytest.fixture
def store(tmp_path) -> ResultStore:
    """Four runs (two with curves, one of another kind) and a failure."""
    store = ResultStore(tmp_path / "source.db")
    put(store, spec("noadapt", "fog"), 0.5, {"accuracy": [0.1, 0.2 + 0.1]})
    put(store, spec("tent", "fog"), 0.25, {"accuracy": [0.3, 1e-7]})
    put(store, spec("tent", "snow"), 0.1 + 0.2)
    put(store, {"model": "resnet20", "method": "tent"}, 0.7, kind="lr_selection")
    store.put_failure("broken", "vision", Failure(spec("sar", "fog"), "RuntimeError: boom"))
    return store


def keep_all(row: dict) -> bool:
    return True


def test_sqlite_to_text_to_sqlite_gives_identical_rows(store, tmp_path):
    folder = tmp_path / "study"
    assert write_text(store, folder, keep_all) == 4
    rebuilt = open_store(folder)
    assert rebuilt.rows() == store.rows()  # every column, floats exactly, in the same order
    assert rebuilt.rows("lr_selection") == store.rows("lr_selection")
    assert rebuilt.failures() == []  # failures are not results
    with pytest.raises(PermissionError, match="read-only"):
        put(rebuilt, spec("eata", "fog"), 0.1)


def lines(path) -> list[str]:
    """The lines of a text store's file, split on \\n only (U+2028 in a value is no line break)."""
    text = path.read_bytes().decode("utf-8")
    assert text.endswith("\n") or not text
    return text.split("\n")[:-1]


def test_one_sorted_canonical_line_per_run_and_per_kept_curve(store, tmp_path):
    folder = tmp_path / "study"
    write_text(store, folder, lambda row: row["spec"].get("method") == "noadapt")
    runs = lines(folder / RUNS)
    values = [json.loads(line) for line in runs]
    assert [v["run_id"] for v in values] == sorted(row["run_id"] for row in store.rows())
    assert all(line == canonical_json(value) for line, value in zip(runs, values, strict=True))
    assert set(values[0]) == {"run_id", "kind", "spec", "metrics", "env", "created"}
    kept = {"run_id": run_id_for(spec("noadapt", "fog")), "curves": {"accuracy": [0.1, 0.2 + 0.1]}}
    assert [json.loads(line) for line in lines(folder / CURVES)] == [kept]


def test_a_second_export_only_adds_lines(store, tmp_path):
    folder = tmp_path / "study"
    write_text(store, folder, keep_all)
    before = {name: lines(folder / name) for name in (RUNS, CURVES)}
    put(store, spec("zerosiam", "fog"), 0.9, {"accuracy": [0.5]})
    put(store, spec("zerosiam", "snow"), 0.8, {"accuracy": [0.6]})
    assert write_text(store, folder, lambda row: row["spec"].get("corruption") == "fog") == 2
    after = {name: lines(folder / name) for name in (RUNS, CURVES)}
    for name, added in ((RUNS, 2), (CURVES, 1)):  # every line as it was, byte for byte, and the new ones
        assert set(before[name]) <= set(after[name]) and len(after[name]) == len(before[name]) + added
        assert after[name] == sorted(after[name], key=lambda line: json.loads(line)["run_id"])
    assert write_text(store, folder, keep_all) == 0 and lines(folder / RUNS) == after[RUNS]
    assert len(lines(folder / CURVES)) == len(after[CURVES]) + 1  # zerosiam on snow's curves, kept now


def test_a_run_in_both_takes_the_sqlite_version_and_the_folder_keeps_the_rest(store, tmp_path):
    folder = tmp_path / "study"
    write_text(store, folder, keep_all)
    before = lines(folder / RUNS)
    later = ResultStore(tmp_path / "later.db")  # another store: one run in common, one new, no curves kept
    put(later, spec("tent", "fog"), 0.25, {"accuracy": [9.0]})
    put(later, spec("eata", "fog"), 0.4)
    assert write_text(later, folder, lambda row: False) == 1
    rows = {row["run_id"]: row for row in open_store(folder).rows()}
    assert len(rows) == len(store) + 1
    common = run_id_for(spec("tent", "fog"))
    assert rows[common]["created"] == later.get(common)["created"] != store.get(common)["created"]
    assert rows[common]["curves"] == {"accuracy": [0.3, 1e-7]}  # the folder's curves stay
    unchanged = [line for line in before if json.loads(line)["run_id"] != common]
    assert set(unchanged) <= set(lines(folder / RUNS))


def test_an_older_store_exported_again_does_not_undo_a_run_made_since(store, tmp_path):
    """A run made again (a remake) and exported is not put back by a later export of a working store that
    still holds its earlier making: the folder keeps the run made last, with its curves."""
    folder = tmp_path / "study"
    write_text(store, folder, keep_all)
    remade = ResultStore(tmp_path / "remade.db")
    put(remade, spec("tent", "fog"), 0.25, {"accuracy": [9.0]})
    write_text(remade, folder, keep_all)
    common = run_id_for(spec("tent", "fog"))
    after = (lines(folder / RUNS), lines(folder / CURVES))
    assert write_text(store, folder, keep_all) == 0
    assert (lines(folder / RUNS), lines(folder / CURVES)) == after
    row = {row["run_id"]: row for row in open_store(folder).rows()}[common]
    assert (row["metrics"]["accuracy"], row["curves"]) == (0.25, {"accuracy": [9.0]})


def test_the_rebuild_is_reused_until_the_text_changes(store, tmp_path, cache):
    folder = tmp_path / "study"
    write_text(store, folder, keep_all)
    first = open_store(folder).path
    built = first.stat().st_mtime_ns
    assert open_store(folder).path == first and first.stat().st_mtime_ns == built
    assert first.parent == cache and oct(first.stat().st_mode & 0o777) == "0o644"
    later = ResultStore(tmp_path / "later.db")
    put(later, spec("zerosiam", "fog"), 0.9)
    write_text(later, folder, keep_all)
    second = open_store(folder)
    assert second.path != first and len(second) == len(store) + 1
    assert sorted(p.suffix for p in cache.iterdir()) == [".db", ".db", ".lock", ".lock"]  # no temporaries


def test_a_path_that_is_neither_form_is_refused_in_one_line(tmp_path):
    for path in (tmp_path / "absent.db", tmp_path):
        with pytest.raises(ValueError, match="not a result store: give a SQLite file or a text") as error:
            open_store(path)
        assert str(path) in str(error.value) and "\n" not in str(error.value)
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / RUNS).write_text('{"run_id": "a"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=f"{RUNS}:1: not a line of a text store"):
        open_store(folder)


def report(argv: list[str]) -> int:
    """``zerosiam report`` through a parser holding only this command."""
    from zerosiam.cli import report as command

    parser = argparse.ArgumentParser(prog="zerosiam")
    command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *argv])
    return int(args.func(args) or 0)


def test_report_reads_the_text_store_as_it_reads_the_sqlite_file(store, tmp_path, capsys):
    folder = tmp_path / "study"
    write_text(store, folder, keep_all)
    for argv in ([], ["--groups", "--methods", "tent"]):
        assert report(["--db", str(store.path), *argv]) == 0
        from_sqlite = capsys.readouterr()
        assert report(["--db", str(folder), *argv]) == 0
        assert capsys.readouterr() == from_sqlite
        assert "| Tent |" in from_sqlite.out
    assert report(["--db", str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("command", ["bench", "select-lr", "llm"])
def test_commands_that_write_refuse_a_text_store_in_one_line(command, store, tmp_path, capsys):
    from zerosiam.cli import main

    folder = tmp_path / "study"
    write_text(store, folder, keep_all)
    files = sorted(os.listdir(folder))
    with pytest.raises(SystemExit) as stop:
        main([command, "--db", str(folder)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err == (
        f"zerosiam: error: {folder} is a committed text store, read-only: run into a SQLite file and export "
        "with benchmarks/study_export.py\n"
    )
    assert sorted(os.listdir(folder)) == files
