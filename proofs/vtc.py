"""VTC: the counter spread among backlogged tenants, the service gap, and no
banked credit (Sheng et al., "Fairness in Serving Large Language Models",
OSDI 2024, Algorithm 2 and Theorem 4.4; SPEC.md 8.3).

State per tenant f (Z3 arrays over the tenant index, any number of tenants):
``c[f]`` the counter, ``q[f]`` backlogged (non-empty queue), ``G[f]`` the
output charge its running sequences still owe (``w_out / w_f`` times their
remaining output tokens: a ghost the model does not store), and ``ll`` the
counter of the last tenant whose queue emptied.  ``U[f] = D / w_f`` with D the
largest charge a tenant can receive after its last pick (SPEC.md 8.2).

Transitions, one per way ``model/step.py`` changes these (each a
subject-verb action; the step is a sequence of them):

* ``join(i, r)``: tenant i's queue goes from empty to non-empty (an arrival,
  or an eviction giving back a sequence that owed r): ``_on_backlogged``
  lifts ``c[i]`` to the least counter of the other backlogged tenants, or to
  ``ll`` when none is backlogged;
* ``admit(i)``: the pick ``select_vtc`` makes among the candidates (backlogged,
  not blocked) and ``_admit_head`` + ``_charge_prompt``: ``c[i] += w_in P / w_i``
  for a first scheduling, and the sequence's output charge joins ``G[i]``; if
  the queue empties, ``ll`` becomes ``c[i]``;
* ``output(i, x)``: ``_charge_output``: tokens produced move x from ``G[i]`` to ``c[i]``;
* ``drop(i, r)``: a cancellation, a finish, or an ``evicted_too_often``
  rejection: ``G[i] -= r``, and the queue may empty.

The invariant (any N): for every tenant f and backlogged g,
``c[f] + G[f] <= c[g] + U[f]``, and when nobody is backlogged,
``c[f] + G[f] <= ll + U[f]``.  Hence the state form of VTC-GAP (backlogged
counters within ``D / w`` of each other) and the history form (the
normalised service of two tenants backlogged over an interval differs by at
most ``D / w_f + D / w_g``, 2D for unit weights).
"""

from __future__ import annotations

import z3
from z3 import And, Implies, Int, Not, Real, Store, ToReal

from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.step import step
from tenantry.model.workload import Request, StepInput

from .checks import catalog_state, no_banked_credit, verdict, vtc_spread
from .concrete import SeqSpec, TenantSpec, Transition, build_state
from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array, real_array, val, zmax

FAMILY = "vtc"


# --- encoding ------------------------------------------------------------------------


def vstate(tag: str) -> dict:
    """Fresh symbolic VTC state named after ``tag``."""
    return {"c": real_array(f"c_{tag}"), "q": bool_array(f"q_{tag}"), "G": real_array(f"G_{tag}"),
            "ll": Real(f"ll_{tag}")}


def invariant(dom: Domain, s: dict, U: z3.ArrayRef) -> z3.BoolRef:
    """VTC-GAP's inductive invariant over ``dom`` (see the module docstring)."""
    c, q, G, ll = s["c"], s["q"], s["G"], s["ll"]
    spread = dom.forall(lambda f, g: Implies(q[g], c[f] + G[f] <= c[g] + U[f]), arity=2)
    idle = Implies(dom.forall(lambda g: Not(q[g])), dom.forall(lambda f: c[f] + G[f] <= ll + U[f]))
    owed = dom.forall(lambda f: And(G[f] >= 0, G[f] <= U[f]))
    return And(spread, idle, owed)


