"""Fault (kind 12, bug log: SGLang #12493, over-preemption).  Expect EVICT-MINIMAL.

Imitates the report: the pool is full and a decoding request needs one more
block; the retract loop estimates what each victim frees from its generated
tokens only (the author assumed the prompt's blocks stay in the prefix cache,
which they do not here), so it keeps retracting after the first victim has
already freed enough: a victim is taken after the requester fits.
"""

from .base import Scheduler, Seq, Setup, StepOut, factory


class DecodeOnlyEstimateScheduler(Scheduler):
    """Counts a victim's generated tokens only as what it frees."""

    def grow(self, seq: Seq, n: int, out: StepOut) -> bool:
        need = self.blocks(seq.computed + n) - len(seq.block_ids)
        if need <= 0:
            return True
        estimate = self.pool.num_free
        while estimate < need:
            victim = self.choose_victim(seq)
            estimate += self.blocks(victim.output)  # BUG: the prompt's blocks are freed too
            self.evict(victim, out)
            if victim is seq:
                return False
        return super().grow(seq, n, out)


SETUP = Setup(policy="fcfs", describe="FCFS, retract loop counting decode blocks only")
make_scheduler = factory(DecodeOnlyEstimateScheduler, SETUP)
