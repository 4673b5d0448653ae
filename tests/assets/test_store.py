"""The asset store: lookup order, download against a local HTTP server, checksums, errors and the CLI."""

from __future__ import annotations

import argparse
import hashlib
import http.server
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import SHARED_ASSETS
from zerosiam import assets
from zerosiam.assets import store
from zerosiam.cli import assets as assets_cli

PAYLOAD = b"zerosiam fixture asset\n" * 100
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).requests.append(self.path)
        super().do_GET()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """An HTTP server on 127.0.0.1 serving ``<tmp>/served``: (base URL, folder, requested paths)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = type("Handler", (_QuietHandler,), {"requests": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served, handler.requests
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(autouse=True)
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Every test gets its own empty mirror and cache, so nothing outside tmp is read or written."""
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    monkeypatch.setenv(assets.MIRROR_ENV, str(mirror))
    monkeypatch.setenv(assets.CACHE_ENV, str(cache))
    store._VERIFIED.clear()
    return mirror, cache


def register_fixture(
    monkeypatch: pytest.MonkeyPatch, urls: tuple[str, ...] = (), sha: str = PAYLOAD_SHA
) -> None:
    entry = assets.AssetFile("fixture/fixture.bin", sha, urls)
    asset = assets.Asset("fixture", (entry,), source="tests", licence="none")
    monkeypatch.setitem(assets.ASSETS, "fixture", asset)


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*.part")] if folder.exists() else []


# ---------------------------------------------------------------------------------------------- mirror
def test_an_unknown_name_fails_before_any_place_is_searched() -> None:
    with pytest.raises(assets.UnknownAssetError, match="known assets"):
        assets.fetch("no-such-asset")
    with pytest.raises(assets.UnknownAssetError, match="no file"):
        assets.fetch("frost", "frost9.png")


@pytest.mark.skipif(not SHARED_ASSETS.is_dir(), reason="the shared asset mirror is absent")
def test_default_mirror_serves_the_real_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(assets.MIRROR_ENV)
    assert assets.default_mirror().resolve() == SHARED_ASSETS.resolve()
    path = assets.fetch("resnet20")
    assert path.resolve() == SHARED_ASSETS.resolve() / "cifar10-resnets" / "resnet20-12fca82f.th"
    results = assets.verify(["frost", "math-aime24", "resnet32"])
    assert [r.ok for r in results] == [True] * len(results) and len(results) == 8 + 3  # files + licences


# ---------------------------------------------------------------------------------------------- download
def test_download_verifies_and_caches(server, places, monkeypatch: pytest.MonkeyPatch) -> None:
    base, served, requests = server
    (served / "fixture.bin").write_bytes(PAYLOAD)
    register_fixture(monkeypatch, (f"{base}/fixture.bin",))
    path = assets.fetch("fixture")
    assert path == places[1] / "fixture" / "fixture.bin"
    assert path.read_bytes() == PAYLOAD
    assert assets.fetch("fixture") == path
    assert requests == ["/fixture.bin"]  # the second call found the cached copy
    assert leftovers(places[1]) == []


def test_download_tries_the_next_url(server, places, monkeypatch: pytest.MonkeyPatch) -> None:
    base, served, _ = server
    (served / "fixture.bin").write_bytes(PAYLOAD)
    register_fixture(monkeypatch, (f"{base}/gone.bin", f"{base}/fixture.bin"))
    assert assets.fetch("fixture").read_bytes() == PAYLOAD


def test_download_with_wrong_content_is_not_kept(server, places, monkeypatch: pytest.MonkeyPatch) -> None:
    base, served, _ = server
    (served / "fixture.bin").write_bytes(PAYLOAD + b"tampered")
    register_fixture(monkeypatch, (f"{base}/fixture.bin",))
    with pytest.raises(assets.ChecksumMismatchError) as caught:
        assets.fetch("fixture")
    message = str(caught.value)
    assert PAYLOAD_SHA in message
    assert hashlib.sha256(PAYLOAD + b"tampered").hexdigest() in message
    assert f"{base}/fixture.bin" in message and str(places[0]) in message
    assert isinstance(caught.value, ValueError)
    assert not (places[1] / "fixture" / "fixture.bin").exists() and leftovers(places[1]) == []


