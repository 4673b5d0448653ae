"""``zerosiam assets list|verify``: see which data and weights are present and check their sha256."""

from __future__ import annotations

import argparse
import sys

from zerosiam import assets


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``assets`` with its ``list`` and ``verify`` sub-commands."""
    parser = subparsers.add_parser("assets", help="list and verify the project's data and weights")
    commands = parser.add_subparsers(dest="assets_command", required=True, metavar="ACTION")
    places = argparse.ArgumentParser(add_help=False)
    places.add_argument(
        "--mirror", action="append", help=f"mirror folder (repeatable; default ${assets.MIRROR_ENV})"
    )
    places.add_argument("--cache", help=f"download cache (default ${assets.CACHE_ENV} or ~/.cache/zerosiam)")

    listing = commands.add_parser("list", parents=[places], help="list the assets and where each file is")
    listing.set_defaults(func=run_list)

    checking = commands.add_parser("verify", parents=[places], help="check the sha256 of every file")
    checking.add_argument("names", nargs="*", metavar="NAME", help="assets to check (default: all)")
    checking.add_argument("--download", action="store_true", help="download files that are missing")
    checking.set_defaults(func=run_verify)


def run_list(args: argparse.Namespace) -> int:
    """One block per asset: licence, source, and each file with where it would be read from."""
    for asset in assets.ASSETS.values():
        print(f"{asset.name}  [{asset.licence}]  {asset.source}")
        for entry in asset.files:
            where = assets.locate(entry, mirror=args.mirror, cache=args.cache)
            print(f"    {entry.name:<28} {entry.sha256[:16]}…  {where if where else 'MISSING'}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Print one line per file; exit status 1 if any file is missing or corrupt."""
    try:
        results = assets.verify(
            args.names or None, mirror=args.mirror, cache=args.cache, download=args.download
        )
    except assets.UnknownAssetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for result in results:
        status = "OK  " if result.ok else "FAIL"
        detail = result.path if result.ok else result.message
        print(f"{status} {result.asset:<20} {result.file}: {detail}")
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed}/{len(results)} files verified")
    return 1 if failed else 0
