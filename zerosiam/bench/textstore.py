"""The committed form of a result store: line-oriented text that git carries well.

Why: to git a SQLite file is one binary blob, stored whole again by every commit that adds a few runs
(the study's 8.5 MB store changed in 50 commits). As text, one line per run sorted by run id, an export
that adds runs adds lines and leaves every other line byte for byte as it was: a commit's diff is its
new runs, and git's delta compression keeps the history small.

A text store is a folder of two files:

* ``runs.jsonl``: one line per run, sorted by ``run_id``, the canonical JSON (sorted keys, compact) of
  ``{"run_id", "kind", "spec", "metrics", "env", "created"}``;
* ``curves.jsonl``: one line per run whose per-step curves are kept, sorted by ``run_id``,
  ``{"run_id", "curves"}``. Curves are most of the bytes and only some runs keep them, so they live
  apart and ``runs.jsonl`` stays small enough to read.

Python's json writes a float as its shortest repr, which reads back as the same float, so SQLite → text
→ SQLite gives every value exactly. Failures (the ``failures`` table) are not results and are left out.

The text is read-only: runs are written into a SQLite file (``zerosiam bench``) and exported here with
:func:`write_text`. :func:`open_store` reads a text store by rebuilding a SQLite file in the cache, keyed
by the text's sha256, so every reader (``zerosiam report``) keeps using :class:`ResultStore`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zerosiam.assets.files import MODE, TEMPORARY_SUFFIX, atomic_write, building
from zerosiam.assets.store import cache_dir
from zerosiam.bench.store import ResultStore, canonical_json

RUNS, CURVES = "runs.jsonl", "curves.jsonl"
Parsed = tuple[str, str, dict[str, Any]]  # a line of a text store: its run id, its text, its value
_RUN_KEYS = ("run_id", "kind", "spec", "metrics", "env", "created")
_FORMAT = b"zerosiam text store 1\n"  # part of the cache key: a change in how text is read rebuilds
READ_ONLY = (
    "is a committed text store, read-only: run into a SQLite file and export with benchmarks/study_export.py"
)


def is_text_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a text store: a folder holding ``runs.jsonl``."""
    return Path(path).is_dir() and (Path(path) / RUNS).is_file()


def write_text(store: ResultStore, folder: Path, keep_curves: Callable[[dict[str, Any]], bool]) -> int:
    """Add the runs of the SQLite ``store`` to the text store ``folder`` (created if need be); return how
    many runs were new there.

    Runs already in the folder stay, their lines untouched; a run in both takes the version made last
    (its ``created``; the SQLite one on a tie, the same line when nothing changed), so that exporting an
    older working store does not undo a run made again since (``zerosiam bench --remake-from``,
    ``--one-device``), curves included. A run's curves are written when they are not empty and
    ``keep_curves(row)`` says so (the row has its run_id, kind, spec, metrics, env and created; its curves
    are read only for the runs kept), and those already in the folder stay. Each file is replaced
    atomically, the curves first, so a reader never sees half a file nor a run whose curves are missing.
    """
    folder = Path(folder)
    parsed = _parse(folder / RUNS)
    runs = {run_id: line for run_id, line, _ in parsed}
    made = {run_id: value["created"] for run_id, _, value in parsed}
    curves = {run_id: line for run_id, line, _ in _parse(folder / CURVES)}
    before = set(runs)
    with store._connect() as db:
        for values in db.execute(f"SELECT {', '.join(_RUN_KEYS)} FROM runs"):
            row = dict(zip(_RUN_KEYS, values, strict=True))
            if made.get(row["run_id"], row["created"]) > row["created"]:
                continue  # the folder holds a later making of this run
            for key in ("spec", "metrics", "env"):
                row[key] = json.loads(row[key])
            runs[row["run_id"]] = canonical_json(row)
            if keep_curves(row):
                (text,) = db.execute("SELECT curves FROM runs WHERE run_id = ?", (row["run_id"],)).fetchone()
                if kept := json.loads(text):
                    curves[row["run_id"]] = canonical_json({"run_id": row["run_id"], "curves": kept})
    for name, lines in ((CURVES, curves), (RUNS, runs)):
        atomic_write(folder / name, "".join(lines[run_id] + "\n" for run_id in sorted(lines)).encode("utf-8"))
    return len(runs.keys() - before)


