"""The fleet (SPEC.md 5.3, 6.2, 7.9): routers, lockstep, fleet accounting, fleet
histories judged offline, the fleet invariants and the mutants they must catch."""

from __future__ import annotations

import collections

import attrs
import pytest
from hypothesis import given, settings, strategies as st

from tenantry.model.config import ConfigError
from tenantry.model.routers import (
    ROUTERS, FleetConfig, RouteView, load_bound, route_least_kv, route_least_outstanding, route_prefix_affinity, route_round_robin, route_tenant_affinity,
)
from tenantry.model.workload import Request
from tenantry.runner.fleet import simulate_fleet
from tenantry.runner.history import history_lines, read_history, write_history
from tenantry.runner.setups import build_config
from tenantry.runner.simulate import simulate
from tenantry.spec.invariants_fleet import (
    FLEET_INVARIANTS, check_fleet_history, fleet_parts, fleet_service_counters, spread_findings,
)
from tenantry.testing.mutants import FLEET_MUTANTS, MUTANTS

ROLES = [("a", "adversary"), ("b", "victim"), ("c", "victim")]


def _view(**kw) -> RouteView:
    base = dict(request=Request(0, "a", 0.0, 10, 1), tenant="a", outstanding=(3, 1, 1), used_blocks=(10, 50, 5),
                num_blocks=(100, 100, 10), cached_blocks=(0, 0, 0), rr_next=0, bound=3, subset=(0, 2))
    base.update(kw)
    return RouteView(**base)


def test_routers_pick_by_their_rule():
    assert [route_round_robin(_view(rr_next=k)) for k in range(5)] == [0, 1, 2, 0, 1]
    assert route_least_outstanding(_view()) == 1  # 1 and 2 tie at 1 outstanding: lowest index
    assert route_least_kv(_view()) == 0  # 10% of the pool against 50% and 50%
    assert route_tenant_affinity(_view()) == 2  # its subset is {0, 2}; 2 has fewer outstanding
    # prefix affinity: the longest cached prefix among the replicas within the bound ...
    assert route_prefix_affinity(_view(cached_blocks=(0, 4, 2))) == 1
    # ... but replica 0 (3 outstanding, 3 + 1 > bound 3) is passed over although it caches more
    assert route_prefix_affinity(_view(cached_blocks=(9, 0, 2))) == 2
    assert route_prefix_affinity(_view(cached_blocks=(9, 0, 2), bound=4)) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.floats(1.0, 3.0))
def test_the_least_loaded_replica_is_always_within_the_load_bound(loads, c):
    """c >= 1: min load + 1 <= ceil(c (m + 1) / R), so prefix affinity always has a replica to route to."""
    assert min(loads) + 1 <= load_bound(c, sum(loads), len(loads))


@pytest.mark.parametrize("kw, field", [
    (dict(router="random"), "router"), (dict(accounting="global"), "accounting"), (dict(load_factor=0.5), "load_factor"),
    (dict(affinity_replicas=3), "affinity_replicas"), (dict(tenant_replicas={"zz": [0]}), "tenant_replicas"),
    (dict(tenant_replicas={"a": [5]}), "tenant_replicas"), (dict(tenant_replicas=[0, 1]), "tenant_replicas"),
    (dict(tenant_replicas={"a": 1}), "tenant_replicas"),
])
def test_bad_fleet_fields_are_one_line_errors_naming_the_field(kw, field):
    cfg = build_config("vtc", ROLES)
    with pytest.raises(ConfigError) as e:
        FleetConfig((cfg, cfg), **kw)
    assert e.value.field == field and "\n" not in str(e.value)


def test_an_unknown_tenant_in_tenant_replicas_lists_the_tenants_there_are():
    cfg = build_config("vtc", ROLES)
    with pytest.raises(ConfigError, match="they have " + ", ".join(t.name for t in cfg.tenants) + "$"):
        FleetConfig((cfg, cfg), tenant_replicas={"zz": [0]})


