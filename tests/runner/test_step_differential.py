"""The fast replica (runner/fast.py) against the readable step (model/step.py): the same
request records byte for byte, and the same clock, events and batch step by step (issues 13, 30).

:func:`~tenantry.runner.simulate.simulate` takes the fast replica for a run that keeps no step
records when it implements the configuration (:func:`~tenantry.runner.fast.unsupported`).  Each
workload here runs twice, once on the fast replica and once through the readable
:func:`~tenantry.model.step.step` with the same driver and recorder, and the two histories'
JSON Lines must be equal: the seed-001 default of ``tenantry simulate`` under its three policies,
the packaged Azure pair excerpt and every adversary pattern's default check-cell scenario on every
setup the fast replica implements, and Hypothesis-drawn configurations and workloads within what
it implements.  Since a request record does not show every step, the two are also stepped side by
side (:func:`_lockstep_fast`).  A broken fast replica is shown caught.

The readable step itself is held to its own bytes from before issue 30 by
``tests/test_step_digests.py``.  By default the seed workload is cut at 120 s and the Azure pair
at 400 rows; ``TENANTRY_DIFFERENTIAL=full`` runs them whole.
"""

from __future__ import annotations

import os

import attrs
import pytest
from hypothesis import given, settings, strategies as st

from tenantry.model.config import Config
from tenantry.model.workload import Workload
from tenantry.runner.history import history_lines
from tenantry.runner.setups import SETUPS, apply_setup, build_config, default_config, seed001_config
from tenantry.runner.simulate import ModelReplica, drive
from tenantry.runner.traces import azure_two_tenant_workload, seed001_workload
from tenantry.testing.strategies import configs, workloads

FULL = os.environ.get("TENANTRY_DIFFERENTIAL") == "full"

#: The one-replica setups (a fleet's replicas run the readable step).
ONE_REPLICA = sorted(n for n, x in SETUPS.items() if x.fleet is None)


def _same_text(fast: str, readable: str, name: str) -> None:
    if fast != readable:
        a, b = fast.splitlines(), readable.splitlines()
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        pytest.fail(f"{name}: histories differ first at line {first} of {len(b)}:\n fast:     "
                    f"{a[first] if first < len(a) else '<end>'}\n readable: {b[first] if first < len(b) else '<end>'}")


def _records_text(config: Config, workload: Workload, horizon_s: float | None, replica_cls=None) -> str:
    """The history a run keeps without step records (what ``tenantry simulate`` keeps without
    ``--history``): :func:`~tenantry.runner.simulate.simulate` through the readable step when
    ``replica_cls`` is None, else on that fast replica class (put in the fast replica's place)."""
    from unittest import mock

    from tenantry.runner import simulate as sim

    if replica_cls is None:
        return "\n".join(history_lines(sim.simulate(config, workload, horizon_s=horizon_s, record_steps=False,
                                                     fast=False)))
    with mock.patch.object(sim, "FastReplica", replica_cls):
        return "\n".join(history_lines(sim.simulate(config, workload, horizon_s=horizon_s, record_steps=False,
                                                     fast=True)))


def assert_fast_same(config: Config, workload: Workload, horizon_s: float | None = None) -> bool:
    """The fast replica records what the readable step records (False when it does not
    implement ``config``: nothing to compare)."""
    from tenantry.runner.fast import FastReplica, unsupported

    if unsupported(config) is not None:
        return False
    _same_text(_records_text(config, workload, horizon_s, FastReplica), _records_text(config, workload, horizon_s),
               "fast replica")
    return True


#: The one-replica setups the fast replica implements (the others fall back to the readable step).
FAST_SETUPS = [n for n in ONE_REPLICA if __import__("tenantry.runner.fast", fromlist=["x"]).unsupported(
    build_config(n, (("a", "adversary"), ("b", "victim"), ("c", "victim")))) is None]


def test_fast_replica_covers_the_simulate_defaults_and_refuses_the_rest():
    from tenantry.runner.fast import FastReplica, unsupported
    from tenantry.runner.simulate import simulate

    assert {"fcfs", "rate_limit", "vtc", "vtc_nolift", "priority", "aging", "hysteresis"} <= set(FAST_SETUPS)
    for name in ("shared_cache", "drr_tokens", "floors", "skip_budget", "protected", "round_robin"):
        cfg = build_config(name, (("a", "adversary"), ("b", "victim")))
        assert unsupported(cfg) is not None, name
        with pytest.raises(ValueError, match="does not implement"):
            FastReplica(cfg)
    with pytest.raises(ValueError, match="no step records"):
        simulate(seed001_config(), Workload(()), record_steps=True, fast=True)


@pytest.mark.parametrize("policy", ["fcfs", "rate_limit", "vtc"])
def test_fast_replica_seed001_default_workload(policy):
    wl = seed001_workload(seed=9)
    horizon = max(3 * wl.duration_s, wl.duration_s + 600.0) if FULL else 120.0
    assert assert_fast_same(apply_setup(seed001_config(wl.tenants), policy), wl, horizon)


