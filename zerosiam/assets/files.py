"""The package's one way to hash a file, to write a file atomically, and to trust a cached file.

Caches, checkpoints, trained weights and corrupted arrays are all read by other processes (pool workers,
a resumed run, another user of a shared cache) and all can be interrupted mid-write, even by ``kill -9``.
Every writer therefore gives the same guarantee, from this module alone, so that no call site can quietly
offer a weaker one:

* the data goes to a temporary file in the target's own folder (the same file system, so the final
  ``os.replace`` is an atomic rename: a reader sees the old file or the whole new one, never half);
* it is flushed and ``os.fsync``-ed before the rename, so a machine crash cannot leave a renamed file
  whose blocks never reached the disk;
* it is made ``0o644`` (``mkstemp`` creates ``0o600``; shared caches and shipped weights must stay
  readable by others);
* on any exception, including ``KeyboardInterrupt``, the temporary file is removed and the target is
  left as it was.

Cached files (corrupted arrays, decoded datasets, converted language models) are also written with a
record of what they must be (``<name>.check.json``: size, sha256, and facts such as shape and dtype)
and checked against it when opened. A full disk, a killed copy or a hand edit can still damage a file
after it was written; such a file is removed with one warning line naming it, and rebuilt.

Checking a cache file and building it is one step under :func:`building` (an exclusive lock per file),
because two processes share one cache (two ``zerosiam bench`` jobs started together): without the lock,
both build, and one's check removes the file the other has just renamed into place but not yet recorded.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

try:
    import fcntl
except ImportError:  # not POSIX: caches are checked and built unlocked
    fcntl = None

PathLike = str | os.PathLike[str]

log = logging.getLogger("zerosiam")

_CHUNK = 1 << 20
MODE = 0o644
CHECK_SUFFIX = ".check.json"
MANIFEST = "zerosiam-check.json"  # the record of a cached folder, inside it
LOCK_SUFFIX = ".lock"
TEMPORARY_SUFFIX = ".part"
"""Suffix of the temporary files: a folder holding ``.<name>.*.part`` files saw an interrupted write."""


def sha256_file(path: PathLike) -> str:
    """The sha256 of a file's content, read in chunks so large files do not fill memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_file(path: PathLike) -> Iterator[BinaryIO]:
    """A binary handle whose content replaces ``path`` only when the ``with`` block ends without error.

    For writers that need a file object (``np.save``, ``torch.save``, a download loop). Raising inside the
    block discards everything written and leaves ``path`` untouched; see the module docstring for the
    guarantees. The parent folder is created if needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    temporary = Path(name)
    try:
        with open(descriptor, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, MODE)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def atomic_write(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_file`: readers never see half a file."""
    with atomic_file(path) as handle:
        handle.write(data)


# ---------------------------------------------------------------------------------------- checked caches
_HASHED: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) → sha256: hash a file once per process


def _sha256_once(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(path)
    return _HASHED[key]


@contextlib.contextmanager
def building(path: PathLike) -> Iterator[None]:
    """Hold the exclusive lock of the cache file or folder ``path`` while checking and building it.

    Another process that wants the same file waits here, then finds it built. The lock is an advisory
    ``flock`` on ``<path>.lock``, released by the kernel when its holder exits, even by ``kill -9``, so a
    crash never leaves a stale lock. Where no lock can be had (a read-only shared cache, or a system
    without ``fcntl``) the block runs unlocked: reading an intact cache needs none. The lock belongs to
    the open lock file, which a forked child inherits, so fork no worker inside the block.
    """
    handle = _open_lock(Path(path)) if fcntl is not None else None
    if handle is None:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _open_lock(path: Path) -> TextIO | None:
    """The lock file of ``path``, open, or None where the cache folder cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path.with_name(path.name + LOCK_SUFFIX), "a")  # noqa: SIM115 (closed by building)
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return None
        raise


def check_path(path: PathLike) -> Path:
    """Where the record of the cached file ``path`` lives."""
    path = Path(path)
    return path.with_name(path.name + CHECK_SUFFIX)


def write_checked(path: PathLike, write: Callable[[BinaryIO], None], **facts: Any) -> None:
    """Write a cache file atomically by ``write(handle)``, then its record: size, sha256 and ``facts``.

    The record comes second, so a crash in between leaves a file without a record, which is rebuilt.
    """
    path = Path(path)
    with atomic_file(path) as handle:
        write(handle)
    record = {"size": path.stat().st_size, "sha256": _sha256_once(path), **facts}
    atomic_write(check_path(path), json.dumps(record, sort_keys=True).encode())


def damage(path: PathLike, **facts: Any) -> str | None:
    """Why the cached file ``path`` cannot be trusted (its record is missing or disagrees with it, or with
    the expected ``facts``), or None when it is intact."""
    path = Path(path)
    try:
        record = json.loads(check_path(path).read_text())
    except FileNotFoundError:
        return "it has no check record"
    except (OSError, ValueError):
        return "its check record is unreadable"
    if not path.is_file():
        return "it is missing"
    size = path.stat().st_size
    if record.get("size") != size:
        return f"{size} bytes where {record.get('size')} were written"
    for key, expected in facts.items():
        if record.get(key) != expected:
            return f"{key} {record.get(key)} where {expected} is expected"
    if record.get("sha256") != _sha256_once(path):
        return "its content differs from what was written"
    return None


def intact(path: PathLike, **facts: Any) -> bool:
    """True when ``path`` is an intact cache file. A damaged or partial one is removed, with one warning
    line naming it, and False returned so that the caller rebuilds it; an absent one is simply False."""
    path = Path(path)
    if not path.exists() and not check_path(path).exists():
        return False
    reason = damage(path, **facts)
    if reason is None:
        return True
    log.warning("zerosiam: damaged cache file %s (%s): removed, and rebuilt", path, reason)
    path.unlink(missing_ok=True)
    check_path(path).unlink(missing_ok=True)
    return False


def write_manifest(folder: PathLike) -> None:
    """Record every file of a cached folder (size and sha256), in the folder itself."""
    folder = Path(folder)
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256_once(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    atomic_write(folder / MANIFEST, json.dumps(files, indent=0, sort_keys=True).encode())


def intact_folder(folder: PathLike) -> bool:
    """True when every file of the cached ``folder`` is as its manifest records. A damaged folder is
    removed, with one warning line naming it, and False returned; an absent one is simply False."""
    folder = Path(folder)
    if not folder.exists():
        return False
    reason = _folder_damage(folder)
    if reason is None:
        return True
    log.warning("zerosiam: damaged cache folder %s (%s): removed, and rebuilt", folder, reason)
    shutil.rmtree(folder, ignore_errors=True)
    return False


def _folder_damage(folder: Path) -> str | None:
    try:
        files = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return "it has no check record"
    except (OSError, ValueError):
        return "its check record is unreadable"
    for name, record in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != record["size"] or _sha256_once(path) != record["sha256"]:
            return f"{name} differs from what was written"
    return None
