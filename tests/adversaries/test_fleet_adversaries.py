"""The adversaries that game routing, the fleet setups and their rows of the check matrix (issue 14).

Measured numbers in the comments come from the model at the patterns' defaults (seeds 0, 1, 2) and
are what the assertions were set against; each assertion could fail if the mechanism changed.
"""

from __future__ import annotations

from collections import Counter

import attrs
import numpy as np
import pytest

from tenantry.adversaries.check import FLEET_PATTERNS, matrix_cells, run_check
from tenantry.adversaries.evaluate import FleetSystem, ModelSystem, Task, evaluate, system_of
from tenantry.adversaries.objectives import contended_share, service_gap, ttft_inflation
from tenantry.adversaries.patterns import LANE_BASE, PATTERNS, herding_docs, make_scenario
from tenantry.adversaries.search import Budget
from tenantry.adversaries.space import freeze
from tenantry.adversaries.victims import doc_ids
from tenantry.model.routers import FleetConfig
from tenantry.runner.fleet import service_timeline, simulate_fleet
from tenantry.runner.history import FleetStepRecord, History, StepRecord
from tenantry.runner.setups import SETUPS, build_config, build_fleet, get_setup
from tenantry.runner.simulate import simulate

ROUTING = ("prefix_herding", "replica_spreading")
FLEETS = [n for n, s in SETUPS.items() if s.fleet is not None]


# --- the patterns --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ROUTING)
def test_routing_patterns_generate_valid_deterministic_workloads(name):
    pat = PATTERNS[name]
    rng = np.random.default_rng(5)
    for k in range(6):
        params = pat.space.defaults() if k == 0 else pat.space.sample(rng)
        a, b = make_scenario(name, params, seed=k), make_scenario(name, params, seed=k)
        assert a.workload == b.workload and a.roles == b.roles  # the same seed: the same requests
        adv = [r for r in a.workload if r.tenant in a.adversaries]
        assert adv and all(r.arrival_s < 16.0 for r in adv)
        assert [r.request_id for r in a.workload] == list(range(len(a.workload)))
        full = pat.space.complete(params)
        if name == "prefix_herding":
            docs = {doc_ids(d) for d in herding_docs(full)}
            assert {r.prefix_ids for r in adv} <= docs  # every prompt leads with a victim document
            assert all(r.prompt_tokens >= 16 * len(r.prefix_ids) for r in adv)
        else:
            lanes = {r.prefix_ids for r in adv}
            assert len(lanes) == min(int(full["lanes"]), len(adv))
            assert all(r.prefix_ids[0] >= LANE_BASE for r in adv)  # private: never a victim's content
        assert a.adversaries == ("adv",)
    c = make_scenario(name, None, seed=1)
    assert c.workload != make_scenario(name, None, seed=2).workload  # the victims carry the seed


def test_fleet_setups_are_one_vocabulary_with_the_replica_setups():
    assert {"fleet_rr", "fleet_prefix_affinity", "fleet_prefix_affinity_fleetacct", "fleet_tenant_affinity",
            "fleet_tenant_affinity_fleetacct", "fleet_least_kv"} <= set(FLEETS)
    roles = [("adv", "adversary"), ("chat", "victim")]
    for name in FLEETS:
        fc, part = build_fleet(name, roles), get_setup(name).fleet
        assert (fc.router, fc.accounting, len(fc.replicas)) == (part.router, part.accounting, 4)
        assert fc.replicas[0] == build_config(name, roles)  # build_config is one replica of the fleet
        assert isinstance(system_of(name), FleetSystem)
    assert isinstance(system_of("vtc"), ModelSystem)
    from tenantry.model.config import ConfigError
    with pytest.raises(ConfigError, match="not a fleet setup"):
        build_fleet("vtc", roles)


def test_the_default_matrix_runs_fleet_setups_against_the_fleet_patterns():
    cells = matrix_cells(["vtc", "fleet_rr"], None)
    assert [p for s, p in cells if s == "vtc"] == list(PATTERNS)
    assert [p for s, p in cells if s == "fleet_rr"] == [p for p in PATTERNS if p in FLEET_PATTERNS]
    assert set(ROUTING) <= set(FLEET_PATTERNS)
    assert matrix_cells(["fleet_rr"], ["churn"]) == [("fleet_rr", "churn")]  # named patterns run anywhere


# --- one service gap --------------------------------------------------------------------------------------------

def _rec(k, replica, queued, service):
    return StepRecord(k, float(k), 1.0, (), (), (), queued, {}, 0, {}, {}, service, {}, replica=replica)


