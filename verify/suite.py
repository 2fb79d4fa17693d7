"""The tenantry suite against a scheduler under test, as plain functions that
raise :class:`TenantryFailure`: used by the pytest plugin (one test item per
check) and by its ``tenantry_verify`` fixture.

* :func:`stateful_check`: a Hypothesis stateful run.  Rules are the
  environment's actions (requests arrive, a client cancels, steps run); after
  every step the harness's checks must find nothing.  Hypothesis shrinks a
  failing run to a minimal one, which is turned into a workload file.
* :func:`pattern_check`: one adversary pattern's scenario in step mode (with
  the catalog and the determinism re-run).  A finding is shrunk by
  :func:`shrink_workload`: cut after the failing step, delta debugging over
  the requests (Zeller and Hildebrandt, IEEE TSE 2002), then halving token
  counts, keeping the same invariant broken.

Every failure carries the (shrunk) workload, written as JSON Lines under the
output folder, and the ``tenantry verify`` command that replays it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Callable, Iterable

import attrs

from tenantry.model.config import TenantConfig
from tenantry.model.workload import Request, Workload

from .findings import Finding
from .run import verify_workload

#: Tenants of the stateful runs.
STATEFUL_TENANTS = ("t0", "t1", "t2")


class TenantryFailure(AssertionError):
    """The scheduler under test broke an invariant or the protocol.

    Attributes:
        findings: the findings (first is the one shrunk for).
        workload, cancellations: the (shrunk) inputs that show it.
        path: the workload file written, or None.
        replay: the command that replays it.
    """

    def __init__(self, title: str, findings: list[Finding], workload: Workload,
                 cancellations: tuple = (), path: Path | None = None, replay: str = "") -> None:
        self.title, self.findings, self.workload = title, list(findings), workload
        self.cancellations, self.path, self.replay = tuple(cancellations), path, replay
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
        lines.append(f"workload: {len(reqs)} requests" + (f", {len(self.cancellations)} cancellations"
                                                          if self.cancellations else ""))
        for r in reqs[:12]:
            lines.append(f"  request {r.request_id} tenant {r.tenant} arrival_s={r.arrival_s:.6g} "
                         f"prompt_tokens={r.prompt_tokens} output_tokens={r.output_tokens}")
        if len(reqs) > 12:
            lines.append(f"  ... and {len(reqs) - 12} more")
        for t, rid in self.cancellations:
            lines.append(f"  cancel request {rid} at t_s={t:.6g}")
        if self.path is not None:
            lines.append(f"written to: {self.path}")
        if self.replay:
            lines.append(f"replay: {self.replay}")
        return "\n".join(lines)


def write_replay(out_dir: Path | str, name: str, target: str, workload: Workload, cancellations: tuple = (),
                 horizon_s: float | None = None) -> tuple[Path, str]:
    """Write the workload (and cancellations) under ``out_dir``; return (path, replay command)."""
    import json

    from tenantry.model.history import atomic_write_text
    from tenantry.model.traces import write_workload_jsonl

    out = Path(out_dir)
    path = out / f"{name}.jsonl"
    write_workload_jsonl(workload, path)
    cmd = f"tenantry verify --target {shlex.quote(target)} --workload {shlex.quote(str(path))}"
    if cancellations:
        cpath = out / f"{name}.cancellations.json"
        atomic_write_text(cpath, [json.dumps([[t, rid] for t, rid in cancellations])])
        cmd += f" --cancellations {shlex.quote(str(cpath))}"
    if horizon_s is not None:
        cmd += f" --horizon-s {horizon_s}"
    return path, cmd


# --- shrinking ------------------------------------------------------------------------


def shrink_workload(fails: Callable[[Workload], bool], workload: Workload, *, max_evaluations: int = 150) -> Workload:
    """A smaller workload on which ``fails`` still holds.

    1. ddmin over the requests: try each of n chunks alone, then each
       complement; keep the first that fails; otherwise double n;
    2. move every arrival to time 0, if it still fails;
    3. halve each request's output tokens, then its prompt tokens (not below 1),
       keeping each change that still fails;
    and again from 1 while anything changed.
    At most ``max_evaluations`` calls of ``fails``; the result always fails.
    """
    budget = [max_evaluations]

    def test(rs: list[Request]) -> bool:
        if budget[0] <= 0 or not rs:
            return False
        budget[0] -= 1
        return fails(Workload(tuple(rs)))

    cur = list(workload.requests)
    while budget[0] > 0:
        before = cur
        cur = _ddmin(cur, test)
        if any(r.arrival_s for r in cur) and test(together := [attrs.evolve(r, arrival_s=0.0) for r in cur]):
            cur = together
        for field in ("output_tokens", "prompt_tokens"):
            for i in range(len(cur)):
                while budget[0] > 0 and getattr(cur[i], field) > 1:
                    cand = cur[:i] + [attrs.evolve(cur[i], **{field: max(1, getattr(cur[i], field) // 2)})] + cur[i + 1:]
                    if not test(cand):
                        break
                    cur = cand
        if cur == before:
            break
    return Workload(tuple(cur))


def _ddmin(cur: list[Request], test: Callable[[list[Request]], bool]) -> list[Request]:
    """Delta debugging over requests (Zeller and Hildebrandt 2002): chunks, then complements."""
    n = 2
    while len(cur) >= 2:
        size = -(-len(cur) // n)
        chunks = [cur[i:i + size] for i in range(0, len(cur), size)]
        nxt = next((c for c in chunks if test(c)), None)
        if nxt is not None:
            cur, n = nxt, 2
            continue
        if len(chunks) > 2:
            nxt = next((comp for i in range(len(chunks))
                        if test(comp := [r for j, c in enumerate(chunks) if j != i for r in c])), None)
            if nxt is not None:
                cur, n = nxt, max(n - 1, 2)
                continue
        if n >= len(cur):
            break
        n = min(len(cur), 2 * n)
    return cur


def _same(invariant: str) -> Callable[[Any], bool]:
    return lambda v: any(f.invariant == invariant for f in v.findings)


def pattern_check(factory: Callable[[], Any], pattern: str, *, target: str, out_dir: Path | str, seed: int = 0,
                  tiered: bool = False, timeout_s: float | None = 10.0, max_evaluations: int = 150) -> None:
    """Run one adversary pattern against the scheduler; raise :class:`TenantryFailure` (shrunk) on a finding."""
    from tenantry.adversaries.patterns import make_scenario

    from .matrix import bind, scenario_tenants

    sc = make_scenario(pattern, None, seed)
    fac = bind(factory, scenario_tenants(sc.roles, tiered))
    v = verify_workload(fac, sc.workload, horizon_s=sc.horizon_s, timeout_s=timeout_s)
    if v.ok:
        return
    first = v.findings[0]
    det = first.invariant == "DETERMINISM"
    fails_v = _same(first.invariant)
    wl = sc.workload
    if first.step_index is not None and first.step_index < len(v.history.steps):
        t_cut = v.history.steps[first.step_index].start_s
        cut = Workload(tuple(r for r in wl if r.arrival_s <= t_cut))
        if len(cut) < len(wl) and fails_v(verify_workload(fac, cut, horizon_s=sc.horizon_s, timeout_s=timeout_s,
                                                          determinism=det)):
            wl = cut
    wl = shrink_workload(lambda w: fails_v(verify_workload(fac, w, horizon_s=sc.horizon_s, timeout_s=timeout_s,
                                                           determinism=det)), wl, max_evaluations=max_evaluations)
    final = verify_workload(fac, wl, horizon_s=sc.horizon_s, timeout_s=timeout_s, determinism=det)
    found = [f for f in final.findings if f.invariant == first.invariant] or list(v.findings)
    path, cmd = write_replay(out_dir, f"{pattern}-{first.invariant}", target, wl, horizon_s=sc.horizon_s)
    raise TenantryFailure(f"{target}: pattern {pattern} breaks {first.invariant} (shrunk from {len(sc.workload)} "
                          f"to {len(wl)} requests)", found, wl, (), path, cmd)


# --- the stateful run ---------------------------------------------------------------------


def stateful_check(factory: Callable[[], Any], *, target: str, out_dir: Path | str, max_examples: int | None = None,
                   steps_per_example: int = 20, timeout_s: float | None = 10.0, tenants: Iterable[str] = STATEFUL_TENANTS,
                   derandomize: bool = True, max_evaluations: int = 150) -> None:
    """Hypothesis stateful run of the scheduler; raise :class:`TenantryFailure` with the shrunk workload.

    Hypothesis generates the runs; the first failing run's inputs become a
    workload (arrival times are the harness clock when each request arrived)
    with its cancellations, which :func:`shrink_workload` then reduces.  (Hypothesis's
    own shrinking replays every candidate run to its end, which costs minutes for
    runs of a few hundred steps; delta debugging on the workload is bounded.)
    """
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from .matrix import bind

    names = tuple(tenants)
    fac = bind(factory, tuple(TenantConfig(n) for n in names))
    machine = _machine(fac, names, timeout_s)
    base = settings()
    s = settings(base, max_examples=max_examples or base.max_examples, stateful_step_count=steps_per_example,
                 deadline=None, derandomize=derandomize, database=None if derandomize else base.database,
                 suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False,
                 phases=(Phase.explicit, Phase.reuse, Phase.generate))
    try:
        run_state_machine_as_test(machine, settings=s)
    except _StatefulFinding as e:
        first = e.findings[0]
        cancels = e.cancellations

        def verdict(w: Workload) -> Any:
            ids = {r.request_id for r in w}
            return verify_workload(fac, w, cancellations=tuple(c for c in cancels if c[1] in ids),
                                   timeout_s=timeout_s, determinism=False, catalog=False)

        fails = lambda w: _same(first.invariant)(verdict(w))
        wl = e.workload
        if first.step_index is not None:
            cut = Workload(tuple(r for r in wl if r.arrival_s <= e.fail_t_s))
            if len(cut) < len(wl) and fails(cut):
                wl = cut
        wl = shrink_workload(fails, wl, max_evaluations=max_evaluations)
        ids = {r.request_id for r in wl}
        cancels = tuple(c for c in cancels if c[1] in ids)
        v = verdict(wl)
        findings = [f for f in v.findings if f.invariant == first.invariant] or e.findings
        path, cmd = write_replay(out_dir, f"stateful-{first.invariant}", target, wl, cancels)
        raise TenantryFailure(f"{target}: a stateful run breaks {first.invariant} (shrunk from "
                              f"{len(e.workload)} to {len(wl)} requests)", list(findings), wl, cancels, path,
                              cmd) from None


class _StatefulFinding(AssertionError):
    def __init__(self, findings: list[Finding], workload: Workload, cancellations: tuple, fail_t_s: float) -> None:
        self.findings, self.workload, self.cancellations = findings, workload, cancellations
        self.fail_t_s = fail_t_s
        super().__init__("; ".join(f.render() for f in findings[:3]))


def _machine(factory: Callable[[], Any], names: tuple[str, ...], timeout_s: float | None):
    """A RuleBasedStateMachine class driving a fresh harness per example."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

    from .harness import Harness

    probe = Harness.start(factory, names, timeout_s=timeout_s)
    probe.close()
    cfg = probe.config
    max_prompt = max(1, min(cfg.max_context_tokens - 64, cfg.num_blocks * cfg.block_size_tokens // 2))

    class SchedulerMachine(RuleBasedStateMachine):
        """Requests arrive, clients cancel, the replica steps; every step is checked."""

        def __init__(self) -> None:
            super().__init__()
            self.h = Harness.start(factory, names, timeout_s=timeout_s)
            self.requests: list[Request] = []
            self.cancels: list[tuple[float, int]] = []
            self.pending: list[Request] = []
            self.pending_cancels: list[int] = []

        def _check(self) -> None:
            if self.h.findings:
                raise _StatefulFinding(list(self.h.findings), Workload(tuple(self.requests)), tuple(self.cancels),
                                       self.h.t_s)

        def _step(self) -> None:
            if not (self.h.has_work() or self.pending or self.pending_cancels):
                return
            self.h.step(self.pending, self.pending_cancels)
            self.pending, self.pending_cancels = [], []
            self._check()

        @rule(tenant=st.sampled_from(names), prompt=st.integers(1, max_prompt), output=st.integers(1, 48),
              copies=st.integers(1, 3))
        def arrive(self, tenant: str, prompt: int, output: int, copies: int) -> None:
            """Tenant ``tenant`` sends ``copies`` requests now."""
            for _ in range(copies):
                r = Request(len(self.requests), tenant, self.h.t_s, prompt, output)
                self.requests.append(r)
                self.pending.append(r)

        @precondition(lambda self: bool(self.h.live))
        @rule(data=st.data())
        def cancel(self, data: Any) -> None:
            """A client cancels one of its requests in flight."""
            rid = data.draw(st.sampled_from(sorted(self.h.live)))
            if rid not in self.pending_cancels:
                self.pending_cancels.append(rid)
                self.cancels.append((self.h.t_s, rid))

        @rule(steps=st.integers(1, 8))
        def run(self, steps: int) -> None:
            """The replica runs ``steps`` steps."""
            for _ in range(steps):
                self._step()

        def teardown(self) -> None:
            try:
                for _ in range(2000):
                    if not (self.h.has_work() or self.pending) or self.h.stopped:
                        break
                    self._step()
                self._check()
            finally:
                self.h.close()

    return SchedulerMachine
