"""State forms of the invariants: judge one step of the reference model.

Each state form reads a :class:`StepContext` (the configuration, the state
before and after the step, the step's inputs and output) and returns a list of
:class:`~tenantry.spec.invariants_core.Finding`, empty when the step is legal.
The checks never call the model's step logic: they recompute what the rules in
SPEC.md section 7 require, so a broken model (a mutant) cannot vouch for itself.

**One definition per invariant.**  Where an invariant's record form judges step
by step, its state form is that judgement run on the step (:func:`from_record`):
the step is recorded as the model's recorder records it
(:func:`~tenantry.runner.simulate.snapshot`, with its blocks per request), and
the records' walk (:class:`~tenantry.spec.replay.Replay`) starts from the
requests as the state before the step holds them (:class:`StepHistory`), so the
record form sees the one step it would see in a history, with the state before
it in place of the steps before.  What only the state shows (the model's own
books: the prefix cache's reference counts, a tenant's running count, the
queue-bound counter, the lift, tier counters, ready steps) is judged by a
state-only part beside it (:func:`with_state_part`), and the catalog says why
(:attr:`~tenantry.spec.invariants_core.Invariant.state_only`).  This module holds
the context and the state-only parts of the safety invariants; those of the
others, and the state forms with no record form to derive from, are in
:mod:`tenantry.spec.invariants_policy`.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Mapping
from functools import cached_property
from itertools import chain, compress, repeat
from operator import attrgetter
from typing import Callable, NamedTuple

import attrs

from tenantry.model.config import Config
from tenantry.model.events import ADMISSION_REASONS, TERMINAL
from tenantry.model.state import Sequence, State
from tenantry.model.step import StepOutput
from tenantry.model.workload import StepInput
from tenantry.runner.history import History, StepRecord
from tenantry.runner.simulate import snapshot

from .invariants_core import Finding, hopeless, largest_charge
from .invariants_history import HistoryContext, StepJudge
from .replay import QueueStart, Replay, StepView


@attrs.frozen
class StepContext:
    """One transition of the model: ``prev --inputs--> state``, with ``output``.

    ``recorded``: the step's record when the caller already made it (a recorder's,
    :func:`~tenantry.runner.simulate.snapshot` with ``detail``); else it is made here
    when a state form derived from a record form needs it (:attr:`record`).
    ``recorded_prev``: the record of the step before (the snapshot of ``prev``), when
    the caller has it; else ``prev``'s snapshot stands for it."""

    config: Config
    prev: State
    inputs: StepInput
    state: State
    output: StepOutput
    recorded: StepRecord | None = attrs.field(default=None, eq=False, repr=False)
    recorded_prev: StepRecord | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def k(self) -> int:
        return self.output.step_index

    def name(self, i: int) -> str:
        return self.config.tenants[i].name

    @cached_property
    def record(self) -> StepRecord:
        """The step's record, as a recorder with ``detail`` records it."""
        return self.recorded if self.recorded is not None else snapshot(self.config, self.state, self.output, True)

    @cached_property
    def history(self) -> "StepHistory":
        """The step as the record forms read a history (:class:`StepHistory`)."""
        return StepHistory.of(self)

    @cached_property
    def prev_seqs(self) -> dict[int, Sequence]:
        return {s.request_id: s for s in self.prev.sequences()}

    @cached_property
    def new_running(self) -> dict[int, Sequence]:
        return {s.request_id: s for s in self.state.running}

    @cached_property
    def new_queued(self) -> dict[int, Sequence]:
        return {s.request_id: s for t in self.state.tenants for s in t.queue}

    @cached_property
    def gone(self) -> dict[int, Sequence]:
        return {s.request_id: s for s in self.output.finished}

    @cached_property
    def terminal_kind(self) -> dict[int, str]:
        return {e.request_id: e.kind for e in self.output.events if e.kind in TERMINAL}

    @cached_property
    def batch(self) -> dict[int, int]:
        return dict(self.output.batch)

    @cached_property
    def cancelled_ids(self) -> set[int]:
        return {e.request_id for e in self.output.events if e.kind == "cancelled"}

    @cached_property
    def evictions(self) -> list:
        """Preempted and evicted_too_often events, in the order they happened."""
        return [e for e in self.output.events
                if e.kind == "preempted" or (e.kind == "rejected" and e.reason == "evicted_too_often")]

    @cached_property
    def admitted_from_queue(self) -> list[Sequence]:
        """Sequences that were waiting (or arrived) and entered the batch this step, as they are now."""
        prev_running = {s.request_id for s in self.prev.running}
        out = []
        for rid, _ in self.output.batch:
            if rid in prev_running:
                continue
            s = self.new_running.get(rid) or self.gone.get(rid)
            if s is not None:
                out.append(s)
        return out

    def after(self, rid: int) -> Sequence | None:
        """The sequence rid after the step, wherever it is (None if it left)."""
        return self.new_running.get(rid) or self.new_queued.get(rid) or self.gone.get(rid)


