"""The adversary matrix on a scheduler under test: every abusive pattern of
:mod:`tenantry.adversaries.patterns`, mixed with the default victims, run in
step mode through the scheduler's adapter, judged by the harness and the
invariant catalog, and scored by the pattern's objective against the run of
the same victims without the adversary.

A factory may take a keyword ``tenants`` (a tuple of
:class:`~tenantry.model.config.TenantConfig`): it then learns each scenario's
tenants, with the adversary in tier 0 and the victims in tier 1 when
``tiered`` (the arrangement of the model's tiered setups, where a priority
policy can hurt someone), so a priority scheduler can map tiers to its own
priorities.  A zero-argument factory is called as it is.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable

import attrs

from tenantry.model.config import TenantConfig
from tenantry.model.history import History

from .run import Verdict, verify_workload


@attrs.frozen
class Cell:
    """One pattern run against the target.

    Attributes:
        pattern: the pattern; objective: the metric it maximises.
        score: the objective's value (larger is worse for the victims).
        threshold: the pattern's "hurt" threshold (a score at or above it
            means the adversary measurably hurt someone).
        metrics: every metric of :data:`~tenantry.adversaries.objectives.OBJECTIVES`.
        verdict: the step-mode verdict of the run with the adversary.
        scenario: the scenario run (workload, roles, horizon).
    """

    pattern: str
    objective: str
    score: float
    threshold: float
    metrics: dict
    verdict: Verdict
    scenario: Any

    @property
    def hurt(self) -> bool:
        return self.score >= self.threshold


def scenario_tenants(roles: Iterable[tuple[str, str]], tiered: bool) -> tuple[TenantConfig, ...]:
    """Tenants of a scenario: weight 1; tiers per role when ``tiered`` (adversary 0, victims 1)."""
    return tuple(TenantConfig(n, tier=(0 if r == "adversary" else 1) if tiered else 0) for n, r in roles)


def bind(factory: Callable[..., Any], tenants: tuple[TenantConfig, ...]) -> Callable[[], Any]:
    """A zero-argument factory: ``factory(tenants=tenants)`` if it takes ``tenants``, else ``factory``."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return factory
    if "tenants" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return functools.partial(factory, tenants=tenants)
    return factory


def run_cell(factory: Callable[..., Any], pattern: str, *, seed: int = 0, params: dict | None = None,
             tiered: bool = False, timeout_s: float | None = 10.0, determinism: bool = True,
             scenario: Any = None) -> Cell:
    """Run one pattern (or an explicit scenario) against the target; see the module docstring."""
    from tenantry.adversaries.evaluate import cached_before
    from tenantry.adversaries.objectives import all_metrics
    from tenantry.adversaries.patterns import PATTERNS, make_scenario

    sc = scenario if scenario is not None else make_scenario(pattern, params, seed)
    fac = bind(factory, scenario_tenants(sc.roles, tiered))
    v = verify_workload(fac, sc.workload, horizon_s=sc.horizon_s, timeout_s=timeout_s, determinism=determinism,
                        header={"pattern": sc.pattern, "seed": sc.seed})
    base = verify_workload(fac, sc.victim_workload(), horizon_s=sc.horizon_s, timeout_s=timeout_s,
                           determinism=False, catalog=False).history
    twin: History | None = None
    if sc.twin is not None:
        twin = verify_workload(fac, sc.twin.workload, horizon_s=sc.horizon_s, timeout_s=timeout_s,
                               determinism=False, catalog=False).history
    o = v.history.header.get("config", {}).get("order", {})
    w_in, w_out = o.get("w_in", 1.0), o.get("w_out", 2.0)
    unit = max((w_in * r.prompt_tokens + w_out * r.output_tokens for r in sc.workload), default=1.0)
    m = all_metrics(v.history, base, adversaries=sc.adversaries, victims=sc.victims, horizon_s=sc.horizon_s,
                    unit_cost=unit, twin=twin, cached_before=cached_before(sc) if twin is not None else None)
    pat = PATTERNS.get(sc.pattern)
    objective = pat.objective if pat is not None else "ttft_p99_inflation"
    return Cell(sc.pattern, objective, m[objective], pat.finding if pat is not None else 5.0, m, v, sc)


def run_matrix(factory: Callable[..., Any], *, patterns: Iterable[str] | None = None, seed: int = 0,
               tiered: bool = False, timeout_s: float | None = 10.0, determinism: bool = True,
               progress: Callable[[str], None] | None = None) -> list[Cell]:
    """Every pattern (default: all of :data:`~tenantry.adversaries.patterns.PATTERNS`) against the target.

    Raises:
        ConfigError: on an unknown pattern name.
    """
    from tenantry.adversaries.patterns import PATTERNS, get_pattern

    names = list(patterns) if patterns is not None else list(PATTERNS)
    for n in names:
        get_pattern(n)
    cells = []
    for n in names:
        cells.append(run_cell(factory, n, seed=seed, tiered=tiered, timeout_s=timeout_s, determinism=determinism))
        if progress is not None:
            c = cells[-1]
            progress(f"{n:16s} {c.objective}={c.score:.3g}{' HURT' if c.hurt else ''} "
                     f"findings={len(c.verdict.findings)}")
    return cells
