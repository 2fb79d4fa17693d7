"""Run the reference model with the invariant catalog checked: the one checked run.

:func:`run_checked` is the model's driver loop
(:func:`tenantry.model.simulate.run_steps`) with the catalog's state forms after
every step, its history forms on the recorded history and, at depth ``full``,
its two-run forms.  Every caller that asks "did an invariant break on this
workload?" (the stateful tests, the mutant hunt, ``tenantry check``'s
evaluations, the regression cases) goes through it.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import attrs

from tenantry.model.config import Config
from tenantry.model.history import History
from tenantry.model.simulate import Recorder, config_to_dict, run_steps, simulate
from tenantry.model.step import Step
from tenantry.model.workload import Request, Workload, as_workload

from .invariants import INVARIANTS, check_history, check_pair, check_state, relabel_contents
from .invariants_core import Finding, dedup

#: How deep :func:`run_checked` checks: history forms only; state forms after
#: every step too; and the two-run forms (DETERMINISM, NONINTERFERENCE) too.
DEPTHS = ("history", "state", "full")
#: Content-id offset of the NONINTERFERENCE twin (far above any id in use).
RELABEL_OFFSET = 10**9


@attrs.frozen
class CheckedRun:
    """A run's history and its findings.

    Attributes:
        history: the recorded run.
        findings: every finding, deduplicated (:func:`~tenantry.spec.invariants_core.dedup`):
            state forms first, then history forms, then two-run forms.
        unchecked: requested ids that were not checked: not applicable to the
            configuration, or with no form at this depth (NONINTERFERENCE
            without observers).
        coverage: every invariant id -> ``checked (<forms>)`` or why it was not
            (not asked for, not applicable, no form at this depth).
    """

    history: History
    findings: tuple[Finding, ...]
    unchecked: tuple[str, ...] = ()
    coverage: dict = attrs.field(factory=dict, eq=False)

    def by_invariant(self) -> dict[str, list[Finding]]:
        """Findings grouped by invariant id, in order of first appearance."""
        out: dict[str, list[Finding]] = {}
        for f in self.findings:
            out.setdefault(f.invariant, []).append(f)
        return out


def run_checked(config: Config, workload: Workload | Iterable[Request], *, ids: Iterable[str] | None = None,
                depth: str = "state", horizon_s: float | None = None, max_steps: int | None = 2000,
                variant: type[Step] | None = None, observers: Sequence[str] = ()) -> CheckedRun:
    """Simulate ``workload`` on ``config`` and check the invariants ``ids`` (None: all).

    Args:
        depth: one of :data:`DEPTHS`.
        horizon_s, max_steps: where the run stops (seconds, steps), as in
            :func:`~tenantry.model.simulate.simulate`.
        variant: a :class:`~tenantry.model.step.Step` subclass to run instead
            of the model (a mutant).
        observers: tenants whose records NONINTERFERENCE compares (at depth
            ``full``) when every other tenant's prompt contents are relabelled.

    Raises:
        ValueError: on an unknown depth.
        KeyError: on an unknown invariant id.
        ConfigError: if a request names a tenant the configuration lacks.
    """
    if depth not in DEPTHS:
        raise ValueError(f"depth={depth!r}: choose one of {', '.join(DEPTHS)}")
    wl = as_workload(workload)
    wanted = tuple(INVARIANTS) if ids is None else tuple(dict.fromkeys(ids))
    live = [i for i in wanted if INVARIANTS[i].applies(config)]
    state_ids = [i for i in live if INVARIANTS[i].check_state is not None] if depth != "history" else []
    hist_ids = [i for i in live if INVARIANTS[i].check_history is not None]
    pair_ids = [i for i in live if INVARIANTS[i].check_pair is not None and depth == "full"
                and (i != "NONINTERFERENCE" or observers)]
    rec = Recorder(config, True, detail=True)
    for r in wl.requests:
        rec.offered(r)
    findings: list[Finding] = []
    state = None
    run = lambda w: simulate(config, w, horizon_s=horizon_s, max_steps=max_steps, variant=variant, detail=True)
    for tr in run_steps(config, wl, horizon_s=horizon_s, max_steps=max_steps, variant=variant):
        if state_ids:
            findings += check_state(config, tr.prev, tr.state, tr.output, tr.inputs, state_ids)
        rec.observe(tr.state, tr.output)
        state = tr.state
    if state is None:
        from tenantry.model.state import initial_state
        state = initial_state(config)
    history = rec.history(state, {"config": config_to_dict(config), "requests": len(wl)})
    if hist_ids:
        findings += check_history(history, config, hist_ids)
    if "DETERMINISM" in pair_ids:  # two runs of the public driver, byte for byte
        findings += check_pair("DETERMINISM", history, run(wl))
    if "NONINTERFERENCE" in pair_ids:
        twin = wl
        for t in {r.tenant for r in wl} - set(observers):
            twin = relabel_contents(twin, t, RELABEL_OFFSET)
        h2 = run(twin)
        for obs in observers:
            findings += check_pair("NONINTERFERENCE", history, h2, observer=obs)
    done = set(state_ids) | set(hist_ids) | set(pair_ids)
    cov = {}
    for i, inv in INVARIANTS.items():
        forms = [f for f, ids_ in (("state", state_ids), ("history", hist_ids), ("two-run", pair_ids)) if i in ids_]
        cov[i] = (f"checked ({', '.join(forms)})" if forms else "not claimed" if i not in wanted
                  else "not applicable to this configuration" if i not in live
                  else "two-run property: checked at depth full with observers" if inv.check_pair else
                  f"no form at depth {depth}")
    return CheckedRun(history, tuple(dedup(findings)), tuple(i for i in wanted if i not in done), cov)


def run_fleet_checked(fleet, workload: Workload | Iterable[Request], *, ids: Iterable[str] | None = None,
                      depth: str = "state", horizon_s: float | None = None, max_steps: int | None = 2000,
                      step_variant: type[Step] | None = None) -> CheckedRun:
    """Simulate ``workload`` on a fleet (:class:`~tenantry.model.fleet.FleetConfig`) and check
    the per-replica invariants ``ids`` on every replica plus every applicable fleet invariant
    (SPEC.md 7.9), the way ``tenantry verify --history`` judges a fleet history
    (:func:`~tenantry.spec.invariants_fleet.check_fleet_history`, nothing re-implemented).

    Args:
        ids: per-replica invariant ids to check (None: all); fleet invariant ids in it are
            ignored (every applicable fleet invariant is checked).
        depth: one of :data:`DEPTHS`: ``state`` adds the state forms on every replica's every
            step; ``full`` adds DETERMINISM over two fleet runs (NONINTERFERENCE has no fleet
            form: the coverage says so).
        step_variant: a :class:`~tenantry.model.step.Step` subclass every replica runs (a mutant).

    Raises:
        ValueError: on an unknown depth.
        KeyError: on an unknown invariant id.
        ConfigError: if a request names a tenant the configuration lacks.
    """
    from tenantry.model.fleet import simulate_fleet

    from .invariants_fleet import FLEET_INVARIANTS, check_fleet_history, fleet_coverage

    if depth not in DEPTHS:
        raise ValueError(f"depth={depth!r}: choose one of {', '.join(DEPTHS)}")
    wl = as_workload(workload)
    wanted = tuple(INVARIANTS) if ids is None else tuple(i for i in dict.fromkeys(ids) if i not in FLEET_INVARIANTS)
    configs = fleet.run_configs
    live = [i for i in wanted if all(INVARIANTS[i].applies(c) for c in configs)]
    state_ids = [i for i in live if INVARIANTS[i].check_state is not None] if depth != "history" else []
    hist_ids = [i for i in live if INVARIANTS[i].check_history is not None]
    pair_ids = [i for i in live if i == "DETERMINISM" and depth == "full"]
    findings: list[Finding] = []

    def observe(tr) -> None:
        for r, t in enumerate(tr.replicas):
            if t is not None:
                findings.extend(attrs.evolve(f, message=f"replica {r}: {f.message}")
                                for f in check_state(configs[r], t.prev, t.state, t.output, t.inputs, state_ids))

    run = lambda obs=None: simulate_fleet(fleet, wl, horizon_s=horizon_s, max_steps=max_steps,
                                          step_variant=step_variant, detail=True, observe=obs)
    history = run(observe if state_ids else None)
    findings += check_fleet_history(history, hist_ids + list(FLEET_INVARIANTS))
    if pair_ids:
        findings += check_pair("DETERMINISM", history, run())
    done = set(state_ids) | set(hist_ids) | set(pair_ids)
    cov = {}
    for i, inv in INVARIANTS.items():
        forms = [f for f, ids_ in (("state", state_ids), ("history", hist_ids), ("two-run", pair_ids)) if i in ids_]
        cov[i] = (f"checked ({', '.join(forms)}{', every replica' if forms != ['two-run'] else ', the fleet'})"
                  if forms else "not claimed" if i not in wanted
                  else ("not applicable: under fleet accounting each replica runs with its lift off and its "
                        "counters are the fleet's (FLEET-VTC-GAP judges them)" if fleet.accounting == "fleet"
                        and INVARIANTS[i].applies(fleet.replicas[0]) else "not applicable to this configuration")
                  if i not in live
                  else "two-run property: no fleet form" if i != "DETERMINISM" and inv.check_pair
                  else "two-run property: checked at depth full" if inv.check_pair else f"no form at depth {depth}")
    cov.update(fleet_coverage(history))
    return CheckedRun(history, tuple(dedup(findings)), tuple(i for i in wanted if i not in done), cov)
