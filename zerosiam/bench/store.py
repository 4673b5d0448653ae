"""A small durable store of benchmark results: one SQLite file, one row per finished run.

Why SQLite: a grid of runs is interrupted, resumed, run from several processes at once and read while
it runs. One file with transactions gives all of that with the standard library alone. WAL mode lets
readers work while a writer commits, and each ``put`` is a single transaction, so a row is either
absent or complete and a killed run never leaves half a result behind.

What the store guarantees, for any number of processes on one machine writing to one file (two
``zerosiam bench`` commands, a sweep launched twice, two Ray drivers):

* **Nothing finished is lost.** Writers wait for each other (a busy timeout, then retries with
  back-off) instead of failing; every ``put`` either lands whole or raises.
* **A run is stored once.** A run is keyed by ``run_id``, normally ``run_id_for(spec)``: the sha256 of
  the spec's canonical JSON. Storing a run whose spec is already stored is a no-op that says so
  (``put`` returns False): the same spec gives the same result, so the second writer has nothing to add.
* **Failures are recorded.** A run that raised, or whose worker was killed, is kept in the ``failures``
  table with its error and traceback; it is not a result, so a rerun retries it, and a success
  removes its failure row.

The schema is deliberately generic (``kind`` tells vision from language rows; the spec, metrics,
curves and environment are JSON documents) so every benchmark of the project can share it.
"""

from __future__ import annotations

import hashlib
import json
import random
import signal
import sqlite3
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    spec JSON NOT NULL,
    metrics JSON NOT NULL,
    curves JSON NOT NULL,
    env JSON NOT NULL,
    created REAL NOT NULL
)
""",
    """
