"""The state of the reference model: immutable records, grouped so that what a
step leaves unchanged is visible (SPEC.md section 3).

``State`` holds the clock, the per-tenant records (queue and accounting), the
running sequences and the KV pool.  Nothing here is mutated after it is built:
:func:`tenantry.model.step.step` returns a new ``State``.  The dicts inside
(``KVPool.refs``, ``KVPool.retained``) are treated as immutable values: the
step copies them before any change.
"""

from __future__ import annotations

import hashlib
from typing import Iterator, NamedTuple

import attrs

from .config import Config
from .workload import Request


class Sequence(NamedTuple):
    """A request once admitted: waiting in its tenant's queue, or running.

    An immutable named tuple: the step builds a changed copy with ``_replace``.

    The KV it holds is ``shared_keys`` (prefix-cache blocks, in order, a prefix
    of ``prefix_keys``) plus ``private_blocks``; together they are
    ``blocks_for(computed_tokens)`` while running, and nothing while waiting.

    Attributes:
        request: the request as offered.
        tenant: index of its tenant in ``Config.tenants``.
        arrival_seq: global admission order (FCFS key; smaller came first).
        admitted_step: step index at which it entered its queue.
        prefix_keys: prefix-cache key of each cacheable prompt block (empty when
            the cache is off); a chain hash of the salt and the block contents.
        computed_tokens: tokens whose KV is computed (prompt and generated).
        output_done: output tokens generated so far.
        shared_keys: cache keys of the leading blocks it references.
        private_blocks: blocks it holds that are not in the cache.
        preemptions: times evicted; wasted_tokens: computed tokens discarded.
        ready_step: not scheduled before this step (readmit cooldown).
        charged_prompt_tokens: prompt tokens already charged to the tenant's
            token bucket (the byte estimate until first scheduled).
        predicted_charge: output tokens charged ahead by ``vtc_predict`` and
            not yet matched by real tokens.
        first_scheduled_s, first_token_s: seconds, or None.
        cached_tokens: prompt tokens served from the prefix cache (cumulative).
    """

    request: Request
    tenant: int
    arrival_seq: int
    admitted_step: int
    prefix_keys: tuple[int, ...] = ()
    computed_tokens: int = 0
    output_done: int = 0
    shared_keys: tuple[int, ...] = ()
    private_blocks: int = 0
    preemptions: int = 0
    wasted_tokens: int = 0
    ready_step: int = 0
    charged_prompt_tokens: int = 0
    predicted_charge: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    cached_tokens: int = 0

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def blocks_held(self) -> int:
        """KV blocks referenced by this sequence (shared ones count once here)."""
        return len(self.shared_keys) + self.private_blocks

    @property
    def target_tokens(self) -> int:
        """Tokens that must be computed before the next output token: prompt + generated."""
        return self.request.prompt_tokens + self.output_done

    @property
    def never_scheduled(self) -> bool:
        return self.first_scheduled_s is None


def running_ids(state: "State") -> tuple[int, ...]:
    """The request ids running in ``state``, in batch order."""
    return tuple(s.request.request_id for s in state.running)


class TenantState(NamedTuple):
    """One tenant's queue and accounting (an immutable named tuple).

    Attributes:
        queue: waiting sequences; preempted ones go back to the front.
        counter: VTC virtual counter (weighted tokens / weight).
        deficit: DRR deficit (weighted tokens or block-seconds, by policy).
        service: cumulative weighted service received (w_in * prompt tokens
            charged at first scheduling + w_out * output tokens), unnormalised.
        block_seconds: cumulative KV block-seconds held.
        bucket_tokens: token-bucket level (tokens; may go negative as generated
            tokens are charged); bucket_requests: request-rate bucket (requests);
            bucket_t_s: time the buckets were last refilled (seconds).
        running: number of its sequences running; blocks: KV blocks its running
            sequences reference (a block shared by k of them counts k times).
        fresh_queued: queued sequences never scheduled (what the queue bound counts).
        skips: the skip budget's count (``order.guard_skips``, SPEC.md 4.3): picks
            made past this tenant in its backlog period while it was not a
            candidate and had the lower counter; a join sets it (to the count of a
            backlogged tenant at or below its lifted counter, or the last leaver's),
            so it is read only while the tenant is backlogged.  0 without a budget.
    """

    queue: tuple[Sequence, ...] = ()
    counter: float = 0.0
    deficit: float = 0.0
    service: float = 0.0
    block_seconds: float = 0.0
    bucket_tokens: float = 0.0
    bucket_requests: float = 0.0
    bucket_t_s: float = 0.0
    running: int = 0
    blocks: int = 0
    fresh_queued: int = 0
    skips: int = 0

    @property
    def backlogged(self) -> bool:
        """Has queued work (SPEC.md 3: 'backlogged' means a non-empty queue)."""
        return bool(self.queue)


