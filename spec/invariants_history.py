"""History forms of the invariants: judge a recorded run offline (SPEC.md 7); the
fairness ones (SPEC.md 7.2) are in :mod:`tenantry.spec.invariants_history_fair`.

They read only what :mod:`tenantry.runner.history` records (request records and,
where present, per-step snapshots) plus the configuration the scheduler
claims, so the same checks judge a scheduler tenantry did not write.  Each
``check_*(hctx: HistoryContext) -> list[Finding]``; a check that needs step
snapshots returns nothing when the history has none.
"""

from __future__ import annotations

from functools import cached_property

import attrs

from tenantry.model.config import Config
from tenantry.model.events import ADMISSION_REASONS
from tenantry.runner.history import History, RequestRecord, StepEvent

from .invariants_core import EPS, Finding, at_slot_cap, caps_enforced, hopeless, largest_charge, slot_caps
from .replay import Replay, StepView



@attrs.frozen
class HistoryContext:
    """A history plus the configuration it is judged against, and what its records imply
    (:class:`~tenantry.spec.replay.Replay`, walked once and shared by every form)."""

    history: History
    config: Config

    @cached_property
    def steps(self):
        return self.history.steps

    @cached_property
    def requests(self) -> dict[int, RequestRecord]:
        return {r.request_id: r for r in self.history.requests}

    @cached_property
    def tenant_of(self) -> dict[int, str]:
        """request id -> its tenant's name."""
        return {r.request_id: r.tenant for r in self.history.requests}

    @cached_property
    def tenant_cfg(self) -> dict:
        return {t.name: t for t in self.config.tenants}

    def weight(self, name: str) -> float:
        t = self.tenant_cfg.get(name)
        return t.weight if t is not None else 1.0

    def tier(self, name: str) -> int:
        t = self.tenant_cfg.get(name)
        return t.tier if t is not None else 0

    @cached_property
    def _walk(self) -> tuple[Replay, list[StepView]]:
        r = Replay(self.history, self.config)
        return r, list(r.views())

    @property
    def replay(self) -> Replay:
        """The replay, already walked (its views in :attr:`views`, its anomalies filled)."""
        return self._walk[0]

    @property
    def views(self) -> list[StepView]:
        """The records' state after each step (:class:`~tenantry.spec.replay.StepView`)."""
        return self._walk[1]

    @cached_property
    def block_reads(self) -> list[tuple[int, int, int, object, tuple]]:
        """Blocks held with content they do not hold (:func:`block_reads`)."""
        return block_reads(self)

    def anomalies(self, invariant: str) -> list[Finding]:
        """The replay's anomalies that break ``invariant``, as findings."""
        return [_f(a.invariant, a.step, a.message, a.observed, a.allowed,
                   [self.requests[a.request].tenant] if a.request in self.requests else [],
                   [] if a.request is None else [a.request])
                for a in self.replay.anomalies if a.invariant == invariant]

    @cached_property
    def charge_bound(self) -> float:
        """D from the workload actually seen (longest prompt, longest request)."""
        rs = self.history.requests
        if not rs:
            return 0.0
        return largest_charge(self.config, max(r.prompt_tokens for r in rs),
                              max(r.prompt_tokens + r.output_tokens for r in rs))

    @cached_property
    def cancel_steps(self) -> dict[str, set[int]]:
        """Per tenant, the steps in which one of its requests was cancelled."""
        starts = {s.start_s: s.step_index for s in self.steps}
        out: dict[str, set[int]] = {}
        for r in self.history.requests:
            if r.outcome == "cancelled" and r.finish_s in starts:
                out.setdefault(r.tenant, set()).add(starts[r.finish_s])
        return out

    @cached_property
    def first_step(self) -> dict[int, int]:
        """request id -> step index of its first scheduling."""
        starts = {s.start_s: s.step_index for s in self.steps}
        return {r.request_id: starts[r.first_scheduled_s] for r in self.history.requests
                if r.first_scheduled_s is not None and r.first_scheduled_s in starts}

    def cancel_freed(self, v: StepView, prev) -> int:
        """KV blocks the cancellations of running requests at the start of step ``v`` surely
        freed: with block ids in the previous step record (``prev``), the cancelled
        requests' blocks that no other running request holds; without them, the blocks
        they held when no block can be shared, else 0 (a shared prefix block may stay in
        use: counting it freed would make an eviction or a ``kv_watermark`` refusal look
        needless).  Counting at least what was surely freed keeps the forms that read it
        from false alarms."""
        gone = {rid: c for rid, c in v.cancelled if c is not None}
        if not gone:
            return 0
        ids = (prev.block_ids or {}) if prev is not None else {}
        if all(rid in ids for rid in gone):
            stay = {b for rid in prev.running if rid not in gone for b in ids.get(rid, ())}
            return len({b for rid in gone for b in ids[rid]} - stay)
        if self.shareable:
            return 0
        held = (prev.held or {}) if prev is not None else {}
        return sum(held.get(rid, self.config.blocks_for(c)) for rid, c in gone.items())

    @cached_property
    def shareable(self) -> bool:
        """Blocks could be shared: a prefix cache is on and some request has prefix content ids."""
        return self.config.prefix_cache != "off" and any(r.prefix_ids for r in self.history.requests)


