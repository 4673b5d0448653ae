"""The catalogue: every project asset registered with full checksums, and clear errors for unknown names."""

from __future__ import annotations

import pytest

from zerosiam.assets import catalogue
from zerosiam.assets.catalogue import ASSETS, UnknownAssetError, get_asset

REQUIRED = [
    "cifar10-jpeg-test",
    "cifar10-jpeg-train",
    "resnet20",
    "resnet32",
    "resnet56",
    "imagenet-sample",
    "frost",
    "math-gsm8k",
    "math-math500",
    "math-aime24",
    "math-minerva",
    "math-college",
]


def test_registry_has_every_project_asset_with_full_checksums() -> None:
    assert set(REQUIRED) <= set(ASSETS)
    assert len(ASSETS["frost"].files) == 6
    for asset in ASSETS.values():
        assert asset.licence and asset.source
        for entry in (*asset.files, *asset.licence_files):
            assert len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0
    resnet = ASSETS["resnet20"].file()
    assert resnet.sha256.startswith(resnet.name.split("-")[1][:8])  # the name carries the hash prefix


def test_unknown_names_are_clear_errors() -> None:
    with pytest.raises(UnknownAssetError, match="known assets"):
        get_asset("no-such-asset")
    with pytest.raises(UnknownAssetError, match="frost1.png"):
        get_asset("frost").file()  # several files: one must be named
    with pytest.raises(UnknownAssetError, match="no file"):
        get_asset("frost").file("frost9.png")
    assert get_asset("frost").file("frost/LICENSE").name == "LICENSE"  # licence files by relative path


def test_every_error_is_an_asset_error_and_a_builtin_one() -> None:
    """Callers catch the package's errors at once (``AssetError``) or as the builtin they resemble."""
    missing = catalogue.AssetMissingError("a.bin", "0" * 64, ["/nowhere/a.bin"])
    mismatch = catalogue.ChecksumMismatchError("a.bin", "0" * 64, {"/m/a.bin": "1" * 64}, ["/m/a.bin"])
    assert isinstance(missing, catalogue.AssetError) and isinstance(missing, FileNotFoundError)
    assert isinstance(mismatch, catalogue.AssetError) and isinstance(mismatch, ValueError)
    assert issubclass(UnknownAssetError, catalogue.AssetError) and issubclass(UnknownAssetError, ValueError)
    assert "/nowhere/a.bin" in str(missing) and f"${catalogue.MIRROR_ENV}" in str(missing)
    assert "1" * 64 in str(mismatch)
