"""The skip-budget encoding (``proofs/skips.py``, SPEC.md 8.3) agrees with the model.

Concrete states with heads the pool refuses and skip counts:
the model's join (``Step.arrive`` -> ``_inherit_skips``) and waiting phase
(``schedule_waiting`` with one free slot -> ``skip_pass``) against the
encoding's ``join`` and ``admit``; and the proved invariant, as the Z3 formula,
on every state of random model runs under KV pressure with the budget on.
Fast by default; ``--hypothesis-profile=deep`` runs more.
"""

from __future__ import annotations

from fractions import Fraction

import attrs
import z3
from hypothesis import assume, given
from hypothesis import strategies as st

from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.step import Step
from tenantry.model.workload import Request
from tenantry.proofs import drr, skips
from tenantry.proofs.agree import apply, arr, holds, owed
from tenantry.proofs.concrete import SeqSpec, TenantSpec, build_state, run_workload
from tenantry.proofs.core import Domain
from tenantry.spec.invariants_core import largest_charge

WEIGHTS = st.sampled_from([0.5, 1.0, 2.0])
QUARTERS = st.integers(0, 64).map(lambda k: k / 4)
K = 2


def skip_config(weights, max_num_seqs=8, num_blocks=64, k=K) -> Config:
    return Config(tenants=tuple(TenantConfig(f"t{j}", weight=w) for j, w in enumerate(weights)),
                  max_num_seqs=max_num_seqs, token_budget=64, num_blocks=num_blocks, max_context_tokens=8,
                  block_size_tokens=4, order=OrderConfig(policy="vtc", w_in=1.0, w_out=2.0, guard_skips=k),
                  cost=CostConfig(mode="unit"))


def pre_of(cfg: Config, state) -> dict:
    n = len(cfg.tenants)
    return {"c": arr(Fraction(t.counter) for t in state.tenants),
            "q": arr((bool(t.queue) for t in state.tenants), "bool"),
            "G": arr(owed(cfg, state.running, n)), "ll": z3.RealVal(Fraction(state.last_left_counter)),
            "sig": arr((t.skips for t in state.tenants), "int"), "sll": z3.IntVal(state.last_left_skips)}


@st.composite
def tenants(draw, n):
    """Per tenant: counter, skip count, queued requests, and whether it is *blocked*:
    its head needs 2 blocks (a 5-7-token prompt) where the others' need 1 (1-4
    tokens), and the pool is built with 1 free block (:func:`pool_for`), so the pool
    refuses exactly the blocked heads.  Some tenants also have a running sequence."""
    specs, blocked = [], []
    for _ in range(n):
        b = draw(st.booleans())
        size = st.integers(5, 7) if b else st.integers(1, 4)
        q = tuple(SeqSpec(draw(size), 1) for _ in range(draw(st.integers(0, 2))))
        run = (SeqSpec(2, 2, done=1, running=True),) if draw(st.booleans()) else ()
        specs.append(TenantSpec(counter=draw(QUARTERS), skips=draw(st.sampled_from((0, 1, K, K))), seqs=q + run))
        blocked.append(b and bool(q))
    return specs, blocked


def pool_for(weights, specs, max_num_seqs=8) -> Config:
    """The configuration whose pool leaves exactly 1 block free in ``specs``' state."""
    used = build_state(skip_config(weights, num_blocks=64), specs).kv.used_blocks
    return skip_config(weights, max_num_seqs=max_num_seqs, num_blocks=used + 1)


@given(st.data())
def test_join_takes_the_count_the_encoding_allows(data):
    n = data.draw(st.integers(1, 4))
    weights = data.draw(st.lists(WEIGHTS, min_size=n, max_size=n))
    specs, _ = data.draw(tenants(n))
    cfg = pool_for(weights, specs)
    state = build_state(cfg, specs, last_left_counter=data.draw(QUARTERS), last_left_skips=data.draw(st.integers(0, K)))
    idle = [j for j, t in enumerate(state.tenants) if not t.queue]
    assume(idle)
    i = data.draw(st.sampled_from(idle))
    s = Step(cfg, state)
    s.arrive(Request(999, f"t{i}", 0.0, 1, 1))
    guard, post, p = skips.join(Domain("N", n), pre_of(cfg, state), "j")
    got = apply(guard, [p["i"] == i, p["r"] == 0, p["n"] == s.tenants[i].skips],
                {**{f"c{j}": post["c"][j] for j in range(n)}, **{f"s{j}": post["sig"][j] for j in range(n)}})
    assert got is not None, f"the model's joiner took count {s.tenants[i].skips}, which the encoding does not allow"
    assert [got[f"c{j}"] for j in range(n)] == [Fraction(t.counter) for t in s.tenants]
    assert [got[f"s{j}"] for j in range(n)] == [t.skips for t in s.tenants]


