"""Bounded wait under the starvation guard, under KV pressure (BOUNDED-WAIT[guard], SPEC.md 8.14).

8.12 proves BOUNDED-WAIT under ``fcfs`` with ample KV (every head fits).  Here
the pool may be full and heads refused; the guard (``guard_steps`` K) is on.
Scope: ``fcfs``, no eviction while r waits (so every queued sequence is fresh
and ready, ``ready_step = admitted_step``), no KV cap, no slot caps, no prefix
cache, every tenant's queue bounded (sum of the bounds ``QB``).

For a request r waiting in its queue, admitted in step ``k_r``, the ranking
function is ``V = mu + C * Q``: ``mu`` is the running work, ``sum over running
of (rem + 1)`` (``rem = prompt + output - 1 - computed``, so ``rem + 1 <=
max_context_tokens``), ``Q`` the number of queued sequences admitted before r,
and ``C = max_num_seqs * max_context_tokens + 1``.  Ghosts of one step: ``V0``
(V at the step's start), ``a`` (admissions of its waiting phase), ``paid`` (one
of them was admitted before r), ``tok`` (tokens computed).  Step invariant J:
``V + C * paid + tok <= V0 + ctx * a``.

Obligations (any number of sequences and tenants):

* ``step:init``: J with ``a = tok = 0`` and ``V0 = V``;
* ``leave:running``, ``leave:queued``, ``arrive`` (admitted after r: Q and mu
  do not move), ``compute`` (n >= 1 tokens: ``mu`` and V drop by n, ``tok`` grows
  by n), ``admit`` (any queued sequence but r, into a free slot: V grows by
  at most ``rem + 1 - C * old <= ctx``, ``a`` by one) keep the invariant and J;
* ``first``: in a step ``k >= k_r + K`` whose guard does not reserve, the first
  pick of the waiting phase is the oldest queued sequence h0 (fcfs: the least
  key, every backlogged tenant a candidate; h0 is its tenant's head, 8.11); it
  was admitted no later than r, so it is overdue, so the guard's bound
  ``first_chunk_blocks_bound`` of its first chunk fits the free blocks, and so
  does the chunk: h0 goes in, and it is r or older than r.  This is the step
  in which the head fits at the phase's start and an older admission takes the
  room: that admission pays (``paid``) for every later one of the phase;
* ``drained``: with nothing running the pool is free and every head fits, so
  a reserving step has a running sequence; ``progress``: the first running
  sequence gets ``min(rem + 1, budget) >= 1`` tokens (no eviction, no stall);
* ``cover``: so a step ``k >= k_r + K`` that does not schedule r has ``paid`` or
  (``a = 0`` and ``tok >= 1``); ``drop``: then J and ``a <= max_num_seqs`` give
  ``V_end <= V0 - 1``; ``bound``: ``0 <= V <= m * ctx + C * (QB - 1)`` (QUEUE-BOUND
  counts the queued fresh requests at r's admission, r among them; Q does not
  grow after it).

So r is first scheduled by step ``k_r + K + V_max``: it waits at most
``K + m * ctx + (m * ctx + 1) * (QB - 1) + 1`` steps of at most ``step_s_max``
seconds (the last one for the step under way when r arrives).  That the count
of such steps is at most ``V_max`` is the well-founded induction over the run
(stated, not a Z3 query), as in 8.12.

Twin ``no-guard`` (``guard_steps = None``): without the guard the first pick
may refuse the oldest head and admit a younger one, unpaid, and V grows;
replayed on 8.12's pool-pressure workload with ``max_wait_s`` the bound, r
waits past it and the catalog's BOUNDED-WAIT (history form) flags the run.

BOUNDED-WAIT[guard_wait_s] is the same encoding with the overdue rule in
seconds (``mode="seconds"``: ``t - arrival_s >= W`` at the step's start;
``first`` then takes admission order as arrival order) and one more
obligation, ``clock``: the first step once r has waited W starts less than
``step_s_max`` later.  So r starts within ``W + (V_max + 1) * step_s_max``
seconds (:func:`wait_bound_s`); with the cost model's floor ``step_s_min``
also within ``ceil(W / step_s_min) + V_max + 1`` steps.
"""

from __future__ import annotations

import math

import attrs
import z3
from z3 import And, If, Implies, Int, Not, Or, Store

from tenantry.model.config import Config
from tenantry.model.policies import step_s_min
from tenantry.model.workload import Request
from tenantry.runner.simulate import simulate

