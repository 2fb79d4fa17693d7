"""minisched_buggy: minisched with a planted bug (a preempted sequence's tail KV block leaks).

The pytest plugin must catch it: ``pytest --tenantry-target=minisched_buggy.tenantry_adapter:make_scheduler``
fails with KV-CONSERVE and a shrunk workload.
"""

from .scheduler import BlockPool, Scheduler, SchedulerOutput, Sequence

__all__ = ["BlockPool", "Scheduler", "SchedulerOutput", "Sequence"]
