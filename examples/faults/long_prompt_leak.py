"""Fault (kind 1, needs a search): a long-prompt path that leaks its sink block.  Expect KV-CONSERVE.

Imitates: a scheduler with a separate path for long prompts (over
``LONG_PROMPT_TOKENS`` = 2,048 tokens) that reserves one extra "attention-sink"
block per sequence for the long-context kernel.  The sink is returned when the
sequence is preempted or cancelled, but the finish path frees only the block
table and forgets the sink: one block leaks per long request that finishes.

No adversary pattern sends a prompt over 2,048 tokens at its default
parameters (few_huge: 2,000; slow_decoders and eviction_thrash: 1,500; the
victims: at most 1,024); the searches over few_huge, slow_decoders and
eviction_thrash (prompts up to 3,000) must find one.
"""

from .base import Scheduler, Seq, Setup, StepOut, factory

#: Prompts longer than this take the long-context path.
LONG_PROMPT_TOKENS = 2048


class LongPromptScheduler(Scheduler):
    """Reserves a sink block for long prompts; frees it on preemption and abort, not on finish."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.sinks: dict[int, int] = {}

    def start(self, seq: Seq, budget: int, out: StepOut) -> int:
        long = seq.prompt > LONG_PROMPT_TOKENS and seq.rid not in self.sinks
        if long and self.pool.num_free < 1:
            return 0
        sink = self.pool.allocate(1) if long else None
        n = super().start(seq, budget, out)
        if sink is not None:
            if n:
                self.sinks[seq.rid] = sink[0]
            else:
                self.pool.free(sink)
        return n

    def held(self, seq: Seq) -> tuple[int, ...]:
        sink = self.sinks.get(seq.rid)
        return tuple(seq.block_ids) + (() if sink is None else (sink,))

    def release(self, seq: Seq) -> None:
        """Preemption and abort return the sink too."""
        sink = self.sinks.pop(seq.rid, None)
        if sink is not None:
            self.pool.free([sink])
        super().release(seq)

    def finish(self, seq: Seq) -> None:
        """The finish path frees the block table only."""
        self.running.remove(seq)
        self.pool.free(seq.block_ids)
        seq.block_ids = []
        self.sinks.pop(seq.rid, None)  # BUG: the sink block is forgotten, never freed
        seq.status = "ended"


SETUP = Setup(policy="fcfs", describe="FCFS with a long-prompt path (leaks a sink block)")
make_scheduler = factory(LongPromptScheduler, SETUP)
