"""The starvation guard drains the pool for an overdue head (GUARD, SPEC.md 8.14).

Without the guard, a queue head that does not fit blocks only its own tenant
(work conservation, 4.3), and later small requests of others can keep the
pool full forever: 8.12's limit ``pool-pressure`` replays a 3-block head that
waits 205 s while 2-block requests of another tenant keep fitting.  With the
guard (``guard_steps`` K or ``guard_wait_s`` W), once the head r is overdue
and, within its own caps, does not fit, the waiting phase admits nothing.

The claim is a ranking function over the running sequences.  Per sequence x
(any number of them): ``run[x]``, ``rem[x]`` (tokens it still has to compute,
``prompt + output - 1 - computed`` at most), ``blk[x]`` (blocks it holds);
ghosts kept by construction (each action moves them by exactly the change of
the sequence it touches): ``U`` the blocks held by running sequences, ``nrun``
their number and ``mu = sum over running of (rem + 1)``; the pool ``P``, its
free blocks ``F``, and r's need ``need`` (its first chunk at the whole budget,
``1 <= need <= P`` since a request that can never fit is refused ``too_large``).
Invariant: ``F + U = P``, ``U, F, nrun >= 0``, ``rem, blk >= 0`` and a sequence
that does not run holds no block.  Two facts about the sums come from
KV-CONSERVE (proved in 8.8) and are hypotheses here: a running sequence holds
at most ``U`` (``blk[y] <= U``), and with nothing running ``U = 0``.  ``mu`` is
a sum of terms ``rem + 1 >= 1``, so it is at least ``nrun``; each obligation
checks that an action moves it by exactly the change of the sequence it
touches.

While r is reserved for (``need > F``):

* ``admit`` is disabled: its guard is the model's, and it requires that no
  overdue head within its caps lacks room (``guard_reservation`` returns None);
* ``compute`` (a running sequence gets ``n >= 1`` of its tokens and ``a >= 0``
  new blocks, ``a <= F``) drops ``mu`` by n (the chunk that samples its last
  token is a compute to ``rem = 0`` followed by ``leave``);
* ``evict`` (a running sequence back to its queue, releasing its blocks) and
  ``leave`` (finish, cancellation, rejection) drop ``mu`` by ``rem + 1 >= 1``;
* ``arrive`` queues a request: no running sequence changes;
* ``progress``: a step with a running sequence computes a token of one or
  evicts one (the running phase gives the first of them ``min(rem + 1,
  budget) >= 1`` tokens, or it stalls only by evicting, 4.5).

So ``mu`` drops by at least one per step while r is refused; when no sequence
runs, ``U = 0``, so ``F = P >= need`` and r is no longer refused (corollary).
The reservation therefore lasts at most ``mu_0 <= max_num_seqs *
max_context_tokens`` steps (each running sequence has fewer than
``max_context_tokens`` tokens left).

Twin ``no-guard`` (``guard_steps = None``): an admission while r is refused
is possible; replayed on 8.12's pool-pressure workload, r waits 205 s, more
than K + mu_0 + 2 steps, and the catalog's GUARD (judged as if the guard were
claimed) names the admissions past the overdue head.
"""

from __future__ import annotations

import attrs
import z3
from z3 import And, If, Implies, Int, Not, Store

from tenantry.model.config import Config
from tenantry.model.workload import Request
from tenantry.runner.simulate import simulate

from .checks import catalog_state, verdict
from .concrete import run_workload
from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array
from .wait import late_starts, pressure_config

FAMILY = "guard"


def gstate(tag: str) -> dict:
    """Symbolic state: per sequence ``run``, ``q``, ``rem``, ``blk``; the pool and the ghosts."""
    return {"run": bool_array(f"grun_{tag}"), "q": bool_array(f"gq_{tag}"), "rem": int_array(f"grem_{tag}"),
            "blk": int_array(f"gblk_{tag}"), "U": Int(f"gU_{tag}"), "F": Int(f"gF_{tag}"), "P": Int(f"gP_{tag}"),
            "nrun": Int(f"gnrun_{tag}"), "mu": Int(f"gmu_{tag}"), "need": Int(f"gneed_{tag}")}


def ginv(dom: Domain, s: dict) -> z3.BoolRef:
    """The invariant of the module docstring."""
    return And(s["F"] + s["U"] == s["P"], s["U"] >= 0, s["F"] >= 0, s["nrun"] >= 0, s["need"] >= 1,
               s["need"] <= s["P"],
               dom.forall(lambda x: And(s["rem"][x] >= 0, s["blk"][x] >= 0, Not(And(s["run"][x], s["q"][x])),
                                        Implies(Not(s["run"][x]), s["blk"][x] == 0))))