def test_the_service_gap_of_a_fleet_sums_the_replicas():
    """Two replicas: adv on both, v on replica 1 only.  Per replica adv and v stay level on replica 1, but
    across the fleet adv gains replica 0's service too; the one service gap sees the fleet's."""
    steps = (
        _rec(0, 0, {"adv": 1, "v": 0}, {"adv": 0.0, "v": 0.0}), _rec(0, 1, {"adv": 1, "v": 1}, {"adv": 0.0, "v": 0.0}),
        _rec(1, 0, {"adv": 1, "v": 0}, {"adv": 100.0, "v": 0.0}), _rec(1, 1, {"adv": 1, "v": 1}, {"adv": 50.0, "v": 50.0}),
        _rec(2, 1, {"adv": 0, "v": 1}, {"adv": 50.0, "v": 120.0}),  # replica 0 waits (its last record stands)
    )
    fleet_steps = tuple(FleetStepRecord(k, float(k), 1.0, (), stepped) for k, stepped in
                        ((0, (0, 1)), (1, (0, 1)), (2, (1,))))
    h = History({}, steps, (), fleet_steps=fleet_steps)
    moments = list(service_timeline(h))
    assert [m[0]["adv"] for m in moments] == [0.0, 150.0, 150.0] and [m[1]["adv"] for m in moments] == [2, 2, 1]
    # both queued at the start of fleet steps 1 and 2: adv - v went 0, 100, 30: the largest swing is 100
    assert service_gap(h, ["adv"], ["v"], unit=50.0) == pytest.approx(2.0)
    assert service_gap(h) == pytest.approx(100.0)  # every pair (the simulate table's fleet service gap)
    assert contended_share(h, ["adv"], ["v"]) == pytest.approx(150 / 270)


def test_a_one_replica_fleet_has_the_replicas_service_gap():
    sc = make_scenario("replica_spreading", None, seed=0)
    cfg = build_config("fleet_rr", sc.roles)
    one = simulate(cfg, sc.workload, horizon_s=sc.horizon_s)
    fleet = simulate_fleet(FleetConfig((cfg,)), sc.workload, horizon_s=sc.horizon_s)
    assert fleet.end_s == one.end_s
    for args in ((sc.adversaries, sc.victims, 100.0), ()):
        assert service_gap(fleet, *args) == service_gap(one, *args) > 0
    assert contended_share(fleet, sc.adversaries, sc.victims) == contended_share(one, sc.adversaries, sc.victims)


# --- what the routing adversaries do ----------------------------------------------------------------------------

def _metric(setup, pattern, seed, metric, params=None):
    return evaluate(Task(setup, pattern, freeze(params or {}), seed, depth=None)).metrics[metric]


def test_fleet_accounting_defeats_replica_spreading():
    """One tenant whose four private prefix lanes keep a lane on every replica under prefix affinity.  With
    per-replica counters it gets a share on each replica, and the fleet service gap against the victims
    (in units of the largest request) was 10.2 / 30.5 / 12.2 on seeds 0 / 1 / 2; with the fleet's one set
    of counters 5.57 / 4.70 / 4.73 (on one VTC replica the same stream stays at 1.41 / 1.97 / 1.56)."""
    for seed in (0, 1, 2):
        per = _metric("fleet_prefix_affinity", "replica_spreading", seed, "service_gap")
        fleet = _metric("fleet_prefix_affinity_fleetacct", "replica_spreading", seed, "service_gap")
        assert per >= PATTERNS["replica_spreading"].finding > fleet  # hurt with replica counters only
        assert fleet < 0.6 * per, (seed, per, fleet)


def _herd(seed, router_setup, load_factor=None):
    params = {"rate_per_s": 1, "n_docs": 1, "output_tokens": 300}
    sc = make_scenario("prefix_herding", params, seed)
    fc = build_fleet(router_setup, sc.roles)
    if load_factor is not None:
        fc = attrs.evolve(fc, load_factor=load_factor)
    h = simulate_fleet(fc, sc.workload, horizon_s=sc.horizon_s)
    base = simulate_fleet(fc, sc.victim_workload(), horizon_s=sc.horizon_s)
    worst, per = ttft_inflation(h, base, sc.victims, 99)
    return worst, per, Counter(q.replica for q in h.requests if q.tenant == "adv")


