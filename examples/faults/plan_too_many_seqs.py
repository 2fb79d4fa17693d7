"""Fault (kind 13, protocol): more sequences than max_num_seqs.  Expect BATCH-LIMITS.

Imitates: the seat count taken from the decode list only: sequences still in
prefill are "not seats yet", so while prompts are being prefilled more than
``max_num_seqs`` (8) sequences run.
"""

from .base import Scheduler, Setup, factory


class DecodeSeatsScheduler(Scheduler):
    """Counts decoding sequences only against max_num_seqs."""

    def seats_free(self) -> bool:
        return sum(1 for s in self.running if s.computed >= s.prompt) < self.setup.max_num_seqs  # BUG


SETUP = Setup(policy="fcfs", describe="FCFS counting decode seats only")
make_scheduler = factory(DecodeSeatsScheduler, SETUP)
