"""The fast replica: the model's steps computed in place, for runs that keep no step records (issue 13).

:func:`tenantry.model.step.step` is the specification: pure, one phase a method, a
new :class:`~tenantry.model.state.State` per step.  A run that records nothing but
each request's outcome (``tenantry simulate`` without ``--history``, the studies)
needs none of that per step, so :class:`FastReplica` runs the same five phases
(SPEC.md 5) on one mutable copy of the state: per-tenant lists, the running
sequences in batch order (by entry number) updated in place, a lazy decode
ledger (a sequence in steady decode, one computed and one generated token a
step, is read only when its next KV block or its last token is due), the order
policy's keys in a heap with lazy deletion, and no step output beyond the
events and the sequences that left.  A step costs what changed: the sequences
due, those not decoding, and the tenants charged.  These are the speed tricks
the readable step does without (issue 30): this module is the one place for them.

It implements a subset of the configurations (:func:`unsupported` names what it
lacks; :func:`tenantry.runner.simulate.simulate` falls back to the readable step
for the rest), and on that subset the request records it yields are those of the
readable step byte for byte: ``tests/test_step_differential.py`` compares them on
the seed-001 workload, the Azure pair, every check cell's workload and drawn
configurations, and steps both side by side (clock, events, batch membership).  A change
to the step that this module does not mirror must narrow :func:`unsupported`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from typing import Iterator, NamedTuple

from tenantry.model.config import Config
from tenantry.model.events import Event
from tenantry.model.policies import VICTIM, key_aging, key_fcfs, key_priority, key_vtc, step_duration_s
from tenantry.model.workload import Request, StepInput

#: Order policies the fast replica implements: their sort keys, the readable step's own
#: (:mod:`tenantry.model.policies`), kept in a heap (:meth:`FastReplica._key`).
ORDER_KEYS = {"fcfs": key_fcfs, "vtc": key_vtc, "priority": key_priority, "aging": key_aging}
ORDERS = tuple(ORDER_KEYS)


def unsupported(config: Config) -> str | None:
    """Why the fast replica cannot run ``config`` (the first mechanism it lacks), or
    None when it can: a prefix cache, an order policy outside :data:`ORDERS`, the
    starvation guard or skip budget, strict tiers, token buckets, KV
    watermarks, tier slot caps, estimated-wait shedding or preemption for priority
    (every victim policy of :data:`~tenantry.model.policies.VICTIM` is its own)."""
    o, a, e = config.order, config.admission, config.eviction
    checks = (
        (config.prefix_cache != "off", f"prefix cache {config.prefix_cache!r}"),
        (o.policy not in ORDERS, f"order policy {o.policy!r}"),
        (o.guard_steps is not None or o.guard_wait_s is not None, "starvation guard"),
        (o.guard_skips is not None, "skip budget"),
        (o.strict_tiers, "strict tiers"),
        (a.token_bucket, "token bucket"),
        (bool(a.kv_watermarks), "KV watermarks"),
        (bool(a.tier_slot_caps), "tier slot caps"),
        (bool(a.wait_limits_s), "estimated-wait shedding"),
        (e.preempt_for_priority, "preemption for priority"),
    )
    return next((why for bad, why in checks if bad), None)


class FastSeq:
    """One admitted request in the fast replica, updated in place; it reads like a
    :class:`~tenantry.model.state.Sequence` for every field the recorder folds
    (:class:`~tenantry.runner.simulate.Recorder`).

    Attributes:
        request, request_id, tenant (index), arrival_seq: as in ``Sequence``.
        prompt, output: the request's prompt and output tokens.
        computed_tokens, output_done, blocks (private KV blocks: there is no prefix
            cache), preemptions, wasted_tokens, ready_step, first_scheduled_s,
            first_token_s, cached_tokens (always 0): as in ``Sequence``.
        running: in the batch; planned: tokens planned in the current step.
        entry: its number of entry into the batch (the batch is in entry order).
        mark: None, or (while it decodes lazily) the step at whose start
            ``computed_tokens`` and ``output_done`` were exact: at the start of step k
            it has advanced ``k - mark`` tokens more (:meth:`FastReplica._materialize`).
    """

    __slots__ = ("request", "request_id", "tenant", "arrival_seq", "prompt", "output", "computed_tokens",
                 "output_done", "blocks", "preemptions", "wasted_tokens", "ready_step", "first_scheduled_s",
                 "first_token_s", "cached_tokens", "running", "planned", "entry", "mark")

    def __init__(self, request: Request, tenant: int, arrival_seq: int, ready_step: int) -> None:
        self.request, self.request_id, self.tenant, self.arrival_seq = request, request.request_id, tenant, arrival_seq
        self.prompt, self.output = request.prompt_tokens, request.output_tokens
        self.computed_tokens = self.output_done = self.blocks = self.preemptions = self.wasted_tokens = 0
        self.ready_step = ready_step
        self.first_scheduled_s = self.first_token_s = None
        self.cached_tokens = 0
        self.running = False
        self.planned = 0
        self.entry = 0
        self.mark = None


    @property
    def blocks_held(self) -> int:
        """KV blocks it holds (all private: there is no prefix cache)."""
        return self.blocks


class _TenantRow(NamedTuple):
    """What the policies' key and victim functions read of a tenant (``TenantState``'s names)."""

    queue: deque
    counter: float
    blocks: int


class _Tenants:
    """The fast replica's per-tenant lists read as the policies read ``State.tenants``:
    ``tenants[i]`` is tenant i's :class:`_TenantRow`."""

    __slots__ = ("rep",)

    def __init__(self, rep: "FastReplica") -> None:
        self.rep = rep

    def __getitem__(self, i: int) -> _TenantRow:
        r = self.rep
        return _TenantRow(r.queues[i], r.counter[i], r.tblocks[i])

    def __len__(self) -> int:
        return len(self.rep.queues)


