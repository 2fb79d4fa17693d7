"""Fault (kind 2, a boundary request): a request of exactly the context limit is refused.  Expect REFUSAL-TRUTH.

Imitates: the API server's length check counting a slot for the token being
sampled, ``prompt + max_tokens >= max_context_tokens`` instead of ``>``: a
request whose prompt plus output is exactly ``max_context_tokens`` (4,096) is
refused ``too_long`` although it fits.

Shows only on a request of exactly 4,096 tokens (output at the limit): no
adversary pattern reaches it today (at most 3,800 tokens), nor the stateful
run (at most 3,120).
"""

from .base import Scheduler, Seq, Setup, factory


class ContextCheckScheduler(Scheduler):
    """Refuses ``too_long`` at the context limit itself."""

    def admission_check(self, seq: Seq, now_s: float) -> str | None:
        if seq.prompt + seq.max_tokens >= self.setup.max_context_tokens:  # BUG: should be >
            return "too_long"
        return super().admission_check(seq, now_s)


SETUP = Setup(policy="fcfs", max_context_tokens=4096, describe="FCFS, context check off by one")
make_scheduler = factory(ContextCheckScheduler, SETUP)
