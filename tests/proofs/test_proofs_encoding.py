"""The Z3 encodings agree with the Python model (SPEC.md 8.1).

Each test draws a concrete state and input, runs the model's own rule (the
``Step`` phase or policy function the encoding claims to describe), and
evaluates the encoding's transition on the same values: the encoding must
admit what the model did and compute the same post-state.  The ``*_runs``
tests evaluate each proved invariant, as the Z3 formula, on every state of
random model runs that meet the proof's hypotheses.

Fast by default (40 examples each); ``--hypothesis-profile=deep`` runs 2000.
"""

from __future__ import annotations

from fractions import Fraction

import attrs
import z3
from hypothesis import assume, given
from hypothesis import strategies as st

from tenantry.model.config import AdmissionConfig, Config, CostConfig, EvictionConfig, OrderConfig, TenantConfig
from tenantry.model.policies import SelectView, refill_drr, select_aging, select_drr, select_floors, select_priority
from tenantry.model.state import prefix_keys
from tenantry.model.step import Step, step
from tenantry.model.workload import Request, StepInput
from tenantry.proofs import bucket, drr, evict, kv, priority, vtc
from tenantry.proofs.agree import apply, arr, holds, owed
from tenantry.proofs.concrete import SeqSpec, TenantSpec, build_state, run_workload
from tenantry.proofs.core import Domain

WEIGHTS = st.sampled_from([0.5, 1.0, 2.0])
QUARTERS = st.integers(0, 64).map(lambda k: k / 4)


def vtc_config(weights, lift=True, max_num_seqs=8, policy="vtc", tiers=None, floors=(0.5, 0.3, 0.2)) -> Config:
    ts = tiers or (0,) * len(weights)
    return Config(tenants=tuple(TenantConfig(f"t{j}", weight=w, tier=ts[j]) for j, w in enumerate(weights)),
                  max_num_seqs=max_num_seqs, token_budget=64, num_blocks=max(8, max_num_seqs), max_context_tokens=8,
                  order=OrderConfig(policy=policy, w_in=1.0, w_out=2.0, lift=lift, tier_floors=floors),
                  cost=CostConfig(mode="unit"))


seq_specs = st.builds(lambda p, o: (p, o), st.integers(1, 4), st.integers(1, 4))


@st.composite
def tenant_specs(draw, n, running=True, queued=True):
    out = []
    for _ in range(n):
        q = draw(st.lists(seq_specs, max_size=2)) if queued else []
        r = draw(st.lists(seq_specs, max_size=1)) if running else []
        seqs = tuple(SeqSpec(p, o) for p, o in q) + tuple(SeqSpec(p, o, done=o - 1 if o > 1 else 0, running=True)
                                                          for p, o in r)
        out.append(TenantSpec(counter=draw(QUARTERS), seqs=seqs))
    return out


# --- VTC ---------------------------------------------------------------------------------


def vtc_pre(cfg, state) -> dict:
    n = len(cfg.tenants)
    return {"c": arr(Fraction(t.counter) for t in state.tenants), "q": arr((bool(t.queue) for t in state.tenants), "bool"),
            "G": arr(owed(cfg, state.running, n)), "ll": z3.RealVal(Fraction(state.last_left_counter))}


@given(st.data())
def test_vtc_join_is_the_model_lift(data):
    n = data.draw(st.integers(1, 4))
    weights = data.draw(st.lists(WEIGHTS, min_size=n, max_size=n))
    lift = data.draw(st.booleans())
    cfg = vtc_config(weights, lift=lift)
    specs = data.draw(tenant_specs(n))
    state = build_state(cfg, specs, last_left_counter=data.draw(QUARTERS))
    idle = [j for j, t in enumerate(state.tenants) if not t.queue]
    assume(idle)
    i = data.draw(st.sampled_from(idle))
    s = Step(cfg, state)
    s.arrive(Request(999, f"t{i}", 0.0, 1, 1))
    guard, post, p = vtc.join(Domain("N", n), vtc_pre(cfg, state), "j", lift=lift)
    got = apply(guard, [p["i"] == i, p["r"] == 0], {**{f"c{j}": post["c"][j] for j in range(n)}, "ll": post["ll"],
                                                     **{f"q{j}": post["q"][j] for j in range(n)}})
    assert got is not None
    assert [got[f"c{j}"] for j in range(n)] == [Fraction(t.counter) for t in s.tenants]
    assert [got[f"q{j}"] for j in range(n)] == [bool(t.queue) for t in s.tenants]
    assert got["ll"] == Fraction(s.last_left)


