"""Z3 search: choose the adversary's arrival counts per time slot by
optimisation over an abstract model, then replay them on the Python model.

The pattern is ``timed_arrivals`` (c_k requests of one fixed shape in slot k,
k < :data:`~tenantry.adversaries.patterns.SLOTS`).  The abstract model is a
fluid queue per side (the adversary, and the victims as one tenant) measured
in *work* (slot-steps: output tokens plus prompt chunks of one step each):

* each slot serves at most ``C`` work, ``C = max_num_seqs * SLOT_S / step_s``
  with ``step_s`` the cost model's decode step;
* the victims' arrivals per slot are the real victims' work, binned;
* the order policy decides who is served within a slot, in ``CHUNKS`` chunks:
  ``fcfs`` is one queue in arrival order (victim work arriving in slot k
  waits behind the backlog carried into it: the term maximised is victim
  work times backlog);
  ``priority`` serves the adversary first; ``round_robin`` alternates
  chunks; ``vtc`` gives each chunk to the backlogged side with the smaller
  counter (each side's counter grows by its weighted tokens per unit of
  work), with the lift when the adversary becomes backlogged, or without it.

``z3.Optimize`` maximises the victims' total queued work over the slots (by
Little's law, their total waiting) subject to a fixed total number of
adversary requests (the pattern's default total), so the question is *when*
to send, not how much.  Each optimum is decoded into parameters, evaluated on
the real model through the executor (the ground truth; the abstraction only
proposes), then blocked, and the next optimum is sought while the budget
lasts.  Solves are bounded by a Z3 resource limit (deterministic) and a
timeout (a safety net).
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

import numpy as np

from tenantry.runner.setups import COST, REPLICA, get_setup

from .patterns import SLOT_S, SLOTS, TIMED_OUTPUT, TIMED_PROMPT, get_pattern
from .victims import default_victims

#: Order policies the abstract model encodes.
SUPPORTED = ("fcfs", "priority", "round_robin", "vtc")
#: Chunks per slot in the abstract model.
CHUNKS = 2
#: Z3 resource limit per solve (deterministic bound), and a wall-clock safety net (ms).
RLIMIT = 3_000_000
TIMEOUT_MS = 10_000


def _work(prompt: int, output: int) -> float:
    """Slot-steps a request occupies: one per output token plus one per prompt chunk."""
    return output + -(-prompt // REPLICA["token_budget"])


def supported(setup: str) -> bool:
    """Whether the abstract model encodes this setup's order policy."""
    return get_setup(setup).order.policy in SUPPORTED