class _PolicyView:
    """The view the readable step's order keys and victim keys take (``SelectView`` /
    ``VictimView``'s fields they read): the configuration, the tenants, the step index."""

    __slots__ = ("config", "tenants", "step_index")


class FastOutput(NamedTuple):
    """What the recorder reads of a step when it keeps no step record: its index, its
    events (:class:`~tenantry.model.events.Event`) and the sequences that left it."""

    step_index: int
    events: list
    finished: list


class FastReplica:
    """The reference model as a :class:`~tenantry.runner.simulate.Replica`, stepping in place.

    Args:
        config: a configuration :func:`unsupported` accepts.

    Raises:
        ValueError: if :func:`unsupported` names a mechanism of ``config``.

    Attributes:
        t_s: when the next step starts (seconds); k: the next step's index.
        last: the last step's :class:`FastOutput` (None before the first);
        last_start_s: when it started (seconds).
    """

    stopped = False

    def __init__(self, config: Config) -> None:
        why = unsupported(config)
        if why is not None:
            raise ValueError(f"the fast replica does not implement the configuration's {why}")
        self.cfg = config
        ts = config.tenants
        n = len(ts)
        self.t_s, self.k, self.last_step_s = 0.0, 0, config.cost.empty_step_s
        self.index = {t.name: i for i, t in enumerate(ts)}
        self.weight = [t.weight for t in ts]
        self.cap = [t.kv_block_cap if config.admission.kv_cap else None for t in ts]  # KV blocks per tenant
        self.queues: list[deque[FastSeq]] = [deque() for _ in range(n)]
        self.counter = [0.0] * n  # VTC counters (kept under vtc only: no other order reads them)
        self.running_n = [0] * n
        self.tblocks = [0] * n
        self.fresh = [0] * n
        self.bucket_requests = [float(t.request_burst or 0.0) for t in ts]
        self.bucket_t = [0.0] * n
        self.batch: dict[int, FastSeq] = {}  # entry -> running sequence, in batch order
        self.entries = 0
        self.active: set[FastSeq] = set()  # running sequences not decoding lazily
        self.lazy: list[int] = []  # entries of the lazy ones, ascending
        self.lazy_sum = 0  # over the lazy ones: computed_tokens - mark
        self.lazy_by_tenant: dict[int, int] = {}  # tenant -> its lazy sequences (tenants with none left out)
        self.due: dict[int, list[FastSeq]] = {}  # step -> lazy sequences to bring up to date at its start
        self.live: dict[int, FastSeq] = {}
        self.used = 0
        self.next_seq = 0
        self.last_left = 0.0
        self.backlogged: set[int] = set()
        self.vtc = config.order.policy == "vtc"
        self.heap: list[tuple[tuple, int]] = []
        self.key_of: dict[int, tuple] = {}
        self.dirty: set[int] = set()
        self.cooling: set[int] = set()
        self.last: FastOutput | None = None
        self.last_start_s = 0.0
        self.events: list[Event] = []
        self.gone: list[FastSeq] = []
        self.planned: list[FastSeq] = []
        self.budget = self.taken = 0
        self.view = _PolicyView()
        self.view.config, self.view.tenants, self.view.step_index = config, _Tenants(self), 0
        self.order_key = ORDER_KEYS[config.order.policy]
        self.victim_key = VICTIM[config.eviction.victim]

    # --- the Replica protocol -------------------------------------------------------

    def has_work(self) -> bool:
        """True while some request is queued or running."""
        return bool(self.batch) or bool(self.backlogged)

    def idle(self, until_s: float) -> None:
        """The empty replica waits until ``until_s`` (seconds)."""
        if until_s > self.t_s:
            self.t_s = until_s

    def sequences(self) -> Iterator[FastSeq]:
        """Every admitted sequence, up to date: running first, then each tenant's queue."""
        for s in list(self.batch.values()):
            self._materialize(s)
        yield from self.batch.values()
        for q in self.queues:
            yield from q

    def step(self, inputs: StepInput) -> FastOutput:
        """One step (SPEC.md 5): cancellations, arrivals, running, waiting, execution."""
        self.events, self.gone = [], []
        self.last_start_s = self.t_s
        if self.cooling:  # a head in its cooldown may be ready now: key those tenants again
            self.dirty |= self.cooling
            self.cooling = set()
        for rid in inputs.cancellations:
            self._cancel(rid)
        for r in inputs.arrivals:
            self._arrive(r)
        self._schedule_running()
        self._schedule_waiting()
        self._execute()
        self.last = FastOutput(self.k, self.events, self.gone)
        self.k += 1
        if len(self.heap) > 4 * len(self.backlogged) + 64:  # drop the stale entries (dirty ones are pushed again)
            self.heap = [(self.key_of[i], i) for i in self.backlogged if i in self.key_of]
            heapq.heapify(self.heap)
        return self.last

    # --- the order policy's keys ------------------------------------------------------

    def _key(self, i: int) -> tuple:
        """Tenant i's order key at this step: the order policy's own key function (the head
        is its first request ready now); a tenant whose first request is cooling down is
        keyed again at the next step."""
        if self.queues[i][0].ready_step > self.k:
            self.cooling.add(i)
        self.view.step_index = self.k
        return self.order_key(self.view, i)

    def _rekey(self) -> None:
        """Push the current key of every backlogged tenant whose key may have changed
        (:attr:`dirty`); an entry is current while ``key_of`` holds its key."""
        dirty = self.dirty
        if dirty:
            heap, key_of, back = self.heap, self.key_of, self.backlogged
            for i in dirty:
                if i in back:
                    key_of[i] = key = self._key(i)
                    heapq.heappush(heap, (key, i))
            dirty.clear()

    def _top(self) -> tuple[tuple, int] | None:
        """The least current (key, tenant) entry, stale entries above it dropped."""
        heap, key_of, back = self.heap, self.key_of, self.backlogged
        while heap:
            key, i = heap[0]
            if i in back and key_of.get(i) == key:
                return heap[0]
            heapq.heappop(heap)
        return None

    def _join(self, i: int) -> None:
        """Tenant i's queue went from empty to non-empty: the VTC lift (Sheng et al.,
        OSDI 2024, Algorithm 2; :meth:`tenantry.model.step.Step._on_backlogged`)."""
        if self.vtc and self.cfg.order.lift:
            self._rekey()
            top = self._top()
            lo = self.last_left if top is None else top[0][0]
            if self.counter[i] < lo:
                self.counter[i] = lo
        self.backlogged.add(i)
        self.dirty.add(i)

    def _leave(self, i: int) -> None:
        self.backlogged.discard(i)
        self.key_of.pop(i, None)

    # --- 1. cancellations and 2. arrivals ----------------------------------------------

    def _drop(self, s: FastSeq, kind: str, t_s: float, reason: str | None = None, blocks: int = 0) -> None:
        del self.live[s.request_id]
        self.gone.append(s)
        if kind == "rejected":
            self.events.append(Event("rejected", s.request_id, s.tenant, t_s, reason=reason, blocks=blocks))
        else:
            self.events.append(Event(kind, s.request_id, s.tenant, t_s, tokens=s.output_done))

    def _release(self, s: FastSeq) -> int:
        """Running sequence s (up to date) leaves the batch and frees its blocks; returns how many."""
        freed = s.blocks
        s.running = False
        del self.batch[s.entry]
        self.active.discard(s)
        self.used -= freed
        self.running_n[s.tenant] -= 1
        self.tblocks[s.tenant] -= freed
        return freed

    def _cancel(self, rid: int) -> None:
        s = self.live.get(rid)
        if s is None:  # unknown or already ended (SPEC.md 5.1)
            return
        i = s.tenant
        if s.running:
            self._materialize(s)
            self._release(s)
        else:
            q = self.queues[i]
            q.remove(s)
            if s.first_scheduled_s is None:
                self.fresh[i] -= 1
            if not q:
                self._leave(i)
                if self.vtc:
                    self.last_left = max(self.last_left, self.counter[i])
            else:
                self.dirty.add(i)
        self._drop(s, "cancelled", self.t_s)

    def _reject(self, r: Request, i: int, reason: str, retry_after_s: float | None) -> None:
        self.events.append(Event("rejected", r.request_id, i, r.arrival_s, reason=reason, retry_after_s=retry_after_s))

    def _arrive(self, r: Request) -> None:
        cfg, adm = self.cfg, self.cfg.admission
        i = self.index[r.tenant]
        tc = cfg.tenants[i]
        if r.total_tokens > cfg.max_context_tokens:
            return self._reject(r, i, "too_long", None)
        need, cap = cfg.blocks_for(r.total_tokens), self.cap[i]
        if need > cfg.num_blocks or (cap is not None and need > cap):
            return self._reject(r, i, "too_large", None)
        dt = self.t_s - self.bucket_t[i]
        if dt > 0:
            self.bucket_t[i] = self.t_s
            if tc.request_rate_per_s is not None:
                self.bucket_requests[i] = min(tc.request_burst,
                                              self.bucket_requests[i] + tc.request_rate_per_s * dt)
        limited = adm.request_rate_limit and tc.request_rate_per_s is not None
        if limited and self.bucket_requests[i] < 1.0:
            return self._reject(r, i, "rate_limit", (1.0 - self.bucket_requests[i]) / tc.request_rate_per_s)
        fresh = self.fresh[i]
        if adm.queue_bound and tc.queue_bound is not None and fresh >= tc.queue_bound:
            return self._reject(r, i, "queue_full", self.last_step_s * max(1, fresh))
        s = FastSeq(r, i, self.next_seq, self.k)
        self.next_seq += 1
        self.live[r.request_id] = s
        q = self.queues[i]
        q.append(s)
        self.fresh[i] = fresh + 1
        if limited:
            self.bucket_requests[i] -= 1.0
        self.events.append(Event("queued", r.request_id, i, r.arrival_s))
        if len(q) == 1:
            self._join(i)
        else:
            self.dirty.add(i)  # a first ready request behind cooling ones changes the head

    # --- the lazy decode ledger (as the readable step's, SPEC.md 3) --------------------------

    def _materialize(self, s: FastSeq) -> None:
        """Bring s up to date if it decodes lazily (it stops doing so)."""
        mark = s.mark
        if mark is None:
            return
        d = self.k - mark
        self.lazy_sum -= s.computed_tokens - mark
        s.computed_tokens += d
        s.output_done += d
        s.mark = None
        lazy = self.lazy
        del lazy[bisect_left(lazy, s.entry)]
        n = self.lazy_by_tenant[s.tenant] - 1
        if n:
            self.lazy_by_tenant[s.tenant] = n
        else:
            del self.lazy_by_tenant[s.tenant]
        self.active.add(s)

    def _lazify(self, s: FastSeq) -> None:
        """s, up to date after this step and in steady decode (one computed and one generated
        token a step), decodes lazily from the next step on, unless it needs a block or
        generates its last token there already."""
        mark = self.k + 1
        blocks_at = mark + s.blocks * self.cfg.block_size_tokens - s.computed_tokens
        last_at = mark + s.output - 1 - s.output_done
        due = blocks_at if blocks_at < last_at else last_at
        if due <= mark:
            return
        s.mark = mark
        self.lazy_sum += s.computed_tokens - mark
        insort(self.lazy, s.entry)
        self.lazy_by_tenant[s.tenant] = self.lazy_by_tenant.get(s.tenant, 0) + 1
        self.active.discard(s)
        d = self.due.get(due)
        if d is None:
            self.due[due] = [s]
        else:
            d.append(s)

    # --- 3. running -------------------------------------------------------------------

    def _schedule_running(self) -> None:
        """Each running sequence, in batch order, gets its next chunk or token within the
        token budget, allocating KV blocks and evicting when the pool is full.

        The lazy sequences due now (a KV block or their last token) are brought up to
        date first; the others get one token each without being read: between two
        sequences that are not lazy, the lazy ones in batch order are counted (by entry),
        and those the budget leaves out fall one step behind (their mark moves)."""
        bs, num_blocks, k = self.cfg.block_size_tokens, self.cfg.num_blocks, self.k
        growing: dict[FastSeq, bool] = {}  # lazy ones due a KV block now (not their last token) -> handled
        for s in self.due.pop(k, ()):
            mark = s.mark
            if mark is None or not s.running:
                continue
            d = k - mark
            if s.output_done + d + 1 < s.output and s.computed_tokens + d >= s.blocks * bs:
                growing[s] = False
            else:
                self._materialize(s)  # its last token (or it was listed early): treated alone
        planned: list[FastSeq] = []
        self.planned = planned
        budget = self.cfg.token_budget
        lazy = self.lazy
        taken = 0  # lazy sequences given their token so far: lazy[:taken]
        spots = self.active.union(growing) if growing else self.active
        for s in (sorted(spots, key=_entry_of) if len(spots) > 1 else tuple(spots)):
            if lazy:
                ahead = bisect_left(lazy, s.entry) - taken  # lazy ones between the last sequence and s
                if ahead > 0:
                    if ahead >= budget:
                        taken += budget if budget > 0 else 0
                        budget = 0
                        break
                    budget -= ahead
                    taken += ahead
            if budget <= 0:
                break
            if not s.running:  # evicted earlier in this loop
                continue
            if s.mark is not None:  # growing by one block: stays lazy when no eviction is needed
                growing[s] = True
                cap = self.cap[s.tenant]
                if self.used < num_blocks and (cap is None or self.tblocks[s.tenant] < cap):
                    self.used += 1
                    self.tblocks[s.tenant] += 1
                    s.blocks += 1
                    due = min(s.mark + s.blocks * bs - s.computed_tokens, s.mark + s.output - 1 - s.output_done)
                    self.due.setdefault(due, []).append(s)
                    taken += 1
                    budget -= 1
                    continue
                self._materialize(s)
            self.budget, self.taken = budget, taken
            c = s.computed_tokens
            n = s.prompt + s.output_done - c
            if n > budget:
                n = budget
            need = -(-(c + n) // bs) - s.blocks
            if need > 0:
                cap = self.cap[s.tenant]
                if need > num_blocks - self.used or (cap is not None and self.tblocks[s.tenant] + need > cap):
                    room = self._make_room(s, need)
                    budget, taken = self.budget, self.taken
                    if not room:
                        continue
                self.used += need
                self.tblocks[s.tenant] += need
                s.blocks += need
            s.planned = n
            planned.append(s)
            budget -= n
        else:  # the lazy ones after the last sequence
            rest = len(lazy) - taken
            if rest > 0 and budget > 0:
                step = rest if rest < budget else budget
                taken += step
                budget -= step
        self.budget, self.taken = budget, taken
        for s, handled in growing.items():
            if not handled and s.running:  # left out by the budget: treated alone from the next step on
                self._materialize(s)

    def _make_room(self, s: FastSeq, need: int) -> bool:
        """Evict victims until s can allocate ``need`` blocks within the pool and its tenant's
        KV cap (only its tenant's sequences are candidates while the cap is short); False if
        s was evicted itself."""
        min_free, cap, i = self.cfg.eviction.min_free_blocks, self.cap[s.tenant], s.tenant
        while True:
            pool_short = need > self.cfg.num_blocks - self.used
            cap_short = cap is not None and self.tblocks[i] + need > cap
            if not pool_short and not cap_short:
                return True
            cands = [c for c in self.batch.values()
                     if (not cap_short or c.tenant == i) and (c is s or c.blocks >= min_free)]
            view, key = self.view, self.victim_key
            victim = min(cands, key=lambda c: key(view, c))
            self._evict(victim)
            if victim is s:
                return False

    def _evict(self, v: FastSeq) -> None:
        """Sequence v is preempted by recompute, or rejected when evicted too often (SPEC.md 4.5);
        what it had planned in this step goes back to the budget."""
        if v.mark is not None:
            if bisect_left(self.lazy, v.entry) < self.taken:  # its token was counted
                self.budget += 1
                self.taken -= 1
            self._materialize(v)
        elif v.planned:
            self.budget += v.planned
            v.planned = 0
            self.planned.remove(v)
        freed = self._release(v)
        i, ev = v.tenant, self.cfg.eviction
        if ev.max_evictions is not None and v.preemptions >= ev.max_evictions:
            return self._drop(v, "rejected", self.t_s, reason="evicted_too_often", blocks=freed)
        self.events.append(Event("preempted", v.request_id, i, self.t_s, tokens=v.computed_tokens, blocks=freed))
        v.wasted_tokens += v.computed_tokens
        v.computed_tokens = v.blocks = 0
        v.preemptions += 1
        v.ready_step = self.k + 1 + ev.cooldown_steps
        q = self.queues[i]
        q.appendleft(v)
        if len(q) == 1:
            self._join(i)
        else:
            self.dirty.add(i)

    # --- 4. waiting -------------------------------------------------------------------

    def _schedule_waiting(self) -> None:
        """The order policy picks tenants whose first ready request joins the batch; a
        tenant whose head cannot go is passed over for the rest of the step."""
        max_seqs = self.cfg.max_num_seqs
        if len(self.batch) >= max_seqs or self.budget <= 0 or not self.backlogged:
            return
        blocked: list[tuple[tuple, int]] = []  # passed over for the rest of the step: out of key_of meanwhile
        while len(self.batch) < max_seqs and self.budget > 0:
            self._rekey()
            top = self._top()
            if top is None:
                break
            heapq.heappop(self.heap)
            i = top[1]
            del self.key_of[i]  # the head leaves (keyed again below), or i is blocked
            if self._admit_head(i):
                if self.queues[i]:
                    self.dirty.add(i)
                else:
                    self.backlogged.discard(i)
            else:
                blocked.append(top)
        for key, i in blocked:
            self.key_of[i] = key
            heapq.heappush(self.heap, (key, i))

    def _admit_head(self, i: int) -> bool:
        """Tenant i's first ready sequence enters the batch; False if none is ready, its
        slot cap is reached or its first chunk's blocks are not free."""
        cfg, q, k = self.cfg, self.queues[i], self.k
        s = q[0]
        idx = 0
        if s.ready_step > k:
            idx = next((j for j, x in enumerate(q) if x.ready_step <= k), -1)
            if idx < 0:
                return False
            s = q[idx]
        cap = cfg.tenants[i].max_running_seqs
        if cfg.admission.slot_cap and cap is not None and self.running_n[i] >= cap:
            return False
        n = s.prompt + s.output_done
        if n > self.budget:
            n = self.budget
        total = -(-n // cfg.block_size_tokens)
        cap = self.cap[i]
        if cap is not None and self.tblocks[i] + total > cap:
            return False
        if total > cfg.num_blocks - self.used:
            return False
        self.used += total
        del q[idx]
        s.blocks = total
        self.running_n[i] += 1
        self.tblocks[i] += total
        if s.first_scheduled_s is None:
            s.first_scheduled_s = self.t_s
            self.fresh[i] -= 1
            if self.vtc:
                o = cfg.order
                self.counter[i] = self.counter[i] + (o.w_in * s.prompt + o.w_out * 0) / self.weight[i]
        if not q and self.vtc:
            self.last_left = self.counter[i]
        s.running = True
        s.planned = n
        s.entry = self.entries
        self.entries += 1
        self.batch[s.entry] = s
        self.active.add(s)
        self.planned.append(s)
        self.budget -= n
        self.events.append(Event("scheduled", s.request_id, i, self.t_s, tokens=0))
        return True

    # --- 5. execution -----------------------------------------------------------------

    def _execute(self) -> None:
        """The batch runs: tokens advance, outputs are produced, finished sequences leave,
        VTC counters are charged for the output (SPEC.md 4.4).  The lazy sequences given a
        token are not touched; those left out by the budget fall one step behind."""
        planned, k, lazy, taken = self.planned, self.k, self.lazy, self.taken
        produced = dict(self.lazy_by_tenant) if self.vtc else None  # a lazy sequence's token is never its first or last
        batched = taken
        kv = self.lazy_sum + k * len(lazy)  # computed tokens of every lazy sequence
        if taken < len(lazy):
            batch = self.batch
            for e in lazy[taken:]:
                s = batch[e]
                kv -= s.computed_tokens - s.mark + k
                s.mark += 1
                if produced is not None:
                    produced[s.tenant] -= 1
            self.lazy_sum -= len(lazy) - taken
        for s in planned:
            batched += s.planned
            kv += s.computed_tokens
        dur = step_duration_s(self.cfg, batched, batched + kv)
        end = self.t_s + dur
        events = self.events
        for s in planned:
            c = s.computed_tokens + s.planned
            s.computed_tokens = c
            s.planned = 0
            if c == s.prompt + s.output_done:  # every known token computed: sample one
                o = s.output_done + 1
                s.output_done = o
                if s.first_token_s is None:
                    s.first_token_s = end
                    events.append(Event("first_token", s.request_id, s.tenant, end))
                if produced is not None:
                    produced[s.tenant] = produced.get(s.tenant, 0) + 1
                if o == s.output:
                    self._release(s)
                    self._drop(s, "finished", end)
                    continue
            if c == s.prompt + s.output_done - 1 and s.first_token_s is not None:
                self._lazify(s)  # steady decode: one token a step from now on
        if produced:
            w_out, counter, weight = self.cfg.order.w_out, self.counter, self.weight
            for i, n in produced.items():
                if n:
                    counter[i] = counter[i] + w_out * n / weight[i]
                    self.dirty.add(i)
        self.t_s = end
        self.last_step_s = dur


def _entry_of(s: FastSeq) -> int:
    return s.entry
