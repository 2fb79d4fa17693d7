"""Fault (kind 12, regression queue-bound-refuses-excess-at-arrival): the queue bound off by one.  Expect QUEUE-BOUND.

Imitates: ``if len(waiting) > queue_bound: reject("queue_full")``: the check
runs before the request is counted, so one request more than the bound (8)
waits.
"""

from .base import Scheduler, Seq, Setup, factory


class LooseBoundScheduler(Scheduler):
    """Refuses queue_full only above the bound."""

    def admission_check(self, seq: Seq, now_s: float) -> str | None:
        reason = super().admission_check(seq, now_s)
        if reason == "queue_full" and self.fresh_queued(seq.tenant) == self.tenant(seq.tenant).queue_bound:
            return None  # BUG: admits the (bound + 1)-th request
        return reason


SETUP = Setup(policy="fcfs", queue_bound=8, describe="FCFS, queue bound off by one")
make_scheduler = factory(LooseBoundScheduler, SETUP)
