"""Tiers: weighted floors (a backlogged tier is served within a bounded number of
decisions) and priority with aging (a request is overtaken only by requests
that aged past it, so its wait is bounded); strict priority is the twin of
both (SPEC.md 8.5).

Floors are VTC applied to tiers (``select_floors``): the tier counter grows
by a tier's charges divided by its floor share, a tier that becomes backlogged
is lifted, and the pick goes to the least tier counter.  So the VTC encoding
(:mod:`tenantry.proofs.vtc`) is reused with tiers as its accounts, and a
ranking argument counts the decisions: while tier k waits, a pick of tier j
needs ``c[j] <= c[k] <= c[k] + G[k]`` and raises ``c[j]`` by at least
``delta_j = w_in / floor_j`` (a first scheduling charges at least one prompt
token), and nothing lowers ``mu_j = c[k] + G[k] - c[j]``; so j is picked at
most ``mu_j / delta_j + 1 <= D / (floor_k delta_j) + 1`` times before k.

Aging (``select_aging``): the key of a tenant is ``tier - rate * (now -
arrival of its head)``.  With ``a = rate * arrival`` (normalised time) the pick
i satisfies ``tier_i + a_i <= tier_j + a_j`` for every candidate j, and a
tenant's head has the least ``tier + a`` of its queue (queues are in arrival
order when nothing is preempted), so every request first scheduled while r
waits has ``tier + rate * arrival <= tier_r + rate * arrival_r``.
"""

from __future__ import annotations

import attrs
import z3
from z3 import And, Implies, Int, Not, Real

from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.step import step
from tenantry.model.workload import Request, StepInput
from tenantry.runner.simulate import simulate

from . import vtc
from .checks import EPS, catalog_history, catalog_state, verdict
from .concrete import SeqSpec, TenantSpec, Transition, build_state, run_workload
from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array, real_array, val

FAMILY = "priority"


# --- floors ------------------------------------------------------------------------------


def ranking_obligations(strict: bool = False) -> list[tuple[str, z3.BoolRef]]:
    """While tier k is backlogged and a candidate, mu_j = c[k] + G[k] - c[j] never
    grows for any tier j != k, and a pick of j needs mu_j >= 0 and lowers it by
    >= delta_j.  ``strict`` replaces the pick by strict priority (the twin)."""
    dom, U = Domain("T"), real_array("U")
    delta = real_array("delta")
    tier = int_array("tierno")
    out = []
    setup = And(dom.size >= 1, dom.forall(lambda f: And(U[f] >= 0, delta[f] > 0, tier[f] == f)))
    k = Int("k_rank")
    for name, act in (("join", vtc.join), ("admit", vtc.admit), ("output", vtc.output), ("drop", vtc.drop)):
        s = vtc.vstate(f"rk_{name}")
        guard, post, p = act(dom, s, f"rk_{name}")
        mu = lambda st, j: st["c"][k] + st["G"][k] - st["c"][j]  # noqa: E731
        hyps = [setup, dom.has(k), s["q"][k], post["q"][k], vtc.invariant(dom, s, U), guard]
        if name == "admit":
            i = p["i"]
            hyps += [i != k, Not(p["blk"][k]), p["pin"] >= delta[i], vtc.hyp_charge(s, p, U)]
            if strict:
                # strict priority: the pick is the candidate with the least tier number, whatever its counter
                guard_s = And(dom.has(i), s["q"][i], Not(p["blk"][i]), p["pin"] >= 0, p["gout"] >= 0,
                              dom.forall(lambda x: Implies(And(s["q"][x], Not(p["blk"][x])), tier[i] <= tier[x])))
                hyps = [h for h in hyps if h is not guard] + [guard_s]
            goal = And(mu(s, i) >= 0, mu(post, i) <= mu(s, i) - delta[i],
                       dom.forall(lambda x: Implies(x != k, mu(post, x) <= mu(s, x))))
        else:
            if name == "drop":
                hyps.append(Implies(p["i"] == k, Not(p["leave"])))
            goal = dom.forall(lambda x: Implies(x != k, mu(post, x) <= mu(s, x)))
        out.append((name, implies_all(hyps, goal)))
    return out


def floor_obligations() -> list[tuple[str, z3.BoolRef]]:
    """The tier-level VTC invariant (tier counters within D/floor) and the ranking."""
    return [(f"tiers:{n}", f) for n, f in vtc.gap_obligations()] + ranking_obligations()


