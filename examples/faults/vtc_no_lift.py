"""Fault (kind 11): VTC without the counter lift.  Expect NO-BANKED-CREDIT.

Imitates: virtual token counters (Sheng et al., OSDI 2024) implemented without
Algorithm 2's lift: a tenant that joins the backlog keeps the low counter it
had when it left, and is then served ahead of everyone until it catches up:
credit banked while idle.  The counters are reported in every plan.
"""

from .base import Scheduler, Setup, factory


class NoLiftVtcScheduler(Scheduler):
    """Least counter first; a tenant joining the backlog is not lifted."""

    def lift(self, tenant: str) -> None:
        pass  # BUG: no lift to the least backlogged counter


SETUP = Setup(policy="vtc", invariants=("WORK-CONSERVING", "NO-BANKED-CREDIT"), describe="VTC without the lift")
make_scheduler = factory(NoLiftVtcScheduler, SETUP)
