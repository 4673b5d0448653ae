"""Where the catalogue's files are on disk, each checked against its registered sha256 before use.

A file is looked up in a local mirror first (the project's ``../shared/assets`` by default), then in the
download cache, and only then downloaded from its public source. Whatever is returned has been checked
against the registered sha256, so a benchmark can never silently run on a truncated or altered file.

Places, in order of precedence: the ``mirror``/``cache`` arguments, the ``ZEROSIAM_MIRROR`` /
``ZEROSIAM_CACHE`` environment variables (the mirror variable may list several folders separated by
``os.pathsep``), then the defaults.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from zerosiam.assets.catalogue import (
    ASSETS,
    CACHE_ENV,
    MIRROR_ENV,
    AssetError,
    AssetFile,
    AssetMissingError,
    ChecksumMismatchError,
    get_asset,
)
from zerosiam.assets.files import atomic_file, atomic_write, sha256_file

_VERIFIED_NAME = "verified.json"
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0

PathLike = str | os.PathLike[str]
MirrorArg = PathLike | Sequence[PathLike] | None


# ---------------------------------------------------------------------------------------------- places
def default_mirror() -> Path:
    """``../shared/assets`` beside the project checkout (this file is ``<root>/zerosiam/assets/store.py``)."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "assets"


def mirror_dirs(mirror: MirrorArg = None) -> list[Path]:
    """The mirror folders to search, in order; a missing default mirror is simply skipped."""
    if mirror is not None:
        items = [mirror] if isinstance(mirror, str | os.PathLike) else list(mirror)
        return [Path(m).expanduser() for m in items]
    env = os.environ.get(MIRROR_ENV)
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    default = default_mirror()
    return [default] if default.is_dir() else []


def cache_dir(cache: PathLike | None = None) -> Path:
    """Where downloads and decoded arrays are kept: argument, ``$ZEROSIAM_CACHE``, ``~/.cache/zerosiam``."""
    if cache is not None:
        return Path(cache).expanduser()
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "zerosiam"


