"""Run the reference model with every applicable invariant checked after each step.

:func:`run_checked` is :func:`tenantry.model.simulate.simulate` (the same
driver loop: arrivals delivered to the first step starting at or after them,
idling when nothing is queued or running) with :func:`check_state` after every
step and :func:`check_history` on the resulting history.
"""

from __future__ import annotations

from typing import Iterable

import attrs

from tenantry.model import step as step_mod
from tenantry.model.config import Config
from tenantry.model.history import History
from tenantry.model.simulate import Recorder, check_workload, config_to_dict, has_work
from tenantry.model.state import initial_state
from tenantry.model.workload import Request, StepInput, Workload

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
    check_workload(config, wl)
    reqs, cancels = wl.requests, sorted(cancellations)
    rec = Recorder(config, True)
    for r in reqs:
        rec.offered(r)
    state = initial_state(config)
    findings: list[Finding] = []
    i = c = 0
    while state.step_index < max_steps:
        if not has_work(state):
            if i == len(reqs):
                break
            if reqs[i].arrival_s > state.t_s:
                state = step_mod.idle(config, state, reqs[i].arrival_s)
        j = i
        while j < len(reqs) and reqs[j].arrival_s <= state.t_s:
            j += 1
        d = c
        while d < len(cancels) and cancels[d][0] <= state.t_s:
            d += 1
        inputs = StepInput(arrivals=reqs[i:j], cancellations=tuple(rid for _, rid in cancels[c:d]))
        i, c = j, d
        new, out = step_mod.step(config, state, inputs)
        if state_checks:
            findings += check_state(config, state, new, out, inputs, ids)
        rec.observe(new, out)
        state = new
    history = rec.history(state, {"config": config_to_dict(config), "requests": len(reqs)})
    if history_checks:
        findings += check_history(history, config, ids)
    return CheckedRun(history, tuple(findings))