class StepRequest(NamedTuple):
    """What the record forms read of a request's record in one step: its static fields
    (a :class:`~tenantry.runner.history.RequestRecord`'s, under the same names; its outcome
    is not known in one step)."""

    request_id: int
    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    admitted_step: int | None
    prefix_ids: tuple[int, ...]
    outcome: str = "unfinished"


def _record_of(r, admitted_step: int | None) -> StepRequest:
    return StepRequest(r.request_id, r.tenant, r.arrival_s, r.prompt_tokens, r.output_tokens, admitted_step,
                       r.prefix_ids)


class _Records(Mapping):
    """request id -> :class:`StepRequest` of one step's requests: those given, and those of
    the states' sequences, each made on first use (``sequences(running)``: the running,
    else the waiting, sequences by id; the waiting ones are indexed only when one is read)."""

    def __init__(self, given: dict[int, StepRequest], sequences: Callable[[bool], dict[int, Sequence]]) -> None:
        self._given, self._sequences, self._index = given, sequences, [None, None]

    def _find(self, rid) -> Sequence | None:
        for i in (0, 1):
            if self._index[i] is None:
                self._index[i] = self._sequences(i == 0)
            s = self._index[i].get(rid)
            if s is not None:
                return s
        return None

    def get(self, rid, default=None):
        r = self._given.get(rid)
        if r is None:
            s = self._find(rid)
            if s is None:
                return default
            r = self._given[rid] = _record_of(s.request, s.admitted_step)
        return r

    def __getitem__(self, rid: int) -> StepRequest:
        r = self.get(rid)
        if r is None:
            raise KeyError(rid)
        return r

    def __contains__(self, rid: object) -> bool:
        return self.get(rid) is not None

    def _all(self) -> dict:
        self._find(None)
        return {**dict.fromkeys(self._given), **dict.fromkeys(self._index[0]), **dict.fromkeys(self._index[1])}

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class _TenantOf(dict):
    """request id -> its tenant's name: the running requests' and the arrivals' given, any
    other of the step's requests read from its :class:`_Records` when asked."""

    def __init__(self, given: dict[int, str], records: _Records) -> None:
        super().__init__(given)
        self._records = records

    def __missing__(self, rid: int) -> str:
        t = self[rid] = self._records[rid].tenant
        return t

    def get(self, rid, default=None):
        t = dict.get(self, rid)
        if t is None:
            r = self._records.get(rid)
            return default if r is None else r.tenant
        return t

    def __contains__(self, rid: object) -> bool:
        return dict.__contains__(self, rid) or rid in self._records


_REQUEST, _RID, _SEQ, _SCHEDULED_S = (attrgetter("request"), attrgetter("request_id"), attrgetter("arrival_seq"),
                                      attrgetter("first_scheduled_s"))
_TENANT = attrgetter("tenant")
_PRIVATE, _SHARED, _COMPUTED = attrgetter("private_blocks"), attrgetter("shared_keys"), attrgetter("computed_tokens")


