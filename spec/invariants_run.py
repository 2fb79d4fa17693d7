"""Run the reference model with every applicable invariant checked after each step.

:func:`run_checked` is :func:`tenantry.model.simulate.simulate` (the same
driver loop: arrivals delivered to the first step starting at or after them,
idling when nothing is queued or running) with :func:`check_state` after every
step and :func:`check_history` on the resulting history.
"""

from __future__ import annotations

from typing import Iterable

import attrs

from tenantry.model.config import Config
from tenantry.model.history import History
from tenantry.model.simulate import Recorder, config_to_dict, run_steps
from tenantry.model.state import initial_state
from tenantry.model.workload import Request, Workload

from .invariants import check_history, check_state
from .invariants_core import Finding


@attrs.frozen
class CheckedRun:
    """A run's history and every finding (state forms first, then history forms)."""

    history: History
    findings: tuple[Finding, ...]

    def by_invariant(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for f in self.findings:
            out.setdefault(f.invariant, []).append(f)
        return out


def run_checked(config: Config, workload: Workload | Iterable[Request], *, cancellations: Iterable[tuple[float, int]] = (),
                max_steps: int = 2000, ids: Iterable[str] | None = None, history_checks: bool = True,
                state_checks: bool = True) -> CheckedRun:
    """Simulate ``workload`` on ``config`` (at most ``max_steps`` steps), checking as it goes.

    Args:
        cancellations: (t_s, request_id): cancel at the first step starting at or after t_s.
        ids: restrict the checks to these invariant ids (None: all applicable).
        history_checks: also run the history forms on the recorded history.
        state_checks: run the state forms after every step (False: judge the history only).

    Raises:
        ConfigError: if a request names a tenant the configuration lacks.
    """
    ids = None if ids is None else tuple(ids)
    wl = workload if isinstance(workload, Workload) else Workload(tuple(workload))
    rec = Recorder(config, True)
    for r in wl.requests:
        rec.offered(r)
    state = initial_state(config)
    findings: list[Finding] = []
    for prev, inputs, state, out in run_steps(config, wl, max_steps=max_steps, cancellations=cancellations):
        if state_checks:
            findings += check_state(config, prev, state, out, inputs, ids)
        rec.observe(state, out)
    history = rec.history(state, {"config": config_to_dict(config), "requests": len(wl)})
    if history_checks:
        findings += check_history(history, config, ids)
    return CheckedRun(history, tuple(findings))