def join(dom: Domain, s: dict, tag: str, lift: bool = True) -> tuple[z3.BoolRef, dict, dict]:
    """Tenant i's queue goes from empty to non-empty; ``_on_backlogged`` lifts its counter.

    Returns (guard, post-state, parameters).  ``lo`` is the least counter of the
    other backlogged tenants (witness ``k``) or ``ll`` when there are none.
    """
    c, q, G, ll = s["c"], s["q"], s["G"], s["ll"]
    i, k, r, lo, other = Int(f"i_{tag}"), Int(f"k_{tag}"), Real(f"r_{tag}"), Real(f"lo_{tag}"), z3.Bool(f"o_{tag}")
    least = And(dom.has(k), k != i, q[k], lo == c[k],
                dom.forall(lambda j: Implies(And(j != i, q[j]), c[k] <= c[j])))
    alone = And(dom.forall(lambda j: Implies(j != i, Not(q[j]))), lo == ll)
    guard = And(dom.has(i), Not(q[i]), r >= 0, r <= G[i], z3.If(other, least, alone))
    new_c = zmax(c[i], lo) if lift else c[i]
    post = {"c": Store(c, i, new_c), "q": Store(q, i, True), "G": Store(G, i, G[i] - r), "ll": ll}
    return guard, post, {"i": i, "k": k, "r": r, "lo": lo, "other": other}


