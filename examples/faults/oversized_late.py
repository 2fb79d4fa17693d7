"""Fault (kind 12, regression prompt-larger-than-pool-refused-at-once): a request larger than the pool is refused late.  Expect NO-LOSS.

Imitates: an admission that checks only the context limit; a request that can
never fit the pool (128 blocks, 2,048 tokens) is queued and refused
``too_large`` only when it reaches the head of the queue and the allocator
gives up.  ``too_large`` is an admission reason: a request refused with it
was never admitted, but this one was (and waited).
"""

from .base import ENDED, Scheduler, Seq, Setup, StepOut, factory


class LateTooLargeScheduler(Scheduler):
    """Finds out that a request can never fit when it tries to start it."""

    def admission_check(self, seq: Seq, now_s: float) -> str | None:
        reason = super().admission_check(seq, now_s)
        return None if reason == "too_large" else reason  # BUG: checked too late, in start()

    def start(self, seq: Seq, budget: int, out: StepOut) -> int:
        if self.blocks(seq.prompt + seq.max_tokens) > self.setup.num_blocks:
            self.queues[seq.tenant].remove(seq)
            del self.seqs[seq.rid]
            seq.status = ENDED
            out.rejected.append((seq.rid, "too_large"))
            return 0
        return super().start(seq, budget, out)


SETUP = Setup(policy="fcfs", num_blocks=128, describe="FCFS, too_large found at the queue head")
make_scheduler = factory(LateTooLargeScheduler, SETUP)
