"""The machinery shared by every proof family (SPEC.md section 8).

A :class:`Proof` is a claim with an id, a one-line statement and a scope, whose
``obligations()`` are Z3 formulas that must each be *unsatisfiable* (each is
"hypotheses and not goal": initiation, or consecution for one transition of
the model).  Each proof carries :class:`Twin` s: the same encoding with one
mechanism removed (or, for ``kind="limit"``, one hypothesis dropped), whose
formula must be *satisfiable*; the model Z3 returns is decoded into a concrete
configuration and run on the Python model, and the Python invariant check must
fail there too.

Verdicts are three-valued (Porcupine, Elle): ``proved`` / ``refuted`` /
``unknown`` with a reason (``timeout``, ``solver: ...``).  An
:class:`Outcome` is data first (id, kind, verdict, seconds, what replayed) and
renders to a table row second.

Per-tenant state is encoded as Z3 arrays over an integer index domain
(:class:`Domain`): with a symbolic size the quantifiers range over any number
of tenants (the proofs), with a concrete size they expand to conjunctions (the
encoding-versus-model tests and some counterexample searches).
"""

from __future__ import annotations

import itertools
import time
from fractions import Fraction
from typing import Any, Callable, Iterable

import attrs
import z3

# Z3's own SIGINT handler (on by default) turns a Ctrl-C during a query into an ``unknown:
# interrupted from keyboard`` answer, which a run then counted as a failed proof and went on
# (a fresh user's Ctrl-C during check's proofs was lost 4 times in 5).  Off, the signal
# reaches tenantry's handler when the query returns, within its attempt time (ATTEMPT_MS).
z3.set_param("ctrl_c", False)

#: Per-query solver timeout (milliseconds); a query that runs out is ``unknown``.
TIMEOUT_MS = 30_000

PROVED, REFUTED, UNKNOWN = "proved", "refuted", "unknown"


class Domain:
    """An index set 0..size-1 (tenants, sequences, tiers) for Z3 arrays.

    Args:
        name: name of the size constant.
        n: a concrete size, or None for a symbolic size (any number).
    """

    def __init__(self, name: str, n: int | None = None) -> None:
        self.name, self.n = name, n
        self.size = z3.Int(name) if n is None else z3.IntVal(n)
        self._fresh = itertools.count()

    @property
    def symbolic(self) -> bool:
        return self.n is None

    def has(self, i: Any) -> z3.BoolRef:
        """``0 <= i < size``."""
        return z3.And(i >= 0, i < self.size)

    def indices(self) -> range:
        """The concrete indices (only for a concrete domain)."""
        if self.n is None:
            raise ValueError(f"domain {self.name} is symbolic; it has no concrete indices")
        return range(self.n)

    def forall(self, body: Callable[..., z3.BoolRef], arity: int = 1) -> z3.BoolRef:
        """``forall i1..ik in the domain: body(i1..ik)`` (expanded when concrete)."""
        if self.n is None:
            k = next(self._fresh)
            vs = [z3.Int(f"{self.name.lower()}{k}_{a}") for a in range(arity)]
            return z3.ForAll(vs, z3.Implies(z3.And(*[self.has(v) for v in vs]), body(*vs)))
        return z3.And(True, *[body(*map(z3.IntVal, t)) for t in itertools.product(range(self.n), repeat=arity)])

    def exists(self, body: Callable[..., z3.BoolRef], arity: int = 1) -> z3.BoolRef:
        """``exists i1..ik in the domain: body(i1..ik)`` (expanded when concrete)."""
        if self.n is None:
            k = next(self._fresh)
            vs = [z3.Int(f"{self.name.lower()}{k}_{a}") for a in range(arity)]
            return z3.Exists(vs, z3.And(*[self.has(v) for v in vs], body(*vs)))
        return z3.Or(False, *[body(*map(z3.IntVal, t)) for t in itertools.product(range(self.n), repeat=arity)])


def real_array(name: str) -> z3.ArrayRef:
    return z3.Array(name, z3.IntSort(), z3.RealSort())


def int_array(name: str) -> z3.ArrayRef:
    return z3.Array(name, z3.IntSort(), z3.IntSort())


def bool_array(name: str) -> z3.ArrayRef:
    return z3.Array(name, z3.IntSort(), z3.BoolSort())


def zmax(a: Any, b: Any) -> z3.ExprRef:
    return z3.If(a >= b, a, b)


def zmin(a: Any, b: Any) -> z3.ExprRef:
    return z3.If(a <= b, a, b)


def val(model: z3.ModelRef, term: Any) -> Any:
    """The value of ``term`` in ``model`` as a Python bool, int or Fraction."""
    v = model.eval(term, model_completion=True)
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_rational_value(v):
        return Fraction(v.numerator_as_long(), v.denominator_as_long())
    if z3.is_algebraic_value(v):
        return Fraction(v.approx(20).as_fraction())
    raise ValueError(f"cannot read a value for {term}: {v}")