@given(st.data())
def test_vtc_drop_by_cancellation_is_the_model_s(data):
    """A client cancels a queued request: the encoding's ``drop`` (r = 0: a queued
    sequence owes nothing) gives the model's queues and ``l``; a queue that empties
    raises ``l`` to its counter and never lowers it."""
    n = data.draw(st.integers(1, 4))
    cfg = vtc_config(data.draw(st.lists(WEIGHTS, min_size=n, max_size=n)))
    state = build_state(cfg, data.draw(tenant_specs(n)), last_left_counter=data.draw(QUARTERS))
    queued = [(j, q) for j, t in enumerate(state.tenants) for q in t.queue]
    assume(queued)
    i, q = data.draw(st.sampled_from(queued))
    s = Step(cfg, state)
    s.cancel(q.request_id)
    guard, post, p = vtc.drop(Domain("N", n), vtc_pre(cfg, state), "d")
    leave = len(state.tenants[i].queue) == 1
    got = apply(guard, [p["i"] == i, p["r"] == 0, p["leave"] == leave],
                {"ll": post["ll"], **{f"q{j}": post["q"][j] for j in range(n)}})
    assert got is not None
    assert [got[f"q{j}"] for j in range(n)] == [bool(t.queue) for t in s.tenants]
    assert got["ll"] == Fraction(s.last_left)


@given(st.data())
def test_vtc_pick_and_prompt_charge_are_the_model_s(data):
    n = data.draw(st.integers(1, 4))
    weights = data.draw(st.lists(WEIGHTS, min_size=n, max_size=n))
    specs = data.draw(tenant_specs(n))
    cfg0 = vtc_config(weights)
    state0 = build_state(cfg0, specs)
    cfg = vtc_config(weights, max_num_seqs=len(state0.running) + 1)
    state = build_state(cfg, specs, last_left_counter=data.draw(QUARTERS))
    assume(any(t.queue for t in state.tenants))
    s = Step(cfg, state)
    s.schedule_waiting()
    new = [q for rid, q in s.running.items() if rid not in {x.request_id for x in state.running}]
    assert len(new) == 1  # ample pool, one free slot: exactly one pick
    q = new[0]
    i = q.tenant
    w = Fraction(weights[i])
    pin = Fraction(q.request.prompt_tokens) / w if q.preemptions == 0 else Fraction(0)
    gout = 2 * Fraction(q.request.output_tokens - q.output_done) / w
    guard, post, p = vtc.admit(Domain("N", n), vtc_pre(cfg, state), "a")
    binds = [p["i"] == i, p["pin"] == pin, p["gout"] == gout, p["leave"] == (not s.tenants[i].queue),
             p["blk"] == z3.K(z3.IntSort(), z3.BoolVal(False))]
    got = apply(guard, binds, {**{f"c{j}": post["c"][j] for j in range(n)}, **{f"G{j}": post["G"][j] for j in range(n)},
                               "ll": post["ll"]})
    assert got is not None, "the model's pick is not a least counter among the candidates"
    assert [got[f"c{j}"] for j in range(n)] == [Fraction(t.counter) for t in s.tenants]
    assert [got[f"G{j}"] for j in range(n)] == owed(cfg, s.running.values(), n)
    assert got["ll"] == Fraction(s.last_left)