from .checks import catalog_history, verdict
from .concrete import run_workload
from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array
from .guard import guard_config, lo_wait_s
from .wait import late_starts, step_s_max

FAMILY = "guard"


def bstate(tag: str) -> dict:
    """Per sequence ``run``, ``q``, ``rem``, ``blk``, ``sq`` (arrival_seq), ``adm`` (admitted step),
    ``nd`` (the guard's bound of its first chunk's blocks); the pool, the ghosts and the step's ghosts."""
    s = {n: bool_array(f"b{n}_{tag}") for n in ("run", "q", "head")}
    s.update({n: int_array(f"b{n}_{tag}") for n in ("rem", "blk", "sq", "adm", "nd")})
    s.update({n: Int(f"b{n}_{tag}") for n in ("U", "F", "P", "nrun", "mu", "Q", "m", "ctx", "K", "k", "r", "nxt",
                                              "V0", "a", "tok")})
    s["paid"] = z3.Bool(f"bpaid_{tag}")
    s["arr"] = z3.Array(f"barr_{tag}", z3.IntSort(), z3.RealSort())  # arrival_s per sequence
    s["t"], s["W"] = z3.Real(f"bt_{tag}"), z3.Real(f"bW_{tag}")  # the step's start; guard_wait_s
    return s


def overdue(s: dict, y, mode: str = "steps") -> z3.BoolRef:
    """Queued fresh sequence y is overdue (``guards.overdue``): ``k - adm >= K`` steps since it
    became ready (``guard_steps``), or ``t - arrival_s >= W`` seconds (``guard_wait_s``)."""
    return s["k"] - s["adm"][y] >= s["K"] if mode == "steps" else s["t"] - s["arr"][y] >= s["W"]


def big_c(s: dict) -> z3.ArithRef:
    """C = max_num_seqs * max_context_tokens + 1: what one paid admission is worth."""
    return s["m"] * s["ctx"] + 1


def rank(s: dict) -> z3.ArithRef:
    """V = mu + C * Q."""
    return s["mu"] + big_c(s) * s["Q"]


def old(s: dict, x) -> z3.BoolRef:
    return s["sq"][x] < s["sq"][s["r"]]


def alive(s: dict, x) -> z3.BoolRef:
    return Or(s["q"][x], s["run"][x])


def binv(dom: Domain, s: dict) -> z3.BoolRef:
    """The invariant: the pool's books, the bounds of mu and nrun, r waiting, per-sequence ranges."""
    r = s["r"]
    return And(s["F"] + s["U"] == s["P"], s["U"] >= 0, s["F"] >= 0, s["m"] >= 1, s["ctx"] >= 1, s["K"] >= 0,
               s["nrun"] >= 0, s["nrun"] <= s["m"], s["mu"] >= 0, s["mu"] <= s["ctx"] * s["nrun"], s["Q"] >= 0,
               dom.has(r), s["q"][r], Not(s["run"][r]), s["sq"][r] < s["nxt"],
               dom.forall(lambda x: And(s["rem"][x] >= 0, s["rem"][x] + 1 <= s["ctx"], s["blk"][x] >= 0, Not(And(s["run"][x], s["q"][x])),
                                        Implies(Not(s["run"][x]), s["blk"][x] == 0),
                                        Implies(alive(s, x), And(s["sq"][x] < s["nxt"], s["nd"][x] >= 1,
                                                                 s["nd"][x] <= s["P"])))))


def jstep(s: dict) -> z3.BoolRef:
    """J: ``V + C * paid + tok <= V0 + ctx * a``, ``0 <= a <= m``, ``tok >= 0``."""
    return And(rank(s) + If(s["paid"], big_c(s), 0) + s["tok"] <= s["V0"] + s["ctx"] * s["a"],
               s["a"] >= 0, s["a"] <= s["m"], s["tok"] >= 0)


def reserving(dom: Domain, s: dict, mode: str = "steps") -> z3.BoolRef:
    """The guard reserves: some queued head, :func:`overdue`, needs more than is free."""
    return dom.exists(lambda y: And(s["q"][y], s["head"][y], overdue(s, y, mode), s["nd"][y] > s["F"]))


