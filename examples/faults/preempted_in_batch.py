"""Fault (kind 12, regression priority-preempted-sequence-leaves-the-batch): a preempted sequence left in the batch.  Expect BATCH-LIMITS.

Imitates: strict priority whose victim is the newest sequence of the lowest
tier, wherever it stands in the running list.  When the victim was already
given its tokens earlier in the same step, the scheduler frees its blocks and
requeues it but does not take its entry out of the step's batch: the step
computes tokens for a request it has just preempted.
"""

from .base import Scheduler, Seq, Setup, factory

#: Tenants on the premium plan (tier 0); every other tenant is tier 1.
PLANS = (("chat", 0),)


class LowestPriorityVictimScheduler(Scheduler):
    """Evicts the newest lowest-tier sequence, even one already in this step's batch."""

    def choose_victim(self, seq: Seq) -> Seq:
        return max(self.running, key=lambda s: (self.tenant(s.tenant).tier, s.order))
        # BUG: evict() does not take a victim scheduled earlier in the step out of out.batch


SETUP = Setup(policy="priority", tiers=PLANS, describe="strict priority, lowest-priority victim left in the batch")
make_scheduler = factory(LowestPriorityVictimScheduler, SETUP)
