"""Bounded wait: under ``fcfs`` with ample KV, a queued request is first scheduled
within a number of steps fixed by the configuration (BOUNDED-WAIT, SPEC.md 8.12).

The model has no deadline mechanism: ``max_wait_s`` is a promise the model
does not read.  What can be proved is that a policy keeps a promise that is
large enough.  The argument is a ranking function.  For a request r waiting
fresh in its queue, let ``mu`` be the work still owed to the requests
admitted before it, ``rem(s) = prompt + output - 1 - computed`` summed over
those still queued or running (``computed`` reaches ``prompt + output - 1``
when the last token is sampled).  Under ``fcfs`` with ample KV (hypothesis
H1 of 8.2: no eviction, no stall, every head fits):

* an arrival is admitted after r and does not count; a cancellation or a
  finish only removes work; an ``admit`` keeps ``rem`` (a prefix-cache hit
  lowers it);
* the pick is the least fcfs key among the candidates, r's tenant is one
  (H1) and its key is at most r's admission number (the queue invariant of
  8.11), so anything admitted while r waits is r or older than r; hence
  every running sequence is older than r (invariant R);
* a step that does not schedule r computes at least one token of an older
  sequence: a running sequence gets ``min(target - computed, budget) >= 1``
  tokens, or, with none running, the waiting phase admits an older head
  (``rem`` drops by the chunk at ``execute``).

So ``mu`` drops by at least one per step while r waits, and r is first
scheduled within ``mu_0`` steps of its admission.  With every tenant's queue
bounded, ``mu_0 <= (max_num_seqs + sum_j queue_bound_j - 1) *
(max_context_tokens - 1)`` (QUEUE-BOUND counts the fresh queued requests; r
is one of them), and r waits at most ``(mu_0 + 1)`` steps of at most
``step_s_max`` seconds (one more for the step under way when r arrives).  The
sum over sequences is a ghost kept by construction: each obligation checks
that an action moves ``mu`` by exactly the change of the sequence it touches.

Twin ``strict-priority`` (``policy=priority``): a later request of a higher
tier enters the batch while r waits, so invariant R fails and a flood of it
delays r past any bound.  Limit ``pool-pressure`` (H1 dropped): under fcfs a
head that does not fit blocks only its tenant, and later small requests of
others keep the pool full.
"""

from __future__ import annotations

import z3
from z3 import And, If, Implies, Int, Not, Store

from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig
from tenantry.runner.simulate import simulate
from tenantry.model.policies import step_s_max  # noqa: F401  (re-exported: proofs.wait.step_s_max)
from tenantry.model.workload import Request

from . import order
from .checks import EPS, catalog_history, verdict
from .concrete import run_workload
from .core import Domain, Proof, Replay, Twin, implies_all, int_array

FAMILY = "wait"


def wstate(tag: str) -> dict:
    """The queue state of 8.11 plus ``rem`` per sequence and the ghost ``mu``."""
    return {**order.qstate(tag), "rem": int_array(f"rem_{tag}"), "mu": Int(f"mu_{tag}")}


def older(s: dict, x, r) -> z3.BoolRef:
    return And(order.alive(s, x), s["sq"][x] < s["sq"][r])


def contrib(s: dict, x, r) -> z3.ArithRef:
    """x's part of ``mu``: its remaining work if it was admitted before r."""
    return If(older(s, x, r), s["rem"][x], 0)


def winv(dom: Domain, s: dict, r) -> z3.BoolRef:
    """r waits fresh; every running sequence is older than r; the work left of each is >= 0
    (so ``mu``, the ghost sum of the contributions, is >= 0)."""
    return And(order.queue_inv(dom, s), dom.has(r), s["q"][r], s["fr"][r],
               dom.forall(lambda x: And(Implies(s["run"][x], s["sq"][x] < s["sq"][r]),
                                        Implies(order.alive(s, x), s["rem"][x] >= 0))))


def moved_by(dom: Domain, s: dict, post: dict, x, r) -> z3.BoolRef:
    """The action touched only x (rem, status), and mu moved by x's change of contribution."""
    return And(post["mu"] - s["mu"] == contrib(post, x, r) - contrib(s, x, r),
               dom.forall(lambda y: Implies(y != x, And(post["rem"][y] == s["rem"][y],
                                                        order.alive(post, y) == order.alive(s, y),
                                                        post["sq"][y] == s["sq"][y]))))


