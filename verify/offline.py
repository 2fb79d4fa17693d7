"""History mode: judge a recorded history offline (a batch-mode scheduler's
output, a real server's logs converted to the schema of
:mod:`tenantry.model.history`).

:func:`verify_history` applies the invariant catalog's history checks (safety
always, the rest when claimed), adds :func:`check_placement` (NO-LOSS: every
admitted request that has not ended is, after every step, running or queued;
a request that vanishes from both is lost), and :func:`locate` completes each
finding with the step and the request it concerns where the history allows.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable

from tenantry.model.config import Config
from tenantry.model.history import History

from tenantry.spec.invariants_core import Finding

from .protocol import Claims, finding

#: Slack for comparing recorded times (seconds): the histories store floats in repr form.
TIME_EPS = 1e-9


def check_placement(history: History) -> list[Finding]:
    """NO-LOSS over step snapshots: per tenant, after step k, the requests
    admitted at or before k that have not ended by the end of k must number
    ``queued[tenant]`` plus those of the tenant in ``running``.

    A finished request ends at the end of the step whose end is its
    ``finish_s``; a cancelled or rejected one at the start of the step whose
    start is its ``finish_s`` (the same instant as the previous step's end).  Reports
    the first step where a tenant's count is short or over, naming the live
    requests that are not running (one of them is lost, or counted twice).
    """
    if not history.steps:
        return []
    by_tenant: dict[str, list] = {}
    for r in history.requests:
        if r.admitted_step is not None:
            by_tenant.setdefault(r.tenant, []).append(r)
    out = []
    for tenant, rs in by_tenant.items():
        for s in history.steps:
            end = s.start_s + s.duration_s + TIME_EPS
            start = s.start_s + TIME_EPS
            live = [r.request_id for r in rs if r.admitted_step <= s.step_index
                    and (r.finish_s is None or r.finish_s > (end if r.outcome == "finished" else start))]
            if not live:
                continue
            running = set(s.running)
            placed = s.queued.get(tenant, 0) + sum(1 for rid in live if rid in running)
            if placed != len(live):
                missing = [rid for rid in live if rid not in running]
                out.append(finding(
                    "NO-LOSS", s.step_index, f"after step {s.step_index} tenant {tenant} has {len(live)} admitted "
                    f"requests not ended, but {placed} are running or queued; among requests "
                    f"{', '.join(map(str, missing[:6]))} one is {'lost' if placed < len(live) else 'counted twice'}",
                    tenant=tenant, request_id=missing[-1] if missing else None, observed=placed, allowed=len(live)))
                break
    return out


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

    if config is None:
        config = config_from_dict(history.header.get("config") or {})
    claims = Claims(config, invariants=tuple(claimed))
    found = [f for f in check_history(history, claims)] + check_placement(history)
    found = [locate(f, history) for f in found]
    found.sort(key=lambda f: (f.step if f.step is not None else -1, f.invariant))
    return found
