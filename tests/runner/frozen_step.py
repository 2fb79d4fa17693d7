"""A frozen copy of the model's step (``tenantry/model/step.py``) as it was
before the step was made fast (issue 13), kept only as the reference of the
differential test (tests/test_step_differential.py): the fast step must give
byte-identical histories.  Do not edit; do not import outside the tests.
Edited only where the model's semantics were fixed after the copy was made,
so that the copy stays the reference of what the step decides: the lift after
a queue emptied by cancellation (l rises to the canceller's counter and never
drops; a VTC-GAP counterexample, tests/regressions/vtc-lift-after-cancel-emptied-the-backlog).

The step function: one scheduling step of the replica (SPEC.md section 5).

``step(config, state, inputs) -> (state', output)`` is pure: it reads the old
state, never mutates it, and returns a new state plus what happened in the
step.  A step is, in order (each phase one method of :class:`Step`):

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

import math
from itertools import compress
from operator import itemgetter

import attrs

from tenantry.model.config import Config
from tenantry.model.events import EVENT_KINDS as HISTORY_EVENT_KINDS
from tenantry.model.policies import ORDER, VICTIM, KeyMemo, SelectView, VictimView, step_duration_s
from tenantry.model.state import KVPool, Sequence, State, TenantState, advanced, prefix_keys
from tenantry.model.workload import Request, StepInput

_queue_of = itemgetter(0)  # TenantState.queue

#: Event kinds (SPEC.md 5.2): one flat table, the history's
#: (:data:`tenantry.model.events.EVENT_KINDS`).  Every request ends in exactly
#: one of finished / rejected / cancelled (or is still in flight).
EVENT_KINDS = HISTORY_EVENT_KINDS


@attrs.frozen(slots=True)
class Event:
    """Something that happened to one request in a step.

    Attributes:
        kind: one of :data:`EVENT_KINDS`.
        request_id, tenant (index): whose.
        t_s: when (seconds): arrival time for queued/rejected at admission,
            end of the step for first_token/finished, start of the step for
            cancelled, preempted and scheduled.
        reason, retry_after_s: for ``rejected`` (a 429): why and when to retry
            (seconds, None when retrying cannot help).
        tokens: ``preempted``: computed tokens discarded; ``scheduled``: tokens
            already computed at entry (prefix-cache hits); ``finished``: tokens generated.
        blocks: ``preempted`` (and ``rejected`` evicted_too_often): blocks its eviction released.
    """

    kind: str
    request_id: int
    tenant: int
    t_s: float
    reason: str | None = None
    retry_after_s: float | None = None
    tokens: int = 0
    blocks: int = 0


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
    """

    step_index: int
    start_s: float
    duration_s: float
    batch: tuple[tuple[int, int], ...]
    preempted: tuple[int, ...]
    events: tuple[Event, ...]
    finished: tuple[Sequence, ...] = ()
    reserved: int | None = None  # added with the starvation guard (record field; the frozen step never reserves)
    reserved_reason: str | None = None  # added with the skip budget (record field; the frozen step never reserves)


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


