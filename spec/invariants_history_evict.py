"""Record forms of the admission and eviction invariants (SPEC.md 7.3 and 7.4):
TOKEN-BUCKET, TOKEN-LIMIT, EVICT-COOLDOWN, EVICT-BOUNDED, VICTIM, EVICT-MIN-FREE.

The same contract as :mod:`tenantry.spec.invariants_history`: each
``h_*(hctx) -> list[Finding]`` reads only the records plus the claimed
configuration; where it judges step by step, its judgement of one step is
``s_*(h, v, pv, carry)``, which is also the invariant's state form
(:func:`tenantry.spec.invariants_state.from_record`).
"""

from __future__ import annotations

from tenantry.runner.history import StepEvent

from .invariants_core import EPS, Finding
from .invariants_history import HistoryContext, _f, each_step
from .replay import StepView


# --- admission -------------------------------------------------------------------------


def h_token_bucket(h: HistoryContext) -> list[Finding]:
    """TOKEN-BUCKET (SPEC.md 7.3), history form: the prompt tokens a tenant had
    admitted in any window [t1, t2] of admission times total at most
    burst + rate * (t2 - t1); with ``reserve_output``, less the output refunded
    in the window (a request leaving before its last token gives back its
    reserved output, which may have been taken before t1)."""
    cfg, out = h.config, []
    if not cfg.admission.token_bucket or cfg.admission.prompt_estimate != "tokens":
        return out
    for t in cfg.tenants:
        if t.token_rate_per_s is None:
            continue
        over = _window_over(_bucket_ledger(h, t.name, with_output=False), t.token_rate_per_s, t.token_burst_tokens)
        if over is not None:
            excess, (t1, r1), (t2, r2) = over
            less = " less the output refunded" if cfg.admission.reserve_output else ""
            out.append(_f("TOKEN-BUCKET", None, f"prompt tokens admitted between t={t1:.6g}s and "
                          f"t={t2:.6g}s{less} exceed burst + rate x window", excess, t.token_burst_tokens,
                          [t.name], [r1, r2]))
    return out


def _bucket_ledger(h: HistoryContext, tenant: str, with_output: bool) -> list[tuple[float, int, int]]:
    """Tenant ``tenant``'s token-bucket charges as (time s, tokens, request id), in time order:
    each admitted request's prompt (plus its output allowance when ``with_output``) at its
    admission (the start of the step that queued it), and with ``reserve_output`` the output a
    request cancelled or rejected after admission did not generate, refunded (negative) at its
    end; refunds of cancellations come before the admissions at one time and refunds of
    rejections after them (the step's phases)."""
    start = {s.step_index: s.start_s for s in h.steps}
    refunds = h.config.admission.reserve_output
    ledger = []  # (time, order, tokens, request id)
    for r in h.history.requests:
        if r.tenant != tenant or r.admitted_step is None:
            continue
        ledger.append((start.get(r.admitted_step, r.arrival_s), 1,
                       r.prompt_tokens + (r.output_tokens if with_output else 0), r.request_id))
        if refunds and r.outcome in ("cancelled", "rejected") and r.finish_s is not None:
            ledger.append((r.finish_s, 0 if r.outcome == "cancelled" else 2,
                           -(r.output_tokens - r.tokens_generated), r.request_id))
    ledger.sort()
    return [(ts, n, rid) for ts, _, n, rid in ledger]


def _window_over(charges, rate: float, burst: float):
    """The first window [t1, t2] over which ``charges`` ((time s, tokens, request id), in time
    order) exceed ``burst + rate * (t2 - t1)``: (excess, (t1, request), (t2, request)), or None.
    One pass: the window's start is the earlier charge minimising ``total before it - rate * t``."""
    total, best, best_i = 0.0, None, None
    for ts, n, rid in charges:
        key = total - rate * ts
        if best is None or key < best:
            best, best_i = key, (ts, rid)
        total += n
        excess = total - rate * ts - best
        if excess > burst + EPS:
            return excess, best_i, (ts, rid)
    return None


