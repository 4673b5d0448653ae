"""Regenerate (or check) every table of docs/RESULTS.md and docs/guard.md from the committed store, by its
own command.

    python benchmarks/results_doc.py            # rewrite the tables in place
    python benchmarks/results_doc.py --check    # exit 1 naming each table that differs from its command

A generated table sits between a comment naming the command that prints it and an end comment:

    <!-- zerosiam report --db docs/results/study --protocol label_shift --model resnet26_gn -->
    ...what that command prints...
    <!-- end -->

The command is run for real (``zerosiam.cli.main``, its standard output captured), from the repository
root, so a table in the document is exactly what a reader who runs the command beside it gets.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "docs" / "RESULTS.md"
DOCUMENTS = (DOCUMENT, ROOT / "docs" / "guard.md")  # every page whose tables come from the store
BLOCK = re.compile(r"(<!-- (zerosiam [^\n]*?) -->\n)(.*?)(<!-- end -->)", re.DOTALL)


def printed(command: str) -> str:
    """What ``command`` (a ``zerosiam ...`` line) prints, run in this process from the repository root."""
    from zerosiam.cli import main

    argv = shlex.split(command)[1:]
    out = io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out):
        code = main(argv)
    if code:
        raise RuntimeError(f"`{command}` exited {code}")
    return out.getvalue()


def regenerate(text: str) -> tuple[str, list[str]]:
    """The document with every block replaced by its command's output, and the commands whose blocks
    changed."""
    changed = []

    def replace(match: re.Match[str]) -> str:
        opening, command, body, closing = match.groups()
        fresh = printed(command)
        if fresh != body:
            changed.append(command)
        return opening + fresh + closing

    return BLOCK.sub(replace, text), changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; fail if a table differs")
    parser.add_argument("--document", type=Path, action="append", help="one page (default: all of them)")
    args = parser.parse_args()
    differs = False
    for document in args.document or DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        fresh, changed = regenerate(text)
        for command in changed:
            print(f"{document.name}: {'differs' if args.check else 'rewritten'}: {command}")
        differs |= bool(changed)
        if not args.check:
            document.write_text(fresh, encoding="utf-8")
    return 1 if args.check and differs else 0


if __name__ == "__main__":
    sys.exit(main())
