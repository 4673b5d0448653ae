"""A small durable store of benchmark results: one SQLite file, one row per finished run.

Why SQLite: a grid of runs is interrupted, resumed, run from several processes at once and read while
it runs. One file with transactions gives all of that with the standard library alone. WAL mode lets
readers work while a writer commits, and each ``put`` is a single transaction, so a row is either
absent or complete and a killed run never leaves half a result behind.

A run is keyed by ``run_id``, normally ``run_id_for(spec)``: the sha256 of the spec's canonical JSON,
so the same spec always maps to the same row and a resumed grid can skip what it has (``has``).
The schema is deliberately generic (``kind`` tells vision from language rows; the spec, metrics,
curves and environment are JSON documents) so every benchmark of the project can share it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    spec JSON NOT NULL,
    metrics JSON NOT NULL,
    curves JSON NOT NULL,
    env JSON NOT NULL,
    created REAL NOT NULL
)
"""
_COLUMNS = ("run_id", "kind", "spec", "metrics", "curves", "env", "created")
_JSON_COLUMNS = ("spec", "metrics", "curves", "env")


class DuplicateRunError(KeyError):
    """A row with this ``run_id`` exists and the caller did not ask to replace it."""


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
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection whose ``with`` block is one transaction (committed, or rolled back on error)."""
        db = sqlite3.connect(self.path, timeout=self.timeout)
        try:
            with db:
                yield db
        finally:
            db.close()

    def put(
        self,
        run_id: str,
        kind: str,
        spec: dict[str, Any],
        metrics: dict[str, Any],
        curves: dict[str, Any] | None = None,
        env: dict[str, Any] | None = None,
        replace: bool = False,
    ) -> None:
        """Write one run in a single transaction.

        Raises ``DuplicateRunError`` when ``run_id`` is already stored, unless ``replace=True``: a
        silent overwrite would hide that two different runs were given the same identity.
        """
        if not run_id or not isinstance(run_id, str):
            raise ValueError("run_id must be a non-empty string")
        values = (
            run_id,
            kind,
            canonical_json(spec),
            canonical_json(metrics),
            canonical_json(curves or {}),
            canonical_json(env or {}),
            time.time(),
        )
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        try:
            with self._connect() as db:
                db.execute(f"{verb} INTO runs ({', '.join(_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)", values)
        except sqlite3.IntegrityError:
            message = f"run {run_id} is already stored; pass replace=True to overwrite"
            raise DuplicateRunError(message) from None

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
        query = f"SELECT {', '.join(_COLUMNS)} FROM runs"
        params: tuple[Any, ...] = ()
        if kind is not None:
            query += " WHERE kind = ?"
            params = (kind,)
        with self._connect() as db:
            found = db.execute(query + " ORDER BY created, run_id", params).fetchall()
        return [_decode(row) for row in found]

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