def _sum_facts(s: dict, x) -> list:
    """Facts about the ghost sums at one term (a term of a sum of non-negative terms is at most the sum;
    KV-CONSERVE for the blocks): x running holds at most U and its ``rem + 1`` is in mu."""
    return [s["blk"][x] <= s["U"], s["nrun"] >= 1, s["mu"] >= s["rem"][x] + 1,
            s["mu"] - s["rem"][x] - 1 <= s["ctx"] * (s["nrun"] - 1)]


def obligations(guarded: bool = True, mode: str = "steps") -> list[tuple[str, z3.BoolRef]]:
    """The obligations of the module docstring; ``mode``: the guard's overdue rule, ``steps``
    (``guard_steps`` K) or ``seconds`` (``guard_wait_s`` W, with the ``clock`` obligation)."""
    dom = Domain("S")
    out = []
    both = lambda s: [dom.size >= 1, binv(dom, s), jstep(s)]  # noqa: E731
    keep = lambda post: And(binv(dom, post), jstep(post))  # noqa: E731

    s = bstate("init")
    out.append(("step:init", implies_all([binv(dom, s), s["a"] == 0, s["tok"] == 0, Not(s["paid"]),
                                          s["V0"] == rank(s)], jstep(s))))
    # leave: a running sequence ends (finish, cancellation, rejection), releasing its blocks
    s = bstate("lvr")
    x = Int("bx_lvr")
    post = {**s, "run": Store(s["run"], x, False), "blk": Store(s["blk"], x, 0), "U": s["U"] - s["blk"][x],
            "F": s["F"] + s["blk"][x], "nrun": s["nrun"] - 1, "mu": s["mu"] - s["rem"][x] - 1}
    out.append(("leave:running", implies_all(both(s) + [dom.has(x), s["run"][x]] + _sum_facts(s, x),
                                             And(keep(post), rank(post) < rank(s)))))
    # leave: a queued sequence other than r is cancelled (Q counts it if it is older than r)
    s = bstate("lvq")
    x = Int("bx_lvq")
    post = {**s, "q": Store(s["q"], x, False), "Q": s["Q"] - If(old(s, x), 1, 0)}
    out.append(("leave:queued", implies_all(both(s) + [dom.has(x), s["q"][x], x != s["r"],
                                                       Implies(old(s, x), s["Q"] >= 1)],
                                            And(keep(post), rank(post) <= rank(s)))))
    # arrive: queued at the tail with sq = nxt, after r: Q and mu do not move
    s = bstate("arr")
    x, w, nd = Int("bx_arr"), Int("bw_arr"), Int("bnd_arr")
    post = {**s, "q": Store(s["q"], x, True), "run": Store(s["run"], x, False), "sq": Store(s["sq"], x, s["nxt"]),
            "nxt": s["nxt"] + 1, "rem": Store(s["rem"], x, w), "blk": Store(s["blk"], x, 0),
            "adm": Store(s["adm"], x, s["k"]), "nd": Store(s["nd"], x, nd)}
    out.append(("arrive", implies_all(both(s) + [dom.has(x), Not(alive(s, x)), w >= 0, w + 1 <= s["ctx"], nd >= 1,
                                                 nd <= s["P"]],
                                      And(keep(post), Not(old(post, x)), rank(post) == rank(s)))))
    # compute: running y gets n >= 1 of its remaining tokens and b >= 0 new blocks from the free ones
    s = bstate("cmp")
    y, n, b = Int("by_cmp"), Int("bn_cmp"), Int("bb_cmp")
    post = {**s, "rem": Store(s["rem"], y, s["rem"][y] - n), "blk": Store(s["blk"], y, s["blk"][y] + b),
            "U": s["U"] + b, "F": s["F"] - b, "mu": s["mu"] - n, "tok": s["tok"] + n}
    out.append(("compute", implies_all(both(s) + [dom.has(y), s["run"][y], n >= 1, n <= s["rem"][y], b >= 0,
                                                  b <= s["F"]] + _sum_facts(s, y),
                                       And(keep(post), rank(post) <= rank(s) - 1))))
    # admit: a queued sequence x (not r) enters a free slot with b >= 1 blocks of the free ones; in the
    # waiting phase nothing leaves, so the phase's admissions are running (a <= nrun)
    s = bstate("adm")
    x, b = Int("bx_adm"), Int("bb_adm")
    post = {**s, "q": Store(s["q"], x, False), "run": Store(s["run"], x, True), "blk": Store(s["blk"], x, b),
            "U": s["U"] + b, "F": s["F"] - b, "nrun": s["nrun"] + 1, "mu": s["mu"] + s["rem"][x] + 1,
            "Q": s["Q"] - If(old(s, x), 1, 0), "a": s["a"] + 1, "paid": Or(s["paid"], old(s, x))}
    out.append(("admit", implies_all(both(s) + [dom.has(x), s["q"][x], x != s["r"], s["nrun"] < s["m"],
                                                s["a"] <= s["nrun"], b >= 1, b <= s["F"],
                                                Implies(old(s, x), s["Q"] >= 1)], keep(post))))
    # first: step k >= k_r + K, the guard does not reserve; fcfs's first pick is the oldest queued
    # sequence h0 (a head, 8.11); admitted no later than r, it is overdue, so it fits and goes in
    s = bstate("first")
    h0, b = Int("bh0_first"), Int("bb_first")
    # admission order is the order of admission steps and (the driver feeds arrivals in time order) of arrivals
    order_of = (lambda u, v: s["adm"][u] <= s["adm"][v]) if mode == "steps" else \
        (lambda u, v: s["arr"][u] <= s["arr"][v])  # noqa: E731
    admitted_in_order = dom.forall(lambda u, v: Implies(And(alive(s, u), alive(s, v), s["sq"][u] <= s["sq"][v]),
                                                         order_of(u, v)), arity=2)
    least = dom.forall(lambda u: Implies(s["q"][u], s["sq"][h0] <= s["sq"][u]))
    distinct = dom.forall(lambda u, v: Implies(And(u != v, alive(s, u), alive(s, v)), s["sq"][u] != s["sq"][v]),
                          arity=2)  # admission numbers are distinct (the queue invariant, 8.11)
    hyps = [dom.size >= 1, binv(dom, s), overdue(s, s["r"], mode), admitted_in_order, distinct,
            dom.has(h0), s["q"][h0], s["head"][h0], least, b >= 1, b <= s["nd"][h0]]
    if guarded:
        hyps.append(Not(reserving(dom, s, mode)))
    out.append(("first", implies_all(hyps, And(b <= s["F"], Or(h0 == s["r"], old(s, h0))))))
    # drained: nothing running, no block held (KV-CONSERVE), the pool is free: the guard does not reserve
    s = bstate("drained")
    out.append(("drained", implies_all([dom.size >= 1, binv(dom, s), s["nrun"] == 0, s["U"] == 0],
                                       Not(reserving(dom, s, mode)))))
    if mode == "seconds":
        # clock: while r waits the steps run back to back (r is work), each lasting at most S (step_s_max);
        # the first step that starts once r has waited W seconds starts less than W + S after its arrival
        t0, t1, dur, S, ar, W = z3.Reals("bc_t0 bc_t1 bc_dur bc_S bc_ar bc_W")
        out.append(("clock", implies_all([t0 - ar < W, dur > 0, dur <= S, t1 == t0 + dur, t1 - ar >= W],
                                         t1 - ar < W + S)))
    # progress: the first running sequence's chunk min(rem + 1, budget) >= 1 (no eviction, so no stall)
    s = bstate("prog")
    y, M = Int("by_prog"), Int("bM_prog")
    n = If(s["rem"][y] + 1 < M, s["rem"][y] + 1, M)
    out.append(("progress", implies_all([dom.size >= 1, binv(dom, s), dom.has(y), s["run"][y], M >= 1], n >= 1)))
    # cover: the step's shape (the facts above) leaves paid, or no admission and a computed token
    wp, res, sched, paid = z3.Bools("b_wp b_res b_sched b_paid")
    a, tok, n0 = Int("b_a_cov"), Int("b_tok_cov"), Int("b_n0_cov")
    out.append(("cover", implies_all([Implies(Not(wp), n0 >= 1),       # skipped: full batch, or budget spent
                                      Implies(res, n0 >= 1),           # drained
                                      Implies(n0 >= 1, tok >= 1),      # progress
                                      Implies(Or(Not(wp), res), a == 0),  # the guard admits nothing
                                      Implies(And(wp, Not(res)), Or(sched, paid))],  # first
                                     Or(sched, paid, And(a == 0, tok >= 1)))))
    # drop: at the step's end
    s = bstate("drop")
    out.append(("drop", implies_all([binv(dom, s), jstep(s), Or(s["paid"], And(s["a"] == 0, s["tok"] >= 1))],
                                    And(rank(s) <= s["V0"] - 1, rank(s) >= 0))))
    # bound: V at any step is at most m * ctx + C * (QB - 1)
    s = bstate("bound")
    qb = Int("b_qb")
    out.append(("bound", implies_all([binv(dom, s), qb >= 1, s["Q"] <= qb - 1],
                                     rank(s) <= s["m"] * s["ctx"] + big_c(s) * (qb - 1))))
    return out


