"""Argument types shared by the subcommands: each rejects a bad value with
argparse's one-line usage error naming the flag and the value (exit 2)."""

from __future__ import annotations

import argparse
import math


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, factors)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive finite number")
    return x


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds, counts that may be zero)."""
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if x < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
    return x


def positive_int(text: str) -> int:
    """An integer >= 1 (row limits, worker counts)."""
    x = non_negative_int(text)
    if x < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return x
