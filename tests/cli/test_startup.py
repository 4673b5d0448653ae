"""``zerosiam --help`` and a mistyped flag answer at once: the command loads torch and the benchmark only in
the functions that compute, never to build its parser (``benchmarks/cli_startup.py`` times it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PARSE_THEN_LIST_MODULES = """
import sys
import zerosiam.cli
try:
    zerosiam.cli.main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted(name for name in sys.modules if name == "torch" or name.startswith("zerosiam.bench"))
print("loaded:", *heavy)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["bench", "--help"],
        ["bench", "--limitt", "5"],
        ["report", "--help"],
        ["train-source", "--help"],
        ["corrupt", "--help"],
        ["select-lr", "--help"],
        ["llm", "--help"],
        ["assets", "--help"],
        ["nonsense"],
    ],
)
def test_parsing_help_or_a_bad_flag_imports_neither_torch_nor_the_benchmark(argv):
    found = subprocess.run(
        [sys.executable, "-c", PARSE_THEN_LIST_MODULES, *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.stdout.splitlines()[-1] == "loaded:", found.stdout[-2000:] + found.stderr[-2000:]


def test_the_architecture_names_the_parser_offers_are_the_zoos():
    from zerosiam.cli.train_source import ARCHITECTURE_NAMES
    from zerosiam.zoo.architectures import ARCHITECTURES, TEST_ARCHITECTURES

    assert (*ARCHITECTURES, *TEST_ARCHITECTURES) == ARCHITECTURE_NAMES