def v_max(config: Config) -> int | None:
    """The ranking's bound ``m * ctx + (m * ctx + 1) * (QB - 1)``; None when a queue is unbounded."""
    bounds = [t.queue_bound for t in config.tenants]
    if not config.admission.queue_bound or any(b is None for b in bounds):
        return None
    mc = config.max_num_seqs * config.max_context_tokens
    return mc + (mc + 1) * (sum(bounds) - 1)


def wait_bound_steps(config: Config) -> int | None:
    """Steps within which a request is first scheduled under fcfs and the guard, counting its
    arrival step: ``K + V_max + 1`` with K = ``guard_steps``; under ``guard_wait_s`` W alone,
    ``ceil(W / step_s_min) + V_max + 1`` (the cost model's floor: a step lasts at least
    ``step_s_min``, so ``ceil(W / step_s_min)`` steps after its admission r is overdue); None
    when a queue is unbounded, the guard is off, or (W alone) the floor is 0."""
    vm, o = v_max(config), config.order
    if vm is None:
        return None
    if o.guard_steps is not None:
        return o.guard_steps + vm + 1
    if o.guard_wait_s is not None and step_s_min(config) > 0:
        return math.ceil(o.guard_wait_s / step_s_min(config) - 1e-9) + vm + 1
    return None