@given(st.data())
def test_pick_passes_over_and_counts_as_the_encoding_does(data):
    n = data.draw(st.integers(2, 4))
    weights = data.draw(st.lists(WEIGHTS, min_size=n, max_size=n))
    specs, blocked = data.draw(tenants(n))
    running = len(build_state(skip_config(weights), specs).running)
    cfg = pool_for(weights, specs, max_num_seqs=running + 1)
    state = build_state(cfg, specs, last_left_counter=data.draw(QUARTERS))
    assume(any(t.queue and not b for t, b in zip(state.tenants, blocked)))
    s = Step(cfg, state)
    s.schedule_waiting()
    dom = Domain("N", n)
    blk = arr(blocked, "bool")
    new = [q for rid, q in s.running.items() if rid not in {x.request_id for x in state.running}]
    if s.reserved_reason == "skips":
        # the model stopped filling: the policy's pick (least counter among the candidates) is disabled
        assert not new
        cands = [j for j, t in enumerate(state.tenants) if t.queue and not blocked[j]]
        i = min(cands, key=lambda j: (state.tenants[j].counter, state.tenants[j].queue[0].arrival_seq))
        guard, _, p = skips.admit(dom, pre_of(cfg, state), "a", z3.IntVal(K))
        assert apply(guard, [p["i"] == i, p["blk"] == blk, p["pin"] >= 0, p["gout"] >= 0], {}) is None, \
            "the model stopped for the skip budget but the encoding allows the pick"
        return
    assert len(new) == 1, "one free slot, a candidate that fits: exactly one pick"
    q = new[0]
    i = q.tenant
    w = Fraction(weights[i])
    guard, post, p = skips.admit(dom, pre_of(cfg, state), "a", z3.IntVal(K))
    binds = [p["i"] == i, p["pin"] == Fraction(q.request.prompt_tokens) / w,
             p["gout"] == 2 * Fraction(q.request.output_tokens - q.output_done) / w,
             p["leave"] == (not s.tenants[i].queue), p["blk"] == blk]
    got = apply(guard, binds, {**{f"c{j}": post["c"][j] for j in range(n)}, **{f"s{j}": post["sig"][j] for j in range(n)},
                               "ll": post["ll"], "sll": post["sll"]})
    assert got is not None, "the model's pick is not one the encoding allows"
    assert [got[f"c{j}"] for j in range(n)] == [Fraction(t.counter) for t in s.tenants]
    assert [got[f"s{j}"] for j in range(n)] == [t.skips for t in s.tenants]
    assert got["ll"] == Fraction(s.last_left) and got["sll"] == s.last_left_skips


#: (tenant, arrival, prompt, output) with prompt + output <= 8 = max_context_tokens (<= 2 blocks of 4 tokens)
workloads = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(1, 7), st.integers(1, 4)),
                     min_size=1, max_size=30)


@given(st.integers(2, 4), st.lists(WEIGHTS, min_size=4, max_size=4), workloads, st.integers(1, 4), st.integers(2, 8),
       st.integers(0, 2))
def test_invariant_holds_on_model_runs_under_kv_pressure(n, weights, raw, slots, blocks, k):
    cfg = skip_config(weights[:n], max_num_seqs=slots, num_blocks=blocks, k=k)
    d = Fraction(largest_charge(cfg))
    dom = Domain("N", n)
    U = arr(d / Fraction(w) for w in weights[:n])
    X = z3.RealVal(d / Fraction(min(weights[:n])))
    reqs = [Request(j, f"t{t % n}", float(a), p, min(o, 8 - p)) for j, (t, a, p, o) in enumerate(raw)]
    for tr in run_workload(cfg, reqs, max_steps=300):
        assert holds(skips.invariant(dom, pre_of(cfg, tr.state), U, X, z3.IntVal(k))), \
            f"the skip-budget invariant is broken at step {tr.output.step_index}"