def floors_config(policy: str, floors=(0.5, 0.5)) -> Config:
    return Config(tenants=(TenantConfig("hi", tier=0), TenantConfig("lo", tier=1)), max_num_seqs=1, token_budget=64,
                  num_blocks=64, max_context_tokens=8,
                  order=OrderConfig(policy=policy, w_in=1.0, w_out=2.0, tier_floors=floors, aging_rate_per_s=1.0),
                  cost=CostConfig(mode="unit"))


def decisions_before_service(config: Config, transitions: list[Transition], d: float) -> list[str]:
    """FLOOR, decision form: while tier k is backlogged, the first schedulings of
    other tiers before k's next one number at most sum_j (D f_j / (f_k w_in) + 1)."""
    o = config.order
    tiers = sorted({t.tier for t in config.tenants})
    f = {x: o.tier_floors[min(x, len(o.tier_floors) - 1)] for x in tiers}
    waiting: dict[int, int] = {}
    for tr in transitions:
        firsts = [s for s in tr.state.running if s.first_scheduled_s == tr.prev.t_s and s.preemptions == 0] + \
                 [s for s in tr.output.finished if s.first_scheduled_s == tr.prev.t_s]
        served = {config.tenants[s.tenant].tier for s in firsts}
        for k in tiers:
            if k in served:
                waiting.pop(k, None)
            back = any(t.queue for i, t in enumerate(tr.state.tenants) if config.tenants[i].tier == k)
            if back and k not in served:
                waiting[k] = waiting.get(k, 0) + sum(1 for s in firsts if config.tenants[s.tenant].tier != k)
                bound = sum(d * f[j] / (f[k] * o.w_in) + 1 for j in tiers if j != k)
                if waiting[k] > bound:
                    return [f"tier {k} stayed backlogged through {waiting[k]} decisions for other tiers, "
                            f"more than sum_j (D f_j / (f_k w_in) + 1) = {bound:g}"]
            elif not back:
                waiting.pop(k, None)
    return []


def _strict_floor_twin():
    def formula() -> tuple[z3.BoolRef, dict]:
        obligations = dict(ranking_obligations(strict=True))
        return obligations["admit"], {}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        cfg, ref = floors_config("priority"), floors_config("floors")
        reqs = [Request(k, "hi", 0.0, 1, 1) for k in range(60)] + [Request(1000, "lo", 0.0, 1, 1)]
        trs = list(run_workload(cfg, reqs, max_steps=200))
        d = vtc.charge_bound(ref)
        h = simulate(cfg, reqs, max_steps=200)
        ok, detail = verdict(decisions_before_service(ref, trs, d), catalog_history("FLOOR", ref, h),
                             "policy=priority, tier 0 sends 60 requests, tier 1 one, floors (0.5, 0.5)")
        return Replay(ok, detail, {"tier0_requests": 60, "tier1_first_scheduled_step":
                                   next((tr.output.step_index for tr in trs
                                         if any(r == 1000 for r, _ in tr.output.batch)), None)})
    return formula, replay


# --- aging -----------------------------------------------------------------------------


def aging_pick(dom: Domain, tag: str, strict: bool = False) -> tuple[z3.BoolRef, dict]:
    """A pick among candidates by ``select_aging`` (or strict priority): tenant j has
    tier ``tier[j]``, head aging credit ``a[j] = rate * arrival``; ``now`` is rate * t_s."""
    tier, a, cand = int_array(f"tier_{tag}"), real_array(f"a_{tag}"), bool_array(f"cand_{tag}")
    seq = int_array(f"seq_{tag}")
    i, now = Int(f"i_{tag}"), Real(f"now_{tag}")
    key = lambda j: z3.ToReal(tier[j]) - (now - a[j])  # noqa: E731
    if strict:
        better = lambda j: z3.Or(tier[i] < tier[j], And(tier[i] == tier[j], seq[i] <= seq[j]))  # noqa: E731
    else:
        better = lambda j: z3.Or(key(i) < key(j), And(key(i) == key(j), seq[i] <= seq[j]))  # noqa: E731
    guard = And(dom.has(i), cand[i], dom.forall(lambda j: Implies(cand[j], better(j))),
                dom.forall(lambda j: And(tier[j] >= 0, a[j] <= now)))
    return guard, {"tier": tier, "a": a, "cand": cand, "i": i, "now": now, "seq": seq}


