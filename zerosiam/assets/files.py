"""The package's one way to hash a file and its one way to write a file atomically.

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
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

PathLike = str | os.PathLike[str]

_CHUNK = 1 << 20
MODE = 0o644
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
