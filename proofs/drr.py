"""DRR over weighted service tokens and over block-seconds: deficit bounds, the
reset of idle tenants, and the service difference of backlogged tenants
(Shreedhar and Varghese, "Efficient Fair Queueing Using Deficit Round Robin",
SIGCOMM 1995, Lemma 2 and Theorem 1; SPEC.md 8.4).

Deficits are normalised by one round's refill: ``e[f] = deficit_f / (q w_f)``
(q the quantum), so one round adds 1 to every backlogged tenant and the carry
bound is ``Ce[f] = C / (q w_f)``.  Per tenant: ``e``, ``pe`` (the provisional
block-second reservations of the current step, normalised), ``G`` (charges
its running sequences still owe, a ghost), ``q`` (backlogged), ``run`` (has a
running sequence), and ``K[f] = D / (q w_f)`` the most a pick can commit.

Transitions (``model/step.py`` and ``refill_drr`` / ``select_drr``):

* ``refill(r)``: no candidate has a positive ``e - pe``; r is the least number
  of rounds after which one has; every *backlogged* tenant gets
  ``min(e + r, Ce)`` (``refill_drr``);
* ``admit(i)``: ``select_drr`` picks a candidate with positive ``e - pe``;
  tokens: ``e -= w_in P / (q w)`` at once; block-seconds: ``pe += blocks *
  last_step_s / (q w)``; the sequence's future charges join ``G``;
* ``charge(i, x)``: output tokens, or the step's block-seconds, move x from
  ``G`` to the deficit;
* ``move(i)``: arrivals, cancellations, evictions, finishes: queue and running
  change, ``G`` may drop;
* ``end``: the step ends: provisional reservations lapse, and (with
  ``drr_reset_when_idle``) a touched tenant with nothing queued or running
  gets deficit 0.
"""

from __future__ import annotations

import z3
from z3 import And, Implies, Int, Lambda, Not, Real, Store, ToInt, ToReal

from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.step import step
from tenantry.model.workload import Request, StepInput
from tenantry.runner.simulate import simulate

from .checks import EPS, catalog_history, catalog_state, verdict
from .concrete import SeqSpec, TenantSpec, Transition, build_state, run_workload
from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array, real_array, val, zmin

FAMILY = "drr"
UNITS = ("tokens", "block_seconds")


def dstate(tag: str) -> dict:
    """Fresh symbolic DRR state."""
    return {"e": real_array(f"e_{tag}"), "pe": real_array(f"pe_{tag}"), "G": real_array(f"G_{tag}"),
            "q": bool_array(f"q_{tag}"), "run": bool_array(f"run_{tag}")}


def params(tag: str) -> dict:
    """Per-tenant constants: carry bound Ce and pick bound K (normalised)."""
    return {"Ce": real_array(f"Ce_{tag}"), "K": real_array(f"K_{tag}")}


def deficit_inv(dom: Domain, s: dict, P: dict, unit: str, capped: bool = True) -> z3.BoolRef:
    """DRR-DEFICIT's invariant: below the carry bound, above -K once owed charges are counted."""
    e, pe, G, run = s["e"], s["pe"], s["G"], s["run"]

    def one(f):
        parts = [e[f] - G[f] > -P["K"][f], G[f] >= 0, G[f] <= P["K"][f], pe[f] >= 0, Implies(Not(run[f]), G[f] == 0)]
        if capped:
            parts.append(e[f] <= P["Ce"][f])
        if unit == "tokens":
            parts.append(pe[f] == 0)
        return And(*parts)
    return dom.forall(one)


def _setup(dom: Domain, P: dict) -> z3.BoolRef:
    return And(dom.size >= 1, dom.forall(lambda f: And(P["Ce"][f] >= 0, P["K"][f] > 0)))


def _times_w(x, w):
    """x * w for a weight known to be 1 or 2 (keeps the formula linear)."""
    return z3.If(w == 1, x, 2 * x)


