"""Fault (kind 2, a boundary request): a request needing exactly the whole pool is refused.  Expect REFUSAL-TRUTH.

Imitates: ``if blocks_needed >= num_blocks: reject("too_large")`` in the
admission check (the author keeps "one block of headroom" in mind and writes
``>=``): a request whose prompt plus output needs exactly ``num_blocks``
(256) blocks, 4,096 tokens, is refused although it fits an empty pool.

Shows only on a request at exactly the pool's size: the adversary patterns
reach 3,800 tokens (238 blocks) at most, the stateful run 2,096.
"""

from .base import Scheduler, Seq, Setup, factory


class PoolCheckScheduler(Scheduler):
    """Refuses ``too_large`` at the pool's size itself."""

    def admission_check(self, seq: Seq, now_s: float) -> str | None:
        total = seq.prompt + seq.max_tokens
        if total <= self.setup.max_context_tokens and self.blocks(total) >= self.setup.num_blocks:  # BUG: >
            return "too_large"
        return super().admission_check(seq, now_s)


SETUP = Setup(policy="fcfs", num_blocks=256, describe="FCFS, pool-size check off by one")
make_scheduler = factory(PoolCheckScheduler, SETUP)
