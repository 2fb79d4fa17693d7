"""Fault (kind 13, protocol): a request twice in one batch.  Expect BATCH-LIMITS.

Imitates: a running phase in two passes, prefills then decodes, where a
request whose prefill chunk completes its prompt is treated as decoding in the
same step (its state is updated when the chunk is planned, not when it ran):
it is planned twice, once for the chunk and once for a decode token.
"""

from .base import Scheduler, Setup, StepOut, factory


class TwoPassScheduler(Scheduler):
    """Plans prefill chunks, then decode tokens; a just-completed prefill gets both."""

    def schedule_running(self, out: StepOut, budget: int) -> int:
        prefilling = [s for s in self.running if s.computed < s.prompt]
        decoding = [s for s in self.running if s.computed >= s.prompt]
        for seq in prefilling:
            if budget <= 0 or seq not in self.running:
                continue
            n = self.chunk(seq, budget)
            if not self.grow(seq, n, out):
                continue
            out.batch.append((seq.rid, n, seq.computed))
            budget -= n
            if seq.computed + n >= seq.prompt:
                decoding.append(seq)  # BUG: its decode token is next step's, not this step's
        for seq in decoding:
            if budget <= 0 or seq not in self.running:
                continue
            if not self.grow(seq, 1, out):
                continue
            out.batch.append((seq.rid, 1, seq.computed))
            budget -= 1
        return budget


SETUP = Setup(policy="fcfs", describe="FCFS in two passes (prefills, then decodes)")
make_scheduler = factory(TwoPassScheduler, SETUP)