# ---------------------------------------------------------------------------------------------- lookup
def test_missing_file_names_every_place(places, monkeypatch: pytest.MonkeyPatch) -> None:
    register_fixture(monkeypatch, ("http://127.0.0.1:9/unreachable.bin",))
    with pytest.raises(assets.AssetMissingError) as caught:
        assets.fetch("fixture")
    message = str(caught.value)
    assert isinstance(caught.value, FileNotFoundError)
    assert PAYLOAD_SHA in message
    for place in (places[0] / "fixture/fixture.bin", places[1] / "fixture/fixture.bin"):
        assert str(place) in message
    assert "127.0.0.1:9/unreachable.bin (download failed" in message


def test_mirror_env_var_and_argument(tmp_path: Path, places, monkeypatch: pytest.MonkeyPatch) -> None:
    register_fixture(monkeypatch)
    other = tmp_path / "other"
    for root in (places[0], other):
        (root / "fixture").mkdir(parents=True)
        (root / "fixture" / "fixture.bin").write_bytes(PAYLOAD)
    assert assets.fetch("fixture") == places[0] / "fixture" / "fixture.bin"
    assert assets.fetch("fixture", mirror=other) == other / "fixture" / "fixture.bin"
    monkeypatch.setenv(assets.MIRROR_ENV, f"{tmp_path / 'empty'}:{other}")
    assert assets.fetch("fixture") == other / "fixture" / "fixture.bin"


def test_corrupt_mirror_copy_is_reported(places, monkeypatch: pytest.MonkeyPatch) -> None:
    register_fixture(monkeypatch)
    (places[0] / "fixture").mkdir()
    (places[0] / "fixture" / "fixture.bin").write_bytes(PAYLOAD[:-1])
    with pytest.raises(assets.ChecksumMismatchError, match=hashlib.sha256(PAYLOAD[:-1]).hexdigest()):
        assets.fetch("fixture")


def test_corrupt_mirror_falls_back_to_a_good_download(server, places, monkeypatch) -> None:
    base, served, _ = server
    (served / "fixture.bin").write_bytes(PAYLOAD)
    register_fixture(monkeypatch, (f"{base}/fixture.bin",))
    (places[0] / "fixture").mkdir()
    (places[0] / "fixture" / "fixture.bin").write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="corrupt"):
        path = assets.fetch("fixture")
    assert path == places[1] / "fixture" / "fixture.bin"


def test_verified_hash_is_reused_until_the_file_changes(places, monkeypatch: pytest.MonkeyPatch) -> None:
    register_fixture(monkeypatch)
    target = places[0] / "fixture" / "fixture.bin"
    target.parent.mkdir()
    target.write_bytes(PAYLOAD)
    assets.fetch("fixture")
    assert (places[1] / "verified.json").is_file()
    store._VERIFIED.clear()  # a new process: only the on-disk record remains

    def no_hashing(path: object) -> str:
        raise AssertionError("the file was hashed again")

    monkeypatch.setattr(store, "sha256_file", no_hashing)
    assert assets.fetch("fixture") == target
    monkeypatch.undo()
    register_fixture(monkeypatch)
    monkeypatch.setenv(assets.MIRROR_ENV, str(places[0]))
    monkeypatch.setenv(assets.CACHE_ENV, str(places[1]))
    target.write_bytes(PAYLOAD.upper())  # new size and mtime: must be hashed again and rejected
    with pytest.raises(assets.ChecksumMismatchError):
        assets.fetch("fixture")


# ---------------------------------------------------------------------------------------------- verify + CLI
def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    assets_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_verify_and_cli_report_missing_and_present(places, monkeypatch, capsys) -> None:
    register_fixture(monkeypatch)
    [missing] = assets.verify(["fixture"])
    assert not missing.ok and "not found" in missing.message
    assert run_cli(["assets", "verify", "fixture"]) == 1
    assert "FAIL" in capsys.readouterr().out
    (places[0] / "fixture").mkdir()
    (places[0] / "fixture" / "fixture.bin").write_bytes(PAYLOAD)
    assert run_cli(["assets", "verify", "fixture", "--mirror", str(places[0])]) == 0
    assert "1/1 files verified" in capsys.readouterr().out
    assert run_cli(["assets", "list", "--cache", str(places[1])]) == 0
    listing = capsys.readouterr().out
    assert "fixture.bin" in listing and str(places[0]) in listing and "cifar10-jpeg-test" in listing
    assert run_cli(["assets", "verify", "nope"]) == 2
