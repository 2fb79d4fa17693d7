"""Run the reference model with the invariant catalog checked: the one checked run.

:func:`run_checked` is the model's driver loop
(:func:`tenantry.runner.simulate.run_steps`) with the catalog's state forms after
every step, its history forms on the recorded history and, at depth ``full``,
its two-run forms.  Every caller that asks "did an invariant break on this
workload?" (the stateful tests, the mutant hunt, ``tenantry check``'s
evaluations, the regression cases) goes through it.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import attrs

from tenantry.model.config import Config
from tenantry.model.step import Step
from tenantry.model.workload import Request, Workload, as_workload
from tenantry.runner.history import History
from tenantry.runner.simulate import Recorder, config_to_dict, run_steps, simulate

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


def _forms(live: Sequence[str], depth: str, pair_ok) -> tuple[list[str], list[str], list[str]]:
    """The ids of ``live`` checked by state, history and two-run forms at ``depth``
    (``pair_ok(id)``: whether this run can check that two-run form)."""
    state_ids = [i for i in live if INVARIANTS[i].check_state is not None] if depth != "history" else []
    hist_ids = [i for i in live if INVARIANTS[i].check_history is not None]
    pair_ids = [i for i in live if INVARIANTS[i].check_pair is not None and depth == "full" and pair_ok(i)]
    return state_ids, hist_ids, pair_ids


def _coverage(wanted: Sequence[str], live: Sequence[str], depth: str, forms_of: tuple, unfit, unpaired: str,
              where) -> dict[str, str]:
    """Every invariant id -> ``checked (<forms><where>)`` or why not (:attr:`CheckedRun.coverage`):
    ``unfit(id)`` for a wanted id that does not apply, ``unpaired(id)`` for a two-run form not run,
    ``where(id, forms)`` a suffix naming where the forms ran."""
    cov = {}
    for i, inv in INVARIANTS.items():
        forms = [f for f, ids_ in zip(("state", "history", "two-run"), forms_of) if i in ids_]
        cov[i] = (f"checked ({', '.join(forms)}{where(i, forms)})" if forms else "not claimed" if i not in wanted
                  else unfit(i) if i not in live else unpaired(i) if inv.check_pair else f"no form at depth {depth}")
    return cov


def noninterference_twin(workload: Workload, observers: Sequence[str]) -> Workload:
    """NONINTERFERENCE's second workload (SPEC.md 7.5): every tenant's prefix content ids but the
    ``observers``' relabelled (:func:`~tenantry.spec.invariants.relabel_contents`, shifted by
    :data:`RELABEL_OFFSET`); the same arrivals, lengths and tenants."""
    twin = workload
    for t in sorted({r.tenant for r in workload} - set(observers)):
        twin = relabel_contents(twin, t, RELABEL_OFFSET)
    return twin


def noninterference(history: History, twin_history: History, observers: Sequence[str]) -> list[Finding]:
    """NONINTERFERENCE judged on a run and its :func:`noninterference_twin`'s run: each observer's
    records must be the same in both (the model's, or a scheduler under test's runs)."""
    out: list[Finding] = []
    for obs in observers:
        out += check_pair("NONINTERFERENCE", history, twin_history, observer=obs)
    return out


def run_checked(config: Config, workload: Workload | Iterable[Request], *, ids: Iterable[str] | None = None,
                depth: str = "state", horizon_s: float | None = None, max_steps: int | None = 2000,
                variant: type[Step] | None = None, observers: Sequence[str] = ()) -> CheckedRun:
    """Simulate ``workload`` on ``config`` and check the invariants ``ids`` (None: all).

    Args:
        depth: one of :data:`DEPTHS`.
        horizon_s, max_steps: where the run stops (seconds, steps), as in
            :func:`~tenantry.runner.simulate.simulate`.
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
    state_ids, hist_ids, pair_ids = _forms(live, depth, lambda i: i != "NONINTERFERENCE" or bool(observers))
    rec = Recorder(config, True, detail=True)
    for r in wl.requests:
        rec.offered(r)
    findings: list[Finding] = []
    state = None
    run = lambda w: simulate(config, w, horizon_s=horizon_s, max_steps=max_steps, variant=variant, detail=True)
    for tr in run_steps(config, wl, horizon_s=horizon_s, max_steps=max_steps, variant=variant):
        rec.observe(tr.state, tr.output)
        if state_ids:  # the state forms derived from record forms read the step's record
            findings += check_state(config, tr.prev, tr.state, tr.output, tr.inputs, state_ids, rec.steps[-1],
                                    rec.steps[-2] if len(rec.steps) > 1 else None)
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
        findings += noninterference(history, run(noninterference_twin(wl, observers)), observers)
    done = set(state_ids) | set(hist_ids) | set(pair_ids)
    cov = _coverage(wanted, live, depth, (state_ids, hist_ids, pair_ids), lambda i: "not applicable to this configuration",
                    lambda i: "two-run property: checked at depth full with observers", lambda i, forms: "")
    return CheckedRun(history, tuple(dedup(findings)), tuple(i for i in wanted if i not in done), cov)


