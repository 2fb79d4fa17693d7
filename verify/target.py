"""The target of ``tenantry verify --target MODULE:FACTORY``: importing it, and checking that
what its factory makes is an adapter (SPEC.md 9).

A target that does not import, or a factory whose product is not an adapter of
the protocol (:mod:`tenantry.verify.protocol`), is the user's mistake: one line
(a :class:`~tenantry.model.config.ConfigError`) before any work, never a finding.
"""

from __future__ import annotations

import importlib
from typing import Any

from tenantry.model.config import ConfigError

from .calls import AdapterExit, exits_refused
from .protocol import Claims


#: The methods every adapter has (besides its ``claims`` attribute).
METHODS = ("add_request", "abort_request", "plan_step", "take_results")


def _what(obj: Any) -> str:
    """``obj`` in a few words for a usage error: ``None``, ``the class X``, ``an int (5)``."""
    if obj is None:
        return "None"
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    name = type(obj).__name__
    text = repr(obj) if isinstance(obj, (int, float, str, bytes, tuple, list, dict)) else ""
    return f"{'an' if name[:1] in 'aeiouAEIOU' else 'a'} {name}" + (f" ({text[:60]})" if text else "")


def adapter_problem(obj: Any) -> tuple[str | None, Claims | None]:
    """Whether a factory's product is an adapter: (None, its claims), or (why not, None) in one
    sentence: None, a class instead of an instance, a method of :data:`METHODS` missing, no
    ``claims`` or claims that are not a :class:`Claims`.  Reads ``obj``'s attributes (which may run
    its code: the harness calls it through the :class:`~tenantry.verify.calls.Caller`)."""
    need = "an adapter has the methods add_request, abort_request, plan_step, take_results and a claims " \
           "attribute, a tenantry.verify.protocol.Claims (SPEC.md 9)"
    if obj is None or isinstance(obj, type):
        hint = f"; return an instance, {obj.__name__}(...)" if isinstance(obj, type) else ""
        return f"the factory returned {_what(obj)}, not an adapter{hint} ({need})", None
    missing = [m for m in METHODS if not callable(getattr(obj, m, None))]
    if missing:
        return (f"the factory returned {_what(obj)}, which has no {', '.join(missing)} method"
                f"{'s' if len(missing) > 1 else ''} ({need})"), None
    try:
        claims = obj.claims
    except AttributeError as e:
        return f"the factory returned {_what(obj)}, which has no claims ({e}; {need})", None
    if not isinstance(claims, Claims):
        return (f"the factory returned {_what(obj)}, whose claims is {_what(claims)}, not a "
                f"tenantry.verify.protocol.Claims ({need})"), None
    return None, claims


def _import_error(mod_name: str, e: BaseException) -> str:
    """Why ``mod_name`` did not import, in one line: the file and line of a syntax error, or the
    exception's type, message and the line that raised it."""
    if isinstance(e, SyntaxError):
        return f"cannot import {mod_name}: {type(e).__name__} at {e.filename}:{e.lineno}: {e.msg}"
    if isinstance(e, ImportError):
        return f"cannot import {mod_name} ({e})"
    import traceback

    tb = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
    at = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    what = f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}"
    return f"cannot import {mod_name}: importing it {what}{at}"


def load_factory(spec: str, path: str | None = None) -> Any:
    """Import ``module:attribute`` (attribute may be dotted) and return it.

    The module is looked up, before ``sys.path``, in ``path`` (default: the
    current folder), as ``python -m pytest`` does: ``tenantry verify --target
    mypkg.sched:make`` works from the folder holding ``mypkg`` without
    ``PYTHONPATH=.``.

    Raises:
        ConfigError: naming the spec if it lacks a colon, the module does not
            import (not found, a syntax error: its file and line, or an exception
            or ``sys.exit`` while it imports: the type, message and line), or the
            attribute is missing or not callable; naming ``path`` when it is not a
            folder.
    """
    import os
    import sys

    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError("target", spec, "must be module:factory, e.g. mypkg.sched:make_scheduler")
    folder = os.path.abspath(path if path is not None else os.getcwd())
    if not os.path.isdir(folder):
        raise ConfigError("--target-path", path, "is not a folder")
    if folder not in (os.path.abspath(p or os.getcwd()) for p in sys.path):
        sys.path.insert(0, folder)
    mod_name, attr = spec.split(":")
    with exits_refused() as exits:
        try:
            obj: Any = importlib.import_module(mod_name)
        except (Exception, SystemExit, AdapterExit) as e:  # the user's module: whatever it raises is one line
            why = f"cannot import {mod_name}: importing it called {exits[0][0]} at {exits[0][1]}" if exits \
                else _import_error(mod_name, e)
            raise ConfigError("target", spec, why) from None
    if exits:  # the module caught the AdapterExit of its own os._exit
        raise ConfigError("target", spec, f"cannot import {mod_name}: importing it called {exits[0][0]} at "
                          f"{exits[0][1]}")
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError("target", spec, f"{mod_name} has no attribute {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError("target", spec, "is not callable; name a factory that returns an adapter")
    return obj


__all__ = ["METHODS", "adapter_problem", "load_factory"]
