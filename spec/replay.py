"""What a history's step records imply: each request's place and progress after every step.

The record forms of the invariants (:mod:`tenantry.spec.invariants_history`)
judge a run from its records alone, whether they come from the model, from
the harness driving a scheduler under test, or from a file.  They share this
one reading of the records: :class:`Replay` walks the steps in order and,
from each step's events (SPEC.md 6: cancelled, queued / rejected, preempted,
rejected later, scheduled, first_token / finished) and batch, keeps every
request's status, computed tokens, generated tokens, evictions and cooldown,
and each tenant's queue in order.  It never judges: what does not fit the
records (an event about a request that was never offered, a batch entry for
a request that is not running) is kept in :attr:`Replay.anomalies` for the
invariant it breaks to report.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from operator import attrgetter
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import attrs

from tenantry.model.config import Config
from tenantry.runner.history import History, RequestRecord, StepRecord

from .replay_events import derive_events


@attrs.define
class Req:
    """One request as the records show it so far.

    Attributes:
        rec: its request record (static fields: tenant, arrival, sizes, prefix ids).
        status: ``offered`` (not answered yet), ``waiting``, ``running``, or
            ``ended:<outcome>`` (finished, rejected, cancelled).
        computed: tokens whose KV exists (0 while waiting).
        generated: output tokens produced.
        preemptions: evictions so far; ready_step: first step it may run (its
            admission step, then its cooldown after an eviction); fresh: queued and
            never scheduled.
        admitted_step: step of its ``queued`` event; first_step: step it was first scheduled.
        entered: step of its last entry into the batch; cached: tokens computed at that entry.
        ended_step: the step its events ended it in.
        queue_key: its place in its tenant's queue (evicted ones go to the front, latest first).
        live_seq: its rank in admission order (the order views list requests and tenants in).
        target: tokens that must be computed before the next output token (prompt plus
            generated tokens; kept as ``generated`` grows).
    """

    rec: RequestRecord
    status: str = "offered"
    computed: int = 0
    generated: int = 0
    preemptions: int = 0
    ready_step: int = 0
    fresh: bool = False
    admitted_step: int | None = None
    first_step: int | None = None
    entered: int | None = None
    cached: int = 0
    queue_key: tuple = ()
    ended_step: int | None = None
    live_seq: int = 0
    target: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.target = self.rec.prompt_tokens + self.generated

    @property
    def live(self) -> bool:
        return self.status in ("waiting", "running")


@attrs.frozen
class Anomaly:
    """Something in the records that no correct run produces (data for a finding).

    Attributes:
        invariant: the invariant it breaks; step: where; request: whose (or None).
        message: one line; observed, allowed: the numbers.
    """

    invariant: str
    step: int | None
    request: int | None
    message: str
    observed: object = None
    allowed: object = None


class StepView(NamedTuple):
    """The records' state right after one step, for the record forms (a named tuple:
    the walk makes one per step; its maps are read, never changed: consecutive views
    share ``waiting`` and ``fresh`` while no queue changes).

    Attributes:
        record: the step record.
        before: request id -> (computed tokens, target tokens), of the requests running before the step.
        running: request id -> computed tokens, of the requests running after it.
        finished: ids that finished in the step (with their last computed tokens).
        waiting: per tenant, its waiting request ids in queue order.
        fresh: per tenant, its waiting never-scheduled request ids.
        heads: per tenant, (request id, target tokens) of its first waiting
            request ready to run at this step (cooldown over), if any.
        produced: per tenant, output tokens produced in the step.
        first: requests scheduled for the first time in the step, in entry order.
        answers: the step's arrivals with their answer (``queued`` or the
            refusal's reason), in arrival order.
        cancelled: requests cancelled at the step's start, with the computed
            tokens each held (None for a waiting one).
        entries: the step's entries into the batch (``scheduled`` events), each with
            the first step its request could run at (its cooldown after an eviction).
        evictions: the step's evictions, in event order: (request id, event kind,
            computed tokens it held, its preemptions after the event); the kind is
            ``preempted`` (it counts one more) or ``rejected`` (a running request refused
            ``evicted_too_often``).
    """

    record: StepRecord
    before: dict[int, tuple[int, int]]
    running: dict[int, int]
    finished: dict[int, int]
    waiting: dict[str, tuple[int, ...]]
    fresh: dict[str, tuple[int, ...]]
    heads: dict[str, tuple[int, int]]
    produced: dict[str, int]
    first: tuple[int, ...] = ()
    answers: tuple[tuple[int, str], ...] = ()
    cancelled: tuple[tuple[int, int | None], ...] = ()
    entries: tuple[tuple[int, int], ...] = ()
    evictions: tuple[tuple[int, str, int, int], ...] = ()


class QueueStart(NamedTuple):
    """A tenant's waiting requests where a walk starts (:meth:`Replay.start_queue`), in queue
    order.  They become :class:`Req` records only when the walk touches one (an event or a
    batch entry names it, or a view needs its tenant's first ready request), so a queue of
    thousands costs a step what the step changes.

    Attributes:
        rids: their request ids; seqs: each one's rank in admission order;
        fresh: the ids of the never-scheduled ones, in order;
        entries: one per id, what ``fields`` reads;
        fields: ``fields(entry) -> (record, generated, preemptions, ready_step, fresh,
            admitted_step, scheduled)`` (``scheduled``: scheduled before; ``record`` as
            :meth:`Replay.place_running` takes it).
    """

    rids: tuple[int, ...]
    seqs: tuple[int, ...]
    fresh: tuple[int, ...]
    entries: Sequence[Any]
    fields: Callable[[Any], tuple]


class _Started:
    """A started queue as the walk goes: the ids that left it, and where each id sits."""

    __slots__ = ("q", "gone", "_pos")

    def __init__(self, q: QueueStart) -> None:
        self.q, self.gone, self._pos = q, set(), None

    def pos(self, rid: int) -> int | None:
        if self._pos is None:
            self._pos = dict(zip(self.q.rids, range(len(self.q.rids))))
        return self._pos.get(rid)

    def left(self) -> tuple[tuple[int, ...], tuple[int, ...], int | None]:
        """(ids still waiting, the never-scheduled ones among them, their least admission rank)."""
        q, gone = self.q, self.gone
        n = len(gone)
        if not n:
            return q.rids, q.fresh, min(q.seqs)
        if gone.issuperset(q.rids[:n]):  # the usual case: the first ones left (scheduled)
            f = sum(1 for r in q.fresh[:n] if r in gone)
            return q.rids[n:], q.fresh[f:], min(q.seqs[n:], default=None)
        return (tuple(r for r in q.rids if r not in gone), tuple(r for r in q.fresh if r not in gone),
                min((n for r, n in zip(q.rids, q.seqs) if r not in gone), default=None))


class Replay:
    """Walk a history's steps; see the module docstring.

    Args:
        history: the records; config: the configuration they are judged against
            (cooldown and block size come from it).
        recorded: the steps carry their events (None: when some step has events;
            a step without any then had none).

    Attributes:
        reqs: request id -> :class:`Req` (the state after the last step walked).
        anomalies: what did not fit, in order.

    A walk starts from nothing (every request ``offered``), or from requests put in place
    before the first step (:meth:`place_running`, :meth:`start_queue`): one step of the
    reference model is judged so, its requests as its state before the step holds them
    (:class:`~tenantry.spec.invariants_state.StepHistory`).
    """

    def __init__(self, history: History, config: Config, recorded: bool | None = None) -> None:
        self.history, self.config = history, config
        self.reqs: dict[int, Req] = {r.request_id: Req(r) for r in history.requests}
        self.anomalies: list[Anomaly] = []
        self._order = 0
        #: the steps carry events (format 2); else they are derived from the request records
        self.recorded = any(s.events for s in history.steps) if recorded is None else recorded
        #: computed tokens are known exactly (False when derived events miss cache hits)
        self.exact = self.recorded or history.header.get("config", {}).get("prefix_cache", "off") == "off" or not any(
            r.cached_prompt_tokens for r in history.requests)
        self._derived = None if self.recorded else derive_events(history)
        # Kept as statuses change, so that a step costs what it changed plus what it lists:
        self._running: dict[int, Req] = {}  # running requests
        self._queues: dict[str, list[tuple[tuple, int, Req]]] = {}  # per tenant, waiting ones by queue_key
        self._listed: dict[str, tuple] = {}  # per tenant: (min live_seq, ids, fresh ids), dropped on change
        self._run_order: list[Req] | None = None  # the running ones by live_seq, dropped on change
        self._lists: tuple | None = None  # (tenants in order, waiting ids, fresh ids), dropped on any queue change
        self._starts: dict[str, _Started] = {}  # per tenant, the queue it started with (start_queue)

    def place_running(self, rec: Any, *, computed: int, generated: int, preemptions: int = 0, ready_step: int = 0,
                      admitted_step: int | None = None, seq: int = 0) -> None:
        """Put a request in the batch where the walk starts: ``rec`` its record (or what has a
        record's request fields: ``request_id``, ``tenant``, ``prompt_tokens``, ``output_tokens``),
        with ``computed`` tokens, ``generated`` output tokens, ``preemptions`` evictions, its
        ``ready_step``, ``admitted_step`` and ``seq``, its rank in admission order.  Before
        :meth:`views`."""
        q = self.reqs[rec.request_id] = Req(rec, "running", computed, generated, preemptions, ready_step, False,
                                            admitted_step, -1, live_seq=seq)
        self._order = max(self._order, seq)
        self._run(q)

    def start_queue(self, tenant: str, start: QueueStart) -> None:
        """Tenant ``tenant``'s queue where the walk starts (:class:`QueueStart`).  Before :meth:`views`."""
        if start.rids:
            self._starts[tenant] = _Started(start)
            self._order = max(self._order, max(start.seqs))
            self._listed.pop(tenant, None)
            self._lists = None

    def _late(self, rid: int) -> Req | None:
        """Request ``rid`` of a started queue, made a :class:`Req` when the walk first touches it."""
        for t, st in self._starts.items():
            i = st.pos(rid)
            if i is not None and rid not in st.gone:
                return self._started(st, i)
        return None

    def _started(self, st: _Started, i: int) -> Req:
        rid = st.q.rids[i]
        q = self.reqs.get(rid)
        if q is None:
            rec, generated, preemptions, ready_step, fresh, admitted_step, scheduled = st.q.fields(st.q.entries[i])
            q = self.reqs[rid] = Req(rec, "waiting", 0, generated, preemptions, ready_step, fresh, admitted_step,
                                     -1 if scheduled else None, queue_key=(0, i), live_seq=st.q.seqs[i])
        return q

    def start_view(self, record: StepRecord) -> StepView:
        """The records' state where the walk starts (before :meth:`views`), with ``record``
        standing for the step before: its running requests and queues; nothing happened in it."""
        _, waiting, fresh = self._queue_lists()
        return StepView(record, {}, {q.rec.request_id: q.computed for q in self._running_in_order()}, {},
                        waiting, fresh, {}, {})

    def _unknown(self, rid: int, k: int, what: str) -> None:
        self.anomalies.append(Anomaly("NO-LOSS", k, rid, f"step {k} {what} request {rid}, which was never offered"))

    def _req(self, rid: int, k: int, what: str) -> Req | None:
        q = self.reqs.get(rid)
        if q is None:
            self._unknown(rid, k, what)
        return q

    def _ended(self, q: Req, k: int, what: str, inv: str = "NO-LOSS") -> bool:
        if q.status.startswith("ended:"):
            self.anomalies.append(Anomaly(inv, k, q.rec.request_id, f"step {k} {what} request {q.rec.request_id}, "
                                          f"which already ended ({q.status[6:]})", q.status[6:], "a live request"))
            return True
        return False

    def _wait(self, q: Req, tenant_key: str) -> None:
        """q joins its tenant's queue at its ``queue_key``."""
        insort(self._queues.setdefault(tenant_key, []), (q.queue_key, q.rec.request_id, q))
        self._listed.pop(tenant_key, None)
        self._lists = None

    def _run(self, q: Req) -> None:
        """q joins the batch."""
        self._running[q.rec.request_id] = q
        self._run_order = None

    def _leave(self, q: Req) -> None:
        """q leaves the queue or the batch it is in (by its status before the change)."""
        if q.status == "running":
            self._running.pop(q.rec.request_id, None)
            self._run_order = None
        elif q.status == "waiting":
            t = q.rec.tenant
            st = self._starts.get(t)
            if st is not None and q.queue_key[0] == 0 and q.queue_key[1] >= 0:  # from the queue it started with
                st.gone.add(q.rec.request_id)
            else:
                qs = self._queues[t]
                qs.pop(bisect_left(qs, (q.queue_key, q.rec.request_id)))
                if not qs:
                    del self._queues[t]
            self._listed.pop(t, None)
            self._lists = None

    def _listing(self, t: str) -> tuple:
        got = self._listed.get(t)
        if got is None:
            qs = self._queues.get(t, ())
            st = self._starts.get(t)
            if st is None:
                got = (min(x.live_seq for _, _, x in qs), tuple(rid for _, rid, _ in qs),
                       tuple(rid for _, rid, x in qs if x.fresh))
            else:  # evicted ones ahead of the started queue, arrivals behind it
                j = bisect_left(qs, ((0, 0),))
                ids, fresh, least = st.left()
                seqs = [x.live_seq for _, _, x in qs] + ([] if least is None else [least])
                got = (min(seqs) if seqs else None, tuple(rid for _, rid, _ in qs[:j]) + ids + tuple(
                    rid for _, rid, _ in qs[j:]), tuple(rid for _, rid, x in qs[:j] if x.fresh) + fresh + tuple(
                    rid for _, rid, x in qs[j:] if x.fresh))
            self._listed[t] = got
        return got

    def _first_ready(self, t: str, k: int) -> tuple[int, int] | None:
        """(request id, target tokens) of tenant ``t``'s first waiting request ready at step ``k``
        (its cooldown over), if any; a started one is read, not made a :class:`Req`."""
        qs = self._queues.get(t, ())
        st = self._starts.get(t)
        if st is not None:
            j = bisect_left(qs, ((0, 0),))
            for _, rid, x in qs[:j]:
                if x.ready_step <= k:
                    return rid, x.target
            for i, rid in enumerate(st.q.rids):
                if rid not in st.gone:
                    x = self.reqs.get(rid)
                    if x is not None:
                        if x.ready_step <= k:
                            return rid, x.target
                        continue
                    rec, generated, _, ready_step = st.q.fields(st.q.entries[i])[:4]
                    if ready_step <= k:
                        return rid, rec.prompt_tokens + generated
            qs = qs[j:]
        return next(((rid, x.target) for _, rid, x in qs if x.ready_step <= k), None)

    def _running_in_order(self) -> list[Req]:
        """The running requests in admission order (kept until the batch changes)."""
        if self._run_order is None:
            self._run_order = sorted(self._running.values(), key=attrgetter("live_seq"))
        return self._run_order

    def _queue_lists(self) -> tuple[list[str], dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """The tenants with waiting requests (by their earliest-admitted waiting request), and per
        tenant its waiting ids and its never-scheduled waiting ids (kept until a queue changes)."""
        if self._lists is None:
            tenants = self._queues if not self._starts else [
                t for t in dict.fromkeys([*self._queues, *self._starts]) if self._listing(t)[1]]
            tenants = sorted(tenants, key=lambda t: self._listing(t)[0])
            self._lists = (tenants, {t: self._listed[t][1] for t in tenants}, {t: self._listed[t][2] for t in tenants})
        return self._lists

    def views(self) -> Iterator[StepView]:
        """The state after each step, in step order (walks the steps as it goes).  Requests and
        tenants are listed in admission order (a tenant by its earliest-admitted waiting request)."""
        cfg, B = self.config, self.config.block_size_tokens
        reqs, cooldown = self.reqs, cfg.eviction.cooldown_steps
        for s in self.history.steps:
            k = s.step_index
            before = {q.rec.request_id: (q.computed, q.target) for q in self._running_in_order()}
            finished: dict[int, int] = {}
            produced: dict[str, int] = {}
            first: list[int] = []
            answers: list[tuple[int, str]] = []
            cancelled: list[tuple[int, int | None]] = []
            entries: list[tuple[int, int]] = []
            evictions: list[tuple[int, str, int, int]] = []
            for e in (s.events if self._derived is None else self._derived.get(k, ())):
                q = reqs.get(e.request_id)
                if q is None and self._starts:
                    q = self._late(e.request_id)
                if q is None:
                    self._unknown(e.request_id, k, f"has a {e.kind} event for")
                    continue
                kind = e.kind
                if kind == "first_token" or kind == "finished":
                    continue  # tokens: the batch entries below make them
                if kind == "cancelled":
                    if not self._ended(q, k, "cancels"):
                        cancelled.append((q.rec.request_id, q.computed if q.status == "running" else None))
                        self._leave(q)
                        q.status, q.fresh, q.ended_step = "ended:cancelled", False, k
                elif kind == "queued":
                    if q.status != "offered":
                        self.anomalies.append(Anomaly("NO-LOSS", k, q.rec.request_id, f"request "
                                                      f"{q.rec.request_id} is admitted twice (it was {q.status})"))
                        continue
                    self._order += 1
                    q.status, q.fresh, q.admitted_step, q.queue_key = "waiting", True, k, (1, self._order)
                    q.ready_step = k  # ready from its admission
                    q.live_seq = self._order
                    self._wait(q, q.rec.tenant)
                    answers.append((q.rec.request_id, "queued"))
                elif kind == "rejected":
                    at_admission = q.status == "offered"
                    if not at_admission and self._ended(q, k, "rejects"):
                        continue
                    if at_admission:
                        answers.append((q.rec.request_id, str(e.reason)))
                    elif q.status == "running":
                        evictions.append((q.rec.request_id, "rejected", q.computed, q.preemptions))
                    self._leave(q)
                    q.status, q.fresh, q.computed, q.ended_step = "ended:rejected", False, 0, k
                elif kind == "preempted":
                    if q.status != "running":
                        self.anomalies.append(Anomaly("BATCH-LIMITS", k, q.rec.request_id, f"step {k} preempts request "
                                                      f"{q.rec.request_id}, which is {q.status}, not running",
                                                      q.status, "running"))
                        continue
                    self._leave(q)
                    self._order += 1
                    evictions.append((q.rec.request_id, "preempted", q.computed, q.preemptions + 1))
                    q.status, q.computed, q.preemptions = "waiting", 0, q.preemptions + 1
                    q.ready_step, q.queue_key = k + 1 + cooldown, (0, -self._order)
                    self._wait(q, q.rec.tenant)
                elif kind == "scheduled":
                    if self._ended(q, k, "schedules"):
                        continue
                    if q.status != "waiting":
                        self.anomalies.append(Anomaly("NO-LOSS", k, q.rec.request_id, f"step {k} schedules request "
                                                      f"{q.rec.request_id}, which is {q.status}, not waiting",
                                                      q.status, "waiting"))
                        continue
                    c0 = e.tokens
                    if c0 and (cfg.prefix_cache == "off" or c0 % B or c0 >= q.target or c0 < 0):
                        self.anomalies.append(Anomaly("KV-CONSERVE", k, q.rec.request_id, f"request {q.rec.request_id} "
                                                      f"enters the batch with {c0} tokens computed: only whole-block "
                                                      f"prefix-cache hits below its {q.target} tokens can be, with the "
                                                      f"cache on ({cfg.prefix_cache})", c0, 0))
                        c0 = 0
                    if q.first_step is None:
                        q.first_step = k
                        first.append(q.rec.request_id)
                    entries.append((q.rec.request_id, q.ready_step))
                    self._leave(q)
                    q.status, q.computed, q.fresh, q.entered, q.cached = "running", c0, False, k, c0
                    self._run(q)
            preempted = s.preempted
            seen: set[int] = set()
            for rid, n in s.batch:
                q = reqs.get(rid)
                if q is None and self._starts:
                    q = self._late(rid)
                if q is None:
                    self._unknown(rid, k, "has a batch entry for")
                    continue
                if rid in seen or rid in preempted:
                    seen.add(rid)
                    continue  # BATCH-LIMITS judges repeats and preempted entries from the record itself
                seen.add(rid)
                if q.status != "running":
                    if not self._ended(q, k, "schedules"):
                        self.anomalies.append(Anomaly("NO-LOSS", k, rid, f"step {k} computes request {rid}, which is "
                                                      f"{q.status}, not in the batch", q.status, "running"))
                    continue
                target = q.target
                if n < 1 or q.computed + n > target:
                    self.anomalies.append(Anomaly("BATCH-LIMITS", k, rid, f"a batch entry of request {rid} computes "
                                                  f"{n} tokens with {q.computed} of {target} computed",
                                                  n, max(0, target - q.computed)))
                    continue
                q.computed += n
                if q.computed == target:
                    q.generated += 1
                    q.target = target + 1
                    t = q.rec.tenant
                    produced[t] = produced.get(t, 0) + 1
                    if q.generated == q.rec.output_tokens:
                        self._leave(q)
                        q.status, q.ended_step = "ended:finished", k
                        finished[rid] = q.computed
            running = {q.rec.request_id: q.computed for q in self._running_in_order()}
            tenants, waiting, fresh = self._queue_lists()
            heads = {}
            queues = self._queues
            for t in tenants:
                if self._starts:
                    got = self._first_ready(t, k)
                    if got is not None:
                        heads[t] = got
                    continue
                qs = queues[t]
                head = qs[0][2]  # the first waiting request, unless its cooldown runs past this step
                ready = head if head.ready_step <= k else next((x for _, _, x in qs if x.ready_step <= k), None)
                if ready is not None:
                    heads[t] = (ready.rec.request_id, ready.target)
            yield StepView(s, before, running, finished, waiting, fresh, heads, produced,
                           tuple(first), tuple(answers), tuple(cancelled), tuple(entries), tuple(evictions))