def test_fleet_accounting_needs_vtc_and_equal_tenants():
    vtc, fcfs = build_config("vtc", ROLES), build_config("fcfs", ROLES)
    with pytest.raises(ConfigError, match="replica 1 runs order policy 'fcfs'"):
        FleetConfig((vtc, fcfs), accounting="fleet")
    with pytest.raises(ConfigError, match="same tenants"):
        FleetConfig((vtc, build_config("vtc", ROLES[:2])))


def _mixed(n=240, gap=0.02):
    return [Request(i, "abc"[i % 3], i * gap, 150 + (i * 37) % 400, 20 + (i * 13) % 60,
                    prefix_ids=tuple(range(i % 4 * 100, i % 4 * 100 + 8)),
                    cancel_s=i * gap + 0.5 if i % 11 == 0 else None) for i in range(n)]


def test_a_fleet_of_one_replica_is_the_replica():
    """The fleet reuses the driver loop and the step: one replica gives the model's history exactly."""
    cfg = build_config("hysteresis", ROLES)
    wl = [Request(i, "ab"[i % 2], i * 0.03, 400 + (i * 37) % 900, 50 + (i * 13) % 200,
                  cancel_s=i * 0.03 + 1.0 if i % 7 == 0 else None) for i in range(200)]
    one, fleet = simulate(cfg, wl), simulate_fleet(FleetConfig((cfg,)), wl)
    assert sum(r.preemptions for r in one.requests) > 0  # a run with evictions and cancellations
    assert tuple(attrs.evolve(s, replica=None) for s in fleet.steps) == one.steps
    assert tuple(attrs.evolve(r, replica=None) for r in fleet.requests) == one.requests
    assert len(fleet.fleet_steps) == len(one.steps)


def test_lockstep_every_replica_steps_on_the_fleet_clock():
    small = attrs.evolve(build_config("vtc", ROLES), num_blocks=1024)
    fc = FleetConfig((build_config("vtc", ROLES), small, small), router="least_outstanding")
    h = simulate_fleet(fc, _mixed())
    by_start = collections.defaultdict(list)
    for s in h.steps:
        by_start[s.start_s].append(s)
    waited = 0
    for f, nxt in zip(h.fleet_steps, h.fleet_steps[1:]):
        steps = by_start[f.start_s]
        assert sorted(s.replica for s in steps) == list(f.stepped)
        end = max(s.start_s + s.duration_s for s in steps)  # the fleet step lasts its longest replica step
        assert f.duration_s == pytest.approx(end - f.start_s, abs=1e-12)
        assert nxt.start_s >= end  # the next starts at its end (or later, after an idle wait)
        waited += sum(1 for s in steps if s.start_s + s.duration_s < end)
    assert waited > 0  # replicas with shorter steps waited for the longest one
    assert len({s.replica for s in h.steps}) == 3


@pytest.mark.parametrize("router", list(ROUTERS))
@pytest.mark.parametrize("accounting", ["replica", "fleet"])
def test_model_fleets_keep_every_invariant(router, accounting):
    """Every router x accounting on a shared prefix cache: each replica's part by the whole catalog, and the
    fleet invariants, find nothing; every request is on the replica it was routed to."""
    cfg = build_config("shared_cache", ROLES)
    fc = FleetConfig((cfg,) * 3, router=router, accounting=accounting)
    h = simulate_fleet(fc, _mixed())
    assert check_fleet_history(h) == []
    routed = {rid: r for f in h.fleet_steps for rid, r in f.routed}
    assert {r.request_id: r.replica for r in h.requests} == routed
    parts = fleet_parts(h)
    assert sum(len(p.requests) for p in parts) == len(h.requests)
    assert all(len(p.steps) > 0 for p in parts)


