"""State forms of the fairness, admission, eviction and isolation invariants
(SPEC.md sections 7.2 to 7.5), over a :class:`~tenantry.spec.invariants_state.StepContext`.

Two kinds (the catalog says which each invariant has, and why:
:attr:`~tenantry.spec.invariants_core.Invariant.state_only`):

* state-only parts, judged beside a state form derived from the record form
  (:func:`~tenantry.spec.invariants_state.with_state_part`): what the model's state
  holds and no record carries (the tier counters and the lift of NO-BANKED-CREDIT,
  the ready step of EVICT-COOLDOWN);
* whole state forms of invariants whose record form judges something else, or
  none: FLOOR (tier counters; the record form bounds the tiers' service over
  intervals), TOKEN-BUCKET (the bucket's level; the record form bounds admissions
  over windows), SALT-ISOLATION (the cache's salt registry; the record form follows
  block writers over the run), GUARD and PRIORITY-PREEMPT (no record form).
"""

from __future__ import annotations

import math

from .invariants_core import EPS, Finding, at_slot_cap, largest_charge, skip_slack, tier_share
from .invariants_state import StepContext, _f


def _backlogged(ts) -> list[int]:
    return [i for i, t in enumerate(ts) if t.queue]


# --- fairness ------------------------------------------------------------------------


def _lift_floor(ctx: StepContext, i: int, counters, before, after_cancel, field: str) -> float | None:
    """Least value a tenant (tier) i joining the backlog in this step may start at.

    The least counter of the others backlogged once cancellations are done;
    if cancellations emptied them all, the least of those that left (the last
    to leave sets the lift); if none was backlogged, the state's last-left value.
    """
    for group in (after_cancel, before):
        others = [counters[j] for j in group if j != i]
        if others:
            return min(others)
    return getattr(ctx.prev, field, None)


def lift_and_tier_counters(ctx: StepContext) -> list[Finding]:
    """NO-BANKED-CREDIT's state-only part (SPEC.md 7.2), with the lift: under ``vtc``, a
    tenant that joins the backlog in the step while none was backlogged starts no lower
    than the state's last-left counter (the lift l); under ``floors``, a tier that
    becomes backlogged starts no lower than the least tier counter of those already
    backlogged (after the step's cancellations; with none, the last-left tier counter)."""
    cfg, out = ctx.config, []
    pol = cfg.order.policy
    if not cfg.order.lift or pol not in ("vtc", "floors"):
        return out
    cancelled = ctx.cancelled_ids
    before = [i for i, t in enumerate(ctx.prev.tenants) if t.queue]
    after_cancel = [i for i in before if any(s.request_id not in cancelled for s in ctx.prev.tenants[i].queue)]
    joined = {e.tenant for e in ctx.output.events if e.kind in ("queued", "preempted")} - set(after_cancel)
    if pol == "vtc":
        for i in sorted(joined):
            if any(j != i for j in before):  # the least counter of the others: the record form judges it
                continue
            lo = ctx.prev.last_left_counter
            c = ctx.state.tenants[i].counter
            if lo is not None and c < lo - EPS:
                out.append(_f(ctx, "NO-BANKED-CREDIT", "a newly backlogged tenant's counter starts below the lift "
                              "(the counter of the last tenant whose queue emptied): banked credit", c, lo,
                              [ctx.name(i)]))
        return out
    tier_of = [t.tier for t in cfg.tenants]
    tiers_before = sorted({tier_of[i] for i in before})
    tiers_after = sorted({tier_of[i] for i in after_cancel})
    for tier in sorted({tier_of[i] for i in joined} - set(tiers_after)):
        lo = _lift_floor(ctx, tier, ctx.prev.tier_counters, tiers_before, tiers_after, "last_left_tier_counter")
        c = ctx.state.tier_counters[tier]
        if lo is not None and c < lo - EPS:
            names = [ctx.name(i) for i in sorted(joined) if tier_of[i] == tier]
            out.append(_f(ctx, "NO-BANKED-CREDIT", f"newly backlogged tier {tier} starts below the least "
                          "backlogged tier counter (banked credit)", c, lo, names))
    return out