@given(st.data())
def test_vtc_output_moves_owed_charge_to_the_counter(data):
    n = data.draw(st.integers(1, 4))
    weights = data.draw(st.lists(WEIGHTS, min_size=n, max_size=n))
    cfg = vtc_config(weights)
    state = build_state(cfg, data.draw(tenant_specs(n, queued=False)))
    post_state, _ = step(cfg, state, StepInput())
    pre = vtc_pre(cfg, state)
    cur = pre
    for i in range(n):
        produced = sum(1 for x in state.running if x.tenant == i)  # one decode token each (budget suffices)
        x = 2 * Fraction(produced) / Fraction(weights[i])
        guard, cur, p = vtc.output(Domain("N", n), cur, f"o{i}")
        sub = [(p["i"], z3.IntVal(i)), (p["x"], z3.RealVal(x))]
        assert holds(z3.substitute(guard, *sub)), "the model charged more output than the tenant owed"
        cur = {k: z3.substitute(v, *sub) if k in ("c", "G") else v for k, v in cur.items()}
    for j in range(n):
        assert z3.simplify(cur["c"][j]) == z3.simplify(z3.RealVal(Fraction(post_state.tenants[j].counter)))
        assert z3.simplify(cur["G"][j]) == z3.simplify(z3.RealVal(owed(cfg, post_state.running, n)[j]))


workloads = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(1, 4), st.integers(1, 4)),
                     min_size=1, max_size=24)


def _requests(raw, n):
    return [Request(k, f"t{t % n}", float(a), p, o) for k, (t, a, p, o) in enumerate(raw)]


@given(st.integers(2, 4), st.lists(WEIGHTS, min_size=4, max_size=4), workloads, st.integers(1, 3))
def test_vtc_gap_invariant_holds_on_model_runs(n, weights, raw, slots):
    cfg = vtc_config(weights[:n], max_num_seqs=slots)
    d = vtc.charge_bound(cfg)
    dom = Domain("N", n)
    U = arr(Fraction(d) / Fraction(w) for w in weights[:n])
    for tr in run_workload(cfg, _requests(raw, n), max_steps=200):
        assert holds(vtc.invariant(dom, vtc_pre(cfg, tr.state), U)), f"VTC-GAP invariant broken at step {tr.output.step_index}"


# --- DRR ---------------------------------------------------------------------------------


def drr_config(weights, policy="drr_tokens", carry=None, reset=True, max_num_seqs=8) -> Config:
    return Config(tenants=tuple(TenantConfig(f"t{j}", weight=w) for j, w in enumerate(weights)),
                  max_num_seqs=max_num_seqs, token_budget=64, num_blocks=max(8, max_num_seqs), max_context_tokens=8,
                  order=OrderConfig(policy=policy, w_in=1.0, w_out=2.0, drr_quantum=8.0, drr_carry_bound=carry,
                                    drr_reset_when_idle=reset),
                  cost=CostConfig(mode="unit"))


