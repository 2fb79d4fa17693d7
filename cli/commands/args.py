"""Argument types shared by the subcommands (``type=`` functions for argparse): each rejects a bad value with
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
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if x < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return x


def budget(text: str):
    """A positive :class:`~tenantry.adversaries.search.Budget`: ``N``, ``Ns`` or ``N,Ns``."""
    from tenantry.adversaries.search import Budget
    from tenantry.model.config import ConfigError

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


def executor(text: str) -> str:
    """An executor kind for the searches: ``process``, ``ray`` (a local Ray instance),
    ``ray:ADDRESS`` (an existing cluster), ``dask`` (a local Dask cluster) or
    ``dask:ADDRESS`` (a running Dask scheduler); ``ray`` / ``dask`` only when installed."""
    import importlib.util

    lib = next((k for k in ("ray", "dask") if text == k or (text.startswith(k + ":") and len(text) > len(k) + 1)), None)
    if text != "process" and lib is None:
        raise argparse.ArgumentTypeError(f"{text!r}: write process, ray (a local Ray instance), ray:ADDRESS "
                                         "(an existing cluster, e.g. ray:auto or ray:10.0.0.5:6379), dask (a local "
                                         "Dask cluster) or dask:ADDRESS (a scheduler, e.g. dask:tcp://10.0.0.5:8786)")
    module = {"ray": "ray", "dask": "distributed"}.get(lib)
    if module and importlib.util.find_spec(module) is None:
        raise argparse.ArgumentTypeError(f"{text}: {'Ray' if lib == 'ray' else 'Dask'} is not installed; "
                                         f"pip install 'tenantry[{lib}]'")
    return text


class Names(argparse.Action):
    """A list of names given space- or comma-separated (``--pattern flood sybil``,
    ``--patterns flood,sybil``, or both), in the order given, repeats dropped; use with
    ``nargs="+"``.  The value is the list, or the option's default when it is absent."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        names = [n.strip() for v in values for n in str(v).split(",") if n.strip()]
        if not names:
            parser.error(f"{option_string}: give at least one name")
        setattr(namespace, self.dest, list(dict.fromkeys(names)))