def check_floor(ctx: StepContext) -> list[Finding]:
    """FLOOR, state form (SPEC.md 7.2): among backlogged tiers, every tier counter is
    within D / floor of the least one (under the skip budget, plus
    ``guard_skips * D / f_min``, :func:`skip_slack`)."""
    cfg, st = ctx.config, ctx.state
    tiers = sorted({cfg.tenants[i].tier for i in _backlogged(st.tenants)})
    if len(tiers) < 2:
        return []
    d = largest_charge(cfg)
    extra = skip_slack(cfg, d)
    tc = st.tier_counters
    lo = min(tiers, key=lambda x: tc[x])
    out = []
    for x in tiers:
        gap, allowed = tc[x] - tc[lo], d / tier_share(cfg, x) + extra
        if gap > allowed + EPS:
            what = "D/floor + guard_skips*D/f_min" if extra else "D/floor"
            out.append(_f(ctx, "FLOOR", f"tier {x}'s counter ran ahead of tier {lo}'s by more than {what}", gap,
                          allowed, [c.name for c in cfg.tenants if c.tier in (x, lo)]))
    return out


# --- admission ------------------------------------------------------------------------


def check_token_bucket(ctx: StepContext) -> list[Finding]:
    """TOKEN-BUCKET, state form (SPEC.md 7.3): each bucket moves exactly by its refill
    (rate * elapsed, capped at the burst) minus what admitted prompts and produced
    tokens cost; refused requests cost nothing."""
    cfg, out = ctx.config, []
    if not cfg.admission.token_bucket:
        return out
    queued = {e.request_id for e in ctx.output.events if e.kind == "queued"}
    arrivals = {r.request_id: r for r in ctx.inputs.arrivals}
    for i, tc in enumerate(cfg.tenants):
        if tc.token_rate_per_s is None:
            continue
        a, b = ctx.prev.tenants[i], ctx.state.tenants[i]
        base = a.bucket_tokens
        if b.bucket_t_s != a.bucket_t_s:
            if abs(b.bucket_t_s - ctx.prev.t_s) > EPS:
                out.append(_f(ctx, "TOKEN-BUCKET", "the bucket was refilled to a time other than the step's start",
                              b.bucket_t_s, ctx.prev.t_s, [tc.name]))
            base = min(tc.token_burst_tokens, a.bucket_tokens + tc.token_rate_per_s * (b.bucket_t_s - a.bucket_t_s))
        reserve = cfg.admission.reserve_output
        charge = 0.0
        for rid in queued:
            r = arrivals.get(rid)
            if r is not None and r.tenant == tc.name:
                s = ctx.after(rid)
                charge += s.charged_prompt_tokens if s is not None and s.never_scheduled else _estimate(cfg, r)
                if reserve:  # the output allowance is taken with the prompt (SPEC.md 4.2)
                    charge += r.output_tokens
        back = {"cancelled": 0, "rejected": 0}
        if reserve:  # what a request leaving before its last token did not generate comes back
            for s in ctx.output.finished:
                kind = ctx.terminal_kind.get(s.request_id)
                if s.tenant == i and kind in back:
                    back[kind] += s.request.output_tokens - s.output_done
        produced = 0
        for s in list(ctx.state.sequences()) + list(ctx.output.finished):
            if s.tenant != i:
                continue
            before = ctx.prev_seqs.get(s.request_id)
            produced += s.output_done - (before.output_done if before is not None else 0)
            if s.first_scheduled_s is not None and (before is None or before.never_scheduled):
                est = before.charged_prompt_tokens if before is not None else _estimate(cfg, s.request)
                if est:
                    charge += s.request.prompt_tokens - est
        if reserve:
            # Generated tokens were reserved at admission.  Refunds are capped at the burst,
            # in the step's order: cancellations (phase 1), admissions (2), evictions too often (3).
            produced = 0
            level = min(tc.token_burst_tokens, base + back["cancelled"]) if back["cancelled"] else base
            want = level - charge
            if back["rejected"]:
                want = min(tc.token_burst_tokens, want + back["rejected"])
        else:
            want = base - charge - produced
        if abs(b.bucket_tokens - want) > EPS * max(1.0, abs(want)):
            out.append(_f(ctx, "TOKEN-BUCKET", f"the bucket moved by {b.bucket_tokens - a.bucket_tokens:.6g}; refill "
                          f"minus {charge:g} admitted prompt tokens and {produced} produced tokens gives "
                          f"{want - a.bucket_tokens:.6g}", b.bucket_tokens, want, [tc.name]))
        if b.bucket_tokens > tc.token_burst_tokens + EPS:
            out.append(_f(ctx, "TOKEN-BUCKET", "the bucket holds more than its burst", b.bucket_tokens,
                          tc.token_burst_tokens, [tc.name]))
    return out


