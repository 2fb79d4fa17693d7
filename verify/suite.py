"""The tenantry suite against a scheduler under test, as plain functions that
raise :class:`TenantryFailure`: used by the pytest plugin (one test item per
check) and by its ``tenantry_verify`` fixture.

* :func:`stateful_check`: a Hypothesis stateful run.  Rules are the
  environment's actions (requests arrive, a client cancels, steps run); after
  every step the harness's checks must find nothing.  The failing run's
  inputs become a workload, shrunk like any other.
* :func:`pattern_check`: one adversary pattern's scenario in step mode (with
  the catalog and the determinism re-run).

A failure is shrunk by :func:`shrink_finding` (the one shrinker,
:mod:`tenantry.testing.shrink`: cut after the failing step, delta debugging
over the requests, dropping cancellations, halving token counts), keeping the
same invariant broken.

Every failure carries the (shrunk) workload, written as JSON Lines under the
output folder, and the ``tenantry verify`` command that replays it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tenantry.model.workload import Workload
from tenantry.spec.invariants_core import Finding
from tenantry.testing.shrink import first_failing, shrink

from .harness import Harness
from .run import verify_workload

#: Tenants of the stateful runs.
STATEFUL_TENANTS = ("t0", "t1", "t2")


class TenantryFailure(AssertionError):
    """The scheduler under test broke an invariant or the protocol.

    Attributes:
        findings: the findings on the (shrunk) workload: first, when another invariant breaks
            at an earlier step than the one shrunk for, that invariant's first finding (the
            likelier cause, as a report's ``witness_first``), then the ones shrunk for.
        workload: the (shrunk) inputs that show it, cancellations included.
        path: the workload file written, or None.
        replay: the command that replays it.
    """

    def __init__(self, title: str, findings: list[Finding], workload: Workload,
                 path: Path | None = None, replay: str = "") -> None:
        self.title, self.findings, self.workload = title, list(findings), workload
        self.path, self.replay = path, replay
        super().__init__(self.report())

    def report(self) -> str:
        """The failure as text: findings, the workload (inline when small), the replay command."""
        lines = [self.title]
        lines += ["  " + f.render() for f in self.findings[:8]]
        if len(self.findings) > 8:
            lines.append(f"  ... and {len(self.findings) - 8} more findings")
        reqs = self.workload.requests
        if not reqs and self.path is None:
            return "\n".join(lines)
        cancels = self.workload.cancellations
        lines.append(f"workload: {len(reqs)} requests" + (f", {len(cancels)} cancelled" if cancels else ""))
        for r in reqs[:12]:
            lines.append(f"  request {r.request_id} tenant {r.tenant} arrival_s={r.arrival_s:.6g} "
                         f"prompt_tokens={r.prompt_tokens} output_tokens={r.output_tokens}")
        if len(reqs) > 12:
            lines.append(f"  ... and {len(reqs) - 12} more")
        for t, rid in cancels:
            lines.append(f"  cancel request {rid} at t_s={t:.6g}")
        if self.path is not None:
            lines.append(f"written to: {self.path}")
        if self.replay:
            lines.append(f"replay: {self.replay}")
        return "\n".join(lines)


def write_replay(out_dir: Path | str, name: str, target: str, workload: Workload,
                 horizon_s: float | None = None, tenants: Iterable[str] = (),
                 replay_dir: Path | str | None = None, shown_dir: Path | str | None = None,
                 target_path: str | None = None, adversaries: Iterable[str] = (), tiered: bool = False,
                 weighted: bool = False) -> tuple[Path, str]:
    """Write the workload (cancellations included) under ``out_dir``; return (path, replay command).
    ``tenants``: the tenant order the run had (the command passes it as ``--victims``; without
    it the replay orders tenants by first arrival, and order breaks ties).  The command writes
    its report to ``replay_dir / <name>-replay`` (default ``out_dir``; a report folder passes
    its ``<report>-replay`` twin, so that running the replay leaves the report as it was).
    ``shown_dir``: the folder the command names for the workload (default ``out_dir``; a report
    being staged passes where it will be once the run ends); ``target_path``: the target's
    ``--target-path``, repeated in the command so that it imports the target as the run did;
    ``adversaries``, ``tiered``, ``weighted``: the run's adversary tenants (``--adversaries``,
    before ``tenants``), tiers and weights (:func:`~tenantry.verify.run.scenario_tenants`)."""
    from tenantry.runner.traces import write_workload_jsonl

    out = Path(out_dir)
    path = out / f"{name}.jsonl"
    write_workload_jsonl(workload, path)
    shown = Path(shown_dir or out) / f"{name}.jsonl"
    cmd = f"tenantry verify --target {shlex.quote(target)} --workload {shlex.quote(str(shown))}"
    if horizon_s is not None:
        cmd += f" --horizon-s {horizon_s}"
    adversaries = tuple(adversaries)
    if adversaries:
        cmd += f" --adversaries {shlex.quote(','.join(adversaries))}"
    if tenants:
        cmd += f" --victims {shlex.quote(','.join(tenants))}"
    cmd += (" --tiered" if tiered else "") + (" --weighted" if weighted else "")
    if target_path:
        cmd += f" --target-path {shlex.quote(str(target_path))}"
    return path, cmd + f" --out {shlex.quote(str(Path(replay_dir or out) / f'{name}-replay'))}"


def failure_title(target: str, what: str, invariant: str, findings: Sequence[Finding], shrunk: str) -> tuple[str, list[Finding]]:
    """The first line of a failure and the findings it lists, the cause first.

    ``findings``: the verdict on the shrunk workload (in step order); ``invariant``: the one it
    was shrunk for; ``shrunk``: ``"shrunk from N to M requests"``.  When another invariant breaks
    at an earlier step of that workload (the rule of a report's ``witness_first``,
    :func:`tenantry.adversaries.check._breaks_first`: a leaked block also shows as a stall or an
    eviction it forced), that one leads the line and the list, as it leads the replay's output.

    Returns (title, [the earlier invariant's first finding, if any] + ``invariant``'s findings).
    """
    from tenantry.adversaries.check import _breaks_first

    own = [f for f in findings if f.invariant == invariant]
    first = _breaks_first(findings, invariant)
    if first is None:
        return f"{target}: {what} breaks {invariant} ({shrunk})", own
    step = min(f.step for f in own if f.step is not None)
    return (f"{target}: {what} breaks {first.invariant} at step {first.step}, before {invariant} at step {step} "
            f"({shrunk}): {invariant} may follow from it; look at {first.invariant} first", [first] + own)


def shrink_finding(verdict: Callable[[Workload], Any], invariant: str, workload: Workload, *,
                   cut_after_s: float | None = None, max_evaluations: int = 150) -> Workload:
    """A smaller workload whose verdict still has a finding of ``invariant``
    (the one shrinker, :func:`tenantry.testing.shrink.shrink`, with every phase)."""
    fails = lambda w: any(f.invariant == invariant for f in verdict(w).findings)
    return shrink(workload, first_failing(fails), cut_after_s=cut_after_s, max_evaluations=max_evaluations).workload


def pattern_check(factory: Callable[[], Any], pattern: str, *, target: str, out_dir: Path | str, seed: int = 0,
                  tiered: bool = False, timeout_s: float | None = 10.0, max_evaluations: int = 150,
                  weighted: bool = False) -> None:
    """Run one adversary pattern against the scheduler (tenants' tiers and weights as
    :func:`~tenantry.verify.run.scenario_tenants` gives them); raise :class:`TenantryFailure`
    (shrunk, with a replay command that runs the same tenants) on a finding."""
    from tenantry.adversaries.patterns import ADVERSARY, get_pattern, limits_of, make_scenario

    from .run import bind, scenario_tenants

    sc = make_scenario(pattern, None, seed)
    fac = bind(factory, scenario_tenants(sc.roles, tiered, weighted))
    if get_pattern(pattern).uses_limits:  # boundary requests at the limits the scheduler claims
        h = Harness.start(fac, [n for n, _ in sc.roles], timeout_s=timeout_s)
        h.close()
        if not h.stopped:
            sc = make_scenario(pattern, None, seed, limits=limits_of(h.config, ADVERSARY))
    v = verify_workload(fac, sc.workload, horizon_s=sc.horizon_s, timeout_s=timeout_s)
    if v.ok:
        return
    first = v.findings[0]
    det = first.invariant == "DETERMINISM"
    verdict = lambda w: verify_workload(fac, w, horizon_s=sc.horizon_s, timeout_s=timeout_s, determinism=det)
    cut = v.history.steps[first.step].start_s if first.step is not None and first.step < len(v.history.steps) else None
    wl = shrink_finding(verdict, first.invariant, sc.workload, cut_after_s=cut, max_evaluations=max_evaluations)
    title, found = failure_title(target, f"pattern {pattern}", first.invariant, verdict(wl).findings,
                                 f"shrunk from {len(sc.workload)} to {len(wl)} requests")
    path, cmd = write_replay(out_dir, f"{pattern}-{first.invariant}", target, wl, horizon_s=sc.horizon_s,
                             adversaries=sc.adversaries, tenants=sc.victims, tiered=tiered, weighted=weighted)
    raise TenantryFailure(title, found or list(v.findings), wl, path, cmd)


# --- the stateful run ---------------------------------------------------------------------


def stateful_check(factory: Callable[[], Any], *, target: str, out_dir: Path | str, max_examples: int | None = None,
                   steps_per_example: int = 20, timeout_s: float | None = 10.0, tenants: Iterable[str] = STATEFUL_TENANTS,
                   derandomize: bool = True, max_evaluations: int = 150,
                   replay_dir: Path | str | None = None, shown_dir: Path | str | None = None,
                   target_path: str | None = None, weighted: bool = True) -> None:
    """Hypothesis stateful run of the scheduler; raise :class:`TenantryFailure` with the shrunk workload.

    ``weighted`` (default): a factory that takes ``tenants`` gets them with the unequal
    :data:`~tenantry.verify.run.WEIGHTS`, so a weighted fair scheduler's use of its weights is
    judged under what it claims (the replay command says ``--weighted``).

    The machine is :class:`tenantry.testing.stateful.ReplicaMachine` over a fresh
    harness per example, judged by the harness's findings.  The first failing
    run's inputs become a workload (arrival times are the harness clock when
    each request arrived, cancellations its ``cancel_s``), which
    :func:`shrink_finding` then reduces.  (Hypothesis's own shrinking replays
    every candidate run to its end, which costs minutes for runs of a few
    hundred steps; the one shrinker on the workload is bounded.)
    """
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from tenantry.testing.stateful import StatefulFinding

    from .run import bind, scenario_tenants

    names = tuple(tenants)
    fac = bind(factory, scenario_tenants([(n, "victim") for n in names], False, weighted))
    machine = harness_machine(fac, names, timeout_s)
    base = settings()
    s = settings(base, max_examples=max_examples or base.max_examples, stateful_step_count=steps_per_example,
                 deadline=None, derandomize=derandomize, database=None if derandomize else base.database,
                 suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False,
                 phases=(Phase.explicit, Phase.reuse, Phase.generate))
    try:
        run_state_machine_as_test(machine, settings=s)
    except StatefulFinding as e:
        first = e.findings[0]
        verdict = lambda w: verify_workload(fac, w, timeout_s=timeout_s, determinism=False)
        wl = shrink_finding(verdict, first.invariant, e.workload,
                            cut_after_s=e.fail_t_s if first.step is not None else None,
                            max_evaluations=max_evaluations)
        title, findings = failure_title(target, "a stateful run", first.invariant, verdict(wl).findings,
                                        f"shrunk from {len(e.workload)} to {len(wl)} requests")
        path, cmd = write_replay(out_dir, f"stateful-{first.invariant}", target, wl, tenants=names,
                                 replay_dir=replay_dir, shown_dir=shown_dir, target_path=target_path,
                                 weighted=weighted)
        raise TenantryFailure(title, findings or list(e.findings), wl, path, cmd) from None


def harness_machine(factory: Callable[[], Any], names: tuple[str, ...], timeout_s: float | None):
    """A :class:`~tenantry.testing.stateful.ReplicaMachine` class driving a fresh harness per example."""
    from tenantry.adversaries.patterns import MAX_BOUNDARY_TOKENS, boundary_sizes, limits_of
    from tenantry.testing.stateful import ReplicaMachine

    from .harness import Harness
    from .run import catalog_findings

    probe = Harness.start(factory, names, timeout_s=timeout_s)
    probe.close()
    cfg = probe.config
    max_prompt = max(1, min(cfg.max_context_tokens - 64, cfg.num_blocks * cfg.block_size_tokens // 2))
    # the boundary pattern's sizes at the claimed limits (the first tenant's caps), at shifts 0 and 1 (a
    # request's last token needs no KV: one more token shows a pool overrun), prompts capped as there
    limits = tuple(dict.fromkeys((min(pr, MAX_BOUNDARY_TOKENS), o) for shift in (0, 1)
                                 for pr, o in boundary_sizes(limits_of(cfg, names[0]), shift)))

    class SchedulerMachine(ReplicaMachine):
        """Requests arrive, clients cancel, the scheduler under test steps; the harness's protocol
        checks judge every step, the invariant catalog the whole run at its end."""

        max_prompt_tokens = max_prompt
        max_output_tokens = 48
        limit_sizes = limits

        def build(self, data):
            self.h = Harness.start(factory, names, timeout_s=timeout_s)
            self.seen = 0
            return self.h, names

        def judge_step(self):
            new = self.h.findings[self.seen:]
            self.seen = len(self.h.findings)
            return list(self.h.findings) if new else []

        def judge_end(self):
            return list(self.h.findings) + catalog_findings(self.h.history(), self.h.claims, self.h.books_call)

        def close(self):
            self.h.close()

    return SchedulerMachine
