"""Order within the batch: first come first served inside a tenant (FCFS-TENANT),
across the tenants of a tier under ``fcfs`` (FCFS-TIER), and the higher tier
first under ``priority`` (TIER-ORDER) (SPEC.md 8.11).

**Queues** (Z3 arrays over any number of sequences; tenants are integers):
per sequence ``q`` (queued), ``run`` (running), ``fr`` (never scheduled:
``first_scheduled_s is None``), ``sq`` (``arrival_seq``, the admission
order), ``pos`` (its place in its tenant's queue: a real, smaller is nearer
the front), ``rdy`` (``ready_step``), ``ten`` (its tenant); ``k`` the step,
``nxt`` the next ``arrival_seq``.  Actions of ``model/step.py``: ``arrive``
(queued at the tail with ``sq = nxt``, ``rdy = k``), ``admit``
(``_admit_head``: the first sequence of the queue with ``rdy <= k``),
``evict`` (``_evict``: back at the front, ``rdy = k + 1 + cooldown``),
``leave`` (cancel, finish, rejection), ``tick`` (the step ends).

Queue invariant: fresh sequences are ready; the fresh ones of a tenant stand
in its queue in admission order; every sequence of a tenant that has been
scheduled (running, or queued again after an eviction) was admitted before
every fresh one; admission numbers are distinct and below ``nxt``.  Hence
(FCFS-TENANT) an ``admit`` that takes a fresh sequence takes its tenant's
oldest fresh one, and a tenant's fcfs key (``_head``: its first *ready*
sequence's ``arrival_seq``) is at most the admission number of each of its
fresh sequences.

**Picks** (``select_fcfs``, ``select_priority``): the candidate with the least
key, ``(tier, key)`` under priority.  So when a fresh request r of tenant A is
first scheduled, every tenant B holding a fresh request q admitted before r
(under priority: holding any fresh request of a higher tier) was not a
candidate: it was blocked in this step.

**Room** (``schedule_waiting``): a tenant is blocked only when its first ready
sequence does not fit (the free pool, or its cap), and during the waiting
phase the free blocks only shrink and a blocked tenant's blocks do not
change; so at the end of the step the head still does not fit.  The
catalog's room for a head (``_could_fit``) is no larger: the most blocks the
head's first chunk can take (``blocks_for(min(prompt, token_budget))``, the
whole prompt with a prefix cache) against the free blocks after the step
less all that the step's finishing requests held.  So the catalog's rival
never "surely fitted".

Twins: ``lifo`` (variant ``tenant_queue_lifo``: a tenant's newest request
first; no configuration reorders a queue) and ``round-robin``
(``policy=round_robin``: one request per tenant per turn, whatever its age
or tier).
"""

from __future__ import annotations

import z3
from z3 import And, If, Implies, Int, Not, Or, Real, Store

from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.workload import Request
from tenantry.runner.simulate import simulate
from tenantry.testing.mutants import TenantQueueLifo

from .checks import catalog_history, verdict
from .concrete import run_workload
from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array, real_array, val

FAMILY = "order"


# --- queues ------------------------------------------------------------------------------


def qstate(tag: str) -> dict:
    """Fresh symbolic queue state named after ``tag``."""
    return {"q": bool_array(f"q_{tag}"), "run": bool_array(f"run_{tag}"), "fr": bool_array(f"fr_{tag}"),
            "sq": int_array(f"sq_{tag}"), "pos": real_array(f"pos_{tag}"), "rdy": int_array(f"rdy_{tag}"),
            "ten": int_array(f"ten_{tag}"), "k": Int(f"k_{tag}"), "nxt": Int(f"nxt_{tag}")}


def alive(s: dict, x) -> z3.BoolRef:
    return Or(s["q"][x], s["run"][x])


