"""Eviction hysteresis: at most K evictions per sequence (and recompute waste at
most K times its context), no readmission within the cooldown, and every
eviction made for another sequence frees at least the minimum (SPEC.md 8.7).

Per sequence (Z3 arrays over any number of sequences): ``pre`` preemptions,
``alive``, ``waste`` (recomputed tokens), ``B`` (a ghost budget growing by
``m = prompt + output - 1`` per eviction), ``ready`` and ``ev`` (the step of
its last eviction, -1 for none), ``freeable`` blocks.  Transitions follow
``_make_room`` / ``_evict`` (``model/running.py``):

* ``evict(v)``: a victim already evicted ``max_evictions`` times is rejected;
  else ``pre += 1``, ``waste += computed`` (``computed <= m``: a running
  sequence has computed at most its target, prompt + output - 1 while it
  still owes a token), ``ready = k + 1 + cooldown_steps``, ``ev = k``;
* ``admit(s)``: ``_admit_head`` only takes a sequence with ``ready <= k``;
* ``choose(v)``: the victims ``_make_room`` may choose are the requesting
  sequence and the running sequences whose eviction frees at least
  ``min_free_blocks`` (``_freeable``, exactly what ``_release`` frees).
"""

from __future__ import annotations

import z3
from z3 import And, Implies, Int, Not, Store

from tenantry.model.config import Config, CostConfig, EvictionConfig, OrderConfig, TenantConfig
from tenantry.model.state import State
from tenantry.model.step import step
from tenantry.model.workload import StepInput

from .checks import catalog_state, verdict
from .concrete import SeqSpec, TenantSpec, Transition, build_state
from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array, val

FAMILY = "evict"


# --- EVICT-BOUNDED ---------------------------------------------------------------------


def bstate(tag: str) -> dict:
    return {"pre": int_array(f"pre_{tag}"), "alive": bool_array(f"alive_{tag}"), "waste": int_array(f"waste_{tag}"),
            "B": int_array(f"B_{tag}")}


def bounded_inv(dom: Domain, s: dict, K: z3.ArithRef) -> z3.BoolRef:
    return dom.forall(lambda x: Implies(s["alive"][x], And(s["pre"][x] >= 0, s["pre"][x] <= K, s["waste"][x] >= 0,
                                                           s["waste"][x] <= s["B"][x])))


def evict_bounded(dom: Domain, s: dict, K: z3.ArithRef, m: z3.ArrayRef, tag: str, limited: bool = True):
    """``_evict(v)``: rejected ``evicted_too_often`` at ``pre >= K``, else re-queued."""
    v, comp = Int(f"v_{tag}"), Int(f"comp_{tag}")
    guard = And(dom.has(v), s["alive"][v], comp >= 0, comp <= m[v])
    reject = And(limited, s["pre"][v] >= K)
    post = {"alive": Store(s["alive"], v, Not(reject)),
            "pre": Store(s["pre"], v, z3.If(reject, s["pre"][v], s["pre"][v] + 1)),
            "waste": Store(s["waste"], v, z3.If(reject, s["waste"][v], s["waste"][v] + comp)),
            "B": Store(s["B"], v, z3.If(reject, s["B"][v], s["B"][v] + m[v]))}
    return guard, post, {"v": v, "comp": comp}


def bounded_obligations() -> list[tuple[str, z3.BoolRef]]:
    dom, K, m = Domain("S"), Int("K"), int_array("m")
    setup = And(dom.size >= 1, K >= 0, dom.forall(lambda x: m[x] >= 0))
    born = Int("born")
    s = bstate("ev")
    g, post, _ = evict_bounded(dom, s, K, m, "ev")
    # an admitted sequence enters with nothing (arrive): the others are unchanged
    s1 = bstate("arr")
    arrived = {"alive": Store(s1["alive"], born, True), "pre": Store(s1["pre"], born, 0),
               "waste": Store(s1["waste"], born, 0), "B": Store(s1["B"], born, 0)}
    return [("arrive", implies_all([setup, bounded_inv(dom, s1, K), dom.has(born)], bounded_inv(dom, arrived, K))),
            ("evict", implies_all([setup, bounded_inv(dom, s, K), g], bounded_inv(dom, post, K)))]


# --- EVICT-COOLDOWN -------------------------------------------------------------------


def cooldown_inv(dom: Domain, ready: z3.ArrayRef, ev: z3.ArrayRef, cd: z3.ArithRef, k: z3.ArithRef) -> z3.BoolRef:
    return dom.forall(lambda x: And(ev[x] < k, Implies(ev[x] >= 0, ready[x] >= ev[x] + 1 + cd)))