def refused(s: dict) -> z3.BoolRef:
    """r, overdue and within its own caps, does not fit: the guard reserves."""
    return s["need"] > s["F"]


def same_others(dom: Domain, s: dict, post: dict, x) -> z3.BoolRef:
    """Every sequence but x is unchanged."""
    return dom.forall(lambda y: Implies(y != x, And(post["run"][y] == s["run"][y], post["q"][y] == s["q"][y],
                                                    post["rem"][y] == s["rem"][y], post["blk"][y] == s["blk"][y])))


def _drop(dom: Domain, s: dict, x, tag: str, to_queue: bool) -> dict:
    """x leaves the batch (evicted back to its queue, or ended), releasing its blocks."""
    return {**s, "run": Store(s["run"], x, False), "q": Store(s["q"], x, to_queue),
            "blk": Store(s["blk"], x, 0), "U": s["U"] - s["blk"][x], "F": s["F"] + s["blk"][x],
            "nrun": s["nrun"] - 1, "mu": s["mu"] - s["rem"][x] - 1}


def obligations(guarded: bool = True) -> list[tuple[str, z3.BoolRef]]:
    """Consecution of the invariant and the drop of ``mu`` for every action while r is
    refused; ``guarded=False`` is the twin's admit (no guard)."""
    dom = Domain("S")
    out = []
    base = lambda s: [dom.size >= 1, ginv(dom, s), refused(s)]  # noqa: E731
    # admit: a queued sequence x would enter with a >= 1 blocks (a <= F).  The model's guard: no
    # admission while the reserved head is refused (``guard_reservation`` is not None).
    s = gstate("adm")
    x, a = Int("gx_adm"), Int("ga_adm")
    allowed = Not(refused(s)) if guarded else z3.BoolVal(True)
    out.append(("admit", implies_all(base(s) + [dom.has(x), s["q"][x], a >= 1, a <= s["F"]], Not(allowed))))
    # compute: running y gets n >= 1 of its remaining tokens and a >= 0 new blocks from the free ones
    # (the chunk that samples its last token is this with n = rem, followed by ``leave``)
    s = gstate("cmp")
    y, n, a = Int("gy_cmp"), Int("gn_cmp"), Int("ga_cmp")
    post = {**s, "rem": Store(s["rem"], y, s["rem"][y] - n), "blk": Store(s["blk"], y, s["blk"][y] + a),
            "U": s["U"] + a, "F": s["F"] - a, "mu": s["mu"] - n}
    out.append(("compute", implies_all(base(s) + [dom.has(y), s["run"][y], n >= 1, n <= s["rem"][y],
                                                  a >= 0, a <= s["F"]],
                                       And(ginv(dom, post), post["mu"] <= s["mu"] - 1,
                                           same_others(dom, s, post, y)))))
    # evict: y back to its queue, its blocks released
    s = gstate("ev")
    y = Int("gy_ev")
    post = _drop(dom, s, y, "ev", True)
    out.append(("evict", implies_all(base(s) + [dom.has(y), s["run"][y], s["U"] >= s["blk"][y], s["nrun"] >= 1],
                                     And(ginv(dom, post), post["mu"] <= s["mu"] - 1, same_others(dom, s, post, y)))))
    # leave: finish, cancellation or rejection of a running sequence
    s = gstate("lv")
    y = Int("gy_lv")
    post = _drop(dom, s, y, "lv", False)
    out.append(("leave", implies_all(base(s) + [dom.has(y), s["run"][y], s["U"] >= s["blk"][y], s["nrun"] >= 1],
                                     And(ginv(dom, post), post["mu"] <= s["mu"] - 1))))
    # arrive: a new request joins a queue; nothing running changes
    s = gstate("arr")
    x = Int("gx_arr")
    post = {**s, "q": Store(s["q"], x, True), "rem": Store(s["rem"], x, Int("gw_arr")), "blk": Store(s["blk"], x, 0)}
    out.append(("arrive", implies_all(base(s) + [dom.has(x), Not(s["run"][x]), Not(s["q"][x]), Int("gw_arr") >= 0],
                                      And(ginv(dom, post), post["mu"] == s["mu"]))))
    # progress: a running sequence's chunk min(rem + 1, budget) >= 1 token
    s = gstate("prog")
    y, M = Int("gy_prog"), Int("gM_prog")
    n = If(s["rem"][y] + 1 < M, s["rem"][y] + 1, M)
    out.append(("progress", implies_all(base(s) + [dom.has(y), s["run"][y], M >= 1], n >= 1)))
    # corollary: with nothing running no block is held (KV-CONSERVE, 8.8: U = 0), the pool is free
    # and r fits, so the reservation ends
    s = gstate("end")
    out.append(("drained", implies_all([dom.size >= 1, ginv(dom, s), s["nrun"] == 0, s["U"] == 0],
                                       Not(refused(s)))))
    return out