def queue_inv(dom: Domain, s: dict) -> z3.BoolRef:
    """The queue invariant (module docstring)."""
    q, run, fr, sq, pos, rdy, ten = (s[n] for n in ("q", "run", "fr", "sq", "pos", "rdy", "ten"))
    same = lambda x, y: ten[x] == ten[y]  # noqa: E731
    one = dom.forall(lambda x: And(
        Not(And(q[x], run[x])), Implies(run[x], Not(fr[x])),
        Implies(alive(s, x), And(sq[x] >= 0, sq[x] < s["nxt"])),
        Implies(And(q[x], fr[x]), rdy[x] <= s["k"])))
    two = dom.forall(lambda x, y: And(
        Implies(And(x != y, alive(s, x), alive(s, y)), sq[x] != sq[y]),
        Implies(And(x != y, q[x], q[y], same(x, y)), pos[x] != pos[y]),
        Implies(And(q[x], q[y], same(x, y), fr[x], fr[y], pos[x] < pos[y]), sq[x] < sq[y]),
        Implies(And(alive(s, x), Not(fr[x]), q[y], fr[y], same(x, y)), sq[x] < sq[y])), arity=2)
    return And(s["nxt"] >= 0, one, two)


def first_ready(dom: Domain, s: dict, x, tenant) -> z3.BoolRef:
    """x is ``tenant``'s first ready queued sequence (what ``_admit_head`` takes and
    ``_head`` ranks the tenant by)."""
    q, pos, rdy, ten = s["q"], s["pos"], s["rdy"], s["ten"]
    return And(dom.has(x), q[x], ten[x] == tenant, rdy[x] <= s["k"],
               dom.forall(lambda t: Implies(And(q[t], ten[t] == tenant, pos[t] < pos[x]), rdy[t] > s["k"])))


def actions(dom: Domain, s: dict, tag: str, lifo: bool = False) -> dict[str, tuple[z3.BoolRef, dict, dict]]:
    """The queue actions (module docstring): name -> (guard, post, params).  ``lifo``:
    the twin's ``admit`` takes the *last* ready sequence of the queue."""
    q, run, fr, pos, rdy, ten, k = (s[n] for n in ("q", "run", "fr", "pos", "rdy", "ten", "k"))
    x, i, p, cd = Int(f"x_{tag}"), Int(f"i_{tag}"), Real(f"p_{tag}"), Int(f"cd_{tag}")
    out = {}
    tail = dom.forall(lambda t: Implies(And(q[t], ten[t] == i), pos[t] < p))
    out["arrive"] = (And(dom.has(x), Not(alive(s, x)), tail),
                     {**s, "q": Store(q, x, True), "fr": Store(fr, x, True), "run": Store(run, x, False),
                      "sq": Store(s["sq"], x, s["nxt"]), "nxt": s["nxt"] + 1, "rdy": Store(rdy, x, k),
                      "ten": Store(ten, x, i), "pos": Store(pos, x, p)}, {"x": x, "i": i})
    if lifo:
        g_admit = And(dom.has(x), q[x], rdy[x] <= k,
                      dom.forall(lambda t: Implies(And(q[t], ten[t] == ten[x], pos[t] > pos[x]), rdy[t] > k)))
    else:
        g_admit = first_ready(dom, s, x, ten[x])
    out["admit"] = (g_admit, {**s, "q": Store(q, x, False), "run": Store(run, x, True), "fr": Store(fr, x, False)},
                    {"x": x})
    front = dom.forall(lambda t: Implies(And(q[t], ten[t] == ten[x]), p < pos[t]))
    out["evict"] = (And(dom.has(x), run[x], cd >= 0, front),
                    {**s, "q": Store(q, x, True), "run": Store(run, x, False), "rdy": Store(rdy, x, k + 1 + cd),
                     "pos": Store(pos, x, p)}, {"x": x})
    out["leave"] = (And(dom.has(x), alive(s, x)), {**s, "q": Store(q, x, False), "run": Store(run, x, False)},
                    {"x": x})
    out["tick"] = (z3.BoolVal(True), {**s, "k": k + 1}, {})
    return out


