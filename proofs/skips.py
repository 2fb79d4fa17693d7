"""VTC under KV pressure: the counter spread and the service gap with refused
heads, bounded by the skip budget (``OrderConfig.guard_skips`` K; SPEC.md 4.3,
8.3).

The VTC encoding of :mod:`tenantry.proofs.vtc` (counter ``c``, backlogged
``q``, owed ``G``, last leaver's counter ``ll``) without its hypothesis H1:
the pick is the least counter among the *candidates* only, so a backlogged
tenant that is not a candidate (its head refused by the pool, its KV cap or a
slot cap, or no head ready) may be passed over while its counter is lower.
Added per tenant: ``sig[f]``, the skip budget's count (``TenantState.skips``),
and ``sll`` (``State.last_left_skips``).  Constants: ``U[f] = D / w_f`` and
``X >= U[f]`` for every f (``X = D / w_min``).

Actions, as in :mod:`~tenantry.proofs.vtc`, plus the count:

* ``join(i)``: the lift; i takes the count of a backlogged tenant whose counter
  is at most its lifted counter (the model takes the least such count), or
  ``sll`` when nobody else is backlogged (``Step._inherit_skips``);
* ``admit(i)``: the pick among the candidates; every backlogged non-candidate
  g with ``c[g] < c[i]`` is passed over, which the model allows only while
  ``sig[g] < K`` (``skip_pass``: else it stops filling), and ``sig[g] += 1``;
  if i's queue empties, ``ll = c[i]`` and ``sll = sig[i]``;
* ``output``; ``drop`` (a queue emptied by cancellation raises ``ll`` and ``sll``
  to its own, never lowers them).

Invariant (any N): for every tenant f and backlogged g,
``c[f] + G[f] <= c[g] + U[f] + X sig[g]``; with nobody backlogged,
``c[f] + G[f] <= ll + U[f] + X sll``; ``0 <= G[f] <= U[f]``; ``0 <= sig, sll <=
K``.  The step that needs the budget: i passes over g, so before it
``c[i] <= c[i] + G[i] <= c[g] + U[i] + X sig[g]``, and after it (H2: i owes at
most ``U[i] <= X`` beyond its counter) ``c[i]' + G[i]' <= c[g] + U[i] + X (sig[g] +
1)``.  The join needs the inheritance: a joiner lifted to the counter of a
tenant passed over has the same tenants ahead of it.

Corollaries: backlogged counters differ by at most ``D / w_f + K D / w_min``;
two tenants backlogged at every step end of an interval get normalised service
differing by at most ``D / w_f + D / w_g + 2 K D / w_min`` (``2 (K + 1) D`` for
unit weights).  D is the catalog's ``largest_charge`` with the pool term
dropped (``M = max_num_seqs * max_context_tokens``, SPEC.md 7.0).

Twin ``no-skip-budget`` (``guard_skips = None``): with the count at K the pick
passes over g anyway and the spread exceeds the bound; replayed on the model
(one step from a decoded state), judged by the catalog's VTC-GAP with the
budget on.

DRR (``drr_tokens`` and ``drr_block_seconds``, one encoding, :func:`drr_obligations`):
refills past a blocked tenant count, bounded by the budget; under block-seconds
with the step's reservations ``pe`` (``0 <= pe <= G``) and H4 (``unit`` cost
mode), D_bs the block-second constant (SPEC.md 7.0, 8.4).  Limit ``roofline``:
H4 dropped, replayed from the empty replica.
"""

from __future__ import annotations

import attrs
import z3
from z3 import And, Implies, Int, Lambda, Not, Store, ToReal

from tenantry.model.config import Config, TenantConfig
from tenantry.model.step import step
from tenantry.model.workload import Request, StepInput

from . import drr, vtc
from .checks import catalog_state, verdict, vtc_spread
from .concrete import SeqSpec, TenantSpec, Transition, build_state, run_workload
from .core import Domain, Proof, Replay, Twin, implies_all, int_array, real_array, val, zmax

FAMILY = "vtc"


def sstate(tag: str) -> dict:
    """Fresh symbolic state: :func:`tenantry.proofs.vtc.vstate` plus the counts."""
    return {**vtc.vstate(f"s{tag}"), "sig": int_array(f"sig_{tag}"), "sll": Int(f"sll_{tag}")}


def invariant(dom: Domain, s: dict, U: z3.ArrayRef, X, K) -> z3.BoolRef:
    """The invariant of the module docstring."""
    c, q, G, ll, sig = s["c"], s["q"], s["G"], s["ll"], s["sig"]
    spread = dom.forall(lambda f, g: Implies(q[g], c[f] + G[f] <= c[g] + U[f] + X * ToReal(sig[g])), arity=2)
    idle = Implies(dom.forall(lambda g: Not(q[g])),
                   dom.forall(lambda f: c[f] + G[f] <= ll + U[f] + X * ToReal(s["sll"])))
    owed = dom.forall(lambda f: And(G[f] >= 0, G[f] <= U[f], sig[f] >= 0, sig[f] <= K))
    return And(spread, idle, owed, s["sll"] >= 0, s["sll"] <= K)


def passed_over(s: dict, p: dict, g) -> z3.BoolRef:
    """g is passed over by the pick of ``p["i"]``: backlogged, not a candidate, lower counter."""
    return And(s["q"][g], p["blk"][g], g != p["i"], s["c"][g] < s["c"][p["i"]])


