"""Fault (kind 13, protocol): ``plan_step`` raises after 200 steps.  Expect ADAPTER-RAISED.

Imitates: a per-step profiling trace kept in a preallocated list of
``TRACE_STEPS`` (200) entries, indexed by the step number: the 201st step
raises ``IndexError`` (it was meant to be a ring buffer, ``step % 200``).
"""

from .base import Scheduler, Setup, StepOut, factory

TRACE_STEPS = 200


class TracingScheduler(Scheduler):
    """Records each step's batch size in a fixed-size trace."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.trace = [0] * TRACE_STEPS

    def schedule(self, step_index: int) -> StepOut:
        out = super().schedule(step_index)
        self.trace[step_index] = len(out.batch)  # BUG: should be step_index % TRACE_STEPS
        return out


SETUP = Setup(policy="fcfs", describe="FCFS with a fixed-size step trace")
make_scheduler = factory(TracingScheduler, SETUP)