def test_fleet_history_round_trips_and_is_deterministic(tmp_path):
    cfg = build_config("shared_cache", ROLES)
    fc = FleetConfig((cfg,) * 2, router="prefix_affinity", accounting="fleet")
    a, b = simulate_fleet(fc, _mixed()), simulate_fleet(fc, _mixed())
    assert list(history_lines(a)) == list(history_lines(b))
    p = tmp_path / "fleet.jsonl"
    write_history(a, p)
    back = read_history(p)
    assert list(history_lines(back)) == list(history_lines(a))
    assert check_fleet_history(back) == []
    assert back.fleet_steps[3].counters is not None and back.requests[5].replica in (0, 1)


def test_a_bad_fleet_step_line_is_one_error_naming_the_field(tmp_path):
    p = tmp_path / "h.jsonl"
    p.write_text('{"kind":"header","format":2}\n'
                 '{"kind":"fleet_step","fleet_step":0,"start_s":0,"duration_s":1,"routed":[[1]],"stepped":[]}\n')
    with pytest.raises(ConfigError) as e:
        read_history(p)
    assert e.value.field == "routed" and ":2" in str(e.value) and "\n" not in str(e.value)


def test_a_one_replica_history_is_not_a_fleet_history():
    h = simulate(build_config("vtc", ROLES), _mixed(30))
    with pytest.raises(ConfigError, match="not a fleet history"):
        check_fleet_history(h)


@pytest.mark.parametrize("name", list(FLEET_MUTANTS))
def test_fleet_mutants_are_caught_by_their_invariants(name):
    m = FLEET_MUTANTS[name]
    fc, wl = m.fleet(), m.workload()
    assert check_fleet_history(simulate_fleet(fc, wl, horizon_s=12)) == []
    bad = check_fleet_history(simulate_fleet(fc, wl, horizon_s=12, variant=m.variant))
    for killer in m.killers:
        assert killer in FLEET_INVARIANTS
        assert any(f.invariant == killer for f in bad), f"{killer} missed mutant {name}"


def test_the_replicas_parts_are_judged_by_the_catalog():
    """A per-replica mutant (VTC counters that ignore output tokens) in a fleet is caught by the catalog's
    VTC-GAP on a replica's part, and the finding names the replica."""
    m = MUTANTS["vtc_prompt_only"]
    fc = FleetConfig((build_config("vtc", ROLES),) * 2, router="round_robin")
    bad = check_fleet_history(simulate_fleet(fc, _mixed(), step_variant=m.variant))
    gap = [f for f in bad if f.invariant == "VTC-GAP"]
    assert gap and all(f.message.startswith(("replica 0:", "replica 1:")) for f in gap)


def _twin(accounting):
    fc = FleetConfig((build_config("vtc", ROLES),) * 2, router="tenant_affinity", accounting=accounting,
                     tenant_replicas={"a": (0,), "b": (0, 1), "c": (1,)})
    return simulate_fleet(fc, [Request(i, "abc"[i % 3], i * 0.01, 300, 40) for i in range(900)], horizon_s=12)


def test_per_replica_accounting_under_affinity_breaks_the_fleet_spread_and_fleet_accounting_keeps_it():
    """a is pinned to replica 0, c to replica 1, b spreads over both.  Per-replica VTC gives b half of each
    replica (twice a's or c's service); the fleet counters give each about a third of the fleet."""
    per, fleet = _twin("replica"), _twin("fleet")
    s_per, s_fleet = fleet_service_counters(per)[-1], fleet_service_counters(fleet)[-1]
    assert s_per["b"] > 1.8 * s_per["a"] and s_per["b"] > 1.8 * s_per["c"]
    assert max(s_fleet.values()) < 1.05 * min(s_fleet.values())
    broken = spread_findings(per, fleet_service_counters(per))
    assert broken and all(f.tenants[0] == "b" for f in broken)  # b, picked on replica 0, runs ahead of a there
    assert broken[0].observed > broken[0].allowed
    assert check_fleet_history(fleet) == []
    assert spread_findings(fleet, [f.counters for f in fleet.fleet_steps]) == []