def refill(dom: Domain, s: dict, P: dict, tag: str, capped: bool = True, need=None) -> tuple[z3.BoolRef, dict, dict]:
    """``refill_drr``: no candidate is positive; r rounds (the least making one
    positive, witness k) go to every backlogged tenant, capped at Ce.  ``need(j)``:
    the rounds that make j positive, ``floor(pe - e) + 1`` (a test plants another)."""
    e, pe, q = s["e"], s["pe"], s["q"]
    r, k, blk = Int(f"r_{tag}"), Int(f"k_{tag}"), bool_array(f"blk_{tag}")
    cand = lambda j: And(q[j], Not(blk[j]))  # noqa: E731
    if need is None:
        need = lambda j: ToInt(pe[j] - e[j]) + 1  # noqa: E731  floor(pe - e) + 1 rounds make j positive
    guard = And(dom.has(k), cand(k), r == need(k), r >= 1,
                dom.forall(lambda j: Implies(cand(j), And(e[j] - pe[j] <= 0, r <= need(j)))))
    grown = lambda j: zmin(e[j] + ToReal(r), P["Ce"][j]) if capped else e[j] + ToReal(r)  # noqa: E731
    j = z3.Int(f"j_{tag}")
    post = {**s, "e": Lambda([j], z3.If(q[j], grown(j), e[j]))}
    return guard, post, {"r": r, "k": k, "blk": blk}


def admit(dom: Domain, s: dict, tag: str, unit: str) -> tuple[z3.BoolRef, dict, dict]:
    """``select_drr`` picks candidate i with positive ``e - pe``; ``_admit_head`` charges it."""
    e, pe, G, q, run = s["e"], s["pe"], s["G"], s["q"], s["run"]
    i, pin, gout, pp, leave = Int(f"i_{tag}"), Real(f"pin_{tag}"), Real(f"gout_{tag}"), Real(f"pp_{tag}"), \
        z3.Bool(f"leave_{tag}")
    blk = bool_array(f"blk_{tag}")
    guard = And(dom.has(i), q[i], Not(blk[i]), e[i] - pe[i] > 0, pin >= 0, gout >= 0, pp >= 0,
                pin == 0 if unit == "block_seconds" else pp == 0)
    post = {"e": Store(e, i, e[i] - pin), "pe": Store(pe, i, pe[i] + pp), "G": Store(G, i, G[i] + gout),
            "q": Store(q, i, Not(leave)), "run": Store(run, i, True)}
    return guard, post, {"i": i, "pin": pin, "gout": gout, "pp": pp, "leave": leave, "blk": blk}


