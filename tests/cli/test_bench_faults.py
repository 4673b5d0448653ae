"""Faults injected into the real ``zerosiam bench`` command (subprocesses, the real ResNet-20 and data).

What a benchmark left running overnight on a shared machine must survive: two commands writing one
store, a worker killed mid-run, a damaged cache file, SIGTERM during a grid, and bad flags. Each test
checks that no row is lost or duplicated, that a rerun completes the grid, and what the message says.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import needs_assets
from zerosiam.bench.store import ResultStore

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [needs_assets(), pytest.mark.slow]


def bench(db: Path, *flags: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """``zerosiam bench`` on the real ResNet-20, one worker, no table; its output captured as text."""
    command = [sys.executable, "-m", "zerosiam.cli", "bench", "--model", "resnet20", "--workers", "1",
               "--no-report", "--db", str(db), *flags]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return subprocess.Popen(command, env=environment, cwd=ROOT, **popen)


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def run_ids(db: Path) -> list[str]:
    """Every stored run id, duplicates included (the table's primary key forbids them; this checks)."""
    with sqlite3.connect(db) as connection:
        return [row[0] for row in connection.execute("SELECT run_id FROM runs")]


def wait_for_rows(db: Path, count: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if db.exists() and len(run_ids(db)) >= count:
                return
        except sqlite3.OperationalError:  # the file exists a moment before the command creates its table
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{db} never held {count} rows")


def workers_of(pid: int) -> list[int]:
    """The grid's worker processes: children of ``pid`` started by multiprocessing's spawn."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


LONG = ["--corruptions", "gaussian_noise", "--protocols", "mild", "--methods", "noadapt,tent,zerosiam",
        "--limit", "2000"]  # fmt: skip  # runs of a few seconds, so that a fault lands inside one


def test_two_commands_on_one_store_both_finish_and_store_the_union_once(tmp_path):
    db = tmp_path / "shared.db"
    axes = ["--corruptions", "gaussian_noise,shot_noise", "--protocols", "mild", "--limit", "128"]
    first = bench(db, *axes, "--methods", "noadapt,tent")
    second = bench(db, *axes, "--methods", "tent,zerosiam")
    (code1, _, err1), (code2, _, err2) = finish(first), finish(second)
    assert code1 == 0 and code2 == 0, err1[-2000:] + err2[-2000:]
    ids = run_ids(db)
    assert len(ids) == len(set(ids)) == 6  # {noadapt, tent, zerosiam} × 2 corruptions, once each
    methods = sorted(row["spec"]["method"] for row in ResultStore(db).rows("vision"))
    assert methods == ["noadapt", "noadapt", "tent", "tent", "zerosiam", "zerosiam"]


def test_a_worker_killed_mid_run_fails_that_run_only_and_a_rerun_retries_it(tmp_path):
    db = tmp_path / "r.db"
    process = bench(db, *LONG)
    wait_for_rows(db, 1)
    time.sleep(0.5)  # the worker has taken the second run
    [worker] = workers_of(process.pid)
    os.kill(worker, signal.SIGKILL)
    code, out, err = finish(process)
    assert code == 1, err[-2000:]
    assert "1 run(s) failed" in err and "killed by SIGKILL" in err and "running the same command" in err
    assert "2 run(s) executed, 1 failed, 0 already in" in out
    store = ResultStore(db)
    [failure] = store.failures()
    assert len(run_ids(db)) == 2 and not store.has(_run_id(failure["spec"]))
    assert "killed by SIGKILL" in failure["error"]

    code, out, err = finish(bench(db, *LONG))  # the rerun runs the failed run only
    assert code == 0, err[-2000:]
    assert "1 run(s) executed, 2 already in" in out
    ids = run_ids(db)
    assert len(ids) == len(set(ids)) == 3 and store.failures() == []


def _run_id(spec: dict) -> str:
    from zerosiam.bench.runner import RunSpec

    return RunSpec.from_dict(spec).run_id


def test_a_truncated_cache_file_is_named_removed_and_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    env = {"ZEROSIAM_CACHE": str(cache)}
    axes = ["--corruptions", "brightness", "--protocols", "mild", "--methods", "tent", "--limit", "128"]
    code, _, err = finish(bench(tmp_path / "first.db", *axes, env=env))
    assert code == 0, err[-2000:]
    cached = cache / "corrupted" / "cifar10c" / "brightness" / "severity5.npy"
    with open(cached, "r+b") as handle:  # what a full disk or a killed copy leaves
        handle.truncate(cached.stat().st_size // 2)

    code, _, err = finish(bench(tmp_path / "second.db", *axes, env=env))
    assert code == 0, err[-2000:]
    [warning] = [line for line in err.splitlines() if "damaged cache file" in line]
    assert str(cached) in warning and "bytes where" in warning
    first, second = (ResultStore(tmp_path / f"{n}.db").rows("vision")[0] for n in ("first", "second"))
    assert first["metrics"]["accuracy"] == second["metrics"]["accuracy"]  # rebuilt to the same images


def test_sigterm_stops_the_grid_keeps_finished_rows_and_says_how_to_resume(tmp_path):
    db = tmp_path / "r.db"
    process = bench(db, *LONG)
    wait_for_rows(db, 1)
    workers = workers_of(process.pid)
    process.send_signal(signal.SIGTERM)
    code, _, err = finish(process, timeout=60)
    assert code == 143, err[-2000:]
    assert "interrupted by SIGTERM" in err and "run the same command again to resume" in err
    assert all(not Path(f"/proc/{pid}").exists() for pid in workers)  # no worker left behind
    kept = run_ids(db)
    assert 1 <= len(kept) < 3 and len(kept) == len(set(kept))

    code, out, err = finish(bench(db, *LONG))
    assert code == 0, err[-2000:]
    assert f"{3 - len(kept)} run(s) executed, {len(kept)} already in" in out
    assert sorted(run_ids(db)) == sorted(set(run_ids(db))) and len(run_ids(db)) == 3


def test_a_run_stopped_part_way_goes_on_from_its_checkpoint_to_the_same_row(tmp_path):
    axes = ["--corruptions", "gaussian_noise", "--protocols", "mild", "--methods", "zerosiam",
            "--limit", "2000", "--checkpoint-every", "0.2"]  # fmt: skip
    db, reference = tmp_path / "r.db", tmp_path / "reference.db"
    folder = tmp_path / "r.db.checkpoints"
    process = bench(db, *axes)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any(folder.glob("*.pt")):
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    code, _, err = finish(process, timeout=60)
    assert code == 143 and not run_ids(db), err[-2000:]  # stopped inside its one run
    [checkpoint] = folder.glob("*.pt")

    code, _, err = finish(bench(db, *axes))
    assert code == 0, err[-2000:]
    assert not checkpoint.exists()  # the run is stored: its checkpoint is gone
    code, _, err = finish(bench(reference, *axes[:-2]))  # never stopped, never checkpointed
    assert code == 0, err[-2000:]
    [resumed], [straight] = ResultStore(db).rows("vision"), ResultStore(reference).rows("vision")
    assert resumed["metrics"]["resumed_from_step"] > 0 and "resumed_from_step" not in straight["metrics"]
    assert resumed["metrics"]["accuracy"] == straight["metrics"]["accuracy"]
    assert resumed["curves"] == straight["curves"]
    assert not (tmp_path / "reference.db.checkpoints").exists()


BAD_FLAGS = [
    (["--limit", "-5"], "argument --limit: expected a positive integer, got -5"),
    (["--batch-size", "0"], "argument --batch-size: expected a positive integer, got 0"),
    (["--workers", "0"], "argument --workers: expected a positive integer, got 0"),
    (["--threads", "0"], "argument --threads: expected a positive integer, got 0"),
    (["--model", "nonexistent"], "unknown model 'nonexistent'; choose one of resnet20"),
    (["--methods", "tentt"], "unknown method 'tentt' for image; available: noadapt, tent"),
    (["--protocols", "foo"], "unknown protocol 'foo'; choose one of mild, label_shift"),
    (["--severity", "7"], "unknown severity 7; choose one of 1, 2, 3, 4, 5"),
    (["--corruptions", "fogg"], "unknown corruption 'fogg'; choose one of gaussian_noise"),
    (["--dataset", "cifar100c"], "unknown dataset 'cifar100c'; choose one of cifar10c, imagenetc"),
    (["--methods", "tent", "--set", "alpha=2"], "option 'alpha' does not apply to method 'tent'; it takes"),
    (["--grid", "missing.yaml"], "grid file 'missing.yaml' does not exist"),
    (["--checkpoint-every", "-1"], "argument --checkpoint-every: expected a number of zero or more, got -1"),
    (["--device", "gpu"], "argument --device: unknown device 'gpu'; choose one of auto, cpu, cuda, cuda:N"),
]


def test_bad_flags_are_one_line_before_any_work(tmp_path):
    processes = [bench(tmp_path / f"{i}.db", *flags) for i, (flags, _) in enumerate(BAD_FLAGS)]
    for index, (process, (flags, message)) in enumerate(zip(processes, BAD_FLAGS, strict=True)):
        code, out, err = finish(process, timeout=120)
        assert code == 2, (flags, err)
        assert err.startswith("zerosiam: error: ") and err.count("\n") == 1, (flags, err)
        assert message in err, (flags, err)
        assert "Traceback" not in err and out == ""
        assert not (tmp_path / f"{index}.db").exists()  # nothing written