def join(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """:func:`tenantry.proofs.vtc.join` and the count a joiner takes."""
    guard, post, p = vtc.join(dom, s, tag)
    i, w, n = p["i"], Int(f"w_{tag}"), Int(f"n_{tag}")
    ci = post["c"][i]
    took = z3.If(p["other"], And(dom.has(w), w != i, s["q"][w], s["c"][w] <= ci, n == s["sig"][w]), n == s["sll"])
    return And(guard, took), {**post, "sig": z3.Store(s["sig"], i, n), "sll": s["sll"]}, {**p, "w": w, "n": n}


def admit(dom: Domain, s: dict, tag: str, K, budget: bool = True) -> tuple[z3.BoolRef, dict, dict]:
    """:func:`tenantry.proofs.vtc.admit` without H1: the passed-over tenants count one
    more; with ``budget`` the pick is allowed only while every one of them is below K."""
    guard, post, p = vtc.admit(dom, s, tag)
    if budget:
        guard = And(guard, dom.forall(lambda g: Implies(passed_over(s, p, g), s["sig"][g] < K)))
    j = Int(f"j_{tag}")
    sig = Lambda([j], z3.If(passed_over(s, p, j), s["sig"][j] + 1, s["sig"][j]))
    return guard, {**post, "sig": sig, "sll": z3.If(p["leave"], s["sig"][p["i"]], s["sll"])}, p


def output(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    guard, post, p = vtc.output(dom, s, tag)
    return guard, {**post, "sig": s["sig"], "sll": s["sll"]}, p


def drop(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """:func:`tenantry.proofs.vtc.drop`; a queue emptied by cancellation raises ``sll`` to its count."""
    guard, post, p = vtc.drop(dom, s, tag)
    return guard, {**post, "sig": s["sig"], "sll": z3.If(p["leave"], zmax(s["sll"], s["sig"][p["i"]]), s["sll"])}, p


def _setup(dom: Domain, U: z3.ArrayRef, X, K) -> z3.BoolRef:
    return And(dom.size >= 1, K >= 0, dom.forall(lambda f: And(U[f] >= 0, U[f] <= X)))


def obligations() -> list[tuple[str, z3.BoolRef]]:
    """Initiation, consecution for every action, and the two corollaries."""
    dom, U, X, K = Domain("N"), real_array("Us"), z3.Real("Xs"), Int("Ks")
    setup = _setup(dom, U, X, K)
    inv = lambda st: invariant(dom, st, U, X, K)  # noqa: E731
    out = []
    s0 = sstate("init")
    init = And(dom.forall(lambda f: And(s0["c"][f] == 0, s0["G"][f] == 0, Not(s0["q"][f]), s0["sig"][f] == 0)),
               s0["ll"] == 0, s0["sll"] == 0)
    out.append(("init", implies_all([setup, init], inv(s0))))
    for name in ("join", "admit", "output", "drop"):
        s = sstate(name)
        if name == "admit":
            guard, post, p = admit(dom, s, name, K)
        else:
            guard, post, p = {"join": join, "output": output, "drop": drop}[name](dom, s, name)
        hyps = [setup, inv(s), guard]
        if name == "admit":
            hyps.append(vtc.hyp_charge(s, p, U))
        out.append((name, implies_all(hyps, inv(post))))
    s = sstate("sp")
    f, g = Int("f_sp"), Int("g_sp")
    out.append(("spread", implies_all([setup, inv(s), dom.has(f), dom.has(g), s["q"][f], s["q"][g]],
                                      s["c"][f] - s["c"][g] <= U[f] + X * ToReal(K))))
    s1, s2 = sstate("t1"), sstate("t2")
    f, g = Int("f_gap"), Int("g_gap")
    ds = lambda x: s2["c"][x] - s1["c"][x]  # noqa: E731
    out.append(("gap", implies_all([setup, inv(s1), inv(s2), dom.has(f), dom.has(g), s1["q"][f], s1["q"][g],
                                    s2["q"][f], s2["q"][g]],
                                   ds(f) - ds(g) <= U[f] + U[g] + 2 * X * ToReal(K))))
    return out


# --- the twin: the skip budget removed ---------------------------------------------------

K_TWIN = 1


def twin_config(guard_skips: int | None) -> Config:
    """:func:`tenantry.proofs.vtc.replay_config`'s 2-tenant replica with 3 slots on a pool
    of 3 blocks of 4 tokens and no cap: t1's running sequence holds 2 blocks, so its
    queued 7-token head (2 blocks) is refused by the pool while t0's (1 block) fits."""
    c = vtc.replay_config(2, lift=True, max_num_seqs=3)
    return attrs.evolve(c, num_blocks=3, block_size_tokens=4, order=attrs.evolve(c.order, guard_skips=guard_skips))


def bound(config: Config) -> float:
    """The proved spread for unit weights: ``D + K D`` (D with the pool term dropped)."""
    from tenantry.spec.invariants_core import largest_charge, skip_slack
    d = largest_charge(config)
    return d + skip_slack(config, d)


def _twin_formula(u: float = 0.0, scale: int = 1, tag: str = "tw") -> tuple[z3.BoolRef, dict]:
    """One pick past an account already passed over K times, without the budget check.
    ``u``: D/w (VTC, unit weights) or D/f (floors, equal floors) of the replay config;
    ``scale``: the account's charge per weighted token (1 for unit weights, 1/f for floors)."""
    dom, U = Domain("N"), real_array(f"U{tag}")
    if not u:
        u = bound(twin_config(K_TWIN)) / (K_TWIN + 1)
    X, K = z3.RealVal(u), z3.IntVal(K_TWIN)
    s = sstate(tag)
    guard, post, p = admit(dom, s, tag, K, budget=False)
    ci, r, pi = int_array(f"ci_{tag}"), int_array(f"r_{tag}"), Int(f"p_{tag}")
    i = p["i"]
    # decodable: t0 picks a 1..4-token prompt (one block) past t1 (backlogged, its 2-block head
    # refused by the pool, one running 5-token-prompt sequence owing r <= 2 tokens, already passed
    # over K times); unit weights, w_out = 2.
    shape = And(dom.size == 2, i == 0, Not(p["leave"]), p["blk"][1], s["q"][1], s["sig"][1] == K,
                s["sig"][0] == 0, s["sll"] == 0, p["pin"] == scale * ToReal(pi), pi >= 1, pi <= 4,
                p["gout"] == 2 * scale, s["G"][0] == 0, r[1] >= 1, r[1] <= 2, s["G"][1] == 2 * scale * ToReal(r[1]),
                dom.forall(lambda f: And(U[f] == u, s["c"][f] == ToReal(ci[f]), ci[f] >= 0, ci[f] <= 400)))
    bad = post["c"][0] - post["c"][1] > U[0] + X * ToReal(K) + 2 * scale  # survives t1's output token
    f = And(_setup(dom, U, X, K), invariant(dom, s, U, X, K), guard, vtc.hyp_charge(s, p, U), shape, bad)
    return f, {"ci": ci, "r": r, "p": pi}


def _twin_replay(m: z3.ModelRef, sym: dict) -> Replay:
    cfg, ref = twin_config(None), twin_config(K_TWIN)
    c0, c1, r1, prompt = (val(m, sym["ci"][0]), val(m, sym["ci"][1]), val(m, sym["r"][1]), val(m, sym["p"]))
    pre = build_state(cfg, [TenantSpec(counter=float(c0), seqs=(SeqSpec(prompt, 1), SeqSpec(1, 1))),
                            TenantSpec(counter=float(c1), skips=K_TWIN,
                                       seqs=(SeqSpec(5, r1 + 1, done=1, running=True), SeqSpec(7, 1)))])
    post, out = step(cfg, pre, StepInput())
    tr = Transition(pre, StepInput(), post, out)
    b = bound(ref)
    facts = {"counters": [c0, c1], "prompt": prompt, "skips": K_TWIN, "bound": b}
    if vtc_spread(ref, pre, b):
        return Replay(False, "the decoded pre-state already violates the claim", facts)
    held, held_out = step(ref, pre, StepInput())  # the same state with the budget on: it stops filling
    facts["with_budget"] = {"reserved_reason": held_out.reserved_reason, "spread": held.tenants[0].counter -
                            held.tenants[1].counter}
    if held_out.reserved_reason != "skips" or vtc_spread(ref, held, b):
        return Replay(False, f"with guard_skips={K_TWIN} the model did not stop for t1: {facts['with_budget']}", facts)
    ok, detail = verdict(vtc_spread(ref, post, b), catalog_state("VTC-GAP", ref, [tr]),
                         f"guard_skips=None: t1 (counter {c1}, passed over {K_TWIN} time(s)) is refused by the pool; "
                         f"t0 (counter {c0}) is charged {prompt} past it again (bound D + K*D = {b:g}; with the budget "
                         "the step stops filling instead)")
    return Replay(ok, detail, facts)


# --- floors: the same over tiers, and the decisions before a waiting tier is served ------------


def ranking_obligations() -> list[tuple[str, z3.BoolRef]]:
    """FLOOR under the skip budget (tiers as accounts): while tier k stays backlogged,
    a pick of tier i != k either passes k over (k's count grows by one, at most K in
    all) or has ``mu_i = c[k] + G[k] - c[i] >= 0`` and lowers it by at least
    ``delta_i`` (a first scheduling charges >= w_in / f_i); no action raises ``mu_x``
    for any x != k (:func:`tenantry.proofs.priority.ranking_obligations` without H1)."""
    dom, U, X, K = Domain("T"), real_array("Ur"), z3.Real("Xr"), Int("Kr")
    delta = real_array("delta_r")
    setup = And(_setup(dom, U, X, K), dom.forall(lambda f: delta[f] > 0))
    k = Int("k_r")
    mu = lambda st, j: st["c"][k] + st["G"][k] - st["c"][j]  # noqa: E731
    out = []
    for name in ("join", "admit", "output", "drop"):
        s = sstate(f"rk{name}")
        if name == "admit":
            guard, post, p = admit(dom, s, f"rk{name}", K)
        else:
            guard, post, p = {"join": join, "output": output, "drop": drop}[name](dom, s, f"rk{name}")
        hyps = [setup, dom.has(k), s["q"][k], post["q"][k], invariant(dom, s, U, X, K), guard]
        others = dom.forall(lambda x: Implies(x != k, mu(post, x) <= mu(s, x)))
        if name == "admit":
            i = p["i"]
            hyps += [i != k, p["pin"] >= delta[i], vtc.hyp_charge(s, p, U)]
            goal = And(Implies(passed_over(s, p, k), post["sig"][k] == s["sig"][k] + 1),
                       Implies(Not(passed_over(s, p, k)), And(mu(s, i) >= 0, mu(post, i) <= mu(s, i) - delta[i])),
                       others)
        else:
            if name == "drop":
                hyps.append(Implies(p["i"] == k, Not(p["leave"])))
            goal = others
        out.append((name, implies_all(hyps, goal)))
    # the start: every backlogged tier j has mu_j <= U[k] + X K (so at most (U[k] + X K)/delta_j + 1 picks)
    s = sstate("rk0")
    j = Int("j_r0")
    out.append(("start", implies_all([setup, invariant(dom, s, U, X, K), dom.has(k), dom.has(j), s["q"][j]],
                                     mu(s, j) <= U[k] + X * ToReal(K))))
    return out


def floor_obligations() -> list[tuple[str, z3.BoolRef]]:
    """The tier-level invariant (:func:`obligations` with tiers as accounts) and the ranking."""
    return [(f"tiers:{n}", f) for n, f in obligations()] + ranking_obligations()


FLOORS = (0.5, 0.5)


def floor_config(guard_skips: int | None) -> Config:
    """:func:`twin_config` with two tenants in tiers 0 and 1 under ``floors`` (0.5, 0.5)."""
    c = twin_config(guard_skips)
    return attrs.evolve(c, tenants=(TenantConfig("t0", tier=0), TenantConfig("t1", tier=1)),
                        order=attrs.evolve(c.order, policy="floors", tier_floors=FLOORS))


def tier_spread(config: Config, state, bound_: float) -> list[str]:
    """FLOOR's state form on concrete states: backlogged tiers' counters within ``bound_``."""
    tiers = sorted({config.tenants[i].tier for i, t in enumerate(state.tenants) if t.queue})
    tc = state.tier_counters
    return [f"tier {a}'s counter is {tc[a] - tc[b]:g} above tier {b}'s, more than {bound_:g}"
            for a in tiers for b in tiers if tc[a] - tc[b] > bound_ + 1e-6]


def floor_bound(config: Config) -> float:
    """The proved tier spread for equal floors f: ``D/f + K D/f``."""
    from tenantry.spec.invariants_core import largest_charge, skip_slack, tier_share
    d = largest_charge(config)
    return d / tier_share(config, 0) + skip_slack(config, d)


def _floor_twin_formula() -> tuple[z3.BoolRef, dict]:
    ref = floor_config(K_TWIN)
    return _twin_formula(floor_bound(ref) / (K_TWIN + 1), 2, "ftw")


def _floor_twin_replay(m: z3.ModelRef, sym: dict) -> Replay:
    cfg, ref = floor_config(None), floor_config(K_TWIN)
    c0, c1, r1, prompt = (val(m, sym["ci"][0]), val(m, sym["ci"][1]), val(m, sym["r"][1]), val(m, sym["p"]))
    specs = [TenantSpec(seqs=(SeqSpec(prompt, 1), SeqSpec(1, 1))),
             TenantSpec(seqs=(SeqSpec(5, r1 + 1, done=1, running=True), SeqSpec(7, 1)))]
    pre = build_state(cfg, specs, tier_counters=(float(c0), float(c1)), tier_skips=(0, K_TWIN))
    post, out = step(cfg, pre, StepInput())
    tr = Transition(pre, StepInput(), post, out)
    b = floor_bound(ref)
    facts = {"tier_counters": [c0, c1], "prompt": prompt, "tier_skips": K_TWIN, "bound": b}
    if tier_spread(ref, pre, b):
        return Replay(False, "the decoded pre-state already violates the claim", facts)
    held, held_out = step(ref, pre, StepInput())
    facts["with_budget"] = {"reserved_reason": held_out.reserved_reason,
                            "spread": held.tier_counters[0] - held.tier_counters[1]}
    if held_out.reserved_reason != "skips" or tier_spread(ref, held, b):
        return Replay(False, f"with guard_skips={K_TWIN} the model did not stop for tier 1: {facts['with_budget']}",
                      facts)
    ok, detail = verdict(tier_spread(ref, post, b), catalog_state("FLOOR", ref, [tr]),
                         f"floors {FLOORS}, guard_skips=None: tier 1 (counter {c1}, passed over {K_TWIN} time(s)) is "
                         f"refused by the pool; tier 0 (counter {c0}) is charged {prompt} past it again (bound "
                         f"D/f + K*D/f = {b:g}; with the budget the step stops filling instead)")
    return Replay(ok, detail, facts)


FLOOR_SKIPS = Proof(
    id="FLOOR[skips]", family="priority",
    claim="with refused heads and the skip budget K (floors): tier counters within D/f_k + K*D/f_min; while tier k "
          "waits, other tiers get <= sum_j ((D/f_k + K*D/f_min) f_j/w_in + 1) + K first schedulings",
    scope="any N tenants, any number of tiers", obligations=floor_obligations,
    twins=(Twin("no-skip-budget", "the skip budget (guard_skips = None: work-conserving past a lower tier counter)",
                _floor_twin_formula, _floor_twin_replay),),
    hypotheses=("H2 for tiers: a pick leaves the tier owing at most D/f (D with M = max_num_seqs * "
                "max_context_tokens)",
                "no enforced KV or slot cap (a head its own cap refuses is not counted)",
                "decisions are first schedulings (a readmitted preempted sequence is not charged)"))


# --- DRR over tokens and block-seconds: refills past a blocked tenant ----------------------------


def dstate(tag: str) -> dict:
    """:func:`tenantry.proofs.drr.gstate` plus the count ``sig``."""
    return {**drr.gstate(f"s{tag}"), "sig": int_array(f"dsig_{tag}")}


def drr_inv(dom: Domain, s: dict, P: dict, Y, K, unit: str = "tokens") -> z3.BoolRef:
    """DRR-GAP[tokens]'s invariant with the budget: ``e - pe <= 1 + sig Y`` (Y rounds per
    refill past the tenant; ``pe`` the step's block-second reservations, 0 under
    tokens; under block-seconds ``0 <= pe <= G``: a reservation is part of what the
    tenant owes), the window's books, equal refills, ``0 <= sig <= K``."""
    e, pe, G = s["e"], s["pe"], s["G"]
    resv = (lambda f: pe[f] == 0) if unit == "tokens" else (lambda f: And(pe[f] >= 0, pe[f] <= G[f]))
    one = dom.forall(lambda f: And(
        e[f] - pe[f] <= 1 + ToReal(s["sig"][f]) * Y, resv(f), e[f] - G[f] > -P["K"][f], G[f] >= 0,
        G[f] <= P["K"][f], Implies(Not(s["run"][f]), G[f] == 0), s["sig"][f] >= 0, s["sig"][f] <= K,
        Implies(s["since"][f], And(s["q"][f], e[f] == s["base"][f] + s["R"][f] - s["S"][f],
                                   s["base"][f] <= 1 + ToReal(K) * Y, s["base"][f] > -P["K"][f]))))
    same = dom.forall(lambda f, g: Implies(And(s["since"][f], s["since"][g]), s["R"][f] == s["R"][g]), arity=2)
    return And(one, same)


def drr_need(s: dict, j) -> z3.ArithRef:
    """Rounds that make j positive: ``floor(pe - e) + 1`` (``refill_drr``)."""
    return z3.ToInt(s["pe"][j] - s["e"][j]) + 1


def refill_passes(s: dict, p: dict, j) -> z3.BoolRef:
    """A refill (parameters ``p`` of :func:`tenantry.proofs.drr.refill`) passes over j:
    backlogged, not a candidate, and needing fewer rounds than the refill gives (``drr_skip_pass``)."""
    return And(s["q"][j], p["blk"][j], drr_need(s, j) < p["r"])


def refill_allowed(dom: Domain, s: dict, p: dict, K) -> z3.BoolRef:
    """The skip budget lets the refill go: every tenant it passes over has a count below K."""
    return dom.forall(lambda j: Implies(refill_passes(s, p, j), s["sig"][j] < K))


def drr_setup(dom: Domain, P: dict, Y, K, unit: str = "tokens") -> z3.BoolRef:
    """``K[f] + 1 <= Y`` (Y = D/(q w_min) + 1) and H3': the carry bound holds a tenant
    passed over K times, ``Ce >= 1 + K Y`` (block-seconds: plus the step's
    reservations, at most ``K[f]``)."""
    extra = (lambda f: 0) if unit == "tokens" else (lambda f: P["K"][f])  # noqa: E731
    return And(dom.size >= 1, K >= 0, dom.forall(lambda f: And(P["K"][f] > 0, P["K"][f] + 1 <= Y,
                                                              P["Ce"][f] >= 1 + ToReal(K) * Y + extra(f))))


def drr_obligations(budget: bool = True, unit: str = "tokens") -> list[tuple[str, z3.BoolRef]]:
    """Window opening, consecution (refill without H1, admit with the reset of the count,
    charge (block-seconds: settle), move, end) and the corollaries."""
    dom, P = Domain("N"), drr.params("Pd")
    Y, K = z3.Real("Yd"), Int("Kd")
    bs = unit == "block_seconds"
    setup = drr_setup(dom, P, Y, K, unit)
    inv = lambda st: drr_inv(dom, st, P, Y, K, unit)  # noqa: E731
    out = []
    s0 = dstate("w0")
    open_ = dom.forall(lambda f: And(s0["R"][f] == 0, s0["S"][f] == 0, s0["base"][f] == s0["e"][f],
                                     Implies(s0["since"][f], s0["q"][f])))
    pre0 = dom.forall(lambda f: And(s0["e"][f] <= 1 + ToReal(s0["sig"][f]) * Y, s0["e"][f] - s0["G"][f] > -P["K"][f],
                                    s0["G"][f] >= 0, s0["G"][f] <= P["K"][f], s0["pe"][f] == 0,
                                    s0["sig"][f] >= 0, s0["sig"][f] <= K, Implies(Not(s0["run"][f]), s0["G"][f] == 0)))
    out.append(("open", implies_all([setup, open_, pre0], inv(s0))))
    s = dstate("rf")
    g, post, p = drr.refill(dom, s, P, "drf")
    jj = Int("jdr")
    got = Lambda([jj], z3.If(s["since"][jj], s["R"][jj] + (post["e"][jj] - s["e"][jj]), s["R"][jj]))
    sig = Lambda([jj], z3.If(refill_passes(s, p, jj), s["sig"][jj] + 1, s["sig"][jj]))
    hyps = [setup, inv(s), g]
    if budget:
        hyps.append(refill_allowed(dom, s, p, K))
    out.append(("refill", implies_all(hyps, inv({**drr._with_ghosts(s, post, R=got), "sig": sig}))))
    s = dstate("ad")
    g, post, p = drr.admit(dom, s, "dad", unit)
    i = p["i"]
    since = Store(s["since"], i, And(s["since"][i], Not(p["leave"])))
    S = Store(s["S"], i, s["S"][i] + p["pin"])
    sig = Store(s["sig"], i, z3.If(post["e"][i] <= 1, 0, s["sig"][i]))
    hyps = [setup, inv(s), g, drr.hyp_charge(s, p, P)]
    if bs:  # the reservation (blocks * last_step_s) is part of the new sequence's charges (unit mode)
        hyps.append(p["pp"] <= p["gout"])
    out.append(("admit", implies_all(hyps, inv({**drr._with_ghosts(s, post, S=S, since=since), "sig": sig}))))
    s = dstate("ch")
    g, post, p = drr.settle(dom, s, "dch") if bs else drr.charge(dom, s, "dch")
    S = Store(s["S"], p["i"], s["S"][p["i"]] + p["x"])
    out.append(("settle" if bs else "charge",
                implies_all([setup, inv(s), g], inv({**drr._with_ghosts(s, post, S=S), "sig": s["sig"]}))))
    s = dstate("mv")
    g, post, p = drr.move(dom, s, "dmv")
    since = Store(s["since"], p["i"], And(s["since"][p["i"]], p["qn"]))
    hyps = [setup, inv(s), g]
    if bs:  # nothing leaves between a pick and the settle of its step (phases 4 and 5, SPEC.md 5)
        hyps.append(s["G"][p["i"]] - p["r"] >= s["pe"][p["i"]])
    out.append(("move", implies_all(hyps, inv({**drr._with_ghosts(s, post, since=since), "sig": s["sig"]}))))
    s = dstate("en")
    g, post, p = drr.end(dom, s, "den")
    settled = dom.forall(lambda f: s["pe"][f] == 0)  # every reservation was settled in execute
    out.append(("end", implies_all([setup, inv(s), g, settled],
                                   inv({**drr._with_ghosts(s, post), "sig": s["sig"]}))))
    s = dstate("dcor")
    f = Int("f_ddcor")
    out.append(("deficit", implies_all([setup, inv(s), dom.has(f), s["pe"][f] == 0],
                                       And(s["e"][f] <= 1 + ToReal(K) * Y, s["e"][f] > -P["K"][f]))))
    s = dstate("cor")
    f, h = Int("f_dcor"), Int("g_dcor")
    out.append(("gap", implies_all([setup, inv(s), dom.has(f), dom.has(h), s["since"][f], s["since"][h],
                                    s["pe"][f] == 0, s["pe"][h] == 0],
                                   s["S"][f] - s["S"][h] < 2 + 2 * ToReal(K) * Y + P["K"][f] + P["K"][h])))
    return out


def drr_config(guard_skips: int | None, unit: str = "tokens") -> Config:
    """:func:`twin_config`'s replica under ``drr_tokens`` or ``drr_block_seconds`` (quantum 8,
    unbounded carry; unit cost, so every step lasts 1 s)."""
    c = twin_config(guard_skips)
    return attrs.evolve(c, order=attrs.evolve(c.order, policy=f"drr_{unit}", drr_quantum=drr.QUANTUM,
                                              drr_carry_bound=None))


def _drr_twin(unit: str):
    """Twin ``no-skip-budget`` of DRR-GAP[skips] (``unit``): a refill past a tenant whose count
    is K, without the budget check; replayed on :func:`drr_config`."""
    from tenantry.spec.invariants_core import drr_charge_bound, drr_skip_rounds

    def formula() -> tuple[z3.BoolRef, dict]:
        ref = drr_config(K_TWIN, unit)
        d, q = drr_charge_bound(ref), drr.QUANTUM
        dom, P = Domain("N"), drr.params(f"Pdt{unit}")
        Y, K = z3.RealVal(d / q + 1), z3.IntVal(K_TWIN)
        s = dstate(f"dtw{unit}")
        g, post, p = drr.refill(dom, s, P, f"dtw{unit}", capped=False)
        di, pi = int_array(f"di_dtw{unit}"), Int(f"p_dtw{unit}")
        # decodable: unit weights; t0 a candidate with deficit d0 <= 0 and a 1..4-token head; t1 blocked (its
        # 7-token head refused by the pool), deficit d1, passed over K times, one running sequence owing 2
        # (tokens: its last output token, w_out = 2; block-seconds: its 2 blocks for its last 1 s step); no
        # reservation yet in the step.
        shape = And(dom.size == 2, Not(p["blk"][0]), p["blk"][1], s["q"][0], s["q"][1], s["sig"][1] == K,
                    s["sig"][0] == 0, pi >= 1, pi <= 4, s["G"][0] == 0, s["run"][1], s["G"][1] == z3.Q(2, int(q)),
                    Not(s["run"][0]), dom.forall(lambda f: And(P["K"][f] == d / q, s["e"][f] * q == ToReal(di[f]),
                                                               s["pe"][f] == 0, Not(s["since"][f]))),
                    di[0] <= 0, di[0] >= -40, di[1] <= 64)
        bad = post["e"][1] > drr_skip_rounds(ref, d) + z3.Q(2, int(q))  # survives t1's charge of the step
        f = And(dom.size >= 1, drr_inv(dom, s, P, Y, K, unit), g, shape, bad)
        return f, {"di": di, "p": pi}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        cfg, ref = drr_config(None, unit), drr_config(K_TWIN, unit)
        d0, d1, prompt = val(m, sym["di"][0]), val(m, sym["di"][1]), val(m, sym["p"])
        specs = [TenantSpec(deficit=float(d0), seqs=(SeqSpec(prompt, 1), SeqSpec(1, 1))),
                 TenantSpec(deficit=float(d1), skips=K_TWIN,
                            seqs=(SeqSpec(5, 2, done=1, running=True), SeqSpec(7, 1)))]
        pre = build_state(cfg, specs)
        post, out = step(cfg, pre, StepInput())
        tr = Transition(pre, StepInput(), post, out)
        dd = drr_charge_bound(ref)
        hi = drr.QUANTUM * drr_skip_rounds(ref, dd)
        local = lambda st: [f"t{j}'s deficit {t.deficit:g} is above q * w * (1 + K (D/(q w_min) + 1)) = {hi:g}"  # noqa: E731
                            for j, t in enumerate(st.tenants) if t.deficit > hi + 1e-6]
        facts = {"deficits": [d0, d1], "prompt": prompt, "skips": K_TWIN, "D": dd, "bound": hi,
                 "after": [t.deficit for t in post.tenants]}
        if local(pre):
            return Replay(False, "the decoded pre-state already violates the claim", facts)
        held, held_out = step(ref, pre, StepInput())
        facts["with_budget"] = {"reserved_reason": held_out.reserved_reason,
                                "deficits": [t.deficit for t in held.tenants]}
        if held_out.reserved_reason != "skips" or local(held):
            return Replay(False, f"with guard_skips={K_TWIN} the model did not stop for t1: {facts['with_budget']}",
                          facts)
        ok, detail = verdict(local(post), catalog_state("DRR-DEFICIT", ref, [tr]),
                             f"drr_{unit}, guard_skips=None: t1 (deficit {d1}, passed over {K_TWIN} time(s)) is "
                             f"refused by the pool; the refill that makes t0 (deficit {d0}) positive carries t1 past "
                             f"its bound again (D = {dd:g}; with the budget the step stops filling instead)")
        return Replay(ok, detail, facts)
    return formula, replay


_drr_twin_formula, _drr_twin_replay = _drr_twin("tokens")

DRR_GAP_SKIPS = Proof(
    id="DRR-GAP[skips]", family="drr",
    claim="drr_tokens with refused heads and the skip budget K: deficits <= q*w*(1 + K*(D/(q*w_min) + 1)); two "
          "tenants backlogged over a window: |dS_f/w_f - dS_g/w_g| < 2q + D/w_f + D/w_g + 2K*(D/w_min + q)",
    scope="any N", obligations=drr_obligations,
    twins=(Twin("no-skip-budget", "the skip budget (guard_skips = None: refills past a blocked tenant uncounted)",
                _drr_twin_formula, _drr_twin_replay),),
    hypotheses=("H2: a pick commits at most D (D with M = max_num_seqs * max_context_tokens)",
                "H3': drr_carry_bound >= q * w * (1 + K*(D/(q*w_min) + 1)) for every tenant, or None",
                "no enforced KV or slot cap (a head its own cap refuses is not counted)"))

def _roofline_limit():
    """Limit ``roofline`` of DRR-GAP[skips,block_seconds]: H4 dropped, a step's settle may charge
    less than the step's reservations (``blocks * last_step_s``), as in ``roofline`` mode when a
    step is shorter than the one before it; replayed from the empty replica."""
    from tenantry.model.config import CostConfig, OrderConfig, TenantConfig
    from tenantry.spec.invariants_core import drr_charge_bound, drr_skip_rounds

    def config(mode: str) -> Config:
        cost = (CostConfig(mode="roofline", weight_read_s=0.0, kv_read_s_per_token=1.0, flop_s_per_token=0.0,
                           overhead_s=0.01) if mode == "roofline" else CostConfig(mode="unit"))
        return Config(tenants=(TenantConfig("t0"), TenantConfig("t1")), max_num_seqs=2, token_budget=64,
                      num_blocks=64, max_context_tokens=8, block_size_tokens=4, cost=cost,
                      order=OrderConfig(policy="drr_block_seconds", drr_quantum=drr.QUANTUM, drr_carry_bound=None,
                                        guard_skips=0))

    def formula() -> tuple[z3.BoolRef, dict]:
        dom, P = Domain("N", 1), drr.params("Prl")  # one tenant suffices
        Y, K = z3.Real("Yrl"), z3.IntVal(0)
        s = dstate("rl")
        i, x = Int("i_rl"), z3.Real("x_rl")
        # settle without H4: the step charges x < pe (its reservations), x <= G
        guard = And(dom.has(i), x >= 0, x < s["pe"][i], x <= s["G"][i])
        post = {**s, "e": Store(s["e"], i, s["e"][i] - x), "G": Store(s["G"], i, s["G"][i] - x),
                "pe": Store(s["pe"], i, 0)}
        inv = lambda st: drr_inv(dom, st, P, Y, K, "block_seconds")  # noqa: E731
        return And(drr_setup(dom, P, Y, K, "block_seconds"), inv(s), guard, Not(inv(post))), {}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        reqs = [Request(0, "t1", 0.0, 7, 1), Request(1, "t1", 0.0, 7, 1)] + \
            [Request(2 + j, "t0", 1.0, 1, 1) for j in range(3)]
        out = {}
        for mode in ("roofline", "unit"):
            cfg = config(mode)
            hi = drr.QUANTUM * drr_skip_rounds(cfg, drr_charge_bound(cfg))
            trs = list(run_workload(cfg, reqs, max_steps=20))
            out[mode] = (hi, [(tr.output.step_index, t.deficit) for tr in trs for t in tr.state.tenants[:1]],
                         [tr.output.duration_s for tr in trs])
        hi, deficits, durs = out["roofline"]
        local = [f"t0's deficit {d:g} after step {k} is above q * w * (1 + K (D_bs/(q w_min) + 1)) = {hi:g}"
                 for k, d in deficits if d > hi + 1e-6]
        facts = {"durations_s": durs, "t0_deficits": [d for _, d in deficits],
                 "unit_deficits": [d for _, d in out["unit"][1]], "bound": hi}
        if any(d > out["unit"][0] + 1e-6 for _, d in out["unit"][1]):
            return Replay(False, "the same workload in unit mode already breaks the bound", facts)
        ok, detail = verdict(local, None, f"drr_block_seconds, guard_skips = 0, roofline steps of {durs[0]:g} s then "
                             f"{durs[1]:g} s: t0's two picks reserve 2 blocks * {durs[0]:g} s, a refill tops it up "
                             f"by the rounds that cover them, and the step charges 2 blocks * {durs[1]:g} s (in "
                             "unit mode the same workload ends at "
                             f"{max(d for _, d in out['unit'][1]):g})")
        return Replay(ok, detail, facts)
    return formula, replay


_bf, _br = _drr_twin("block_seconds")
_lf, _lr = _roofline_limit()
DRR_GAP_SKIPS_BS = Proof(
    id="DRR-GAP[skips,block_seconds]", family="drr",
    claim="drr_block_seconds with refused heads and the skip budget K: deficits <= q*w*(1 + K*(D_bs/(q*w_min) + 1)) "
          "at step ends; two tenants backlogged over a window: |dB_f/w_f - dB_g/w_g| < 2q + D_bs/w_f + D_bs/w_g + "
          "2K*(D_bs/w_min + q) (B block-seconds; D_bs = min(P, m*blocks_for(ctx)) * (ctx + floor((m-1)*ctx/budget)) "
          "* unit_step_s)",
    scope="any N", obligations=lambda: drr_obligations(unit="block_seconds"),
    twins=(Twin("no-skip-budget", "the skip budget (guard_skips = None: refills past a blocked tenant uncounted)",
                _bf, _br),
           Twin("roofline", "H4: unit cost mode (a step's settle charges at least its reservations, blocks * "
                "last_step_s)", _lf, _lr, kind="limit")),
    hypotheses=("H2: a pick leaves the tenant owing at most D_bs block-seconds (largest_block_seconds: at most "
                "min(num_blocks, m*blocks_for(ctx)) blocks held per step, for at most ctx + floor((m-1)*ctx/budget) "
                "steps of unit_step_s)",
                "H3'': drr_carry_bound >= q * w * (1 + K*(D_bs/(q*w_min) + 1)) + D_bs for every tenant, or None",
                "H4: unit cost mode, so a step charges a tenant at least its reservations (blocks * last_step_s) and "
                "a reservation is part of what it owes",
                "phase order: nothing leaves the batch between a pick and its step's settle (SPEC.md 5)",
                "no enforced KV or slot cap (a head its own cap refuses is not counted)"))


GAP_SKIPS = Proof(
    id="VTC-GAP[skips]", family=FAMILY,
    claim="with refused heads and the skip budget K: c_f + owed_f <= c_g + D/w_f + skips_g*D/w_min for every f and "
          "backlogged g; so backlogged counters within D/w_f + K*D/w_min, service gaps within D/w_f + D/w_g + "
          "2K*D/w_min",
    scope="any N",
    obligations=obligations,
    twins=(Twin("no-skip-budget", "the skip budget (guard_skips = None: work-conserving past a lower counter)",
                _twin_formula, _twin_replay),),
    hypotheses=("H2: a pick leaves the tenant owing at most D/w (D with M = max_num_seqs * max_context_tokens)",
                "the picked tenant has the least counter among the candidates (no H1: others may be refused)"),
)

PROOFS = (GAP_SKIPS,)
"""Registered after :mod:`tenantry.proofs.vtc`; :data:`FLOOR_SKIPS` after the floors (family ``priority``)."""
