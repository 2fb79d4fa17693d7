"""Fault (kind 12, bug log: SGLang #35270, free blocks overcounted).  Expect KV-CONSERVE.

Imitates the report: with the prefix cache on, the scheduler reports its free
KV as the free list plus every block in the cache index (the "evictable" size),
counting cached blocks that running requests still hold: free + distinct
blocks in use exceeds the pool.  The regression case
``tests/regressions/free-blocks-overcounted`` runs it in step mode.
"""

from .base import Scheduler, Setup, factory


class EvictableCountScheduler(Scheduler):
    """Reports cached blocks as free even while they are referenced."""

    def reported_free(self) -> int:
        return len(self.pool._free) + len(self.pool.key_of)  # BUG: only unreferenced cached blocks are free


SETUP = Setup(policy="fcfs", prefix_cache="salted", describe="FCFS with a salted prefix cache, free count overcounted")
make_scheduler = factory(EvictableCountScheduler, SETUP)