def tier_pre(cfg: Config, state) -> dict:
    """The encoding's state with tiers as accounts (``floors``): tier counters, tiers
    backlogged, owed per tier (w_out / floor per remaining output token), tier counts."""
    from tenantry.spec.invariants_core import tier_share
    ntiers = len(state.tier_counters)
    g = [Fraction(0)] * ntiers
    for s in state.running:
        tier = cfg.tenants[s.tenant].tier
        g[tier] += Fraction(cfg.order.w_out) * (s.request.output_tokens - s.output_done) / Fraction(tier_share(cfg, tier))
    back = {cfg.tenants[i].tier for i, t in enumerate(state.tenants) if t.queue}
    sk = state.tier_skips or (0,) * ntiers
    return {"c": arr(Fraction(x) for x in state.tier_counters), "q": arr((x in back for x in range(ntiers)), "bool"),
            "G": arr(g), "ll": z3.RealVal(Fraction(state.last_left_tier_counter)), "sig": arr(sk, "int"),
            "sll": z3.IntVal(state.last_left_tier_skips)}


@given(st.integers(2, 4), st.lists(st.integers(0, 2), min_size=4, max_size=4), workloads, st.integers(1, 4),
       st.integers(2, 8), st.integers(0, 2))
def test_tier_invariant_holds_on_floors_runs_under_kv_pressure(n, tiers, raw, slots, blocks, k):
    """FLOOR[skips]: the same invariant over tiers, on every state of ``floors`` runs."""
    floors = (0.5, 0.3, 0.2)
    cfg = Config(tenants=tuple(TenantConfig(f"t{j}", tier=tiers[j]) for j in range(n)), max_num_seqs=slots,
                 token_budget=64, num_blocks=blocks, max_context_tokens=8, block_size_tokens=4,
                 order=OrderConfig(policy="floors", w_in=1.0, w_out=2.0, tier_floors=floors, guard_skips=k),
                 cost=CostConfig(mode="unit"))
    d = Fraction(largest_charge(cfg))
    dom = Domain("T", 3)
    U = arr(d / Fraction(f) for f in floors)
    X = z3.RealVal(d / Fraction(min(floors[t] for t in tiers[:n])))
    reqs = [Request(j, f"t{t % n}", float(a), p, min(o, 8 - p)) for j, (t, a, p, o) in enumerate(raw)]
    for tr in run_workload(cfg, reqs, max_steps=300):
        assert holds(skips.invariant(dom, tier_pre(cfg, tr.state), U, X, z3.IntVal(k))), \
            f"the tier skip-budget invariant is broken at step {tr.output.step_index}"


@given(st.integers(2, 4), st.lists(WEIGHTS, min_size=4, max_size=4), workloads, st.integers(1, 4), st.integers(2, 8),
       st.integers(0, 2))