@pytest.mark.parametrize("setup", FAST_SETUPS)
def test_fast_replica_azure_pair(setup):
    wl = azure_two_tenant_workload(speedup=5.0, use_shared=False, max_rows=None if FULL else 400)
    assert assert_fast_same(apply_setup(default_config(wl.tenants), setup), wl)


@pytest.mark.parametrize("k", range(16))
def test_fast_replica_check_cell_workloads(k):
    """Each adversary pattern's default scenario on every setup the fast replica implements."""
    from tenantry.adversaries.evaluate import Task, scenario_of
    from tenantry.adversaries.patterns import PATTERNS

    patterns = sorted(PATTERNS)
    if k >= len(patterns):
        pytest.skip(f"{len(patterns)} patterns")
    for setup in FAST_SETUPS:
        sc = scenario_of(Task(setup, patterns[k], (), 0))
        assert assert_fast_same(build_config(setup, sc.roles), sc.workload, sc.horizon_s)


@st.composite
def fast_configs(draw):
    """A drawn configuration (:func:`~tenantry.testing.strategies.configs`) brought into what
    the fast replica implements: its mechanisms outside that set turned off, its order
    policy one of :data:`~tenantry.runner.fast.ORDERS` when it was another."""
    from tenantry.runner.fast import ORDERS, unsupported

    cfg = draw(configs(lanes=False))
    order = attrs.evolve(cfg.order, guard_steps=None, guard_wait_s=None, guard_skips=None)
    if order.policy not in ORDERS:
        order = attrs.evolve(order, policy=draw(st.sampled_from(ORDERS)))
    cfg = attrs.evolve(
        cfg, prefix_cache="off", order=order,
        admission=attrs.evolve(cfg.admission, token_bucket=False, reserve_output=False, tier_slot_caps=()),
        eviction=attrs.evolve(cfg.eviction, preempt_for_priority=False))
    assert unsupported(cfg) is None, unsupported(cfg)
    return cfg


@settings(max_examples=200 if FULL else 40)
@given(data=st.data())
def test_fast_replica_on_hypothesis_workloads(data):
    """Drawn configurations the fast replica implements (caps, cooldowns, eviction limits,
    every victim policy, tiny pools), drawn workloads with cancellations and idle gaps."""
    cfg = data.draw(fast_configs())
    wl = data.draw(workloads(cfg, max_requests=25, big=data.draw(st.booleans()), long_outputs=True,
                             cancels=True, idle_gaps=True))
    assert assert_fast_same(cfg, wl, horizon_s=60.0)


class _LateBlocks(__import__("tenantry.runner.fast", fromlist=["x"]).FastReplica):
    """A broken fast replica: a lazy sequence's next KV block falls due one step late."""

    def _lazify(self, s):
        s.blocks += 1
        try:
            super()._lazify(s)
        finally:
            s.blocks -= 1


def test_the_fast_replica_comparison_catches_a_broken_replica():
    """The comparison is not vacuous: a fast replica that lets a lazy sequence decode past
    its last KV block records other outcomes than the readable step on the seed workload."""
    wl = seed001_workload(seed=9)
    cfg = apply_setup(seed001_config(wl.tenants), "vtc")
    assert _records_text(cfg, wl, 60.0, _LateBlocks) != _records_text(cfg, wl, 60.0)


def _lockstep_fast(config: Config, workload: Workload, horizon_s: float | None) -> int:
    """Step the readable model and the fast replica side by side: after every step the same
    clock, the same events (every field) and the same running request ids in batch order.
    Returns the steps compared."""
    from tenantry.runner.fast import FastReplica
    from tenantry.model.state import running_ids

    fast, model = FastReplica(config), ModelReplica(config)
    n = 0
    for inputs in drive(fast, workload, horizon_s=horizon_s):
        model.idle(fast.last_start_s)
        tr = model.step(inputs)
        n += 1
        k = tr.output.step_index
        assert fast.last.step_index == k
        assert fast.t_s == tr.state.t_s, f"clocks differ after step {k}"
        assert list(fast.last.events) == list(tr.output.events), f"events differ in step {k}"
        assert tuple(s.request_id for s in fast.batch.values()) == running_ids(tr.state), f"batch differs after step {k}"
    assert not model.has_work() or horizon_s is not None
    return n


@pytest.mark.parametrize("policy", ["fcfs", "vtc"])
def test_fast_replica_steps_in_lockstep_with_the_model(policy):
    """Beyond the records: every step's clock, events and batch membership agree (seed-001)."""
    wl = seed001_workload(seed=9)
    assert _lockstep_fast(apply_setup(seed001_config(wl.tenants), policy), wl, 40.0) > 2_000


@settings(max_examples=200 if FULL else 30)
@given(data=st.data())
def test_fast_replica_lockstep_on_hypothesis_workloads(data):
    cfg = data.draw(fast_configs())
    wl = data.draw(workloads(cfg, max_requests=25, big=data.draw(st.booleans()), long_outputs=True,
                             cancels=True, idle_gaps=True))
    _lockstep_fast(cfg, wl, 60.0)