@attrs.frozen
class StepHistory(HistoryContext):
    """One step of the model as a history of that one step (:class:`HistoryContext`):
    its record; request records for the requests the state before it holds, the step's
    arrivals and whatever the state after it holds (a waiting one's made when read); the
    walk of the records starts from the requests as the state before the step holds them
    (:meth:`~tenantry.spec.replay.Replay.place_running`,
    :meth:`~tenantry.spec.replay.Replay.start_queue`: a waiting request becomes a record of
    the walk only if the step touches it, so a step costs what it changes, not what
    waits), and :attr:`start` is that state's view.  D (:attr:`charge_bound`) is the
    configuration's: one step does not see the workload."""

    step: StepContext | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def of(cls, ctx: StepContext) -> "StepHistory":
        """The step of ``ctx`` (its arrivals are the history's request records: the walk offers them)."""
        recs = []
        if ctx.inputs.arrivals:
            queued = {e.request_id for e in ctx.output.events if e.kind == "queued"}
            recs = [_record_of(r, ctx.k if r.request_id in queued else None) for r in ctx.inputs.arrivals]
        return cls(History({}, (ctx.record,), tuple(recs)), ctx.config, ctx)

    def _sequences(self, running: bool) -> dict[int, Sequence]:
        """The running (else the waiting) sequences of the states before and after the step, by id."""
        out: dict[int, Sequence] = {}
        for st in (self.step.state, self.step.prev):
            for q in ((st.running,) if running else (t.queue for t in st.tenants)):
                if q:
                    out.update(zip(map(_RID, map(_REQUEST, q)), q))
        return out

    @cached_property
    def requests(self) -> Mapping[int, StepRequest]:
        return _Records({r.request_id: r for r in self.history.requests}, self._sequences)

    @cached_property
    def tenant_of(self) -> Mapping[int, str]:
        ctx = self.step
        reqs = [*map(_REQUEST, ctx.prev.running), *map(_REQUEST, ctx.state.running), *ctx.inputs.arrivals]
        return _TenantOf(dict(zip(map(_RID, reqs), map(_TENANT, reqs))), self.requests)

    @cached_property
    def shareable(self) -> bool:
        """A prefix cache is on and some request of the step has prefix content ids."""
        if self.config.prefix_cache == "off":
            return False
        ctx = self.step
        seqs = chain(ctx.prev.running, ctx.state.running, *(t.queue for t in ctx.prev.tenants),
                     *(t.queue for t in ctx.state.tenants))
        return any(r.prefix_ids for r in ctx.inputs.arrivals) or any(s.request.prefix_ids for s in seqs)

    @staticmethod
    def _fields(s: Sequence) -> tuple:
        fresh = s.first_scheduled_s is None
        return s.request, s.output_done, s.preemptions, s.ready_step, fresh, s.admitted_step, not fresh

    @cached_property
    def _walk(self) -> tuple:
        ctx, cfg = self.step, self.config
        r = Replay(self.history, cfg, recorded=True)
        for s in ctx.prev.running:
            r.place_running(s.request, computed=s.computed_tokens, generated=s.output_done,
                            preemptions=s.preemptions, ready_step=s.ready_step, admitted_step=s.admitted_step,
                            seq=s.arrival_seq)
        for tc, t in zip(cfg.tenants, ctx.prev.tenants):
            q = t.queue
            if q:
                rids = tuple(map(_RID, map(_REQUEST, q)))
                fresh = tuple(compress(rids, map(operator.is_, map(_SCHEDULED_S, q), repeat(None))))
                r.start_queue(tc.name, QueueStart(rids, tuple(map(_SEQ, q)), fresh, q, self._fields))
        prev = ctx.prev
        before = ctx.recorded_prev
        if before is None:
            before = snapshot(cfg, prev, StepOutput(ctx.k - 1, prev.t_s, 0.0, (), (), ()))
        start = r.start_view(before)
        return r, list(r.views()), start

    @property
    def start(self) -> StepView:
        """The state before the step, as a view (its record: the state's snapshot)."""
        return self._walk[2]

    @cached_property
    def charge_bound(self) -> float:
        """D from the configuration (:func:`~tenantry.spec.invariants_core.largest_charge`)."""
        return largest_charge(self.config)


