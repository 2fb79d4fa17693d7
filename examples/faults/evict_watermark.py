"""Fault (kind 10): preemption while the pool still has the blocks.  Expect EVICT-PROGRESS.

Imitates: an admission watermark (keep ``WATERMARK_BLOCKS`` = 8 blocks free for
decodes) applied in the decode path too: a running sequence that needs a block
while fewer than 8 + its need are free evicts others, although the pool could
give it the block.  The claimed pool has no watermark; the evictions are
churn without progress.
"""

from .base import Scheduler, Seq, Setup, StepOut, factory

WATERMARK_BLOCKS = 8


class WatermarkScheduler(Scheduler):
    """Keeps a watermark free even for running sequences, by evicting."""

    def grow(self, seq: Seq, n: int, out: StepOut) -> bool:
        need = self.blocks(seq.computed + n) - len(seq.block_ids)
        while need > 0:
            if self.pool.num_free - need >= WATERMARK_BLOCKS or len(self.running) == 1:  # BUG: the watermark
                new = self.pool.allocate(need)
                if new is not None:
                    seq.block_ids.extend(new)
                    return True
            victim = self.choose_victim(seq)
            self.evict(victim, out)
            if victim is seq:
                return False
        return True


SETUP = Setup(policy="fcfs", invariants=("WORK-CONSERVING", "EVICT-PROGRESS"),
              describe="FCFS, decode path keeps an admission watermark")
make_scheduler = factory(WatermarkScheduler, SETUP)