def obligations(policy: str = "fcfs") -> list[tuple[str, z3.BoolRef]]:
    dom, r = Domain("S"), Int("waiter_w")
    out = []
    base = lambda s: [dom.size >= 1, winv(dom, s, r)]  # noqa: E731
    # arrive: admitted after r, so it owes r nothing
    s = wstate("w_arr")
    g, post, p = order.actions(dom, s, "w_arr")["arrive"]
    w, mu1 = Int("w_arr_rem"), Int("w_arr_mu")
    post = {**post, "rem": Store(s["rem"], p["x"], w), "mu": mu1}
    out.append(("arrive", implies_all(base(s) + [g, w >= 1, mu1 == s["mu"] + contrib(post, p["x"], r)],
                                      And(winv(dom, post, r), mu1 == s["mu"]))))
    # admit under the pick of ``policy``; r's tenant is a candidate (H1: nothing is blocked)
    s = wstate("w_adm")
    gp, pk = order.pick(dom, s, "w_adm", policy)
    x = pk["r"]  # the admitted sequence is the picked tenant's first ready one
    cut = Int("w_adm_cut")  # tokens a prefix-cache hit spares
    post = {**s, "q": Store(s["q"], x, False), "run": Store(s["run"], x, True), "fr": Store(s["fr"], x, False),
            "rem": Store(s["rem"], x, s["rem"][x] - cut), "mu": s["mu"] - If(older(s, x, r), cut, 0)}
    out.append(("admit", implies_all(base(s) + [gp, pk["cand"][s["ten"][r]], x != r, cut >= 0, cut <= s["rem"][x]],
                                     And(winv(dom, post, r), moved_by(dom, s, post, x, r)))))
    # compute: a running sequence gets n >= 1 of its remaining tokens (execute)
    s = wstate("w_cmp")
    y, n = Int("w_cmp_y"), Int("w_cmp_n")
    post = {**s, "rem": Store(s["rem"], y, s["rem"][y] - n), "mu": s["mu"] - n}
    out.append(("compute", implies_all(base(s) + [dom.has(y), s["run"][y], n >= 1, n <= s["rem"][y]],
                                       And(winv(dom, post, r), moved_by(dom, s, post, y, r),
                                           post["mu"] <= s["mu"] - 1))))
    # leave: finish (rem = 0), cancellation, rejection: r stays (or its wait ended otherwise)
    s = wstate("w_lv")
    g, post, p = order.actions(dom, s, "w_lv")["leave"]
    post = {**post, "mu": s["mu"] - contrib(s, p["x"], r)}
    out.append(("leave", implies_all(base(s) + [g, p["x"] != r], And(winv(dom, post, r),
                                                                       moved_by(dom, s, post, p["x"], r)))))
    s = wstate("w_tick")
    g, post, _ = order.actions(dom, s, "w_tick")["tick"]
    out.append(("tick", implies_all(base(s) + [g], winv(dom, {**post, "rem": s["rem"], "mu": s["mu"]}, r))))
    # progress: the first entry of a step's batch takes min(target - computed, budget) >= 1 tokens of a
    # sequence that is running (older than r) or was just admitted (older than r, or r itself)
    s = wstate("w_prog")
    e, tgt, comp, M = Int("w_e"), Int("w_tgt"), Int("w_comp"), Int("w_M")
    n = z3.If(tgt - comp < M, tgt - comp, M)
    out.append(("progress", implies_all(base(s) + [dom.has(e), s["run"][e], M >= 1, tgt > comp],
                                        And(n >= 1, s["sq"][e] < s["sq"][r]))))
    return out


# --- the bound, and the replays ----------------------------------------------------------


def wait_bound_steps(config: Config) -> int | None:
    """``mu_0``'s bound: ``(max_num_seqs + sum_j queue_bound_j - 1) * (max_context_tokens - 1)``
    steps, or None when some tenant's queue is unbounded (no bound exists then)."""
    bounds = [t.queue_bound for t in config.tenants]
    if not config.admission.queue_bound or any(b is None for b in bounds):
        return None
    return (config.max_num_seqs + sum(bounds) - 1) * (config.max_context_tokens - 1)


def wait_bound_s(config: Config) -> float | None:
    """The wait BOUNDED-WAIT can promise under fcfs with ample KV (seconds): ``(mu_0 + 1)`` steps."""
    n = wait_bound_steps(config)
    return None if n is None else (n + 1) * step_s_max(config)


def wait_config(policy: str, max_wait_s: float | None = None, num_blocks: int = 64, ctx: int = 2) -> Config:
    """``hi`` (tier 0) and ``lo`` (tier 1, promised ``max_wait_s``), queue bounds of 1, one slot,
    unit steps of 1 s."""
    return Config(tenants=(TenantConfig("hi", tier=0, queue_bound=1),
                           TenantConfig("lo", tier=1, queue_bound=1, max_wait_s=max_wait_s)),
                  max_num_seqs=1, token_budget=64, num_blocks=num_blocks, max_context_tokens=ctx,
                  order=OrderConfig(policy=policy), cost=CostConfig(mode="unit"))


