"""The fleet-step encoding of FLEET-VTC-GAP (``proofs/fleet.py``, SPEC.md 8.15) agrees with
the fleet model (``runner/fleet.py``).

Random workloads on small fleets (1 to 3 ``vtc`` replicas with ample KV, any router, fleet
accounting with the lift, weights 0.5 / 1 / 2, cancellations) run fleet step by fleet step; at
each step the encoding's ``fleet_step`` is evaluated on the model's concrete values
(:func:`tenantry.proofs.agree.apply`): its guard (the fleet lift's level, the picks by the
counters read at the step's start, the charge and owed facts of H1 and H2) must admit what the
fleet did, and its post-state must be the fleet's: the counters, the last-left counter, and the
spread's relation as :class:`tenantry.spec.invariants_fleet.SpreadRelation` keeps it.  The
proved invariant, as the Z3 formula, holds on every state.  Two planted encoding errors (the
replicas of earlier picks kept; charges not divided by the weight) are each caught.
The twin's and the limit ``pool-refused``'s counterexample shapes replay on the model.
Fast by default; ``--hypothesis-profile=deep`` runs more.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.routers import ROUTERS, FleetConfig
from tenantry.model.workload import Request
from tenantry.proofs import fleet as pf
from tenantry.proofs.agree import apply, arr, holds, owed
from tenantry.proofs.core import Domain
from tenantry.runner.fleet import Fleet, run_fleet
from tenantry.spec.invariants_core import ample_kv, batch_token_capacity
from tenantry.spec.invariants_fleet import SpreadRelation, fleet_largest_charge

WEIGHTS = (0.5, 1.0, 2.0)


def replica(weights, max_num_seqs: int) -> Config:
    """A small ``vtc`` replica with ample KV (4-token blocks, contexts of 8 tokens)."""
    return Config(tenants=tuple(TenantConfig(f"t{j}", weight=w) for j, w in enumerate(weights)),
                  max_num_seqs=max_num_seqs, token_budget=64, num_blocks=16, max_context_tokens=8,
                  block_size_tokens=4, order=OrderConfig(policy="vtc", w_in=1.0, w_out=2.0),
                  cost=CostConfig(mode="unit"))


def arr2(rows, sort: str = "real") -> z3.ArrayRef:
    """A concrete two-index array from a list of rows."""
    inner = {"bool": z3.BoolSort(), "int": z3.IntSort()}.get(sort, z3.RealSort())
    zero = {"bool": z3.BoolVal(False), "int": z3.IntVal(0)}.get(sort, z3.RealVal(0))
    a = z3.K(z3.IntSort(), z3.K(z3.IntSort(), zero))
    assert a.sort() == z3.ArraySort(z3.IntSort(), z3.ArraySort(z3.IntSort(), inner))
    for x, row in enumerate(rows):
        a = z3.Store(a, x, arr(row, sort))
    return a


class Observer:
    """The encoding's state read off a fleet: counters, owed, queues, the spread's relation
    (the checker's :class:`SpreadRelation`), the last-left counter and the fleet step."""

    def __init__(self, fc: FleetConfig) -> None:
        self.fc = fc
        self.names = [t.name for t in fc.replicas[0].tenants]
        self.rel = SpreadRelation(len(fc.replicas))

    def state(self, fl) -> dict:
        n, R = len(self.names), len(fl.replicas)
        g = [Fraction(0)] * n
        for c, rep in zip(fl.configs, fl.replicas):
            g = [a + b for a, b in zip(g, owed(c, rep.state.running, n))]
        lp = [self.rel.last_pick.get(f, (-1, frozenset())) for f in self.names]
        return {"c": arr(Fraction(x) for x in fl.counters), "G": arr(g),
                "q": arr2([[bool(t.queue) for t in rep.state.tenants] for rep in fl.replicas], "bool"),
                "sn": arr2([[self.rel.since[r].get(f, -1) for f in self.names] for r in range(R)], "int"),
                "lp": arr((j for j, _ in lp), "int"),
                "P": arr2([[r in reps for r in range(R)] for _, reps in lp], "bool"),
                "ll": z3.RealVal(Fraction(fl.last_left)), "k": z3.IntVal(fl.fleet_step)}

    def raw(self, fl) -> dict:
        n = len(self.names)
        return {"service": [[t.service for t in rep.state.tenants] for rep in fl.replicas],
                "queued": [[bool(t.queue) for t in rep.state.tenants] for rep in fl.replicas],
                "owed": [owed(c, rep.state.running, n) for c, rep in zip(fl.configs, fl.replicas)]}


def u_bound(fc: FleetConfig, longest: int) -> list[Fraction]:
    """U[f] = D_F / w_f (``fleet_charge_bound``: T the longest request of the workload)."""
    d_f = Fraction(fleet_largest_charge(fc.replicas, longest))
    return [d_f / Fraction(t.weight) for t in fc.replicas[0].tenants]


def check_run(fc: FleetConfig, wl: list[Request], plant: str | None = None, max_steps: int = 40) -> str | None:
    """Run ``wl`` on the fleet; at every fleet step evaluate the encoding on the fleet's values.
    Returns the first disagreement (a line), or None."""
    names = [t.name for t in fc.replicas[0].tenants]
    n, R = len(names), len(fc.replicas)
    dt, dr = Domain("N", n), Domain("R", R)
    weights = [Fraction(t.weight) for t in fc.replicas[0].tenants]
    longest = max(q.prompt_tokens + q.output_tokens for q in wl)
    U = arr(u_bound(fc, longest))
    tenant_of = {q.request_id: q.tenant for q in wl}
    obs = Observer(fc)
    pre_state, pre_raw = obs.state(Fleet(fc)), obs.raw(Fleet(fc))  # the empty fleet
    fl = None
    for tr, fl in run_fleet(fc, wl, max_steps=max_steps):
        k = tr.record.fleet_step
        assert holds(pf.gap_invariant(dt, dr, pre_state, U)), f"the invariant is broken before fleet step {k}"
        post_raw = obs.raw(fl)
        picked = [[False] * n if t is None else [any(e.kind == "scheduled" and e.tenant == i for e in t.output.events)
                                                 for i in range(n)] for t in tr.replicas]
        dlt = [[(Fraction(b) - Fraction(a)) / weights[i] for i, (a, b) in enumerate(zip(sa, sb))]
               for sa, sb in zip(pre_raw["service"], post_raw["service"])]
        arriving = {names.index(tenant_of[rid]) for rid, _ in tr.record.routed}
        for r, c in enumerate(fc.replicas):  # the replicas' facts the sum lemmas take (H2 per replica)
            d_r = Fraction(max(c.order.w_in, c.order.w_out) * batch_token_capacity(c, longest))
            for i in range(n):
                left = dlt[r][i] + post_raw["owed"][r][i]
                if left > d_r / weights[i] or (not picked[r][i] and left > pre_raw["owed"][r][i]):
                    return (f"fleet step {k}: H2 fails on replica {r} for t{i}: charged {dlt[r][i]}, "
                            f"owes {left - dlt[r][i]}")
        g2 = [Fraction(0)] * n
        for c, rep in zip(fl.configs, fl.replicas):
            g2 = [a + b for a, b in zip(g2, owed(c, rep.state.running, n))]
        guard, post, p = pf.fleet_step(dt, dr, pre_state, U, "e", plant=plant)
        binds = [p["A"] == arr((i in arriving for i in range(n)), "bool"),
                 p["Q"] == arr((any(q[i] for q in pre_raw["queued"]) for i in range(n)), "bool"),
                 p["Q2"] == arr((any(q[i] for q in post_raw["queued"]) for i in range(n)), "bool"),
                 p["D"] == arr2(dlt), p["dt"] == arr(sum(d[i] for d in dlt) for i in range(n)),
                 p["pk"] == arr2(picked, "bool"), p["pa"] == arr((any(x[i] for x in picked) for i in range(n)), "bool"),
                 p["q2"] == arr2(post_raw["queued"], "bool"), p["G2"] == arr(g2), p["wt"] == arr(weights)]
        terms = {**{f"c{i}": post["c"][i] for i in range(n)}, "ll": post["ll"],
                 **{f"lp{i}": post["lp"][i] for i in range(n)},
                 **{f"P{i},{r}": post["P"][i][r] for i in range(n) for r in range(R)},
                 **{f"sn{r},{i}": post["sn"][r][i] for r in range(R) for i in range(n) if post_raw["queued"][r][i]}}
        got = apply(guard, binds, terms)
        if got is None:
            return f"fleet step {k}: the encoding's guard rejects what the fleet did"
        obs.rel.advance(k, [{names[i] for i in range(n) if x[i]} for x in picked],
                        [dict(zip(names, map(int, q))) for q in post_raw["queued"]])
        want = {**{f"c{i}": Fraction(fl.counters[i]) for i in range(n)}, "ll": Fraction(fl.last_left),
                **{f"lp{i}": obs.rel.last_pick.get(names[i], (-1,))[0] for i in range(n)},
                **{f"P{i},{r}": r in obs.rel.last_pick.get(names[i], (-1, frozenset()))[1]
                   for i in range(n) for r in range(R)},
                **{f"sn{r},{i}": obs.rel.since[r][names[i]] for r in range(R) for i in range(n)
                   if post_raw["queued"][r][i]}}
        bad = [x for x in want if got[x] != want[x]]
        if bad:
            return f"fleet step {k}: {bad[0]} is {want[bad[0]]} in the fleet, {got[bad[0]]} in the encoding"
        pre_state, pre_raw = obs.state(fl), post_raw
    assert fl is None or holds(pf.gap_invariant(dt, dr, pre_state, U)), "the invariant is broken at the end"
    return None


#: (tenant, arrival step, prompt, output, cancelled after this many steps or None)
workloads = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10), st.integers(1, 6), st.integers(1, 4),
                               st.one_of(st.none(), st.integers(0, 4))), min_size=1, max_size=14)


