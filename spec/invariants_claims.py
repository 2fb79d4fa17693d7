"""Record forms of the invariants that say what a refusal, an order, a wait and an
eviction may be (SPEC.md 7.3, 7.2 and 7.4): REFUSAL-TRUTH, REQUEST-RATE,
BOUNDED-WAIT, FCFS-TENANT, FCFS-TIER, TIER-ORDER, EVICT-MINIMAL, EVICT-PROGRESS.

Each ``h_*(h: HistoryContext) -> list[Finding]`` reads only the records (the
replay of :mod:`tenantry.spec.replay` and the configuration), so it judges the
model's runs, a scheduler driven by the harness and a recorded history alike.
Nothing here calls the model: the buckets, queues and pool are recomputed from
the configuration and what the records say happened.
"""

from __future__ import annotations

from tenantry.model.events import REJECT_REASONS

from .invariants_core import EPS, Finding, at_slot_cap, caps_enforced
from .invariants_history import HistoryContext, _f


# --- admission ------------------------------------------------------------------------


class _Bucket:
    """A bucket of ``rate`` per second up to ``burst``, refilled lazily (SPEC.md 4.2)."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst, self.level, self.t_s = rate, burst, float(burst), 0.0

    def at(self, t_s: float) -> float:
        if t_s > self.t_s:
            self.level = min(self.burst, self.level + self.rate * (t_s - self.t_s))
            self.t_s = t_s
        return self.level


def _give_back(b: _Bucket, t_s: float, tokens: int) -> None:
    """A reserved output allowance not generated returns to bucket b at t_s (capped at the burst)."""
    if tokens > 0:
        b.at(t_s)
        b.level = min(b.burst, b.level + tokens)


def h_refusal_truth(h: HistoryContext) -> list[Finding]:
    """REFUSAL-TRUTH (SPEC.md 7.3), record form: every 429 names a known reason, and
    the reason was true when it was given: ``too_long`` (prompt + output over the
    context limit), ``too_large`` (more blocks than the pool or the enforced cap),
    ``rate_limit`` (the request bucket held less than one request), ``token_bucket``
    (the token bucket held less than the prompt, plus the output with
    ``reserve_output``, or that charge exceeds the burst),
    ``queue_full`` (the tenant's never-scheduled queue at its bound),
    ``kv_watermark`` (blocks in use at or above the tier's watermark; with
    ``kv_watermark_queued``, blocks in use + the blocks of never-scheduled
    requests queued in tiers 0..t + its own over it), ``estimated_wait`` (the
    service tokens queued never-scheduled in its tier over the service rate
    exceed the tier's limit), ``evicted_too_often`` (max_evictions evictions so far).  The buckets and
    the queue are recomputed from the configuration and the records; a bucket
    charged by a byte-length estimate is not judged."""
    cfg, adm, out = h.config, h.config.admission, []
    req_b = {t.name: _Bucket(t.request_rate_per_s, t.request_burst) for t in cfg.tenants
             if t.request_rate_per_s is not None}
    tok_b = {t.name: _Bucket(t.token_rate_per_s, t.token_burst_tokens) for t in cfg.tenants
             if t.token_rate_per_s is not None}
    judge_tokens = adm.prompt_estimate == "tokens"
    reserve = adm.token_bucket and adm.reserve_output
    prev_fresh: set[int] = set()
    used, prev = 0, None
    for v in h.views:
        s, k, t0 = v.record, v.record.step_index, v.record.start_s
        fresh: dict[str, int] = {}
        fresh_ids = set(prev_fresh)  # never-scheduled queued requests, as arrivals see them
        for rid in prev_fresh:
            fresh[h.requests[rid].tenant] = fresh.get(h.requests[rid].tenant, 0) + 1
        for rid, computed in v.cancelled:
            r = h.requests.get(rid)
            if r is not None and rid in prev_fresh:
                fresh[r.tenant] -= 1
                fresh_ids.discard(rid)
            if r is not None and reserve and r.tenant in tok_b and r.admitted_step is not None:
                _give_back(tok_b[r.tenant], t0, r.output_tokens - r.tokens_generated)
        used -= h.cancel_freed(v, prev)
        for rid, answer in v.answers:
            r = h.requests.get(rid)
            if r is None:
                continue
            tc = h.tenant_cfg.get(r.tenant)
            if answer == "queued":
                fresh[r.tenant] = fresh.get(r.tenant, 0) + 1
                fresh_ids.add(rid)
                if r.tenant in req_b and adm.request_rate_limit:
                    req_b[r.tenant].at(t0)
                    req_b[r.tenant].level -= 1.0
                if r.tenant in tok_b and adm.token_bucket:
                    tok_b[r.tenant].at(t0)
                    tok_b[r.tenant].level -= r.prompt_tokens + (r.output_tokens if reserve else 0)
                continue
            why = _false_refusal(h, r, tc, answer, t0, req_b, tok_b, fresh, fresh_ids, used, judge_tokens)
            if why:
                out.append(_f("REFUSAL-TRUTH", k, f"request {rid} was refused {answer!r}, but {why[0]}", why[1],
                              why[2], [r.tenant], [rid]))
        for e in s.events:
            if e.kind == "rejected" and e.reason == "evicted_too_often":
                q = h.replay.reqs.get(e.request_id)
                kmax = cfg.eviction.max_evictions
                if q is not None and reserve and q.rec.tenant in tok_b:
                    _give_back(tok_b[q.rec.tenant], t0, q.rec.output_tokens - q.rec.tokens_generated)
                if q is not None and (kmax is None or q.preemptions < kmax):
                    out.append(_f("REFUSAL-TRUTH", k, f"request {e.request_id} was refused 'evicted_too_often' after "
                                  f"{q.preemptions} evictions", q.preemptions, kmax, [q.rec.tenant], [e.request_id]))
        if adm.token_bucket and not reserve:
            for name, n in v.produced.items():
                if name in tok_b:
                    tok_b[name].at(t0)
                    tok_b[name].level -= n
        prev_fresh = {rid for ids in v.fresh.values() for rid in ids}
        used = s.used_blocks if s.used_blocks is not None else cfg.num_blocks - s.free_blocks
        prev = s
    return out


def _false_refusal(h: HistoryContext, r, tc, reason: str, t0: float, req_b, tok_b, fresh, fresh_ids, used: int,
                   judge_tokens: bool) -> tuple[str, object, object] | None:
    """Why refusing ``r`` with ``reason`` at a step starting at ``t0`` was false: (why, observed, allowed) or None."""
    cfg, adm = h.config, h.config.admission
    if reason not in REJECT_REASONS:
        return f"{reason!r} is not a reason tenantry knows ({', '.join(REJECT_REASONS)})", reason, "a known reason"
    total = r.prompt_tokens + r.output_tokens
    if reason == "too_long":
        return None if total > cfg.max_context_tokens else (
            f"its {total} tokens fit the context limit", total, cfg.max_context_tokens)
    if reason == "too_large":
        need = cfg.blocks_for(total)
        cap = tc.kv_block_cap if tc is not None and adm.kv_cap and tc.kv_block_cap is not None else cfg.num_blocks
        return None if need > min(cfg.num_blocks, cap) else (
            f"its {need} blocks fit the pool and its tenant's cap", need, min(cfg.num_blocks, cap))
    if reason == "rate_limit":
        if not adm.request_rate_limit or r.tenant not in req_b:
            return "no request-rate limit is configured for its tenant", reason, "no rate_limit refusal"
        level = req_b[r.tenant].at(t0)
        return None if level < 1.0 + EPS else (f"the request bucket held {level:.6g} requests", level, "< 1")
    if reason == "token_bucket":
        if not adm.token_bucket or r.tenant not in tok_b:
            return "no token bucket is configured for its tenant", reason, "no token_bucket refusal"
        charge = r.prompt_tokens + (r.output_tokens if adm.reserve_output else 0)
        if not judge_tokens or charge > tc.token_burst_tokens:
            return None
        level = tok_b[r.tenant].at(t0)
        return None if level < charge + EPS else (
            f"the token bucket held {level:.6g} tokens for a charge of {charge} tokens", level, f"< {charge}")
    if reason == "queue_full":
        bound = tc.queue_bound if tc is not None and adm.queue_bound else None
        n = fresh.get(r.tenant, 0)
        return None if bound is not None and n >= bound else (
            f"its tenant had {n} never-scheduled requests queued (bound {bound})", n, bound)
    if reason == "kv_watermark":
        if not adm.kv_watermarks:
            return "no KV watermark is configured", reason, "no kv_watermark refusal"
        tier = tc.tier if tc is not None else 0
        wm = adm.kv_watermarks[min(tier, len(adm.kv_watermarks) - 1)]
        if adm.kv_watermark_queued:
            queued = sum(cfg.blocks_for(q.prompt_tokens + q.output_tokens) for q in _queued(h, fresh_ids)
                         if _tier(h, q.tenant) <= tier)
            occ = used + queued + cfg.blocks_for(total)
            return None if occ > wm * cfg.num_blocks - EPS else (
                f"{used} blocks in use + {queued} queued in tiers 0..{tier} + its {cfg.blocks_for(total)} were "
                f"{occ}, within the watermark of {wm:g} x {cfg.num_blocks}", occ, f"> {wm * cfg.num_blocks:g}")
        return None if used >= wm * cfg.num_blocks - EPS else (
            f"{used} blocks were in use, under the watermark of {wm:g} x {cfg.num_blocks}", used,
            f">= {wm * cfg.num_blocks:g}")
    if reason == "estimated_wait":
        if not adm.wait_limits_s:
            return "no wait limit is configured", reason, "no estimated_wait refusal"
        tier = tc.tier if tc is not None else 0
        limit = adm.wait_limits_s[min(tier, len(adm.wait_limits_s) - 1)]
        o = cfg.order
        pending = sum(o.w_in * q.prompt_tokens + o.w_out * q.output_tokens for q in _queued(h, fresh_ids)
                      if _tier(h, q.tenant) == tier)
        wait = pending / adm.wait_service_rate_tokens_per_s
        return None if wait > limit - EPS else (
            f"its tier's {pending:g} queued service tokens estimate a wait of {wait:.6g}s, within the limit of "
            f"{limit:g}s", wait, f"> {limit:g}")
    if reason == "evicted_too_often":
        return "it was never admitted, so never evicted", reason, "an admitted request"
    return None


def _queued(h: HistoryContext, ids) -> list:
    """The request records of ``ids`` (never-scheduled queued requests), in id order."""
    return [h.requests[rid] for rid in sorted(ids) if rid in h.requests]


def _tier(h: HistoryContext, tenant: str) -> int:
    tc = h.tenant_cfg.get(tenant)
    return tc.tier if tc is not None else 0


def h_request_rate(h: HistoryContext) -> list[Finding]:
    """REQUEST-RATE (SPEC.md 7.3), record form: the requests a tenant had admitted in
    any window [t1, t2] of admission times number at most burst + rate * (t2 - t1)
    (admission time: the start of the step that queued it)."""
    cfg, out = h.config, []
    start = {s.step_index: s.start_s for s in h.steps}
    for t in cfg.tenants:
        if t.request_rate_per_s is None:
            continue
        adm = sorted((start.get(r.admitted_step, r.arrival_s), r.request_id)
                     for r in h.history.requests if r.tenant == t.name and r.admitted_step is not None)
        total, best, best_i = 0.0, None, None
        for ts, rid in adm:
            key = total - t.request_rate_per_s * ts
            if best is None or key < best:
                best, best_i = key, (ts, rid)
            total += 1
            excess = total - t.request_rate_per_s * ts - best
            if excess > t.request_burst + EPS:
                out.append(_f("REQUEST-RATE", None, f"requests admitted between t={best_i[0]:.6g}s and t={ts:.6g}s "
                              "exceed burst + rate x window", excess, t.request_burst, [t.name], [best_i[1], rid]))
                break
    return out


# --- order and waiting ------------------------------------------------------------------


def h_bounded_wait(h: HistoryContext) -> list[Finding]:
    """BOUNDED-WAIT (SPEC.md 7.2), record form: each admitted request of a tenant with
    ``max_wait_s`` is first scheduled within ``max_wait_s`` seconds of its arrival,
    unless it ended before that; one still waiting when the records end counts once
    they run past its deadline."""
    out = []
    end = h.history.end_s
    for r in h.history.requests:
        tc = h.tenant_cfg.get(r.tenant)
        if tc is None or tc.max_wait_s is None or r.admitted_step is None:
            continue
        deadline = r.arrival_s + tc.max_wait_s
        if r.first_scheduled_s is not None:
            waited = r.first_scheduled_s - r.arrival_s
        elif r.finish_s is not None and r.finish_s <= deadline + EPS:
            continue
        elif end > deadline + EPS:
            waited = (r.finish_s if r.finish_s is not None else end) - r.arrival_s
        else:
            continue
        if waited > tc.max_wait_s + EPS:
            out.append(_f("BOUNDED-WAIT", h.first_step.get(r.request_id), f"request {r.request_id} waited "
                          f"{waited:.6g} s to be scheduled{'' if r.first_scheduled_s is not None else ' (and still waits)'}",
                          waited, tc.max_wait_s, [r.tenant], [r.request_id]))
    return out


def _could_fit(h: HistoryContext, v, rid: int) -> bool:
    """Request rid's first chunk surely had room in step ``v``: the most blocks its
    first chunk could take (``min(prompt, token_budget)`` tokens; its whole target
    with a prefix cache, whose hits add to the chunk) were free at any moment of the
    waiting phase (free after the step, less what the step's finishing requests
    held) and within its tenant's cap (its blocks after the step, plus what its
    finishing requests held), and its tenant and tier were below their slot caps.  Unknown room (shared blocks without ``held``) counts
    as no room, so an order claim is broken only when the skipped request surely fitted."""
    cfg, s = h.config, v.record
    if h.shareable and s.held is None:
        return False
    r = h.requests[rid]
    during = [h.requests[x].tenant for x in dict.fromkeys(list(s.running) + list(v.finished)) if x in h.requests]
    if at_slot_cap(cfg, r.tenant, during):
        return False
    tokens = r.prompt_tokens if cfg.prefix_cache != "off" else min(r.prompt_tokens, cfg.token_budget)
    need = cfg.blocks_for(tokens)
    free = s.free_blocks - sum(cfg.blocks_for(c) for c in v.finished.values())
    if need > free:
        return False
    tc = h.tenant_cfg.get(r.tenant)
    if caps_enforced(cfg) and tc is not None and tc.kv_block_cap is not None:
        mine = sum(s.held.get(x, 0) if s.held else cfg.blocks_for(c) for x, c in v.running.items()
                   if h.requests[x].tenant == r.tenant)
        mine += sum(cfg.blocks_for(c) for x, c in v.finished.items() if h.requests[x].tenant == r.tenant)
        return mine + need <= tc.kv_block_cap
    return True


def _order_claim(h: HistoryContext, inv: str, rivals, exempt_if_no_room: bool) -> list[Finding]:
    """A request first scheduled in a step while a rival (``rivals(r, q)``) admitted
    before it still waits never scheduled, at the step's end: the first such step.
    Across tenants (``exempt_if_no_room``) a rival counts only as its tenant's first
    ready request (behind its own head it waits by FCFS-TENANT) that surely fitted."""
    order = {}
    n = 0
    for v in h.views:
        for rid, answer in v.answers:
            if answer == "queued":
                n += 1
                order[rid] = n
        if exempt_if_no_room:
            heads = {rid for rid, _ in v.heads.values()}
            waiting_fresh = [q for ids in v.fresh.values() for q in ids if q in heads]
        else:
            waiting_fresh = [q for ids in v.fresh.values() for q in ids]
        for rid in v.first:
            r = h.requests.get(rid)
            if r is None or rid not in order:
                continue
            for qid in waiting_fresh:
                q = h.requests[qid]
                if order.get(qid, 1 << 60) < order[rid] and rivals(r, q) and not (
                        exempt_if_no_room and not _could_fit(h, v, qid)):
                    return [_f(inv, v.record.step_index, f"request {rid} (tenant {r.tenant}) was scheduled before "
                               f"request {qid} (tenant {q.tenant}), admitted earlier and still waiting", rid, qid,
                               [r.tenant, q.tenant] if r.tenant != q.tenant else [r.tenant], [rid, qid])]
    return []


def h_fcfs_tenant(h: HistoryContext) -> list[Finding]:
    """FCFS-TENANT (SPEC.md 7.2), record form: within a tenant, requests are first
    scheduled in the order they were admitted."""
    return _order_claim(h, "FCFS-TENANT", lambda r, q: r.tenant == q.tenant, exempt_if_no_room=False)


def h_fcfs_tier(h: HistoryContext) -> list[Finding]:
    """FCFS-TIER (SPEC.md 7.2), record form: within a tier, requests are first
    scheduled in the order they were admitted, except past one that surely did not fit."""
    return _order_claim(h, "FCFS-TIER", lambda r, q: h.tier(r.tenant) == h.tier(q.tenant), exempt_if_no_room=True)


def h_tier_order(h: HistoryContext) -> list[Finding]:
    """TIER-ORDER (SPEC.md 7.2), record form: no request is first scheduled while a
    request of a higher tier (a smaller tier number), admitted earlier, waits never
    scheduled, unless that request surely did not fit."""
    return _order_claim(h, "TIER-ORDER", lambda r, q: h.tier(q.tenant) < h.tier(r.tenant), exempt_if_no_room=True)


# --- eviction ---------------------------------------------------------------------------


def _eviction_books(h: HistoryContext, v, prev_used: int, prev_held: dict[int, int], prev):
    """For a step with preemptions: (blocks the step could have needed beyond what its
    requests held, free blocks before any eviction, [(victim, blocks freed, growth it
    no longer needs)]) from the records (``held`` when recorded, else the blocks of the
    computed tokens).  A victim may have been the requester (evicting itself), so its
    own growth counts at the most it could have been: its next chunk up to the token
    budget.  Counting every need at its largest makes an eviction look needed whenever
    it might have been."""
    cfg, s = h.config, v.record
    held = lambda rid: prev_held.get(rid, cfg.blocks_for(v.before.get(rid, (0, 0))[0]))
    growth = {}
    for rid, n in s.batch:
        if rid in v.before:
            c = v.before[rid][0]
            growth[rid] = max(0, cfg.blocks_for(c + n) - held(rid))
        else:
            r = h.requests.get(rid)
            c0 = next((e.tokens for e in s.events if e.kind == "scheduled" and e.request_id == rid), 0)
            growth[rid] = cfg.blocks_for(c0 + n) if r is not None else 0
    free = cfg.num_blocks - prev_used + h.cancel_freed(v, prev)
    victims = []
    evictions = [e for e in s.events if (e.kind == "preempted" and e.reason != "priority")
                 or (e.kind == "rejected" and e.request_id in v.before)]
    order = [e.request_id for e in evictions] if s.events else list(s.preempted)  # in the order they happened
    blocks = {e.request_id: e.blocks for e in evictions}
    for rid in order:  # an eviction that rejects (evicted too often) is an eviction too
        freed = blocks[rid] if rid in blocks and s.events else held(rid)
        c, target = v.before.get(rid, (0, 0))
        own = max(0, cfg.blocks_for(c + min(target - c, cfg.token_budget)) - held(rid)) if rid in v.before else 0
        victims.append((rid, freed, own))
    return sum(growth.values()) + sum(g for _, _, g in victims), free, victims


def _for_priority(s) -> set[int]:
    """Requests a step preempted for a waiting higher tier (events with reason ``priority``):
    made for waiting work, not for a running sequence's blocks, so the eviction books skip them."""
    return {e.request_id for e in s.events if e.kind == "preempted" and e.reason == "priority"}


def _evictions(h: HistoryContext):
    """Yield (view, need, free, victims) for each step with preemptions (exact records only)."""
    if not h.replay.exact or (h.shareable and not any(s.held for s in h.steps)):
        return
    prev_used, prev_held, prev = 0, {}, None
    for v in h.views:
        s = v.record
        pool = [rid for rid in s.preempted if rid not in _for_priority(s)]  # 4.5: room for a running sequence
        if pool or any(e.kind == "rejected" and e.request_id in v.before for e in s.events):
            need, free, victims = _eviction_books(h, v, prev_used, prev_held, prev)
            yield v, need, free, victims
        prev_used = s.used_blocks if s.used_blocks is not None else h.config.num_blocks - s.free_blocks
        prev_held, prev = dict(s.held or {}), s


def h_evict_minimal(h: HistoryContext) -> list[Finding]:
    """EVICT-MINIMAL (SPEC.md 7.4), record form: in a step that evicts, no victim is
    taken once the ones before it made room: after victims v1..vj, if the free
    blocks plus what they held before the step cover the growth of the batch and
    of the victims after vj, v(j+1) is one victim too many (the over-preemption of
    a scheduler that keeps evicting after the requester fits).  A victim's share
    is what it freed less the most it could have been given in the step, and a
    victim's own growth counts at its largest, so a step is flagged only when the
    victim was surely not needed.  Not judged under per-tenant caps (a cap, not
    the pool, may be what evictions make room under)."""
    out = []
    if caps_enforced(h.config):
        return out
    for v, need, free, victims in _evictions(h):
        batch_need = need - sum(g for _, _, g in victims)
        room = free
        for j, (rid, b, g) in enumerate(victims):
            later = sum(gg for _, _, gg in victims[j:])
            if j and room >= batch_need + later:
                r = h.requests.get(rid)
                out.append(_f("EVICT-MINIMAL", v.record.step_index, f"request {rid} was evicted after the victims "
                              f"before it had made room ({room} free blocks for {batch_need + later} needed)",
                              room, batch_need + later, [r.tenant] if r else [], [rid]))
                break
            room += max(0, b - g)
    return out


def h_evict_progress(h: HistoryContext) -> list[Finding]:
    """EVICT-PROGRESS (SPEC.md 7.4), record form: a step preempts only when its batch
    needs more blocks than are free, and every eviction frees blocks: a preemption
    while everything fitted, or one that frees nothing, is churn without progress."""
    out = []
    if caps_enforced(h.config):
        return out
    for v, need, free, victims in _evictions(h):
        rid, b, g = victims[0]
        r = h.requests.get(rid)
        if need <= free:
            out.append(_f("EVICT-PROGRESS", v.record.step_index, f"request {rid} was evicted although the step's "
                          f"batch needed {need} blocks and {free} were free", need, f"more than the {free} free",
                          [r.tenant] if r else [], [rid]))
        elif any(bb == 0 for _, bb, _ in victims):
            z = next(x for x, bb, _ in victims if bb == 0)
            out.append(_f("EVICT-PROGRESS", v.record.step_index, f"request {z} was evicted and freed no block", 0,
                          "at least 1", [h.requests[z].tenant] if z in h.requests else [], [z]))
    return out