def aging_obligations() -> list[tuple[str, z3.BoolRef]]:
    dom = Domain("N")
    guard, p = aging_pick(dom, "ag")
    # x: any request queued at candidate j, no older than j's head (queues in arrival order)
    j, ax = Int("j_ag"), Real("ax_ag")
    hyps = [dom.size >= 1, guard, dom.has(j), p["cand"][j], ax >= p["a"][j]]
    goal = z3.ToReal(p["tier"][p["i"]]) + p["a"][p["i"]] <= z3.ToReal(p["tier"][j]) + ax
    return [("pick", implies_all(hyps, goal))]


def _strict_aging_twin():
    def formula() -> tuple[z3.BoolRef, dict]:
        dom = Domain("N")
        guard, p = aging_pick(dom, "sa", strict=True)
        j = Int("j_sa")
        # decodable: two tenants, tiers 0 and 1, integral arrival credits (rate 1 per second)
        ai = int_array("ai_sa")
        shape = And(dom.size == 2, dom.forall(lambda x: And(p["cand"][x], p["a"][x] == z3.ToReal(ai[x]), ai[x] >= 0,
                                                            ai[x] <= 5, p["tier"][x] <= 1, p["seq"][x] == ai[x])),
                    p["now"] == 6)
        bad = z3.ToReal(p["tier"][p["i"]]) + p["a"][p["i"]] > z3.ToReal(p["tier"][j]) + p["a"][j]
        return And(guard, dom.has(j), shape, bad), {"dom": dom, "p": p, "ai": ai}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        p = sym["p"]
        cfg, ref = floors_config("priority"), floors_config("aging")
        now = 6.0
        specs = []
        for x in range(2):
            arr = float(val(m, sym["ai"][x]))
            specs.append((val(m, p["tier"][x]), arr))
        # tenants of the replay config: "hi" is tier 0, "lo" tier 1; give each the decoded arrival
        by_tier = {tier: arr for tier, arr in specs}
        if set(by_tier) != {0, 1}:
            return Replay(False, f"decoded tiers {sorted(by_tier)} are not one tenant per tier")
        pre = build_state(cfg, [TenantSpec(seqs=(SeqSpec(1, 1, arrival_s=by_tier[0]),)),
                                TenantSpec(seqs=(SeqSpec(1, 1, arrival_s=by_tier[1]),))], t_s=now)
        post, out = step(cfg, pre, StepInput())
        tr = Transition(pre, StepInput(), post, out)
        local = []
        lo_head = pre.tenants[1].queue[0]
        if any(r == pre.tenants[0].queue[0].request_id for r, _ in out.batch) and lo_head.request_id not in dict(out.batch):
            va, vb = 0 + by_tier[0], 1 + by_tier[1]
            if va > vb + EPS:
                local.append(f"tier-0 request (arrival {by_tier[0]:g}, tier + rate*arrival = {va:g}) ran while the "
                             f"tier-1 request (arrival {by_tier[1]:g}, {vb:g}) waited")
        ok, detail = verdict(local, catalog_state("AGING", ref, [tr]), "policy=priority, rate 1/s, one batch slot")
        return Replay(ok, detail, {"arrival_tier0": by_tier[0], "arrival_tier1": by_tier[1], "now": now})
    return formula, replay


def aging_pressure_config(guard_steps: int | None = None) -> Config:
    """:func:`floors_config`'s two tiers under ``aging`` on a pool of 3 blocks of 4 tokens with
    two slots: a running 6-token sequence of hi holds 2 blocks, so lo's 7-token head (2
    blocks) is refused while hi's 1-4-token head (1 block) fits."""
    c = floors_config("aging")
    return attrs.evolve(c, max_num_seqs=2, num_blocks=3, block_size_tokens=4,
                        order=attrs.evolve(c.order, guard_steps=guard_steps))


