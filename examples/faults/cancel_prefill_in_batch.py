"""Fault (kind 3, a cancellation during prefill): a request aborted mid-prefill stays in the batch.  Expect NO-LOSS.

Imitates: ``abort_request`` removing a request from the request table and
freeing its blocks, but removing it from the running list only when it is
decoding (prefilling requests were kept in a list of their own in an earlier
version): the cancelled request stays in the batch and is scheduled again in
the next steps, an ended request in the plan.
"""

from .base import ENDED, RUNNING, Scheduler, Setup, factory


class PrefillAbortInBatchScheduler(Scheduler):
    """Leaves a request aborted during its prefill in the running list."""

    def abort_request(self, rid: int) -> None:
        seq = self.seqs.get(rid)
        if seq is not None and seq.status == RUNNING and seq.computed < seq.prompt:
            del self.seqs[rid]
            self.release(seq)
            seq.status = ENDED  # BUG: still in self.running
            return
        super().abort_request(rid)


SETUP = Setup(policy="fcfs", describe="FCFS, abort during prefill leaves the request in the batch")
make_scheduler = factory(PrefillAbortInBatchScheduler, SETUP)
