"""The one atomic writer and the one file hash: whole files or none, fsync-ed, readable by others."""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from zerosiam.assets import files
from zerosiam.assets.files import atomic_file, atomic_write, sha256_file


def leftovers(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(files.TEMPORARY_SUFFIX))


def test_atomic_file_writes_the_complete_content(tmp_path: Path) -> None:
    target = tmp_path / "new" / "folder" / "array.npy"  # the folders are created
    array = np.arange(3 * 1000, dtype=np.int64).reshape(3, 1000)
    with atomic_file(target) as handle:
        np.save(handle, array)
        assert not target.exists()  # nothing is visible before the block ends
    np.testing.assert_array_equal(np.load(target), array)
    assert leftovers(target.parent) == []


def test_atomic_write_replaces_a_file_readable_by_others(tmp_path: Path) -> None:
    target = tmp_path / "blob.bin"
    target.write_bytes(b"old")
    os.chmod(target, 0o600)
    atomic_write(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert stat.S_IMODE(target.stat().st_mode) == files.MODE == 0o644  # mkstemp alone would give 0o600


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_exception_keeps_the_old_file_and_no_temporary(tmp_path: Path, error: type[BaseException]) -> None:
    target = tmp_path / "weights.bin"
    target.write_bytes(b"previous")
    with pytest.raises(error), atomic_file(target) as handle:
        handle.write(b"half of the new")
        raise error
    assert target.read_bytes() == b"previous"
    assert leftovers(tmp_path) == []


def test_an_exception_before_any_file_existed_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError), atomic_file(tmp_path / "never.npy") as handle:
        handle.write(b"x")
        raise ValueError("the writer failed")
    assert list(tmp_path.iterdir()) == []


def test_the_data_is_fsynced_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "checkpoint.pt"
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        events.append("fsync")
        real_fsync(descriptor)

    def replace(source: os.PathLike[str], destination: os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(source, destination)

    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    atomic_write(target, b"payload")
    assert events == ["fsync", "replace"] and target.read_bytes() == b"payload"


def test_sha256_file_reads_in_chunks_and_matches_hashlib(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    data = np.random.default_rng(0).integers(0, 256, 3 * (1 << 20) + 17, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    assert sha256_file(str(path)) == sha256_file(path)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert sha256_file(empty) == hashlib.sha256(b"").hexdigest()


# --- checked caches -------------------------------------------------------------------------------


def _cached_array(tmp_path, values=(1, 2, 3)):
    path = tmp_path / "cache" / "a.npy"
    array = np.array(values, dtype=np.uint8)
    files.write_checked(path, lambda handle: np.save(handle, array), shape=list(array.shape), dtype="uint8")
    return path


def test_a_checked_cache_file_is_intact_until_damaged(tmp_path, caplog):
    path = _cached_array(tmp_path)
    record = json.loads(files.check_path(path).read_text())
    assert record["size"] == path.stat().st_size and record["shape"] == [3] and record["dtype"] == "uint8"
    assert files.intact(path, shape=[3], dtype="uint8")
    assert not files.intact(tmp_path / "never-built.npy") and not caplog.records  # absent: no warning
    with open(path, "r+b") as handle:  # as a full disk or a killed copy would leave it
        handle.truncate(path.stat().st_size - 2)
    assert not files.intact(path, shape=[3], dtype="uint8")
    assert not path.exists() and not files.check_path(path).exists()  # removed, to be rebuilt
    [warning] = caplog.records
    assert str(path) in warning.getMessage() and "where" in warning.getMessage()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-1] + b"\x09"), "content differs"),
        (lambda p: files.check_path(p).unlink(), "no check record"),
        (lambda p: files.check_path(p).write_text("{"), "unreadable"),
    ],
)
def test_every_kind_of_damage_is_named(tmp_path, damage, reason):
    path = _cached_array(tmp_path)
    damage(path)
    assert reason in files.damage(path)


def test_facts_that_differ_from_the_expected_ones_are_damage(tmp_path):
    path = _cached_array(tmp_path)
    assert "shape [3] where [4] is expected" in files.damage(path, shape=[4])


def test_a_checked_folder_is_intact_until_one_of_its_files_changes(tmp_path, caplog):
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"\x00" * 64)
    (folder / "sub" / "config.json").write_text("{}")
    files.write_manifest(folder)
    assert files.intact_folder(folder)
    (folder / "sub" / "config.json").write_text('{"x": 1}')
    assert not files.intact_folder(folder) and not folder.exists()
    assert "sub/config.json differs" in caplog.records[0].getMessage()
    assert not files.intact_folder(tmp_path / "absent")


def test_building_makes_a_second_process_wait_for_the_first(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "array.npy"
    first_done = tmp_path / "first-done"
    fork = multiprocessing.get_context("fork")
    holding = fork.Event()

    def first() -> None:
        with files.building(target):
            holding.set()
            time.sleep(0.5)
            first_done.touch()

    child = fork.Process(target=first)
    child.start()
    assert holding.wait(timeout=30)
    with files.building(target):
        assert first_done.exists()  # entered only once the other process had finished and let go
    child.join(timeout=30)
    assert child.exitcode == 0


def test_building_runs_unlocked_where_the_cache_cannot_be_written(tmp_path: Path, monkeypatch) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(files, "open", refused, raising=False)  # the lock file's open, in files only
    with files.building(tmp_path / "array.npy"):  # no error: reading an intact cache needs no lock
        pass
    assert not (tmp_path / ("array.npy" + files.LOCK_SUFFIX)).exists()