def _f(inv, step, msg, observed, allowed, tenants=(), requests=()) -> Finding:
    return Finding(inv, step, tuple(tenants), tuple(requests), observed, allowed, msg)


# --- safety --------------------------------------------------------------------------


def h_kv_conserve(h: HistoryContext) -> list[Finding]:
    """KV-CONSERVE (SPEC.md 7.1), record form: after every step free blocks are at
    most the pool and free + distinct blocks in use = pool (``used_blocks``; without it,
    only when no block can be shared: free + sum of blocks held = pool); each
    running request holds at least the blocks its computed tokens need and the
    tenants' counts add up (``held``); a block is held by two requests only with a
    prefix cache (``block_ids``); an entry into the batch with computed tokens is
    a whole-block cache hit; nothing held when nothing runs."""
    cfg, out = h.config, h.anomalies("KV-CONSERVE")
    exact, shareable, tenant_of, blocks_for = h.replay.exact, h.shareable, h.tenant_of, cfg.blocks_for
    pool = cfg.num_blocks
    for v in h.views:
        s, k = v.record, v.record.step_index
        free, held, used_blocks, in_use = s.free_blocks, s.held, s.used_blocks, s.blocks_in_use
        held_sum = sum(in_use.values())
        used = used_blocks if used_blocks is not None else (held_sum if not shareable else None)
        if free > pool:
            out.append(_f("KV-CONSERVE", k, "more free blocks than the pool has", free, pool))
        elif free < 0:
            pass  # more blocks in use than the pool: KV-CAP
        elif used is not None and used + free != pool:
            out.append(_f("KV-CONSERVE", k, f"free blocks ({free}) plus distinct blocks in use ({used}) "
                          "differ from the pool", used + free, pool))
        elif not s.running and (held_sum or free != pool):
            out.append(_f("KV-CONSERVE", k, "nothing runs but blocks are still in use", pool - free, 0))
        if held is not None:
            if held.keys() != set(s.running):
                extra = sorted(set(held) - set(s.running))
                if any(held[r] for r in extra):
                    out.append(_f("KV-CONSERVE", k, "a request that is not running holds blocks: they leak",
                                  len(extra), 0, requests=extra))
            per: dict[str, int] = {}
            running = v.running
            for rid, b in held.items():
                tenant = tenant_of.get(rid)
                if tenant is None:
                    continue
                per[tenant] = per.get(tenant, 0) + b
                c = running.get(rid)
                if exact and c is not None and b < blocks_for(c):
                    out.append(_f("KV-CONSERVE", k, f"request {rid} has {c} tokens of KV in {b} blocks",
                                  b, blocks_for(c), [tenant], [rid]))
            for name, b in per.items():
                if in_use.get(name, 0) != b:
                    out.append(_f("KV-CONSERVE", k, "a tenant's blocks in use differ from its requests' blocks",
                                  in_use.get(name, 0), b, [name]))
            if used_blocks is not None and used_blocks > sum(held.values()):
                out.append(_f("KV-CONSERVE", k, "more distinct blocks in use than the running requests hold",
                              used_blocks, sum(held.values())))
        if s.block_ids:
            ids = [b for rid in s.running for b in s.block_ids.get(rid, ())]
            if s.used_blocks is not None and len(set(ids)) != s.used_blocks and (s.held is None or all(
                    len(s.block_ids.get(rid, ())) == s.held.get(rid) for rid in s.running)):
                out.append(_f("KV-CONSERVE", k, "distinct block ids differ from the blocks in use",
                              len(set(ids)), s.used_blocks))
            if cfg.prefix_cache == "off" and len(set(ids)) != len(ids):
                twice = sorted({b for b in ids if ids.count(b) > 1}, key=repr)[:3]
                holders = [rid for rid in s.running if set(s.block_ids.get(rid, ())) & set(twice)]
                out.append(_f("KV-CONSERVE", k, f"block {twice[0]!r} is held by two requests with the prefix "
                              "cache off", len(ids) - len(set(ids)), 0, requests=holders))
    salts = {t.name: (t.salt if cfg.prefix_cache == "salted" else None) for t in cfg.tenants}
    for k, rid, j, bid, w in h.block_reads:
        r = h.requests[rid]
        if w[0] == salts.get(r.tenant):  # same namespace, other content: the request reads KV that is not its own
            if w[3] == rid:  # its own other position (or its earlier content): no other party to name
                out.append(_f("KV-CONSERVE", k, f"request {rid} holds block {bid!r} at position {j}, whose content "
                              "it last wrote itself for other tokens", None, None, [r.tenant], [rid]))
            else:
                out.append(_f("KV-CONSERVE", k, f"request {rid} holds block {bid!r} at position {j}, whose content "
                              f"was last written by request {w[3]} for other tokens (observed: that writer; allowed: "
                              "the holder)", w[3], rid, [r.tenant], [rid, w[3]]))
    return out


