"""Fault (kind 11): VTC that ignores the tenants' weights.  Expect VTC-GAP.

Imitates: a virtual token counter charged with the raw weighted tokens of a
request, the division by the tenant's weight left out (the weights were
added to the configuration later and only the admission path reads them):
with equal weights it is VTC exactly, so only a run whose tenants have
unequal weights shows it.  A tenant of weight 2 is charged twice what VTC
charges it and is served half its share.  The counters move by the service
itself instead of the service over the weight, which VTC-GAP's counter
premise judges from the first step (Sheng et al., OSDI 2024, Algorithm 2).
The pool is ample, as VTC-GAP requires.
"""

from .base import Scheduler, Setup, factory


class WeightlessVtcScheduler(Scheduler):
    """Charges every tenant as if its weight were 1."""

    def charge(self, tenant: str, cost: float) -> None:
        self.counters[tenant] += cost  # BUG: not divided by the tenant's weight


SETUP = Setup(policy="vtc", num_blocks=2048, max_context_tokens=4096, invariants=("WORK-CONSERVING", "VTC-GAP"),
              describe="VTC ignoring the tenants' weights")
make_scheduler = factory(WeightlessVtcScheduler, SETUP)