def tenant_claim(dom: Domain, s: dict, x) -> z3.BoolRef:
    """FCFS-TENANT at an ``admit`` of x: if x is fresh, it is its tenant's oldest fresh sequence."""
    q, fr, sq, ten = s["q"], s["fr"], s["sq"], s["ten"]
    return Implies(fr[x], dom.forall(lambda t: Implies(And(t != x, q[t], fr[t], ten[t] == ten[x]), sq[x] < sq[t])))


def queue_obligations() -> list[tuple[str, z3.BoolRef]]:
    dom = Domain("S")
    s0 = qstate("q0")
    out = [("queue:init", implies_all([dom.size >= 1, s0["nxt"] == 0, s0["k"] == 0,
                                       dom.forall(lambda x: Not(alive(s0, x)))], queue_inv(dom, s0)))]
    for name in ("arrive", "admit", "evict", "leave", "tick"):
        s = qstate(f"q_{name}")
        g, post, p = actions(dom, s, f"q_{name}")[name]
        out.append((f"queue:{name}", implies_all([dom.size >= 1, queue_inv(dom, s), g], queue_inv(dom, post))))
        if name == "admit":
            out.append(("fcfs-tenant", implies_all([dom.size >= 1, queue_inv(dom, s), g],
                                                   tenant_claim(dom, s, p["x"]))))
    return out


# --- picks -------------------------------------------------------------------------------


def pick(dom: Domain, s: dict, tag: str, policy: str) -> tuple[z3.BoolRef, dict]:
    """A pick of tenant A whose first ready sequence r enters the batch, under ``policy``
    (``fcfs``, ``priority``, or ``any``: the twin, any candidate).  ``cand[B]``:
    backlogged and not blocked; ``hw[B]``: B's first ready sequence, which exists
    whenever B has a ready queued sequence (queues are finite)."""
    cand, hw, tier = bool_array(f"cand_{tag}"), int_array(f"hw_{tag}"), int_array(f"tier_{tag}")
    r, A = Int(f"r_{tag}"), Int(f"A_{tag}")
    q, sq, rdy, ten = s["q"], s["sq"], s["rdy"], s["ten"]
    heads = dom.forall(lambda t: Implies(And(q[t], rdy[t] <= s["k"]), first_ready(dom, s, hw[ten[t]], ten[t])))
    key_le = {
        "fcfs": lambda B: sq[r] <= sq[hw[B]],
        "priority": lambda B: Or(tier[A] < tier[B], And(tier[A] == tier[B], sq[r] <= sq[hw[B]])),
        "any": lambda B: z3.BoolVal(True),
    }[policy]
    # every candidate with a ready sequence ranks no better than A (one with none is skipped by _admit_head)
    better = dom.forall(lambda t: Implies(And(q[t], rdy[t] <= s["k"], cand[ten[t]]), key_le(ten[t])))
    guard = And(heads, cand[A], first_ready(dom, s, r, A), hw[A] == r, better)
    return guard, {"cand": cand, "hw": hw, "tier": tier, "r": r, "A": A}


def rivals_blocked(dom: Domain, s: dict, p: dict, rival) -> z3.BoolRef:
    """Every tenant holding a fresh queued ``rival(y)`` of the picked fresh r is blocked."""
    q, fr, ten = s["q"], s["fr"], s["ten"]
    return Implies(s["fr"][p["r"]], dom.forall(lambda y: Implies(And(q[y], fr[y], ten[y] != p["A"], rival(y)),
                                                                 Not(p["cand"][ten[y]]))))


def tier_rival(s: dict, p: dict):
    """FCFS-TIER's rival: same tier, admitted before r."""
    return lambda y: And(p["tier"][s["ten"][y]] == p["tier"][p["A"]], s["sq"][y] < s["sq"][p["r"]])