def _pool_refused_aging_limit():
    """Limit ``pool-refused`` of AGING: H1 dropped (a backlogged tenant whose head the pool
    refuses is not a candidate), so the pick is least only among the candidates."""
    def formula() -> tuple[z3.BoolRef, dict]:
        dom = Domain("N")
        guard, p = aging_pick(dom, "pr")
        j, ai = Int("j_pr"), int_array("ai_pr")
        # decodable: tier 0 (hi, a candidate) and tier 1 (lo, backlogged, its head refused: not a
        # candidate); integral arrivals (rate 1/s) in 0..5, now = 6; admission order = arrival order
        shape = And(dom.size == 2, dom.has(j), Not(p["cand"][j]), p["cand"][p["i"]], p["tier"][p["i"]] == 0,
                    p["tier"][j] == 1, p["now"] == 6,
                    dom.forall(lambda x: And(p["a"][x] == z3.ToReal(ai[x]), ai[x] >= 0, ai[x] <= 5, p["seq"][x] == ai[x])))
        bad = z3.ToReal(p["tier"][p["i"]]) + p["a"][p["i"]] > z3.ToReal(p["tier"][j]) + p["a"][j]
        return And(guard, shape, bad), {"p": p, "ai": ai, "j": j}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        p, j = sym["p"], val(m, sym["j"])
        i = val(m, p["i"])
        a_hi, a_lo = float(val(m, sym["ai"][i])), float(val(m, sym["ai"][j]))
        facts = {"arrival_hi": a_hi, "arrival_lo": a_lo, "now": 6.0}
        runs = {}
        for k in (None, 3):
            cfg = aging_pressure_config(k)
            pre = build_state(cfg, [TenantSpec(seqs=(SeqSpec(5, 3, done=1, running=True),
                                                     SeqSpec(1, 1, arrival_s=a_hi))),
                                    TenantSpec(seqs=(SeqSpec(7, 1, arrival_s=a_lo),))], t_s=6.0)
            post, out = step(cfg, pre, StepInput())
            runs[k] = (cfg, Transition(pre, StepInput(), post, out))
        cfg, tr = runs[None]
        hi_head, lo_head = tr.prev.tenants[0].queue[-1], tr.prev.tenants[1].queue[0]
        batch = dict(tr.output.batch)
        local = []
        if hi_head.request_id in batch and lo_head.request_id not in batch:
            local.append(f"hi's request (tier 0, arrival {a_hi:g}: tier + rate*arrival = {a_hi:g}) entered the batch "
                         f"while lo's refused head (tier 1, arrival {a_lo:g}: {1 + a_lo:g}) waited")
        facts["with_guard_steps_3"] = guarded = hi_head.request_id in dict(runs[3][1].output.batch)
        if not guarded:
            return Replay(False, "with guard_steps = 3 the model did not admit hi's request past lo's head", facts)
        ok, detail = verdict(local, catalog_state("AGING", cfg, [tr]),
                             "aging, rate 1/s, a pool of 3 blocks with 1 free: lo's 7-token head (2 blocks) is "
                             "refused and hi's younger 1-block request goes in (the same with guard_steps = 3: the "
                             "head is not overdue yet)")
        return Replay(ok, detail, facts)
    return formula, replay


def _proofs() -> tuple[Proof, ...]:
    ff, fr = _strict_floor_twin()
    af, ar = _strict_aging_twin()
    lf, lr = _pool_refused_aging_limit()
    return (
        Proof(id="FLOOR", family=FAMILY,
              claim="tier counters stay within D/floor; while tier k waits, tier j is picked <= D/(f_k delta_j) + 1 "
                    "times (delta_j = w_in/f_j)",
              scope="any N, any number of tiers", obligations=floor_obligations,
              twins=(Twin("strict-priority", "the floor counters (policy priority instead of floors)", ff, fr),),
              hypotheses=("H1 and H2 of VTC-GAP, for tiers (no head refused; a pick commits <= D)",
                          "decisions are first schedulings (a readmitted preempted sequence is not charged)")),
        Proof(id="AGING", family=FAMILY,
              claim="a request first scheduled while r waits has tier + rate*arrival <= tier_r + rate*arrival_r",
              scope="any N, one pick", obligations=aging_obligations,
              twins=(Twin("strict-priority", "aging (policy priority instead of aging)", af, ar),
                     Twin("pool-refused", "H1: every backlogged tenant is a candidate (no head refused by the "
                          "pool: ample KV); the starvation guard does not restore the order", lf, lr, kind="limit")),
              hypotheses=("H1: every backlogged tenant is a candidate (ample KV: no head refused, no preemption)",
                          "queues in arrival order")),
    )


PROOFS = _proofs()