@given(st.data())
def test_drr_refill_and_pick_are_the_model_s(data):
    n = data.draw(st.integers(1, 4))
    weights = data.draw(st.lists(st.sampled_from([1.0, 2.0]), min_size=n, max_size=n))
    carry = data.draw(st.sampled_from([None, 8.0, 16.0, 24.0]))
    policy = data.draw(st.sampled_from(["drr_tokens", "drr_block_seconds"]))
    cfg = drr_config(weights, policy, carry)
    defs = [data.draw(st.integers(-40, 8)) / 2 for _ in range(n)]
    if carry is not None:
        defs = [min(x, carry) for x in defs]
    specs = [TenantSpec(deficit=defs[j], seqs=(SeqSpec(1, 1),) if data.draw(st.booleans()) else ()) for j in range(n)]
    state = build_state(cfg, specs)
    back = [j for j, t in enumerate(state.tenants) if t.queue]
    assume(back)
    blocked = set(data.draw(st.lists(st.sampled_from(back), max_size=len(back) - 1)))
    cands = [j for j in back if j not in blocked]
    prov = {j: data.draw(st.integers(0, 12)) / 2 for j in back} if policy == "drr_block_seconds" else {}
    view = SelectView(cfg, list(state.tenants), cands, 0.0, 0, state.tier_counters, prov, back)
    updates = refill_drr(view)
    qw = [Fraction(8) * Fraction(w) for w in weights]
    pre = {"e": arr(Fraction(defs[j]) / qw[j] for j in range(n)), "pe": arr(Fraction(prov.get(j, 0)) / qw[j] for j in range(n)),
           "G": arr([0] * n), "q": arr((j in back for j in range(n)), "bool"), "run": arr([False] * n, "bool")}
    P = {"Ce": arr((Fraction(carry) / qw[j] if carry is not None else 0) for j in range(n)), "K": arr([1] * n)}
    guard, post, p = drr.refill(Domain("N", n), pre, P, "r", capped=carry is not None)
    binds = [p["blk"] == arr((j in blocked for j in range(n)), "bool")]
    got = apply(guard, binds, {f"e{j}": post["e"][j] for j in range(n)})
    if not updates:
        assert got is None, "the encoding refills where the model does not"
        new = defs
    else:
        assert got is not None, "the model refilled where the encoding's guard forbids it"
        new = [updates.get(j, defs[j]) for j in range(n)]
        assert [got[f"e{j}"] for j in range(n)] == [Fraction(new[j]) / qw[j] for j in range(n)]
    tenants = [t._replace(deficit=new[j]) for j, t in enumerate(state.tenants)]
    i = select_drr(SelectView(cfg, tenants, cands, 0.0, 0, state.tier_counters, prov, back))
    assert i is not None
    pre2 = {**pre, "e": arr(Fraction(new[j]) / qw[j] for j in range(n))}
    guard, _, p = drr.admit(Domain("N", n), pre2, "a", "tokens" if policy == "drr_tokens" else "block_seconds")
    ok = z3.Solver()
    ok.add(guard, p["i"] == i, p["blk"] == arr((j in blocked for j in range(n)), "bool"))
    assert ok.check() == z3.sat, "the model picked a tenant the encoding does not allow"


def drr_pre(cfg, state, unit) -> tuple[dict, list[Fraction]]:
    n = len(cfg.tenants)
    qw = [Fraction(cfg.order.drr_quantum) * Fraction(t.weight) for t in cfg.tenants]
    g = [Fraction(0)] * n
    if unit == "tokens":
        for s in state.running:
            g[s.tenant] += 2 * Fraction(s.request.output_tokens - s.output_done)
    return ({"e": arr(Fraction(t.deficit) / qw[j] for j, t in enumerate(state.tenants)), "pe": arr([0] * n),
             "G": arr(g[j] / qw[j] for j in range(n)), "q": arr((bool(t.queue) for t in state.tenants), "bool"),
             "run": arr((t.running > 0 for t in state.tenants), "bool")}, qw)


@given(st.integers(2, 4), st.lists(st.sampled_from([1.0, 2.0]), min_size=4, max_size=4), workloads,
       st.integers(1, 3), st.sampled_from(["drr_tokens", "drr_block_seconds"]), st.sampled_from([None, 16.0, 24.0]))
def test_drr_invariants_hold_on_model_runs(n, weights, raw, slots, policy, carry):
    unit = "tokens" if policy == "drr_tokens" else "block_seconds"
    cfg = drr_config(weights[:n], policy, carry, max_num_seqs=slots)
    d = vtc.charge_bound(cfg)
    dom = Domain("N", n)
    for tr in run_workload(cfg, _requests(raw, n), max_steps=200):
        pre, qw = drr_pre(cfg, tr.state, unit)
        assert holds(drr.reset_inv(dom, pre)), f"DRR-RESET broken at step {tr.output.step_index}"
        Ce = arr((Fraction(carry) / qw[j] if carry is not None else 10 ** 6) for j in range(n))
        if unit == "tokens":
            P = {"Ce": Ce, "K": arr(Fraction(d) / qw[j] for j in range(n))}
            assert holds(drr.deficit_inv(dom, pre, P, unit)), f"DRR-DEFICIT broken at step {tr.output.step_index}"
            # H1 (ample KV) and H3 (carry >= q*w) hold here: deficits stay at most one round
            assert holds(dom.forall(lambda f: pre["e"][f] <= 1))
        else:
            assert all(t.deficit <= (carry if carry is not None else float("inf")) for t in tr.state.tenants)
            if carry is None:
                # H1, H3 and H4 (unit cost) hold: at a step end no deficit exceeds one round
                assert holds(dom.forall(lambda f: pre["e"][f] <= 1)), f"block-seconds deficit above q*w at step {tr.output.step_index}"