def order_rival(s: dict, p: dict):
    """TIER-ORDER's rival: a higher tier (smaller number); the catalog also asks that
    it was admitted before r, strict priority needs no such premise."""
    return lambda y: p["tier"][s["ten"][y]] < p["tier"][p["A"]]


def pick_obligations(policy: str, rival: str) -> list[tuple[str, z3.BoolRef]]:
    dom = Domain("S")
    s = qstate(f"pk_{policy}")
    g, p = pick(dom, s, f"pk_{policy}", policy)
    riv = (tier_rival if rival == "tier" else order_rival)(s, p)
    return [(f"pick:{policy}", implies_all([dom.size >= 1, queue_inv(dom, s), g], rivals_blocked(dom, s, p, riv)))]


# --- room --------------------------------------------------------------------------------


def rstate(tag: str) -> dict:
    """Per tenant during the waiting phase: ``back`` (backlogged), ``cand``, ``fh`` (its
    first ready sequence is fresh), ``nr`` (none ready), ``nc`` (the catalog's blocks for
    its head's first chunk), ``tb`` (its blocks), ``cap`` and ``capped``; ``F`` free blocks."""
    return {"back": bool_array(f"back_{tag}"), "cand": bool_array(f"cand_{tag}"), "fh": bool_array(f"fh_{tag}"),
            "nr": bool_array(f"nr_{tag}"), "nc": int_array(f"nc_{tag}"), "tb": int_array(f"tb_{tag}"),
            "cap": int_array(f"cap_{tag}"), "capped": bool_array(f"capped_{tag}"), "F": Int(f"F_{tag}")}


def no_room(s: dict, B, F=None, tb=None) -> z3.BoolRef:
    F = s["F"] if F is None else F
    tb = s["tb"][B] if tb is None else tb
    return Or(s["nc"][B] > F, And(s["capped"][B], tb + s["nc"][B] > s["cap"][B]))


def room_inv(dom: Domain, s: dict) -> z3.BoolRef:
    """A blocked tenant whose first ready sequence is fresh has no room for it."""
    return dom.forall(lambda B: Implies(And(s["back"][B], Not(s["cand"][B]), s["fh"][B], Not(s["nr"][B])),
                                        no_room(s, B)))


def room_obligations() -> list[tuple[str, z3.BoolRef]]:
    dom = Domain("N")
    out = []
    s0 = rstate("r0")
    out.append(("room:start", implies_all([dom.forall(lambda B: s0["cand"][B] == s0["back"][B])], room_inv(dom, s0))))
    # admit(A): A's head joins the batch: the pool gives a >= 0 blocks, A's own records change freely
    s, A, a, tot = rstate("ra"), Int("A_ra"), Int("a_ra"), Int("tot_ra")
    nb, nfh, nnr, nnc = z3.Bool("nb_ra"), z3.Bool("nfh_ra"), z3.Bool("nnr_ra"), Int("nnc_ra")
    post = {**s, "F": s["F"] - a, "tb": Store(s["tb"], A, s["tb"][A] + tot), "back": Store(s["back"], A, nb),
            "fh": Store(s["fh"], A, nfh), "nr": Store(s["nr"], A, nnr), "nc": Store(s["nc"], A, nnc)}
    out.append(("room:admit", implies_all([room_inv(dom, s), dom.has(A), s["cand"][A], a >= 0, a <= s["F"], tot >= 0],
                                          room_inv(dom, post))))
    # block(A): _admit_head failed: none ready, or the pool (private + revived pm) or the cap (total tm) is short;
    # a fresh head's first chunk takes at most what the catalog counts: pm <= tm <= nc
    s, A, pm, tm = rstate("rb"), Int("A_rb"), Int("pm_rb"), Int("tm_rb")
    failed = Or(s["nr"][A], pm > s["F"], And(s["capped"][A], s["tb"][A] + tm > s["cap"][A]))
    post = {**s, "cand": Store(s["cand"], A, False)}
    out.append(("room:block", implies_all([room_inv(dom, s), dom.has(A), s["cand"][A], failed, pm >= 0, pm <= tm,
                                           Implies(s["fh"][A], tm <= s["nc"][A])], room_inv(dom, post))))
    # the step ends: the catalog's free blocks (after the step, less all the finishing requests held) and a
    # tenant's blocks (after the step, plus what its finishing requests held) are no better than the model's
    s, B, Fc, tbc = rstate("re"), Int("B_re"), Int("Fc_re"), Int("tbc_re")
    out.append(("room:end", implies_all([room_inv(dom, s), dom.has(B), Fc <= s["F"], tbc >= s["tb"][B], s["back"][B],
                                         Not(s["cand"][B]), s["fh"][B], Not(s["nr"][B])], no_room(s, B, Fc, tbc))))
    return out


