"""Fault (kind 13, protocol): more tokens than remain.  Expect BATCH-LIMITS.

Imitates: a prefill kernel with a fixed chunk of ``CHUNK_TOKENS`` (64): every
prefill chunk is planned at the full chunk size, the last one padded, so the
plan asks a request to compute more prompt tokens than it has left.  (Decode
steps are planned right.)
"""

from .base import Scheduler, Seq, Setup, factory

CHUNK_TOKENS = 64


class FixedChunkScheduler(Scheduler):
    """Plans prefill chunks of a fixed size, padding the last."""

    def chunk(self, seq: Seq, budget: int) -> int:
        if seq.computed < seq.prompt:
            return min(CHUNK_TOKENS, budget)  # BUG: min(CHUNK_TOKENS, what is left, budget)
        return super().chunk(seq, budget)

    def first_chunk(self, seq: Seq, computed: int, budget: int) -> int:
        return min(CHUNK_TOKENS, budget)  # BUG: the same


SETUP = Setup(policy="fcfs", describe="FCFS with fixed-size prefill chunks")
make_scheduler = factory(FixedChunkScheduler, SETUP)