# --- floors and aging ---------------------------------------------------------------------


@given(st.data())
def test_floors_pick_is_the_least_tier_counter(data):
    n = data.draw(st.integers(1, 5))
    tiers = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    cfg = vtc_config([1.0] * n, policy="floors", tiers=tuple(tiers))
    state = build_state(cfg, [TenantSpec(seqs=(SeqSpec(1, 1),) if data.draw(st.booleans()) else ()) for _ in range(n)],
                        tier_counters=tuple(data.draw(QUARTERS) for _ in range(max(tiers) + 1)))
    cands = [j for j, t in enumerate(state.tenants) if t.queue]
    assume(cands)
    i = select_floors(SelectView(cfg, list(state.tenants), cands, 0.0, 0, state.tier_counters, {}, cands))
    nt = max(tiers) + 1
    pre = {"c": arr(Fraction(x) for x in state.tier_counters), "q": arr((any(tiers[j] == x for j in cands)
                                                                          for x in range(nt)), "bool"),
           "G": arr([0] * nt), "ll": z3.RealVal(0)}
    guard, _, p = vtc.admit(Domain("T", nt), pre, "f")
    s = z3.Solver()
    s.add(guard, p["i"] == tiers[i], p["blk"] == z3.K(z3.IntSort(), z3.BoolVal(False)))
    assert s.check() == z3.sat, "select_floors picked a tier that is not least"


@given(st.data())
def test_aging_and_priority_picks_are_the_model_s(data):
    n = data.draw(st.integers(1, 4))
    tiers = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    arrivals = data.draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    rate = data.draw(st.sampled_from([0.5, 1.0, 2.0]))
    strict = data.draw(st.booleans())
    cfg = Config(tenants=tuple(TenantConfig(f"t{j}", tier=tiers[j]) for j in range(n)), max_num_seqs=4,
                 num_blocks=8, max_context_tokens=8,
                 order=OrderConfig(policy="priority" if strict else "aging", aging_rate_per_s=rate),
                 cost=CostConfig(mode="unit"))
    state = build_state(cfg, [TenantSpec(seqs=(SeqSpec(1, 1, arrival_s=float(arrivals[j])),)) for j in range(n)], t_s=12.0)
    seq_no = {j: state.tenants[j].queue[0].arrival_seq for j in range(n)}
    view = SelectView(cfg, list(state.tenants), list(range(n)), 12.0, 0, state.tier_counters, {}, list(range(n)))
    i = (select_priority if strict else select_aging)(view)
    guard, p = priority.aging_pick(Domain("N", n), "g", strict=strict)
    s = z3.Solver()
    s.add(guard, p["i"] == i, p["now"] == Fraction(rate) * 12, p["cand"] == arr([True] * n, "bool"),
          p["tier"] == arr(tiers, "int"), p["a"] == arr(Fraction(rate) * a for a in arrivals),
          p["seq"] == arr([seq_no[j] for j in range(n)], "int"))
    assert s.check() == z3.sat, f"the model's pick {i} is not allowed by the encoding"


# --- token bucket -------------------------------------------------------------------------


