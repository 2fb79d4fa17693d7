"""History mode: judge a recorded history offline (a batch-mode scheduler's
output, a real server's logs converted to the schema of
:mod:`tenantry.runner.history`).

:func:`verify_history` applies the invariant catalog's record forms (safety
always, the rest when claimed) to the history, deduplicates what they find,
and :func:`locate` completes each finding with the step and the request it
concerns where the history allows.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable

from tenantry.model.config import Config, config_to_dict
from tenantry.model.workload import Request
from tenantry.runner.history import History, RequestRecord, StepEvent, StepRecord
from tenantry.spec.invariants_core import Finding

from .protocol import Claims

#: Slack for comparing recorded times (seconds): the histories store floats in repr form.
TIME_EPS = 1e-9


def _step_at(history: History, t_s: float | None, *, end: bool) -> int | None:
    """The step starting (``end=False``) or ending (``end=True``) at t_s, if any."""
    if t_s is None or not history.steps:
        return None
    key = [s.start_s + s.duration_s if end else s.start_s for s in history.steps]
    i = bisect_left(key, t_s - TIME_EPS)
    if i < len(key) and abs(key[i] - t_s) <= TIME_EPS:
        return history.steps[i].step_index
    return None


def _newest_fresh(history: History, tenant: str, step: int) -> int | None:
    """The newest of ``tenant``'s requests queued and never scheduled after ``step``:
    the one a full queue should have refused."""
    fresh = []
    for r in history.requests:
        if r.tenant != tenant or r.admitted_step is None or r.admitted_step > step:
            continue
        first = _step_at(history, r.first_scheduled_s, end=False)
        gone = _step_at(history, r.finish_s, end=False) if r.outcome != "finished" else None
        if (first is None or first > step) and (gone is None or gone > step):
            fresh.append(r.request_id)
    return max(fresh) if fresh else None


def locate(f: Finding, history: History) -> Finding:
    """The finding with its step and request filled in where the history tells them.

    A request-level finding without a step gets the step where the request
    ended (or was admitted), in a history with step records; a QUEUE-BOUND finding gets the newest request of
    its tenant still queued and never scheduled (the one that should have been
    refused); another step-level finding gets the newest running request of
    its tenant (or of any tenant) at that step.
    """
    import attrs

    step, rid, tenant = f.step, f.request_id, f.tenant
    recs = {r.request_id: r for r in history.requests}
    if step is None and rid is not None and rid in recs:
        r = recs[rid]
        step = _step_at(history, r.finish_s, end=r.outcome == "finished")
        if step is None and history.steps:  # without step records there is no step to name
            step = r.admitted_step
    if rid is None and f.invariant == "QUEUE-BOUND" and tenant is not None and step is not None:
        rid = _newest_fresh(history, tenant, step)
    if rid is None and step is not None and 0 <= step < len(history.steps):
        s = history.steps[step]
        cands = [x for x in s.running if x in recs and (tenant is None or recs[x].tenant == tenant)]
        if not cands:
            cands = [b[0] for b in s.batch]
        rid = max(cands) if cands else None
    if tenant is None and rid is not None and rid in recs:
        tenant = recs[rid].tenant
    return attrs.evolve(f, step=step, requests=f.requests or (() if rid is None else (rid,)),
                        tenants=f.tenants or (() if tenant is None else (tenant,)))


def verify_history(history: History, config: Config | None = None, claimed: Iterable[str] = ()) -> list[Finding]:
    """Every finding on ``history`` under ``config`` (default: the header's), located.

    Args:
        claimed: claim-level invariant ids the scheduler asserts (the safety
            ones are always checked).

    Raises:
        ConfigError: if no config is given and the header has none that parses.
    """
    from tenantry.spec.invariants import check_history, config_from_dict
    from tenantry.spec.invariants_core import dedup

    if config is None:
        config = config_from_dict(history.header.get("config") or {})
    claims = Claims(config, invariants=tuple(claimed))
    found = [locate(f, history) for f in dedup(check_history(history, claims))]
    found.sort(key=lambda f: (f.step if f.step is not None else 1 << 60, f.invariant))
    return found


def history_header(config: Config, num_requests: int, scheduler: str, claims: Iterable[str] = (),
                   extra: dict | None = None) -> dict:
    """The header of a recorded history (SPEC.md 6): the claimed configuration, the
    number of request records, the scheduler's one-line description and its claims
    (what ``tenantry verify --history`` reads when given no ``--config`` / ``--claims``)."""
    return {"config": config_to_dict(config), "requests": num_requests, "scheduler": scheduler,
            "claims": sorted(claims), **(extra or {})}


class Recording:
    """A history built from the decisions of a scheduler tenantry did not write, as
    it made them (history mode's recorder; the step-mode harness records its own).

    Two kinds of source:

    * one with steps (a simulation that runs batches): call :meth:`step` once per
      step with what it decided (answers to arrivals, entries into the batch, the
      batch's tokens, what runs and waits after it, the KV blocks each running
      request holds, its own counters or deficits).  The recording produces the
      tokens the way every tenantry history does (a batch entry that brings a
      request's computed tokens to prompt + generated produces one token), and
      from them the ``first_token`` / ``finished`` events, the request records and
      each tenant's service (``w_in`` x prompt when first scheduled, ``w_out`` per
      token) and block-seconds; a batch entry for a request that already ended is
      recorded as given and produces nothing (the checks report it);
    * one without steps (a request log): call :meth:`settle` once per request with
      its outcome and times.  Such a history has request records only, and the
      invariants that need steps report ``unknown`` (SPEC.md 6).

    Args:
        config: the configuration the scheduler claims (tenants, pool, batch limits, policy).
        scheduler: one line naming the scheduler, for the header and reports.
        claims: claim-level invariant ids it asserts (the safety ones are always checked).
        header: further header entries (free-form JSON).
    """

    def __init__(self, config: Config, *, scheduler: str, claims: Iterable[str] = (),
                 header: dict | None = None) -> None:
        self.config, self.scheduler, self.claims = config, scheduler, tuple(claims)
        self.extra = dict(header or {})
        self.requests: dict[int, Request] = {}
        self.records: dict[int, dict] = {}
        self.steps: list = []
        self._computed: dict[int, int] = {}
        self._generated: dict[int, int] = {}
        names = [t.name for t in config.tenants]
        self.service = {n: 0.0 for n in names}
        self.block_seconds = {n: 0.0 for n in names}

    def offer(self, request: Request) -> None:
        """Request ``request`` is offered (before any step that answers it)."""
        self.requests[request.request_id] = request
        self.records[request.request_id] = {
            "request_id": request.request_id, "tenant": request.tenant, "arrival_s": request.arrival_s,
            "prompt_tokens": request.prompt_tokens, "output_tokens": request.output_tokens,
            "outcome": "unfinished", "prefix_ids": request.prefix_ids}

    def step(self, start_s: float, duration_s: float, *, batch: Iterable[tuple[int, int]],
             running: Iterable[int], queued: dict[str, int], answers: Iterable[tuple[int, str | None]] = (),
             scheduled: Iterable[int] = (), held: dict[int, int] | None = None,
             counters: dict[str, float] | None = None, deficits: dict[str, float] | None = None) -> StepRecord:
        """Record one step (times in seconds) and return its :class:`StepRecord`.

        Args:
            batch: (request id, tokens computed in the step), in batch order.
            running: ids holding KV after the step (in the batch, or admitted to it
                and not computed in this step).
            queued: per tenant, requests waiting in its queue after the step.
            answers: the step's arrivals in order: (id, None) queued, or (id, reason)
                refused at admission (a reason of :data:`~tenantry.model.events.REJECT_REASONS`).
            scheduled: ids entering the batch in this step (first or again).
            held: KV blocks each running request holds after the step; None: the blocks
                of its computed tokens.
            counters, deficits: the scheduler's own books after the step (per tenant), if it keeps them.

        Raises:
            ValueError: naming the request when an answer or entry names an unknown request.
        """
        cfg, k = self.config, len(self.steps)
        end_s = start_s + duration_s
        events = []
        for rid, reason in answers:
            rec = self._rec(rid)
            if reason is None:
                rec["admitted_step"] = k
                events.append(StepEvent("queued", rid))
            else:
                rec.update(outcome="rejected", reason=reason, finish_s=rec["arrival_s"])
                events.append(StepEvent("rejected", rid, reason))
        for rid in scheduled:
            rec = self._rec(rid)
            if rec.get("first_scheduled_s") is None:
                rec["first_scheduled_s"] = start_s
                self.service[rec["tenant"]] += cfg.order.w_in * rec["prompt_tokens"]
            self._computed.setdefault(rid, 0)
            events.append(StepEvent("scheduled", rid))
        batch = tuple((rid, n) for rid, n in batch)
        tokens = []
        for rid, n in batch:
            rec = self._rec(rid)
            if rec["outcome"] != "unfinished":
                continue  # an entry for an ended request produces nothing (the replay reports it)
            c = self._computed[rid] = self._computed.get(rid, 0) + n
            g = self._generated.get(rid, 0)
            if c == rec["prompt_tokens"] + g:
                g = self._generated[rid] = g + 1
                self.service[rec["tenant"]] += cfg.order.w_out
                rec["tokens_generated"] = g
                if g == 1:
                    rec["first_token_s"] = end_s
                    tokens.append(StepEvent("first_token", rid))
                if g == rec["output_tokens"]:
                    rec.update(outcome="finished", finish_s=end_s)
                    tokens.append(StepEvent("finished", rid, tokens=g))
        running = tuple(running)
        if held is None:
            held = {rid: cfg.blocks_for(self._computed.get(rid, 0)) for rid in running}
        blocks = {n: 0 for n in self.service}
        for rid in running:
            blocks[self.records[rid]["tenant"]] += held.get(rid, 0)
        for name, b in blocks.items():
            self.block_seconds[name] += b * duration_s
        used = sum(held.get(rid, 0) for rid in running)
        rec = StepRecord(
            step_index=k, start_s=start_s, duration_s=duration_s, batch=batch, preempted=(), running=running,
            queued=dict(queued), blocks_in_use=blocks, free_blocks=cfg.num_blocks - used,
            counters=dict(counters or {}), deficits=dict(deficits or {}), service=dict(self.service),
            block_seconds=dict(self.block_seconds), events=tuple(events) + tuple(tokens), used_blocks=used,
            held={rid: held.get(rid, 0) for rid in running})
        self.steps.append(rec)
        return rec

    def settle(self, request_id: int, *, admitted: bool, reason: str | None = None, start_s: float | None = None,
               first_token_s: float | None = None, finish_s: float | None = None) -> None:
        """Record the outcome of one request of a source without steps (times in seconds).

        ``admitted`` without ``reason``: it was queued and served whole (``start_s``,
        ``first_token_s``, ``finish_s``); ``reason`` without ``admitted``: refused at
        admission at ``finish_s``; both: refused at ``finish_s`` after it had been
        queued.  With no steps there is no step index to give, so ``admitted_step`` is
        0 for every admitted request (it says "admitted", not when).

        Raises:
            ValueError: on an unknown request, or a served request without its times.
        """
        rec = self._rec(request_id)
        if admitted:
            rec["admitted_step"] = 0
        if reason is not None:
            rec.update(outcome="rejected", reason=reason, finish_s=finish_s)
            return
        if not admitted or None in (start_s, first_token_s, finish_s):
            raise ValueError(f"request {request_id}: a served request needs admitted=True, start_s, "
                             f"first_token_s and finish_s (given {start_s}, {first_token_s}, {finish_s})")
        rec.update(outcome="finished", first_scheduled_s=start_s, first_token_s=first_token_s, finish_s=finish_s,
                   tokens_generated=rec["output_tokens"])

    def _rec(self, rid: int) -> dict:
        rec = self.records.get(rid)
        if rec is None:
            raise ValueError(f"request {rid} was never offered to the recording (call offer() first)")
        return rec

    def history(self) -> History:
        """The recorded run: header (:func:`history_header`), steps, request records in id order."""
        recs = tuple(RequestRecord(**self.records[rid]) for rid in sorted(self.records))
        return History(header=history_header(self.config, len(recs), self.scheduler, self.claims, self.extra),
                       steps=tuple(self.steps), requests=recs)