def _estimate(cfg, r) -> int:
    if cfg.admission.prompt_estimate == "bytes":
        nbytes = r.prompt_bytes if r.prompt_bytes is not None else 4 * r.prompt_tokens
        return math.ceil(nbytes / cfg.admission.bytes_per_token)
    return r.prompt_tokens


# --- starvation guard ------------------------------------------------------------------


def _entry_blocks(cfg, s) -> int:
    """The most blocks s can hold on entering the batch: its first chunk at the whole
    budget, or, with a prefix cache (hits add to the chunk), its whole target
    (SPEC.md 4.3 and 4.5; restated here, not read from the model)."""
    if cfg.prefix_cache != "off":
        return cfg.blocks_for(s.target_tokens)
    return cfg.blocks_for(min(s.target_tokens, cfg.token_budget))


def check_guard(ctx: StepContext) -> list[Finding]:
    """GUARD (SPEC.md 7.2), with ``guard_steps`` or ``guard_wait_s``: no sequence enters
    the batch from a queue in a step that began its waiting phase with an overdue head
    (ready; waited ``guard_steps`` steps since ready, or never scheduled and
    ``guard_wait_s`` seconds since arrival) that its own caps would take but whose
    first chunk at the whole budget did not fit in the free blocks; and a step that
    records a reservation admitted nothing and reserved for such a head.  The free
    blocks at the waiting phase's start are recomputed from the sequences in the
    batch that did not enter it in the step; the heads from the queues before the
    step, less cancellations, plus the step's arrivals."""
    cfg, o, out = ctx.config, ctx.config.order, []
    entered = {s.request_id for s in ctx.admitted_from_queue}
    during = list(ctx.state.running) + [ctx.gone[e.request_id] for e in ctx.output.events if e.kind == "finished"]
    stay = [s for s in during if s.request_id not in entered]
    keys: set = set()
    private = 0
    per: dict[int, int] = {}
    for s in stay:
        keys.update(s.shared_keys)
        private += s.private_blocks
        per[s.tenant] = per.get(s.tenant, 0) + s.blocks_held
    free = cfg.num_blocks - private - len(keys)
    in_batch = [ctx.name(s.tenant) for s in stay]
    arrived = {}
    for r in ctx.inputs.arrivals:
        q = ctx.after(r.request_id)
        if q is not None or r.request_id in ctx.gone:
            arrived.setdefault(cfg.tenant_index(r.tenant), []).append(r.request_id)
    due = []
    for i, t in enumerate(ctx.prev.tenants):
        first = next((s for s in t.queue if s.ready_step <= ctx.k and s.request_id not in ctx.cancelled_ids), None)
        if first is None:
            rid = next((x for x in arrived.get(i, ()) if x not in ctx.cancelled_ids), None)
            first = ctx.prev_seqs.get(rid) if rid is not None else None
            if first is None and rid is not None:
                first = ctx.after(rid) or ctx.gone.get(rid)
        if first is None:
            continue
        late = (o.guard_steps is not None and ctx.k - first.ready_step >= o.guard_steps) or (
            o.guard_wait_s is not None and first.never_scheduled
            and ctx.prev.t_s - first.request.arrival_s >= o.guard_wait_s - EPS)
        if not late:
            continue
        need = _entry_blocks(cfg, first)
        cap = cfg.tenants[i].kv_block_cap if cfg.admission.kv_cap else None
        if (cap is not None and per.get(i, 0) + need > cap) or at_slot_cap(cfg, ctx.name(i), in_batch):
            continue
        if need > free:
            due.append((first.arrival_seq, i, first.request_id, need))
    if due and entered:
        _, i, rid, need = min(due)
        out.append(_f(ctx, "GUARD", f"requests {sorted(entered)} entered the batch while overdue request {rid} "
                      f"needed {need} blocks with {free} free", len(entered), 0, [ctx.name(i)],
                      [rid] + sorted(entered)))
    rv = ctx.output.reserved
    if o.guard_skips is not None:
        out += _skip_budget(ctx)
    if rv is not None and ctx.output.reserved_reason == "skips":
        return out
    if rv is not None and (entered or rv not in {d[2] for d in due}):
        out.append(_f(ctx, "GUARD", f"the step reserved for request {rv}, which was not an overdue head that did "
                      "not fit" + (f", and admitted {sorted(entered)}" if entered else ""), rv,
                      sorted(d[2] for d in due), [], [rv]))
    return out


