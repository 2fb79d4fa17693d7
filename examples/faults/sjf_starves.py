"""Fault (kind 7): a starving order sold with a bounded wait.  Expect BOUNDED-WAIT.

Imitates: shortest-prompt-first across every waiting request (good for mean
latency) sold with the promise that the interactive plan's tenants (chat,
conv, code) start every request within 5 s.  A steady stream of shorter
prompts overtakes a longer one for as long as it lasts.  (tenantry has no SJF
order; the claimed config names round robin, the order the scheduler
replaced, and no invariant depends on it.  The fixed twin is that round robin,
under which those tenants wait at most 3.6 s in every pattern at its defaults.)
"""

from .base import Scheduler, Seq, Setup, factory


class ShortestPromptFirstScheduler(Scheduler):
    """The waiting request with the shortest prompt goes next (ties: the oldest)."""

    def pick(self, blocked: list[str]) -> Seq | None:
        waiting = [s for name, q in self.queues.items() if name not in blocked for s in q
                   if s.ready_step <= self.step_index]
        return min(waiting, key=lambda s: (s.prompt, s.order), default=None)  # BUG: no aging, starves

    def head(self, tenant: str) -> Seq | None:
        return min((s for s in self.queues[tenant] if s.ready_step <= self.step_index),
                   key=lambda s: (s.prompt, s.order), default=None)


#: The interactive plan: its tenants' requests are promised a start within 5 s.
INTERACTIVE = (("chat", 5.0), ("conv", 5.0), ("code", 5.0))

SETUP = Setup(policy="round_robin", queue_bound=4, waits=INTERACTIVE, invariants=("BOUNDED-WAIT",),
              describe="shortest prompt first, claimed to start interactive requests within 5 s")
make_scheduler = factory(ShortestPromptFirstScheduler, SETUP)