@attrs.frozen(slots=True)
class KVPool:
    """The KV block pool.

    Attributes:
        used_blocks: blocks referenced by some running sequence.
        refs: cache key -> number of running sequences referencing that block.
        retained: cache keys of unreferenced blocks still holding content, oldest
            first (free blocks, reclaimed least recently used first).
        key_salt: cache key -> the salt it was registered under (for checks).
    """

    used_blocks: int = 0
    refs: dict = attrs.field(factory=dict)
    retained: dict = attrs.field(factory=dict)
    key_salt: dict = attrs.field(factory=dict)


@attrs.frozen(slots=True)
class State:
    """The whole model state between two steps.

    Attributes:
        step_index: index of the next step (0 before the first).
        t_s: time the next step starts (seconds).
        last_step_s: duration of the previous step (seconds; before the first,
            the empty step's, :attr:`~tenantry.model.config.CostConfig.empty_step_s`).
        tenants: per-tenant records, indexed like ``Config.tenants``.
        running: running sequences in the order they entered the batch.
        kv: the KV pool.
        next_arrival_seq: next global admission number.
        rr_next: round robin's next tenant index.
        tier_counters: per-tier counters of the ``floors`` policy.
        last_left_counter, last_left_tier_counter: the counter of the last
            tenant (and the tier counter of the last tier) whose queue emptied;
            the lift for a tenant (tier) that becomes backlogged while no other
            is (Sheng et al., OSDI 2024, Algorithm 2, variable l).
        last_left_skips: that tenant's skip count when its queue emptied (the
            skip budget, SPEC.md 4.3: a joiner lifted to ``last_left_counter``
            takes it with the counter).
        tier_skips, last_left_tier_skips: the same per tier under ``floors`` with a
            skip budget (empty otherwise: read as zeros).
    """

    step_index: int
    t_s: float
    last_step_s: float
    tenants: tuple[TenantState, ...]
    running: tuple[Sequence, ...] = ()
    kv: KVPool = attrs.field(factory=KVPool)
    next_arrival_seq: int = 0
    rr_next: int = 0
    tier_counters: tuple[float, ...] = ()
    last_left_counter: float = 0.0
    last_left_tier_counter: float = 0.0
    last_left_skips: int = 0
    tier_skips: tuple[int, ...] = ()
    last_left_tier_skips: int = 0

    def backlogged(self) -> frozenset[int]:
        """Indices of the backlogged tenants: those with a non-empty queue."""
        return frozenset(i for i, t in enumerate(self.tenants) if t.queue)

    def sequences(self) -> Iterator[Sequence]:
        """Every admitted sequence: running first, then each tenant's queue."""
        yield from self.running
        for t in self.tenants:
            yield from t.queue


def free_blocks(config: Config, state: State) -> int:
    """Free KV blocks (cached-but-unreferenced blocks count as free)."""
    return config.num_blocks - state.kv.used_blocks


def initial_state(config: Config) -> State:
    """The empty replica at time 0: every queue empty, buckets full, pool free."""
    tenants = tuple(
        TenantState(
            bucket_tokens=float(t.token_burst_tokens or 0.0),
            bucket_requests=float(t.request_burst or 0.0),
        )
        for t in config.tenants
    )
    ntiers = max(t.tier for t in config.tenants) + 1
    return State(step_index=0, t_s=0.0, last_step_s=config.cost.empty_step_s, tenants=tenants, tier_counters=(0.0,) * ntiers)


def block_ids(s: Sequence) -> tuple:
    """Ids of the KV blocks sequence ``s`` references, in token order: its
    prefix-cache keys (shared blocks: an equal key is one block), then
    ``"p<request_id>:<position>"`` for its private blocks (the model has no
    physical block numbers; a private block is named by its request and its
    position, so its name stays while it holds the same tokens)."""
    rid, n = s.request.request_id, len(s.shared_keys)
    return tuple(s.shared_keys) + tuple(f"p{rid}:{n + j}" for j in range(s.private_blocks))


def salt_seed(salt: str | None) -> int:
    """Integer seed of a cache salt (None: the shared, unsalted namespace)."""
    if salt is None:
        return 0
    return int.from_bytes(hashlib.blake2b(salt.encode("utf-8"), digest_size=8).digest(), "big")


def prefix_keys(config: Config, request: Request, salt: str | None) -> tuple[int, ...]:
    """Prefix-cache keys of a request's cacheable prompt blocks.

    Key i is a chain hash over (salt, content id 0..i), so equal keys mean equal
    salt and equal content of every block up to i (the hash is modelled as
    injective; SPEC.md 4.6).  Only full prompt blocks are cacheable.
    """
    n = min(len(request.prefix_ids), request.prompt_tokens // config.block_size_tokens)
    key = salt_seed(salt)
    out = []
    for content in request.prefix_ids[:n]:
        key = hash((key, content))
        out.append(key)
    return tuple(out)
