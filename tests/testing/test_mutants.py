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



def _drawn(mutant, n: int, guard) -> list[str]:
    """The first ``n`` workloads a hunt of ``mutant`` draws (hunt's settings), as reprs."""
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample

    from tenantry.testing.strategies import workloads

    seen: list[str] = []

    def pred(wl) -> bool:
        seen.append(repr(wl))
        return False

    with guard():
        with pytest.raises(NoSuchExample):
            find(workloads(mutant.config, **mutant.shape), pred,
                 settings=settings(max_examples=n, database=None, deadline=None, derandomize=True,
                                   phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    return seen


def test_a_hunt_does_not_depend_on_what_the_process_imported(tmp_path, monkeypatch):
    """Hypothesis draws literal constants from the loaded local modules' source: importing
    a module of odd constants (and building the CLI's parser) between two hunts must not
    change what the second one draws; without :func:`without_local_constants` it does
    (``skip_budget_ignored_block_seconds`` was killed by DRR-DEFICIT in a fresh process
    and survived 1,000 workloads after ``build_parser()``)."""
    import contextlib
    import importlib

    from tenantry.cli.dispatch import build_parser
    from tenantry.testing.strategies import without_local_constants

    mutant = MUTANTS["skip_budget_ignored_block_seconds"]
    guarded, bare = _drawn(mutant, 400, without_local_constants), _drawn(mutant, 400, contextlib.nullcontext)
    (tmp_path / "odd_constants_for_hypothesis.py").write_text(
        "VALUES = [" + ", ".join(str(n) for n in (3, 7, 13, 17, 33, 65, 129, 257, 513, 1025, 2049, 4097, 8191)) + "]\n"
        "FLOATS = [0.013, 0.5, 1.5, 2.25, 3.75, 7.125, 99.5]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("odd_constants_for_hypothesis")
    build_parser()
    assert _drawn(mutant, 400, without_local_constants) == guarded
    assert _drawn(mutant, 400, contextlib.nullcontext) != bare  # the leak the guard closes is real
