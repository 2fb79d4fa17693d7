"""Preemption makes room and no more: no victim once the requester fits
(EVICT-MINIMAL), and a step preempts only when its batch needs more blocks
than are free, each victim freeing at least one block (EVICT-PROGRESS)
(SPEC.md 8.13).  Family ``evict``, with the hysteresis proofs of 8.7.

**Accounting** of one step (``schedule_running`` / ``_make_room`` / ``_evict``,
then the waiting phase), per sequence ``a`` (blocks allocated to it in this
step), ``fb`` (what its eviction frees: ``_release``), ``g`` (the catalog's
allowance for its growth in the step: its next chunk at the whole token
budget, ``_eviction_books``), ``pl`` (planned), and scalars ``F`` (free
blocks), ``F0`` (free blocks when the running phase starts, after the
cancellations), ghost sums ``EV`` (freed by the victims so far), ``AV``
(allocated to them in this step), ``AP`` (allocated to the planned
entries), ``RM`` (the catalog's room after the victims so far:
``F0 + sum max(0, freed - g)``).  Invariant:
``F + AP + AV = F0 + EV`` and ``RM <= F0 + EV - AV`` (a victim frees at
least what it was given in the step, and ``g`` is at least that).

``_make_room`` evicts only while the requester is short (``need > F``), so at
every eviction ``RM <= F + AP < AP + need``.  From then on ``Y = AP +`` (the
requester's need while pending) ``+`` (the allowances of the victims from
this one on) never decreases (an allocation adds to AP; an eviction moves
``a <= g`` from AP to the allowances; the requester is served or becomes a
victim with ``g >= need``), and at the step's end the catalog's batch need
plus the later victims' allowances is at least Y.  So no victim after the
first is "one too many" (EVICT-MINIMAL), and at the first eviction
``F0 < Y <=`` the catalog's need (EVICT-PROGRESS, first part).

**Sole blocks** (second part: every victim frees a block).  Per sequence
``priv`` (private blocks), a witness key ``w``, per key ``refs``, and
``hold[s][k]``.  Invariant P, from a step's start through its running
phase: every running sequence has a private block or holds a key no one
else holds (``refs = 1``).  Releases keep it (a key held by two has
``refs >= 2``: KV-CONSERVE), allocations add private blocks.  The waiting
phase runs only when the running phase ended with budget left, so every
running sequence was just given ``n >= 1`` tokens; its shared blocks are
full blocks of its computed tokens (``sh * B <= c``), so it holds
``blocks_for(c + n) - sh >= 1`` private blocks (W); a new admission holds
``blocks_for(hits * B + n) - hits >= 1``.  Hits only raise ``refs``.  At
``execute``, ``_register`` turns at most ``priv`` blocks into new keys
(``refs = 1``), the last of them the new witness.  Without a prefix cache
``fb >= 1`` is immediate: a running sequence has computed a token.

Twins (no configuration removes them): ``one-more`` (variant
``evicts_one_more``: one more victim after the requester fits) and
``without-need`` (variant ``evicts_without_need``: the newest sequence is
evicted whenever the pool is more than half full).
"""

from __future__ import annotations

import z3
from z3 import And, If, Implies, Int, Lambda, Not, Or, Store

from tenantry.model.config import Config, CostConfig, EvictionConfig, OrderConfig, TenantConfig
from tenantry.model.workload import Request
from tenantry.runner.simulate import simulate
from tenantry.testing.mutants import EvictsOneMore, EvictsWithoutNeed

from .checks import catalog_history, verdict
from .concrete import run_workload
from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array, zmax

FAMILY = "evict"


# --- accounting --------------------------------------------------------------------------


def astate(tag: str) -> dict:
    return {"run": bool_array(f"run_{tag}"), "pl": bool_array(f"pl_{tag}"), "a": int_array(f"a_{tag}"),
            "fb": int_array(f"fb_{tag}"), "g": int_array(f"g_{tag}"),
            **{n: Int(f"{n}_{tag}") for n in ("F", "F0", "EV", "AV", "AP", "RM")}}


