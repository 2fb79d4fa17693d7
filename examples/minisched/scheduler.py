"""minisched: a small continuous-batching scheduler with per-tenant fair share.

Written in the shape of a production scheduler (vLLM v1's ``core/sched`` in
miniature): a block pool that returns None when there is no room, sequences
that track ``num_computed_tokens``, a ``schedule()`` that first advances the
running batch (chunked prefill, one decode token per sequence) and preempts by
recompute when blocks run out, then admits waiting sequences, and an
``update_from_output()`` that applies the sampled tokens.

Fair share: each tenant has a virtual token counter charged ``w_in`` per prompt
token when a sequence is first scheduled and ``w_out`` per generated token,
divided by the tenant's weight; the waiting tenant with the least counter goes
next, and a tenant that becomes backlogged is lifted to the least counter of
the backlogged tenants (Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024, Algorithm 2).  It knows nothing about tenantry.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


class BlockPool:
    """A fixed pool of KV blocks, numbered 0..num_blocks-1, handed out first-free-first."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = collections.deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """``num_blocks`` block ids, or None when fewer are free (nothing is taken then)."""
        if num_blocks > len(self._free):
            return None
        return [self._free.popleft() for _ in range(num_blocks)]

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(block_ids)


@dataclass
class Sequence:
    """One request: its prompt, what is computed, the blocks it holds."""

    seq_id: int
    tenant: str
    num_prompt_tokens: int
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    status: str = WAITING
    ever_scheduled: bool = False

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV must exist before the next token is sampled."""
        return self.num_prompt_tokens + self.num_output_tokens


@dataclass
class SchedulerOutput:
    """One step's decisions: tokens per sequence (batch order), preemptions, and
    the computed tokens of each scheduled sequence before the step."""

    num_scheduled_tokens: dict[int, int]
    preempted: list[int]
    computed_before: dict[int, int]


class Scheduler:
    """Continuous batching with chunked prefill, recompute preemption (newest
    running sequence first) and a per-tenant virtual token counter.

    Args:
        num_blocks: KV blocks in the pool; block_size: tokens per block.
        max_num_seqs: most sequences running at once.
        max_num_batched_tokens: most tokens computed per step.
        weights: tenant -> weight (default 1).
        w_in, w_out: counter charge per prompt and per generated token.
    """

    def __init__(self, num_blocks: int, block_size: int = 16, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 256, weights: dict[str, float] | None = None,
                 w_in: float = 1.0, w_out: float = 2.0) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.weights = dict(weights or {})
        self.w_in, self.w_out = w_in, w_out
        self.seqs: dict[int, Sequence] = {}
        self.queues: dict[str, collections.deque] = {}
        self.running: list[Sequence] = []
        self.counters: dict[str, float] = {}

    # --- requests in and out -------------------------------------------------------

    def add_request(self, seq_id: int, tenant: str, num_prompt_tokens: int) -> None:
        seq = Sequence(seq_id, tenant, num_prompt_tokens)
        self.seqs[seq_id] = seq
        self._enqueue(seq, front=False)

    def abort_request(self, seq_id: int) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            return
        if seq.status == RUNNING:
            self.running.remove(seq)
            self.pool.free(seq.block_ids)
            seq.block_ids = []
        elif seq.status == WAITING:
            self.queues[seq.tenant].remove(seq)
        seq.status = FINISHED

    def has_unfinished_requests(self) -> bool:
        return bool(self.seqs)

    # --- one step --------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: dict[int, int] = {}
        computed: dict[int, int] = {}
        preempted: list[int] = []
        # 1. Running sequences, oldest first: next chunk or decode token.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._grow(seq, n, preempted):
                continue  # seq itself was preempted; running[i] is now the next one
            scheduled[seq.seq_id] = n
            computed[seq.seq_id] = seq.num_computed_tokens
            budget -= n
            i += 1
        # 2. Waiting sequences, least-served tenant first.
        blocked: set[str] = set()
        while budget > 0 and len(self.running) < self.max_num_seqs:
            tenant = self._pick_tenant(blocked, preempted)
            if tenant is None:
                break
            seq = next(s for s in self.queues[tenant] if s.seq_id not in preempted)
            n = min(seq.num_tokens, budget)
            blocks = self.pool.allocate(self._blocks_for(n))
            if blocks is None:
                blocked.add(tenant)
                continue
            self.queues[tenant].remove(seq)
            seq.block_ids, seq.num_computed_tokens, seq.status = blocks, 0, RUNNING
            if not seq.ever_scheduled:
                seq.ever_scheduled = True
                self._charge(tenant, self.w_in * seq.num_prompt_tokens)
            self.running.append(seq)
            scheduled[seq.seq_id] = n
            computed[seq.seq_id] = 0
            budget -= n
        return SchedulerOutput(scheduled, preempted, computed)

    def update_from_output(self, output: SchedulerOutput, sampled: list[int], finished: list[int]) -> None:
        """Apply a step: every scheduled sequence advanced; ``sampled`` got a token;
        ``finished`` are done and leave."""
        for seq_id, n in output.num_scheduled_tokens.items():
            self.seqs[seq_id].num_computed_tokens += n
        for seq_id in sampled:
            seq = self.seqs[seq_id]
            seq.num_output_tokens += 1
            self._charge(seq.tenant, self.w_out)
        for seq_id in finished:
            seq = self.seqs.pop(seq_id)
            self.running.remove(seq)
            self.pool.free(seq.block_ids)
            seq.block_ids, seq.status = [], FINISHED

    # --- internals --------------------------------------------------------------------

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _grow(self, seq: Sequence, n: int, preempted: list[int]) -> bool:
        """Give seq the blocks for n more tokens, preempting the newest running
        sequences as needed.  False if seq itself had to be preempted."""
        need = self._blocks_for(seq.num_computed_tokens + n) - len(seq.block_ids)
        while need > 0:
            blocks = self.pool.allocate(need)
            if blocks is not None:
                seq.block_ids.extend(blocks)
                return True
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim.seq_id)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Recompute preemption: drop the KV, back to the front of its tenant's queue."""
        self.running.remove(seq)
        self.pool.free(seq.block_ids)
        seq.block_ids, seq.num_computed_tokens = [], 0
        self._enqueue(seq, front=True)

    def _enqueue(self, seq: Sequence, front: bool) -> None:
        q = self.queues.setdefault(seq.tenant, collections.deque())
        if not q:
            self._lift(seq.tenant)
        seq.status = WAITING
        if front:
            q.appendleft(seq)
        else:
            q.append(seq)

    def _lift(self, tenant: str) -> None:
        others = [self.counters.get(t, 0.0) for t, q in self.queues.items() if q and t != tenant]
        if others:
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), min(others))

    def _charge(self, tenant: str, cost: float) -> None:
        self.counters[tenant] = self.counters.get(tenant, 0.0) + cost / self.weights.get(tenant, 1.0)

    def _pick_tenant(self, blocked: set[str], preempted: list[int]) -> str | None:
        best = None
        for t, q in self.queues.items():
            if t in blocked or not any(s.seq_id not in preempted for s in q):
                continue
            if best is None or self.counters.get(t, 0.0) < self.counters.get(best, 0.0):
                best = t
        return best
