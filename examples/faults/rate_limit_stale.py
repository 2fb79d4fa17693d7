"""Fault (kind 12, bug log: LiteLLM PR #37789, rate limit refused under the limit).  Expect REFUSAL-TRUTH.

Imitates the report: the request-rate limiter reads the bucket's stored level
and refuses ``rate_limit`` when it is below one; the bucket is refilled only
when a request is admitted.  Once the level drops below one it is never
refilled again: every later request is refused although the refilled bucket
would hold it.  The claim: 1 request per second per tenant, burst 2.
"""

from .base import Scheduler, Seq, Setup, factory


class StaleBucketScheduler(Scheduler):
    """Checks the request bucket before refilling it."""

    def admission_check(self, seq: Seq, now_s: float) -> str | None:
        b = self.rate_buckets.get(seq.tenant)
        if b is not None and b.level < 1.0:  # BUG: the level is stale, refill first
            return "rate_limit"
        return super().admission_check(seq, now_s)


SETUP = Setup(policy="fcfs", request_rate=(1.0, 2.0), invariants=("WORK-CONSERVING", "REQUEST-RATE"),
              describe="FCFS, request-rate bucket checked before its refill")
make_scheduler = factory(StaleBucketScheduler, SETUP)