CREATE TABLE IF NOT EXISTS failures (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    spec JSON NOT NULL,
    error TEXT NOT NULL,
    traceback TEXT NOT NULL,
    created REAL NOT NULL
)
""",
)
_COLUMNS = ("run_id", "kind", "spec", "metrics", "curves", "env", "created")
_JSON_COLUMNS = ("spec", "metrics", "curves", "env")
_FAILURE_COLUMNS = ("run_id", "kind", "spec", "error", "traceback", "created")
_ATTEMPTS = 8  # retries of a transaction that found the database locked, after the busy timeout


@dataclass(frozen=True)
class Failure:
    """A run that did not finish: its spec, its error in one line, and the traceback (or how it died)."""

    spec: dict[str, Any]
    error: str
    traceback: str = ""

    @classmethod
    def of(cls, spec: dict[str, Any], error: BaseException) -> Failure:
        """The failure of ``spec`` by ``error``, with the traceback being handled now."""
        lines = str(error).strip().splitlines()
        first = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
        return cls(spec, first, traceback.format_exc())


class DuplicateRunError(KeyError):
    """A different spec was stored under this ``run_id``: two runs were given one identity."""


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends: a result that has arrived is stored before the
    process answers a Ctrl-C or a ``kill``. (A pending signal is delivered on leaving the block.)
    Where signals cannot be masked (not POSIX, or not the main thread) the block runs as it is."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no insignificant whitespace: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def run_id_for(spec: dict[str, Any]) -> str:
    """The stable identity of a run: sha256 (hex) of the spec's canonical JSON.

    Key order does not matter; every value does. A spec that is not JSON-serialisable is an error
    rather than being stringified silently (two different objects could print alike).
    """
    if not isinstance(spec, dict):
        raise TypeError(f"a run spec must be a dict, not {type(spec).__name__}")
    try:
        text = canonical_json(spec)
    except (TypeError, ValueError) as error:
        raise TypeError(f"run spec is not JSON-serialisable: {error}") from None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ResultStore:
    """The ``runs`` table of one SQLite file; safe to use from several processes at once.

    A connection is opened per operation, so an instance can be shared with forked workers and
    threads without sharing a connection object.
    """

    def __init__(self, path: str | Path, timeout: float = 60.0) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"result store path {self.path} is a directory; give a file name")
        if not self.path.parent.exists():
            raise FileNotFoundError(f"folder {self.path.parent} of the result store does not exist")
        self.timeout = timeout
        self._write(lambda db: [db.execute(table) for table in _SCHEMA], wal=True)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection whose ``with`` block is one transaction (committed, or rolled back on error)."""
        db = sqlite3.connect(self.path, timeout=self.timeout)
        try:
            with db:
                yield db
        finally:
            db.close()

    def _write(self, transaction: Any, wal: bool = False) -> Any:
        """Run ``transaction(db)`` as one write transaction, retried while another writer holds the lock.

        ``BEGIN IMMEDIATE`` takes the write lock up front, so two writers never both read and then both
        try to upgrade (which SQLite resolves by failing one of them at once, busy timeout or not).
        """
        for attempt in range(_ATTEMPTS):
            db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            try:
                if wal:
                    db.execute("PRAGMA journal_mode=WAL")
                db.execute("BEGIN IMMEDIATE")
                try:
                    result = transaction(db)
                    db.execute("COMMIT")
                    return result
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as error:
                contended = "locked" in str(error) or "busy" in str(error)
                if not contended or attempt == _ATTEMPTS - 1:
                    raise
                time.sleep(min(2.0, 0.05 * 2**attempt) * (1 + random.random()))
            finally:
                db.close()
        raise AssertionError("unreachable")

    def put(
        self,
        run_id: str,
        kind: str,
        spec: dict[str, Any],
        metrics: dict[str, Any],
        curves: dict[str, Any] | None = None,
        env: dict[str, Any] | None = None,
        replace: bool = False,
    ) -> bool:
        """Write one run in a single transaction; True when written, False when already stored.

        A row with this ``run_id`` and the same spec is left as it is (the same spec gives the same
        result; the first writer's row stands) unless ``replace=True``. A row with this ``run_id`` and
        a different spec raises ``DuplicateRunError``: two different runs were given one identity.
        Storing a run clears any failure recorded for it.
        """
        if not run_id or not isinstance(run_id, str):
            raise ValueError("run_id must be a non-empty string")
        spec_json = canonical_json(spec)
        values = (
            run_id,
            kind,
            spec_json,
            canonical_json(metrics),
            canonical_json(curves or {}),
            canonical_json(env or {}),
            time.time(),
        )

        def transaction(db: sqlite3.Connection) -> bool:
            stored = db.execute("SELECT spec FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if stored is not None and not replace:
                if canonical_json(json.loads(stored[0])) != spec_json:
                    raise DuplicateRunError(f"run {run_id} is stored with a different spec")
                return False
            db.execute(
                f"INSERT OR REPLACE INTO runs ({', '.join(_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)", values
            )
            db.execute("DELETE FROM failures WHERE run_id = ?", (run_id,))
            return True

        return self._write(transaction)

    def put_failure(self, run_id: str, kind: str, failure: Failure) -> None:
        """Record that a run failed (its error in one line and its traceback); a later success clears it."""
        values = (run_id, kind, canonical_json(failure.spec), failure.error, failure.traceback, time.time())
        columns = ", ".join(_FAILURE_COLUMNS)
        self._write(
            lambda db: db.execute(
                f"INSERT OR REPLACE INTO failures ({columns}) VALUES (?, ?, ?, ?, ?, ?)", values
            )
        )

    def failures(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The recorded failures (of one ``kind`` when given), oldest first, the spec decoded."""
        found = self._select("failures", _FAILURE_COLUMNS, kind)
        rows = [dict(zip(_FAILURE_COLUMNS, row, strict=True)) for row in found]
        for row in rows:
            row["spec"] = json.loads(row["spec"])
        return rows

    def _select(self, table: str, columns: tuple[str, ...], kind: str | None) -> list[tuple[Any, ...]]:
        """``columns`` of every row of ``table`` (of one ``kind`` when given), oldest first."""
        where, params = (" WHERE kind = ?", (kind,)) if kind is not None else ("", ())
        with self._connect() as db:
            query = f"SELECT {', '.join(columns)} FROM {table}{where} ORDER BY created, run_id"
            return db.execute(query, params).fetchall()

    def has(self, run_id: str) -> bool:
        with self._connect() as db:
            return db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is not None

    def get(self, run_id: str) -> dict[str, Any]:
        """One run as a dict with its JSON columns decoded; ``KeyError`` when absent."""
        with self._connect() as db:
            row = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run {run_id} in {self.path}")
        return _decode(row)

    def rows(self, kind: str | None = None) -> list[dict[str, Any]]:
        """All runs (of one ``kind`` when given), oldest first, JSON columns decoded."""
        return [_decode(row) for row in self._select("runs", _COLUMNS, kind)]

    def copy_to(self, target: ResultStore, keep_curves: Callable[[dict[str, Any]], bool]) -> int:
        """Copy every run into ``target`` (runs it holds already stay as they are); returns how many were
        new there. ``keep_curves(spec)`` says whose per-step curves travel: the others arrive with empty
        curves, so that a store of thousands of runs can be committed with the curves its figures draw.
        Each row keeps its original ``created``."""
        with self._connect() as db:
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs ORDER BY created, run_id").fetchall()
        spec, curves = _COLUMNS.index("spec"), _COLUMNS.index("curves")
        copied = [
            (*row[:curves], row[curves] if keep_curves(json.loads(row[spec])) else "{}", *row[curves + 1 :])
            for row in rows
        ]
        columns, slots = ", ".join(_COLUMNS), ", ".join("?" * len(_COLUMNS))
        insert = f"INSERT OR IGNORE INTO runs ({columns}) VALUES ({slots})"

        def transaction(db: sqlite3.Connection) -> int:
            before = db.total_changes
            db.executemany(insert, copied)
            return db.total_changes - before

        return target._write(transaction)

    def __len__(self) -> int:
        with self._connect() as db:
            return db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]

    def __contains__(self, run_id: object) -> bool:
        return isinstance(run_id, str) and self.has(run_id)


def _decode(row: tuple[Any, ...]) -> dict[str, Any]:
    record = dict(zip(_COLUMNS, row, strict=True))
    for column in _JSON_COLUMNS:
        record[column] = json.loads(record[column])
    return record
