"""Argument types shared by the sub-commands."""

from __future__ import annotations

import argparse


def csv_list(text: str) -> list[str]:
    """A comma-separated list on the command line, blanks dropped; an empty list is a usage error."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items