def wait_bound_s(config: Config) -> float | None:
    """The wait (seconds) BOUNDED-WAIT can promise under fcfs with the guard: ``wait_bound_steps``
    steps of at most ``step_s_max`` seconds under ``guard_steps``; under ``guard_wait_s`` W,
    ``W + (V_max + 1) * step_s_max`` (the obligation ``clock``: the first step once r has waited W
    starts less than one step later; no floor needed); the smaller when both are set."""
    vm, o, smax = v_max(config), config.order, step_s_max(config)
    if vm is None:
        return None
    out = []
    if o.guard_steps is not None:
        out.append((o.guard_steps + vm + 1) * smax)
    if o.guard_wait_s is not None:
        out.append(o.guard_wait_s + (vm + 1) * smax)
    return min(out) if out else None


K_REPLAY = 3


def pressure_workload(bound_s: float) -> list[Request]:
    """8.12's pool-pressure workload: lo's 3-block head among 2-block requests of hi every 3 s, for
    twice ``bound_s``."""
    n = int(2 * bound_s / 3) + 4
    return [Request(0, "hi", 0.0, 17, 6), Request(1, "lo", 0.0, 47, 1)] + \
        [Request(2 + j, "hi", 1.0 + 3.0 * j, 17, 6) for j in range(n)]


W_REPLAY = 3.0


def wait_config(guard_wait_s: float | None, max_wait_s: float | None = None) -> Config:
    """8.12's pool-pressure replica with the guard in seconds (``guard_wait_s``) and no ``guard_steps``."""
    c = guard_config(None, max_wait_s)
    return attrs.evolve(c, order=attrs.evolve(c.order, guard_wait_s=guard_wait_s))


def _no_guard_twin(mode: str = "steps"):
    on = (lambda b=None: guard_config(K_REPLAY, b)) if mode == "steps" else (lambda b=None: wait_config(W_REPLAY, b))
    off = (lambda b: guard_config(None, b)) if mode == "steps" else (lambda b: wait_config(None, b))
    what = f"guard_steps = {K_REPLAY}" if mode == "steps" else f"guard_wait_s = {W_REPLAY:g} s"

    def formula() -> tuple[z3.BoolRef, dict]:
        dom = Domain("S", 3)
        s = bstate(f"tw{mode}")
        x, b = Int(f"bx_tw{mode}"), Int(f"bb_tw{mode}")
        # r (seq 0) is the oldest queued head, overdue, and refused; a younger x fits and is admitted
        # unpaid, so the step ends with V above V0 - 1 (the drop fails)
        post_rank = rank(s) + s["rem"][x] + 1 - s["tok"]
        late = And(s["K"] == K_REPLAY) if mode == "steps" else s["W"] == W_REPLAY
        return And(binv(dom, s), s["r"] == 0, s["head"][0], overdue(s, 0, mode), late,
                   s["nd"][0] > s["F"], s["P"] == 4, s["nd"][0] == 3, s["F"] == 2, x == 1, s["q"][x],
                   Not(old(s, x)), b >= 1, b <= s["F"], s["tok"] == 1, s["nrun"] == 1, s["V0"] == rank(s),
                   Not(post_rank <= s["V0"] - 1)), {}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        bound = wait_bound_s(on())
        ref, cfg = on(bound), off(bound)
        reqs = pressure_workload(bound)
        steps = 4 * len(reqs) + 50
        trs = list(run_workload(cfg, reqs, max_steps=steps))
        h = simulate(cfg, reqs, max_steps=steps)
        ok, detail = verdict(late_starts(cfg, trs, bound), catalog_history("BOUNDED-WAIT", ref, h),
                             f"fcfs on a 4-block pool without the guard ({what} removed): lo's 3-block head waits "
                             f"while {len(reqs) - 2} later 2-block requests of hi keep fitting (the guard's bound "
                             f"{bound:g} s)")
        return Replay(ok, detail, {"bound_s": bound, "hi_requests": len(reqs) - 2})
    return formula, replay


