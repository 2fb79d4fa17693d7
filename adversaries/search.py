"""Searches for the worst workload of a pattern against a setup.

Every search takes a ``seed`` (and optionally a separate ``scenario_seed`` for
the victims' traffic; all randomness from
``np.random.default_rng(seed)`` or Hypothesis's ``@seed``) and a
:class:`Budget` (evaluations and/or seconds), shows a tqdm progress bar, and
returns a :class:`SearchResult` whose ``best`` is the worst workload found
(largest objective; ties go to the earliest candidate).

Evaluations go through a ``concurrent.futures`` executor in fixed-size
batches (:data:`BATCH`) that do not depend on the number of workers, and the
results are reduced in candidate order, so the same seed and an evaluation
budget give the same result with 1 worker or 32, in a process pool or on a
Ray or Dask executor.  A budget in seconds stops between batches and so is
only reproducible in the number of evaluations it happened to allow.

Searches (:data:`SEARCHES`):

* ``random``: the pattern's defaults, then uniform points of the unit cube.
* ``evolution``: a (mu + lambda) evolutionary search over the unit cube
  (uniform crossover, Gaussian mutation, elitism), numpy only.
* ``hypothesis``: Hypothesis generates parameters and is steered with
  ``hypothesis.target(score)`` (targeted property-based testing: Löscher and
  Sagonas, ISSTA 2017); shrinking is off, the best example seen is kept.
* ``z3``: :mod:`tenantry.adversaries.z3search` (``timed_arrivals`` only).
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

import attrs
import numpy as np
from tqdm import tqdm

from tenantry.model.config import ConfigError
from tenantry.spec.invariants_core import Finding
from tenantry.testing.strategies import without_local_constants

from .evaluate import Evaluation, Task, evaluate_batch
from .patterns import get_pattern
from .space import Space, freeze

#: Candidates evaluated per batch (fixed: independent of the worker count).
BATCH = 8
#: Hypothesis is not thread-safe: one Hypothesis search at a time per process.
_HYPOTHESIS_LOCK = threading.Lock()


class _BudgetSpent(Exception):
    """Raised inside the Hypothesis test to stop it when the budget is spent."""


@attrs.frozen
class Budget:
    """How much a search may spend.

    Attributes:
        evaluations: most evaluations (None: no limit).
        seconds: wall-clock limit, checked between batches (None: no limit).
    """

    evaluations: int | None = None
    seconds: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.evaluations is None and self.seconds is None:
            raise ConfigError("budget", None, "give a number of evaluations, seconds, or both")
        if self.evaluations is not None and (not isinstance(self.evaluations, int) or self.evaluations < 1):
            raise ConfigError("budget", self.evaluations, "evaluations must be an integer >= 1")
        if self.seconds is not None and not self.seconds > 0:
            raise ConfigError("budget", self.seconds, "seconds must be > 0")

    def describe(self) -> str:
        """In words: ``64 evaluations``, ``20 s``, or ``64 evaluations or 20 s, whichever is spent first``."""
        parts = ([f"{self.evaluations} evaluation{'s' if self.evaluations != 1 else ''}"] if self.evaluations else []) + (
            [f"{self.seconds:g} s"] if self.seconds else [])
        return " or ".join(parts) + (", whichever is spent first" if len(parts) > 1 else "")

    @classmethod
    def parse(cls, text: str) -> "Budget":
        """``"40"`` (evaluations), ``"30s"`` (seconds) or ``"40,30s"`` (both).

        Raises:
            ConfigError: on any other text, naming it.
        """
        ev = sec = None
        for part in str(text).replace(" ", "").split(","):
            if re.fullmatch(r"\d+", part):
                ev = int(part)
            elif re.fullmatch(r"\d+(\.\d*)?s", part):
                sec = float(part[:-1])
            else:
                raise ConfigError("--budget", text, "write N (evaluations), Ns (seconds) or N,Ns")
        return cls(ev, sec)

    def split(self, n: int) -> "Budget":
        """This budget shared by ``n`` searches (each gets at least 1 evaluation)."""
        return Budget(None if self.evaluations is None else max(1, self.evaluations // n),
                      None if self.seconds is None else self.seconds / n)


@attrs.frozen
class Candidate:
    """One evaluated point: its index in the search, parameters and evaluation."""

    index: int
    params: Mapping[str, Any]
    evaluation: Evaluation

    @property
    def score(self) -> float:
        return self.evaluation.score


@attrs.frozen
class SearchResult:
    """What a search found.

    Attributes:
        search, setup, pattern, seed: what ran.
        best: the worst workload found (largest score, earliest on ties).
        evaluations: evaluations spent.
        scores: every candidate's score, in candidate order.
        broken: {invariant id: (candidate index, first finding, candidate params)} for
            claimed invariants that broke in any candidate (the finding as data).
        note: why the search did less than asked, or "".
    """

    search: str
    setup: str
    pattern: str
    seed: int
    best: Candidate | None
    evaluations: int
    scores: tuple[float, ...] = ()
    broken: Mapping[str, tuple[int, Finding, Mapping[str, Any]]] = attrs.field(factory=dict)
    note: str = ""


class Runner:
    """Evaluates batches of parameter sets within a budget and keeps the best.

    Not thread-safe; one per search.
    """

    def __init__(self, search: str, setup: str, pattern: str, seed: int, budget: Budget,
                 executor: cf.Executor, progress: bool = True, objective: str | None = None,
                 scenario_seed: int | None = None, victims: str = "excerpt") -> None:
        self.search, self.setup, self.pattern, self.seed = search, setup, pattern, seed
        self.victims = victims
        self.scenario_seed = seed if scenario_seed is None else scenario_seed
        self.budget, self.executor, self.objective = budget, executor, objective
        self.space: Space = get_pattern(pattern).space
        self.candidates: list[Candidate] = []
        self.best: Candidate | None = None
        self.broken: dict[str, tuple[int, Finding, Mapping[str, Any]]] = {}
        self.t0 = time.monotonic()
        name = setup if isinstance(setup, str) else setup.name
        self.bar = tqdm(total=budget.evaluations, desc=f"{search:<10} {name}/{pattern}", disable=not progress,
                        leave=False, dynamic_ncols=True)

    def remaining(self) -> int | None:
        """Evaluations left (None: unlimited); 0 once the time budget is spent, or once the
        system hung (ADAPTER-HANG: every further evaluation would wait out the call timeout)."""
        if "ADAPTER-HANG" in self.broken:
            return 0
        if self.budget.seconds is not None and time.monotonic() - self.t0 >= self.budget.seconds:
            return 0
        if self.budget.evaluations is None:
            return None
        return max(0, self.budget.evaluations - len(self.candidates))

    def evaluate(self, params_list: Sequence[Mapping[str, Any]]) -> list[Candidate]:
        """Evaluate parameter sets (truncated to the budget), in order; returns the new candidates."""
        left = self.remaining()
        if left is not None:
            params_list = list(params_list)[:left]
        if not params_list:
            return []
        full = [self.space.complete(p) for p in params_list]
        tasks = [Task(self.setup, self.pattern, freeze(p), self.scenario_seed, self.objective, victims=self.victims)
                 for p in full]
        out = []
        for p, ev in zip(full, evaluate_batch(self.executor, tasks)):
            c = Candidate(len(self.candidates), p, ev)
            self.candidates.append(c)
            out.append(c)
            if self.best is None or c.score > self.best.score:
                self.best = c
            for f in ev.findings:
                self.broken.setdefault(f.invariant, (c.index, f, p))
        self.bar.update(len(out))
        self.bar.set_postfix_str(f"best={self.best.score:.3g}")
        return out

    def result(self, note: str = "") -> SearchResult:
        self.bar.close()
        if "ADAPTER-HANG" in self.broken:
            note = "; ".join(x for x in (note, "stopped early: the system hung (ADAPTER-HANG)") if x)
        return SearchResult(self.search, self.setup, self.pattern, self.seed, self.best, len(self.candidates),
                            tuple(c.score for c in self.candidates), dict(self.broken), note)


def random_search(setup: str, pattern: str, *, seed: int, budget: Budget, executor: cf.Executor,
                  progress: bool = True, objective: str | None = None, scenario_seed: int | None = None,
                  victims: str = "excerpt", include_default: bool = True) -> SearchResult:
    """Uniform random search: the defaults first, then uniform points, in batches of :data:`BATCH`."""
    r = Runner("random", setup, pattern, seed, budget, executor, progress, objective, scenario_seed, victims)
    rng = np.random.default_rng(seed)
    first = [r.space.defaults()] if include_default else []
    while r.remaining() != 0:
        batch = first + [r.space.sample(rng) for _ in range(BATCH - len(first))]
        first = []
        if not r.evaluate(batch):
            break
    return r.result()


def evolution_search(setup: str, pattern: str, *, seed: int, budget: Budget, executor: cf.Executor,
                     progress: bool = True, objective: str | None = None, scenario_seed: int | None = None,
                     victims: str = "excerpt", mu: int = 4, sigma: float = 0.15) -> SearchResult:
    """A (mu + lambda) evolutionary search on the unit cube, lambda = :data:`BATCH`.

    Generation 0 is the defaults plus uniform points.  Each later generation
    draws BATCH children: two parents from the mu best so far (uniformly),
    uniform crossover, then Gaussian mutation of scale ``sigma`` on every
    coordinate, clipped to [0, 1] (Eiben and Smith, "Introduction to
    Evolutionary Computing", 2nd ed., ch. 4-5).  The mu best of parents and
    children survive (elitism).
    """
    r = Runner("evolution", setup, pattern, seed, budget, executor, progress, objective, scenario_seed, victims)
    rng = np.random.default_rng(seed)
    d = len(r.space)
    points = [r.space.encode(r.space.defaults())] + [rng.random(d) for _ in range(BATCH - 1)]
    pool: list[tuple[float, int, np.ndarray]] = []
    while r.remaining() != 0:
        cands = r.evaluate([r.space.decode(u) for u in points])
        if not cands:
            break
        pool += [(c.score, c.index, r.space.encode(c.params)) for c in cands]
        pool = sorted(pool, key=lambda x: (-x[0], x[1]))[:mu]
        points = []
        for _ in range(BATCH):
            a, b = pool[int(rng.integers(len(pool)))][2], pool[int(rng.integers(len(pool)))][2]
            mask = rng.random(d) < 0.5
            child = np.where(mask, a, b) + rng.normal(0.0, sigma, d)
            points.append(np.clip(child, 0.0, 1.0))
    return r.result()


def hypothesis_search(setup: str, pattern: str, *, seed: int, budget: Budget, executor: cf.Executor,
                      progress: bool = True, objective: str | None = None,
                      scenario_seed: int | None = None, victims: str = "excerpt") -> SearchResult:
    """Hypothesis-driven search: ``@given`` parameters, ``target(score)``, no shrinking.

    Each example is evaluated through ``executor`` (one at a time: Hypothesis
    decides the next example from the last score).  Hypothesis may stop
    before the budget when it has explored its space; the result says so.
    """
    from hypothesis import HealthCheck, Phase, given, settings, target
    from hypothesis import seed as hyp_seed
    from hypothesis import strategies as st

    r = Runner("hypothesis", setup, pattern, seed, budget, executor, progress, objective, scenario_seed, victims)

    def strat(p):
        if p.integer:
            return st.integers(int(p.low), int(p.high))
        if p.log:
            return st.floats(float(np.log(p.low)), float(np.log(p.high))).map(lambda x, p=p: p.clamp(float(np.exp(x))))
        return st.floats(p.low, p.high)

    params = st.fixed_dictionaries({p.name: strat(p) for p in r.space.params})
    n = budget.evaluations if budget.evaluations is not None else 10_000

    @hyp_seed(seed)
    @settings(max_examples=n, database=None, deadline=None, derandomize=False, phases=[Phase.generate, Phase.target],
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False)
    @given(params)
    def probe(p):
        if r.remaining() == 0:
            raise _BudgetSpent  # ends the run now instead of generating the remaining examples
        got = r.evaluate([p])
        if got:
            target(got[0].score, label="objective")

    with _HYPOTHESIS_LOCK, without_local_constants():
        try:
            probe()
        except _BudgetSpent:
            pass
    note = "" if budget.evaluations is None or len(r.candidates) >= budget.evaluations or r.remaining() == 0 \
        else f"hypothesis stopped after {len(r.candidates)} examples"
    return r.result(note)


def _z3(setup: str, pattern: str, *, seed: int, budget: Budget, executor: cf.Executor,
        progress: bool = True, objective: str | None = None, scenario_seed: int | None = None,
        victims: str = "excerpt") -> SearchResult:
    from .z3search import z3_search  # here, not at the top: z3 is imported only by a Z3 search

    return z3_search(Runner("z3", setup, pattern, seed, budget, executor, progress, objective, scenario_seed, victims))


#: Search name -> function(setup, pattern, *, seed, budget, executor, progress, objective, scenario_seed,
#: victims) -> SearchResult.  ``seed`` drives the search; ``scenario_seed`` (default: seed) and ``victims``
#: (trace source) the victims' traffic.
SEARCHES: dict[str, Callable[..., SearchResult]] = {
    "random": random_search,
    "evolution": evolution_search,
    "hypothesis": hypothesis_search,
    "z3": _z3,
}


@contextmanager
def private_hypothesis_home() -> Iterator[None]:
    """Point Hypothesis's storage folder at a temporary folder for the block (removed after).

    Hypothesis keeps caches in ``./.hypothesis`` by default; a ``tenantry`` run
    writes nothing in the user's folder but its report.
    """
    import shutil
    import tempfile

    from hypothesis import configuration

    old = configuration.storage_directory(intent_to_write=False).home_directory
    tmp = tempfile.mkdtemp(prefix="tenantry-hypothesis-")
    configuration.set_hypothesis_home_dir(tmp)
    try:
        yield
    finally:
        configuration.set_hypothesis_home_dir(old)
        shutil.rmtree(tmp, ignore_errors=True)


def run_search(name: str, setup: str, pattern: str, *, seed: int, budget: Budget, executor: cf.Executor,
               progress: bool = True, objective: str | None = None, scenario_seed: int | None = None,
               victims: str = "excerpt") -> SearchResult:
    """Run the search called ``name``; ``seed`` drives the search, ``scenario_seed``
    (default: ``seed``) the victims' traffic.

    Raises:
        ConfigError: on an unknown search name.
    """
    fn = SEARCHES.get(name)
    if fn is None:
        raise ConfigError("search", name, f"unknown search; choose from {', '.join(SEARCHES)}")
    return fn(setup, pattern, seed=seed, budget=budget, executor=executor, progress=progress, objective=objective,
              scenario_seed=scenario_seed, victims=victims)