class TextStoreCopy(ResultStore):
    """The SQLite rebuild of a text store, in the cache: for reading. A run written here would be lost
    at the next rebuild, so ``put`` and ``put_failure`` refuse."""

    def __init__(self, path: Path, source: Path) -> None:
        super().__init__(path)
        self.source = source

    def put(self, *args: Any, **kwargs: Any) -> bool:
        raise PermissionError(f"{self.source} {READ_ONLY}")

    def put_failure(self, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(f"{self.source} {READ_ONLY}")


def open_store(path: str | os.PathLike[str]) -> ResultStore:
    """The result store at ``path``: a SQLite file as it is, or a text store through its SQLite rebuild.

    The rebuild is ``<cache>/text_stores/<sha256 of the text>.db``, reused while the text is unchanged.
    It is built into a temporary file and renamed, under the cache's lock, so two readers at once are
    safe. (Rebuilds of older texts stay in the cache until it is cleared.)
    """
    path = Path(path)
    if path.is_file():
        return ResultStore(path)
    if not is_text_store(path):
        raise ValueError(
            f"{path} is not a result store: give a SQLite file or a text store folder holding {RUNS}"
        )
    runs, curves = (_read(path / name) for name in (RUNS, CURVES))
    digest = hashlib.sha256(_FORMAT + b"%d\n" % len(runs) + runs + curves).hexdigest()
    target = cache_dir() / "text_stores" / f"{digest}.db"
    with building(target):
        if not target.is_file():
            _rebuild(_parse(path / RUNS, runs), _parse(path / CURVES, curves), target)
    return TextStoreCopy(target, path)


def _rebuild(runs: list[Parsed], curves_of: list[Parsed], target: Path) -> None:
    """Write the SQLite form of a text store's parsed lines into ``target`` (a temporary file, renamed)."""
    curves = {run_id: value["curves"] for run_id, _, value in curves_of}
    rows = [
        tuple(
            canonical_json(value[key]) if key in ("spec", "metrics", "env") else value[key]
            for key in _RUN_KEYS
        )
        + (canonical_json(curves.get(run_id, {})),)
        for run_id, _, value in runs
    ]
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMPORARY_SUFFIX)
    os.close(descriptor)
    temporary = Path(name)
    insert = f"INSERT INTO runs ({', '.join(_RUN_KEYS)}, curves) VALUES ({', '.join('?' * 7)})"
    try:
        ResultStore(temporary)._write(lambda db: db.executemany(insert, rows))
        os.chmod(temporary, MODE)  # readable by the other users of a shared cache, as its other files
        os.replace(temporary, target)
    except BaseException:
        for leftover in (temporary, Path(f"{temporary}-wal"), Path(f"{temporary}-shm")):
            leftover.unlink(missing_ok=True)
        raise


def _read(path: Path) -> bytes:
    """The bytes of one file of a text store; none when it is absent (a store without curves)."""
    return path.read_bytes() if path.is_file() else b""


def _parse(path: Path, data: bytes | None = None) -> list[Parsed]:
    """(run_id, line, value) for each line of ``path``, a file of a text store, given its bytes ``data``
    (read from ``path`` when None); [] when it is absent.

    Lines are split on ``\\n`` only: the JSON is written with ``ensure_ascii=False``, so a string may hold
    other characters Python counts as line breaks (U+2028)."""
    required = _RUN_KEYS if path.name == RUNS else ("run_id", "curves")
    parsed, seen = [], set()
    for number, line in enumerate((_read(path) if data is None else data).decode("utf-8").split("\n"), 1):
        if not line:
            continue
        try:
            value = json.loads(line)
            missing = [key for key in required if key not in value]
            if missing:
                raise KeyError(", ".join(missing))
            run_id = value["run_id"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not a line of a text store ({error!r})") from None
        if run_id in seen:
            raise ValueError(f"{path}:{number}: run {run_id} appears twice")
        seen.add(run_id)
        parsed.append((run_id, line, value))
    return parsed
