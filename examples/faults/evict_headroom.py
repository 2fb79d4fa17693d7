"""Fault (kind 10): over-preemption for "headroom".  Expect EVICT-MINIMAL.

Imitates: an attempt at hysteresis: once the requester fits after evicting,
one more victim is evicted "so that the next decode steps do not preempt
again".  That victim is taken after the requester already fits: its recompute
is wasted work.
"""

from .base import Scheduler, Seq, Setup, StepOut, factory


class HeadroomScheduler(Scheduler):
    """Evicts one extra sequence after the requester fits."""

    def grow(self, seq: Seq, n: int, out: StepOut) -> bool:
        need = self.blocks(seq.computed + n) - len(seq.block_ids)
        evicted = False
        while need > 0:
            new = self.pool.allocate(need)
            if new is not None:
                seq.block_ids.extend(new)
                if evicted and self.running[-1] is not seq:
                    self.evict(self.running[-1], out)  # BUG: one victim more than needed
                return True
            victim = self.choose_victim(seq)
            self.evict(victim, out)
            evicted = True
            if victim is seq:
                return False
        return True


SETUP = Setup(policy="fcfs", describe="FCFS, evicts one extra victim for headroom")
make_scheduler = factory(HeadroomScheduler, SETUP)