def test_drr_invariant_holds_on_drr_runs_under_kv_pressure(n, weights, raw, slots, blocks, k):
    """DRR-GAP[skips]: the deficit part of the invariant (no window open) on every state of
    ``drr_tokens`` runs with the budget: ``e <= 1 + skips * Y``, ``e - owed > -D/(q w)``."""
    q = 8.0
    cfg = Config(tenants=tuple(TenantConfig(f"t{j}", weight=w) for j, w in enumerate(weights[:n])), max_num_seqs=slots,
                 token_budget=64, num_blocks=blocks, max_context_tokens=8, block_size_tokens=4,
                 order=OrderConfig(policy="drr_tokens", w_in=1.0, w_out=2.0, drr_quantum=q, drr_carry_bound=None,
                                   guard_skips=k),
                 cost=CostConfig(mode="unit"))
    d = Fraction(largest_charge(cfg))
    dom = Domain("N", n)
    qw = [Fraction(q) * Fraction(w) for w in weights[:n]]
    P = {"K": arr(d / x for x in qw), "Ce": arr(Fraction(10 ** 9) for _ in qw)}
    Y = z3.RealVal(d / (Fraction(q) * Fraction(min(weights[:n]))) + 1)
    reqs = [Request(j, f"t{t % n}", float(a), p, min(o, 8 - p)) for j, (t, a, p, o) in enumerate(raw)]
    for tr in run_workload(cfg, reqs, max_steps=300):
        ts = tr.state.tenants
        owed_ = [Fraction(0)] * n
        for s in tr.state.running:
            owed_[s.tenant] += 2 * Fraction(s.request.output_tokens - s.output_done) / qw[s.tenant]
        pre = {"e": arr(Fraction(t.deficit) / qw[j] for j, t in enumerate(ts)), "pe": arr([0] * n),
               "G": arr(owed_), "q": arr((bool(t.queue) for t in ts), "bool"),
               "run": arr((t.running > 0 for t in ts), "bool"), "since": arr([False] * n, "bool"),
               "base": arr([0] * n), "R": arr([0] * n), "S": arr([0] * n), "sig": arr((t.skips for t in ts), "int")}
        assert holds(skips.drr_inv(dom, pre, P, Y, z3.IntVal(k))), \
            f"the DRR skip-budget invariant is broken at step {tr.output.step_index}"


# --- DRR over block-seconds (DRR-GAP[skips,block_seconds], SPEC.md 8.4) -------------------------------------

Q_BS = 8.0


def bs_config(weights, max_num_seqs=3, num_blocks=64, k=K, token_budget=64) -> Config:
    return Config(tenants=tuple(TenantConfig(f"t{j}", weight=w) for j, w in enumerate(weights)),
                  max_num_seqs=max_num_seqs, token_budget=token_budget, num_blocks=num_blocks, max_context_tokens=8,
                  block_size_tokens=4, order=OrderConfig(policy="drr_block_seconds", drr_quantum=Q_BS,
                                                         drr_carry_bound=None, guard_skips=k),
                  cost=CostConfig(mode="unit"))


def future_block_seconds(trs, k: int, n: int) -> list[Fraction]:
    """The ghost G of the block-seconds encoding at the end of step ``trs[k]``, from the run
    itself: per tenant, the block-seconds charged in later steps for the sequences running at
    that point (until each leaves the batch; a readmission after an eviction is a new pick)."""
    live = {s.request_id: s.preemptions for s in trs[k].state.running}
    g = [Fraction(0)] * n
    for tr in trs[k + 1:]:
        if not live:
            break
        held = [s for s in tr.state.running] + [s for s in tr.output.finished
                                                if s.output_done == s.request.output_tokens]
        seen = set()
        for s in held:
            if live.get(s.request_id) == s.preemptions:
                g[s.tenant] += s.blocks_held * Fraction(tr.output.duration_s)
                seen.add(s.request_id)
        live = {r: p for r, p in live.items() if r in seen}
    return g


def bs_pre(cfg: Config, state, owed_bs: list[Fraction], provisional=None) -> dict:
    """The encoding's state (normalised by q w) of a concrete state."""
    ts, n = state.tenants, len(cfg.tenants)
    qw = [Fraction(cfg.order.drr_quantum) * Fraction(t.weight) for t in cfg.tenants]
    prov = provisional or {}
    return {"e": arr(Fraction(t.deficit) / qw[j] for j, t in enumerate(ts)),
            "pe": arr(Fraction(prov.get(j, 0.0)) / qw[j] for j in range(n)),
            "G": arr(owed_bs[j] / qw[j] for j in range(n)), "q": arr((bool(t.queue) for t in ts), "bool"),
            "run": arr((t.running > 0 for t in ts), "bool"), "since": arr([False] * n, "bool"),
            "base": arr([0] * n), "R": arr([0] * n), "S": arr([0] * n), "sig": arr((t.skips for t in ts), "int")}


