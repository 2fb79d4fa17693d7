"""Evaluating the encodings on concrete values, to check them against the model
(SPEC.md 8.1: the encoding-versus-model test).

A transition of an encoding is ``(guard, post)`` over a pre-state and some
parameter symbols.  With the pre-state given as concrete Z3 terms
(:func:`arr`), :func:`apply` binds the parameters the model's run fixes,
checks that the guard admits the model's transition, and returns the
post-state values the encoding computes, checking that they are the only
ones it allows.  The tests compare them with what the model did.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Iterable, Mapping

import z3

from tenantry.spec.invariants_core import owed  # noqa: F401  (the VTC ghost G, re-exported for the encodings' tests)

from .core import val


def arr(values: Iterable[Any], sort: str = "real") -> z3.ArrayRef:
    """A concrete Z3 array over 0..n-1 (reals, ints or bools); beyond n it reads a default."""
    vals = list(values)
    if sort == "bool":
        a = z3.K(z3.IntSort(), z3.BoolVal(False))
        mk = z3.BoolVal
    elif sort == "int":
        a = z3.K(z3.IntSort(), z3.IntVal(0))
        mk = z3.IntVal
    else:
        a = z3.K(z3.IntSort(), z3.RealVal(0))
        mk = lambda v: z3.RealVal(Fraction(v))  # noqa: E731
    for i, v in enumerate(vals):
        a = z3.Store(a, i, mk(v))
    return a


def holds(formula: z3.BoolRef) -> bool:
    """Truth of a closed formula over concrete values (decided by the solver)."""
    s = z3.Solver()
    s.add(z3.Not(formula))
    r = s.check()
    if r == z3.unknown:
        raise RuntimeError(f"solver could not decide a concrete formula: {s.reason_unknown()}")
    return r == z3.unsat


def apply(guard: z3.BoolRef, binds: Iterable[z3.BoolRef], post: Mapping[str, Any]) -> dict[str, Any] | None:
    """Values of the ``post`` terms under ``guard`` and ``binds``; None if the guard
    rejects the bound transition.

    Raises:
        AssertionError: if the encoding allows two different values for a post term
            (it must be a function of the pre-state and the bound parameters).
    """
    s = z3.Solver()
    s.add(guard, *binds)
    if s.check() != z3.sat:
        return None
    m = s.model()
    out = {name: val(m, t) for name, t in post.items()}
    for name, t in post.items():
        v = out[name]
        lit = z3.BoolVal(v) if isinstance(v, bool) else (z3.IntVal(v) if isinstance(v, int) and t.sort() == z3.IntSort()
                                                          else z3.RealVal(Fraction(v)))
        s.push()
        s.add(t != lit)
        if s.check() == z3.sat:
            raise AssertionError(f"the encoding allows two values for {name}: {v} and {val(s.model(), t)}")
        s.pop()
    return out


def exact(x: float) -> Fraction:
    """A float as the exact rational it is."""
    return Fraction(x)