# --- replays -----------------------------------------------------------------------------


def order_config(policy: str, tiers=(0, 0)) -> Config:
    """Two tenants ``a`` and ``b`` with the given tiers, one batch slot, an ample pool."""
    return Config(tenants=tuple(TenantConfig(n, tier=t) for n, t in zip("ab", tiers)), max_num_seqs=1,
                  token_budget=64, num_blocks=64, max_context_tokens=16, order=OrderConfig(policy=policy),
                  cost=CostConfig(mode="unit"))


def out_of_order(config: Config, transitions, rival) -> list[str]:
    """Local predicate: a request first scheduled in a step while a ``rival(r, q)``
    admitted before it (by ``arrival_seq``) is still queued, never scheduled, its
    tenant's first ready sequence, at the step's end (the pool is ample here)."""
    for tr in transitions:
        heads = {}
        for i, t in enumerate(tr.state.tenants):
            h = next((s for s in t.queue if s.ready_step <= tr.output.step_index), None)
            if h is not None and h.never_scheduled:
                heads[i] = h
        firsts = [s for s in tuple(tr.state.running) + tuple(tr.output.finished)
                  if s.first_scheduled_s == tr.prev.t_s and s.preemptions == 0 and s.request_id in dict(tr.output.batch)]
        for r in firsts:
            for i, q in heads.items():
                if q.arrival_seq < r.arrival_seq and rival(r, q):
                    return [f"request {r.request_id} ({config.tenants[r.tenant].name}) was first scheduled at step "
                            f"{tr.output.step_index} while request {q.request_id} ({config.tenants[i].name}), "
                            "admitted before it, waited"]
    return []


def _lifo_twin():
    def formula() -> tuple[z3.BoolRef, dict]:
        dom = Domain("S", 3)
        s = qstate("lifo")
        g, post, p = actions(dom, s, "lifo", lifo=True)["admit"]
        n = Int("n_lifo")
        fresh = lambda x: If(And(s["q"][x], s["fr"][x], s["ten"][x] == 0), 1, 0)  # noqa: E731
        shape = And(dom.forall(lambda x: And(s["ten"][x] == 0, Not(s["run"][x]))),
                    n == sum(fresh(z3.IntVal(x)) for x in dom.indices()))
        return And(queue_inv(dom, s), g, shape, Not(tenant_claim(dom, s, p["x"]))), {"n": n}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        n = val(m, sym["n"])
        cfg = order_config("fcfs")
        reqs = [Request(j, "a", 0.0, 1, 1) for j in range(n)]
        trs = list(run_workload(cfg, reqs, max_steps=20, variant=TenantQueueLifo))
        h = simulate(cfg, reqs, max_steps=20, variant=TenantQueueLifo)
        ok, detail = verdict(out_of_order(cfg, trs, lambda r, q: r.tenant == q.tenant),
                             catalog_history("FCFS-TENANT", cfg, h),
                             f"variant tenant_queue_lifo, one slot, {n} requests of one tenant at t=0")
        return Replay(ok, detail, {"requests": n})
    return formula, replay