def h_kv_cap(h: HistoryContext) -> list[Finding]:
    """KV-CAP (SPEC.md 7.1), record form: blocks in use within the pool; per-tenant
    blocks within enforced caps."""
    cfg, out = h.config, []
    for s in h.steps:
        used = max(s.used_blocks if s.used_blocks is not None else 0, cfg.num_blocks - s.free_blocks)
        if used > cfg.num_blocks:
            out.append(_f("KV-CAP", s.step_index, "more blocks in use than the pool has", used, cfg.num_blocks))
        if not caps_enforced(cfg):
            continue
        for name, n in s.blocks_in_use.items():
            t = h.tenant_cfg.get(name)
            if t is not None and t.kv_block_cap is not None and n > t.kv_block_cap:
                running = [rid for rid in s.running if h.requests.get(rid) and h.requests[rid].tenant == name]
                out.append(_f("KV-CAP", s.step_index, "a tenant holds more blocks than its cap", n, t.kv_block_cap,
                              [name], running))
    return out


def h_slot_cap(h: HistoryContext) -> list[Finding]:
    """SLOT-CAP (SPEC.md 7.1), record form: the requests of a tenant in a step's
    batch (running after it, or finished in it) number at most its enforced
    ``max_running_seqs``, those of a tier at most the tier's slot cap."""
    cfg, out = h.config, []
    if not cfg.admission.slot_cap:
        return out
    for v in h.views:
        s = v.record
        during = [rid for rid in dict.fromkeys(list(s.running) + list(v.finished)) if rid in h.requests]
        names = [h.requests[rid].tenant for rid in during]
        for name in sorted(set(names)):
            own, tier_cap = slot_caps(cfg, name)
            n = names.count(name)
            if own is not None and n > own:
                out.append(_f("SLOT-CAP", s.step_index, "a tenant has more requests in the batch than its slot cap",
                              n, own, [name], [rid for rid in during if h.requests[rid].tenant == name]))
            if tier_cap is not None:
                mine = [rid for rid in during if h.tier(h.requests[rid].tenant) == h.tier(name)]
                if len(mine) > tier_cap and name == min(h.requests[rid].tenant for rid in mine):
                    out.append(_f("SLOT-CAP", s.step_index, f"tier {h.tier(name)} has more requests in the batch "
                                  "than its slot cap", len(mine), tier_cap,
                                  sorted({h.requests[rid].tenant for rid in mine}), mine))
    return out


