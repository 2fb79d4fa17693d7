"""Fault (kind 12, regression long-prompt-preempted-at-most-k-times): the eviction bound off by one.  Expect EVICT-BOUNDED.

Imitates: ``if seq.num_preemptions > max_evictions: reject(...)``: a sequence
is preempted ``max_evictions + 1`` (3) times before it is rejected
``evicted_too_often``.
"""

from .base import Scheduler, Seq, Setup, factory


class LooseEvictionBoundScheduler(Scheduler):
    """Rejects evicted_too_often one eviction late."""

    def evicted_too_often(self, victim: Seq) -> bool:
        return victim.preemptions > self.setup.max_evictions  # BUG: should be >=


SETUP = Setup(policy="fcfs", max_evictions=2, describe="FCFS, eviction bound off by one")
make_scheduler = factory(LooseEvictionBoundScheduler, SETUP)