def _rr_twin(rival: str):
    """``policy=round_robin`` against FCFS-TIER (``rival='tier'``) or TIER-ORDER (``'order'``)."""
    def formula() -> tuple[z3.BoolRef, dict]:
        dom = Domain("S", 2)
        s = qstate(f"rr_{rival}")
        g, p = pick(dom, s, f"rr_{rival}", "any")
        riv = (tier_rival if rival == "tier" else order_rival)(s, p)
        shape = And(dom.forall(lambda x: And(s["q"][x], s["fr"][x], s["ten"][x] == x, p["tier"][x] >= 0,
                                             p["tier"][x] <= 1)), p["r"] == 0)
        bad = Not(rivals_blocked(dom, s, p, riv))
        return And(queue_inv(dom, s), g, shape, bad), {"tier": p["tier"], "sq": s["sq"]}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        tiers = tuple(val(m, sym["tier"][x]) for x in range(2))
        # round robin starts at tenant 0: tenant 0 holds the picked request r, tenant 1 the rival,
        # which arrives first (admitted before r)
        ref = order_config("fcfs" if rival == "tier" else "priority", tiers)
        cfg = order_config("round_robin", tiers)
        reqs = [Request(0, "b", 0.0, 1, 1), Request(1, "a", 0.0, 1, 1)]
        trs = list(run_workload(cfg, reqs, max_steps=20))
        h = simulate(cfg, reqs, max_steps=20)
        inv = "FCFS-TIER" if rival == "tier" else "TIER-ORDER"
        tier = lambda s: ref.tenants[s.tenant].tier  # noqa: E731
        pred = (lambda r, q: tier(r) == tier(q)) if rival == "tier" else (lambda r, q: tier(q) < tier(r))
        ok, detail = verdict(out_of_order(ref, trs, pred), catalog_history(inv, ref, h),
                             f"policy=round_robin, one slot, tiers a={tiers[0]}, b={tiers[1]}, b's request first")
        return Replay(ok, detail, {"tiers": list(tiers)})
    return formula, replay


def _proofs() -> tuple[Proof, ...]:
    lf, lr = _lifo_twin()
    tf, tr = _rr_twin("tier")
    of, orr = _rr_twin("order")
    return (
        Proof(id="FCFS-TENANT", family=FAMILY,
              claim="a fresh request enters the batch only as its tenant's oldest fresh one (queues keep admission "
                    "order; preempted ones at the front were admitted earlier)",
              scope="any N (sequences, tenants)", obligations=queue_obligations,
              twins=(Twin("lifo", "the queue order (variant tenant_queue_lifo)", lf, lr),)),
        Proof(id="FCFS-TIER", family=FAMILY,
              claim="under fcfs (and priority) a fresh request is first scheduled only while every older fresh head "
                    "of its tier belongs to a blocked tenant, which still has no room at the step's end",
              scope="any N (sequences, tenants)",
              obligations=lambda: queue_obligations() + pick_obligations("fcfs", "tier")
              + pick_obligations("priority", "tier") + room_obligations(),
              twins=(Twin("round-robin", "the arrival order of the pick (policy round_robin instead of fcfs)", tf, tr),),
              hypotheses=("the catalog's room for a head is no larger than the model's (room:end)",)),
        Proof(id="TIER-ORDER", family=FAMILY,
              claim="under priority a fresh request is first scheduled only while every fresh head of a higher tier "
                    "belongs to a blocked tenant, which still has no room at the step's end",
              scope="any N (sequences, tenants)",
              obligations=lambda: queue_obligations() + pick_obligations("priority", "order") + room_obligations(),
              twins=(Twin("round-robin", "the tier rank of the pick (policy round_robin instead of priority)", of,
                          orr),),
              hypotheses=("the catalog's room for a head is no larger than the model's (room:end)",)),
    )


PROOFS = _proofs()
