"""Record forms of the invariants: judge a recorded run offline (SPEC.md 7).  This
module holds the :class:`HistoryContext` every record form reads and the safety
ones (SPEC.md 7.1); the fairness ones are in :mod:`tenantry.spec.invariants_history_fair`,
those of the KV pool and its blocks in :mod:`tenantry.spec.invariants_history_blocks`, those of
admission and eviction in :mod:`tenantry.spec.invariants_history_evict`.

They read only what :mod:`tenantry.runner.history` records (request records and,
where present, per-step snapshots) plus the configuration the scheduler
claims, so the same checks judge a scheduler tenantry did not write.  Each
``h_*(hctx: HistoryContext) -> list[Finding]``; a check that needs step
snapshots returns nothing when the history has none.

**One definition.**  Where a record form judges step by step, its judgement of
one step is a function of its own, ``s_*(h, v, pv, carry) -> list[Finding]``
(``v`` the step's :class:`~tenantry.spec.replay.StepView`, ``pv`` the one before
it or None, ``carry`` a dict the judgement may keep between steps, e.g. what it
already reported): the record form runs it over every step (:func:`each_step`),
and the invariant's state form is the same function run on one step of the
model (:func:`tenantry.spec.invariants_state.from_record`).  What the record form
judges only over the whole run stays in ``h_*``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Callable

import attrs

from tenantry.model.config import Config
from tenantry.model.events import ADMISSION_REASONS
from tenantry.runner.history import History, RequestRecord

from .invariants_core import Finding, at_slot_cap, hopeless, largest_charge, slot_caps
from .replay import Replay, StepView


@attrs.frozen
class HistoryContext:
    """A history plus the configuration it is judged against, and what its records imply
    (:class:`~tenantry.spec.replay.Replay`, walked once and shared by every form)."""

    history: History
    config: Config
    #: What a record form computes once and shares with another, by name (the blocks' writers:
    #: :func:`~tenantry.spec.invariants_history_blocks.block_reads`).
    memo: dict = attrs.field(factory=dict, init=False, eq=False, repr=False)

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

    @property
    def start(self) -> StepView | None:
        """The records' state before the first step (None: nothing; a one-step context
        gives the state the step started from)."""
        return None

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


#: A record form's judgement of one step: ``judge(h, v, pv, carry) -> list[Finding]``.
StepJudge = Callable[[HistoryContext, StepView, "StepView | None", dict], list[Finding]]


def first_of(findings: list[Finding], key: Callable[[Finding], object] = lambda f: f.message) -> list[Finding]:
    """The first of ``findings`` of each ``key`` (by default, each message), in order: what a
    record form reports once per run where every step would repeat it."""
    seen: set = set()
    out = []
    for f in findings:
        k = key(f)
        if k not in seen:
            seen.add(k)
            out.append(f)
    return out


def each_step(h: HistoryContext, judge: StepJudge) -> list[Finding]:
    """``judge`` over every step of ``h`` in order, each with the view before it (the
    first with :attr:`HistoryContext.start`) and one ``carry`` for the whole run."""
    out: list[Finding] = []
    pv, carry = h.start, {}
    for v in h.views:
        out += judge(h, v, pv, carry)
        pv = v
    return out


# --- safety --------------------------------------------------------------------------


def s_slot_cap(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """SLOT-CAP's judgement of one step (:func:`h_slot_cap`)."""
    cfg, out = h.config, []
    if not cfg.admission.slot_cap:
        return out
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


def h_slot_cap(h: HistoryContext) -> list[Finding]:
    """SLOT-CAP (SPEC.md 7.1), record form: the requests of a tenant in a step's
    batch (running after it, or finished in it) number at most its enforced
    ``max_running_seqs``, those of a tier at most the tier's slot cap (:func:`s_slot_cap`)."""
    return each_step(h, s_slot_cap)


