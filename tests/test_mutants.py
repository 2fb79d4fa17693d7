"""Mutation testing of the invariant suite (SPEC.md 7.7): every mutant of the model
must be caught by each invariant it names; a survivor fails the test.

Run with ``-s`` to see the report: mutant, killing invariant, the shrunk
workload's length in requests and steps, and how many workloads the search
generated before the first catch.
"""

from __future__ import annotations

import pytest

from tenantry.model import policies
from tenantry.model import step as step_mod
from tenantry.spec.invariants import INVARIANTS
from tenantry.testing.mutants import MUTANTS, applied
from tenantry.testing.hunt import hunt, shrink

CASES = [(m.name, k) for m in MUTANTS.values() for k in m.killers]
REPORT: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize(("mutant", "killer"), CASES)
def test_mutant_is_killed(mutant, killer):
    kill = hunt(MUTANTS[mutant], killer)
    assert kill is not None, f"mutant {mutant} survived {killer}"
    assert 1 <= len(kill.requests) <= 20 and kill.steps >= 1
    REPORT[(mutant, killer)] = kill.line()
    print(kill.line())


def test_mutation_report_has_no_survivors():
    """Runs after the kills (file order); lists them, and fails if any case is missing."""
    missing = [c for c in CASES if c not in REPORT]
    print("\nmutation report:\n" + "\n".join(REPORT[c] for c in CASES if c in REPORT))
    assert not missing, f"not killed (or not run): {missing}"


def test_every_invariant_kills_some_mutant():
    assert {k for _, k in CASES} == set(INVARIANTS)


def test_mutants_restore_the_model():
    before = (dict(vars(step_mod._Step)), dict(policies.ORDER), dict(policies.VICTIM), step_mod.prefix_keys)
    for m in MUTANTS.values():
        with applied(m):
            pass
    after = (dict(vars(step_mod._Step)), dict(policies.ORDER), dict(policies.VICTIM), step_mod.prefix_keys)
    assert after == before


def test_shrink_keeps_only_needed_requests():
    reqs = tuple(range(6))
    wl = (tuple(type("R", (), {"request_id": i})() for i in reqs), ((0.0, 2),))
    small = shrink(wl, lambda w: {r.request_id for r in w[0]} >= {1, 4})
    assert [r.request_id for r in small[0]] == [1, 4] and small[1] == ()


#: (mutant, killer) pairs whose history form alone (no state checks: the path for a
#: scheduler tenantry did not write) catches the mutant in its configuration.
HISTORY_CASES = [
    ("drr_unbounded_carry", "DRR-DEFICIT"), ("aging_strict_priority", "AGING"),
    ("evict_no_cooldown", "EVICT-COOLDOWN"), ("evict_max_off_by_one", "EVICT-BOUNDED"), ("victim_oldest", "VICTIM"),
    ("no_tenant_kv_cap", "KV-CAP"), ("cancel_leaks_blocks", "KV-CONSERVE"),
    ("preempted_left_in_batch", "BATCH-LIMITS"), ("queue_bound_off_by_one", "QUEUE-BOUND"),
]


@pytest.mark.parametrize(("mutant", "killer"), HISTORY_CASES)
def test_history_form_alone_kills(mutant, killer):
    kill = hunt(MUTANTS[mutant], killer, history_only=True)
    assert kill is not None, f"the history form of {killer} missed {mutant}"
    print("history only:", kill.line())
