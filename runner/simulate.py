"""The driver: feed a workload to the step function and record the history.

``simulate(config, workload)`` is deterministic: the same configuration and
workload give the same :class:`~tenantry.runner.history.History`, byte for byte
once written.  Time comes only from the cost model; there is no wall clock and
no random state.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, NamedTuple, Protocol

import numpy as np

from tenantry.model.config import Config, ConfigError, config_to_dict
from tenantry.model.state import State, block_ids, free_blocks, initial_state, running_ids
from tenantry.model.step import Step, StepOutput, idle, step
from tenantry.model.workload import Request, StepInput, Workload, as_workload

from .fast import FastReplica, unsupported
from .history import History, RequestRecord, StepEvent, StepRecord


def check_workload(config: Config, workload: Workload) -> None:
    """Every request names a configured tenant.

    Raises:
        ConfigError: naming the first request (in arrival order) whose tenant is unknown:
            where it was read (``file:line``, :attr:`Workload.origin`, when read from a
            file), its id, the tenant and the configured tenants.
    """
    known = {t.name for t in config.tenants}
    for r in workload.requests:
        if r.tenant not in known:
            raise ConfigError(
                "tenant", r.tenant,
                f"request {r.request_id} names a tenant the configuration does not have ({', '.join(sorted(known))})",
                workload.origin.get(r.request_id, ""),
            )


def has_work(state: State) -> bool:
    """True while some sequence is running or queued."""
    return bool(state.running) or bool(state.backlogged())


class Recorder:
    """Builds request records and step records from step outputs.

    Args:
        record_steps: keep a step record per step.
        detail: also record each running request's blocks (``held``, and with
            the prefix cache on their ids, :func:`~tenantry.model.state.block_ids`):
            what the KV and isolation record forms need; costs a map per step.
        replica: the replica index the step records name (a fleet's; None: one replica).
    """

    def __init__(self, config: Config, record_steps: bool = True, detail: bool = False,
                 replica: int | None = None) -> None:
        self.config = config
        self.record_steps = record_steps
        self.detail = detail
        self.replica = replica
        self.requests: dict[int, dict[str, Any]] = {}
        self.steps: list[StepRecord] = []
        self._names = tenant_names(config)
        self._block_ids: dict[int, tuple] = {}  # request id -> (shared keys, private blocks, block ids): see snapshot

    def offered(self, r: Request) -> None:
        self.requests[r.request_id] = {
            "request_id": r.request_id, "tenant": r.tenant, "arrival_s": r.arrival_s,
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "outcome": "unfinished",
            "prefix_ids": r.prefix_ids,
        }

    def observe(self, state: State, out: StepOutput) -> None:
        """Fold one step's output (and the state after it) into the records."""
        for e in out.events:
            rec = self.requests[e.request_id]
            if e.kind == "queued":
                rec["admitted_step"] = out.step_index
            elif e.kind == "rejected":
                rec.update(outcome="rejected", reason=e.reason, retry_after_s=e.retry_after_s, finish_s=e.t_s)
            elif e.kind == "first_token":
                rec["first_token_s"] = e.t_s
            elif e.kind in ("finished", "cancelled"):
                rec.update(outcome=e.kind, finish_s=e.t_s)
        for s in out.finished:
            self._fold_sequence(s)
        if self.record_steps:
            self.steps.append(snapshot(self.config, state, out, self.detail, self._names, self._block_ids,
                                       self.replica))
            for s in out.finished:
                self._block_ids.pop(s.request_id, None)

    def _fold_sequence(self, s) -> None:
        rec = self.requests[s.request_id]
        rec.update(
            first_scheduled_s=s.first_scheduled_s, first_token_s=s.first_token_s, tokens_generated=s.output_done,
            preemptions=s.preemptions, wasted_prefill_tokens=s.wasted_tokens, cached_prompt_tokens=s.cached_tokens,
        )

    def history(self, state: State, header: dict[str, Any]) -> History:
        """The run's history; ``state``: the last state (or anything whose ``sequences()``
        gives the requests still in flight, as :class:`~tenantry.runner.fast.FastReplica`)."""
        for s in state.sequences():
            self._fold_sequence(s)
        recs = tuple(RequestRecord(**self.requests[k]) for k in sorted(self.requests))
        return History(header=header, steps=tuple(self.steps), requests=recs)


#: Groups of a step record's events in their canonical order (SPEC.md 6), by event:
#: cancellations, answers to arrivals (queued, or refused at admission) in arrival
#: order, evictions (preempted, or rejected evicted too often) in the order they
#: happened, entries into the batch, tokens.
_GROUP = {"cancelled": 0, "queued": 1, "preempted": 2, "scheduled": 4, "first_token": 5, "finished": 5}


def _group(e) -> int:
    if e.kind == "rejected":
        return 2 if e.reason == "evicted_too_often" else 1
    return _GROUP[e.kind]


def step_events(out: StepOutput) -> tuple[StepEvent, ...]:
    """A step's events as the history records them (:class:`~tenantry.runner.history.StepEvent`),
    in the canonical order (a stable sort of the model's order by group)."""
    evs = out.events
    if not evs:
        return ()
    if len(evs) > 1:
        evs = sorted(evs, key=_group)
    return tuple([StepEvent(e.kind, e.request_id, e.reason, e.retry_after_s, e.tokens, e.blocks) for e in evs])


def tenant_names(config: Config) -> list[str]:
    """The configured tenants' names, in configuration order (the order of a step record's per-tenant maps)."""
    return [t.name for t in config.tenants]


def _block_ids(s, memo: dict[int, tuple] | None) -> tuple:
    """:func:`~tenantry.model.state.block_ids` of sequence ``s``, kept in ``memo`` (request id ->
    (shared keys, private blocks, ids)) from step to step: the same tuple while the sequence
    holds the same blocks, extended when it gains private blocks (a decode step's usual change),
    so a step record costs what changed, not every block held."""
    if memo is None:
        return block_ids(s)
    rid, keys, priv = s.request.request_id, s.shared_keys, s.private_blocks
    hit = memo.get(rid)
    if hit is not None and hit[0] == keys:
        if hit[1] == priv:
            return hit[2]
        if hit[1] < priv:
            n = len(keys)
            ids = hit[2] + tuple([f"p{rid}:{n + j}" for j in range(hit[1], priv)])
            memo[rid] = (keys, priv, ids)
            return ids
    ids = memo[rid] = (keys, priv, block_ids(s))
    return ids[2]


def snapshot(config: Config, state: State, out: StepOutput, detail: bool = False,
             names: list[str] | None = None, memo: dict[int, tuple] | None = None,
             replica: int | None = None) -> StepRecord:
    """The step record of the history (SPEC.md 6): the state after the step and its events.

    ``names``: :func:`tenant_names` of ``config``, when the caller keeps them (a :class:`Recorder`);
    ``memo``: the caller's block ids from step to step (:func:`_block_ids`; the same record without);
    ``replica``: the record's replica index (a fleet's)."""
    if names is None:
        names = tenant_names(config)
    held = ids = None
    if detail:
        held = {s.request_id: s.blocks_held for s in state.running}
        if config.prefix_cache != "off":
            ids = {s.request_id: _block_ids(s, memo) for s in state.running}
            done = {e.request_id for e in out.events if e.kind == "finished"}
            ids.update((s.request_id, _block_ids(s, memo)) for s in out.finished if s.request_id in done)
            ids = ids or None  # and the blocks of requests finishing in the step, as they finished
    queued: dict[str, int] = {}
    blocks: dict[str, int] = {}
    counters: dict[str, float] = {}
    deficits: dict[str, float] = {}
    service: dict[str, float] = {}
    block_seconds: dict[str, float] = {}
    for n, t in zip(names, state.tenants):  # one pass builds every per-tenant map, in configuration order
        queued[n] = len(t.queue)
        blocks[n] = t.blocks
        counters[n] = t.counter
        deficits[n] = t.deficit
        service[n] = t.service
        block_seconds[n] = t.block_seconds
    return StepRecord(
        step_index=out.step_index,
        start_s=out.start_s,
        duration_s=out.duration_s,
        batch=out.batch,
        preempted=out.preempted,
        running=running_ids(state),
        queued=queued,
        blocks_in_use=blocks,
        free_blocks=free_blocks(config, state),
        counters=counters,
        deficits=deficits,
        service=service,
        block_seconds=block_seconds,
        events=step_events(out),
        used_blocks=state.kv.used_blocks,
        held=held,
        block_ids=ids,
        reserved=out.reserved,
        reserved_reason=out.reserved_reason,
        replica=replica,
    )


class Transition(NamedTuple):
    """One step of a run: ``prev --inputs--> state``, with the step's output."""

    prev: State
    inputs: StepInput
    state: State
    output: StepOutput


class Replica(Protocol):
    """What the driver loop feeds: the reference model (:class:`ModelReplica`) or a
    scheduler under test behind the harness (:class:`tenantry.verify.harness.Harness`).

    Attributes:
        t_s: when the next step starts (seconds).
        stopped: True once no further step can run (a harness that made a
            finding which makes the rest of the run meaningless).
    """

    t_s: float
    stopped: bool

    def has_work(self) -> bool:
        """True while some request is queued or running."""

    def idle(self, until_s: float) -> None:
        """The empty replica waits until ``until_s`` (seconds)."""

    def step(self, inputs: StepInput) -> Any:
        """Run one step with these arrivals and cancellations."""


class ModelReplica:
    """The reference model as a :class:`Replica`: holds the state between steps.

    Args:
        config: the replica.
        state: the state to start from (default: :func:`~tenantry.model.state.initial_state`).
        variant: a :class:`~tenantry.model.step.Step` subclass to run instead of the model (a mutant).

    Attributes:
        state: the current state; last: the last :class:`Transition` (None before the first step).
    """

    stopped = False

    def __init__(self, config: Config, state: State | None = None, variant: type[Step] | None = None) -> None:
        self.config, self.variant = config, variant
        self.state = initial_state(config) if state is None else state
        self.last: Transition | None = None

    @property
    def t_s(self) -> float:
        return self.state.t_s

    def has_work(self) -> bool:
        return has_work(self.state)

    def idle(self, until_s: float) -> None:
        if until_s > self.state.t_s:
            self.state = idle(self.config, self.state, until_s)

    def step(self, inputs: StepInput) -> Transition:
        new, out = step(self.config, self.state, inputs, self.variant)
        self.last = Transition(self.state, inputs, new, out)
        self.state = new
        return self.last


_NOTHING = StepInput()


class Feed:
    """Delivers a workload's arrivals and cancellations to the steps that are due.

    The one rule every driver shares (SPEC.md 5.1): a request arrives at the
    first step starting at or after its ``arrival_s``; its cancellation (its
    ``cancel_s``) at the first step starting at or after that time, or at the
    step after its arrival's when both fall due at the same step (a step
    applies cancellations before arrivals, so the cancellation would find
    nothing and the cancelled request would run).

    A feed is ``open`` while more requests may come that it does not hold yet (a live
    server's, :class:`tenantry.live.engine.LiveFeed`): :func:`drive` then waits for them
    instead of ending.  A workload's feed is closed.
    """

    open = False

    def __init__(self, workload: Workload | Iterable[Request]) -> None:
        wl = as_workload(workload)
        self.requests = wl.requests
        self.cancels = wl.cancellations
        self.i = self.c = 0
        self.held: tuple[int, ...] = ()  # cancellations held back from the step their request arrived at

    @property
    def exhausted(self) -> bool:
        """Every arrival has been delivered."""
        return self.i == len(self.requests)

    @property
    def next_arrival_s(self) -> float | None:
        """Arrival time of the next undelivered request, or None."""
        return None if self.exhausted else self.requests[self.i].arrival_s

    def due(self, t_s: float) -> StepInput:
        """The arrivals and cancellations due at a step starting at ``t_s``."""
        reqs, cancels = self.requests, self.cancels
        j = self.i
        if not self.held and (j == len(reqs) or reqs[j].arrival_s > t_s) and (
                self.c == len(cancels) or cancels[self.c][0] > t_s):
            return _NOTHING  # most steps: nothing arrives, nothing is cancelled
        while j < len(reqs) and reqs[j].arrival_s <= t_s:
            j += 1
        d = self.c
        while d < len(cancels) and cancels[d][0] <= t_s:
            d += 1
        arrivals = reqs[self.i:j]
        due = self.held + tuple(rid for _, rid in cancels[self.c:d])
        self.held = ()
        if due and arrivals:
            now = {r.request_id for r in arrivals}
            self.held = tuple(rid for rid in due if rid in now)
            if self.held:
                due = tuple(rid for rid in due if rid not in now)
        out = StepInput(arrivals=arrivals, cancellations=due)
        self.i, self.c = j, d
        return out


def drive(replica: Replica, workload: Workload | Iterable[Request] | Feed, *, horizon_s: float | None = None,
          max_steps: int | None = None) -> Iterator[StepInput | None]:
    """The one driver loop: feed ``workload`` to ``replica`` step by step.

    Arrivals and cancellations go to the first step starting at or after
    their time (:class:`Feed`); when nothing is queued or running the replica
    idles until the next arrival.  The run ends when every request has ended
    and none is left to arrive, at ``horizon_s`` (seconds; no step starts at
    or after it), after ``max_steps`` steps, or when the replica stops.
    Yields each step's inputs after the replica ran the step.

    ``workload`` may be a :class:`Feed` itself: an open one (a live server's) makes the
    loop yield None, instead of ending, when the replica is empty and the feed holds no
    arrival yet; the caller resumes it once the feed has one (or has closed).
    """
    feed = workload if isinstance(workload, Feed) else Feed(workload)
    steps = 0
    while not replica.stopped and (max_steps is None or steps < max_steps):
        if not replica.has_work():
            nxt = feed.next_arrival_s
            if nxt is None and feed.open:
                yield None  # a live feed: wait for the next arrival
                continue
            if nxt is None or (horizon_s is not None and nxt >= horizon_s):
                return
            replica.idle(nxt)
        if horizon_s is not None and replica.t_s >= horizon_s:
            return
        inputs = feed.due(replica.t_s)
        replica.step(inputs)
        steps += 1
        yield inputs


def run_steps(
    config: Config,
    workload: Workload | Iterable[Request],
    *,
    horizon_s: float | None = None,
    max_steps: int | None = None,
    state: State | None = None,
    variant: type[Step] | None = None,
) -> Iterator[Transition]:
    """:func:`drive` over the reference model, yielding every step's :class:`Transition`.

    Args:
        state: start from this state instead of the empty replica (proof replays).
        variant: run this :class:`~tenantry.model.step.Step` subclass (a mutant).

    Raises:
        ConfigError: if a request names an unknown tenant (before any step).
    """
    wl = as_workload(workload)
    check_workload(config, wl)
    rep = ModelReplica(config, state, variant)
    for _ in drive(rep, wl, horizon_s=horizon_s, max_steps=max_steps):
        yield rep.last


def simulate(
    config: Config,
    workload: Workload | Iterable[Request],
    *,
    horizon_s: float | None = None,
    max_steps: int | None = None,
    record_steps: bool = True,
    header: dict[str, Any] | None = None,
    variant: type[Step] | None = None,
    detail: bool = False,
    cancellations: Iterable[tuple[float, int]] = (),
    fast: bool | None = None,
) -> History:
    """Run ``workload`` on the replica ``config`` and return its history.

    The run is :func:`run_steps` (arrivals delivered to the first step that
    starts at or after their ``arrival_s``, idling when the replica is empty)
    until every request has ended, or ``horizon_s`` (seconds) / ``max_steps``
    steps; requests still in flight then are recorded as ``unfinished``.  Without
    either bound a configuration that livelocks never returns: e.g. victim
    ``largest`` under a tenant's ``kv_block_cap`` that fits each of three requests
    but not their sum evicts whichever has gone furthest, forever (``tenantry
    simulate`` always passes a horizon).

    Args:
        record_steps: keep a step record per step (costly with many tenants).
        detail: record each running request's blocks in the step records
            (:class:`Recorder`).
        header: extra header fields (e.g. a seed, a workload name).
        variant: run this :class:`~tenantry.model.step.Step` subclass (a mutant).
        fast: run on :class:`~tenantry.runner.fast.FastReplica` (the same request
            records, computed in place): None (the default) when the run keeps no step
            records, runs the model (no variant) and the fast replica implements the
            configuration (:func:`~tenantry.runner.fast.unsupported`); False never; True
            always (ValueError where it cannot).
        cancellations: deprecated: (t_s, request_id) pairs, folded into the
            workload (:meth:`~tenantry.model.workload.Workload.with_cancellations`);
            give requests a ``cancel_s`` instead.

    Raises:
        ConfigError: if a request names an unknown tenant.
    """
    wl = as_workload(workload)
    if cancellations:
        import warnings

        warnings.warn("simulate(cancellations=...) is deprecated: give requests a cancel_s "
                      "(Workload.with_cancellations)", DeprecationWarning, stacklevel=2)
        wl = wl.with_cancellations(cancellations)
    if fast is None:
        fast = not record_steps and variant is None and unsupported(config) is None
    elif fast and (record_steps or variant is not None):
        raise ValueError("simulate(fast=True) keeps no step records and runs no variant")
    rec = Recorder(config, record_steps, detail)
    for r in wl.requests:
        rec.offered(r)
    if fast:
        check_workload(config, wl)
        rep = FastReplica(config)
        for _ in drive(rep, wl, horizon_s=horizon_s, max_steps=max_steps):
            rec.observe(None, rep.last)
        state = rep
    else:
        state = initial_state(config)
        for tr in run_steps(config, wl, horizon_s=horizon_s, max_steps=max_steps, variant=variant):
            rec.observe(tr.state, tr.output)
            state = tr.state
    hdr = {"config": config_to_dict(config), "requests": len(wl), **(header or {})}
    return rec.history(state, hdr)


def tenant_table(history: History, *, window_s: float, w_in: float, w_out: float) -> list[dict[str, Any]]:
    """Per-tenant rows of a run (``tenantry simulate``'s table and the studies'): sent,
    rejected (429), share finished by ``window_s`` (seconds), TTFT p50/p95/p99 in
    seconds (inf when a request never got a token; percentiles by the inverted CDF)
    and weighted tokens per second (``w_in`` per prompt token, ``w_out`` per output
    token) finished within the window."""
    rows = []
    for tenant, recs in history.by_tenant().items():
        admitted = [r for r in recs if r.outcome != "rejected"]
        ttft = [r.ttft_s if r.ttft_s is not None else math.inf for r in admitted]
        done = [r for r in recs if r.outcome == "finished" and r.finish_s is not None and r.finish_s <= window_s]
        pct = (lambda q: float(np.percentile(ttft, q, method="inverted_cdf"))) if ttft else (lambda q: math.nan)
        rows.append({
            "tenant": tenant, "sent": len(recs), "rejected": len(recs) - len(admitted),
            "finished_in_time": len(done) / len(recs) if recs else 0.0,
            "ttft_p50_s": pct(50), "ttft_p95_s": pct(95), "ttft_p99_s": pct(99),
            "weighted_tokens_per_s": sum(w_in * r.prompt_tokens + w_out * r.output_tokens for r in done) / window_s,
        })
    return rows