def cooldown_obligations(model_cd: z3.ArithRef | None = None, n: int | None = None) -> list[tuple[str, z3.BoolRef]]:
    """``model_cd``: the cooldown the model applies (None: the claimed one); ``n``: a concrete
    number of sequences (None: any number, the proof)."""
    dom, cd = Domain("S", n), Int("cd")
    k, ready, ev = Int("k"), int_array("ready"), int_array("ev")
    setup = And(dom.size >= 1, cd >= 0, k >= 0)
    inv = cooldown_inv(dom, ready, ev, cd, k)
    v, s = Int("v"), Int("s")
    applied = cd if model_cd is None else model_cd
    evicted = cooldown_inv(dom, Store(ready, v, k + 1 + applied), Store(ev, v, k), cd, k + 1)
    arrived = cooldown_inv(dom, Store(ready, v, k), Store(ev, v, -1), cd, k)
    admit_ok = Implies(And(dom.has(s), ready[s] <= k, ev[s] >= 0), k >= ev[s] + 1 + cd)
    return [("evict+tick", implies_all([setup, inv, dom.has(v)], evicted)),
            ("tick", implies_all([setup, inv], cooldown_inv(dom, ready, ev, cd, k + 1))),
            ("arrive", implies_all([setup, inv, dom.has(v)], arrived)),
            ("admit", implies_all([setup, inv], admit_ok))]


# --- EVICT-MIN-FREE --------------------------------------------------------------------


def choose(dom: Domain, tag: str, mf_model: z3.ArithRef):
    """``_make_room``'s candidate set and the victim's freed blocks."""
    freeable, tenant = int_array(f"freeable_{tag}"), int_array(f"tenant_{tag}")
    s0, v, cap_short = Int(f"s0_{tag}"), Int(f"v_{tag}"), z3.Bool(f"cap_short_{tag}")
    guard = And(dom.has(s0), dom.has(v), dom.forall(lambda x: freeable[x] >= 0),
                z3.Or(Not(cap_short), tenant[v] == tenant[s0]), z3.Or(v == s0, freeable[v] >= mf_model))
    return guard, {"freeable": freeable, "s0": s0, "v": v, "freed": freeable[v]}


def min_free_obligations() -> list[tuple[str, z3.BoolRef]]:
    dom, mf = Domain("S"), Int("mf")
    g, p = choose(dom, "mf", mf)
    return [("choose", implies_all([dom.size >= 1, mf >= 0, g, p["v"] != p["s0"]], p["freed"] >= mf))]


# --- replays: one running sequence needs a block the full pool does not have ------------


def pressure_config(max_evictions: int | None = None, cooldown: int = 0, min_free: int = 0) -> Config:
    """Two tenants, a two-block pool, victims newest first."""
    return Config(tenants=(TenantConfig("a"), TenantConfig("b")), max_num_seqs=4, token_budget=64, num_blocks=2,
                  max_context_tokens=32, order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"),
                  eviction=EvictionConfig(victim="newest", max_evictions=max_evictions, cooldown_steps=cooldown,
                                          min_free_blocks=min_free))


def pressure_state(config: Config, step_index: int = 0, victim_preemptions: int = 0) -> State:
    """a's sequence has filled its block (16 tokens) and needs a second for its last
    token; b's newer sequence holds the pool's other block."""
    return build_state(config, [TenantSpec(seqs=(SeqSpec(16, 2, done=1, running=True),)),
                                TenantSpec(seqs=(SeqSpec(1, 3, done=1, running=True,
                                                         preemptions=victim_preemptions),))],
                       step_index=step_index)


def _bounded_twin():
    def formula():
        dom, K, m = Domain("S"), Int("K_tw"), int_array("m_tw")
        s = bstate("btw")
        g, post, p = evict_bounded(dom, s, K, m, "btw", limited=False)
        shape = And(dom.size == 1, K >= 1, K <= 4, dom.forall(lambda x: m[x] == 3))
        bad = Not(bounded_inv(dom, post, K))
        return And(bounded_inv(dom, s, K), g, shape, bad), {"K": K, "s": s, "v": p["v"]}

    def replay(m, sym):
        k_ref = val(m, sym["K"])
        pre_count = val(m, sym["s"]["pre"][val(m, sym["v"])])
        cfg, ref = pressure_config(max_evictions=None), pressure_config(max_evictions=k_ref)
        pre = pressure_state(cfg, victim_preemptions=pre_count)
        post, out = step(cfg, pre, StepInput())
        tr = Transition(pre, StepInput(), post, out)
        local = [f"request {s.request_id} has been evicted {s.preemptions} times, more than K = {k_ref}"
                 for s in post.sequences() if s.preemptions > k_ref]
        ok, detail = verdict(local, catalog_state("EVICT-BOUNDED", ref, [tr]),
                             f"max_evictions=None, victim evicted {pre_count} times before")
        return Replay(ok, detail, {"K": k_ref, "preemptions_before": pre_count})
    return formula, replay