def from_record(invariant: str, judge: StepJudge, anomalies: bool = False) -> Callable[[StepContext], list[Finding]]:
    """The state form of ``invariant`` derived from its record form: ``judge`` (the record
    form's judgement of one step) on the step (:attr:`StepContext.history`), with the
    state before it as the view before; ``anomalies``: also what the records' walk of
    the step finds that breaks it (as the record form reports them)."""

    def state_form(ctx: StepContext) -> list[Finding]:
        h = ctx.history
        out = h.anomalies(invariant) if anomalies else []
        return out + judge(h, h.views[0], h.start, {})

    state_form.__name__ = f"state_form_of_{judge.__name__}"
    state_form.__doc__ = (f"{invariant}, state form: the record form's judgement of one step "
                          f"({judge.__module__}.{judge.__name__}) on this step of the model.")
    return state_form


def with_state_part(invariant: str, derived: Callable, part: Callable) -> Callable[[StepContext], list[Finding]]:
    """``derived`` (:func:`from_record`), then ``part``: what the state form judges that
    the records do not carry."""

    def state_form(ctx: StepContext) -> list[Finding]:
        return derived(ctx) + part(ctx)

    state_form.__name__ = f"{derived.__name__}_and_{part.__name__}"
    state_form.__doc__ = f"{invariant}, state form: {derived.__doc__.split(': ', 1)[1]} Then {part.__name__}."
    return state_form


def _f(ctx: StepContext, inv: str, msg: str, observed, allowed, tenants=(), requests=()) -> Finding:
    return Finding(inv, ctx.k, tuple(tenants), tuple(requests), observed, allowed, msg)


# --- state-only parts of the safety invariants ----------------------------------------------


def kv_books(ctx: StepContext) -> list[Finding]:
    """KV-CONSERVE's state-only part (SPEC.md 7.1): the pool's own books balance after
    the step: blocks in use = private blocks + distinct cache keys referenced; the
    reference counts are the sequences referencing each key; no key both referenced
    and retained, retained at most free; a running sequence holds no more than its
    computed tokens need (the record form checks at least); a tenant's blocks and
    running count are its sequences'; a waiting sequence holds nothing."""
    cfg, st, out = ctx.config, ctx.state, []
    kv = st.kv
    holders: Counter = Counter()
    private = 0
    for s in st.running:
        holders.update(s.shared_keys)
        private += s.private_blocks
        want = cfg.blocks_for(s.computed_tokens)
        if s.blocks_held > want:
            out.append(_f(ctx, "KV-CONSERVE", f"running request {s.request_id} holds {s.blocks_held} blocks "
                          f"for {s.computed_tokens} computed tokens", s.blocks_held, want,
                          [ctx.name(s.tenant)], [s.request_id]))
    expected_used = private + len(holders)
    if kv.used_blocks != expected_used:
        out.append(_f(ctx, "KV-CONSERVE", "blocks in use differ from the blocks running sequences hold "
                      f"({private} private + {len(holders)} shared)", kv.used_blocks, expected_used))
    if dict(holders) != dict(kv.refs):
        bad = sorted(set(holders.items()) ^ set(kv.refs.items()))[:3]
        out.append(_f(ctx, "KV-CONSERVE", f"prefix-cache reference counts differ from the sequences holding them {bad}",
                      len(kv.refs), len(holders)))
    both = set(kv.retained) & set(kv.refs)
    if both:
        out.append(_f(ctx, "KV-CONSERVE", "a block is both referenced and on the free (retained) list", len(both), 0))
    if len(kv.retained) > cfg.num_blocks - kv.used_blocks:
        out.append(_f(ctx, "KV-CONSERVE", "more retained cache blocks than free blocks",
                      len(kv.retained), cfg.num_blocks - kv.used_blocks))
    for i, t in enumerate(st.tenants):
        mine = [s for s in st.running if s.tenant == i]
        held = sum(s.blocks_held for s in mine)
        if t.blocks != held or t.running != len(mine):
            out.append(_f(ctx, "KV-CONSERVE", f"tenant's books say {t.running} running holding {t.blocks} blocks, "
                          f"its sequences are {len(mine)} holding {held}", t.blocks, held, [ctx.name(i)]))
        q = t.queue
        if q and (any(map(_PRIVATE, q)) or any(map(_SHARED, q)) or any(map(_COMPUTED, q))):
            for s in q:
                if s.blocks_held or s.computed_tokens:
                    out.append(_f(ctx, "KV-CONSERVE", "a waiting request holds KV", s.blocks_held, 0,
                                  [ctx.name(i)], [s.request_id]))
    return out


