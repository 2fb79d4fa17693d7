"""Fault (kind 12, regression cancel-at-every-stage-returns-every-block): an abort during decode leaks a block.  Expect KV-CONSERVE.

Imitates: an asynchronous engine's abort path: when a decoding request is
cancelled, its last block "is still being written by the step in flight" and
is left to the step's completion handler, which only knows requests that are
still alive: the tail block is never returned.
"""

from .base import ENDED, RUNNING, Scheduler, Setup, factory


class AsyncAbortScheduler(Scheduler):
    """Frees all but the tail block of a request cancelled while decoding."""

    def abort_request(self, rid: int) -> None:
        seq = self.seqs.get(rid)
        if seq is not None and seq.status == RUNNING and seq.computed >= seq.prompt:
            del self.seqs[rid]
            self.running.remove(seq)
            self.pool.free(seq.block_ids[:-1])  # BUG: the tail block is never freed
            seq.block_ids, seq.status = [], ENDED
            return
        super().abort_request(rid)


SETUP = Setup(policy="fcfs", describe="FCFS, abort during decode keeps the tail block")
make_scheduler = factory(AsyncAbortScheduler, SETUP)