def ainv(dom: Domain, s: dict) -> z3.BoolRef:
    return And(s["F"] + s["AP"] + s["AV"] == s["F0"] + s["EV"], s["RM"] <= s["F0"] + s["EV"] - s["AV"], s["F"] >= 0,
               dom.forall(lambda x: And(s["a"][x] >= 0, Implies(s["pl"][x], s["run"][x]),
                                        Implies(s["run"][x], And(s["fb"][x] >= s["a"][x], s["g"][x] >= s["a"][x])),
                                        Implies(Not(s["pl"][x]), s["a"][x] == 0))))


def alloc(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """x (running, not yet planned) fits and takes n new blocks; the catalog allows it >= n
    (its next chunk at the whole budget)."""
    x, n = Int(f"x_{tag}"), Int(f"n_{tag}")
    g = And(dom.has(x), s["run"][x], Not(s["pl"][x]), n >= 0, n <= s["F"], s["g"][x] >= n, s["fb"][x] >= 0)
    post = {**s, "a": Store(s["a"], x, n), "pl": Store(s["pl"], x, True), "fb": Store(s["fb"], x, s["fb"][x] + n),
            "F": s["F"] - n, "AP": s["AP"] + n}
    return g, post, {"x": x, "n": n}


def evict(dom: Domain, s: dict, tag: str, guarded: bool = True) -> tuple[z3.BoolRef, dict, dict]:
    """``_make_room`` for requester x needing ``d`` blocks evicts v (``guarded``: only while
    x is short, ``d > F``); v frees fb[v] >= 1 (the sole-block part)."""
    x, v, d = Int(f"x_{tag}"), Int(f"v_{tag}"), Int(f"d_{tag}")
    g = And(dom.has(x), dom.has(v), s["run"][x], Not(s["pl"][x]), s["run"][v], d >= 1, s["fb"][v] >= 1,
            s["g"][x] >= d)
    if guarded:
        g = And(g, d > s["F"])
    a = s["a"][v]
    post = {**s, "run": Store(s["run"], v, False), "pl": Store(s["pl"], v, False), "a": Store(s["a"], v, 0),
            "F": s["F"] + s["fb"][v], "EV": s["EV"] + s["fb"][v], "AV": s["AV"] + a, "AP": s["AP"] - a,
            "RM": s["RM"] + zmax(0, s["fb"][v] - s["g"][v])}
    return g, post, {"x": x, "v": v, "d": d, "a": a}


def admit_waiting(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """The waiting phase admits a new entry taking n <= F blocks (new work never evicts)."""
    x, n = Int(f"x_{tag}"), Int(f"n_{tag}")
    g = And(dom.has(x), Not(s["run"][x]), n >= 1, n <= s["F"])
    post = {**s, "run": Store(s["run"], x, True), "pl": Store(s["pl"], x, True), "a": Store(s["a"], x, n),
            "fb": Store(s["fb"], x, n), "g": Store(s["g"], x, n), "F": s["F"] - n, "AP": s["AP"] + n}
    return g, post, {"x": x, "n": n}


def accounting_obligations() -> list[tuple[str, z3.BoolRef]]:
    dom = Domain("S")
    out = []
    s0 = astate("a0")
    start = And(s0["F"] == s0["F0"], s0["EV"] == 0, s0["AV"] == 0, s0["AP"] == 0, s0["RM"] == s0["F0"], s0["F0"] >= 0,
                dom.forall(lambda x: And(Not(s0["pl"][x]), s0["a"][x] == 0, s0["fb"][x] >= 0, s0["g"][x] >= 0)))
    out.append(("books:start", implies_all([dom.size >= 1, start], ainv(dom, s0))))
    for name, act in (("alloc", alloc), ("evict", evict), ("admit", admit_waiting)):
        s = astate(f"a_{name}")
        g, post, p = act(dom, s, f"a_{name}")
        out.append((f"books:{name}", implies_all([dom.size >= 1, ainv(dom, s), g], ainv(dom, post))))
        if name == "evict":
            out.append(("minimal", implies_all([dom.size >= 1, ainv(dom, s), g], s["RM"] < s["AP"] + p["d"])))
            out.append(("first-short", implies_all([dom.size >= 1, ainv(dom, s), g, s["EV"] == 0, s["AV"] == 0],
                                                   s["F0"] < s["AP"] + p["d"])))
    return out


def future_obligations() -> list[tuple[str, z3.BoolRef]]:
    """``Y = AP + PEND + GL`` never decreases after an eviction (PEND: the requester's need
    while it waits for its blocks; GL: allowances of the victims since), and the catalog's
    comparand (batch need ``BN >= AP``, later allowances ``GL``) is at least Y at the end."""
    AP, PEND, GL, d, n, a, g = (Int(f"{v}_fu") for v in ("AP", "PEND", "GL", "d", "n", "a", "g"))
    Y = AP + PEND + GL
    pend = Or(PEND == 0, PEND == d)
    base = [AP >= 0, d >= 1, pend, GL >= 0]
    out = [
        ("future:alloc-other", implies_all(base + [n >= 0], (AP + n) + PEND + GL >= Y)),
        ("future:alloc-requester", implies_all(base + [PEND == d], (AP + d) + 0 + GL >= Y)),
        ("future:evict-other", implies_all(base + [a >= 0, g >= a, a <= AP], (AP - a) + PEND + (GL + g) >= Y)),
        ("future:evict-requester", implies_all(base + [PEND == d, g >= d], AP + 0 + (GL + g) >= Y)),
        ("future:admit", implies_all(base + [n >= 1], (AP + n) + PEND + GL >= Y)),
    ]
    BN = Int("BN_fu")
    out.append(("future:end", implies_all([AP >= 0, GL >= 0, BN >= AP, PEND == 0], BN + GL >= Y)))
    return out


# --- sole blocks -------------------------------------------------------------------------


def kstate(tag: str) -> dict:
    return {"run": bool_array(f"krun_{tag}"), "priv": int_array(f"priv_{tag}"), "w": int_array(f"w_{tag}"),
            "refs": int_array(f"refs_{tag}"),
            "hold": z3.Array(f"hold_{tag}", z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.BoolSort()))}


def sole(s: dict, x) -> z3.BoolRef:
    return Or(s["priv"][x] >= 1, And(s["hold"][x][s["w"][x]], s["refs"][s["w"][x]] == 1))


def kv_facts(s: dict, x, u, k) -> z3.BoolRef:
    """KV-CONSERVE (8.8) at the terms used: refs counts the holders (two holders: >= 2;
    a held key: >= 1), private blocks >= 0."""
    return And(Implies(And(x != u, s["run"][x], s["run"][u], s["hold"][x][k], s["hold"][u][k]), s["refs"][k] >= 2),
               Implies(And(s["run"][x], s["hold"][x][k]), s["refs"][k] >= 1), s["priv"][x] >= 0)


def sole_obligations() -> list[tuple[str, z3.BoolRef]]:
    dom = Domain("S")
    x = Int("x_so")
    out = []
    # release(u): evicted, cancelled or finished: its keys lose a reference
    s, u = kstate("rel"), Int("u_rel")
    refs1 = Lambda([Int("k_rel")], If(s["hold"][u][Int("k_rel")], s["refs"][Int("k_rel")] - 1, s["refs"][Int("k_rel")]))
    post = {**s, "run": Store(s["run"], u, False), "refs": refs1}
    out.append(("sole:release", implies_all([dom.has(x), dom.has(u), x != u, s["run"][x], s["run"][u], sole(s, x),
                                             kv_facts(s, x, u, s["w"][x])], sole(post, x))))
    # alloc(y, n): private blocks grow
    s, y, n = kstate("al"), Int("y_al"), Int("n_al")
    post = {**s, "priv": Store(s["priv"], y, s["priv"][y] + n)}
    out.append(("sole:alloc", implies_all([dom.has(x), s["run"][x], sole(s, x), n >= 0], sole(post, x))))
    # into the waiting phase: x was given n >= 1 tokens, its shared blocks are full blocks of its computed tokens
    B, c, sh, nb, n = Int("B_w"), Int("c_w"), Int("sh_w"), Int("nb_w"), Int("n_w")
    planned = [B >= 1, c >= 0, sh >= 0, sh * B <= c, n >= 1, B * (nb - 1) < c + n, c + n <= B * nb]
    out.append(("sole:processed", implies_all(planned, nb - sh >= 1)))
    # a waiting-phase admission: hits h full blocks, computes n >= 1 more tokens
    h = Int("h_w")
    out.append(("sole:admitted", implies_all([B >= 1, h >= 0, n >= 1, B * (nb - 1) < h * B + n, h * B + n <= B * nb],
                                             nb - h >= 1)))
    # execute: _register turns m <= priv private blocks of y into new keys (refs 1, held by y alone); x with
    # a private block (W) keeps one, or its last new key is its witness
    s, y, m, k0 = kstate("reg"), Int("y_reg"), Int("m_reg"), Int("k0_reg")
    hold1 = Store(s["hold"], y, Store(s["hold"][y], k0, True))
    post = {**s, "priv": Store(s["priv"], y, s["priv"][y] - m), "refs": Store(s["refs"], k0, If(m >= 1, 1, s["refs"][k0])),
            "hold": If(m >= 1, hold1, s["hold"]), "w": If(m >= 1, Store(s["w"], y, k0), s["w"])}
    fresh_key = And(s["refs"][k0] == 0, dom.forall(lambda z: Not(s["hold"][z][k0])))
    out.append(("sole:register", implies_all([dom.has(x), dom.has(y), s["run"][x], s["priv"][x] >= 1, m >= 0,
                                              m <= s["priv"][y], fresh_key],
                                             sole(post, x))))
    # a register when x was not in the waiting phase (no waiting phase this step): P is kept
    out.append(("sole:register-p", implies_all([dom.has(x), dom.has(y), s["run"][x], sole(s, x), m >= 0,
                                                m <= s["priv"][y], fresh_key,
                                                kv_facts(s, x, x, s["w"][x])], sole(post, x))))
    # the claim: an eviction of x frees its private blocks and its keys left unreferenced: at least one
    s = kstate("cl")
    freed = s["priv"][x] + If(And(s["hold"][x][s["w"][x]], s["refs"][s["w"][x]] == 1), 1, 0)
    out.append(("sole:frees", implies_all([dom.has(x), s["run"][x], sole(s, x), kv_facts(s, x, x, s["w"][x])],
                                          freed >= 1)))
    return out


# --- replays -----------------------------------------------------------------------------


def room_config(num_blocks: int) -> Config:
    """One tenant, victims newest first, no cooldown, unit steps: the pool binds."""
    return Config(tenants=(TenantConfig("a"),), max_num_seqs=4, token_budget=64, num_blocks=num_blocks,
                  max_context_tokens=64, order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"),
                  eviction=EvictionConfig(victim="newest", cooldown_steps=0))


def extra_victims(config: Config, transitions) -> list[str]:
    """Local predicate (cache off, no cancellations): in a step, a victim taken when the
    free blocks before it already covered the growth still to be allocated."""
    B = config.block_size_tokens
    for tr in transitions:
        if not tr.output.preempted:
            continue
        held = {s.request_id: s.blocks_held for s in tr.prev.running}
        comp = {s.request_id: (s.computed_tokens, s.target_tokens) for s in tr.prev.running}
        free = config.num_blocks - tr.prev.kv.used_blocks
        growth = {rid: -(-(comp[rid][0] + n) // B) - held[rid] for rid, n in tr.output.batch if rid in comp}
        victims = [e for e in tr.output.events if e.kind == "preempted"]
        for j, e in enumerate(victims):
            if j and free >= sum(growth.values()):
                return [f"request {e.request_id} was evicted at step {tr.output.step_index} when {free} blocks were "
                        f"free for the {sum(growth.values())} the batch still needed"]
            free += e.blocks
    return []


def needless_evictions(config: Config, transitions) -> list[str]:
    """Local predicate (cache off, no cancellations): a step evicted while its batch's growth
    fitted the free blocks, or an eviction freed nothing."""
    B = config.block_size_tokens
    for tr in transitions:
        victims = [e for e in tr.output.events if e.kind == "preempted"]
        if not victims:
            continue
        held = {s.request_id: s.blocks_held for s in tr.prev.running}
        comp = {s.request_id: (s.computed_tokens, s.target_tokens) for s in tr.prev.running}
        free = config.num_blocks - tr.prev.kv.used_blocks
        need = sum(-(-(comp[rid][0] + n) // B) - held[rid] for rid, n in tr.output.batch if rid in comp)
        for e in victims:  # a victim's own growth at its largest: its next chunk within the whole budget
            c, target = comp[e.request_id]
            need += max(0, -(-(c + min(target - c, config.token_budget)) // B) - held[e.request_id])
        if need <= free or any(e.blocks == 0 for e in victims):
            return [f"step {tr.output.step_index} evicted request {victims[0].request_id} while its batch needed at "
                    f"most {need} blocks and {free} were free"]
    return []


def _twin(kind: str):
    def formula() -> tuple[z3.BoolRef, dict]:
        dom = Domain("S", 3)
        s = astate(f"tw_{kind}")
        g, post, p = evict(dom, s, f"tw_{kind}", guarded=False)
        if kind == "one-more":
            # a first victim made room (EV > 0), the requester now fits, one more victim is taken
            bad = And(s["EV"] >= 1, p["d"] <= s["F"], s["RM"] >= s["AP"] + p["d"])
        else:
            # the step's first eviction while the free blocks cover the batch's need
            bad = And(s["EV"] == 0, s["AV"] == 0, s["F0"] >= s["AP"] + p["d"])
        shape = And(s["F0"] <= 4, dom.forall(lambda x: s["g"][x] <= 2))
        return And(ainv(dom, s), g, shape, bad), {"F": s["F"]}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        if kind == "one-more":
            # a (16-token prompt) fills its block and needs a second; b and c hold the pool's other two
            cfg, variant, inv, pred = room_config(3), EvictsOneMore, "EVICT-MINIMAL", extra_victims
            reqs = [Request(0, "a", 0.0, 16, 2), Request(1, "a", 0.0, 1, 3), Request(2, "a", 0.0, 1, 3)]
            what = "variant evicts_one_more, a 3-block pool: one request needs a block, two hold one each"
        else:
            cfg, variant, inv, pred = room_config(8), EvictsWithoutNeed, "EVICT-PROGRESS", needless_evictions
            reqs = [Request(0, "a", 0.0, 40, 4), Request(1, "a", 0.0, 20, 4)]
            what = "variant evicts_without_need, an 8-block pool, two requests holding 5 blocks and needing none"
        trs = list(run_workload(cfg, reqs, max_steps=40, variant=variant))
        h = simulate(cfg, reqs, max_steps=40, variant=variant, detail=True)
        ok, detail = verdict(pred(cfg, trs), catalog_history(inv, cfg, h), what)
        return Replay(ok, detail, {"num_blocks": cfg.num_blocks, "requests": len(reqs)})
    return formula, replay


def _proofs() -> tuple[Proof, ...]:
    mf, mr = _twin("one-more")
    pf, pr = _twin("without-need")
    return (
        Proof(id="EVICT-MINIMAL", family=FAMILY,
              claim="every eviction comes while the requester is short, so the room made by the victims before it is "
                    "less than the batch still needs: no victim after the requester fits",
              scope="any N (sequences), one step", obligations=lambda: accounting_obligations() + future_obligations(),
              twins=(Twin("one-more", "stopping once the requester fits (variant evicts_one_more)", mf, mr),),
              hypotheses=("no enforced cap (the catalog does not judge evictions under a cap)",
                          "free blocks at the step's start as the pool has them: a cancelled request's shared "
                          "blocks still held by others are not free (the catalog counts them: see 8.13)")),
        Proof(id="EVICT-PROGRESS", family=FAMILY,
              claim="a step's first eviction comes while its batch needs more blocks than are free, and every victim "
                    "frees a block (a running sequence always holds a block no other references)",
              scope="any N (sequences, keys), one step",
              obligations=lambda: accounting_obligations() + future_obligations() + sole_obligations(),
              twins=(Twin("without-need", "evicting only for a short requester (variant evicts_without_need)", pf,
                          pr),),
              hypotheses=("no enforced cap", "KV-CONSERVE (8.8): refs counts the holders of a key",
                          "free blocks at the step's start as the pool has them (see EVICT-MINIMAL)")),
    )


PROOFS = _proofs()
