"""argparse ``type=`` converters shared by the sub-commands (not a sub-command: the CLI
skips modules whose name starts with ``_``)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An int >= 1, else an argparse error naming the value."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return v
