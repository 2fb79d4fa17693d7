"""Fault (kind 3, a cancellation during prefill): blocks of a request aborted mid-prefill leak.  Expect KV-CONSERVE.

Imitates: a scheduler whose chunked prefill hands the partly computed blocks
to the prefill job; ``abort_request`` on a request still in prefill only
unlinks it from the batch, assuming the job frees its blocks, which it never
does once the request is gone.  Aborts of queued or decoding requests are fine.

Shows when a client cancels a request whose prompt is longer than one step's
budget while its prefill is under way.
"""

from .base import ENDED, RUNNING, Scheduler, Setup, factory


class PrefillAbortScheduler(Scheduler):
    """Forgets the blocks of a request aborted during its prefill."""

    def abort_request(self, rid: int) -> None:
        seq = self.seqs.get(rid)
        if seq is not None and seq.status == RUNNING and seq.computed < seq.prompt:
            del self.seqs[rid]
            self.running.remove(seq)
            seq.block_ids = []  # BUG: "the prefill job frees them": nobody does
            seq.status = ENDED
            return
        super().abort_request(rid)


SETUP = Setup(policy="fcfs", describe="FCFS, abort during prefill leaks its blocks")
make_scheduler = factory(PrefillAbortScheduler, SETUP)
