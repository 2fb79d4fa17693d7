"""Fault (kind 8): strict priority with the tiers upside down.  Expect TIER-ORDER.

Imitates: a priority scheduler whose tiers come from the tenants' plans and
are compared as "priority values" where larger is more important (the
Kubernetes PriorityClass convention), while the claimed configuration uses
tenantry's (and vLLM's) convention, tier 0 first.  The premium tenant
``chat`` (tier 0) is served last.
"""

from .base import Scheduler, Seq, Setup, factory

#: Tenants on the premium plan (tier 0); every other tenant is tier 1.
PLANS = (("chat", 0),)


class PriorityValueScheduler(Scheduler):
    """The largest tier number goes first."""

    def pick(self, blocked: list[str]) -> Seq | None:
        heads = self.candidates(blocked)
        return min(heads, key=lambda s: (-self.tenant(s.tenant).tier, s.order), default=None)  # BUG: -tier


SETUP = Setup(policy="priority", tiers=PLANS, invariants=("WORK-CONSERVING", "TIER-ORDER"),
              describe="strict priority (tiers compared the wrong way)")
make_scheduler = factory(PriorityValueScheduler, SETUP)