def fleet_of(n: int, weights, slots, router: str, raw) -> tuple[FleetConfig, list[Request]]:
    fc = FleetConfig(tuple(replica(weights[:n], s) for s in slots), router=router, accounting="fleet",
                     tenant_replicas={"t0": (0,)} if router == "tenant_affinity" else {})
    wl = [Request(j, f"t{t % n}", float(a), pr, min(o, 8 - pr), cancel_s=None if c is None else float(a + c))
          for j, (t, a, pr, o, c) in enumerate(raw)]
    assert all(ample_kv(c) for c in fc.replicas)
    return fc, wl


@settings(max_examples=max(12, settings.default.max_examples // 3))
@given(st.integers(2, 3), st.lists(st.sampled_from(WEIGHTS), min_size=3, max_size=3),
       st.lists(st.integers(1, 3), min_size=1, max_size=3), st.sampled_from(sorted(ROUTERS)), workloads)
def test_fleet_step_encoding_is_the_fleet_s(n, weights, slots, router, raw):
    fc, wl = fleet_of(n, weights, slots, router, raw)
    assert check_run(fc, wl) is None, check_run(fc, wl)


def _picks_on_two_replicas() -> tuple[FleetConfig, list[Request]]:
    """Round robin: t0 (weight 2) picked on replica 0, t1 on replica 1 and queued on 0; t0's second
    request, later, goes to replica 1 and is picked there alone: exposes both plants."""
    fc = FleetConfig((replica((2.0, 1.0), 1),) * 2, router="round_robin", accounting="fleet")
    return fc, [Request(0, "t0", 0.0, 2, 2), Request(1, "t1", 0.0, 2, 2), Request(2, "t1", 0.0, 2, 2),
                Request(3, "t0", 8.0, 2, 2)]


def test_fleet_step_encoding_holds_on_the_planted_runs_unplanted():
    fc, wl = _picks_on_two_replicas()
    assert check_run(fc, wl) is None


def test_planted_pick_accumulation_is_caught():
    """Keeping the replicas of a tenant's earlier picks in P (a plausible slip: the relation
    would then range over replicas the checker has dropped) disagrees with the fleet."""
    fc, wl = _picks_on_two_replicas()
    msg = check_run(fc, wl, plant="picks_accumulate")
    assert msg is not None and msg.split(": ")[1].startswith("P"), msg


def test_planted_unweighted_charge_is_caught():
    """Charges added to the counters without dividing by the weight disagree with the fleet."""
    fc, wl = _picks_on_two_replicas()
    msg = check_run(fc, wl, plant="unweighted")
    assert msg is not None and msg.split(": ")[1].startswith("c"), msg


def test_the_step_obligation_is_not_vacuous():
    """On 2 tenants and 2 replicas (the quantifiers expanded) the step's hypotheses with a
    related pair after it have a model, its goal cannot fail, and with per-replica picks
    (``shared=False``) it can."""
    from tenantry.proofs.core import real_array, solve
    dt, dr, U = Domain("N", 2), Domain("R", 2), real_array("U")
    s = pf.fstate("v")
    for shared, want in ((True, "unsat"), (False, "sat")):
        guard, post, _ = pf.fleet_step(dt, dr, s, U, "v", shared=shared)
        f, g, r = z3.Int("f"), z3.Int("g"), z3.Int("r")
        hyps = [pf._fsetup(dt, dr, U), pf.gap_invariant(dt, dr, s, U), guard, dt.has(f), dt.has(g), dr.has(r),
                pf.related(post, f, g, r)]
        assert solve(z3.And(*hyps), 20000).status == "sat"
        assert solve(z3.And(*hyps, post["c"][f] + post["G"][f] > post["c"][g] + U[f]), 20000).status == want


@pytest.mark.parametrize("n, p, o", [(2, 1, 1), (2, 7, 1), (3, 4, 4), (6, 1, 7)])
def test_every_twin_counterexample_shape_replays(n, p, o):
    """The twin ``per-replica``'s counterexample replays whichever rounds and request sizes Z3
    picks (all 140 shapes were checked by hand on 2026-12-02; a sample here): the run reaches the
    decoded state and the spread breaks at the decoded step with the decoded gap."""
    from tenantry.proofs.core import solve
    f, sym = pf._gap_twin_formula()
    c = solve(z3.And(f, sym["n"] == n, sym["p"] == p, sym["o"] == o), 20000)
    assert c.status == "sat"
    rp = pf._gap_twin_replay(c.model, sym)
    assert rp.replayed, rp.detail
    assert rp.facts["step"] == (2 * n - 1) * o and rp.facts["decoded_gap"] == (2 * n - 2) * (p + 2 * o) + 2 * (p + 2)


@pytest.mark.parametrize("b, k", [(1, 3), (2, 4), (3, 4), (6, 5)])
def test_every_pool_refused_counterexample_shape_replays(b, k):
    """The limit ``pool-refused`` (H1 dropped) replays whichever block size Z3 picks: the four
    shapes the formula admits (b, k found by enumerating b = 1..7, k = 2..13 on 2026-12-02) each
    reach the decoded state, the catalog flags t0 against t1 first at fleet step k with the
    decoded gap, the catalog does not claim FLEET-VTC-GAP there, and an ample pool keeps it."""
    from tenantry.proofs.core import solve
    f, sym = pf._pool_refused_formula()
    c = solve(z3.And(f, sym["b"] == b, sym["k"] == k), 20000)
    assert c.status == "sat"
    rp = pf._pool_refused_replay(c.model, sym)
    assert rp.replayed, rp.detail
    assert rp.facts["first_finding_step"] == k and rp.facts["decoded_gap"] == 2 * (b + 4) * (k - 1)
    d_f = 2 * (min(3 * b, 2 * (b + 2)) + 2 * (b + 2))
    assert rp.facts["D_F"] == d_f < rp.facts["decoded_gap"]


def test_pool_refused_needs_exactly_the_dropped_hypothesis():
    """The limit's shape with H1 kept (``ample=True``: the pick least against every tenant queued on
    the replica, refused head or not) has no model: the counterexample is H1's, not the shape's; and
    no other block size or step than the four replayed ones breaks the spread."""
    from tenantry.proofs.core import solve
    f, sym = pf._pool_refused_formula()
    seen = set()
    for _ in range(6):
        c = solve(z3.And(f, *[z3.Or(sym["b"] != b, sym["k"] != k) for b, k in seen]), 20000)
        if c.status != "sat":
            break
        seen.add((c.model.eval(sym["b"]).as_long(), c.model.eval(sym["k"]).as_long()))
    assert seen == {(1, 3), (2, 4), (3, 4), (6, 5)}
    assert solve(pf._pool_refused_formula(ample=True)[0], 20000).status == "unsat"