@given(st.integers(0, 16), st.integers(0, 8), st.integers(1, 12), st.sampled_from([1.0, 2.0, 4.0]))
def test_bucket_admission_and_refill_are_the_model_s(level, dt, prompt, rate):
    burst = 8.0
    cfg = Config(tenants=(TenantConfig("a", token_rate_per_s=rate, token_burst_tokens=burst),), max_num_seqs=4,
                 num_blocks=8, max_context_tokens=16, admission=AdmissionConfig(token_bucket=True),
                 order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"))
    lvl0 = min(burst, level / 2)
    state = build_state(cfg, [TenantSpec(bucket_tokens=lvl0)], t_s=float(dt))
    state = attrs.evolve(state, tenants=(state.tenants[0]._replace(bucket_t_s=0.0),))
    s = Step(cfg, state)
    s.arrive(Request(0, "a", float(dt), prompt, 1))
    queued = any(e.kind == "queued" for e in s.events)
    dom = Domain("N", 1)
    pre = {"lvl": arr([lvl0]), "A": arr([0]), "O": arr([0]), "tau": z3.RealVal(0)}
    b = arr([burst])
    g1, mid, p1 = bucket.refill(dom, pre, b, "r")
    g2, post, p2 = bucket.admit(dom, mid, b, "a")
    binds = [p1["i"] == 0, p1["dt"] == Fraction(rate) * dt, p2["i"] == 0, p2["x"] == prompt]
    got = apply(z3.And(g1, g2), binds, {"lvl": post["lvl"][0]})
    if queued:
        assert got is not None and got["lvl"] == Fraction(s.tenants[0].bucket_tokens)
    else:
        assert got is None, "the model refused what the encoding admits"


# --- eviction -----------------------------------------------------------------------------


@given(st.data())
def test_eviction_choice_and_counts_are_the_model_s(data):
    n = data.draw(st.integers(2, 4))
    mf = data.draw(st.integers(0, 3))
    k_max = data.draw(st.sampled_from([None, 0, 1, 2]))
    victim = data.draw(st.sampled_from(["newest", "largest", "lowest_priority", "most_over_share"]))
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))  # blocks held
    pres = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    # sequence 0 sits at a block boundary and needs one more block; the pool is exactly full
    specs = [TenantSpec(seqs=(SeqSpec(16 * sizes[0], 2, done=1, running=True, preemptions=pres[0]),))] + \
            [TenantSpec(seqs=(SeqSpec(16 * sizes[j] - 1, 3, done=1, running=True, preemptions=pres[j]),))
             for j in range(1, n)]
    cfg = Config(tenants=tuple(TenantConfig(f"t{j}", tier=j % 2) for j in range(n)), max_num_seqs=8, token_budget=64,
                 num_blocks=sum(sizes), max_context_tokens=64, order=OrderConfig(policy="fcfs"),
                 cost=CostConfig(mode="unit"),
                 eviction=EvictionConfig(victim=victim, min_free_blocks=mf, max_evictions=k_max))
    state = build_state(cfg, specs)
    s = Step(cfg, state)
    s.schedule_running()
    pre = {q.request_id: q for q in state.running}
    requester = state.running[0].request_id
    evictions = [e for e in s.events if e.kind == "preempted" or (e.kind == "rejected" and e.reason == "evicted_too_often")]
    assert evictions, "a full pool and a growing sequence must evict someone"
    dom = Domain("S", n)
    ids = [q.request_id for q in state.running]
    for e in evictions:
        v = ids.index(e.request_id)
        guard, p = evict.choose(dom, "c", z3.IntVal(mf))
        sol = z3.Solver()
        sol.add(guard, p["s0"] == 0, p["v"] == v, p["freeable"] == arr([q.blocks_held for q in state.running], "int"))
        assert sol.check() == z3.sat, f"victim {e.request_id} was not a candidate of the encoding"
        if e.kind == "preempted" and e.request_id != requester:
            assert e.blocks == pre[e.request_id].blocks_held
        K = z3.IntVal(10 ** 6 if k_max is None else k_max)
        bs = {"pre": arr([q.preemptions for q in state.running], "int"), "alive": arr([True] * n, "bool"),
              "waste": arr([0] * n, "int"), "B": arr([0] * n, "int")}
        guard, post, p = evict.evict_bounded(dom, bs, K, arr([64] * n, "int"), "b", limited=k_max is not None)
        got = apply(guard, [p["v"] == v, p["comp"] == pre[e.request_id].computed_tokens],
                    {"alive": post["alive"][v], "pre": post["pre"][v]})
        assert got["alive"] == (e.kind == "preempted")
        if e.kind == "preempted":
            back = next(q for q in s.tenants[v].queue if q.request_id == e.request_id)
            assert got["pre"] == back.preemptions
            assert back.ready_step == state.step_index + 1 + cfg.eviction.cooldown_steps


