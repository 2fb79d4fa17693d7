"""The common parts of the planted-fault schedulers: written once, used by all.

A small continuous-batching scheduler in the shape of a production one (vLLM
v1's scheduler in miniature, like ``examples/minisched``), with the knobs the
faults need:

* :class:`BlockPool`: KV blocks handed out by id; with ``prefix_cache`` on, full
  prompt blocks are registered under a key chained over the tenant's salt and
  the prompt's content ids, shared by reference count, and kept (free but
  reusable) when nobody references them, reclaimed least recently released first;
* :class:`Seq`: one request as the scheduler sees it;
* :class:`Scheduler`: per-tenant FIFO queues; admission (``too_long``,
  ``too_large``, a request-rate bucket, a token bucket, a queue bound); a step
  that first advances the running batch (chunked prefill, one decode token per
  sequence) and preempts by recompute when blocks run out (the most recently
  started sequence first; ``max_evictions`` and a cooldown), then admits waiting
  requests by an order policy (``fcfs``, ``priority``, ``round_robin``, ``vtc``);
* :class:`Setup`, :class:`Adapter` and :func:`factory`: the tenantry adapter
  (``tenantry.verify.protocol``) and the claims a setup makes.

Every method a fault overrides is small and named for what it does; each fault
module subclasses :class:`Scheduler` (or :class:`Adapter`) and replaces one of
them with the bug.  Without an override the scheduler is correct for every
claim a :class:`Setup` can make (``tests/test_faults.py`` runs the fixed twin
of every fault on its witness workload).

Deterministic: no wall clock, no random state, no iteration over sets or
string-keyed hashes in a decision; time is the harness's clock (the end of the
last step, or the arrival when the replica was idle).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable, Iterable

from tenantry.model.config import (
    AdmissionConfig, Config, CostConfig, EvictionConfig, OrderConfig, TenantConfig,
)
from tenantry.verify.protocol import Claims, Plan, Rejection, Scheduled, StepResults

WAITING, RUNNING, ENDED = "waiting", "running", "ended"

#: Step times of a slow accelerator (as minisched's): a step lasts 27 ms and more,
#: so a 16-s adversary scenario is a few hundred steps.
COST = CostConfig(weight_read_s=0.025, kv_read_s_per_token=1e-6, flop_s_per_token=1.2e-4, overhead_s=0.002)


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens (ceiling division)."""
    return -(-tokens // block_size)


# --- the KV pool ------------------------------------------------------------------------


class BlockPool:
    """A fixed pool of KV blocks ``0..num_blocks-1``, with an optional prefix cache.

    ``allocate`` takes never-cached free blocks first, then reclaims cached
    blocks nobody references (least recently released first).  ``num_free``
    counts both: a cached block with no reference is free.

    Args:
        num_blocks: blocks in the pool.
        prefix_cache: keep full prompt blocks under their content key.
    """

    def __init__(self, num_blocks: int, prefix_cache: bool = False) -> None:
        self.num_blocks = num_blocks
        self.prefix_cache = prefix_cache
        self._free: collections.deque[int] = collections.deque(range(num_blocks))
        self.refs: dict[int, int] = {}
        self.cache: dict[tuple, int] = {}        # content key -> block id
        self.key_of: dict[int, tuple] = {}       # block id -> content key
        self.retained: collections.OrderedDict[int, None] = collections.OrderedDict()  # cached, unreferenced

    @property
    def num_free(self) -> int:
        """Blocks that an allocation can take (never-cached free ones plus cached unreferenced ones)."""
        return len(self._free) + len(self.retained)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh block ids (reference count 1), or None when fewer are free (nothing taken then)."""
        if n > self.num_free:
            return None
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.popleft()
            else:
                b, _ = self.retained.popitem(last=False)
                del self.cache[self.key_of.pop(b)]
            self.refs[b] = 1
            out.append(b)
        return out

    def free(self, ids: Iterable[int]) -> None:
        """Drop one reference to each block; a block left unreferenced is free (kept if cached)."""
        for b in ids:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                del self.refs[b]
                if b in self.key_of:
                    self.retained[b] = None
                else:
                    self._free.append(b)

    def lookup(self, keys: list[tuple]) -> list[int]:
        """The blocks of the longest cached prefix of ``keys``, each referenced once more."""
        hits = []
        for k in keys:
            b = self.cache.get(k)
            if b is None:
                break
            if b in self.retained:
                del self.retained[b]
                self.refs[b] = 1
            else:
                self.refs[b] += 1
            hits.append(b)
        return hits

    def register(self, key: tuple, block: int) -> None:
        """Keep ``block`` under ``key`` (when neither is cached yet)."""
        if self.prefix_cache and key not in self.cache and block not in self.key_of:
            self.cache[key] = block
            self.key_of[block] = key


# --- requests -------------------------------------------------------------------------------


@dataclass
class Seq:
    """One request as the scheduler sees it.

    ``max_tokens`` is the output allowance the client declared (used only at
    admission, as an API server checks ``prompt + max_tokens``); the scheduler
    learns that a request ended from the results, as it would from a stop token.
    """

    rid: int
    tenant: str
    prompt: int
    max_tokens: int
    arrival_s: float
    order: int = 0                    # admission number: FCFS order
    prefix_ids: tuple = ()
    computed: int = 0                 # tokens whose KV exists
    output: int = 0                   # tokens generated
    block_ids: list[int] = field(default_factory=list)
    status: str = WAITING
    ever_scheduled: bool = False
    preemptions: int = 0
    ready_step: int = 0
    registered: int = 0               # prompt blocks offered to the prefix cache so far

    @property
    def target(self) -> int:
        """Tokens whose KV must exist before the next token is sampled (recompute after preemption)."""
        return self.prompt + self.output


@dataclass
class StepOut:
    """One step's decisions: (request id, tokens, computed before) in batch order; evictions in
    the order made; refusals as (request id, reason)."""

    batch: list[tuple[int, int, int]] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)


class TokenBucket:
    """``rate`` per second up to ``burst``, refilled lazily at each look (a leaky bucket's twin)."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst, self.level, self.t_s = rate, burst, float(burst), 0.0

    def refill(self, now_s: float) -> float:
        """The level at ``now_s`` (seconds on the scheduler's clock)."""
        if now_s > self.t_s:
            self.level = min(self.burst, self.level + self.rate * (now_s - self.t_s))
            self.t_s = now_s
        return self.level


# --- the scheduler --------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """How a scheduler is built and what its adapter claims.

    Attributes:
        num_blocks, block_size, max_num_seqs, token_budget, max_context_tokens: the
            replica's limits (blocks, tokens per block, sequences, tokens per step, tokens).
        policy: order of waiting requests: ``fcfs`` (oldest first, across tenants),
            ``priority`` (lowest tier number first, then oldest), ``round_robin``
            (one request per tenant per turn), ``vtc`` (least virtual token counter,
            lifted on joining the backlog).
        w_in, w_out: counter charge per prompt and per generated token (``vtc``).
        prefix_cache: ``off`` or ``salted`` (keys chained over the tenant's name).
        max_evictions, cooldown_steps: preemption hysteresis (None: unbounded).
        queue_bound: most never-scheduled requests per tenant (None: unbounded).
        request_rate: (requests per second, burst) per tenant, or None.
        token_rate: (tokens per second, burst) per tenant, or None.
        reserve_output: the token bucket takes each request's output allowance
            (``max_tokens``) at admission with its prompt, gives back what a request
            that leaves early did not generate, and is not charged as tokens are
            produced (SPEC.md 4.2).
        waits: tenant name -> the wait (seconds from arrival to the first scheduling)
            promised to that tenant's requests (the BOUNDED-WAIT claim); others: none.
        tiers: tenant name -> tier for named tenants (others: ``default_tier``), or
            None to keep the tiers the harness gives.
        invariants: claim-level invariant ids asserted.
        describe: one line for reports.
    """

    num_blocks: int = 384
    block_size: int = 16
    max_num_seqs: int = 8
    token_budget: int = 256
    max_context_tokens: int = 131_072
    policy: str = "fcfs"
    w_in: float = 1.0
    w_out: float = 2.0
    prefix_cache: str = "off"
    max_evictions: int | None = None
    cooldown_steps: int = 0
    queue_bound: int | None = None
    request_rate: tuple[float, float] | None = None
    token_rate: tuple[float, float] | None = None
    reserve_output: bool = False
    waits: tuple[tuple[str, float], ...] = ()
    tiers: tuple[tuple[str, int], ...] | None = None
    default_tier: int = 1
    invariants: tuple[str, ...] = ("WORK-CONSERVING",)
    describe: str = ""

    def tenant(self, given: TenantConfig) -> TenantConfig:
        """The configuration this setup gives a tenant the harness names."""
        tier = given.tier if self.tiers is None else dict(self.tiers).get(given.name, self.default_tier)
        wait = dict(self.waits).get(given.name)
        rr = self.request_rate or (None, None)
        tr = self.token_rate or (None, None)
        return TenantConfig(given.name, weight=given.weight, tier=tier, queue_bound=self.queue_bound,
                            request_rate_per_s=rr[0], request_burst=rr[1], token_rate_per_s=tr[0],
                            token_burst_tokens=tr[1], max_wait_s=wait)

    def config(self, tenants: tuple[TenantConfig, ...]) -> Config:
        """The claimed replica for these tenants."""
        return Config(
            tenants=tenants, block_size_tokens=self.block_size, num_blocks=self.num_blocks,
            max_num_seqs=self.max_num_seqs, token_budget=self.token_budget,
            max_context_tokens=self.max_context_tokens, prefix_cache=self.prefix_cache,
            order=OrderConfig(policy=self.policy, w_in=self.w_in, w_out=self.w_out),
            admission=AdmissionConfig(queue_bound=self.queue_bound is not None,
                                      request_rate_limit=self.request_rate is not None,
                                      token_bucket=self.token_rate is not None, kv_cap=False,
                                      reserve_output=self.reserve_output),
            eviction=EvictionConfig(victim="newest", max_evictions=self.max_evictions,
                                    cooldown_steps=self.cooldown_steps),
            cost=COST)


class Scheduler:
    """Continuous batching with chunked prefill, recompute preemption and per-tenant queues.

    The prefix cache keeps the blocks a request completes while it stays running;
    the blocks it completes in the step it finishes are freed uncached
    (``cache_at_finish = False``; caching those too, ``fp_cache_at_finish``, is
    just as correct).

    Args:
        setup: limits and policies (:class:`Setup`).
        tenants: the tenants' configurations (tier, weight, limits); a request of a
            tenant not listed gets the defaults.
    """

    #: Cache the prompt blocks a request completes in the step it finishes.
    cache_at_finish = False

    def __init__(self, setup: Setup, tenants: Iterable[TenantConfig]) -> None:
        self.setup = s = setup
        self.B = s.block_size
        self.pool = BlockPool(s.num_blocks, prefix_cache=s.prefix_cache != "off")
        self.tenants: dict[str, TenantConfig] = {t.name: t for t in tenants}
        self.queues: dict[str, collections.deque[Seq]] = {n: collections.deque() for n in self.tenants}
        self.seqs: dict[int, Seq] = {}
        self.running: list[Seq] = []
        self.step_index = 0
        self.next_order = 0
        self.rate_buckets: dict[str, TokenBucket] = {}
        self.token_buckets: dict[str, TokenBucket] = {}
        self.counters: dict[str, float] = {n: 0.0 for n in self.tenants}
        self.last_left = 0.0                 # counter of the last tenant whose queue emptied by service
        self.emptied_by_cancel: dict[str, float] = {}   # this step: tenant -> counter when a cancel emptied it
        self.rr_next = 0
        for t in self.tenants.values():
            self._buckets_for(t)

    # --- tenants -----------------------------------------------------------------------

    def tenant(self, name: str) -> TenantConfig:
        """A tenant's configuration (registered with defaults on first sight)."""
        t = self.tenants.get(name)
        if t is None:
            t = self.tenants[name] = TenantConfig(name)
            self.queues[name] = collections.deque()
            self.counters[name] = 0.0
            self._buckets_for(t)
        return t

    def _buckets_for(self, t: TenantConfig) -> None:
        if t.request_rate_per_s is not None:
            self.rate_buckets[t.name] = TokenBucket(t.request_rate_per_s, t.request_burst)
        if t.token_rate_per_s is not None:
            self.token_buckets[t.name] = TokenBucket(t.token_rate_per_s, t.token_burst_tokens)

    # --- requests in and out -------------------------------------------------------------

    def add_request(self, seq: Seq, now_s: float) -> str | None:
        """Admit ``seq`` at ``now_s`` (queued at its tenant's tail) or return the 429 reason."""
        self.tenant(seq.tenant)
        reason = self.admission_check(seq, now_s)
        if reason is not None:
            return reason
        self.charge_admission(seq, now_s)
        seq.order = self.next_order
        self.next_order += 1
        self.seqs[seq.rid] = seq
        self.enqueue(seq, front=False)
        return None

    def admission_check(self, seq: Seq, now_s: float) -> str | None:
        """The first admission check ``seq`` fails, in the API server's order, or None."""
        total = seq.prompt + seq.max_tokens
        if total > self.setup.max_context_tokens:
            return "too_long"
        if self.blocks(total) > self.setup.num_blocks:
            return "too_large"
        if seq.tenant in self.rate_buckets and self.rate_buckets[seq.tenant].refill(now_s) < 1.0:
            return "rate_limit"
        if seq.tenant in self.token_buckets:
            b, charge = self.token_buckets[seq.tenant], self.token_charge(seq)
            if charge > b.burst or b.refill(now_s) < charge:
                return "token_bucket"
        bound = self.tenant(seq.tenant).queue_bound
        if bound is not None and self.fresh_queued(seq.tenant) >= bound:
            return "queue_full"
        return None

    def token_charge(self, seq: Seq) -> int:
        """Tokens ``seq`` takes from its token bucket at admission: its prompt, and its output
        allowance too under ``reserve_output``."""
        return seq.prompt + (seq.max_tokens if self.setup.reserve_output else 0)

    def charge_admission(self, seq: Seq, now_s: float) -> None:
        """Take one request from the tenant's rate bucket and :meth:`token_charge` from its token bucket."""
        if seq.tenant in self.rate_buckets:
            self.rate_buckets[seq.tenant].level -= 1.0
        if seq.tenant in self.token_buckets:
            self.token_buckets[seq.tenant].level -= self.token_charge(seq)

    def refund_reservation(self, seq: Seq) -> None:
        """``seq`` leaves before its last token: under ``reserve_output`` its bucket gets back
        the output it did not generate (capped at the burst)."""
        if self.setup.reserve_output and seq.tenant in self.token_buckets:
            b = self.token_buckets[seq.tenant]
            b.level = min(b.burst, b.level + seq.max_tokens - seq.output)

    def fresh_queued(self, tenant: str) -> int:
        """The tenant's queued requests that were never scheduled."""
        return sum(1 for s in self.queues[tenant] if not s.ever_scheduled)

    def abort_request(self, rid: int) -> None:
        """The client cancelled ``rid``: it leaves the batch or its queue, its blocks are freed."""
        seq = self.seqs.pop(rid, None)
        if seq is None:
            return
        self.refund_reservation(seq)
        if seq.status == RUNNING:
            self.running.remove(seq)
            self.release(seq)
        elif seq.status == WAITING:
            q = self.queues[seq.tenant]
            q.remove(seq)
            if not q:
                self.emptied_by_cancel[seq.tenant] = self.counters[seq.tenant]
        seq.status = ENDED

    # --- one step ------------------------------------------------------------------------------

    def schedule(self, step_index: int) -> StepOut:
        """The step's batch: running sequences first (in the order they entered), then waiting ones."""
        self.step_index = step_index
        out = StepOut()
        budget = self.schedule_running(out, self.setup.token_budget)
        self.schedule_waiting(out, budget)
        self.emptied_by_cancel = {}
        return out

    def schedule_running(self, out: StepOut, budget: int) -> int:
        """Each running sequence gets its next chunk or decode token while budget lasts
        (preempting when the pool is short); returns the budget left."""
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self.chunk(seq, budget)
            if not self.grow(seq, n, out):
                continue  # seq itself was evicted: running[i] is now the next one
            out.batch.append((seq.rid, n, seq.computed))
            budget -= n
            i += 1
        return budget

    def chunk(self, seq: Seq, budget: int) -> int:
        """Tokens ``seq`` computes this step: what it has left, up to the budget left."""
        return min(seq.target - seq.computed, budget)

    def schedule_waiting(self, out: StepOut, budget: int) -> int:
        """Admit waiting requests into the batch while seats and budget last; a tenant
        whose next request does not fit is passed over for the rest of the step."""
        blocked: list[str] = []
        while budget > 0 and self.seats_free():
            seq = self.pick(blocked)
            if seq is None:
                break
            n = self.start(seq, budget, out)
            if n == 0:
                blocked.append(seq.tenant)
                continue
            budget -= n
        return budget

    def seats_free(self) -> bool:
        """A sequence can still join the batch (fewer than max_num_seqs run)."""
        return len(self.running) < self.setup.max_num_seqs

    def head(self, tenant: str) -> Seq | None:
        """The tenant's next request: the first in its queue that is ready (past its cooldown)."""
        return next((s for s in self.queues[tenant] if s.ready_step <= self.step_index), None)

    def candidates(self, blocked: list[str]) -> list[Seq]:
        """The ready heads of the tenants not passed over in this step, in tenant order."""
        out = []
        for name in self.queues:
            if name not in blocked:
                h = self.head(name)
                if h is not None:
                    out.append(h)
        return out

    def pick(self, blocked: list[str]) -> Seq | None:
        """The next request to start, by the setup's order policy."""
        heads = self.candidates(blocked)
        if not heads:
            return None
        policy = self.setup.policy
        if policy == "fcfs":
            return min(heads, key=lambda s: s.order)
        if policy == "priority":
            return min(heads, key=lambda s: (self.tenant(s.tenant).tier, s.order))
        if policy == "vtc":
            return min(heads, key=lambda s: (self.counters[s.tenant], s.order))
        if policy == "round_robin":
            names = list(self.queues)
            ready = {s.tenant: s for s in heads}
            for k in range(len(names)):
                name = names[(self.rr_next + k) % len(names)]
                if name in ready:
                    return ready[name]
        raise ValueError(f"unknown policy {policy!r}")

    def start(self, seq: Seq, budget: int, out: StepOut) -> int:
        """Move ``seq`` from its queue into the batch with its first chunk; the chunk's
        size, or 0 when its blocks are not free (new work never preempts)."""
        hits = self.pool.lookup(self.cache_keys(seq)[: self.reusable_blocks(seq)]) if self.pool.prefix_cache else []
        computed = len(hits) * self.B
        n = self.first_chunk(seq, computed, budget)
        new = self.pool.allocate(self.blocks(computed + n) - len(hits))
        if new is None:
            self.pool.free(hits)
            return 0
        self.queues[seq.tenant].remove(seq)
        seq.block_ids, seq.computed, seq.status, seq.registered = hits + new, computed, RUNNING, len(hits)
        if not seq.ever_scheduled:
            seq.ever_scheduled = True
            self.charge(seq.tenant, self.setup.w_in * seq.prompt)
        if not self.queues[seq.tenant]:
            self.last_left = self.counters[seq.tenant]
        names = list(self.queues)
        self.rr_next = (names.index(seq.tenant) + 1) % len(names)
        self.running.append(seq)
        out.batch.append((seq.rid, n, computed))
        return n

    def reusable_blocks(self, seq: Seq) -> int:
        """Leading prompt blocks a cache hit may cover: the full blocks before the last prompt
        token, which is always computed (its logits give the first output token)."""
        return (seq.target - 1) // self.B

    def first_chunk(self, seq: Seq, computed: int, budget: int) -> int:
        """Tokens a request entering the batch computes in this step (after ``computed`` cached ones)."""
        return min(seq.target - computed, budget)

    def grow(self, seq: Seq, n: int, out: StepOut) -> bool:
        """Give ``seq`` the blocks for ``n`` more tokens, evicting as needed; False if
        ``seq`` itself was evicted."""
        need = self.blocks(seq.computed + n) - len(seq.block_ids)
        while need > 0:
            new = self.pool.allocate(need)
            if new is not None:
                seq.block_ids.extend(new)
                return True
            victim = self.choose_victim(seq)
            self.evict(victim, out)
            if victim is seq:
                return False
        return True

    def choose_victim(self, seq: Seq) -> Seq:
        """The sequence to evict for ``seq``: the one that started running last."""
        return self.running[-1]

    def evict(self, victim: Seq, out: StepOut) -> None:
        """Preempt by recompute (back to the front of its queue, ready after the cooldown),
        or reject it ``evicted_too_often`` once it was evicted max_evictions times."""
        self.running.remove(victim)
        self.release(victim)
        out.preempted.append(victim.rid)
        if self.evicted_too_often(victim):
            out.rejected.append((victim.rid, "evicted_too_often"))
            self.refund_reservation(victim)
            self.seqs.pop(victim.rid, None)
            victim.status = ENDED
            return
        victim.preemptions += 1
        victim.computed = 0
        victim.ready_step = self.ready_after_eviction()
        self.enqueue(victim, front=True)

    def evicted_too_often(self, victim: Seq) -> bool:
        """The victim was evicted max_evictions times already: it is rejected instead."""
        k = self.setup.max_evictions
        return k is not None and victim.preemptions >= k

    def ready_after_eviction(self) -> int:
        """The first step an evicted sequence may run again: after the cooldown."""
        return self.step_index + 1 + self.setup.cooldown_steps

    def release(self, seq: Seq) -> None:
        """Return ``seq``'s blocks to the pool."""
        self.pool.free(seq.block_ids)
        seq.block_ids = []

    def enqueue(self, seq: Seq, front: bool) -> None:
        """Put ``seq`` in its tenant's queue (a tenant joining the backlog is lifted first)."""
        q = self.queues[seq.tenant]
        if not q:
            self.lift(seq.tenant)
        seq.status = WAITING
        if front:
            q.appendleft(seq)
        else:
            q.append(seq)

    def lift(self, tenant: str) -> None:
        """VTC's counter lift (Sheng et al., OSDI 2024, Alg. 2): a tenant joining the backlog
        starts at the least counter of the others backlogged, or of those a cancellation
        emptied in this step, or at the counter of the last tenant served empty."""
        others = [self.counters[t] for t, q in self.queues.items() if q and t != tenant]
        if not others:
            others = [c for t, c in self.emptied_by_cancel.items() if t != tenant] or [self.last_left]
        self.counters[tenant] = max(self.counters[tenant], min(others))

    def charge(self, tenant: str, cost: float) -> None:
        """Add weighted tokens to the tenant's virtual counter."""
        self.counters[tenant] += cost / self.tenant(tenant).weight

    # --- results -----------------------------------------------------------------------------

    def update(self, out: StepOut, tokens: Iterable[int], finished: Iterable[int]) -> None:
        """Apply a step: each batch entry computed its tokens, ``tokens`` got one output
        token each, ``finished`` are done and leave."""
        leaving = set(finished)
        for rid, n, _ in out.batch:
            seq = self.seqs.get(rid)
            if seq is not None and seq.status == RUNNING:
                seq.computed += n
                if rid not in leaving or self.cache_at_finish:
                    self.register_blocks(seq)
        for rid in tokens:
            seq = self.seqs[rid]
            seq.output += 1
            self.charge_output(seq)
        for rid in finished:
            self.finish(self.seqs.pop(rid))

    def charge_output(self, seq: Seq) -> None:
        """A generated token: charged to the counter, and to the token bucket unless it was reserved."""
        self.charge(seq.tenant, self.setup.w_out)
        if seq.tenant in self.token_buckets and not self.setup.reserve_output:
            self.token_buckets[seq.tenant].level -= 1

    def finish(self, seq: Seq) -> None:
        """A finished sequence leaves the batch and frees its blocks."""
        self.running.remove(seq)
        self.release(seq)
        seq.status = ENDED

    # --- blocks and the prefix cache -------------------------------------------------------------

    def held(self, seq: Seq) -> tuple[int, ...]:
        """The block ids ``seq`` holds (its block table)."""
        return tuple(seq.block_ids)

    def reported_free(self) -> int:
        """Free blocks as the scheduler reports them (its metrics endpoint)."""
        return self.pool.num_free

    def blocks(self, tokens: int) -> int:
        """Blocks for ``tokens`` tokens."""
        return blocks_for(tokens, self.B)

    def cache_keys(self, seq: Seq) -> list[tuple]:
        """Content keys of ``seq``'s cacheable prompt blocks: a chain over its tenant's salt
        and the prompt's content ids (whole blocks only)."""
        keys, key = [], ("salt", seq.tenant)
        for j in range(min(len(seq.prefix_ids), seq.prompt // self.B)):
            key = (key, seq.prefix_ids[j])
            keys.append(key)
        return keys

    def register_blocks(self, seq: Seq) -> None:
        """Offer ``seq``'s newly completed cacheable prompt blocks to the prefix cache."""
        if not self.pool.prefix_cache:
            return
        keys = self.cache_keys(seq)
        done = min(seq.computed // self.B, len(keys))
        for j in range(seq.registered, done):
            self.pool.register(keys[j], seq.block_ids[j])
        seq.registered = max(seq.registered, done)


# --- the tenantry adapter --------------------------------------------------------------------


class Adapter:
    """A :class:`Scheduler` behind the tenantry adapter protocol (``tenantry.verify.protocol``).

    Reports each running request's block ids, the pool's free blocks and the
    virtual counters (under ``vtc``).  Its clock is the harness's: the end of the
    last step, or a request's arrival when the replica was idle.
    """

    def __init__(self, scheduler: Scheduler, claims: Claims) -> None:
        self.sched, self.claims = scheduler, claims
        self.now_s = 0.0
        self.step_index = 0
        self._last: StepOut | None = None

    def add_request(self, request) -> str | None:
        """Admit or refuse (a 429 reason)."""
        seq = Seq(request.request_id, request.tenant, request.prompt_tokens, request.output_tokens,
                  request.arrival_s, prefix_ids=tuple(request.prefix_ids))
        return self.sched.add_request(seq, max(self.now_s, request.arrival_s))

    def abort_request(self, request_id: int) -> None:
        """The client cancelled."""
        self.sched.abort_request(request_id)

    def plan_step(self, t_s: float) -> Plan:
        """The scheduler's decisions for the step starting at ``t_s``."""
        self.now_s = t_s
        out = self._last = self.sched.schedule(self.step_index)
        return self.plan(out)

    def plan(self, out: StepOut) -> Plan:
        """A step's decisions as a :class:`Plan` (blocks as ids, free blocks, counters)."""
        s = self.sched
        batch = tuple(Scheduled(rid, n, c) for rid, n, c in out.batch)
        rejected = tuple(Rejection(rid, why) for rid, why in out.rejected)
        blocks = {q.rid: s.held(q) for q in s.running}
        counters = dict(s.counters) if s.setup.policy == "vtc" else {}
        return Plan(batch=batch, preempted=tuple(out.preempted), rejected=rejected, blocks=blocks,
                    free_blocks=s.reported_free(), counters=counters)

    def take_results(self, results: StepResults) -> None:
        """Apply the step's tokens and finishes."""
        self.now_s = results.start_s + results.duration_s
        self.step_index = results.step_index + 1
        self.sched.update(self._last, results.tokens, results.finished)

    def accounting(self) -> tuple[dict[str, float], dict[str, float]]:
        """The counters after the step's results (output is charged as it comes back)."""
        s = self.sched
        return (dict(s.counters) if s.setup.policy == "vtc" else {}), {}


def build(scheduler_cls: type[Scheduler], setup: Setup, tenants: Iterable[TenantConfig] = (),
          adapter_cls: type[Adapter] = Adapter) -> Adapter:
    """An adapter over a fresh ``scheduler_cls`` for ``tenants`` under ``setup``."""
    given = tuple(tenants) or (TenantConfig("default"),)
    configs = tuple(setup.tenant(t) for t in given)
    claims = Claims(setup.config(configs), invariants=setup.invariants,
                    describe=setup.describe or scheduler_cls.__name__)
    return adapter_cls(scheduler_cls(setup, configs), claims)


def factory(scheduler_cls: type[Scheduler], setup: Setup, adapter_cls: type[Adapter] = Adapter,
            fixed: type[Scheduler] = Scheduler) -> Callable[..., Adapter]:
    """A ``make_scheduler(tenants=())`` factory for ``tenantry verify --target``.

    ``fixed`` is the scheduler with the fault removed (default: the plain
    :class:`Scheduler`), used by :func:`fixed_twin`.
    """

    def make_scheduler(tenants: tuple[TenantConfig, ...] = ()) -> Adapter:
        return build(scheduler_cls, setup, tenants, adapter_cls)

    make_scheduler.__doc__ = (f"A fresh {scheduler_cls.__name__} behind the tenantry adapter, for the "
                              "tenants the harness names.")
    make_scheduler.scheduler_cls, make_scheduler.setup, make_scheduler.fixed = scheduler_cls, setup, fixed
    return make_scheduler


def fixed_twin(make_scheduler: Callable[..., Adapter]) -> Callable[..., Adapter]:
    """The same setup and claims with the fault removed (the plain adapter over the fixed scheduler)."""
    return factory(make_scheduler.fixed, make_scheduler.setup)