def h_queue_bound(h: HistoryContext) -> list[Finding]:
    """QUEUE-BOUND (SPEC.md 7.1), record form: after every step, each tenant's
    admitted, never-scheduled, not-ended requests number at most its bound; the
    finding names the newest of them (the one that should have been refused)."""
    cfg, out = h.config, []
    if not cfg.admission.queue_bound:
        return out
    flagged: set[str] = set()
    for v in h.views:
        for name, fresh in v.fresh.items():
            t = h.tenant_cfg.get(name)
            if t is None or t.queue_bound is None or len(fresh) <= t.queue_bound or name in flagged:
                continue
            flagged.add(name)
            out.append(_f("QUEUE-BOUND", v.record.step_index, "more never-scheduled requests queued than the bound",
                          len(fresh), t.queue_bound, [name], [max(fresh)]))
    return out


def h_no_loss(h: HistoryContext) -> list[Finding]:
    """NO-LOSS (SPEC.md 7.1), record form: every request the steps name was offered
    and is live there; every step's running list and queue counts are what its
    requests' events imply (a request missing from both is lost); each arrival is
    answered once; each record ends coherently and as the steps show it."""
    out = h.anomalies("NO-LOSS")
    for r in h.history.requests:
        bad = None
        if r.outcome == "rejected" and r.reason is None:
            bad = "rejected without a reason"
        elif r.outcome != "rejected" and r.reason is not None:
            bad = "a reason on a request that was not rejected"
        elif r.outcome == "finished" and r.tokens_generated != r.output_tokens:
            bad = "finished without producing all its tokens"
        elif r.outcome == "rejected" and r.reason in ADMISSION_REASONS and r.admitted_step is not None:
            bad = (f"refused {r.reason!r} after it was admitted, a reason given only to an arrival (an admitted "
                   "request ends refused only as evicted_too_often)")
        elif r.outcome == "finished" and r.admitted_step is None:
            bad = "never admitted yet recorded as served"
        if bad:
            out.append(_f("NO-LOSS", None, f"request record incoherent: {bad}", r.outcome, "a coherent record",
                          [r.tenant], [r.request_id]))
        elif (r.admitted_step is not None and r.outcome not in ("rejected", "cancelled")
              and hopeless(h.config, r.prompt_tokens, r.output_tokens)):
            pool = h.config.num_blocks * h.config.block_size_tokens
            out.append(_f("NO-LOSS", r.admitted_step, f"request {r.request_id} was admitted though its KV "
                          f"(prompt + output - 1 = {r.prompt_tokens + r.output_tokens - 1} tokens) can never fit the "
                          f"pool ({pool} tokens): it can never finish and is still {r.outcome} (refuse it too_large)",
                          r.prompt_tokens + r.output_tokens - 1, pool, [r.tenant], [r.request_id]))
    lost_tenants: set[str] = set()
    for v in h.views:
        s, k = v.record, v.record.step_index
        running = set(s.running)
        if len(running) != len(s.running):
            out.append(_f("NO-LOSS", k, "a request is listed as running twice", len(s.running), len(running)))
        for rid in sorted(running.symmetric_difference(v.running)):
            if rid in h.requests:
                listed = rid in s.running
                out.append(_f("NO-LOSS", k, f"step {k} lists request {rid} as {'running' if listed else 'not running'}"
                              f"; its events leave it {'not running' if listed else 'running'}",
                              "running" if listed else "not running", "not running" if listed else "running",
                              [h.requests[rid].tenant], [rid]))
        queued, waiting = s.queued, v.waiting
        for name in dict.fromkeys([*queued, *waiting]):  # the step's tenant order, not a set's (hash-seed) order
            want = len(waiting.get(name, ()))
            if queued.get(name, 0) != want and name not in lost_tenants:
                lost_tenants.add(name)
                ids = v.waiting.get(name, ())
                out.append(_f("NO-LOSS", k, f"after step {k} tenant {name} has {want} requests waiting by its events, "
                              f"the step says {s.queued.get(name, 0)}: one is "
                              f"{'lost' if s.queued.get(name, 0) < want else 'counted twice'}",
                              s.queued.get(name, 0), want, [name], list(ids[-1:])))
    if h.steps:
        last = h.steps[-1].start_s
        for rid, q in h.replay.reqs.items():
            r = q.rec
            if q.status == "offered" and r.arrival_s <= last and r.outcome != "unfinished":
                out.append(_f("NO-LOSS", None, "an arrival was never answered (neither queued nor refused)",
                              r.outcome, "queued or rejected", [r.tenant], [rid]))
            elif q.status.startswith("ended:") and r.outcome != q.status[6:] and h.replay.exact:
                out.append(_f("NO-LOSS", q.ended_step, f"the record says {r.outcome}; the steps end it "
                              f"{q.status[6:]} at step {q.ended_step}", r.outcome, q.status[6:], [r.tenant], [rid]))
            elif q.live and r.outcome in ("finished", "rejected", "cancelled") and h.replay.exact:
                out.append(_f("NO-LOSS", None, f"the record says {r.outcome}; the steps leave it {q.status}",
                              r.outcome, q.status, [r.tenant], [rid]))
    return out