def s_queue_bound(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """QUEUE-BOUND's judgement of one step (:func:`h_queue_bound`): each tenant with more
    never-scheduled requests waiting after the step than its bound (naming the newest);
    then, of the other tenants, each arrival the step queued past the bound (replaying
    its answers in order from the count before it, less its cancellations: one that took
    the count past the bound and was scheduled in the same step)."""
    cfg, out = h.config, []
    if not cfg.admission.queue_bound:
        return out
    k, over = v.record.step_index, set()
    for name, fresh in v.fresh.items():
        t = h.tenant_cfg.get(name)
        if t is not None and t.queue_bound is not None and len(fresh) > t.queue_bound:
            over.add(name)
            out.append(_f("QUEUE-BOUND", k, "more never-scheduled requests queued than the bound", len(fresh),
                          t.queue_bound, [name], [max(fresh)]))
    if not v.answers:
        return out
    count = {name: len(ids) for name, ids in pv.fresh.items()} if pv is not None else {}
    if v.cancelled and pv is not None:  # the step's cancellations come before its arrivals
        gone = {rid for rid, _ in v.cancelled}
        for name, ids in pv.fresh.items():
            count[name] -= sum(1 for rid in ids if rid in gone)
    for rid, answer in v.answers:
        r = h.requests.get(rid)
        t = h.tenant_cfg.get(r.tenant) if r is not None else None
        if t is None or answer != "queued":
            continue
        count[r.tenant] = n = count.get(r.tenant, 0) + 1
        if t.queue_bound is not None and n > t.queue_bound and r.tenant not in over:
            out.append(_f("QUEUE-BOUND", k, "a request was queued past the bound (its tenant's never-scheduled "
                          "requests at its admission)", n, t.queue_bound, [r.tenant], [rid]))
    return out


def h_queue_bound(h: HistoryContext) -> list[Finding]:
    """QUEUE-BOUND (SPEC.md 7.1), record form: after every step, each tenant's admitted,
    never-scheduled, not-ended requests number at most its bound, and replaying each
    step's answers in order, no ``queued`` arrival took that count past the bound
    (:func:`s_queue_bound`; the first per tenant).  A ``queue_full`` given below the
    bound is a false refusal: REFUSAL-TRUTH."""
    return first_of(each_step(h, s_queue_bound), lambda f: f.tenants)


def s_no_loss(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """NO-LOSS's judgement of one step (:func:`h_no_loss`): its running list and queue
    counts are what its requests' events imply."""
    out = []
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
    lost_tenants = carry.setdefault("lost", set())
    for name in dict.fromkeys([*queued, *waiting]):  # the step's tenant order, not a set's (hash-seed) order
        want = len(waiting.get(name, ()))
        if queued.get(name, 0) != want and name not in lost_tenants:
            lost_tenants.add(name)
            ids = v.waiting.get(name, ())
            out.append(_f("NO-LOSS", k, f"after step {k} tenant {name} has {want} requests waiting by its events, "
                          f"the step says {s.queued.get(name, 0)}: one is "
                          f"{'lost' if s.queued.get(name, 0) < want else 'counted twice'}",
                          s.queued.get(name, 0), want, [name], list(ids[-1:])))
    return out


def h_no_loss(h: HistoryContext) -> list[Finding]:
    """NO-LOSS (SPEC.md 7.1), record form: every request the steps name was offered
    and is live there; every step's running list and queue counts are what its
    requests' events imply (a request missing from both is lost; :func:`s_no_loss`);
    over the whole run, each arrival is answered once and each record ends
    coherently and as the steps show it."""
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
    out += each_step(h, s_no_loss)
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


def s_batch_limits(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """BATCH-LIMITS's judgement of one step (:func:`h_batch_limits`)."""
    cfg, s, out = h.config, v.record, []
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


def h_batch_limits(h: HistoryContext) -> list[Finding]:
    """BATCH-LIMITS (SPEC.md 7.1), record form: sequences and tokens within the
    limits; no repeated entry; no preempted request in its step's batch; no
    preemption of a request that is not running; each entry computes 1 to the
    tokens its request has left (:func:`s_batch_limits`)."""
    return h.anomalies("BATCH-LIMITS") + each_step(h, s_batch_limits)


def s_work_conserving(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """WORK-CONSERVING's judgement of one step (:func:`h_work_conserving`): each tenant whose
    first ready request waits though it surely fits."""
    cfg = h.config
    if not h.replay.exact:
        return []
    s, k = v.record, v.record.step_index
    during = set(s.running) | set(v.finished)
    seats = cfg.max_num_seqs - len(during)
    budget = cfg.token_budget - sum(n for _, n in s.batch)
    held = s.held if s.held is not None else (
        {rid: cfg.blocks_for(c) for rid, c in v.running.items()} if not h.shareable else None)
    if seats <= 0 or budget <= 0 or held is None or (h.shareable and v.finished) or s.reserved is not None:
        return []
    free = s.free_blocks - sum(cfg.blocks_for(c) for c in v.finished.values())
    per: dict[str, int] = {}
    for rid in during:
        r = h.requests.get(rid)
        if r is not None:
            b = held.get(rid, cfg.blocks_for(v.finished.get(rid, 0)))
            per[r.tenant] = per.get(r.tenant, 0) + b
    in_batch = [h.requests[rid].tenant for rid in during if rid in h.requests]
    out = []
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


def h_work_conserving(h: HistoryContext) -> list[Finding]:
    """WORK-CONSERVING (SPEC.md 7.1), record form: no step leaves a seat and token
    budget unused while some tenant's first ready waiting request would surely
    fit: the blocks of the largest first chunk it could be given
    (``min(target, token_budget)`` tokens; its whole target with a prefix cache)
    are free during the step (free after it, less what the step's finishing
    requests held), within its tenant's cap.  A step whose record names a
    starvation-guard reservation (``reserved``) is excused.  Needs ``held`` (or
    no sharing) and exact computed tokens; the first such request is reported
    (:func:`s_work_conserving`)."""
    return each_step(h, s_work_conserving)[:1]
