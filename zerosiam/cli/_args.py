"""Argument types shared by the sub-commands."""

from __future__ import annotations

import argparse


def csv_list(text: str) -> list[str]:
    """A comma-separated list on the command line, blanks dropped; an empty list is a usage error."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def positive_int(text: str) -> int:
    """A whole number above zero (counts, sizes, limits)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A number of zero or more (intervals, where zero turns a thing off)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of zero or more, got {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a number of zero or more, got {text}")
    return value


def int_list(text: str) -> list[int]:
    """A comma-separated list of whole numbers."""
    try:
        return [int(item) for item in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def device_name(text: str) -> str:
    """A device the machine has (``auto``, ``cpu``, ``cuda``, ``cuda:N``), checked when the flags are
    read; kept as text, so that it travels to worker processes as it was given. The CPU is always there:
    ``cpu``, the commands' default, is taken without loading torch, which argparse would otherwise load
    to convert the default on every parse, ``--help`` and bad flags included."""
    if text == "cpu":
        return text
    from zerosiam.bench.device import resolve_device  # lazily: torch only for the commands that compute

    try:
        resolve_device(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text