def test_fleet_vtc_gap_is_claimed_only_with_fleet_accounting():
    from tenantry.spec.invariants_fleet import fleet_coverage

    assert fleet_coverage(_twin("replica"))["FLEET-VTC-GAP"] != "checked"
    assert fleet_coverage(_twin("fleet"))["FLEET-VTC-GAP"] == "checked"
    assert fleet_coverage(_twin("fleet"))["ROUTE-LOAD-BOUND"] != "checked"  # tenant affinity is not load-bounded


def test_the_proofs_ceiling_is_the_models_load_bound():
    """The Z3 encoding of B (proofs/fleet.py) against load_bound on concrete values: B satisfies it, B - 1 and B + 1
    do not."""
    import z3

    from tenantry.proofs.core import num
    from tenantry.proofs.fleet import ceil_bound

    for r in range(1, 7):
        for m in range(0, 31, 3):
            for c in (1.0, 1.25, 1.5, 2.0):
                b = load_bound(c, m, r)
                holds = [z3.simplify(ceil_bound(z3.IntVal(x), num(c), z3.IntVal(m), z3.IntVal(r))) for x in (b - 1, b, b + 1)]
                assert [z3.is_true(h) for h in holds] == [False, True, False], (r, m, c, b)


def test_route_load_bound_is_proved_and_its_twin_replays():
    from tenantry.proofs.core import run_proof, run_twin
    from tenantry.proofs.registry import select

    (p,) = select(["ROUTE-LOAD-BOUND"])
    assert run_proof(p).verdict == "proved"
    for tw in p.twins:
        o = run_twin(p, tw)
        assert o.ok, o.replay


@pytest.mark.parametrize("cache", ["shared", "salted"])
def test_cached_blocks_sees_what_the_replica_cached(cache):
    """The router's view of a replica's prefix cache is the step's: after a request ran on replica 0, a request of
    its tenant with the same prefix finds its blocks there (under the tenant's salt) and none elsewhere; another
    tenant finds them only in a shared cache."""
    from tenantry.runner.fleet import Fleet
    from tenantry.model.routers import cached_blocks
    from tenantry.runner.simulate import drive

    cfg = build_config("shared_cache", ROLES)
    cfg = attrs.evolve(cfg, prefix_cache=cache)
    fleet = Fleet(FleetConfig((cfg, cfg), router="prefix_affinity"))
    first = Request(0, "a", 0.0, 160, 2, prefix_ids=tuple(range(10)))
    for _ in drive(fleet, [first]):
        pass
    again, other = Request(1, "a", 1.0, 160, 2, prefix_ids=tuple(range(10))), Request(2, "b", 1.0, 160, 2,
                                                                                         prefix_ids=tuple(range(10)))
    assert [cached_blocks(cfg, r.state, again) for r in fleet.replicas] == [10, 0]
    assert [cached_blocks(cfg, r.state, other) for r in fleet.replicas] == ([10, 0] if cache == "shared" else [0, 0])


@settings(deadline=None)
@given(st.data(), st.sampled_from(list(ROUTERS)), st.sampled_from(["replica", "fleet"]), st.integers(1, 3),
       st.sampled_from([False, True]))
def test_model_fleets_keep_every_invariant_on_drawn_workloads(data, router, accounting, replicas, small_pool):
    """Hypothesis workloads (bursts, shared prefixes, cancellations; a small pool that preempts) on every router and
    accounting: each replica's part by the catalog and the fleet invariants find nothing."""
    from tenantry.testing.mutants import _fleet_replica
    from tenantry.testing.strategies import workloads

    cfg = _fleet_replica(prefix_cache="shared")
    if small_pool:
        cfg = attrs.evolve(cfg, num_blocks=40)
    wl = data.draw(workloads(cfg, max_requests=30, shared_prefixes=True, bursty=True, cancels=True))
    fc = FleetConfig((cfg, attrs.evolve(cfg, num_blocks=cfg.num_blocks * 2), cfg)[:replicas], router=router,
                     accounting=accounting)
    assert check_fleet_history(simulate_fleet(fc, wl)) == []