def _skip_budget(ctx: StepContext) -> list[Finding]:
    """GUARD's skip-budget part (``guard_skips`` K_skip, SPEC.md 4.3): after the step no
    backlogged tenant has been passed over more than K_skip times, and a step that
    stopped for the budget (``reserved_reason`` ``skips``) stopped for a queued head of
    a backlogged tenant whose count is K_skip."""
    cfg, k, ts, out = ctx.config, ctx.config.order.guard_skips, ctx.state.tenants, []
    if cfg.order.policy == "floors":  # the counts are per tier
        tier_skips = ctx.state.tier_skips or (0,) * len(ctx.state.tier_counters)
        count = lambda i: tier_skips[cfg.tenants[i].tier]  # noqa: E731
        what = "tier"
    else:
        count = lambda i: ts[i].skips  # noqa: E731
        what = "tenant"
    over = [i for i, t in enumerate(ts) if t.queue and count(i) > k]
    if over:
        i = over[0]
        out.append(_f(ctx, "GUARD", f"a backlogged {what} was passed over {count(i)} times in its backlog period, "
                      f"more than guard_skips = {k}", count(i), k, [ctx.name(i)]))
    rv = ctx.output.reserved
    if rv is not None and ctx.output.reserved_reason == "skips":
        owner = next((i for i, t in enumerate(ts) if any(q.request_id == rv for q in t.queue)), None)
        if owner is None or count(owner) != k:
            out.append(_f(ctx, "GUARD", f"the step stopped for the skip budget on request {rv}, which is not the "
                          f"queued work of a tenant passed over guard_skips = {k} times",
                          None if owner is None else count(owner), k, [] if owner is None else [ctx.name(owner)],
                          [rv]))
    return out


# --- eviction -------------------------------------------------------------------------


