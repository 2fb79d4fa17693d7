"""Verify a scheduler on one workload: the step-mode run, the invariant catalog
over its history, and the determinism re-run.  The result is a :class:`Verdict`.

Used by ``tenantry verify --target``, the pytest plugin and the vLLM report.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable

import attrs

from tenantry.model.config import ConfigError, TenantConfig
from tenantry.model.workload import Request, Workload, as_workload, renumber
from tenantry.runner.history import History
from tenantry.spec.invariants_core import Finding

from .harness import Harness
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


def catalog_findings(history: History, claims: Any, books_call: str = "plan_step") -> list[Finding]:
    """The invariant catalog's record forms on a step-mode ``history`` under ``claims``
    (safety always, the rest only when claimed), deduplicated.  A finding about
    a step is a decision of that step's ``plan_step``, and is attributed to it;
    one judged on the counters or deficits
    (:func:`~tenantry.spec.invariants_history_fair.from_books`) to ``books_call``,
    the call that reported them (:attr:`~tenantry.verify.harness.Harness.books_call`)."""
    from tenantry.spec.invariants import check_history
    from tenantry.spec.invariants_core import dedup
    from tenantry.spec.invariants_history_fair import from_books

    return [f if f.step is None or f.call is not None
            else attrs.evolve(f, call=books_call if from_books(f) else "plan_step")
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
        findings = _merge([f for f in findings if h.stopped], catalog_findings(history, h.claims, h.books_call)) + [
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


# --- a scheduler under test as a system of the adversary searches ---------------------------


#: Tenant weights of a weighted run (``--weighted``, and the stateful extra), cycled in tenant
#: order (the adversary first): unequal weights, so that a weighted fair scheduler's use of them
#: (VTC's counters, DRR's quanta, SPEC.md 7.2) is judged, which equal weights cannot show.
WEIGHTS = (1.0, 2.0, 0.5)


def scenario_tenants(roles: Iterable[tuple[str, str]], tiered: bool, weighted: bool = False) -> tuple[TenantConfig, ...]:
    """Tenants of a scenario, in the order of ``roles`` ((name, role) pairs): weight 1, or
    :data:`WEIGHTS` cycled in that order when ``weighted``; tiers per role when ``tiered``
    (adversary 0, victims 1)."""
    return tuple(TenantConfig(n, weight=WEIGHTS[i % len(WEIGHTS)] if weighted else 1.0,
                              tier=(0 if r == "adversary" else 1) if tiered else 0) for i, (n, r) in enumerate(roles))


def bind(factory: Callable[..., Any], tenants: tuple[TenantConfig, ...]) -> Callable[[], Any]:
    """A zero-argument factory: ``factory(tenants=tenants)`` if it takes ``tenants``, else ``factory``.

    A factory that takes a keyword ``tenants`` learns each scenario's tenants (the
    adversary in tier 0 and the victims in tier 1 when the run is ``tiered``), so a
    priority scheduler can map tiers to its own priorities.
    """
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return factory
    if "tenants" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return functools.partial(factory, tenants=tenants)
    return factory


def preflight(factory: Callable[..., Any], roles: Iterable[tuple[str, str]], *, tiered: bool = False,
              timeout_s: float | None = 10.0, name: str = "the target", weighted: bool = False) -> list[str]:
    """Check, before any search, that a scheduler under test can be judged as it claims.

    Runs a probe on ``bind(factory, scenario_tenants(roles, tiered, weighted))`` (two small
    requests per tenant, sharing a prefix when the prefix cache is on) and reads
    what its history lacks for each claimed invariant
    (:func:`tenantry.spec.invariants.missing`).  A probe on which the adapter
    breaks the protocol passes: the run itself reports that.

    Returns:
        warnings, one line each: claimed invariants that do not apply to the
        claimed configuration (reported as not applicable, not checked).

    Raises:
        ConfigError: ``tiered`` or ``weighted`` with a factory that takes no ``tenants``
            (the tiers or weights could not reach it); a factory whose product is no
            adapter (None, a class, an object without the protocol's methods or without
            a :class:`~tenantry.verify.protocol.Claims`), naming ``name`` and what it
            returned; a claimed invariant whose data the adapter does not give
            (counters, deficits, blocks, block ids), naming the invariant and what is
            missing.
    """
    from tenantry.spec.invariants import INVARIANTS, missing

    roles = tuple(roles)
    for flag, on, what in (("--tiered", tiered, "tiers"), ("--weighted", weighted, "weights")):
        if on and bind(factory, ()) is factory:
            raise ConfigError(flag, name, f"the factory takes no 'tenants' argument, so it cannot learn the "
                              f"{what}; add a 'tenants' keyword to the factory or drop {flag}")
    fac = bind(factory, scenario_tenants(roles, tiered, weighted))
    h = Harness.start(fac, [n for n, _ in roles], timeout_s=timeout_s)
    h.close()
    if h.unusable is not None:  # the user's mistake, not the scheduler's: one line, before any run
        raise ConfigError("target", name, h.unusable)
    if h.stopped:
        return []
    config = h.config
    B = config.block_size_tokens
    shared = (7_000_001, 7_000_002) if config.prefix_cache != "off" else ()
    probe = [Request(0, t, 0.001 * i, 2 * B + 1, 2, prefix_ids=shared) for i, (t, _) in enumerate(roles + roles)]
    v = verify_workload(fac, Workload(renumber(probe)), timeout_s=timeout_s, determinism=False, catalog=False,
                        max_steps=500)
    if any(f.invariant in PROTOCOL for f in v.findings):
        return []
    warnings = []
    for i in sorted(v.claimed):
        inv = INVARIANTS.get(i)
        if inv is None:
            continue
        if not inv.applies(config):
            warnings.append(f"{name} claims {i}, which does not apply to its configuration (SPEC.md {inv.spec}): "
                            "reported as not applicable, not checked")
            continue
        why = missing(inv, v.history, config)
        if why is not None:
            raise ConfigError("claims.invariants", i, f"claimed by {name}, but it cannot be checked: {why}; "
                              "report them in the Plan or drop the claim")
    return warnings