def admit(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """``select_vtc`` picks candidate i (least counter among backlogged, unblocked
    tenants) and ``_admit_head`` moves its sequence into the batch: ``c[i] += pin``
    (the prompt charge, 0 for a readmitted sequence), the sequence's output
    charge ``gout`` joins ``G[i]``; the queue may empty (``leave``)."""
    c, q, G, ll = s["c"], s["q"], s["G"], s["ll"]
    i, pin, gout, leave = Int(f"i_{tag}"), Real(f"pin_{tag}"), Real(f"gout_{tag}"), z3.Bool(f"leave_{tag}")
    blk = bool_array(f"blk_{tag}")
    guard = And(dom.has(i), q[i], Not(blk[i]), pin >= 0, gout >= 0,
                dom.forall(lambda j: Implies(And(q[j], Not(blk[j])), c[i] <= c[j])))
    ci = c[i] + pin
    post = {"c": Store(c, i, ci), "q": Store(q, i, Not(leave)), "G": Store(G, i, G[i] + gout),
            "ll": z3.If(leave, ci, ll)}
    return guard, post, {"i": i, "pin": pin, "gout": gout, "leave": leave, "blk": blk}


def output(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """``_charge_output``: tenant i's running sequences produce tokens charged x."""
    c, G = s["c"], s["G"]
    i, x = Int(f"i_{tag}"), Real(f"x_{tag}")
    guard = And(dom.has(i), x >= 0, x <= G[i])
    return guard, {**s, "c": Store(c, i, c[i] + x), "G": Store(G, i, G[i] - x)}, {"i": i, "x": x}


def drop(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """A sequence of tenant i leaves (cancelled, finished, or rejected
    ``evicted_too_often``): it owed r; a queued one may empty the queue (a
    cancellation), which raises ``ll`` to ``c[i]`` and never lowers it."""
    c, q, G, ll = s["c"], s["q"], s["G"], s["ll"]
    i, r, leave = Int(f"i_{tag}"), Real(f"r_{tag}"), z3.Bool(f"leave_{tag}")
    guard = And(dom.has(i), r >= 0, r <= G[i], Implies(leave, q[i]))
    post = {"c": c, "q": Store(q, i, And(q[i], Not(leave))), "G": Store(G, i, G[i] - r),
            "ll": z3.If(leave, zmax(ll, c[i]), ll)}
    return guard, post, {"i": i, "r": r, "leave": leave}


def hyp_least(dom: Domain, s: dict, p: dict) -> z3.BoolRef:
    """H1: the picked tenant's counter is least among *all* backlogged tenants
    (true when no head is refused: ample KV, no cap, no cooldown)."""
    c, q = s["c"], s["q"]
    return dom.forall(lambda j: Implies(q[j], c[p["i"]] <= c[j]))


def hyp_charge(s: dict, p: dict, U: z3.ArrayRef) -> z3.BoolRef:
    """H2: after a pick, the prompt charge plus everything the tenant's running
    sequences still owe is at most ``U[i] = D / w_i``."""
    return p["pin"] + s["G"][p["i"]] + p["gout"] <= U[p["i"]]


def _setup(dom: Domain, U: z3.ArrayRef) -> z3.BoolRef:
    return And(dom.size >= 1, dom.forall(lambda f: U[f] >= 0))


def gap_obligations() -> list[tuple[str, z3.BoolRef]]:
    """Initiation, consecution for every transition, and the service-gap corollary."""
    dom, U = Domain("N"), real_array("U")
    out = []
    s0 = vstate("init")
    init = And(dom.forall(lambda f: And(s0["c"][f] == 0, s0["G"][f] == 0, Not(s0["q"][f]))), s0["ll"] == 0)
    out.append(("init", implies_all([_setup(dom, U), init], invariant(dom, s0, U))))
    for name, act in (("join", join), ("admit", admit), ("output", output), ("drop", drop)):
        s = vstate(name)
        guard, post, p = act(dom, s, name)
        hyps = [_setup(dom, U), invariant(dom, s, U), guard]
        if name == "admit":
            hyps += [hyp_least(dom, s, p), hyp_charge(s, p, U)]
        out.append((name, implies_all(hyps, invariant(dom, post, U))))
    # Corollary: two tenants backlogged at t1 and t2 and throughout (no lift in between,
    # so the counter grew by exactly the normalised service): the gap is <= U_f + U_g.
    s1, s2 = vstate("t1"), vstate("t2")
    f, g = Int("f_gap"), Int("g_gap")
    ds = lambda x: s2["c"][x] - s1["c"][x]  # noqa: E731
    hyps = [_setup(dom, U), invariant(dom, s1, U), invariant(dom, s2, U), dom.has(f), dom.has(g),
            s1["q"][f], s1["q"][g], s2["q"][f], s2["q"][g]]
    out.append(("gap", implies_all(hyps, ds(f) - ds(g) <= U[f] + U[g])))
    return out


def credit_obligations() -> list[tuple[str, z3.BoolRef]]:
    """NO-BANKED-CREDIT: a joining tenant's counter ends at least at the least
    backlogged counter (or at ``ll`` when the backlog was empty)."""
    dom = Domain("N")
    s = vstate("nbc")
    guard, post, p = join(dom, s, "nbc")
    return [("join", implies_all([dom.size >= 1, guard], post["c"][p["i"]] >= p["lo"]))]


# --- replays ---------------------------------------------------------------------------

T_MAX = 8  # max_context_tokens of the replay configurations


def replay_config(n: int, lift: bool, max_num_seqs: int = 1, weights: tuple[float, ...] | None = None,
                  caps: tuple[int | None, ...] | None = None) -> Config:
    """The small replica counterexamples are replayed on (unit cost, tiny contexts)."""
    ws = weights or (1.0,) * n
    cs = caps or (None,) * n
    return Config(tenants=tuple(TenantConfig(f"t{j}", weight=ws[j], kv_block_cap=cs[j]) for j in range(n)),
                  max_num_seqs=max_num_seqs, token_budget=64, num_blocks=64, max_context_tokens=T_MAX,
                  order=OrderConfig(policy="vtc", w_in=1.0, w_out=2.0, lift=lift), cost=CostConfig(mode="unit"))


def charge_bound(config: Config) -> float:
    """D for a configuration: min(w_in L + w_out M, max(w_in, w_out) M), L the
    longest prompt (max_context_tokens - 1) and M the most tokens one batch can
    reach, min(num_blocks * B, max_num_seqs * max_context_tokens) (SPEC.md 8.2)."""
    o = config.order
    m = min(config.num_blocks * config.block_size_tokens, config.max_num_seqs * config.max_context_tokens)
    lp = min(config.max_context_tokens - 1, m)
    return min(o.w_in * lp + o.w_out * m, max(o.w_in, o.w_out) * m)


def _decodable(dom: Domain, s: dict, U: z3.ArrayRef, d: float, tag: str) -> tuple[z3.BoolRef, dict]:
    """Shape constraints that make a model replayable on :func:`replay_config`:
    2-3 tenants, unit weights, integral counters, exactly one running sequence
    (it fills the one-sequence batch, so the step admits nothing), owing
    ``2 * r`` (r output tokens at w_out = 2)."""
    ci, r, lli = int_array(f"ci_{tag}"), int_array(f"r_{tag}"), Int(f"lli_{tag}")
    c, G = s["c"], s["G"]
    one = dom.forall(lambda f, g: Implies(And(r[f] >= 1, r[g] >= 1), f == g), arity=2)
    shape = And(dom.size >= 2, dom.size <= 3,
                dom.forall(lambda f: And(U[f] == d, c[f] == ToReal(ci[f]), ci[f] >= 0, ci[f] <= 200,
                                         G[f] == 2 * ToReal(r[f]), r[f] >= 0, r[f] <= T_MAX - 1)),
                dom.exists(lambda f: r[f] >= 1), one, s["ll"] == ToReal(lli), lli >= 0)
    return shape, {"ci": ci, "r": r, "lli": lli}


def _specs(m: z3.ModelRef, sym: dict, n: int) -> list[TenantSpec]:
    s = sym["pre"]
    out = []
    for j in range(n):
        seqs = []
        if val(m, s["q"][j]):
            seqs.append(SeqSpec(prompt=1, output=1))
        rj = val(m, sym["r"][j])
        if rj >= 1:
            seqs.append(SeqSpec(prompt=1, output=rj, running=True))
        out.append(TenantSpec(counter=float(val(m, s["c"][j])), seqs=tuple(seqs)))
    return out


def _join_twin_formula(goal: str) -> tuple[z3.BoolRef, dict]:
    """Join without the lift; ``goal`` is ``spread`` (two backlogged counters more
    than D apart afterwards) or ``credit`` (the joiner below the least)."""
    dom, U = Domain("N"), real_array("U")
    d = charge_bound(replay_config(2, lift=True))
    s = vstate("tw")
    guard, post, p = join(dom, s, "tw", lift=False)
    shape, extra = _decodable(dom, s, U, d, "tw")
    # The rest of the replayed step charges at most one output token (w_out = 2) to each
    # tenant: the violation must survive it.
    if goal == "spread":
        vf, vg = Int("vf"), Int("vg")
        bad = And(dom.has(vf), dom.has(vg), post["q"][vf], post["q"][vg], post["c"][vf] - post["c"][vg] > U[vf] + 2)
    else:
        bad = post["c"][p["i"]] < p["lo"] - 2
    f = And(_setup(dom, U), invariant(dom, s, U), guard, p["r"] == 0, shape, bad)
    return f, {"dom": dom, "pre": s, "p": p, **extra}


def _join_replay(goal: str):
    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        n, i = val(m, sym["dom"].size), val(m, sym["p"]["i"])
        cfg, ref = replay_config(n, lift=False), replay_config(n, lift=True)
        pre = build_state(cfg, _specs(m, sym, n), last_left_counter=float(val(m, sym["lli"])))
        arrival = Request(1000, f"t{i}", 0.0, 1, 1)
        post, out = step(cfg, pre, StepInput(arrivals=(arrival,)))
        tr = Transition(pre, StepInput(arrivals=(arrival,)), post, out)
        facts = {"tenants": n, "joiner": f"t{i}", "counters": [t.counter for t in pre.tenants],
                 "backlogged": [bool(t.queue) for t in pre.tenants], "last_left": pre.last_left_counter}
        if goal == "spread":
            d = charge_bound(ref)
            ok, detail = verdict(vtc_spread(ref, post, d), catalog_state("VTC-GAP", ref, [tr]),
                                 f"lift=False, t{i} joins at counter {pre.tenants[i].counter:g}")
        else:
            ok, detail = verdict(no_banked_credit(ref, tr), catalog_state("NO-BANKED-CREDIT", ref, [tr]),
                                 f"lift=False, t{i} joins at counter {pre.tenants[i].counter:g}")
        if ok and vtc_spread(ref, pre, charge_bound(ref)) and goal == "spread":
            return Replay(False, "the decoded pre-state already violates the claim", facts)
        return Replay(ok, detail, facts)
    return replay


def _skip_blocked_formula() -> tuple[z3.BoolRef, dict]:
    """H1 dropped: the least-counter tenant's head is refused (its KV cap), the model
    skips it and charges the next candidate."""
    dom, U = Domain("N"), real_array("U")
    cfg = replay_config(2, lift=True, max_num_seqs=2, caps=(None, 1))
    d = charge_bound(cfg)
    s = vstate("sb")
    guard, post, p = admit(dom, s, "sb")
    ci, r, pi = int_array("ci_sb"), int_array("r_sb"), Int("p_sb")
    i = p["i"]
    # decodable: tenant 0 picks one 1..7-token prompt while tenant 1 (the least, backlogged, blocked by
    # its cap, with one running sequence owing r tokens) waits; unit weights, w_out = 2.
    shape = And(dom.size == 2, i == 0, Not(p["leave"]), p["blk"][1], s["q"][1], p["pin"] == ToReal(pi), pi >= 1, pi <= 7,
                p["gout"] == 2, s["G"][0] == 0, r[1] >= 1, r[1] <= 6, s["G"][1] == 2 * ToReal(r[1]),
                dom.forall(lambda f: And(U[f] == d, s["c"][f] == ToReal(ci[f]), ci[f] >= 0, ci[f] <= 100)))
    bad = post["c"][0] - post["c"][1] > U[0] + 2  # survives tenant 1's output token
    f = And(_setup(dom, U), invariant(dom, s, U), guard, hyp_charge(s, p, U), shape, bad)
    return f, {"ci": ci, "r": r, "p": pi, "d": d}


def _skip_blocked_replay(m: z3.ModelRef, sym: dict) -> Replay:
    cfg = replay_config(2, lift=True, max_num_seqs=2, caps=(None, 1))
    c0, c1, r1, prompt = (val(m, sym["ci"][0]), val(m, sym["ci"][1]), val(m, sym["r"][1]), val(m, sym["p"]))
    pre = build_state(cfg, [TenantSpec(counter=float(c0), seqs=(SeqSpec(prompt, 1), SeqSpec(1, 1))),
                            TenantSpec(counter=float(c1), seqs=(SeqSpec(1, r1 + 1, done=1, running=True),
                                                                SeqSpec(1, 1)))])
    post, out = step(cfg, pre, StepInput())
    tr = Transition(pre, StepInput(), post, out)
    d = charge_bound(cfg)
    ok, detail = verdict(vtc_spread(cfg, post, d), catalog_state("VTC-GAP", cfg, [tr]),
                         f"t1 (counter {c1}) is least but its KV cap refuses its head; t0 (counter {c0}) is charged "
                         f"{prompt} instead")
    if vtc_spread(cfg, pre, d):
        return Replay(False, "the decoded pre-state already violates the claim")
    return Replay(ok, detail, {"counters": [c0, c1], "prompt": prompt, "D": d})


GAP = Proof(
    id="VTC-GAP",
    family=FAMILY,
    claim="c_f + owed_f <= c_g + D/w_f for every tenant f and backlogged g; so backlogged counters stay within "
          "D/w and service gaps within D/w_f + D/w_g",
    scope="any N",
    obligations=gap_obligations,
    twins=(Twin("no-lift", "the counter lift (OrderConfig(lift=False))",
                lambda: _join_twin_formula("spread"), _join_replay("spread")),
           Twin("skip-blocked", "H1: the model skips a refused least-counter head and charges the next tenant "
                "(the paper's artifact stops instead)", _skip_blocked_formula, _skip_blocked_replay, kind="limit")),
    hypotheses=("H1: the picked tenant has the least counter among all backlogged tenants (no head refused)",
                "H2: a pick leaves the tenant owing at most D/w (prompt charge + remaining output charge)"),
)

CREDIT = Proof(
    id="NO-BANKED-CREDIT",
    family=FAMILY,
    claim="a tenant that becomes backlogged starts at >= the least backlogged counter (or the last leaver's)",
    scope="any N, one step",
    obligations=credit_obligations,
    twins=(Twin("no-lift", "the counter lift (OrderConfig(lift=False))",
                lambda: _join_twin_formula("credit"), _join_replay("credit")),),
)

PROOFS = (GAP, CREDIT)
