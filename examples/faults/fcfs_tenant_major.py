"""Fault (kind 8): "FCFS" that serves tenants in a fixed order.  Expect FCFS-TIER.

Imitates: a scheduler that keeps one FIFO per tenant and fills the batch by
walking the tenants in registration order, taking the first head it finds.
Within each tenant the order is first-come-first-served, so its author calls
it FCFS; across tenants of one tier the first registered tenant always goes
first, however long the others have waited.
"""

from .base import Scheduler, Seq, Setup, factory


class TenantMajorScheduler(Scheduler):
    """The first tenant (registration order) with a ready request goes next."""

    def pick(self, blocked: list[str]) -> Seq | None:
        heads = self.candidates(blocked)
        return heads[0] if heads else None  # BUG: should be the oldest head, min by admission order


SETUP = Setup(policy="fcfs", invariants=("WORK-CONSERVING", "FCFS-TENANT", "FCFS-TIER"),
              describe="FCFS per tenant, tenants in a fixed order")
make_scheduler = factory(TenantMajorScheduler, SETUP)
