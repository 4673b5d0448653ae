"""How the command line fails: one line for a bad input, a clean stop on a signal.

A bad flag or value is reported as one line, ``zerosiam: error: …`` naming the value and the choices,
with exit code 2, before any work starts and before anything is written. Ctrl-C (SIGINT) and SIGTERM
stop a command between results, never in the middle of storing one, with exit code 128 + the signal's
number (130, 143), as shells report a process that a signal ended.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

PROGRAM = "zerosiam"


class UsageError(ValueError):
    """A bad input the user can fix; the message names the value and the valid choices."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are the one-line ``zerosiam: error: …`` (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        fail(message)


def fail(message: str) -> NoReturn:
    sys.stderr.write(f"{PROGRAM}: error: {message}\n")
    raise SystemExit(2)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; like ``KeyboardInterrupt``, ``except Exception`` does not catch it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def interruptible() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``Interrupted`` (where the store defers them, after
    the result being stored is safe); the previous handlers come back afterwards."""

    def stop(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def refuse_text_store(db: object) -> None:
    """Stop a command that writes results, before any work, when ``--db`` is a committed text store."""
    from zerosiam.bench.textstore import READ_ONLY, is_text_store

    if is_text_store(db):
        raise UsageError(f"{db} {READ_ONLY}")


def resume_hint(stop: Interrupted, store: Any, specs: Sequence[Any], db: object) -> str:
    """What an interrupted grid leaves behind, and how to go on."""
    stored = sum(store.has(spec.run_id) for spec in specs)
    return (
        f"{PROGRAM}: interrupted by {stop}: {stored} of {len(specs)} run(s) are stored in {db}; "
        "run the same command again to resume (stored runs are skipped)"
    )


def report_failures(failures: Sequence[Any]) -> int:
    """List the runs that failed, one line each, and give the exit code: 1 if any failed, else 0."""
    if not failures:
        return 0
    print(f"{PROGRAM}: {len(failures)} run(s) failed; they are recorded in the store, and running the same "
          "command again retries them:", file=sys.stderr)  # fmt: skip
    for failure in failures:
        label = ", ".join(f"{key}={failure.spec[key]}" for key in _LABEL if key in failure.spec)
        print(f"  {label}: {failure.error}", file=sys.stderr)
    return 1


_LABEL = ("model", "dataset", "corruption", "severity", "protocol", "method", "seed", "hparams")