def h_batch_limits(h: HistoryContext) -> list[Finding]:
    """BATCH-LIMITS (SPEC.md 7.1), record form: sequences and tokens within the
    limits; no repeated entry; no preempted request in its step's batch; no
    preemption of a request that is not running; each entry computes 1 to the
    tokens its request has left."""
    cfg, out = h.config, h.anomalies("BATCH-LIMITS")
    for s in h.steps:
        ids = [rid for rid, _ in s.batch]
        sizes = [n for _, n in s.batch]
        total = sum(sizes)
        distinct = set(ids)
        if len(s.running) > cfg.max_num_seqs:
            out.append(_f("BATCH-LIMITS", s.step_index, "more sequences running than max_num_seqs", len(s.running),
                          cfg.max_num_seqs))
        if total > cfg.token_budget:
            out.append(_f("BATCH-LIMITS", s.step_index, "more tokens in the batch than the budget", total,
                          cfg.token_budget, requests=ids))
        if len(distinct) != len(ids):
            out.append(_f("BATCH-LIMITS", s.step_index, "a request has more than one batch entry (entries against "
                          "distinct requests)", len(ids), len(distinct),
                          requests=sorted({r for r in ids if ids.count(r) > 1})))
        if any(n < 1 for n in sizes):
            out.append(_f("BATCH-LIMITS", s.step_index, "a batch entry computes no token (its tokens against the "
                          "least an entry computes)", min(sizes), 1,
                          requests=[r for r, n in zip(ids, sizes) if n < 1]))
        both = distinct.intersection(s.preempted) if s.preempted else None
        if both:
            out.append(_f("BATCH-LIMITS", s.step_index, "a request preempted in this step is in its batch",
                          len(both), 0, requests=sorted(both)))
    return out


def h_work_conserving(h: HistoryContext) -> list[Finding]:
    """WORK-CONSERVING (SPEC.md 7.1), record form: no step leaves a seat and token
    budget unused while some tenant's first ready waiting request would surely
    fit: the blocks of the largest first chunk it could be given
    (``min(target, token_budget)`` tokens; its whole target with a prefix cache)
    are free during the step (free after it, less what the step's finishing
    requests held), within its tenant's cap.  A step whose record names a
    starvation-guard reservation (``reserved``) is excused.  Needs ``held`` (or
    no sharing) and exact computed tokens; the first such step is reported."""
    cfg, out = h.config, []
    if not h.replay.exact:
        return out
    for v in h.views:
        s, k = v.record, v.record.step_index
        during = set(s.running) | set(v.finished)
        seats = cfg.max_num_seqs - len(during)
        budget = cfg.token_budget - sum(n for _, n in s.batch)
        held = s.held if s.held is not None else (
            {rid: cfg.blocks_for(c) for rid, c in v.running.items()} if not h.shareable else None)
        if seats > 0 and budget > 0 and held is not None and not (h.shareable and v.finished) and s.reserved is None:
            free = s.free_blocks - sum(cfg.blocks_for(c) for c in v.finished.values())
            per: dict[str, int] = {}
            for rid in during:
                r = h.requests.get(rid)
                if r is not None:
                    b = held.get(rid, cfg.blocks_for(v.finished.get(rid, 0)))
                    per[r.tenant] = per.get(r.tenant, 0) + b
            in_batch = [h.requests[rid].tenant for rid in during if rid in h.requests]
            for name, (rid, target) in v.heads.items():
                if at_slot_cap(cfg, name, in_batch):
                    continue
                need = cfg.blocks_for(target if cfg.prefix_cache != "off" else min(target, cfg.token_budget))
                cap = h.tenant_cfg[name].kv_block_cap if cfg.admission.kv_cap and name in h.tenant_cfg else None
                if need <= free and (cap is None or per.get(name, 0) + need <= cap):
                    out.append(_f("WORK-CONSERVING", k, f"request {rid} of tenant {name} waits although it fits: "
                                  f"{seats} free seats, {budget} tokens of budget and {free} free blocks, it needs "
                                  f"{need}", need, free, [name], [rid]))
                    return out
    return out


