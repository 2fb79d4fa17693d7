"""Fault (kind 9): ``queue_full`` below the bound.  Expect REFUSAL-TRUTH.

Imitates: a queue bound that counts every unfinished request of the tenant,
running ones included, against ``queue_bound`` (16) of waiting requests: a
tenant with requests in the batch is refused ``queue_full`` while fewer than 16
of its requests wait.
"""

from .base import Scheduler, Setup, factory


class InFlightBoundScheduler(Scheduler):
    """Counts running requests as queued."""

    def fresh_queued(self, tenant: str) -> int:
        return len(self.queues[tenant]) + sum(1 for s in self.running if s.tenant == tenant)  # BUG


SETUP = Setup(policy="fcfs", queue_bound=16, describe="FCFS, queue bound counting requests in flight")
make_scheduler = factory(InFlightBoundScheduler, SETUP)