def pressure_config(max_wait_s: float | None) -> Config:
    """fcfs on a 4-block pool (not ample): ``hi`` (queue bound 2) and ``lo`` (queue bound 1,
    promised ``max_wait_s``), two slots, contexts up to 48 tokens, unit steps of 1 s."""
    return Config(tenants=(TenantConfig("hi", queue_bound=2), TenantConfig("lo", queue_bound=1, max_wait_s=max_wait_s)),
                  max_num_seqs=2, token_budget=64, num_blocks=4, max_context_tokens=48,
                  order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"))


def late_starts(config: Config, transitions, bound_s: float) -> list[str]:
    """Local predicate: a request of a tenant with a ``max_wait_s`` waited longer than
    ``bound_s`` (seconds) to be first scheduled (or still waits, with the run past the bound)."""
    promised = {t.name for t in config.tenants if t.max_wait_s is not None}
    arrival, first, end = {}, {}, 0.0
    for tr in transitions:
        for r in tr.inputs.arrivals:
            if r.tenant in promised:
                arrival[r.request_id] = r.arrival_s
        for s in tuple(tr.state.sequences()) + tuple(tr.output.finished):
            if s.first_scheduled_s is not None:
                first.setdefault(s.request_id, s.first_scheduled_s)
        end = tr.state.t_s
    for rid, a in sorted(arrival.items()):
        waited = first.get(rid, end) - a
        if waited > bound_s + EPS:
            return [f"request {rid} waited {waited:g} s to be first scheduled, more than the bound {bound_s:g} s"]
    return []


def _priority_twin():
    def formula() -> tuple[z3.BoolRef, dict]:
        dom, r = Domain("S", 2), Int("waiter_wt")
        s = wstate("wt")
        gp, pk = order.pick(dom, s, "wt", "priority")
        x = pk["r"]
        shape = And(r == 1, s["ten"][0] == 0, s["ten"][1] == 1, pk["tier"][0] == 0, pk["tier"][1] == 1)
        # the admitted request is younger than r: invariant R breaks
        return And(winv(dom, s, r), gp, pk["cand"][s["ten"][r]], x != r, shape,
                   s["sq"][x] > s["sq"][r]), {"sq": s["sq"]}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        ref = wait_config("fcfs")
        bound = wait_bound_s(ref)
        ref = wait_config("fcfs", bound)
        cfg = wait_config("priority", bound)
        n = int(3 * bound) + 2
        reqs = [Request(0, "lo", 0.0, 1, 1)] + [Request(1 + j, "hi", float(j), 1, 1) for j in range(n)]
        trs = list(run_workload(cfg, reqs, max_steps=200))
        h = simulate(cfg, reqs, max_steps=200)
        ok, detail = verdict(late_starts(ref, trs, bound), catalog_history("BOUNDED-WAIT", ref, h),
                             f"policy=priority, lo promised the fcfs bound {bound:g} s, hi sends one request per "
                             f"second for {n} s")
        return Replay(ok, detail, {"bound_s": bound, "tier0_requests": n})
    return formula, replay


def _pressure_limit():
    def formula() -> tuple[z3.BoolRef, dict]:
        dom, r = Domain("S", 2), Int("waiter_wl")
        s = wstate("wl")
        gp, pk = order.pick(dom, s, "wl", "fcfs")
        x = pk["r"]
        shape = And(r == 0, s["ten"][0] == 0, s["ten"][1] == 1)
        # H1 dropped: r's tenant is blocked (its head does not fit), a later request enters the batch
        return And(winv(dom, s, r), gp, Not(pk["cand"][s["ten"][r]]), x != r, shape,
                   s["sq"][x] > s["sq"][r]), {}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        # a 4-block pool: lo's 47-token prompt needs 3 blocks; hi's 17-token requests (2 blocks each, 6
        # steps) arrive every 3 s, so one always runs and the next always fits in the other 2 blocks
        bound = wait_bound_s(pressure_config(None))
        cfg = pressure_config(bound)
        n = int(bound / 3) + 4
        reqs = [Request(0, "hi", 0.0, 17, 6), Request(1, "lo", 0.0, 47, 1)] + \
            [Request(2 + j, "hi", 1.0 + 3.0 * j, 17, 6) for j in range(n)]
        trs = list(run_workload(cfg, reqs, max_steps=4 * n + 50))
        h = simulate(cfg, reqs, max_steps=4 * n + 50)
        ok, detail = verdict(late_starts(cfg, trs, bound), catalog_history("BOUNDED-WAIT", cfg, h),
                             f"fcfs on a 4-block pool: lo's 3-block head waits while {n} later 2-block requests "
                             f"of hi keep fitting (bound {bound:g} s)")
        return Replay(ok, detail, {"bound_s": bound, "hi_requests": n})
    return formula, replay


_pf, _pr = _priority_twin()
_lf, _lr = _pressure_limit()
BOUNDED_WAIT = Proof(
    id="BOUNDED-WAIT", family=FAMILY,
    claim="under fcfs with ample KV the work owed to older requests drops by >= 1 token per step while r waits, "
          "so r starts within (mu_0 + 1) steps; mu_0 <= (max_num_seqs + sum queue bounds - 1)(context - 1)",
    scope="any N (sequences, tenants), one step", obligations=obligations,
    twins=(Twin("strict-priority", "the arrival order (policy priority instead of fcfs)", _pf, _pr),
           Twin("pool-pressure", "H1 (ample KV): a head that does not fit blocks only its tenant", _lf, _lr,
                kind="limit")),
    hypotheses=("H1 ample KV: no eviction, no stall, every head fits (so r's tenant is always a candidate)",
                "every tenant's queue is bounded (else mu_0 has no bound)",
                "max_wait_s >= (mu_0 + 1) * step_s_max: the model does not read max_wait_s"))

PROOFS = (BOUNDED_WAIT,)