def held_with_guard(k: int = K_REPLAY) -> tuple[float, float]:
    """(lo's wait, the bound) in seconds on the twin's workload with the guard on."""
    bound = wait_bound_s(guard_config(k))
    return lo_wait_s(guard_config(k, bound), pressure_workload(bound)), bound


def held_with_wait_guard(w: float = W_REPLAY) -> tuple[float, float]:
    """:func:`held_with_guard` with the guard in seconds (``guard_wait_s`` = w)."""
    bound = wait_bound_s(wait_config(w))
    return lo_wait_s(wait_config(w, bound), pressure_workload(bound)), bound


_HYPS = ("no eviction while r waits and no evicted sequence queued (every queued sequence is fresh and ready); no "
         "KV cap, no slot caps, no prefix cache",
         "every tenant's queue bounded (QUEUE-BOUND: at most sum - 1 queued before r at its admission)",
         "a request that can never fit is refused too_large (every first chunk fits the pool)")

_tf, _tr = _no_guard_twin()
BOUNDED_WAIT_GUARD = Proof(
    id="BOUNDED-WAIT[guard]", family=FAMILY,
    claim="under fcfs with the guard (K) and KV pressure, V = running work + C * (older queued), "
          "C = max_num_seqs * ctx + 1, drops by >= 1 per step from k_r + K while r waits, so r starts "
          "within K + m*ctx + (m*ctx + 1)(sum queue bounds - 1) + 1 steps",
    scope="any N (sequences, tenants), one step; fcfs, guard_steps, no eviction, no caps, no prefix cache",
    obligations=obligations,
    twins=(Twin("no-guard", "the guard (guard_steps = None: the first pick may pass the refused oldest head)",
                _tf, _tr),),
    hypotheses=("policy fcfs, guard_steps K (guard_wait_s may also be set)",) + _HYPS
    + ("max_wait_s >= the bound * step_s_max: the model does not read max_wait_s",))

_wf, _wr = _no_guard_twin("seconds")
BOUNDED_WAIT_GUARD_S = Proof(
    id="BOUNDED-WAIT[guard_wait_s]", family=FAMILY,
    claim="under fcfs with the guard in seconds (W) and KV pressure, the same V drops by >= 1 per step once r has "
          "waited W seconds, and that step starts < W + step_s_max after r's arrival, so r starts within "
          "W + (m*ctx + (m*ctx + 1)(sum queue bounds - 1) + 1) * step_s_max seconds",
    scope="any N (sequences, tenants), one step; fcfs, guard_wait_s, no eviction, no caps, no prefix cache",
    obligations=lambda: obligations(mode="seconds"),
    twins=(Twin("no-guard", "the guard (guard_wait_s = None: the first pick may pass the refused oldest head)",
                _wf, _wr),),
    hypotheses=("policy fcfs, guard_wait_s W (guard_steps may also be set)",
                "the driver feeds arrivals in time order (admission order is arrival order) and steps back to back "
                "while r waits, each at most step_s_max (the cost model's ceiling; its floor step_s_min gives the "
                "step count ceil(W / step_s_min) + V_max + 1)") + _HYPS
    + ("max_wait_s >= the bound: the model does not read max_wait_s",))

PROOFS = (BOUNDED_WAIT_GUARD, BOUNDED_WAIT_GUARD_S)