def h_token_limit(h: HistoryContext) -> list[Finding]:
    """TOKEN-LIMIT (SPEC.md 7.3), record form, with ``reserve_output``: for each
    tenant and any window [t1, t2], the tokens it was charged for, each admitted
    request's prompt plus output (its allowance, ``output_tokens``) at its admission,
    less the output a request cancelled or rejected after admission did not
    generate, at its end, total at most ``burst + rate * (t2 - t1)``.  For requests
    that finish this is what they consumed, prompt plus generated tokens."""
    cfg, out = h.config, []
    if not cfg.admission.token_bucket or cfg.admission.prompt_estimate != "tokens":
        return out
    for t in cfg.tenants:
        if t.token_rate_per_s is None:
            continue
        over = _window_over(_bucket_ledger(h, t.name, with_output=True), t.token_rate_per_s, t.token_burst_tokens)
        if over is not None:
            excess, (t1, r1), (t2, r2) = over
            out.append(_f("TOKEN-LIMIT", None, f"prompt + output tokens charged between t={t1:.6g}s and "
                          f"t={t2:.6g}s exceed burst + rate x window", excess, t.token_burst_tokens,
                          [t.name], [r1, r2]))
    return out


# --- eviction --------------------------------------------------------------------------


def s_evict_cooldown(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """EVICT-COOLDOWN's judgement of one step (:func:`h_evict_cooldown`)."""
    k, c, out = v.record.step_index, h.config.eviction.cooldown_steps, []
    for rid, ready in v.entries:
        if ready > k:
            r = h.requests.get(rid)
            out.append(_f("EVICT-COOLDOWN", k, f"request ran again {k - (ready - 1 - c)} steps after its preemption",
                          k, ready, [r.tenant] if r is not None else [], [rid]))
    return out


def h_evict_cooldown(h: HistoryContext) -> list[Finding]:
    """EVICT-COOLDOWN (SPEC.md 7.4), record form: a request preempted in step k does not
    enter a batch before step k + 1 + cooldown_steps (:func:`s_evict_cooldown`)."""
    return each_step(h, s_evict_cooldown)


def s_evict_bounded(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """EVICT-BOUNDED's judgement of one step (:func:`h_evict_bounded`): each eviction in it."""
    k_max, k, out = h.config.eviction.max_evictions, v.record.step_index, []
    for rid, kind, computed, n in v.evictions:
        r = h.requests.get(rid)
        if r is None:
            continue
        if kind == "preempted" and k_max is not None and n > k_max:
            out.append(_f("EVICT-BOUNDED", k, "preempted more than max_evictions times", n, k_max, [r.tenant], [rid]))
        if kind == "rejected" and n != k_max:
            out.append(_f("EVICT-BOUNDED", k, "evicted_too_often before max_evictions evictions", n, k_max,
                          [r.tenant], [rid]))
        if computed > r.prompt_tokens + r.output_tokens - 1:
            out.append(_f("EVICT-BOUNDED", k, "an eviction discarded more than prompt + output - 1 computed tokens",
                          computed, r.prompt_tokens + r.output_tokens - 1, [r.tenant], [rid]))
    return out


def h_evict_bounded(h: HistoryContext) -> list[Finding]:
    """EVICT-BOUNDED (SPEC.md 7.4), record form: over the request records (with or without
    steps), preemptions <= max_evictions, evicted_too_often only at max_evictions,
    recomputed tokens <= preemptions x (prompt + output - 1); and step by step, for the
    requests the records do not already convict, no eviction takes a request past
    max_evictions preemptions, ``evicted_too_often`` comes only at max_evictions, and an
    eviction discards at most prompt + output - 1 computed tokens (:func:`s_evict_bounded`)."""
    k_max, out = h.config.eviction.max_evictions, []
    for r in h.history.requests:
        if k_max is not None and r.preemptions > k_max:
            out.append(_f("EVICT-BOUNDED", None, "preempted more than max_evictions times", r.preemptions, k_max,
                          [r.tenant], [r.request_id]))
        if r.reason == "evicted_too_often" and r.preemptions != k_max:
            out.append(_f("EVICT-BOUNDED", None, "evicted_too_often before max_evictions evictions", r.preemptions,
                          k_max, [r.tenant], [r.request_id]))
        cap = r.preemptions * (r.prompt_tokens + r.output_tokens - 1)
        if r.wasted_prefill_tokens > cap:
            out.append(_f("EVICT-BOUNDED", None, "recomputed tokens exceed preemptions x (prompt + output - 1)",
                          r.wasted_prefill_tokens, cap, [r.tenant], [r.request_id]))
    named = {f.requests[0] for f in out}
    return out + [f for f in each_step(h, s_evict_bounded) if f.requests[0] not in named]


def _victim_rank(h: HistoryContext, pol: str):
    """The victim policy's order over request ids (smaller first), restated from admission
    order and tiers (not read from the model's registry); None for ``largest``."""
    if pol not in ("newest", "lowest_priority"):
        return None
    reqs = h.requests

    def order(rid: int) -> tuple:
        r = reqs[rid]
        return (-r.admitted_step, -r.arrival_s, -rid)
    return order if pol == "newest" else (lambda rid: (-h.tier(reqs[rid].tenant),) + order(rid))


def s_victim(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """VICTIM's judgement of one step (:func:`h_victim`)."""
    cfg, s, out = h.config, v.record, []
    events = s.events or tuple(StepEvent("preempted", rid) for rid in s.preempted)
    evs = [e for e in events if e.kind == "preempted" or (e.kind == "rejected" and e.reason == "evicted_too_often")]
    if not evs:
        return out
    pol = cfg.eviction.victim
    rank = _victim_rank(h, pol)
    gone = {rid for rid, _ in v.cancelled}
    cands = {rid for rid in v.before if rid not in gone and rid in h.requests
             and h.requests[rid].admitted_step is not None}
    for e in evs:
        rid = e.request_id
        if rid not in cands:
            continue
        cands.discard(rid)
        if e.reason == "priority":  # chosen among the lower tiers for a waiting head (PRIORITY-PREEMPT)
            continue
        tenant = [h.requests[rid].tenant]
        if rank is not None:
            better = [c for c in cands if rank(c) < rank(rid)]
            if better:
                c = min(better, key=rank)
                out.append(_f("VICTIM", s.step_index, f"the {pol} policy ranks request {c} before the victim, "
                              f"request {rid}", rid, c, tenant, [rid, c]))
        elif (pol == "largest" and e.kind == "preempted" and cfg.prefix_cache == "off" and s.events
              and h.replay.exact and cands):
            big = max(sorted(cands), key=lambda c: cfg.blocks_for(v.before[c][0]))
            held = cfg.blocks_for(v.before[big][0])
            if held > e.blocks:
                out.append(_f("VICTIM", s.step_index, f"request {big} held more blocks than the 'largest' victim",
                              e.blocks, held, tenant, [rid, big]))
    return out


def h_victim(h: HistoryContext) -> list[Finding]:
    """VICTIM (SPEC.md 7.4), record form: the victims of a step, in event order, are
    chosen among the requests running before it (less cancellations and earlier
    victims): for ``newest`` and ``lowest_priority`` each is the first by the policy's
    order, from admission order and tiers; for ``largest`` (with the cache off and
    events recorded) no candidate held more blocks than the victim freed
    (:func:`s_victim`).  Evictions for priority are PRIORITY-PREEMPT's."""
    return each_step(h, s_victim)


def s_evict_min_free(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """EVICT-MIN-FREE's judgement of one step (:func:`h_evict_min_free`)."""
    cfg, out = h.config, []
    m = cfg.eviction.min_free_blocks
    if not h.replay.exact:
        return out
    s = v.record
    for e in s.events or tuple(StepEvent("preempted", rid) for rid in s.preempted):
        if e.kind != "preempted" or e.request_id not in v.before:
            continue
        c, target = v.before[e.request_id]
        freed = e.blocks if s.events else cfg.blocks_for(c)
        if freed >= m:
            continue
        r = h.requests[e.request_id]
        if cfg.blocks_for(c + min(target - c, cfg.token_budget)) <= max(freed, cfg.blocks_for(c)):
            out.append(_f("EVICT-MIN-FREE", s.step_index, "a victim freeing fewer than min_free_blocks was evicted "
                          "for another sequence", freed, m, [r.tenant], [e.request_id]))
    return out


def h_evict_min_free(h: HistoryContext) -> list[Finding]:
    """EVICT-MIN-FREE (SPEC.md 7.4), record form: an eviction that frees fewer than
    ``min_free_blocks`` (its event's ``blocks``; in records without events, the
    blocks its computed tokens filled) is the requesting sequence giving up its
    own blocks: the victim must have needed a new block in this step (:func:`s_evict_min_free`)."""
    return each_step(h, s_evict_min_free)