def bs_params(cfg: Config) -> tuple[dict, z3.ArithRef]:
    from tenantry.spec.invariants_core import largest_block_seconds
    d = Fraction(largest_block_seconds(cfg))
    qw = [Fraction(cfg.order.drr_quantum) * Fraction(t.weight) for t in cfg.tenants]
    P = {"K": arr(d / x for x in qw), "Ce": arr(Fraction(10 ** 9) for _ in qw)}
    return P, z3.RealVal(d / (Fraction(cfg.order.drr_quantum) * Fraction(min(t.weight for t in cfg.tenants))) + 1)


@given(st.integers(2, 4), st.lists(WEIGHTS, min_size=4, max_size=4), workloads, st.integers(1, 4), st.integers(2, 8),
       st.integers(0, 2), st.sampled_from((4, 8, 64)))
def test_drr_block_seconds_invariant_holds_on_runs_under_kv_pressure(n, weights, raw, slots, blocks, k, budget):
    """DRR-GAP[skips,block_seconds]: on every step end of ``drr_block_seconds`` runs with the
    budget, the invariant (no window open) with G the block-seconds the run really charges
    later for the sequences then running: ``e <= 1 + skips * Y``, ``e - G > -D_bs/(q w)``
    and ``G <= D_bs/(q w)`` (H2: :func:`largest_block_seconds`, token budgets below the
    batch's so that sequences are left out)."""
    cfg = bs_config(weights[:n], max_num_seqs=slots, num_blocks=blocks, k=k, token_budget=budget)
    P, Y = bs_params(cfg)
    dom = Domain("N", n)
    reqs = [Request(j, f"t{t % n}", float(a), p, min(o, 8 - p)) for j, (t, a, p, o) in enumerate(raw)]
    trs = list(run_workload(cfg, reqs, max_steps=400))
    for j, tr in enumerate(trs):
        for i, t in enumerate(tr.state.tenants):  # the ghost's per-sequence charges are the model's per tenant
            before = trs[j - 1].state.tenants[i].block_seconds if j else 0.0
            held = sum(s.blocks_held for s in tr.state.running if s.tenant == i) + sum(
                s.blocks_held for s in tr.output.finished if s.tenant == i and s.output_done == s.request.output_tokens)
            assert abs(t.block_seconds - before - held * tr.output.duration_s) < 1e-9
        pre = bs_pre(cfg, tr.state, future_block_seconds(trs, j, n))
        assert holds(skips.drr_inv(dom, pre, P, Y, z3.IntVal(k), "block_seconds")), \
            f"the block-seconds skip-budget invariant is broken at step {tr.output.step_index}"


