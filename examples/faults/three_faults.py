"""Fault (kind 4): one scheduler with three independent bugs.  Expect KV-CONSERVE, REFUSAL-TRUTH, WORK-CONSERVING.

Imitates three unrelated slips in one code base, each reported once (with a count):

1. KV-CONSERVE: a request with a single output token finishes in its prefill
   step, before it reaches the decode path; the prefill path's completion
   handler drops the request without freeing its blocks.
2. REFUSAL-TRUTH: the queue-bound check shares the rate limiter's error path
   and answers ``rate_limit`` (no rate limit is configured) instead of
   ``queue_full``.
3. WORK-CONSERVING: the waiting loop stops at the first queue head whose blocks
   are not free (as the paper's VTC loop does) instead of passing over that
   tenant, leaving seats and budget idle while another tenant's request fits.
"""

from .base import ENDED, Scheduler, Seq, Setup, factory


class ThreeBugScheduler(Scheduler):
    """Leaks one-token requests' blocks, misnames queue_full, stops at the first misfit."""

    def admission_check(self, seq: Seq, now_s: float) -> str | None:
        reason = super().admission_check(seq, now_s)
        return "rate_limit" if reason == "queue_full" else reason  # BUG 2: the wrong reason

    def finish(self, seq: Seq) -> None:
        if seq.output == 1:  # finished in its prefill step
            self.running.remove(seq)
            seq.block_ids = []  # BUG 1: never freed
            seq.status = ENDED
            return
        super().finish(seq)

    def schedule_waiting(self, out, budget: int) -> int:
        while budget > 0 and self.seats_free():
            seq = self.pick([])
            if seq is None:
                break
            n = self.start(seq, budget, out)
            if n == 0:
                break  # BUG 3: should pass over this tenant and go on
            budget -= n
        return budget


SETUP = Setup(policy="fcfs", queue_bound=24, describe="FCFS with three bugs")
make_scheduler = factory(ThreeBugScheduler, SETUP)