# --- admission and eviction ----------------------------------------------------------


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


def h_evict_cooldown(h: HistoryContext) -> list[Finding]:
    """EVICT-COOLDOWN (SPEC.md 7.4), history form: a request preempted in step k is
    in no batch before step k + 1 + cooldown_steps."""
    c, out = h.config.eviction.cooldown_steps, []
    until: dict[int, tuple[int, int]] = {}
    for s in h.steps:
        for rid, _ in s.batch:
            if rid in until and s.step_index < until[rid][0]:
                out.append(_f("EVICT-COOLDOWN", s.step_index, f"request ran again {s.step_index - until[rid][1]} "
                              f"steps after its preemption", s.step_index, until[rid][0], requests=[rid]))
                del until[rid]
        for rid in s.preempted:
            until[rid] = (s.step_index + 1 + c, s.step_index)
    return out


def h_evict_bounded(h: HistoryContext) -> list[Finding]:
    """EVICT-BOUNDED (SPEC.md 7.4), history form: preemptions <= max_evictions,
    evicted_too_often only at max_evictions, recomputed tokens <= preemptions x
    (prompt + output - 1)."""
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
    return out


def h_victim(h: HistoryContext) -> list[Finding]:
    """VICTIM (SPEC.md 7.4), history form for ``newest`` / ``lowest_priority``: each
    preempted request is the first by the policy's order among those running."""
    cfg, out = h.config, []
    order = {}
    for r in h.history.requests:
        if r.admitted_step is not None:
            order[r.request_id] = (r.admitted_step, r.arrival_s, r.request_id)
    pol = cfg.eviction.victim
    rank = (lambda rid: tuple(-x for x in order[rid])) if pol == "newest" else (
        lambda rid: (-h.tier(h.requests[rid].tenant),) + tuple(-x for x in order[rid]))
    starts = {s.start_s for s in h.steps}
    gone_at = {}
    for r in h.history.requests:
        if r.finish_s in starts and (r.outcome == "cancelled" or r.reason == "evicted_too_often"):
            gone_at.setdefault(r.finish_s, set()).add(r.request_id)
    prev_running: tuple = ()
    for s in h.steps:
        cands = set(prev_running) - gone_at.get(s.start_s, set())
        for_priority = {e.request_id for e in s.events if e.kind == "preempted" and e.reason == "priority"}
        for rid in s.preempted:
            cands.discard(rid)
            if rid in for_priority:  # chosen among the lower tiers for a waiting head (PRIORITY-PREEMPT)
                continue
            better = [c for c in cands if c in order and rank(c) < rank(rid)]
            if better:
                out.append(_f("VICTIM", s.step_index, f"the {pol} policy ranks request {min(better, key=rank)} before "
                              f"the victim, request {rid}", rid, min(better, key=rank), requests=[rid, min(better, key=rank)]))
        prev_running = s.running
    return out


def h_evict_min_free(h: HistoryContext) -> list[Finding]:
    """EVICT-MIN-FREE (SPEC.md 7.4), record form: an eviction that frees fewer than
    ``min_free_blocks`` (its event's ``blocks``; in records without events, the
    blocks its computed tokens filled) is the requesting sequence giving up its
    own blocks: the victim must have needed a new block in this step."""
    cfg, out = h.config, []
    m = cfg.eviction.min_free_blocks
    if not h.replay.exact:
        return out
    for v in h.views:
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


def _content_keys(r: RequestRecord, n: int) -> list:
    """The content of blocks 0..n-1 of request ``r``: a chain over its prefix content ids,
    then unique to the request (what a block must hold for ``r`` to read it)."""
    out, key = [], ("c",)
    for j in range(n):
        if j < len(r.prefix_ids):
            key = hash((key, r.prefix_ids[j]))
            out.append(key)
        else:
            out.append(("u", r.request_id, j))
    return out