# ---------------------------------------------------------------------------------------------- hashes
class _VerifiedStore:
    """Remembers the sha256 of files keyed by (path, size, mtime) so big files are hashed once.

    Kept in memory and in ``<cache>/verified.json``; a changed size or mtime invalidates the entry.
    Failing to write the store only costs a rehash later, so write errors are ignored.
    """

    def __init__(self) -> None:
        self._memory: dict[str, str] = {}

    @staticmethod
    def _key(path: Path) -> str:
        stat = path.stat()
        return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"

    def sha256(self, path: Path, cache: Path) -> str:
        key = self._key(path)
        if key in self._memory:
            return self._memory[key]
        stored = self._load(cache)
        if key not in stored:
            stored[key] = sha256_file(path)
            self._save(cache, stored)
        self._memory[key] = stored[key]
        return stored[key]

    @staticmethod
    def _load(cache: Path) -> dict[str, str]:
        try:
            data = json.loads((cache / _VERIFIED_NAME).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def _save(cache: Path, stored: dict[str, str]) -> None:
        with contextlib.suppress(OSError):
            atomic_write(cache / _VERIFIED_NAME, json.dumps(stored, indent=0, sort_keys=True).encode())

    def clear(self) -> None:
        self._memory.clear()


_VERIFIED = _VerifiedStore()


# ---------------------------------------------------------------------------------------------- lookup
class _Discarded(Exception):
    """Raised inside ``atomic_file`` to throw a download away: its content is not the registered one."""


def _download(url: str, dest: Path, expected: str) -> str:
    """Download ``url`` next to ``dest``; rename it into place only if its sha256 is ``expected``.

    Returns the sha256 of what was received (equal to ``expected`` on success).
    """
    digest = hashlib.sha256()
    with (
        contextlib.suppress(_Discarded),
        atomic_file(dest) as handle,
        urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response,
    ):
        while chunk := response.read(_CHUNK):
            digest.update(chunk)
            handle.write(chunk)
        if digest.hexdigest() != expected:
            raise _Discarded
    return digest.hexdigest()


def _find_local(
    entry: AssetFile, places: Iterable[Path], cache: Path, looked: list[str], bad: dict[str, str]
):
    """The first of ``places`` holding ``entry`` with the right content, noting every place tried."""
    for base in places:
        candidate = base / entry.path
        looked.append(str(candidate))
        if not candidate.is_file():
            continue
        actual = _VERIFIED.sha256(candidate, cache)
        if actual == entry.sha256:
            return candidate
        bad[str(candidate)] = actual
    return None


def resolve(
    entry: AssetFile, *, mirror: MirrorArg = None, cache: PathLike | None = None, download: bool = True
) -> Path:
    """A verified local path for ``entry``: mirror, then cache, then (if allowed) a download to the cache."""
    cache_root = cache_dir(cache)
    looked: list[str] = []
    bad: dict[str, str] = {}
    found = _find_local(entry, [*mirror_dirs(mirror), cache_root], cache_root, looked, bad)
    if found is None and download:
        found = _download_any(entry, cache_root, looked, bad)
    if found is not None:
        if bad:
            warnings.warn(f"ignored corrupt copies of {entry.path}: {bad}", stacklevel=3)
        return found
    if not entry.urls:
        looked.append("(no download URL is registered for this file: it must come from a mirror)")
    elif not download:
        looked.append("(downloading was not allowed)")
    if bad:
        raise ChecksumMismatchError(entry.path, entry.sha256, bad, looked)
    raise AssetMissingError(entry.path, entry.sha256, looked)


def _download_any(entry: AssetFile, cache_root: Path, looked: list[str], bad: dict[str, str]) -> Path | None:
    dest = cache_root / entry.path
    for url in entry.urls:
        looked.append(url)
        try:
            actual = _download(url, dest, entry.sha256)
        except (urllib.error.URLError, OSError, ValueError) as error:
            looked[-1] = f"{url} (download failed: {error})"
            continue
        if actual == entry.sha256:
            return dest
        bad[url] = actual
    return None


def fetch(
    asset: str,
    file: str | None = None,
    *,
    mirror: MirrorArg = None,
    cache: PathLike | None = None,
    download: bool = True,
) -> Path:
    """Verified local path of one file of ``asset`` (``file`` may be omitted for one-file assets)."""
    return resolve(get_asset(asset).file(file), mirror=mirror, cache=cache, download=download)


# ---------------------------------------------------------------------------------------------- verify
@dataclass(frozen=True)
class VerifyResult:
    """The outcome of checking one file: ``ok`` with its path, or the error message."""

    asset: str
    file: str
    ok: bool
    path: Path | None
    message: str


def verify(
    asset_names: Iterable[str] | None = None,
    *,
    mirror: MirrorArg = None,
    cache: PathLike | None = None,
    download: bool = False,
    licences: bool = True,
) -> list[VerifyResult]:
    """Check every file (and licence file) of the named assets (all by default); never raises for a file."""
    names = list(ASSETS) if asset_names is None else list(asset_names)
    results = []
    for name in names:
        asset = get_asset(name)
        entries = (*asset.files, *(asset.licence_files if licences else ()))
        for entry in entries:
            results.append(_verify_one(asset.name, entry, mirror, cache, download))
    return results


def _verify_one(
    name: str, entry: AssetFile, mirror: MirrorArg, cache: PathLike | None, download: bool
) -> VerifyResult:
    try:
        path = resolve(entry, mirror=mirror, cache=cache, download=download)
    except AssetError as error:
        return VerifyResult(name, entry.path, False, None, str(error))
    return VerifyResult(name, entry.path, True, path, f"ok {entry.sha256[:16]}… {path}")


def locate(entry: AssetFile, *, mirror: MirrorArg = None, cache: PathLike | None = None) -> Path | None:
    """Where ``entry`` would be read from, without hashing or downloading (for listings)."""
    for base in [*mirror_dirs(mirror), cache_dir(cache)]:
        if (base / entry.path).is_file():
            return base / entry.path
    return None
