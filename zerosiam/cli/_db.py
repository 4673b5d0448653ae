"""Where a command's result store (``--db``) may be, checked before any work.

A path that cannot hold a SQLite file (a folder, a path under a file, a place nothing can be created such
as ``/proc``) would otherwise stop a command with SQLite's ``unable to open database file`` and a
traceback, after its grid was checked and maybe after its workers started. The static checks read the
path only; the store is then opened as the command's first write, and a failure there removes what the
opening made (the file and the folders created for it), so a refused ``--db`` leaves nothing behind.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from zerosiam.cli._errors import UsageError, refuse_text_store

if TYPE_CHECKING:
    from zerosiam.bench.store import ResultStore

SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def check_writable_db(db: Path) -> None:
    """Refuse, in one line and without writing, a ``--db`` a command could not write its runs into: a
    committed text store, a folder, a path under a file, or a file that is not a SQLite database. Missing
    folders are fine: the command creates them (``runs/quick.db`` in a fresh clone)."""
    refuse_text_store(db)
    if db.is_dir():
        raise UsageError(f"--db {db} is a folder; give the name of a SQLite file, e.g. {db / 'results.db'}")
    _refuse_file_in_the_way(db)
    if db.exists():
        _refuse_other_than_sqlite(db)


def check_readable_db(db: Path) -> None:
    """Refuse, in one line and without writing, a ``--db`` that holds no result store: a path that does
    not exist, a folder without a text store's ``runs.jsonl``, a file that is not a SQLite database."""
    from zerosiam.bench.textstore import RUNS, is_text_store

    if is_text_store(db):
        return
    _refuse_file_in_the_way(db)
    if not db.exists():
        raise UsageError(
            f"--db {db} does not exist; give the SQLite file `zerosiam bench` wrote or a text store"
        )
    if db.is_dir():
        raise UsageError(f"--db {db} is a folder without {RUNS}; give a SQLite file or a text store folder")
    _refuse_other_than_sqlite(db)


def open_for_writing(db: Path) -> ResultStore:
    """The result store at ``db``, its missing folders created; a path where no SQLite file can be opened
    or created is a one-line ``UsageError``, and what the attempt created is removed again."""
    from zerosiam.bench.store import ResultStore

    created = _missing_folders(db)
    existed = db.exists()
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        return ResultStore(db)
    except (OSError, sqlite3.Error) as error:
        if not existed:
            _remove_quietly(db, *(Path(f"{db}{suffix}") for suffix in ("-wal", "-shm", "-journal")))
        for folder in reversed(created):
            _remove_quietly(folder)
        raise UsageError(f"--db {db}: cannot open or create a SQLite file there ({error})") from None


def _refuse_file_in_the_way(db: Path) -> None:
    """A folder on the way to ``db`` that is a file (``notes.txt/results.db``) is named."""
    for folder in db.parents:
        if folder.exists():
            if not folder.is_dir():
                raise UsageError(f"--db {db}: {folder} is a file, not a folder")
            return


def _refuse_other_than_sqlite(db: Path) -> None:
    """An existing ``db`` must be a file SQLite can read (an empty one becomes a new store)."""
    if not db.is_file():
        raise UsageError(f"--db {db} is not a regular file; give the name of a SQLite file")
    try:
        with db.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except OSError as error:
        raise UsageError(f"--db {db} cannot be read ({error.strerror or error})") from None
    if header and header != SQLITE_HEADER:
        raise UsageError(f"--db {db} is not a SQLite file (it does not start with {SQLITE_HEADER[:-1]!r})")


def _missing_folders(db: Path) -> list[Path]:
    """The folders above ``db`` that do not exist yet, outermost first."""
    return [folder for folder in reversed(db.parents) if not folder.exists()]


def _remove_quietly(*paths: Path) -> None:
    for path in paths:
        try:
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        except OSError:
            continue
