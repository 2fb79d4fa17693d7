"""Stateful runs of the reference model (SPEC.md 7): Hypothesis drives tenants that
submit requests of every size (tiny to larger than the pool), flood, cancel, advance
steps and go idle, for every policy family; every applicable invariant's state form
is checked after every step and its history form at the end
(:class:`tenantry.testing.stateful.ModelMachine`).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from tenantry.testing.stateful import model_machine
from tenantry.testing.strategies import configs


def _family(policy: str):
    case = model_machine(configs(policy), name=f"Machine_{policy}").TestCase
    # Half the profile's examples per family (20 by default, 1000 under ``deep``), at most 40 rules each.
    case.settings = settings(case.settings, max_examples=max(10, settings.default.max_examples // 2),
                             stateful_step_count=40)
    return case


TestFCFS = _family("fcfs")
TestRoundRobin = _family("round_robin")
TestVTC = _family("vtc")
TestVTCPredict = _family("vtc_predict")
TestDRRTokens = _family("drr_tokens")
TestDRRBlockSeconds = _family("drr_block_seconds")
TestPriority = _family("priority")
TestAging = _family("aging")
TestFloors = _family("floors")


def test_a_mutant_fails_the_machine_with_a_replayable_workload():
    """The machine is not vacuous: the leaking-cancel mutant is caught, and the failure carries the inputs."""
    from hypothesis import HealthCheck, Phase
    from hypothesis.stateful import run_state_machine_as_test

    from tenantry.spec.invariants_run import run_checked
    from tenantry.testing.mutants import MUTANTS
    from tenantry.testing.stateful import StatefulFinding

    m = MUTANTS["cancel_leaks_blocks"]
    machine = model_machine(m.config, variant=m.variant, name="LeakyCancel")
    try:
        run_state_machine_as_test(machine, settings=settings(max_examples=200, database=None, derandomize=True,
                                                             phases=(Phase.generate,), deadline=None,
                                                             suppress_health_check=list(HealthCheck)))
    except StatefulFinding as e:
        assert e.findings[0].invariant == "KV-CONSERVE"
        assert e.workload.cancellations, "the leak needs a cancellation, and the workload carries it"
        again = run_checked(m.config, e.workload, variant=m.variant, ids=("KV-CONSERVE",))
        assert again.findings and again.findings[0].invariant == "KV-CONSERVE"
    else:
        raise AssertionError("the stateful machine missed the cancel_leaks_blocks mutant")


def _fleet_case():
    from tenantry.testing.stateful import fleet_machine
    from tenantry.testing.strategies import fleets
    case = fleet_machine(fleets(), name="Machine_fleet").TestCase
    case.settings = settings(case.settings, max_examples=max(10, settings.default.max_examples // 2),
                             stateful_step_count=40)
    return case


TestFleet = _fleet_case()


@pytest.mark.parametrize("name", ["route_loses", "affinity_unbounded", "counters_unread", "fleet_no_lift"])
def test_every_fleet_mutant_fails_the_machine(name):
    """The fleet rules are not vacuous: each fleet mutant (``FLEET_MUTANTS``) on its fleet is caught by one of its
    killers (a state form after a fleet step, or the fleet history at the end: ``fleet_no_lift``'s banked credit),
    and the failure carries a workload that replays it on the mutant and not on the model."""
    from hypothesis import HealthCheck, Phase
    from hypothesis.stateful import run_state_machine_as_test

    from tenantry.runner.fleet import simulate_fleet
    from tenantry.spec.invariants_fleet import check_fleet_history
    from tenantry.testing.mutants import FLEET_MUTANTS
    from tenantry.testing.stateful import StatefulFinding, fleet_machine

    m = FLEET_MUTANTS[name]
    machine = fleet_machine(m.fleet(), variant=m.variant, name=name)
    try:
        run_state_machine_as_test(machine, settings=settings(max_examples=200, database=None, derandomize=True,
                                                             phases=(Phase.generate,), deadline=None,
                                                             suppress_health_check=list(HealthCheck)))
    except StatefulFinding as e:
        assert e.findings[0].invariant in m.killers, e
        again = check_fleet_history(simulate_fleet(m.fleet(), e.workload, variant=m.variant), m.killers)
        assert again and again[0].invariant in m.killers
        assert not check_fleet_history(simulate_fleet(m.fleet(), e.workload), m.killers)
    else:
        raise AssertionError(f"the stateful machine missed the {name} fleet mutant")