def test_prefix_herding_piles_onto_the_cached_replica_and_the_load_bound_spills_it():
    """The honest effect of prefix herding (1 request/s of 300-token outputs led by victim document 0).

    - Without a load bound worth the name (c = 100) prefix affinity sends all 11 of the adversary's
      requests to the one replica caching the document; round robin spreads them 3 / 3 / 3 / 2.
    - The victim that shares the document follows them there: on seed 1, conv's TTFT p99 inflation is
      x37.4 while chat and code (no shared prefix, routed to the other replicas) stay at x1.1 and x0.9.
    - With the setups' bound (c = 1.25) the pile spills over three replicas, and prefix affinity still
      hurts the worst victim less than round robin, which puts the long decoders on every replica:
      x29.8 / x47.0 / x35.0 against x66.1 / x45.7 / x61.7 on seeds 0 / 1 / 2 (seed 1 about even).
      So the pattern does not hurt prefix affinity more than round robin; it hurts the prefix's sharers."""
    _, _, unbounded = _herd(0, "fleet_prefix_affinity", load_factor=100.0)
    _, _, rr = _herd(0, "fleet_rr")
    assert list(unbounded.values()) == [sum(rr.values())] and len(rr) == 4 and max(rr.values()) <= 3
    _, per, _ = _herd(1, "fleet_prefix_affinity", load_factor=100.0)
    assert per["conv"] > 10 * max(per["chat"], per["code"])
    pa = [_herd(s, "fleet_prefix_affinity")[0] for s in (0, 1, 2)]
    rr = [_herd(s, "fleet_rr")[0] for s in (0, 1, 2)]
    assert sum(pa) < 0.75 * sum(rr) and pa[0] < rr[0] and pa[2] < rr[2]
    assert all(x >= PATTERNS["prefix_herding"].finding for x in pa)  # hurt all the same (slots held for seconds)


# --- the matrix's fleet rows ------------------------------------------------------------------------------------

def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix in (".jsonl", ".csv", ".json", ".md") and p.name != "timing.json"}


def test_a_fleet_row_is_byte_identical_twice_and_reports_the_fleet_service_gap(tmp_path):
    kw = dict(setups=["fleet_prefix_affinity_fleetacct"], patterns=None, seed=0, budget=Budget(2),
              searches=("random",), shrink_evaluations=0, plots="none", extras=False, progress=False, spread_seeds=0,
              workers=1, replay_depth="state")  # state: DETERMINISM's second fleet run is what this test does
    out = tmp_path / "rep"
    a = run_check(out=out, **kw)
    fa = _files(out)
    run_check(out=out, **kw)
    fb = _files(out)
    assert fa["matrix.json"] == fb["matrix.json"] and fa == fb  # and matrix.md, report.md, every cell's files
    assert [p for _, p in a["cells"]] == list(FLEET_PATTERNS)  # the row: the fleet patterns
    c = a["cells"][("fleet_prefix_affinity_fleetacct", "replica_spreading")]
    assert c["fleet"] == {"router": "prefix_affinity", "accounting": "fleet", "replicas": 4}
    assert c["coverage"]["FLEET-VTC-GAP"] == "checked" and c["coverage"]["ROUTE-LOAD-BOUND"] == "checked"
    assert c["coverage"]["FLEET-NO-LOSS"] == "checked" and not c["findings"]
    assert c["coverage"]["KV-CONSERVE"].startswith("checked (state, history")
    report = fa["report.md"].decode()
    assert "## Fleet setups" in report
    m = c["metrics"]
    assert f"x{m['ttft_p99_inflation']:.3g} / {m['service_gap']:.3g}" in report


def test_simulate_runs_a_fleet_setups_fleet(tmp_path, capsys):
    from tenantry.cli import main
    from tenantry.runner.history import read_history

    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(f'{{"request_id":{i},"tenant":"{"ab"[i % 2]}","arrival_s":{i * 0.02:.2f},'
                          f'"prompt_tokens":200,"output_tokens":20}}\n' for i in range(60)))
    h = tmp_path / "h.jsonl"
    assert main(["simulate", "--workload", str(wl), "--policy", "fleet_prefix_affinity_fleetacct",
                 "--history", str(h)]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("fleet_prefix_affinity_fleetacct ")
               and "fleet " in line)
    assert row[1] == "fleet" and len(row[4:]) == 4 and sum(map(int, row[4:])) == 60  # 4 replicas, every request
    fleet = read_history(h).header["fleet"]
    assert (fleet["router"], fleet["accounting"], len(fleet["replicas"])) == ("prefix_affinity", "fleet", 4)
    assert main(["simulate", "--workload", str(wl), "--policy", "vtc", "fleet_rr"]) == 2
    assert "mixes fleet setups (fleet_rr) and one-replica setups (vtc)" in capsys.readouterr().err
