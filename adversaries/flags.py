"""argparse ``type=`` functions for ``tenantry check`` and ``tenantry verify``.

Each turns a flag's text into its value or raises ``argparse.ArgumentTypeError``
with the reason, so a bad value is one usage line naming the flag and the
value (``tenantry check: error: argument --seed: -1: must be >= 0``), exit 2.
"""

from __future__ import annotations

import argparse

from tenantry.args import non_negative_int as nonneg_int, positive_float, positive_int  # noqa: F401 (re-exported)
from tenantry.model.config import ConfigError


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
