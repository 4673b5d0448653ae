"""How long the ``zerosiam`` command takes to answer before it does any work.

``zerosiam --help``, ``zerosiam bench --help`` and a bad flag should answer at once: a user who mistypes a
flag, or a script that asks for the usage, should not wait for torch to load. Each command runs in a fresh
``python -m zerosiam.cli`` subprocess (so nothing is cached in the process); the table gives the median
wall time of ``--repeats`` runs, beside a bare ``python -c pass`` for the interpreter's own start-up. A
busy machine slows every row alike: compare rows of one table, not tables of two machines.

    python benchmarks/cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "python -c pass (the interpreter alone)": ["-c", "pass"],
    "zerosiam --help": ["-m", "zerosiam.cli", "--help"],
    "zerosiam bench --help": ["-m", "zerosiam.cli", "bench", "--help"],
    "zerosiam bench --limitt 5 (a bad flag)": ["-m", "zerosiam.cli", "bench", "--limitt", "5"],
}


def seconds_to_answer(arguments: list[str]) -> float:
    """Wall time of one fresh interpreter running ``arguments``, until it exits."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    subprocess.run([sys.executable, *arguments], cwd=ROOT, env=environment, capture_output=True, check=False)
    return time.perf_counter() - start


def median_seconds(arguments: list[str], repeats: int) -> float:
    return statistics.median(seconds_to_answer(arguments) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command; the median is shown")
    args = parser.parse_args()
    print(f"| command | median of {args.repeats} (s) |\n|---|---:|")
    for label, arguments in COMMANDS.items():
        print(f"| {label} | {median_seconds(arguments, args.repeats):.2f} |")


if __name__ == "__main__":
    main()
