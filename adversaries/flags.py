"""argparse ``type=`` functions for ``tenantry check`` and ``tenantry verify``.

Each turns a flag's text into its value or raises ``argparse.ArgumentTypeError``
with the reason, so a bad value is one usage line naming the flag and the
value (``tenantry check: error: argument --seed: -1: must be >= 0``), exit 2.
"""

from __future__ import annotations

import argparse
import math

from tenantry.model.config import ConfigError


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an integer") from None


def nonneg_int(text: str) -> int:
    """An integer >= 0 (seeds, shrink evaluations)."""
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return v


def positive_int(text: str) -> int:
    """An integer >= 1 (worker processes)."""
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 1")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text}: must be a positive finite number of seconds")
    return v


def budget(text: str):
    """A positive :class:`~tenantry.adversaries.search.Budget`: ``N``, ``Ns`` or ``N,Ns``."""
    from .search import Budget

    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text}: must be positive (N evaluations, Ns seconds or N,Ns)")
    try:
        b = Budget.parse(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r}: write N (evaluations, N >= 1), Ns (seconds, N > 0) "
                                         "or N,Ns") from None
    if b.evaluations == 0 or b.seconds == 0:
        raise argparse.ArgumentTypeError(f"{text}: must be positive (at least 1 evaluation, more than 0 s)")
    return b