class Step:
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
        self.refs, self.retained, self.key_salt = st.kv.refs, st.kv.retained, st.kv.key_salt
        self._kv_copied = False
        self.next_seq = st.next_arrival_seq
        self.rr_next = st.rr_next
        self.tier_counters = list(st.tier_counters)
        self.planned: dict[int, int] = {}
        self.budget = cfg.token_budget
        self.preempted: list[int] = []
        self.events: list[Event] = []
        self.gone: list[Sequence] = []
        self.touched: set[int] = set()
        self.provisional: dict[int, float] = {}
        self.duration_s = 0.0
        self.backlogged: set[int] = set(compress(range(len(st.tenants)), map(_queue_of, st.tenants)))
        self._min_counter: float | None = None
        self._keys = KeyMemo()  # order-policy sort keys memoised for this step
        self.last_left, self.last_left_tier = st.last_left_counter, st.last_left_tier_counter

    # --- small helpers ---------------------------------------------------------

    def _kv_write(self) -> None:
        if not self._kv_copied:
            self.refs, self.retained, self.key_salt = dict(self.refs), dict(self.retained), dict(self.key_salt)
            self._kv_copied = True

    def _set(self, i: int, **changes) -> TenantState:
        """Replace fields of tenant i's record, keeping the backlog set and the
        cached least counter (see :meth:`_on_backlogged`) in step."""
        t = self.tenants[i]._replace(**changes)
        self.tenants[i] = t
        self.touched.add(i)
        self._keys.invalidate(i)
        if "queue" in changes:
            if t.queue:
                self.backlogged.add(i)
            elif i in self.backlogged:
                self.backlogged.discard(i)
                self._min_counter = None
        if "counter" in changes and i in self.backlogged:
            self._min_counter = None
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
        return self.cfg.tenants[i].kv_block_cap if self.cfg.admission.kv_cap else None

    def _prefix_keys(self, r: Request, salt: str | None) -> tuple[int, ...]:
        """Prefix-cache keys of r's cacheable blocks under ``salt`` (:func:`~tenantry.model.state.prefix_keys`)."""
        return prefix_keys(self.cfg, r, salt)

    def _reject(self, r: Request, i: int, reason: str, retry_after_s: float | None, t_s: float) -> None:
        self.events.append(Event("rejected", r.request_id, i, t_s, reason=reason, retry_after_s=retry_after_s))

    def _on_backlogged(self, i: int) -> None:
        """Tenant i's queue went from empty to non-empty: apply the counter lift.

        VTC (Sheng et al. 2024, Alg. 2): c_i = max(c_i, min over other
        backlogged tenants of c_j), or c_i = max(c_i, l) when no other tenant is
        backlogged, l the counter of the last tenant whose queue emptied (without
        it a tenant idle while another was served alone banks credit, and the
        service gap of Theorem 4.4 is unbounded: SPEC.md 7.2); the same for i's
        tier counter over the other backlogged tiers (``floors``).  The minimum is cached for the step and
        dropped whenever a backlogged tenant's counter changes or a tenant
        leaves the backlog; a join cannot lower it, since the joiner is lifted.
        """
        if not self.cfg.order.lift:
            return
        lo = self._min_counter
        if lo is None:
            lo = min((self.tenants[j].counter for j in self.backlogged if j != i), default=None)
        alone = lo is None
        if alone:
            lo = self.last_left
        c = self.tenants[i].counter
        if c < lo:
            self._set(i, counter=lo)
            c = lo
        self._min_counter = c if alone else lo
        tiers = self.cfg.tenants
        tier = tiers[i].tier
        others = {tiers[j].tier for j in self.backlogged if j != i}
        if tier not in others:
            lo_t = min((self.tier_counters[x] for x in others), default=self.last_left_tier)
            self.tier_counters[tier] = max(self.tier_counters[tier], lo_t)

    def _release(self, s: Sequence) -> int:
        """Free the blocks of sequence s; returns how many became free."""
        freed = s.private_blocks
        if s.shared_keys:
            self._kv_write()
            for key in s.shared_keys:
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
        return s.private_blocks + sum(1 for key in s.shared_keys if self.refs.get(key) == 1)

    def _reclaim(self, new_blocks: int) -> None:
        """Make room for ``new_blocks`` uncached blocks by dropping the oldest retained ones."""
        uncached = self.cfg.num_blocks - self.used - len(self.retained)
        excess = new_blocks - uncached
        if excess > 0:
            self._kv_write()
            for key in list(self.retained)[:excess]:
                del self.retained[key]
                self.key_salt.pop(key, None)

    def _drop(self, s: Sequence, kind: str, reason: str | None = None, blocks: int = 0) -> None:
        """Sequence s leaves the state (finished, cancelled, or rejected after admission;
        ``blocks``: what its eviction freed, for a rejection that evicts)."""
        self._refund_prediction(s)
        self.gone.append(s)
        t_s = self.t + self.duration_s if kind == "finished" else self.t
        if kind == "rejected":
            self.events.append(Event("rejected", s.request_id, s.tenant, t_s, reason=reason, blocks=blocks))
        else:
            self.events.append(Event(kind, s.request_id, s.tenant, t_s, tokens=s.output_done))

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
                        tier = self.cfg.tenants[i].tier
                        if all(self.cfg.tenants[x].tier != tier for x in self.backlogged):
                            self.last_left_tier = max(self.last_left_tier, self.tier_counters[tier])
                    return
        # Unknown or already ended: nothing to do (SPEC.md 5.1).

    # --- 2. arrivals ------------------------------------------------------------

    def arrive(self, r: Request) -> None:
        """Request r arrives: it is queued, or refused with a reason (a 429)."""
        cfg, adm = self.cfg, self.cfg.admission
        i = cfg.tenant_index(r.tenant)
        tc = cfg.tenants[i]
        t_s = r.arrival_s
        if r.total_tokens > cfg.max_context_tokens:
            return self._reject(r, i, "too_long", None, t_s)
        need = cfg.blocks_for(r.total_tokens)
        cap = self._cap(i)
        if need > cfg.num_blocks or (cap is not None and need > cap):
            return self._reject(r, i, "too_large", None, t_s)
        t = self._refill(i)
        limited = adm.request_rate_limit and tc.request_rate_per_s is not None
        if limited and t.bucket_requests < 1.0:
            return self._reject(r, i, "rate_limit", (1.0 - t.bucket_requests) / tc.request_rate_per_s, t_s)
        bucket = adm.token_bucket and tc.token_rate_per_s is not None
        charge = r.prompt_tokens
        if adm.prompt_estimate == "bytes":
            nbytes = r.prompt_bytes if r.prompt_bytes is not None else 4 * r.prompt_tokens
            charge = math.ceil(nbytes / adm.bytes_per_token)
        if bucket:
            if charge > tc.token_burst_tokens:
                return self._reject(r, i, "token_bucket", None, t_s)
            if t.bucket_tokens < charge:
                return self._reject(r, i, "token_bucket", (charge - t.bucket_tokens) / tc.token_rate_per_s, t_s)
        if adm.queue_bound and tc.queue_bound is not None and t.fresh_queued >= tc.queue_bound:
            return self._reject(r, i, "queue_full", self.st.last_step_s * max(1, t.fresh_queued), t_s)
        if adm.kv_watermarks:
            wm = adm.kv_watermarks[min(tc.tier, len(adm.kv_watermarks) - 1)]
            if self.used >= wm * cfg.num_blocks:
                return self._reject(r, i, "kv_watermark", self.st.last_step_s, t_s)
        salt = None if cfg.prefix_cache == "shared" else tc.salt
        keys = self._prefix_keys(r, salt) if cfg.prefix_cache != "off" else ()
        seq = Sequence(request=r, tenant=i, arrival_seq=self.next_seq, admitted_step=self.k,
                       prefix_keys=keys, ready_step=self.k, charged_prompt_tokens=charge if bucket else 0)
        self.next_seq += 1
        was_empty = not t.queue
        changes = {"queue": t.queue + (seq,), "fresh_queued": t.fresh_queued + 1}
        if limited:
            changes["bucket_requests"] = t.bucket_requests - 1.0
        if bucket:
            changes["bucket_tokens"] = t.bucket_tokens - charge
        self._set(i, **changes)
        self.events.append(Event("queued", r.request_id, i, t_s))
        if was_empty:
            self._on_backlogged(i)

    # --- 3. running sequences ------------------------------------------------------

    def schedule_running(self) -> None:
        """Each running sequence, in batch order, gets its next chunk or token."""
        bs = self.cfg.block_size_tokens
        running, planned = self.running, self.planned
        for rid in list(running):
            if self.budget <= 0:
                break
            s = running.get(rid)
            if s is None:  # evicted earlier in this loop
                continue
            n = s.request.prompt_tokens + s.output_done - s.computed_tokens
            if n > self.budget:
                n = self.budget
            need = -(-(s.computed_tokens + n) // bs) - len(s.shared_keys) - s.private_blocks
            if need > 0:
                if not self._make_room(s, need):
                    continue
                self._reclaim(need)
                self.used += need
                t = self.tenants[s.tenant]
                self._set(s.tenant, blocks=t.blocks + need)
                running[rid] = s._replace(private_blocks=s.private_blocks + need)
            planned[rid] = n
            self.budget -= n

    def _make_room(self, s: Sequence, need: int) -> bool:
        """Evict victims until s can allocate ``need`` blocks.  False if s stalls or is evicted itself."""
        cfg, cap = self.cfg, self._cap(s.tenant)
        key = self.VICTIM[cfg.eviction.victim]
        while True:
            pool_short = need - (cfg.num_blocks - self.used)
            cap_short = 0 if cap is None else self.tenants[s.tenant].blocks + need - cap
            if pool_short <= 0 and cap_short <= 0:
                return True
            view = VictimView(cfg, self.tenants)
            cands = [
                c for c in self.running.values()
                if (cap_short <= 0 or c.tenant == s.tenant)
                and (c is s or self._freeable(c) >= cfg.eviction.min_free_blocks)
            ]
            victim = min(cands, key=lambda c: key(view, c))
            self._evict(victim)
            if victim.request_id == s.request_id:
                return False

    def _evict(self, v: Sequence) -> None:
        """Sequence v is preempted by recompute (or rejected if evicted too often)."""
        rid = v.request_id
        del self.running[rid]
        if rid in self.planned:
            self.budget += self.planned.pop(rid)
        freed = self._release(v)
        k_max = self.cfg.eviction.max_evictions
        if k_max is not None and v.preemptions >= k_max:
            self._drop(v, "rejected", reason="evicted_too_often", blocks=freed)
            return
        self.preempted.append(rid)
        self.events.append(Event("preempted", rid, v.tenant, self.t, tokens=v.computed_tokens, blocks=freed))
        back = v._replace(computed_tokens=0, shared_keys=(), private_blocks=0, preemptions=v.preemptions + 1,
            wasted_tokens=v.wasted_tokens + v.computed_tokens,
            ready_step=self.k + 1 + self.cfg.eviction.cooldown_steps,
        )
        t = self.tenants[v.tenant]
        self._set(v.tenant, queue=(back,) + t.queue)
        if not t.queue:
            self._on_backlogged(v.tenant)

    # --- 4. waiting sequences ------------------------------------------------------

    def schedule_waiting(self) -> None:
        """The order policy picks tenants whose first ready request joins the batch."""
        cfg, policy = self.cfg, self.policy
        if len(self.running) >= cfg.max_num_seqs or self.budget <= 0 or not self.backlogged:
            return
        avail = set(self.backlogged)  # backlogged and not blocked in this step
        while avail and len(self.running) < cfg.max_num_seqs and self.budget > 0:
            view = self._view(avail)
            i = policy.select(view)
            if i is None and policy.refill is not None:
                for j, d in policy.refill(view).items():
                    self._set(j, deficit=d)
                i = policy.select(self._view(avail))
            if i is None:
                return
            if not self._admit_head(i) or not self.tenants[i].queue:
                avail.discard(i)

    def _view(self, cands: set[int]) -> SelectView:
        return SelectView(self.cfg, self.tenants, cands, self.t, self.rr_next, self.tier_counters, self.provisional,
                          self.backlogged, self._keys, self.k)

    def _admit_head(self, i: int) -> bool:
        """Move tenant i's first ready sequence into the batch; False if none is ready or it does not fit."""
        cfg, t = self.cfg, self.tenants[i]
        idx = next((j for j, q in enumerate(t.queue) if q.ready_step <= self.k), None)
        if idx is None:
            return False
        s = t.queue[idx]
        B = cfg.block_size_tokens
        hit = self._lookup(s.prefix_keys)
        hit = hit[: (s.target_tokens - 1) // B]
        computed0 = len(hit) * B
        n = min(s.target_tokens - computed0, self.budget)
        total = cfg.blocks_for(computed0 + n)
        private = total - len(hit)
        revived = sum(1 for key in hit if key not in self.refs)
        cap = self._cap(i)
        if cap is not None and t.blocks + total > cap:
            return False
        if private + revived > cfg.num_blocks - self.used:
            return False
        if hit:
            self._kv_write()
            for key in hit:
                if key in self.refs:
                    self.refs[key] += 1
                else:
                    del self.retained[key]
                    self.refs[key] = 1
            self.used += revived
        self._reclaim(private)
        self.used += private
        first = s.never_scheduled
        s = s._replace(computed_tokens=computed0, shared_keys=hit, private_blocks=private,
            cached_tokens=s.cached_tokens + min(computed0, s.request.prompt_tokens),
            first_scheduled_s=self.t if first else s.first_scheduled_s,
        )
        changes = {
            "queue": t.queue[:idx] + t.queue[idx + 1:],
            "running": t.running + 1,
            "blocks": t.blocks + total,
            "fresh_queued": t.fresh_queued - (1 if first else 0),
        }
        if first:
            s = self._charge_prompt(i, s, changes)
        if self.policy.deficit_unit == "block_seconds":
            self.provisional[i] = self.provisional.get(i, 0.0) + total * self.st.last_step_s
        t = self._set(i, **changes)
        if not t.queue:  # i leaves the backlog by being served: its counter is the lift (Algorithm 2's l)
            self.last_left = t.counter
            tier = cfg.tenants[i].tier
            if all(cfg.tenants[j].tier != tier for j in self.backlogged):
                self.last_left_tier = self.tier_counters[tier]
        self.running[s.request_id] = s
        self.planned[s.request_id] = n
        self.budget -= n
        self.rr_next = (i + 1) % len(self.tenants)
        self.events.append(Event("scheduled", s.request_id, i, self.t, tokens=computed0))
        return True

    def _charge_prompt(self, i: int, s: Sequence, changes: dict) -> Sequence:
        """Charge a sequence's prompt to its tenant when it is first scheduled (SPEC.md 4.4)."""
        cfg, t, tc = self.cfg, self.tenants[i], self.cfg.tenants[i]
        o = cfg.order
        cost = o.w_in * s.request.prompt_tokens
        predicted = (s.request.predicted_output_tokens or 0) if self.policy.charge_predicted else 0
        changes["counter"] = t.counter + (cost + o.w_out * predicted) / tc.weight
        changes["service"] = t.service + cost
        if self.policy.deficit_unit == "tokens":
            changes["deficit"] = t.deficit - cost
        self.tier_counters[tc.tier] += cost / o.tier_floors[min(tc.tier, len(o.tier_floors) - 1)]
        if s.charged_prompt_tokens and s.charged_prompt_tokens != s.request.prompt_tokens:
            changes["bucket_tokens"] = t.bucket_tokens - (s.request.prompt_tokens - s.charged_prompt_tokens)
        return s._replace(predicted_charge=predicted, charged_prompt_tokens=s.request.prompt_tokens)

    def _lookup(self, keys: tuple[int, ...]) -> tuple[int, ...]:
        """The longest prefix of ``keys`` present in the cache (referenced or retained)."""
        n = 0
        for key in keys:
            if key in self.refs or key in self.retained:
                n += 1
            else:
                break
        return keys[:n]

    # --- 5. execution -----------------------------------------------------------------

    def execute(self) -> None:
        """The batch runs: tokens advance, outputs are produced, the accounting is charged."""
        cfg, o = self.cfg, self.cfg.order
        batched = sum(self.planned.values())
        kv_tokens = sum(self.running[rid].computed_tokens + n for rid, n in self.planned.items())
        dur = step_duration_s(cfg, batched, kv_tokens)
        self.duration_s = dur
        end = self.t + dur
        # Block-seconds for every tenant holding blocks during the step (charged below).
        held = {s.tenant: self.tenants[s.tenant].blocks * dur for s in self.running.values()}
        B = cfg.block_size_tokens
        produced: dict[int, list[int]] = {}  # tenant -> [tokens produced, tokens to charge to the counter]
        running = self.running
        for rid, n in self.planned.items():
            s = running[rid]
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
                acc = produced.get(s.tenant)
                if acc is None:
                    acc = produced[s.tenant] = [0, 0]
                acc[0] += 1
                if predicted <= 0:
                    acc[1] += 1
                else:
                    predicted -= 1
            s = advanced(s, computed, output_done, shared, private, predicted, first)
            if output_done == s.request.output_tokens:
                del running[rid]
                self._release(s)
                self._drop(s, "finished")
            else:
                running[rid] = s
        for i, bs in held.items():
            tokens, counted = produced.pop(i, (0, 0))
            self._charge_step(i, bs, tokens, counted)
        for i, (tokens, counted) in produced.items():  # finished sequences of tenants now holding nothing
            self._charge_step(i, 0.0, tokens, counted)
        # Idle tenants lose their DRR deficit (no banked credit).
        if o.drr_reset_when_idle:
            for i in self.touched:
                t = self.tenants[i]
                if not t.queue and t.running == 0 and t.deficit != 0.0:
                    self._set(i, deficit=0.0)

    def _register(self, s: Sequence, computed: int, shared: tuple, private: int) -> tuple[tuple, int]:
        """Enter s's newly completed cacheable prompt blocks into the prefix cache
        (SPEC.md 4.6): a block whose key is not cached yet becomes shared."""
        full = min(computed // self.cfg.block_size_tokens, len(s.prefix_keys))
        if full <= len(shared) or private <= 0:
            return shared, private
        self._kv_write()
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
        cfg, o = self.cfg, self.cfg.order
        t, tc = self.tenants[i], cfg.tenants[i]
        cost = o.w_out * tokens
        changes = {"block_seconds": t.block_seconds + block_s}
        if tokens:
            changes["service"] = t.service + cost
        if counted:
            changes["counter"] = t.counter + o.w_out * counted / tc.weight
        unit = self.policy.deficit_unit
        if unit == "tokens" and tokens:
            changes["deficit"] = t.deficit - cost
        elif unit == "block_seconds" and block_s:
            changes["deficit"] = t.deficit - block_s
        if tokens and cfg.admission.token_bucket and tc.token_rate_per_s is not None:
            t = self._refill(i)
            changes["bucket_tokens"] = t.bucket_tokens - tokens
        self._set(i, **changes)
        if tokens:
            self.tier_counters[tc.tier] += cost / o.tier_floors[min(tc.tier, len(o.tier_floors) - 1)]

    # --- result ---------------------------------------------------------------------

    def result(self) -> tuple[State, StepOutput]:
        kv = self.st.kv
        if self._kv_copied or self.used != kv.used_blocks:
            kv = KVPool(used_blocks=self.used, refs=self.refs, retained=self.retained, key_salt=self.key_salt)
        new = State(
            step_index=self.k + 1,
            t_s=self.t + self.duration_s,
            last_step_s=self.duration_s,
            tenants=tuple(self.tenants),
            running=tuple(self.running.values()),
            kv=kv,
            next_arrival_seq=self.next_seq,
            rr_next=self.rr_next,
            tier_counters=tuple(self.tier_counters),
            last_left_counter=self.last_left,
            last_left_tier_counter=self.last_left_tier,
        )
        out = StepOutput(
            step_index=self.k,
            start_s=self.t,
            duration_s=self.duration_s,
            batch=tuple(self.planned.items()),
            preempted=tuple(self.preempted),
            events=tuple(self.events),
            finished=tuple(self.gone),
        )
        return new, out