def charge(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """Tenant i's running sequences are charged x (tokens produced, or block-seconds held)."""
    e, G = s["e"], s["G"]
    i, x = Int(f"i_{tag}"), Real(f"x_{tag}")
    return And(dom.has(i), x >= 0, x <= G[i]), {**s, "e": Store(e, i, e[i] - x), "G": Store(G, i, G[i] - x)}, \
        {"i": i, "x": x}


def move(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """Tenant i's queue or batch changes without a charge (arrival, cancel, evict, finish)."""
    G, q, run = s["G"], s["q"], s["run"]
    i, r, qn, rn = Int(f"i_{tag}"), Real(f"r_{tag}"), z3.Bool(f"qn_{tag}"), z3.Bool(f"rn_{tag}")
    guard = And(dom.has(i), r >= 0, r <= G[i], Implies(Not(rn), G[i] - r == 0))
    return guard, {**s, "G": Store(G, i, G[i] - r), "q": Store(q, i, qn), "run": Store(run, i, rn)}, \
        {"i": i, "r": r, "qn": qn, "rn": rn}


def end(dom: Domain, s: dict, tag: str, reset: bool = True) -> tuple[z3.BoolRef, dict, dict]:
    """The step ends: reservations lapse; touched idle tenants lose their deficit."""
    e, q, run = s["e"], s["q"], s["run"]
    touched = bool_array(f"touched_{tag}")
    j = z3.Int(f"j_{tag}")
    idle = And(Not(q[j]), Not(run[j]))
    new_e = Lambda([j], z3.If(And(touched[j], idle), 0, e[j])) if reset else e
    return z3.BoolVal(True), {**s, "e": new_e, "pe": z3.K(z3.IntSort(), z3.RealVal(0))}, {"touched": touched}


def hyp_charge(s: dict, p: dict, P: dict) -> z3.BoolRef:
    """H2: after a pick the tenant owes at most K (its prompt plus what its running sequences will be charged)."""
    return p["pin"] + s["G"][p["i"]] + p["gout"] <= P["K"][p["i"]]


def deficit_obligations(unit: str):
    def build() -> list[tuple[str, z3.BoolRef]]:
        dom, P = Domain("N"), params("P")
        out = []
        s0 = dstate("init")
        init = dom.forall(lambda f: And(s0["e"][f] == 0, s0["pe"][f] == 0, s0["G"][f] == 0, Not(s0["run"][f]),
                                        Not(s0["q"][f])))
        setup = And(_setup(dom, P), dom.forall(lambda f: P["Ce"][f] >= 0))
        out.append(("init", implies_all([setup, init], deficit_inv(dom, s0, P, unit))))
        for name in ("refill", "admit", "charge", "move", "end"):
            s = dstate(name)
            if name == "refill":
                g, post, p = refill(dom, s, P, name)
            elif name == "admit":
                g, post, p = admit(dom, s, name, unit)
            elif name == "charge":
                g, post, p = charge(dom, s, name)
            elif name == "move":
                g, post, p = move(dom, s, name)
            else:
                g, post, p = end(dom, s, name)
            hyps = [setup, deficit_inv(dom, s, P, unit), g]
            if name == "admit":
                hyps.append(hyp_charge(s, p, P))
            out.append((name, implies_all(hyps, deficit_inv(dom, post, P, unit))))
        return out
    return build


# --- DRR-RESET: a whole step, seen from its end ------------------------------------------


def reset_inv(dom: Domain, s: dict) -> z3.BoolRef:
    return dom.forall(lambda f: Implies(And(Not(s["q"][f]), Not(s["run"][f])), s["e"][f] == 0))


def step_havoc(dom: Domain, s: dict, tag: str, reset: bool) -> tuple[z3.BoolRef, dict, dict]:
    """One step: touched tenants' deficit, queue and batch change arbitrarily, the
    others not at all; then ``end`` runs."""
    mid = dstate(f"mid_{tag}")
    touched = bool_array(f"touched_{tag}")
    same = dom.forall(lambda f: Implies(Not(touched[f]), And(mid["e"][f] == s["e"][f], mid["q"][f] == s["q"][f],
                                                               mid["run"][f] == s["run"][f])))
    j = z3.Int(f"jj_{tag}")
    idle = And(touched[j], Not(mid["q"][j]), Not(mid["run"][j]))
    new_e = Lambda([j], z3.If(idle, 0, mid["e"][j])) if reset else mid["e"]
    return same, {**mid, "e": new_e}, {"mid": mid, "touched": touched}


def reset_obligations() -> list[tuple[str, z3.BoolRef]]:
    dom = Domain("N")
    s = dstate("rs")
    g, post, _ = step_havoc(dom, s, "rs", reset=True)
    s0 = dstate("rs0")
    init = dom.forall(lambda f: And(s0["e"][f] == 0, Not(s0["q"][f]), Not(s0["run"][f])))
    return [("init", implies_all([dom.size >= 1, init], reset_inv(dom, s0))),
            ("step", implies_all([dom.size >= 1, reset_inv(dom, s), g], reset_inv(dom, post)))]


# --- DRR-GAP (tokens): backlogged tenants' normalised service ---------------------------


def gstate(tag: str) -> dict:
    return {**dstate(tag), "since": bool_array(f"since_{tag}"), "base": real_array(f"base_{tag}"),
            "R": real_array(f"R_{tag}"), "S": real_array(f"S_{tag}")}


def gap_inv(dom: Domain, s: dict, P: dict, unit: str = "tokens") -> z3.BoolRef:
    """Deficits in (-K, 1] (block-seconds: ``e - pe <= 1``, the step's reservations
    counted) and, for tenants backlogged since the window opened, ``e = base + R - S``
    with equal refills R."""
    e, pe, G = s["e"], s["pe"], s["G"]
    upper = (lambda f: And(e[f] <= 1, pe[f] == 0)) if unit == "tokens" else (lambda f: And(e[f] - pe[f] <= 1, pe[f] >= 0))
    one = dom.forall(lambda f: And(
        upper(f), e[f] - G[f] > -P["K"][f], G[f] >= 0, G[f] <= P["K"][f],
        Implies(Not(s["run"][f]), G[f] == 0),
        Implies(s["since"][f], And(s["q"][f], e[f] == s["base"][f] + s["R"][f] - s["S"][f], s["base"][f] <= 1,
                                   s["base"][f] > -P["K"][f]))))
    same = dom.forall(lambda f, g: Implies(And(s["since"][f], s["since"][g]), s["R"][f] == s["R"][g]), arity=2)
    return And(one, same)


def _with_ghosts(pre: dict, post: dict, R=None, S=None, since=None) -> dict:
    return {**post, "since": pre["since"] if since is None else since, "base": pre["base"],
            "R": pre["R"] if R is None else R, "S": pre["S"] if S is None else S}


def settle(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """Block-seconds, end of ``execute``: tenant i is charged x for the blocks it
    held, at least its reservations of the step (H4), which then lapse."""
    e, pe, G = s["e"], s["pe"], s["G"]
    i, x = Int(f"i_{tag}"), Real(f"x_{tag}")
    guard = And(dom.has(i), x >= pe[i], x <= G[i])
    return guard, {**s, "e": Store(e, i, e[i] - x), "G": Store(G, i, G[i] - x), "pe": Store(pe, i, 0)}, {"i": i, "x": x}


def gap_obligations(unit: str = "tokens"):
    """Window opening, consecution, and the corollary, for ``unit``."""
    def build() -> list[tuple[str, z3.BoolRef]]:
        dom, P = Domain("N"), params("P")
        setup = And(dom.size >= 1, dom.forall(lambda f: And(P["K"][f] > 0, P["Ce"][f] >= 1)))
        inv = lambda st: gap_inv(dom, st, P, unit)  # noqa: E731
        out = []
        # The window opens at a step end, in any state within the deficit bounds and with e <= 1.
        s0 = gstate("w0")
        open_ = dom.forall(lambda f: And(s0["R"][f] == 0, s0["S"][f] == 0, s0["base"][f] == s0["e"][f],
                                         Implies(s0["since"][f], s0["q"][f])))
        pre0 = dom.forall(lambda f: And(s0["e"][f] <= 1, s0["e"][f] - s0["G"][f] > -P["K"][f], s0["G"][f] >= 0,
                                        s0["G"][f] <= P["K"][f], s0["pe"][f] == 0,
                                        Implies(Not(s0["run"][f]), s0["G"][f] == 0)))
        out.append(("open", implies_all([setup, open_, pre0], inv(s0))))
        # refill under H1 (every backlogged tenant a candidate) and H3 (carry bound >= one round)
        s = gstate("rf")
        g, post, p = refill(dom, s, P, "rf")
        h1 = dom.forall(lambda j: Implies(s["q"][j], Not(p["blk"][j])))
        # H3 for block-seconds: the carry bound also covers the step's reservations
        h3 = dom.forall(lambda j: Implies(s["q"][j], s["pe"][j] + 1 <= P["Ce"][j]))
        jj = Int("jr")
        got = Lambda([jj], z3.If(s["since"][jj], s["R"][jj] + (post["e"][jj] - s["e"][jj]), s["R"][jj]))
        out.append(("refill", implies_all([setup, inv(s), g, h1, h3], inv(_with_ghosts(s, post, R=got)))))
        s = gstate("ad")
        g, post, p = admit(dom, s, "ad", unit)
        since = Store(s["since"], p["i"], And(s["since"][p["i"]], Not(p["leave"])))
        S = Store(s["S"], p["i"], s["S"][p["i"]] + p["pin"])
        out.append(("admit", implies_all([setup, inv(s), g, hyp_charge(s, p, P)],
                                         inv(_with_ghosts(s, post, S=S, since=since)))))
        s = gstate("ch")
        g, post, p = charge(dom, s, "ch") if unit == "tokens" else settle(dom, s, "ch")
        S = Store(s["S"], p["i"], s["S"][p["i"]] + p["x"])
        out.append(("charge" if unit == "tokens" else "settle",
                    implies_all([setup, inv(s), g], inv(_with_ghosts(s, post, S=S)))))
        s = gstate("mv")
        g, post, p = move(dom, s, "mv")
        since = Store(s["since"], p["i"], And(s["since"][p["i"]], p["qn"]))
        out.append(("move", implies_all([setup, inv(s), g], inv(_with_ghosts(s, post, since=since)))))
        s = gstate("en")
        g, post, p = end(dom, s, "en")
        settled = dom.forall(lambda f: s["pe"][f] == 0)  # block-seconds: every reservation was settled
        out.append(("end", implies_all([setup, inv(s), g, settled], inv(_with_ghosts(s, post)))))
        s = gstate("cor")
        f, h = Int("f_cor"), Int("g_cor")
        out.append(("gap", implies_all([setup, inv(s), dom.has(f), dom.has(h), s["since"][f], s["since"][h],
                                        s["pe"][f] == 0, s["pe"][h] == 0],
                                       s["S"][f] - s["S"][h] < 2 + P["K"][f] + P["K"][h])))
        return out
    return build


# --- replays -----------------------------------------------------------------------------

QUANTUM = 8.0


def replay_config(weights: tuple[float, ...], policy: str, carry: float | None, reset: bool,
                  max_num_seqs: int = 4, caps: tuple[int | None, ...] | None = None) -> Config:
    cs = caps or (None,) * len(weights)
    return Config(tenants=tuple(TenantConfig(f"t{j}", weight=w, kv_block_cap=cs[j]) for j, w in enumerate(weights)),
                  max_num_seqs=max_num_seqs, token_budget=64, num_blocks=64, max_context_tokens=8,
                  order=OrderConfig(policy=policy, w_in=1.0, w_out=2.0, drr_quantum=QUANTUM, drr_carry_bound=carry,
                                    drr_reset_when_idle=reset),
                  cost=CostConfig(mode="unit"))


def _weights_shape(dom: Domain, w: z3.ArrayRef) -> z3.BoolRef:
    return And(dom.size >= 2, dom.size <= 3, dom.forall(lambda f: z3.Or(w[f] == 1, w[f] == 2)))


def _carry_twin(unit: str):
    policy = "drr_tokens" if unit == "tokens" else "drr_block_seconds"

    def formula() -> tuple[z3.BoolRef, dict]:
        dom, P = Domain("N"), params("cw")
        s = dstate("cw")
        g, post, p = refill(dom, s, P, "cw", capped=False)
        w, d = real_array("w_cw"), int_array("d_cw")
        v = Int("v_cw")
        # decodable: weights 1 or 2, carry bound C = q (Ce = 1/w), integral deficits, nothing
        # blocked, no provisional charge; after the step's own charges (at most 3 = a 1-token
        # prompt and one output token) the tenant is still above C.
        shape = And(_weights_shape(dom, w), dom.forall(lambda f: And(
            P["Ce"][f] == z3.If(w[f] == 1, z3.RealVal(1), z3.Q(1, 2)), _times_w(s["e"][f] * QUANTUM, w[f]) == ToReal(d[f]),
            d[f] >= -20, d[f] <= 8,
            Not(p["blk"][f]), s["pe"][f] == 0, s["G"][f] == 0, Not(s["run"][f]), P["K"][f] == 4)),
            dom.has(v), _times_w(post["e"][v] * QUANTUM, w[v]) > QUANTUM + 3)
        f = And(dom.size >= 1, deficit_inv(dom, s, P, unit), g, shape)
        return f, {"dom": dom, "s": s, "w": w, "d": d, "v": v, "p": p}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        n = val(m, sym["dom"].size)
        ws = tuple(float(val(m, sym["w"][j])) for j in range(n))
        cfg = replay_config(ws, policy, carry=None, reset=False)
        ref = replay_config(ws, policy, carry=QUANTUM, reset=True)
        specs = [TenantSpec(deficit=float(val(m, sym["d"][j])),
                            seqs=(SeqSpec(1, 1),) if val(m, sym["s"]["q"][j]) else ()) for j in range(n)]
        pre = build_state(cfg, specs)
        post, out = step(cfg, pre, StepInput())
        tr = Transition(pre, StepInput(), post, out)
        local = [f"t{j}'s deficit {t.deficit:g} exceeds the carry bound {QUANTUM:g}" for j, t in enumerate(post.tenants)
                 if t.deficit > QUANTUM + EPS]
        ok, detail = verdict(local, catalog_state("DRR-DEFICIT", ref, [tr]),
                             f"{policy}, drr_carry_bound=None, weights {ws}, deficits {[t.deficit for t in pre.tenants]}")
        return Replay(ok, detail, {"weights": ws, "deficits_before": [t.deficit for t in pre.tenants],
                                   "deficits_after": [t.deficit for t in post.tenants]})
    return formula, replay


def _reset_twin():
    def formula() -> tuple[z3.BoolRef, dict]:
        dom = Domain("N")
        s = dstate("rt")
        g, post, p = step_havoc(dom, s, "rt", reset=False)
        d, v = int_array("d_rt"), Int("v_rt")
        mid = p["mid"]
        # decodable: tenant v runs its last token this step (charged w_out = 2, normalised by q w = 8)
        # and ends idle with a deficit left; the others stay as they were.
        shape = And(dom.size >= 1, dom.size <= 3, dom.has(v), p["touched"][v], Not(s["q"][v]), s["run"][v],
                    Not(mid["q"][v]), Not(mid["run"][v]), s["e"][v] * QUANTUM == ToReal(d[v]), d[v] >= 3, d[v] <= 8,
                    mid["e"][v] == s["e"][v] - z3.Q(2, int(QUANTUM)),
                    dom.forall(lambda f: Implies(f != v, Not(p["touched"][f]))),
                    dom.forall(lambda f: And(Implies(f != v, And(Not(s["run"][f]), s["e"][f] == 0)))))
        bad = Not(reset_inv(dom, post))
        return And(dom.size >= 1, reset_inv(dom, s), g, shape, bad), {"dom": dom, "s": s, "d": d, "v": v}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        n, v = val(m, sym["dom"].size), val(m, sym["v"])
        cfg = replay_config((1.0,) * n, "drr_tokens", carry=QUANTUM, reset=False)
        ref = replay_config((1.0,) * n, "drr_tokens", carry=QUANTUM, reset=True)
        dv = float(val(m, sym["d"][v]))
        specs = [TenantSpec(deficit=dv, seqs=(SeqSpec(1, 1, running=True),)) if j == v else TenantSpec()
                 for j in range(n)]
        pre = build_state(cfg, specs)
        post, out = step(cfg, pre, StepInput())
        tr = Transition(pre, StepInput(), post, out)
        local = [f"t{j} is idle with deficit {t.deficit:g}" for j, t in enumerate(post.tenants)
                 if not t.queue and t.running == 0 and abs(t.deficit) > EPS]
        ok, detail = verdict(local, catalog_state("NO-BANKED-CREDIT", ref, [tr]),
                             f"drr_reset_when_idle=False, t{v} finishes its last request holding deficit {dv:g}")
        return Replay(ok, detail, {"tenant": f"t{v}", "deficit_before": dv, "deficit_after": post.tenants[v].deficit})
    return formula, replay


def service_gap_violations(config: Config, transitions: list[Transition], d: float,
                           field: str = "service") -> list[str]:
    """DRR-GAP over a run: for two tenants backlogged at every step end of a
    stretch, |dS_f/w_f - dS_g/w_g| <= 2q + D/w_f + D/w_g, S the tenant's
    ``field`` (``service``: weighted tokens; ``block_seconds``)."""
    q, names = config.order.drr_quantum, [t.name for t in config.tenants]
    out = []
    n = len(names)
    for a in range(n):
        for b in range(a + 1, n):
            wa, wb = config.tenants[a].weight, config.tenants[b].weight
            bound = 2 * q + d / wa + d / wb
            lo = hi = None
            for tr in transitions:
                ts = tr.state.tenants
                if not (ts[a].queue and ts[b].queue):
                    lo = hi = None
                    continue
                x = getattr(ts[a], field) / wa - getattr(ts[b], field) / wb
                lo = x if lo is None else min(lo, x)
                hi = x if hi is None else max(hi, x)
                if hi - lo > bound + EPS:
                    return [f"normalised {field} gap of {names[a]} and {names[b]} moved by {hi - lo:g} while both "
                            f"were backlogged, more than 2q + D/w_a + D/w_b = {bound:g}"]
    return out


def block_seconds_bound(config: Config, requests) -> float:
    """D for block-seconds under ample KV and a budget that serves every running
    sequence each step: a pick commits at most max_num_seqs sequences each holding
    blocks_for(prompt + output) blocks for ceil(prompt / budget) + output steps."""
    per = max(config.blocks_for(r.total_tokens) * (-(-r.prompt_tokens // config.token_budget) + r.output_tokens)
              for r in requests)
    return config.max_num_seqs * per * config.cost.unit_step_s


def _gap_twin(unit: str):
    policy = "drr_tokens" if unit == "tokens" else "drr_block_seconds"

    def formula() -> tuple[z3.BoolRef, dict]:
        dom, P = Domain("N"), params("gt")
        s = gstate("gt")
        g, post, p = refill(dom, s, P, "gt")
        jj = Int("jgt")
        got = Lambda([jj], z3.If(s["since"][jj], s["R"][jj] + (post["e"][jj] - s["e"][jj]), s["R"][jj]))
        h1 = dom.forall(lambda j: Implies(s["q"][j], Not(p["blk"][j])))
        w = real_array("w_gt")
        # decodable: weights 1 or 2 and the carry bound C = q (Ce = 1/w): valid, since C >= q.
        shape = And(_weights_shape(dom, w), w[0] == 1, w[1] == 2,
                    dom.forall(lambda f: P["Ce"][f] == z3.If(w[f] == 1, z3.RealVal(1), z3.Q(1, 2))))
        setup = And(dom.size >= 1, dom.forall(lambda f: P["K"][f] > 0))
        inv = lambda st: gap_inv(dom, st, P, unit)  # noqa: E731
        f = And(setup, inv(s), g, h1, shape, Not(inv(_with_ghosts(s, post, R=got))))
        return f, {"dom": dom, "w": w}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        n = val(m, sym["dom"].size)
        ws = tuple(float(val(m, sym["w"][j])) for j in range(n))
        if len(set(ws)) == 1:
            return Replay(False, f"equal weights {ws}: a carry bound >= q cuts nothing")
        cfg = replay_config(ws, policy, carry=QUANTUM, reset=True, max_num_seqs=1)
        ref = replay_config(ws, policy, carry=None, reset=True, max_num_seqs=1)
        reqs = [Request(1000 * j + k, f"t{j}", 0.0, 1, 1) for j in range(n) for k in range(200)]
        trs = list(run_workload(cfg, reqs, max_steps=300))
        field = "service" if unit == "tokens" else "block_seconds"
        d = _charge_bound(cfg) if unit == "tokens" else block_seconds_bound(cfg, reqs)
        catalog = catalog_history("DRR-DEFICIT", ref, simulate(cfg, reqs, max_steps=300)) if unit == "tokens" else None
        ok, detail = verdict(service_gap_violations(cfg, trs, d, field), catalog,
                             f"{policy}, weights {ws}, drr_carry_bound = quantum = {QUANTUM:g} < q*w, "
                             "200 requests each")
        return Replay(ok, detail, {"weights": ws, "carry_bound": QUANTUM, "D": d,
                                   field: [getattr(t, field) for t in trs[-1].state.tenants]})
    return formula, replay


def _charge_bound(config: Config) -> float:
    from .vtc import charge_bound
    return charge_bound(config)


def _proofs() -> tuple[Proof, ...]:
    out = []
    for unit in UNITS:
        f, r = _carry_twin(unit)
        out.append(Proof(
            id=f"DRR-DEFICIT[{unit}]", family=FAMILY,
            claim="deficit <= carry bound C, and deficit - owed > -D (a pick needs a positive deficit and commits <= D)",
            scope="any N", obligations=deficit_obligations(unit),
            twins=(Twin("unbounded-carry", "the carry bound (drr_carry_bound=None, drr_reset_when_idle=False)", f, r),),
            hypotheses=("H2: a pick leaves the tenant owing at most D (prompt, remaining output / block-seconds)",)))
    f, r = _reset_twin()
    out.append(Proof(
        id="DRR-RESET", family=FAMILY,
        claim="at every step end a tenant with nothing queued or running has deficit 0 (no banked credit)",
        scope="any N", obligations=reset_obligations,
        twins=(Twin("no-reset", "the idle reset (drr_reset_when_idle=False)", f, r),)))
    for unit in UNITS:
        f, r = _gap_twin(unit)
        hyps = ("H1: at a refill no backlogged tenant is blocked (no head refused: ample KV)",
                "H2: a pick commits at most D (tokens: D of SPEC 8.2; block-seconds: a stated bound D_bs)",
                "H3: drr_carry_bound >= q * w for every tenant (block-seconds: plus the step's reservations), or None")
        if unit == "block_seconds":
            hyps += ("H4: a step charges a tenant at least its reservations (unit cost mode)",)
        out.append(Proof(
            id=f"DRR-GAP[{unit}]", family=FAMILY,
            claim="two tenants backlogged over a window: |dS_f/w_f - dS_g/w_g| < 2q + D/w_f + D/w_g",
            scope="any N", obligations=gap_obligations(unit),
            twins=(Twin("carry-below-round", "a carry bound of at least one round (C < q*w is allowed by the config)",
                        f, r),),
            hypotheses=hyps))
    return tuple(out)


PROOFS = _proofs()
