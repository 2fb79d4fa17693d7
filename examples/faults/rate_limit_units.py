"""Fault (kind 9): a request-rate limit that does not limit.  Expect REQUEST-RATE.

Imitates: a limiter lifted from a gateway that timestamps in milliseconds: the
bucket is refilled with the elapsed time in ms against a rate per second, so it
refills a thousand times too fast and every request is admitted.  The claim is
2 requests per second per tenant with a burst of 4.
"""

from .base import Scheduler, Seq, Setup, factory


class MillisecondLimiterScheduler(Scheduler):
    """Refills the request buckets with milliseconds."""

    def admission_check(self, seq: Seq, now_s: float) -> str | None:
        return super().admission_check(seq, now_s * 1000.0)  # BUG: the limiter's clock is in milliseconds


SETUP = Setup(policy="fcfs", request_rate=(2.0, 4.0), invariants=("WORK-CONSERVING", "REQUEST-RATE"),
              describe="FCFS with a request-rate limit in the wrong unit")
make_scheduler = factory(MillisecondLimiterScheduler, SETUP)