def check_priority_preempt(ctx: StepContext) -> list[Finding]:
    """PRIORITY-PREEMPT (SPEC.md 7.4), with ``preempt_for_priority``.  Sound: every
    eviction for priority takes a sequence of a strictly lower tier than some ready
    request waiting in the step, that had been evicted fewer than ``max_evictions``
    times and frees at least ``min_free_blocks``.  Complete: after a step whose
    waiting phase admitted nothing and evicted nothing, with the batch's slots all
    taken, no tenant's first ready waiting request of tier t (within its own KV and
    slot caps, the most blocks it can hold on entry free) waits while a sequence of a
    tier below t, running since before the step, could have been evicted for it."""
    cfg, out = ctx.config, []
    ev = cfg.eviction
    k_max, min_free = ev.max_evictions, ev.min_free_blocks
    tier = lambda s: cfg.tenants[s.tenant].tier
    waiting = [s for t in ctx.prev.tenants for s in t.queue if s.ready_step <= ctx.k]
    waiting += [ctx.after(r.request_id) for r in ctx.inputs.arrivals if ctx.after(r.request_id) is not None]
    top = min((tier(s) for s in waiting if s is not None), default=None)
    for e in ctx.output.events:
        if e.kind != "preempted" or e.reason != "priority":
            continue
        v = ctx.prev_seqs.get(e.request_id)
        if v is None:
            continue
        if top is None or tier(v) <= top:
            out.append(_f(ctx, "PRIORITY-PREEMPT", f"request {v.request_id} of tier {tier(v)} was evicted for "
                          "priority with no ready request of a higher tier waiting", tier(v), top,
                          [ctx.name(v.tenant)], [v.request_id]))
        if k_max is not None and v.preemptions >= k_max:
            out.append(_f(ctx, "PRIORITY-PREEMPT", f"request {v.request_id} was evicted for priority after "
                          f"{v.preemptions} evictions", v.preemptions + 1, k_max, [ctx.name(v.tenant)],
                          [v.request_id]))
        if e.blocks < min_free:
            out.append(_f(ctx, "PRIORITY-PREEMPT", f"request {v.request_id} was evicted for priority freeing "
                          f"{e.blocks} blocks", e.blocks, min_free, [ctx.name(v.tenant)], [v.request_id]))
    st = ctx.state
    during = list(st.running) + [ctx.gone[e.request_id] for e in ctx.output.events if e.kind == "finished"]
    took = any(e.kind == "preempted" and e.reason == "priority" for e in ctx.output.events)
    if len(during) < cfg.max_num_seqs or ctx.admitted_from_queue or took:
        return out  # judged only where the waiting phase changed nothing: then it saw the batch as it ends
    refs = st.kv.refs
    keys: set = set()
    private = 0
    per_tenant: dict[int, int] = {}
    for s in during:
        keys.update(s.shared_keys)
        private += s.private_blocks
        per_tenant[s.tenant] = per_tenant.get(s.tenant, 0) + s.blocks_held
    free = cfg.num_blocks - private - len(keys)
    before = {s.request_id for s in ctx.prev.running}
    victims = [s for s in st.running if s.request_id in before and (k_max is None or s.preemptions < k_max)
               and s.private_blocks + sum(1 for key in s.shared_keys if refs.get(key) == 1) >= min_free]
    if not victims:
        return out
    in_batch = [ctx.name(s.tenant) for s in during]
    for i, t in enumerate(st.tenants):
        r = next((s for s in t.queue if s.ready_step <= ctx.k), None)
        if r is None or at_slot_cap(cfg, ctx.name(i), in_batch):
            continue
        need = _entry_blocks(cfg, r)
        cap = cfg.tenants[i].kv_block_cap if cfg.admission.kv_cap else None
        if need > free or (cap is not None and per_tenant.get(i, 0) + need > cap):
            continue
        low = [v for v in victims if tier(v) > cfg.tenants[i].tier]
        if low:
            v = max(low, key=lambda c: (tier(c), c.arrival_seq))
            out.append(_f(ctx, "PRIORITY-PREEMPT", f"request {r.request_id} of tier {cfg.tenants[i].tier} waits "
                          f"for a slot while request {v.request_id} of tier {tier(v)} runs", tier(v),
                          cfg.tenants[i].tier, [ctx.name(i), ctx.name(v.tenant)], [r.request_id, v.request_id]))
    return out


def cooldown_ready_step(ctx: StepContext) -> list[Finding]:
    """EVICT-COOLDOWN's state-only part (SPEC.md 7.4): a sequence preempted in the step
    waits with ready_step = k + 1 + cooldown_steps (the ready step the records imply
    from the preemption, which the model keeps and the next steps trust)."""
    cfg, out = ctx.config, []
    want = ctx.k + 1 + cfg.eviction.cooldown_steps
    for rid in ctx.output.preempted:
        s = ctx.new_queued.get(rid)
        if s is not None and s.ready_step != want:
            out.append(_f(ctx, "EVICT-COOLDOWN", "a preempted request may run again before its cooldown ends",
                          s.ready_step, want, [ctx.name(s.tenant)], [rid]))
    return out


# --- isolation -----------------------------------------------------------------------


def check_salt_isolation(ctx: StepContext) -> list[Finding]:
    """SALT-ISOLATION (SPEC.md 7.5): with a salted cache, every cached block a
    sequence references was registered under its own tenant's salt."""
    cfg, kv, out = ctx.config, ctx.state.kv, []
    for s in ctx.state.running:
        salt = cfg.tenants[s.tenant].salt
        for key in s.shared_keys:
            got = kv.key_salt.get(key, "<unregistered>")
            if got != salt:
                out.append(_f(ctx, "SALT-ISOLATION", "a request references a cached block registered under another "
                              "salt", got, salt, [ctx.name(s.tenant)], [s.request_id]))
                break
    return out