def queue_count(ctx: StepContext) -> list[Finding]:
    """QUEUE-BOUND's state-only part (SPEC.md 7.1): each tenant's queue-bound counter
    (``fresh_queued``) is the number of its never-scheduled queued requests."""
    if not ctx.config.admission.queue_bound:
        return []
    out = []
    for i, t in enumerate(ctx.state.tenants):
        n = sum(1 for s in t.queue if s.never_scheduled)
        if t.fresh_queued != n:
            out.append(_f(ctx, "QUEUE-BOUND", "the queue-bound count differs from the never-scheduled queued requests",
                          t.fresh_queued, n, [ctx.name(i)]))
    return out


def arrivals_and_handover(ctx: StepContext) -> list[Finding]:
    """NO-LOSS's state-only part (SPEC.md 7.1): each of the step's arrivals is answered
    in the step, exactly once (queued or refused with an admission reason); one whose KV
    can never fit the pool (:func:`~tenantry.spec.invariants_core.hopeless`) is not
    queued; every request that left the state is handed over in ``StepOutput.finished``."""
    out = []
    answers: dict[int, list[str]] = {}
    for e in ctx.output.events:
        if e.kind == "queued" or (e.kind == "rejected" and e.reason in ADMISSION_REASONS):
            answers.setdefault(e.request_id, []).append(e.kind)
    known: set[int] = set()
    for r in ctx.inputs.arrivals:
        ev = answers.get(r.request_id, [])
        if len(ev) != 1:
            out.append(_f(ctx, "NO-LOSS", "an arrival was not answered exactly once (queued or refused)",
                          len(ev), 1, requests=[r.request_id]))
        if "queued" in ev:
            known.add(r.request_id)
            if hopeless(ctx.config, r.prompt_tokens, r.output_tokens):
                out.append(_f(ctx, "NO-LOSS", "a request whose KV can never fit the pool was queued (it can never "
                              "finish; it is refused too_large)", r.total_tokens - 1,
                              ctx.config.num_blocks * ctx.config.block_size_tokens, requests=[r.request_id]))
    prev, st = ctx.prev, ctx.state
    before = len(prev.running) + sum(len(t.queue) for t in prev.tenants) + len(known)
    after = len(st.running) + sum(len(t.queue) for t in st.tenants)
    if before - after == len(ctx.output.finished):  # as many left as were handed over: the usual step
        return out
    known.update(map(_RID, map(_REQUEST, chain(prev.running, *(t.queue for t in prev.tenants)))))
    here = set(map(_RID, map(_REQUEST, chain(st.running, *(t.queue for t in st.tenants)))))
    for rid in sorted(rid for rid in known - here if rid not in ctx.gone):
        out.append(_f(ctx, "NO-LOSS", "a request left the state without being handed over in the step's output "
                      "(StepOutput.finished)", "not handed over", "handed over", requests=[rid]))
    return out
