"""Fault (kind 12, bug log: vLLM #40004, priority inversion with full seats).  Expect BOUNDED-WAIT.

Imitates the report: strict priority with two seats (``max_num_seqs`` = 2) and
no preemption for priority: when both seats hold long tier-1 decodes, a
tier-0 request waits for one of them to finish, however long that takes,
although the tier-0 tenant (``chat``) is promised a start within 2 s.

The fixed twin (:class:`SeatPreemptingScheduler`) preempts the newest
lower-tier sequence, at most one a step, when a higher-tier request waits for a
seat.
"""

from .base import Scheduler, Setup, StepOut, factory

#: Tenants on the premium plan (tier 0); every other tenant is tier 1.
PLANS = (("chat", 0),)


class SeatPreemptingScheduler(Scheduler):
    """Strict priority that takes a seat from the newest lower-tier sequence for a waiting higher tier."""

    def schedule_running(self, out: StepOut, budget: int) -> int:
        if not self.seats_free():
            waiting = self.pick([])
            if waiting is not None:
                tier = self.tenant(waiting.tenant).tier
                lower = [s for s in self.running if self.tenant(s.tenant).tier > tier]
                if lower:
                    self.evict(max(lower, key=lambda s: s.order), out)
        return super().schedule_running(out, budget)


SETUP = Setup(policy="priority", max_num_seqs=2, tiers=PLANS, waits=(("chat", 2.0),),
              invariants=("BOUNDED-WAIT",), describe="strict priority on two seats, no preemption for priority")
make_scheduler = factory(Scheduler, SETUP, fixed=SeatPreemptingScheduler)
