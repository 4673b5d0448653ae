"""The ``zerosiam`` command. Each sub-command lives in its own module of this package and exposes
``register(subparsers)``; modules are discovered, so adding a command never touches this file."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerosiam", description="Test-time adaptation without collapse.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
        importlib.import_module(f"{__name__}.{module}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
