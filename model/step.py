"""The step function: one scheduling step of the replica (SPEC.md section 5).

``step(config, state, inputs) -> (state', output)`` is pure: it reads the old
state, never mutates it, and returns a new state plus what happened in the
step.  A step is, in order (each phase one method of :class:`Step`; phase 2 is
inherited from :class:`~tenantry.model.admission.AdmissionPhase` in ``model/admission.py``,
phase 3 from :class:`~tenantry.model.running.RunningPhase` in ``model/running.py``,
phase 4 from :class:`~tenantry.model.waiting.WaitingPhase` in ``model/waiting.py``):

1. cancellations  - the client cancels requests (queued or running);
2. arrivals       - each arriving request is admitted to its tenant's queue
                    or refused with a 429 reason;
3. running        - every running sequence gets its next chunk (prefill) or
                    token (decode) within the token budget, allocating KV
                    blocks and preempting victims when the pool or the
                    tenant's cap is full;
4. waiting        - the order policy picks tenants whose queue heads join the
                    batch while sequences, budget and blocks allow;
5. execution      - the cost model gives the step's duration; computed
                    tokens advance, tokens are produced, finished sequences
                    free their blocks, and the accounting is charged.

``idle(config, state, until_s)`` is the other action: the empty replica waits.

Variants of the model (the mutants of :mod:`tenantry.testing.mutants`) are
subclasses of :class:`Step` that override a phase, a helper, or the policy
tables :attr:`Step.ORDER` / :attr:`Step.VICTIM`; ``step(..., variant=cls)``
runs one.  Nothing global is patched, so a variant is a value: picklable by
reference, usable in a process pool, and the model's source never branches
on it.
"""

from __future__ import annotations

import attrs

from .admission import AdmissionPhase
from .config import Config
from .events import EVENT_KINDS as HISTORY_EVENT_KINDS, Event
from .guards import inherited_skips
from .policies import ORDER, VICTIM, step_duration_s
from .running import RunningPhase
from .state import KVPool, Sequence, State, TenantState
from .waiting import WaitingPhase
from .workload import StepInput


#: Event kinds (SPEC.md 5.2): one flat table, the history's
#: (:data:`tenantry.model.events.EVENT_KINDS`).  Every request ends in exactly
#: one of finished / rejected / cancelled (or is still in flight).
EVENT_KINDS = HISTORY_EVENT_KINDS


@attrs.frozen(slots=True)
class StepOutput:
    """What one step did.

    Attributes:
        step_index: the step's index; start_s, duration_s: seconds.
        batch: (request_id, num_tokens) in batch order.
        preempted: request ids evicted in the step (never in ``batch``).
        events: events in the order they happened.
        finished: sequences that left the state in this step (finished,
            cancelled, or rejected after admission), as they were last.
        reserved: the request the starvation guard stopped the waiting phase
            for (an overdue head that did not fit), or None.
        reserved_reason: None for the overdue-head guard; ``skips`` when the
            skip budget stopped it (the head of a tenant passed over
            ``guard_skips`` times, SPEC.md 4.3).
    """

    step_index: int
    start_s: float
    duration_s: float
    batch: tuple[tuple[int, int], ...]
    preempted: tuple[int, ...]
    events: tuple[Event, ...]
    finished: tuple[Sequence, ...] = ()
    reserved: int | None = None
    reserved_reason: str | None = None


def idle(config: Config, state: State, until_s: float) -> State:
    """The empty replica waits until ``until_s`` (seconds); nothing else changes.

    Raises:
        ValueError: if ``until_s`` is before the state's clock.
    """
    if until_s < state.t_s:
        raise ValueError(f"idle until_s={until_s!r} is before the clock t_s={state.t_s!r}")
    return attrs.evolve(state, t_s=until_s)


def step(config: Config, state: State, inputs: StepInput = StepInput(),
         variant: type["Step"] | None = None) -> tuple[State, StepOutput]:
    """Run one step.  Pure: ``state`` and ``inputs`` are not modified.

    Args:
        config: the replica and its policies.
        state: the state before the step.
        inputs: arrivals (each with arrival_s <= state.t_s) and cancellations.
        variant: a subclass of :class:`Step` to run instead of the model
            (a mutant); None runs the model.

    Returns:
        (the state after the step, the step's :class:`StepOutput`).

    Raises:
        ConfigError: if an arrival names a tenant the config does not have.
    """
    s = (variant or Step)(config, state)
    for rid in inputs.cancellations:
        s.cancel(rid)
    for r in inputs.arrivals:
        s.arrive(r)
    s.schedule_running()
    s.schedule_waiting()
    s.execute()
    return s.result()



