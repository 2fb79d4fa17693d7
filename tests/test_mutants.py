"""Mutation testing of the invariant suite (SPEC.md 7.7): every mutant of the model
must be caught by each invariant it names; a survivor fails the test.

Run with ``-s`` to see the report: mutant, killing invariant, the shrunk
workload's length in requests and steps, and how many workloads the search
generated before the first catch.
"""

from __future__ import annotations

import os
import pickle

import pytest

from tenantry.model import policies
from tenantry.model import step as step_mod
from tenantry.model.workload import Request, Workload
from tenantry.spec.invariants import INVARIANTS
from tenantry.testing.mutants import MUTANTS
from tenantry.testing.hunt import hunt
from tenantry.testing.shrink import first_failing, shrink

CASES = [(m.name, k) for m in MUTANTS.values() for k in m.killers]
REPORT: dict[tuple[str, str], str] = {}
#: The cases this process ran (under pytest-xdist a worker runs only some of them).
ATTEMPTED: set[tuple[str, str]] = set()


@pytest.mark.parametrize(("mutant", "killer"), CASES)
def test_mutant_is_killed(mutant, killer):
    ATTEMPTED.add((mutant, killer))
    kill = hunt(MUTANTS[mutant], killer)
    assert kill is not None, f"mutant {mutant} survived {killer}"
    assert 1 <= len(kill.workload) <= 20 and kill.steps >= 1
    REPORT[(mutant, killer)] = kill.line()
    print(kill.line())


def test_mutation_report_has_no_survivors():
    """Runs after the kills (file order); lists them, and fails if any case is missing.
    Under pytest-xdist (``-n``) the kills are spread over the workers, so a worker reports
    and checks the cases it ran (each kill is its own test wherever it runs)."""
    ran = CASES if os.environ.get("PYTEST_XDIST_WORKER") is None else [c for c in CASES if c in ATTEMPTED]
    missing = [c for c in ran if c not in REPORT]
    print("\nmutation report:\n" + "\n".join(REPORT[c] for c in CASES if c in REPORT))
    assert not missing, f"not killed (or not run): {missing}"


def test_every_invariant_kills_some_mutant():
    assert {k for _, k in CASES} == set(INVARIANTS)


def test_mutants_are_values_not_patches():
    """A mutant is a Step subclass passed as an argument: nothing global changes, and it pickles by name."""
    before = (dict(vars(step_mod.Step)), dict(policies.ORDER), dict(policies.VICTIM))
    for m in MUTANTS.values():
        assert issubclass(m.variant, step_mod.Step) and m.variant is not step_mod.Step
        assert pickle.loads(pickle.dumps(m)) == m
    assert (dict(vars(step_mod.Step)), dict(policies.ORDER), dict(policies.VICTIM)) == before


def test_shrink_keeps_only_needed_requests_and_their_cancellations():
    wl = Workload(tuple(Request(i, "a", 0.1 * i, 32, 4, cancel_s=0.5 if i == 2 else None) for i in range(6)))
    small = shrink(wl, first_failing(lambda w: {r.request_id for r in w} >= {1, 4}),
                   phases=("requests", "cancellations")).workload
    assert [r.request_id for r in small] == [1, 4] and small.cancellations == ()


#: Every form of every invariant, each with the mutants that name the invariant: one of
#: them must be caught by that form alone (``history``: the record form, the path for a
#: scheduler tenantry did not write; ``step``: the state form after every step).
FORM_CASES = [(i, form) for i, inv in INVARIANTS.items()
              for form, fn in (("step", inv.check_state), ("history", inv.check_history)) if fn is not None]


@pytest.mark.parametrize(("killer", "form"), FORM_CASES)
def test_every_form_alone_kills_a_mutant(killer, form):
    candidates = [m for m in MUTANTS.values() if killer in m.killers]
    kills = [k for m in candidates
             if (k := hunt(m, killer, max_examples=1000, history_only=form == "history",
                           state_only=form == "step")) is not None]
    assert kills, f"the {form} form of {killer} missed every mutant naming it: {[m.name for m in candidates]}"
    print(f"{form} form alone:", kills[0].line())