def run_fleet_checked(fleet, workload: Workload | Iterable[Request], *, ids: Iterable[str] | None = None,
                      depth: str = "state", horizon_s: float | None = None, max_steps: int | None = 2000,
                      step_variant: type[Step] | None = None) -> CheckedRun:
    """Simulate ``workload`` on a fleet (:class:`~tenantry.model.routers.FleetConfig`) and check
    the per-replica invariants ``ids`` on every replica plus every applicable fleet invariant
    (SPEC.md 7.9), the way ``tenantry verify --history`` judges a fleet history
    (:func:`~tenantry.spec.invariants_fleet.check_fleet_history`) and the stateful machine
    judges a fleet step (:func:`~tenantry.spec.invariants_fleet.check_fleet_transition`):
    nothing re-implemented.

    Args:
        ids: per-replica invariant ids to check (None: all); fleet invariant ids in it are
            ignored (every applicable fleet invariant is checked).
        depth: one of :data:`DEPTHS`: ``state`` adds the state forms on every replica's every
            step and the fleet invariants' state forms; ``full`` adds DETERMINISM over two
            fleet runs (NONINTERFERENCE has no fleet form: the coverage says so).
        step_variant: a :class:`~tenantry.model.step.Step` subclass every replica runs (a mutant).

    Raises:
        ValueError: on an unknown depth.
        KeyError: on an unknown invariant id.
        ConfigError: if a request names a tenant the configuration lacks.
    """
    from tenantry.runner.fleet import FleetRecorder, run_fleet, simulate_fleet
    from tenantry.model.state import initial_state

    from .invariants_fleet import (FLEET_INVARIANTS, FleetStepContext, check_fleet_history, check_fleet_transition,
                                   fleet_coverage)

    if depth not in DEPTHS:
        raise ValueError(f"depth={depth!r}: choose one of {', '.join(DEPTHS)}")
    wl = as_workload(workload)
    wanted = tuple(INVARIANTS) if ids is None else tuple(i for i in dict.fromkeys(ids) if i not in FLEET_INVARIANTS)
    configs = fleet.run_configs
    live = [i for i in wanted if all(INVARIANTS[i].applies(c) for c in configs)]
    state_ids, hist_ids, pair_ids = _forms(live, depth, lambda i: i == "DETERMINISM")
    findings: list[Finding] = []
    rec = FleetRecorder(fleet, detail=True)
    for r in wl.requests:
        rec.offer(r)
    ctx = FleetStepContext(fleet)
    before = [initial_state(c) for c in configs]
    ran = None
    for tr, ran in run_fleet(fleet, wl, horizon_s=horizon_s, max_steps=max_steps, step_variant=step_variant):
        if depth != "history":
            findings += check_fleet_transition(ctx, before, tr, ran, state_ids)
        rec.observe(tr)
        before = [rep.state for rep in ran.replicas]
    history = rec.history(ran, {"requests": len(wl)})
    findings += check_fleet_history(history, hist_ids + list(FLEET_INVARIANTS))
    if pair_ids:
        findings += check_pair("DETERMINISM", history, simulate_fleet(
            fleet, wl, horizon_s=horizon_s, max_steps=max_steps, step_variant=step_variant, detail=True))
    done = set(state_ids) | set(hist_ids) | set(pair_ids)

    def unfit(i: str) -> str:
        if fleet.accounting == "fleet" and INVARIANTS[i].applies(fleet.replicas[0]):
            return ("not applicable: under fleet accounting each replica runs with its lift off and its "
                    "counters are the fleet's (FLEET-VTC-GAP judges them)")
        return "not applicable to this configuration"

    cov = _coverage(wanted, live, depth, (state_ids, hist_ids, pair_ids), unfit,
                    lambda i: "two-run property: checked at depth full" if i == "DETERMINISM"
                    else "two-run property: no fleet form",
                    lambda i, forms: ", every replica" if forms != ["two-run"] else ", the fleet")
    cov.update(fleet_coverage(history))
    return CheckedRun(history, tuple(dedup(findings)), tuple(i for i in wanted if i not in done), cov)