# --- KV pool ------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 6), st.integers(17, 40), st.integers(1, 4),
                          st.sampled_from([(1, 2), (1,), (3, 4), ()])), min_size=1, max_size=12),
       st.sampled_from(["salted", "shared"]), st.integers(4, 10))
def test_kv_invariant_holds_on_model_runs(raw, mode, pool):
    cfg = Config(tenants=(TenantConfig("a"), TenantConfig("b"), TenantConfig("c", cache_salt="a")), max_num_seqs=4,
                 token_budget=48, num_blocks=pool, max_context_tokens=64, prefix_cache=mode,
                 order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"))
    names = ("a", "b", "c")
    reqs = [Request(k, names[t], float(a), p, o, prefix_ids=ids) for k, (t, a, p, o, ids) in enumerate(raw)]
    assume(all(cfg.blocks_for(r.total_tokens) <= pool for r in reqs))
    salts = {None: kv.NONE}
    salt_const = lambda x: salts.setdefault(x, z3.Const(f"salt_{x}", kv.Salt))  # noqa: E731
    root_of: dict = {}
    for r in reqs:
        tsalt = cfg.tenants[cfg.tenant_index(r.tenant)].salt
        for key in prefix_keys(cfg, r, tsalt if mode == "salted" else None):
            root_of[key] = tsalt if mode == "salted" else None
    for tr in run_workload(cfg, reqs, max_steps=120):
        stt = tr.state
        keys = {k: z3.Const(f"key_{n}", kv.Key) for n, k in enumerate(sorted(set(stt.kv.refs) | set(stt.kv.retained)))}
        holds_ = [(s, k) for s in stt.running for k in s.shared_keys]
        owner = {k: cfg.tenants[s.tenant].salt for s, k in holds_}
        s_ = {"used": z3.IntVal(stt.kv.used_blocks), "P": z3.IntVal(sum(s.private_blocks for s in stt.running)),
              "L": z3.IntVal(len(stt.kv.refs)), "nret": z3.IntVal(len(stt.kv.retained))}
        facts = [z3.Distinct(*keys.values())] if len(keys) > 1 else []
        facts += [z3.Distinct(*salts.values())] if len(salts) > 1 else []
        goal = [kv.inv_global(s_, z3.IntVal(pool))]
        for k, c in keys.items():
            own = salt_const(owner.get(k, stt.kv.key_salt.get(k) if mode == "salted" else root_of.get(k)))
            facts.append(kv.root(c) == salt_const(root_of[k]))
            st_k = {"refs": z3.Store(z3.K(kv.Key, z3.IntVal(0)), c, stt.kv.refs.get(k, 0)),
                    "live": z3.Store(z3.K(kv.Key, False), c, k in stt.kv.refs),
                    "ret": z3.Store(z3.K(kv.Key, False), c, k in stt.kv.retained),
                    "owner": z3.Store(z3.K(kv.Key, kv.NONE), c, own)}
            goal.append(kv.inv_key(st_k, c, salted=mode == "salted"))
            n_hold = sum(1 for _, kk in holds_ if kk == k)
            goal.append(z3.BoolVal(n_hold == stt.kv.refs.get(k, 0)))
        sol = z3.Solver()
        sol.add(*facts, z3.Not(z3.And(*goal)))
        assert sol.check() == z3.unsat, f"KV-CONSERVE invariant broken at step {tr.output.step_index} ({mode})"
        if mode == "salted":
            for s, k in holds_:
                assert stt.kv.key_salt[k] == cfg.tenants[s.tenant].salt
