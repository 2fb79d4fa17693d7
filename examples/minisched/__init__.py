"""minisched: an example third-party scheduler (see scheduler.py) and its tenantry adapter."""

from .scheduler import BlockPool, Scheduler, SchedulerOutput, Sequence

__all__ = ["BlockPool", "Scheduler", "SchedulerOutput", "Sequence"]
