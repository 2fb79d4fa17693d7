"""Fault (kind 2, a boundary request): a prompt wholly in the prefix cache enters the batch with 0 tokens.  Expect BATCH-LIMITS.

Imitates: the full-prefix-hit bug of paged-KV engines (vLLM's "the last prompt
token must be recomputed" cap on a cache hit, SGLang's matching rule): the hit
may cover every full block of the prompt, so a prompt that is an exact number
of blocks, all cached, has nothing left to compute, and the scheduler plans it
with a 0-token chunk, step after step; it never samples its first token.

Shows only on a prompt of exactly k blocks whose k blocks are cached under its
tenant's salt: the ``boundary`` pattern's one-block bursts (from the second on)
and the stateful extra make it; the other patterns add at least 16 tokens of
their own after a shared prefix.  Found blind: a helper wrote it behind the
protocol without saying what it was, and the default run caught it (2026-12-02).
"""

from .base import Scheduler, Seq, Setup, factory


class WholePromptHitScheduler(Scheduler):
    """Lets a cache hit cover the prompt's last block too."""

    def reusable_blocks(self, seq: Seq) -> int:
        return seq.target // self.B  # BUG: should be (target - 1) // B: the last token is always computed


SETUP = Setup(policy="fcfs", prefix_cache="salted", describe="FCFS, a whole cached prompt scheduled with 0 tokens")
make_scheduler = factory(WholePromptHitScheduler, SETUP)
