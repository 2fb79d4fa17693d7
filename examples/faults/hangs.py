"""Fault (kind 13, protocol): ``plan_step`` waits for blocks that never come.  Expect ADAPTER-HANG.

Imitates two slips that meet: admission checks the *prompt* against the pool
(forgetting ``max_tokens``), and a running sequence that is alone and short of
blocks does not evict itself but waits, polling, for the KV offloader to
return blocks ("it is the only request, evicting it would lose all its
work").  In this synchronous engine nothing frees blocks during the wait: a
request whose prompt fits the pool (128 blocks, 2,048 tokens) but whose output
does not grows until it waits forever.  The harness's per-call timeout (10 s)
reports the hang.
"""

import time

from .base import Scheduler, Seq, Setup, StepOut, factory

#: Seconds between two polls of the pool.
POLL_S = 0.05


class WaitingScheduler(Scheduler):
    """Waits for free blocks when the requester is alone."""

    def admission_check(self, seq: Seq, now_s: float) -> str | None:
        reason = super().admission_check(seq, now_s)
        if reason == "too_large" and self.blocks(seq.prompt) <= self.setup.num_blocks:
            return None  # BUG 1: the prompt fits, max_tokens is forgotten
        return reason

    def grow(self, seq: Seq, n: int, out: StepOut) -> bool:
        need = self.blocks(seq.computed + n) - len(seq.block_ids)
        if need > self.pool.num_free and self.running == [seq]:
            while self.pool.num_free < need:  # BUG 2: nothing else can free blocks
                time.sleep(POLL_S)
        return super().grow(seq, n, out)


SETUP = Setup(policy="fcfs", num_blocks=128, describe="FCFS that waits for the KV offloader")
make_scheduler = factory(WaitingScheduler, SETUP)