def _mu_bound_steps(config: Config) -> int:
    """``mu_0``'s bound: ``max_num_seqs * max_context_tokens`` steps."""
    return config.max_num_seqs * config.max_context_tokens


def guard_config(guard_steps: int | None, max_wait_s: float | None = None) -> Config:
    """8.12's pool-pressure replica (fcfs, a 4-block pool, two slots) with the guard."""
    c = pressure_config(max_wait_s)
    return attrs.evolve(c, order=attrs.evolve(c.order, guard_steps=guard_steps))


def _no_guard_twin():
    K = 3

    def formula() -> tuple[z3.BoolRef, dict]:
        dom = Domain("S", 2)
        s = gstate("tw")
        x, a = Int("gx_tw"), Int("ga_tw")
        # an admission while r is refused: the younger request takes blocks the head is waiting for
        return And(dom.size >= 1, ginv(dom, s), refused(s), dom.has(x), s["q"][x], a >= 1, a <= s["F"],
                   s["P"] == 4, s["need"] == 3, s["F"] == 2), {}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        ref = guard_config(K)
        bound = (K + _mu_bound_steps(ref) + 2) * ref.cost.unit_step_s
        ref = guard_config(K, bound)
        cfg = guard_config(None, bound)
        n = int(2 * bound / 3) + 4
        reqs = [Request(0, "hi", 0.0, 17, 6), Request(1, "lo", 0.0, 47, 1)] + \
            [Request(2 + j, "hi", 1.0 + 3.0 * j, 17, 6) for j in range(n)]
        trs = list(run_workload(cfg, reqs, max_steps=4 * n + 50))
        ok, detail = verdict(late_starts(cfg, trs, bound), catalog_state("GUARD", ref, trs),
                             f"fcfs on a 4-block pool without the guard: lo's 3-block head waits while {n} later "
                             f"2-block requests of hi keep fitting (the guard's bound K + mu_0 + 2 = {bound:g} s)")
        return Replay(ok, detail, {"bound_s": bound, "hi_requests": n})
    return formula, replay


def lo_wait_s(config: Config, requests: list[Request]) -> float:
    """Seconds lo's request (id 1) of a pressure workload waits from its arrival to its first
    scheduling on ``config`` (at most 4 steps per request, plus 50)."""
    h = simulate(config, requests, max_steps=4 * len(requests) + 50)
    r = next(x for x in h.requests if x.request_id == 1)
    return r.first_scheduled_s - r.arrival_s


def held_with_guard(k: int = 3) -> tuple[float, float]:
    """(lo's wait, the bound) on the twin's workload with the guard on: the run the proof promises."""
    ref = guard_config(k)
    bound = (k + _mu_bound_steps(ref) + 2) * ref.cost.unit_step_s
    n = int(2 * bound / 3) + 4
    reqs = [Request(0, "hi", 0.0, 17, 6), Request(1, "lo", 0.0, 47, 1)] + \
        [Request(2 + j, "hi", 1.0 + 3.0 * j, 17, 6) for j in range(n)]
    return lo_wait_s(guard_config(k, bound), reqs), bound


_tf, _tr = _no_guard_twin()
GUARD = Proof(
    id="GUARD", family=FAMILY,
    claim="while an overdue head that does not fit is reserved for, nothing is admitted and the running work "
          "drops by >= 1 token per step; with nothing running it fits, so the reservation lasts <= "
          "max_num_seqs * max_context_tokens steps",
    scope="any N (sequences), one step", obligations=obligations,
    twins=(Twin("no-guard", "the guard (guard_steps = None: work-conserving past the refused head)", _tf, _tr),),
    hypotheses=("the head's own KV cap and slot caps would take it (else only its own tenant's work makes room)",
                "its first chunk needs at most the pool (a request that can never fit is refused too_large)"))

PROOFS = (GUARD,)
