"""History mode: judge a recorded history offline (a batch-mode scheduler's
output, a real server's logs converted to the schema of
:mod:`tenantry.model.history`).

:func:`verify_history` applies the invariant catalog's record forms (safety
always, the rest when claimed) to the history, deduplicates what they find,
and :func:`locate` completes each finding with the step and the request it
concerns where the history allows.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable

from tenantry.model.config import Config
from tenantry.model.history import History

from tenantry.spec.invariants_core import Finding

from .protocol import Claims

#: Slack for comparing recorded times (seconds): the histories store floats in repr form.
TIME_EPS = 1e-9


def _step_at(history: History, t_s: float | None, *, end: bool) -> int | None:
    """The step starting (``end=False``) or ending (``end=True``) at t_s, if any."""
    if t_s is None or not history.steps:
        return None
    key = [s.start_s + s.duration_s if end else s.start_s for s in history.steps]
    i = bisect_left(key, t_s - TIME_EPS)
    if i < len(key) and abs(key[i] - t_s) <= TIME_EPS:
        return history.steps[i].step_index
    return None


def _newest_fresh(history: History, tenant: str, step: int) -> int | None:
    """The newest of ``tenant``'s requests queued and never scheduled after ``step``:
    the one a full queue should have refused."""
    fresh = []
    for r in history.requests:
        if r.tenant != tenant or r.admitted_step is None or r.admitted_step > step:
            continue
        first = _step_at(history, r.first_scheduled_s, end=False)
        gone = _step_at(history, r.finish_s, end=False) if r.outcome != "finished" else None
        if (first is None or first > step) and (gone is None or gone > step):
            fresh.append(r.request_id)
    return max(fresh) if fresh else None


def locate(f: Finding, history: History) -> Finding:
    """The finding with its step and request filled in where the history tells them.

    A request-level finding without a step gets the step where the request
    ended (or was admitted); a QUEUE-BOUND finding gets the newest request of
    its tenant still queued and never scheduled (the one that should have been
    refused); another step-level finding gets the newest running request of
    its tenant (or of any tenant) at that step.
    """
    import attrs

    step, rid, tenant = f.step, f.request_id, f.tenant
    recs = {r.request_id: r for r in history.requests}
    if step is None and rid is not None and rid in recs:
        r = recs[rid]
        step = _step_at(history, r.finish_s, end=r.outcome == "finished")
        if step is None:
            step = r.admitted_step
    if rid is None and f.invariant == "QUEUE-BOUND" and tenant is not None and step is not None:
        rid = _newest_fresh(history, tenant, step)
    if rid is None and step is not None and 0 <= step < len(history.steps):
        s = history.steps[step]
        cands = [x for x in s.running if x in recs and (tenant is None or recs[x].tenant == tenant)]
        if not cands:
            cands = [b[0] for b in s.batch]
        rid = max(cands) if cands else None
    if tenant is None and rid is not None and rid in recs:
        tenant = recs[rid].tenant
    return attrs.evolve(f, step=step, requests=f.requests or (() if rid is None else (rid,)),
                        tenants=f.tenants or (() if tenant is None else (tenant,)))


def verify_history(history: History, config: Config | None = None, claimed: Iterable[str] = ()) -> list[Finding]:
    """Every finding on ``history`` under ``config`` (default: the header's), located.

    Args:
        claimed: claim-level invariant ids the scheduler asserts (the safety
            ones are always checked).

    Raises:
        ConfigError: if no config is given and the header has none that parses.
    """
    from tenantry.spec.invariants import check_history, config_from_dict
    from tenantry.spec.invariants_core import dedup

    if config is None:
        config = config_from_dict(history.header.get("config") or {})
    claims = Claims(config, invariants=tuple(claimed))
    found = [locate(f, history) for f in dedup(check_history(history, claims))]
    found.sort(key=lambda f: (f.step if f.step is not None else 1 << 60, f.invariant))
    return found