class _RefillProbe(Step):
    """Records, at each refill under the skip budget, the tenants, the provisional
    reservations and the candidates before it, and the tenants after it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.refills: list[dict] = []

    def _skip_guard(self, i, avail, cands=None):
        if i == -1:
            self.refills.append({"tenants": list(self.tenants), "prov": dict(self.provisional), "cands": set(cands),
                                 "tried": self.backlogged - (avail - cands)})
        stop, passed = super()._skip_guard(i, avail, cands)
        if i == -1:
            self.refills[-1]["stop"] = stop
        return stop, passed

    def _view(self, cands):
        if self.refills and "after" not in self.refills[-1] and "stop" in self.refills[-1]:
            self.refills[-1]["after"] = list(self.tenants)
        return super()._view(cands)


def need_without_reservations(s: dict, j):
    """A planted encoding error: the refill's rounds computed without the step's reservations
    (the tokens mode's ``floor(-e) + 1``)."""
    return z3.ToInt(-s["e"][j]) + 1


@st.composite
def bs_tenants(draw, n):
    """Per tenant: a small integral deficit, a count, 0-2 queued requests of 1-7 prompt
    tokens (1 or 2 blocks) and maybe a running sequence; the pool is built with 2 blocks
    free (:func:`check_refills`), so a pick's reservation can precede a refill that finds
    the same tenant's next head refused."""
    return [TenantSpec(deficit=float(draw(st.integers(-12, 10))), skips=draw(st.sampled_from((0, 1, K))),
                       seqs=tuple(SeqSpec(draw(st.integers(1, 7)), 1) for _ in range(draw(st.integers(0, 2))))
                       + ((SeqSpec(2, 2, done=1, running=True),) if draw(st.booleans()) else ()))
            for _ in range(n)]


def refill_rounds_without_reservations(s: dict):
    """A planted encoding error: the refill's rounds computed without the step's reservations
    (the tokens mode's ``floor(-e) + 1``)."""
    return lambda j: z3.ToInt(-s["e"][j]) + 1


def budget_one_too_large(dom, s, p, k):
    """A planted encoding error: the refill allowed while every count passed over is at most K."""
    return dom.forall(lambda j: z3.Implies(skips.refill_passes(s, p, j), s["sig"][j] <= k))


def check_refills(data, rounds=None, allowed=skips.refill_allowed) -> None:
    """Every refill of one waiting phase of the model, against the encoding's refill, its
    pass-over count and the budget's check (``rounds``, ``allowed``: planted variants)."""
    n = data.draw(st.integers(2, 4))
    weights = data.draw(st.lists(st.sampled_from([1.0, 2.0]), min_size=n, max_size=n))
    specs = data.draw(bs_tenants(n))
    used = build_state(bs_config(weights, max_num_seqs=12), specs).kv.used_blocks
    cfg = bs_config(weights, max_num_seqs=12, num_blocks=used + 2)
    state = build_state(cfg, specs)
    s = _RefillProbe(cfg, state)
    s.schedule_waiting()
    assume(s.refills)
    P, _ = bs_params(cfg)
    dom = Domain("N", n)
    qw = [Fraction(Q_BS) * Fraction(w) for w in weights]
    for rec in s.refills:
        pre_state = attrs.evolve(state, tenants=tuple(rec["tenants"]))
        pre = bs_pre(cfg, pre_state, [Fraction(10 ** 6)] * n, rec["prov"])
        pre["q"] = arr((j in rec["tried"] for j in range(n)), "bool")  # the backlogged tenants the refill judges
        guard, post, p = drr.refill(dom, pre, P, "pr", capped=False, need=rounds and rounds(pre))
        blk = arr((j not in rec["cands"] for j in range(n)), "bool")
        out = {**{f"e{j}": post["e"][j] for j in range(n)},
               **{f"p{j}": z3.If(skips.refill_passes(pre, p, j), 1, 0) for j in range(n)}}
        counts = [t.skips for t in rec["tenants"]]
        if rec["stop"]:
            got = apply(z3.And(guard, allowed(dom, pre, p, z3.IntVal(K))), [p["blk"] == blk], out)
            assert got is None, "the model stopped for the skip budget but the encoding allows the refill"
            continue
        got = apply(z3.And(guard, allowed(dom, pre, p, z3.IntVal(K))), [p["blk"] == blk], out)
        assert got is not None, "the encoding's refill (under the budget) does not allow the model's"
        after = rec["after"]
        assert [after[j].skips - counts[j] for j in range(n)] == [got[f"p{j}"] for j in range(n)], \
            "the pass-over count differs from the encoding's"
        assert [Fraction(after[j].deficit) / qw[j] for j in range(n) if j in rec["tried"]] == \
            [got[f"e{j}"] for j in range(n) if j in rec["tried"]], "the refilled deficits differ from the encoding's"


@given(st.data())
def test_drr_block_seconds_refill_and_count_agree_with_the_encoding(data):
    """The model's refills under ``drr_block_seconds`` (after earlier picks of the step made
    reservations) against the encoding's ``refill`` with ``pe`` the step's reservations."""
    check_refills(data)


def _caught(**planted) -> bool:
    from hypothesis import Phase, settings

    @settings(max_examples=300, database=None, derandomize=True, phases=(Phase.generate,))  # no shrinking
    @given(st.data())
    def run(data):
        check_refills(data, **planted)

    try:
        run()
    except AssertionError:
        return True
    return False


def test_planted_refill_errors_are_caught():
    """Two planted errors in the block-seconds refill's encoding (its rounds computed
    without the step's reservations; the budget one too large) are each caught by the
    same check on some drawn state."""
    assert _caught(rounds=refill_rounds_without_reservations), "a refill that forgets the reservations went unnoticed"
    assert _caught(allowed=budget_one_too_large), "a budget one too large went unnoticed"
