"""Fault (kind 12, regression long-prompt-preempted-at-most-k-times): the eviction cooldown ignored.  Expect EVICT-COOLDOWN.

Imitates: a cooldown (2 steps) that is configured and claimed, but the
requeue path sets the sequence ready for the very next step (the cooldown
field was read from a config object the requeue path never received): an
evicted sequence is back in the batch one step later and can thrash.
"""

from .base import Scheduler, Setup, factory


class NoCooldownScheduler(Scheduler):
    """Readmits evicted sequences at the next step."""

    def ready_after_eviction(self) -> int:
        return self.step_index + 1  # BUG: + cooldown_steps missing


SETUP = Setup(policy="fcfs", cooldown_steps=2, describe="FCFS, eviction cooldown ignored")
make_scheduler = factory(NoCooldownScheduler, SETUP)
