"""Fault (kind 11): VTC that does not charge generated tokens.  Expect VTC-GAP.

Imitates: a virtual token counter charged only with prompt tokens (the output
charge was left out "because it is not known in advance"): a tenant with long
outputs is charged a fraction of its service, and its normalised service can
run ahead of a backlogged tenant's by more than VTC's bound.  The pool is
ample (8 sequences of the 4,096-token context fit), as VTC-GAP requires.
"""

from .base import Scheduler, Seq, Setup, factory


class PromptOnlyVtcScheduler(Scheduler):
    """Charges the counter at the first scheduling only."""

    def charge_output(self, seq: Seq) -> None:
        pass  # BUG: w_out per generated token is never charged


SETUP = Setup(policy="vtc", num_blocks=2048, max_context_tokens=4096, invariants=("WORK-CONSERVING", "VTC-GAP"),
              describe="VTC charging prompt tokens only")
make_scheduler = factory(PromptOnlyVtcScheduler, SETUP)
