"""The SQLite result store: atomic rows, duplicates refused, stable run ids, several writers at once."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from zerosiam.bench.store import DuplicateRunError, Failure, ResultStore, run_id_for

SPEC = {"model": "m", "dataset": "d", "method": "tent", "lr": 1e-3, "targets": ["q", "v"]}


def test_run_id_is_stable_and_ignores_key_order_but_not_values():
    reordered = dict(reversed(list(SPEC.items())))
    assert run_id_for(SPEC) == run_id_for(reordered)
    assert len(run_id_for(SPEC)) == 64
    assert run_id_for(SPEC) != run_id_for({**SPEC, "lr": 2e-3})
    assert run_id_for(SPEC) != run_id_for({**SPEC, "targets": ["v", "q"]})
    # the hash of a fixed spec never changes between releases (stored rows stay addressable)
    assert run_id_for({"a": 1}) == "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"


def test_run_id_refuses_what_json_cannot_hold():
    with pytest.raises(TypeError, match="JSON"):
        run_id_for({"x": object()})
    with pytest.raises(TypeError, match="dict"):
        run_id_for(["not", "a", "dict"])


def test_put_get_round_trip(tmp_path):
    store = ResultStore(tmp_path / "r.db")
    run_id = run_id_for(SPEC)
    assert not store.has(run_id)
    store.put(run_id, "llm", SPEC, {"accuracy": 0.25}, {"loss": [1.0, 0.5]}, {"torch": "x"})
    assert store.has(run_id) and run_id in store and len(store) == 1
    row = store.get(run_id)
    assert row["spec"] == SPEC and row["metrics"] == {"accuracy": 0.25}
    assert row["curves"] == {"loss": [1.0, 0.5]} and row["env"] == {"torch": "x"}
    assert row["kind"] == "llm" and row["created"] > 0
    with pytest.raises(KeyError):
        store.get("absent")


def test_storing_a_stored_spec_again_is_a_no_op_and_another_spec_an_error(tmp_path):
    store = ResultStore(tmp_path / "r.db")
    assert store.put("a", "llm", SPEC, {"accuracy": 0.1}) is True
    assert store.put("a", "llm", dict(reversed(SPEC.items())), {"accuracy": 0.9}) is False  # already stored
    assert store.get("a")["metrics"]["accuracy"] == 0.1  # the first writer's row stands
    with pytest.raises(DuplicateRunError, match="different spec"):
        store.put("a", "llm", {**SPEC, "lr": 5.0}, {"accuracy": 0.9})
    assert store.put("a", "llm", SPEC, {"accuracy": 0.9}, replace=True) is True
    assert store.get("a")["metrics"]["accuracy"] == 0.9 and len(store) == 1


def test_failures_are_recorded_apart_and_cleared_by_a_success(tmp_path):
    store = ResultStore(tmp_path / "r.db")
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError as error:
        store.put_failure("a", "vision", Failure.of(SPEC, error))
    assert not store.has("a") and len(store) == 0  # a failure is not a result: a rerun retries it
    [failure] = store.failures("vision")
    assert failure["error"] == "RuntimeError: boom" and failure["spec"] == SPEC
    assert "Traceback" in failure["traceback"] and "second line" in failure["traceback"]
    store.put("a", "vision", SPEC, {"accuracy": 0.5})
    assert store.failures() == [] and store.has("a")


def test_rows_filter_by_kind_and_survive_reopening(tmp_path):
    path = tmp_path / "r.db"
    store = ResultStore(path)
    store.put("v1", "vision", {"i": 1}, {"accuracy": 0.5})
    store.put("l1", "llm", {"i": 2}, {"accuracy": 0.1})
    store.put("l2", "llm", {"i": 3}, {"accuracy": 0.2})
    reopened = ResultStore(path)
    assert [row["run_id"] for row in reopened.rows(kind="llm")] == ["l1", "l2"]
    assert {row["run_id"] for row in reopened.rows()} == {"v1", "l1", "l2"}
    assert reopened.rows(kind="none") == []


def test_wal_mode_and_schema(tmp_path):
    ResultStore(tmp_path / "r.db")
    with sqlite3.connect(tmp_path / "r.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        columns = [row[1] for row in db.execute("PRAGMA table_info(runs)")]
    assert columns == ["run_id", "kind", "spec", "metrics", "curves", "env", "created"]


def test_a_failed_write_leaves_no_row(tmp_path):
    store = ResultStore(tmp_path / "r.db")
    with pytest.raises(TypeError):
        store.put("bad", "llm", SPEC, {"accuracy": object()})
    assert not store.has("bad") and len(store) == 0


def test_bad_paths_are_clear_errors(tmp_path):
    with pytest.raises(IsADirectoryError):
        ResultStore(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ResultStore(tmp_path / "missing" / "r.db")
    with pytest.raises(ValueError, match="run_id"):
        ResultStore(tmp_path / "r.db").put("", "llm", SPEC, {})


def _write_many(path: str, worker: int) -> None:
    store = ResultStore(path)
    for index in range(20):
        store.put(f"{worker}-{index}", "llm", {"w": worker, "i": index}, {"accuracy": index / 20})
        store.put(f"shared-{index}", "llm", {"i": index}, {"accuracy": index / 20})  # every worker: once


def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "r.db")
    ResultStore(path)
    # fork: workers start in milliseconds (spawn would re-import torch in each)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    workers = [context.Process(target=_write_many, args=(path, w)) for w in range(3)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
        assert process.exitcode == 0
    assert len(ResultStore(path)) == 60 + 20


def test_copy_to_keeps_the_chosen_curves_and_never_overwrites(tmp_path):
    source, target = ResultStore(tmp_path / "source.db"), ResultStore(tmp_path / "target.db")
    for corruption in ("fog", "snow"):
        spec = {**SPEC, "corruption": corruption}
        source.put(run_id_for(spec), "vision", spec, {"accuracy": 0.5}, {"loss": [1.0, 0.5]}, {"host": "a"})
    kept = {**SPEC, "corruption": "fog"}
    target.put(run_id_for(kept), "vision", kept, {"accuracy": 0.9}, {}, {})  # already there: stays
    assert source.copy_to(target, keep_curves=lambda spec: spec["corruption"] == "snow") == 1
    snow = target.get(run_id_for({**SPEC, "corruption": "snow"}))
    assert snow["curves"] == {"loss": [1.0, 0.5]} and snow["env"] == {"host": "a"}
    assert snow["created"] == source.get(snow["run_id"])["created"]
    assert target.get(run_id_for(kept))["metrics"] == {"accuracy": 0.9}
    assert source.copy_to(target, keep_curves=lambda spec: False) == 0  # idempotent
    fog_only = ResultStore(tmp_path / "fog.db")
    source.copy_to(fog_only, keep_curves=lambda spec: spec["corruption"] == "snow")
    assert fog_only.get(run_id_for(kept))["curves"] == {}
