"""The ``zerosiam`` command. Each sub-command lives in its own module of this package and exposes
``register(subparsers)``; modules are discovered, so adding a command never touches this file."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from zerosiam.cli._errors import Interrupted, Parser, UsageError, fail


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="zerosiam", description="Test-time adaptation without collapse.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
        importlib.import_module(f"{__name__}.{module}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a sub-command: a bad input is one line and exit code 2, a signal exits 128 + its number."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as error:
        fail(str(error))
    except Interrupted as stop:
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
