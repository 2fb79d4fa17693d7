"""Fault (kind 8): "FCFS" that is last-come-first-served within a tenant.  Expect FCFS-TENANT.

Imitates: each tenant's waiting requests kept in a Python list used as a stack:
new requests are appended and the scheduler takes ``queue[-1]`` (``pop()``
where ``pop(0)`` was meant).  Across tenants the order is still by age of the
head it looks at, so it looks like FCFS until a tenant has two requests waiting.
"""

from .base import Scheduler, Seq, Setup, factory


class StackQueueScheduler(Scheduler):
    """Takes a tenant's newest ready request first."""

    def head(self, tenant: str) -> Seq | None:
        ready = [s for s in self.queues[tenant] if s.ready_step <= self.step_index]
        return ready[-1] if ready else None  # BUG: ready[0] is the oldest


SETUP = Setup(policy="fcfs", invariants=("WORK-CONSERVING", "FCFS-TENANT"), describe="FCFS (a stack per tenant)")
make_scheduler = factory(StackQueueScheduler, SETUP)