class Step(AdmissionPhase, RunningPhase, WaitingPhase):
    """One step in progress: a mutable scratch copy of the state, and the phases.

    Built from the state before the step; the phase methods (:meth:`cancel`,
    :meth:`arrive`, :meth:`schedule_running`, :meth:`schedule_waiting`,
    :meth:`execute`) change the copy and :meth:`result` freezes it into the
    new :class:`State` and the :class:`StepOutput`.  The old state is never
    written.  A subclass is a variant of the model (see the module docstring).

    Attributes:
        ORDER, VICTIM: the policy tables this step looks policies up in
            (:data:`tenantry.model.policies.ORDER` / ``VICTIM``; a variant
            may replace entries in a copy).
        cfg, st: the configuration and the state before the step; k, t: its
            index and start (seconds); policy: the order policy (``ORDER[...]``).
        tenants: the per-tenant records (a list; changed through :meth:`_set`).
        running: the running sequences by request id, in batch order.
        used, refs, retained, key_salt: the KV pool (copies of the state's).
        planned: request id -> tokens it gets in this step, in batch order;
            budget: the tokens left of the step's token budget.
        backlogged: the tenants with a non-empty queue (kept by :meth:`_set`).
        events, preempted, gone: what the step did so far (events in order, the
            request ids evicted, the sequences that left the state).
        provisional, capped, reserved, reserved_reason: the waiting phase's
            notes (DRR block-second reservations, tenants refused by their own
            caps, the request the guard or skip budget stopped filling for).
        next_seq, rr_next, tier_counters, last_left, last_left_tier,
            last_left_skips, tier_skips, last_left_tier_skips: the state's
            fields of the same meaning, as the step changes them.
    """

    ORDER = ORDER
    VICTIM = VICTIM

    def __init__(self, cfg: Config, st: State) -> None:
        self.cfg, self.st = cfg, st
        self.k = st.step_index
        self.t = st.t_s
        self.policy = self.ORDER[cfg.order.policy]
        self.tenants: list[TenantState] = list(st.tenants)
        self.running: dict[int, Sequence] = {s.request_id: s for s in st.running}
        self.used = st.kv.used_blocks
        self.refs, self.retained, self.key_salt = dict(st.kv.refs), dict(st.kv.retained), dict(st.kv.key_salt)
        self.next_seq = st.next_arrival_seq
        self.rr_next = st.rr_next
        self.tier_counters = list(st.tier_counters)
        self.planned: dict[int, int] = {}
        self.budget = cfg.token_budget
        self.preempted: list[int] = []
        self.events: list[Event] = []
        self.gone: list[Sequence] = []
        self.provisional: dict[int, float] = {}
        self.duration_s = 0.0
        self.reserved: int | None = None
        self.reserved_reason: str | None = None
        self.capped: set[int] = set()  # tenants whose head their own KV or slot cap refused in this step
        self.backlogged: set[int] = set(st.backlogged())  # kept by _set as queues change
        self.last_left, self.last_left_tier = st.last_left_counter, st.last_left_tier_counter
        self.last_left_skips = st.last_left_skips
        self._tier_skips_on = cfg.order.guard_skips is not None and cfg.order.policy == "floors"
        self.tier_skips = list(st.tier_skips or (0,) * len(st.tier_counters)) if self._tier_skips_on else []
        self.last_left_tier_skips = st.last_left_tier_skips

    # --- small helpers ---------------------------------------------------------

    def _set(self, i: int, **changes) -> TenantState:
        """Replace fields of tenant i's record (``TenantState._replace``; ValueError on an
        unknown field), keeping the set of backlogged tenants in step; returns the new record."""
        t = self.tenants[i]._replace(**changes)
        self.tenants[i] = t
        if t.queue:
            self.backlogged.add(i)
        else:
            self.backlogged.discard(i)
        return t

    def _refill(self, i: int) -> TenantState:
        """Refill tenant i's buckets up to now (lazy token-bucket refill)."""
        t, tc = self.tenants[i], self.cfg.tenants[i]
        dt = self.t - t.bucket_t_s
        if dt <= 0:
            return t
        changes = {"bucket_t_s": self.t}
        if tc.token_rate_per_s is not None:
            changes["bucket_tokens"] = min(tc.token_burst_tokens, t.bucket_tokens + tc.token_rate_per_s * dt)
        if tc.request_rate_per_s is not None:
            changes["bucket_requests"] = min(tc.request_burst, t.bucket_requests + tc.request_rate_per_s * dt)
        return self._set(i, **changes)

    def _cap(self, i: int) -> int | None:
        """Tenant i's KV block cap when caps are enforced (``admission.kv_cap``), else None."""
        return self.cfg.tenants[i].kv_block_cap if self.cfg.admission.kv_cap else None

    def _on_backlogged(self, i: int) -> None:
        """Tenant i's queue went from empty to non-empty: apply the counter lift.

        VTC (Sheng et al. 2024, Alg. 2): c_i = max(c_i, min over other
        backlogged tenants of c_j), or c_i = max(c_i, l) when no other tenant is
        backlogged, l the counter of the last tenant whose queue emptied by
        service, or the largest of it and a tenant's whose queue emptied by
        cancellation, which only raises l, so a canceller cannot lower its own lift (without
        it a tenant idle while another was served alone banks credit, and the
        service gap of Theorem 4.4 is unbounded: SPEC.md 7.2); the same for i's
        tier counter over the other backlogged tiers (``floors``).
        """
        skips_lift = self.cfg.order.guard_skips is not None and self.policy.refill is None  # DRR keeps its count
        if not self.cfg.order.lift:
            if skips_lift:
                self._set(i, skips=0)
            return
        lo = min((self.tenants[j].counter for j in self.backlogged if j != i), default=None)
        alone = lo is None
        if alone:
            lo = self.last_left
        c = self.tenants[i].counter
        if c < lo:
            self._set(i, counter=lo)
            c = lo
        if skips_lift:
            self._inherit_skips(i, c, alone)
        tiers = self.cfg.tenants
        tier = tiers[i].tier
        others = {tiers[j].tier for j in self.backlogged if j != i}
        if tier not in others:
            lo_t = min((self.tier_counters[x] for x in others), default=self.last_left_tier)
            self.tier_counters[tier] = max(self.tier_counters[tier], lo_t)
            if self._tier_skips_on:
                self._inherit_tier_skips(tier, others)

    def _inherit_skips(self, i: int, c: float, alone: bool) -> None:
        """Tenant i joined the backlog with (lifted) counter c: its skip count
        (:func:`~tenantry.model.guards.inherited_skips` over the other backlogged
        tenants, or those emptied by cancellation in this step, or the last leaver)."""
        ts = self.tenants
        pairs = [] if alone else [(ts[j].counter, ts[j].skips) for j in self.backlogged if j != i]
        n = inherited_skips(pairs, c, self.last_left_skips)
        if ts[i].skips != n:
            self._set(i, skips=n)

    def _inherit_tier_skips(self, tier: int, others: set[int]) -> None:
        """:meth:`_inherit_skips` for a tier joining the backlog under ``floors``."""
        tc = self.tier_counters
        pairs = [(tc[x], self.tier_skips[x]) for x in others]
        self.tier_skips[tier] = inherited_skips(pairs, tc[tier], self.last_left_tier_skips)

    def _release(self, s: Sequence) -> int:
        """Free the blocks of sequence s; returns how many became free."""
        freed = s.private_blocks
        for key in s.shared_keys:  # a cached block no sequence references any more is retained (free)
            n = self.refs[key] - 1
            if n == 0:
                del self.refs[key]
                self.retained[key] = None
                freed += 1
            else:
                self.refs[key] = n
        self.used -= freed
        t = self.tenants[s.tenant]
        self._set(s.tenant, running=t.running - 1, blocks=t.blocks - s.blocks_held)
        return freed

    def _freeable(self, s: Sequence) -> int:
        """Blocks evicting s would free now: its private blocks and the cached ones only it references."""
        return s.private_blocks + sum(1 for key in s.shared_keys if self.refs.get(key) == 1)

    def _reclaim(self, new_blocks: int) -> None:
        """Make room for ``new_blocks`` uncached blocks by dropping the oldest retained ones."""
        uncached = self.cfg.num_blocks - self.used - len(self.retained)
        excess = new_blocks - uncached
        if excess > 0:
            for key in list(self.retained)[:excess]:
                del self.retained[key]
                self.key_salt.pop(key, None)

    def _drop(self, s: Sequence, kind: str, reason: str | None = None, blocks: int = 0) -> None:
        """Sequence s leaves the state (finished, cancelled, or rejected after admission;
        ``blocks``: what its eviction freed, for a rejection that evicts)."""
        self._refund_prediction(s)
        self._refund_reservation(s)
        self.gone.append(s)
        t_s = self.t + self.duration_s if kind == "finished" else self.t
        if kind == "rejected":
            self.events.append(Event("rejected", s.request_id, s.tenant, t_s, reason=reason, blocks=blocks))
        else:
            self.events.append(Event(kind, s.request_id, s.tenant, t_s, tokens=s.output_done))

    def _reserved_output(self, i: int, tokens: int) -> int:
        """Output tokens tenant i's bucket takes ahead for ``tokens`` of output allowance:
        all of them under ``reserve_output`` with the bucket enforced for i, else 0 (SPEC.md 4.2)."""
        adm = self.cfg.admission
        if adm.reserve_output and adm.token_bucket and self.cfg.tenants[i].token_rate_per_s is not None:
            return tokens
        return 0

    def _refund_reservation(self, s: Sequence) -> None:
        """Sequence s leaves before its last token: its bucket gets back the reserved
        output it did not generate (refilled to now first, capped at the burst)."""
        left = self._reserved_output(s.tenant, s.request.output_tokens - s.output_done)
        if left > 0:
            t = self._refill(s.tenant)
            self._set(s.tenant, bucket_tokens=min(self.cfg.tenants[s.tenant].token_burst_tokens,
                                                  t.bucket_tokens + left))

    def _refund_prediction(self, s: Sequence) -> None:
        if s.predicted_charge > 0:
            i = s.tenant
            w = self.cfg.tenants[i].weight
            self._set(i, counter=self.tenants[i].counter - self.cfg.order.w_out * s.predicted_charge / w)

    # --- 1. cancellations --------------------------------------------------------

    def cancel(self, rid: int) -> None:
        """The client cancels request rid: it leaves its queue or the batch, releasing every block."""
        s = self.running.pop(rid, None)
        if s is not None:
            self._release(s)
            self._drop(s, "cancelled")
            return
        for i, t in enumerate(self.tenants):
            for j, q in enumerate(t.queue):
                if q.request_id == rid:
                    t = self._set(i, queue=t.queue[:j] + t.queue[j + 1:],
                                  fresh_queued=t.fresh_queued - (1 if q.never_scheduled else 0))
                    self._drop(q, "cancelled")
                    if not t.queue:  # i left the backlog by cancellation: l rises to its counter, never drops (4.4)
                        self.last_left = max(self.last_left, t.counter)
                        self.last_left_skips = max(self.last_left_skips, t.skips)
                        tier = self.cfg.tenants[i].tier
                        if all(self.cfg.tenants[x].tier != tier for x in self.backlogged):
                            self.last_left_tier = max(self.last_left_tier, self.tier_counters[tier])
                            if self._tier_skips_on:
                                self.last_left_tier_skips = max(self.last_left_tier_skips, self.tier_skips[tier])
                    return
        # Unknown or already ended: nothing to do (SPEC.md 5.1).

    # --- 5. execution -----------------------------------------------------------------

    def execute(self) -> None:
        """The batch runs: tokens advance, outputs are produced, the accounting is charged."""
        cfg, o = self.cfg, self.cfg.order
        batched = sum(self.planned.values())
        kv_tokens = sum(self.running[rid].computed_tokens + n for rid, n in self.planned.items())
        dur = step_duration_s(cfg, batched, kv_tokens)
        self.duration_s = dur
        end = self.t + dur
        # Block-seconds for every tenant holding blocks during the step (charged below), in batch order.
        held = {s.tenant: self.tenants[s.tenant].blocks * dur for s in self.running.values()}
        produced: dict[int, list[int]] = {}  # tenant -> [tokens produced, tokens to charge to the counter]
        for rid, n in self.planned.items():
            s = self.running[rid]
            computed = s.computed_tokens + n
            shared, private = s.shared_keys, s.private_blocks
            if s.prefix_keys:
                shared, private = self._register(s, computed, shared, private)
            output_done, predicted, first = s.output_done, s.predicted_charge, s.first_token_s
            if computed == s.request.prompt_tokens + output_done:  # every known token computed: sample one
                output_done += 1
                if first is None:
                    first = end
                    self.events.append(Event("first_token", rid, s.tenant, end))
                acc = produced.setdefault(s.tenant, [0, 0])
                acc[0] += 1
                if predicted <= 0:
                    acc[1] += 1
                else:
                    predicted -= 1  # a token charged ahead (vtc_predict) is not charged again
            s = s._replace(computed_tokens=computed, output_done=output_done, shared_keys=shared,
                           private_blocks=private, predicted_charge=predicted, first_token_s=first)
            if output_done == s.request.output_tokens:
                del self.running[rid]
                self._release(s)
                self._drop(s, "finished")
            else:
                self.running[rid] = s
        for i, block_s in held.items():  # every tenant that produced a token held blocks: it is in held
            tokens, counted = produced.get(i, (0, 0))
            self._charge_step(i, block_s, tokens, counted)
        # Idle tenants lose their DRR deficit (no banked credit).
        if o.drr_reset_when_idle:
            for i, t in enumerate(self.tenants):
                if not t.queue and t.running == 0 and t.deficit != 0.0:
                    self._set(i, deficit=0.0)

    def _register(self, s: Sequence, computed: int, shared: tuple, private: int) -> tuple[tuple, int]:
        """Enter s's newly completed cacheable prompt blocks into the prefix cache
        (SPEC.md 4.6): a block whose key is not cached yet becomes shared."""
        full = min(computed // self.cfg.block_size_tokens, len(s.prefix_keys))
        if full <= len(shared) or private <= 0:
            return shared, private
        add = []
        for key in s.prefix_keys[len(shared):full]:
            if key in self.refs or key in self.retained or private - len(add) <= 0:
                break
            add.append(key)
        salt = self.cfg.tenants[s.tenant].salt if self.cfg.prefix_cache == "salted" else None
        for key in add:
            self.refs[key] = 1
            self.key_salt[key] = salt
        return shared + tuple(add), private - len(add)

    def _charge_step(self, i: int, block_s: float, tokens: int, counted: int) -> None:
        """Charge tenant i for one step: ``block_s`` block-seconds held and
        ``tokens`` generated tokens (service, deficit, token bucket, tier
        counter); only ``counted`` of them go to its VTC counter (the rest were
        charged ahead as a prediction)."""
        cfg = self.cfg
        o, tc = cfg.order, cfg.tenants[i]
        if tokens and cfg.admission.token_bucket and tc.token_rate_per_s is not None \
                and not self._reserved_output(i, tokens):
            self._refill(i)
            charge_bucket = True
        else:
            charge_bucket = False
        t = self.tenants[i]
        cost = o.w_out * tokens
        unit = self.policy.deficit_unit
        changes = {"block_seconds": t.block_seconds + block_s}
        if tokens:
            changes["service"] = t.service + cost
            if unit == "tokens":
                changes["deficit"] = t.deficit - cost
            if charge_bucket:
                changes["bucket_tokens"] = t.bucket_tokens - tokens
        if unit == "block_seconds" and block_s:
            changes["deficit"] = t.deficit - block_s
        if counted:
            changes["counter"] = t.counter + o.w_out * counted / tc.weight
        self._set(i, **changes)
        if tokens:
            self.tier_counters[tc.tier] += cost / o.tier_floors[min(tc.tier, len(o.tier_floors) - 1)]

    # --- result ---------------------------------------------------------------------

    def result(self) -> tuple[State, StepOutput]:
        new = State(
            step_index=self.k + 1,
            t_s=self.t + self.duration_s,
            last_step_s=self.duration_s,
            tenants=tuple(self.tenants),
            running=tuple(self.running.values()),
            kv=KVPool(used_blocks=self.used, refs=self.refs, retained=self.retained, key_salt=self.key_salt),
            next_arrival_seq=self.next_seq,
            rr_next=self.rr_next,
            tier_counters=tuple(self.tier_counters),
            last_left_counter=self.last_left,
            last_left_tier_counter=self.last_left_tier,
            last_left_skips=self.last_left_skips,
            tier_skips=tuple(self.tier_skips) if self._tier_skips_on else self.st.tier_skips,
            last_left_tier_skips=self.last_left_tier_skips,
        )
        out = StepOutput(
            step_index=self.k,
            start_s=self.t,
            duration_s=self.duration_s,
            batch=tuple(self.planned.items()),
            preempted=tuple(self.preempted),
            events=tuple(self.events),
            finished=tuple(self.gone),
            reserved=self.reserved,
            reserved_reason=self.reserved_reason,
        )
        return new, out