def num(x: Any) -> z3.ExprRef:
    """A Z3 real literal from a Python int, float or Fraction (floats exactly)."""
    if isinstance(x, bool):
        raise TypeError("a bool is not a number")
    return z3.RealVal(Fraction(x))


# --- records -------------------------------------------------------------------------


@attrs.frozen
class Check:
    """Result of one solver query.

    Attributes:
        status: ``unsat``, ``sat`` or ``unknown``.
        seconds: wall time of the query.
        model: the model when ``sat``.
        reason: the solver's reason when ``unknown``.
    """

    status: str
    seconds: float
    model: Any = None
    reason: str = ""


#: Per-attempt budget of :func:`solve` (milliseconds): Z3's time on these queries
#: is heavy-tailed in its random seed and in the history of the process's Z3
#: context (one query took 0.04 s or over 30 s depending on both), so a query
#: is retried with fresh seeds rather than waited on.
ATTEMPT_MS = 3000


#: Seeds :func:`solve` tries when Z3 answers ``unknown`` for incomplete quantifier
#: instantiation (a seed-dependent answer on the quantified twins), before giving up.
INCOMPLETE_RETRIES = 8


def solve(formula: z3.BoolRef, timeout_ms: int = TIMEOUT_MS) -> Check:
    """Check ``formula`` for satisfiability within ``timeout_ms`` in all.

    Runs attempts of at most :data:`ATTEMPT_MS` (and at most a quarter of
    ``timeout_ms``, at least 0.2 s) with solver-local random seeds
    0, 1, 2, ... (pinned per solver, so global Z3 parameters set elsewhere in
    the process do not matter) until one answers sat or unsat or the time is
    spent (at most :data:`INCOMPLETE_RETRIES` further seeds after an "incomplete
    quantifiers" answer); ``unknown`` only if none answered.
    """
    t0 = time.perf_counter()
    seed, reason = 0, "timeout"
    while True:
        left_ms = timeout_ms - int((time.perf_counter() - t0) * 1000)
        if left_ms <= 0:
            break
        s = z3.Solver()
        s.set("timeout", min(ATTEMPT_MS, max(200, timeout_ms // 4), left_ms))
        s.set("smt.random_seed", seed)
        s.add(formula)
        r = s.check()
        if r == z3.unsat:
            return Check("unsat", time.perf_counter() - t0)
        if r == z3.sat:
            return Check("sat", time.perf_counter() - t0, s.model())
        why = s.reason_unknown()
        if "interrupted" in why:  # a Ctrl-C that Z3 caught after all: it stops the run, it is no answer
            raise KeyboardInterrupt
        reason = "timeout" if "timeout" in why or "canceled" in why else f"solver: {why}"
        # "incomplete quantifiers" also depends on the seed (and on the process's Z3 history: a
        # DRR twin got it only after the skip-budget proof ran first); other reasons are final
        if reason != "timeout" and ("incomplete" not in why or seed >= INCOMPLETE_RETRIES):
            break
        seed += 1
    return Check("unknown", time.perf_counter() - t0, reason=reason)


@attrs.frozen
class Replay:
    """What happened when a counterexample was run on the Python model.

    Attributes:
        replayed: the Python check failed on the concrete run, as it must.
        detail: one line: the configuration used and what the check reported
            (or why it did not fail).
        facts: the decoded numbers (for ``--json``).
    """

    replayed: bool
    detail: str
    facts: dict = attrs.field(factory=dict)


@attrs.frozen
class Twin:
    """The encoding with one mechanism removed; Z3 must find a model.

    Attributes:
        name: short name (``no-lift``).
        removed: the mechanism removed, as configuration where it is one
            (``OrderConfig(lift=False)``).
        formula: builds ``(formula, symbols)``; the formula must be satisfiable
            and ``symbols`` are the terms the decoder reads.
        replay: ``replay(model, symbols) -> Replay``: decode, run, check.
        kind: ``twin`` (mechanism removed) or ``limit`` (a hypothesis of the
            proof dropped: shows that the model needs it).
        scope: what the counterexample is: ``one transition`` of the encoding
            from a state satisfying the invariant, or a bounded run from the
            initial state (``run of k``).
    """

    name: str
    removed: str
    formula: Callable[[], tuple[z3.BoolRef, dict]]
    replay: Callable[[z3.ModelRef, dict], Replay]
    kind: str = "twin"
    scope: str = "one transition"


@attrs.frozen
class Proof:
    """A claim proved by Z3.

    Attributes:
        id: invariant id (SPEC.md 7 / 8), e.g. ``VTC-GAP``.
        family: proof module (``vtc``, ``drr``, ...).
        claim: the statement in one line.
        scope: ``any N`` (quantified over any number of tenants / sequences /
            keys) or ``bound k=...``.
        obligations: ``() -> [(name, formula)]``; every formula must be unsat.
        twins: refuted twins and limits.
        hypotheses: the assumptions, one line each (SPEC.md 8 lists them).
    """

    id: str
    family: str
    claim: str
    scope: str
    obligations: Callable[[], list[tuple[str, z3.BoolRef]]]
    twins: tuple[Twin, ...] = ()
    hypotheses: tuple[str, ...] = ()


@attrs.frozen
class Outcome:
    """One row of ``tenantry prove``.

    Attributes:
        id: the proof id, or ``<proof id>~<twin name>``.
        kind: ``proof``, ``twin`` or ``limit``.
        claim, scope: as in the proof (for twins: what was removed).
        verdict: ``proved``, ``refuted`` or ``unknown``.
        expected: ``proved`` for proofs, ``refuted`` for twins and limits.
        seconds: solver plus replay time.
        reason: why ``unknown``, or which obligation was satisfiable.
        replay: for twins: the replay's one-line report.
        replayed: for twins: whether the Python check failed on the replay.
        facts: decoded counterexample numbers.
    """

    id: str
    kind: str
    claim: str
    scope: str
    verdict: str
    expected: str
    seconds: float
    reason: str = ""
    replay: str = ""
    replayed: bool | None = None
    facts: dict = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        """Proved as claimed, or refuted as required and replayed on the model."""
        if self.kind == "proof":
            return self.verdict == PROVED
        return self.verdict == REFUTED and bool(self.replayed)

    def as_dict(self) -> dict:
        d = attrs.asdict(self)
        d["ok"] = self.ok
        d["facts"] = {k: _jsonable(v) for k, v in self.facts.items()}
        return d


def _jsonable(v: Any) -> Any:
    if isinstance(v, Fraction):
        return float(v) if v.denominator != 1 else int(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


def run_proof(p: Proof, timeout_ms: int = TIMEOUT_MS) -> Outcome:
    """Discharge every obligation of ``p``: proved iff all are unsat."""
    total = 0.0
    for name, f in p.obligations():
        c = solve(f, timeout_ms)
        total += c.seconds
        if c.status == "sat":
            return Outcome(p.id, "proof", p.claim, p.scope, REFUTED, PROVED, total,
                           reason=f"obligation '{name}' has a counterexample")
        if c.status == "unknown":
            return Outcome(p.id, "proof", p.claim, p.scope, UNKNOWN, PROVED, total,
                           reason=f"obligation '{name}': {c.reason}")
    return Outcome(p.id, "proof", p.claim, p.scope, PROVED, PROVED, total)


def run_twin(p: Proof, tw: Twin, timeout_ms: int = TIMEOUT_MS) -> Outcome:
    """Ask Z3 for a model of the twin and replay it on the Python model."""
    tid = f"{p.id}~{tw.name}"
    claim = ("limit: " if tw.kind == "limit" else "") + f"without {tw.removed}"
    formula, symbols = tw.formula()
    c = solve(formula, timeout_ms)
    if c.status != "sat":
        verdict = PROVED if c.status == "unsat" else UNKNOWN
        why = "Z3 found no counterexample: the mechanism is not needed" if c.status == "unsat" else c.reason
        return Outcome(tid, tw.kind, claim, tw.scope, verdict, REFUTED, c.seconds, reason=why, replayed=False)
    t0 = time.perf_counter()
    try:
        rp = tw.replay(c.model, symbols)
    except Exception as e:  # a decoder that crashes is a failed twin, reported, not a crash of the command
        rp = Replay(False, f"replay raised {type(e).__name__}: {e}")
    dt = c.seconds + time.perf_counter() - t0
    return Outcome(tid, tw.kind, claim, tw.scope, REFUTED, REFUTED, dt, replay=rp.detail, replayed=rp.replayed,
                   facts=rp.facts)


def run_all(proofs: Iterable[Proof], twins: bool = True, timeout_ms: int = TIMEOUT_MS) -> list[Outcome]:
    """Every proof, each followed by its twins (in declaration order)."""
    out = []
    for p in proofs:
        out.append(run_proof(p, timeout_ms))
        if twins:
            out.extend(run_twin(p, tw, timeout_ms) for tw in p.twins)
    return out


def implies_all(hyps: Iterable[z3.BoolRef], goal: z3.BoolRef) -> z3.BoolRef:
    """The obligation formula ``hyps and not goal`` (must be unsat)."""
    return z3.And(*hyps, z3.Not(goal))