def abstract_inputs(seed: int, victims: str = "excerpt") -> dict[str, Any]:
    """The abstract model's constants for the default victims of ``seed``."""
    step_s = COST.weight_read_s + COST.overhead_s + REPLICA["max_num_seqs"] * 400 * COST.kv_read_s_per_token
    cap = REPLICA["max_num_seqs"] * SLOT_S / step_s
    vw = [0.0] * SLOTS
    vcost = [0.0] * SLOTS
    for r in default_victims(seed, source=victims):
        k = int(r.arrival_s // SLOT_S)
        if k < SLOTS:
            vw[k] += _work(r.prompt_tokens, r.output_tokens)
            vcost[k] += r.prompt_tokens + 2 * r.output_tokens
    rho_v = sum(vcost) / max(sum(vw), 1e-9)
    wa = _work(TIMED_PROMPT, TIMED_OUTPUT)
    return {"capacity": cap, "victim_work": vw, "adv_work": wa, "rho_adv": (TIMED_PROMPT + 2 * TIMED_OUTPUT) / wa,
            "rho_victim": rho_v}


def build(setup: str, seed: int, total: int, max_per_slot: int, victims: str = "excerpt"):
    """The optimisation problem: (z3.Optimize, adversary count variables, objective term)."""
    import z3

    pol = get_setup(setup).order
    c = abstract_inputs(seed, victims)
    cap, wa = c["capacity"], c["adv_work"]
    opt = z3.Optimize()
    a = [z3.Int(f"c{k}") for k in range(SLOTS)]
    for x in a:
        opt.add(x >= 0, x <= max_per_slot)
    opt.add(z3.Sum(a) == total)
    qa, qv = z3.RealVal(0), z3.RealVal(0)
    ca, cv = z3.RealVal(0), z3.RealVal(0)
    waiting = []
    chunk = cap / CHUNKS
    turn_a = True  # round robin: whose turn
    for k in range(SLOTS):
        arr_a = a[k] * wa
        arr_v = z3.RealVal(c["victim_work"][k])
        if pol.policy == "vtc" and pol.lift:
            # The adversary becoming backlogged is lifted to the victims' counter if they are backlogged.
            ca = z3.If(z3.And(qa <= 0, arr_a > 0, qv > 0), z3.If(ca < cv, cv, ca), ca)
        if pol.policy == "fcfs":
            # One queue in arrival order: the victims arriving in slot k wait behind the backlog b.
            waiting.append(arr_v * qa)
            qa = qa + arr_a + arr_v - cap
            qa = z3.If(qa > 0, qa, 0)
            continue
        else:
            qa, qv = qa + arr_a, qv + arr_v
            for _ in range(CHUNKS):
                if pol.policy == "priority":
                    to_a = qa > 0
                elif pol.policy == "round_robin":
                    to_a = z3.Or(z3.And(qa > 0, z3.BoolVal(turn_a)), qv <= 0)
                    turn_a = not turn_a
                else:
                    to_a = z3.And(qa > 0, z3.Or(qv <= 0, ca <= cv))
                sa = z3.If(to_a, z3.If(qa < chunk, qa, chunk), 0)
                sv = z3.If(to_a, 0, z3.If(qv < chunk, qv, chunk))
                qa, qv = qa - sa, qv - sv
                ca, cv = ca + sa * c["rho_adv"], cv + sv * c["rho_victim"]
        waiting.append(qv)
    objective = z3.Sum(waiting)
    opt.maximize(objective)
    return opt, a, objective


def z3_search(r):
    """Maximise the abstract victims' waiting with Z3, replaying each optimum on the model.

    Args:
        r: the search's :class:`~tenantry.adversaries.search.Runner` (search ``z3``), which
            evaluates each schedule and keeps the best within the budget.

    Returns:
        ``r.result(note)``: a :class:`~tenantry.adversaries.search.SearchResult`; with no
        evaluation and a note when the pattern is not ``timed_arrivals`` or the setup's order
        policy is not in :data:`SUPPORTED`.
    """
    import z3

    setup, pattern, seed, victims = r.setup, r.pattern, r.seed, r.victims
    if pattern != "timed_arrivals":
        return r.result(f"z3 searches timed_arrivals only, not {pattern}")
    if not supported(setup):
        return r.result(f"z3: no abstract model of order policy {get_setup(setup).order.policy}")
    space = get_pattern(pattern).space
    total = int(sum(space.defaults().values()))
    max_per_slot = int(space.params[0].high)
    opt, a, _ = build(setup, r.scenario_seed, total, max_per_slot, victims)
    opt.set("smt.random_seed", seed % (2**31))  # this optimiser only: a global seed would change other Z3 users' queries
    opt.set("rlimit", RLIMIT)
    opt.set("timeout", TIMEOUT_MS)
    note = ""
    while r.remaining() != 0:
        res = opt.check()
        if res == z3.unsat:
            note = "z3: no further arrival schedule"
            break
        try:
            m = opt.model()
        except z3.Z3Exception:
            note = f"z3: {res} with no model (resource limit)"
            break
        counts = [m.eval(x, model_completion=True).as_long() for x in a]
        r.evaluate([{f"c{k}": counts[k] for k in range(SLOTS)}])
        opt.add(z3.Or([x != v for x, v in zip(a, counts)]))
        if res != z3.sat:
            note = f"z3: {res}: best model within the resource limit"
    return r.result(note)
