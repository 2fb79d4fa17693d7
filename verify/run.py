"""Verify a scheduler on one workload: the step-mode run, the invariant catalog
over its history, and the determinism re-run.  The result is a :class:`Verdict`.

Used by ``tenantry verify --target``, the pytest plugin and the vLLM report.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import attrs

from tenantry.model.history import History
from tenantry.model.workload import Request, Workload, as_workload

from .harness import Harness
from tenantry.spec.invariants_core import Finding

from .protocol import PROTOCOL, finding


@attrs.frozen
class Verdict:
    """The outcome of verifying one scheduler on one workload.

    Attributes:
        describe: the scheduler's own one-line description (``Claims.describe``).
        findings: every finding, harness ones first, then the catalog's.
        history: the recorded run (up to the stop, if a finding stopped it).
        stats: the harness counters (steps, preemptions, cache hits ...).
        claimed: the claim-level invariant ids in force.
    """

    describe: str
    findings: tuple[Finding, ...]
    history: History
    stats: dict
    claimed: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No finding."""
        return not self.findings

    def invariants(self) -> list[str]:
        """The distinct ids found, in order of first appearance."""
        return list(dict.fromkeys(f.invariant for f in self.findings))

    def render(self, limit: int = 20) -> str:
        """Findings as lines (at most ``limit``), or ``ok``."""
        if self.ok:
            return f"{self.describe or 'scheduler'}: ok ({self.stats.get('steps', 0)} steps)"
        lines = [f.render() for f in self.findings[:limit]]
        if len(self.findings) > limit:
            lines.append(f"... and {len(self.findings) - limit} more")
        return "\n".join(lines)


def catalog_findings(history: History, claims: Any) -> list[Finding]:
    """The invariant catalog's record forms on a step-mode ``history`` under ``claims``
    (safety always, the rest only when claimed), deduplicated.  A finding about
    a step is a decision of that step's ``plan_step``, and is attributed to it."""
    from tenantry.spec.invariants import check_history
    from tenantry.spec.invariants_core import dedup

    return [f if f.step is None or f.call is not None else attrs.evolve(f, call="plan_step")
            for f in dedup(check_history(history, claims))]


def _merge(own: list[Finding], catalog: list[Finding]) -> list[Finding]:
    """The harness's protocol findings, then the catalog's; when a protocol finding
    stopped the run, catalog findings after that step (and whole-run ones, judged on
    a cut history) are its consequences and left out."""
    stopped_at = min((f.step if f.step is not None else -1 for f in own), default=None)
    out = list(own)
    for f in catalog:
        if stopped_at is not None and (f.step is None or f.step > stopped_at):
            continue
        out.append(f)
    return out


def _first_divergence(a: list, b: list) -> Finding | None:
    for x, y in zip(a, b):
        if x != y:
            call = "add_request" if x[0] == "add" or y[0] == "add" else "plan_step"
            step = x[1] if x[0] == "plan" else None
            return finding("DETERMINISM", step, f"two runs on the same inputs differ at {call}"
                           f"{f' (request {x[1]})' if x[0] == 'add' else ''}: first run {str(x[2])[:160]}, "
                           f"second run {str(y[2])[:160]}", observed=str(x[2])[:160], allowed=str(y[2])[:160],
                           request_id=x[1] if x[0] == "add" else None, call=call)
    if len(a) != len(b):
        return finding("DETERMINISM", None, f"two runs on the same inputs made {len(a)} and {len(b)} calls",
                       observed=len(a), allowed=len(b))
    return None


def verify_workload(factory: Callable[[], Any], workload: Workload | Iterable[Request], *,
                    horizon_s: float | None = None,
                    max_steps: int | None = 100_000, timeout_s: float | None = 10.0, determinism: bool = True,
                    catalog: bool = True, header: dict | None = None) -> Verdict:
    """Run the scheduler built by ``factory()`` on ``workload`` and judge it.

    Args:
        factory: zero-argument callable returning a
            :class:`~tenantry.verify.protocol.SchedulerAdapter`; called once per run.
        horizon_s, max_steps: stop there (requests still in flight are unfinished).
        timeout_s: per-call timeout (seconds), None to call inline.
        determinism: run a second fresh instance and compare every decision.
        catalog: apply the invariant catalog's history checks.

    Never raises for anything the scheduler does: exceptions, hangs and bad
    plans are findings.
    """
    wl = as_workload(workload)
    tenants = wl.tenants

    def one() -> Harness:
        h = Harness.start(factory, tenants, timeout_s=timeout_s)
        if not h.stopped:
            h.run(wl, horizon_s=horizon_s, max_steps=max_steps)
        h.close()
        return h

    h = one()
    history = h.history(wl.requests, header=header)
    findings = list(h.findings)
    if catalog and h.adapter is not None:
        findings = _merge([f for f in findings if h.stopped], catalog_findings(history, h.claims)) + [
            f for f in findings if not h.stopped]
    # step order; at one step, what the catalog found before the harness's own remarks
    findings.sort(key=lambda f: (f.step if f.step is not None else 1 << 60, f.invariant in PROTOCOL))
    if determinism and h.adapter is not None and not any(f.invariant in ("ADAPTER-HANG",) for f in findings):
        h2 = one()
        d = _first_divergence(h.plans, h2.plans)
        if d is not None:
            findings.append(d)
        elif len(h2.findings) != len(h.findings) or any(
                a.render() != b.render() for a, b in zip(h.findings, h2.findings)):
            first = next((b for a, b in zip(h.findings, h2.findings) if a.render() != b.render()),
                         (h2.findings or h.findings)[0])
            findings.append(finding("DETERMINISM", first.step, "a second run on the same inputs ended "
                                    f"differently: {first.render()}", call=first.call))
    return Verdict(h.claims.describe, tuple(findings), history, dict(h.stats), tuple(sorted(h.claimed)))
