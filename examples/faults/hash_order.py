"""Fault (kind 5): decisions follow Python's string hashing.  Expect DETERMINISM.

Imitates: a "least recently served tenant first" order whose candidates are
collected in a ``set`` of tenant names; ties (several tenants never served, or
served in the same step) go to whichever name the set yields first, and that
order changes with ``PYTHONHASHSEED``: the same workload is scheduled
differently in another process.
"""

from .base import Scheduler, Seq, Setup, StepOut, factory


class LeastRecentlyServedScheduler(Scheduler):
    """Least recently served tenant first; ties broken by set iteration order."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.last_served: dict[str, int] = {}

    def pick(self, blocked: list[str]) -> Seq | None:
        heads = {s.tenant: s for s in self.candidates(blocked)}
        backlogged = set(heads)  # BUG: a set of str: its order follows PYTHONHASHSEED
        best = None
        for name in backlogged:
            if best is None or self.last_served.get(name, -1) < self.last_served.get(best, -1):
                best = name
        return None if best is None else heads[best]

    def start(self, seq: Seq, budget: int, out: StepOut) -> int:
        n = super().start(seq, budget, out)
        if n:
            self.last_served[seq.tenant] = self.step_index
        return n


SETUP = Setup(policy="round_robin", describe="least recently served tenant first (set order ties)")
make_scheduler = factory(LeastRecentlyServedScheduler, SETUP)