def _cooldown_twin():
    def formula():
        # two sequences suffice for the counterexample; the symbolic domain's quantifiers made the
        # query's first seed time out in some sequences of queries (3 s before the retry answered)
        obligations = dict(cooldown_obligations(model_cd=z3.IntVal(0), n=2))
        k, cd = Int("k"), Int("cd")
        return And(obligations["evict+tick"], k <= 20, cd >= 1, cd <= 5), {"cd": cd, "k": k}

    def replay(m, sym):
        cd_ref = max(1, val(m, sym["cd"]))
        k0 = max(0, val(m, sym["k"]))
        cfg, ref = pressure_config(cooldown=0), pressure_config(cooldown=cd_ref)
        pre = pressure_state(cfg, step_index=k0)
        mid, out1 = step(cfg, pre, StepInput())
        post, out2 = step(cfg, mid, StepInput())
        trs = [Transition(pre, StepInput(), mid, out1), Transition(mid, StepInput(), post, out2)]
        victim = out1.preempted[0] if out1.preempted else None
        local = []
        if victim is not None and victim in dict(out2.batch):
            local.append(f"request {victim} evicted at step {k0} ran again at step {k0 + 1}, before step "
                         f"{k0 + 1 + cd_ref} (cooldown {cd_ref})")
        ok, detail = verdict(local, catalog_state("EVICT-COOLDOWN", ref, trs), "cooldown_steps=0")
        return Replay(ok, detail, {"cooldown_claimed": cd_ref, "evicted_at_step": k0, "victim": victim})
    return formula, replay


def _min_free_twin():
    def formula():
        dom, mf_ref = Domain("S"), Int("mf_ref")
        g, p = choose(dom, "mft", z3.IntVal(0))
        shape = And(dom.size == 2, mf_ref >= 2, mf_ref <= 4, p["freed"] == 1)
        return And(g, shape, p["v"] != p["s0"], p["freed"] < mf_ref), {"mf": mf_ref}

    def replay(m, sym):
        mf_ref = val(m, sym["mf"])
        cfg, ref = pressure_config(min_free=0), pressure_config(min_free=mf_ref)
        pre = pressure_state(cfg)
        post, out = step(cfg, pre, StepInput())
        tr = Transition(pre, StepInput(), post, out)
        requester = pre.running[0].request_id
        local = [f"request {e.request_id} was evicted for request {requester} freeing {e.blocks} block(s), fewer "
                 f"than min_free_blocks = {mf_ref}" for e in out.events
                 if e.kind == "preempted" and e.request_id != requester and e.blocks < mf_ref]
        ok, detail = verdict(local, catalog_state("EVICT-MIN-FREE", ref, [tr]), "min_free_blocks=0")
        return Replay(ok, detail, {"min_free_claimed": mf_ref})
    return formula, replay


def _proofs():
    bf, br = _bounded_twin()
    cf, cr = _cooldown_twin()
    mf, mr = _min_free_twin()
    return (
        Proof(id="EVICT-BOUNDED", family=FAMILY,
              claim="a sequence is evicted at most K = max_evictions times and recomputes at most K*(prompt+output-1) "
                    "tokens",
              scope="any N", obligations=bounded_obligations,
              twins=(Twin("no-limit", "the eviction limit (max_evictions=None)", bf, br),)),
        Proof(id="EVICT-COOLDOWN", family=FAMILY,
              claim="a sequence evicted at step k is not readmitted before step k + 1 + cooldown_steps",
              scope="any N", obligations=cooldown_obligations,
              twins=(Twin("no-cooldown", "the readmit cooldown (cooldown_steps=0)", cf, cr),)),
        Proof(id="EVICT-MIN-FREE", family=FAMILY,
              claim="an eviction made for another sequence frees at least min_free_blocks",
              scope="any N, one eviction", obligations=min_free_obligations,
              twins=(Twin("no-minimum", "the minimum-free filter (min_free_blocks=0)", mf, mr),)),
    )


PROOFS = _proofs()