def block_reads(h: HistoryContext) -> list[tuple[int, int, int, object, tuple]]:
    """Blocks held with content they do not hold: (step, request id, position, block id,
    writer) for every block a running request holds at a computed position whose last
    writer was another salt or other content (the first such per request).  A block's
    writer is followed over its whole life, cache hit declared or not: the request
    that computes tokens into a block (its entry's declared hits excepted) writes it,
    in its last step too (a request finishing in a step has its block ids there).

    Cost follows what changed: a position a request held, fine, at its last check stays
    fine while it holds the same block and no other content is written into that block
    (a writer's salt and content only matter), so each step checks a request's new
    positions, positions whose block changed and blocks written with other content since,
    in position order; the result is that of checking every position every step."""
    cfg, B, out = h.config, h.config.block_size_tokens, []
    salt = {t.name: (t.salt if cfg.prefix_cache == "salted" else None) for t in cfg.tenants}
    writer: dict = {}
    rewritten: dict = {}  # block id -> index (in ``h.views``) of the last step that wrote other content into it
    seen: dict[int, tuple] = {}  # request id -> (block ids, positions checked, view index) of its last check
    keys: dict[int, list] = {}
    bad: set[int] = set()
    for i, v in enumerate(h.views):
        s, k = v.record, v.record.step_index
        if not s.block_ids:
            continue
        entered = {e.request_id: e.tokens for e in s.events if e.kind == "scheduled"}
        held = [(rid, c, s.block_ids.get(rid), h.requests.get(rid)) for rid, c in v.running.items()]
        # a request finishing in the step wrote its last chunk too (its ids as it finished)
        held += [(rid, c, s.block_ids.get(rid), h.requests.get(rid)) for rid, c in v.finished.items()]
        changed = set()
        for rid, c_after, ids, r in held:
            if ids and r is not None:
                start = entered[rid] // B if rid in entered else v.before.get(rid, (0, 0))[0] // B
                for j in range(start, min(cfg.blocks_for(c_after), len(ids))):
                    w = (salt.get(r.tenant), _key(keys, r, j), r.tenant, rid)
                    was = writer.get(ids[j])
                    if was is not None and (was[0] != w[0] or was[1] != w[1]):
                        changed.add(ids[j])
                        rewritten[ids[j]] = i
                    writer[ids[j]] = w
        for rid, c_after, ids, r in held:
            if not ids or r is None or rid in bad:
                continue
            n = min(cfg.blocks_for(c_after), len(ids))
            last = seen.get(rid)
            if last is None:
                todo = range(n)
            else:
                old, m, at = last
                m = min(m, n)
                if old is not ids and old[:m] != ids[:m]:
                    todo = [j for j in range(n) if j >= m or old[j] != ids[j] or rewritten.get(ids[j], -1) > at]
                elif not changed and not (at < i - 1 and rewritten):
                    todo = range(m, n)
                else:
                    since = changed if at == i - 1 else {b for b in ids[:m] if rewritten.get(b, -1) > at}
                    todo = ([j for j in range(m) if ids[j] in since] if since and not since.isdisjoint(ids[:m])
                            else []) + list(range(m, n))
            seen[rid] = (ids, n, i)
            for j in todo:
                w = writer.get(ids[j])
                if w is None:  # first seen holding computed tokens: its holder wrote it
                    writer[ids[j]] = (salt.get(r.tenant), _key(keys, r, j), r.tenant, rid)
                elif w[0] != salt.get(r.tenant) or w[1] != _key(keys, r, j):
                    out.append((k, rid, j, ids[j], w))
                    bad.add(rid)
                    break
    return out


def h_salt_isolation(h: HistoryContext) -> list[Finding]:
    """SALT-ISOLATION (SPEC.md 7.5), record form over block ids: no request holds a
    block last written under another salt (:func:`block_reads`)."""
    salt = {t.name: t.salt for t in h.config.tenants}
    out = []
    for k, rid, j, bid, w in h.block_reads:
        r = h.requests[rid]
        if w[0] != salt.get(r.tenant):
            out.append(_f("SALT-ISOLATION", k, f"request {rid} (tenant {r.tenant}) holds block {bid!r} at position {j}, "
                          f"written by request {w[3]} (tenant {w[2]}) under another salt", w[2], r.tenant,
                          [r.tenant, w[2]] if w[2] != r.tenant else [r.tenant], [rid, w[3]]))
    return out


def _key(cache: dict[int, list], r: RequestRecord, j: int):
    ks = cache.get(r.request_id)
    if ks is None or len(ks) <= j:
        ks = cache[r.request_id] = _content_keys(r, max(j + 1, 2 * len(ks or ())))
    return ks[j]
