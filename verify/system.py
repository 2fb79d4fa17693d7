"""A scheduler under test as a system of the adversary matrix (``tenantry verify --target``).

:class:`TargetSystem` is what ``tenantry check``'s searches evaluate when the
system is a target ``module:factory`` (:class:`tenantry.adversaries.evaluate.System`):
every evaluation drives a fresh adapter through the harness
(:func:`~tenantry.verify.run.verify_workload`) and judges it with the invariant
catalog; at depth ``full`` the run is repeated in a fresh Python process
(:func:`_rerun_main`) for DETERMINISM, and the short stateful run of the suite
(:mod:`tenantry.verify.suite`) is its extra.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import attrs

from tenantry.model.workload import Workload
from tenantry.runner.history import History
from tenantry.spec.invariants_core import Finding

from .harness import Harness
from .protocol import Claims, finding
from .run import Verdict, bind, preflight, scenario_tenants, verify_workload
#: PYTHONHASHSEED of the fresh process that re-runs a workload for DETERMINISM.
RERUN_HASH_SEEDS = ("1", "2")


@attrs.frozen
class TargetSystem:
    """A scheduler under test as a system of ``tenantry check``'s searches
    (:class:`tenantry.adversaries.evaluate.System`): every evaluation drives a fresh
    adapter from ``target`` (``module:factory``) through the harness and judges the
    run with the invariant catalog under the adapter's claims.  At depth ``full`` the
    run is repeated in a fresh Python process with another ``PYTHONHASHSEED`` and the
    two histories must be equal byte for byte (DETERMINISM): a scheduler whose
    decisions follow string hashing, set order or a wall clock differs there.

    Attributes:
        target: ``module:factory``; tiered: tenants' tiers by role (adversary 0,
            victims 1); timeout_s: per call (seconds); path: import the target from
            this folder first (None: the current folder); weighted: tenants' weights
            :data:`WEIGHTS` in tenant order (else 1).
    """

    target: str
    tiered: bool = False
    timeout_s: float | None = 10.0
    path: str | None = None
    weighted: bool = False

    @property
    def name(self) -> str:
        return self.target

    def options(self) -> dict[str, Any]:
        """The command-line options this system stands for (``tenantry verify``'s flags), as a
        resumed matrix run must match them (:func:`tenantry.adversaries.check.run_check`)."""
        return {"--target": self.target, "--tiered": self.tiered, "--weighted": self.weighted,
                "--timeout-s": self.timeout_s, "--target-path": self.path}

    def factory(self, roles: Iterable[tuple[str, str]]) -> Callable[[], Any]:
        from .target import load_factory

        return bind(load_factory(self.target, path=self.path), scenario_tenants(roles, self.tiered, self.weighted))

    def config(self, roles: Iterable[tuple[str, str]]) -> Any:
        return self._claims(roles)[0]

    def describe(self, roles: Iterable[tuple[str, str]] = (("probe", "victim"),)) -> str:
        """The adapter's own one-line description (``Claims.describe``)."""
        return self._claims(roles)[1]

    def _claims(self, roles: Iterable[tuple[str, str]]) -> tuple[Any, str]:
        key = (self, tuple(roles))
        got = _CONFIGS.get(key)
        if got is None:
            h = Harness.start(self.factory(key[1]), [n for n, _ in key[1]], timeout_s=self.timeout_s)
            h.close()
            got = _CONFIGS[key] = (h.config, h.claims.describe)
        return got

    def preflight(self, roles: Iterable[tuple[str, str]]) -> list[str]:
        """:func:`preflight` of this target (see there)."""
        from .target import load_factory

        return preflight(load_factory(self.target, path=self.path), roles, tiered=self.tiered,
                         timeout_s=self.timeout_s, name=self.target, weighted=self.weighted)

    def checked(self, workload: Workload, horizon_s: float, depth: str, roles) -> Any:
        from tenantry.spec.invariants import coverage
        from tenantry.spec.invariants_run import CheckedRun

        v = verify_workload(self.factory(roles), workload, horizon_s=horizon_s, timeout_s=self.timeout_s,
                            determinism=False)
        findings = list(v.findings)
        cov = coverage(v.history, Claims(self.config(roles), invariants=tuple(i for i in v.claimed)))
        failed = next((f.invariant for f in findings if f.invariant in ("ADAPTER-HANG", "ADAPTER-RAISED")), None)
        if depth == "full" and failed is not None:  # no second run of a run that raised or hung: say so
            for i in ("DETERMINISM", "NONINTERFERENCE"):
                if i == "DETERMINISM" or i in v.claimed:
                    cov[i] = f"skipped: the run broke {failed}, so it was not run again"
        if depth == "full" and failed is None:
            d, why = self.rerun_differs(workload, horizon_s, roles, v.history)
            if d is not None:
                findings.append(d)
            cov["DETERMINISM"] = why
            ni = self.noninterference(workload, horizon_s, roles, v)
            if ni is not None:
                findings += ni
                cov["NONINTERFERENCE"] = "checked (two-run)"
        unchecked = tuple(i for i, why in cov.items() if why.startswith("skipped"))
        return CheckedRun(v.history, tuple(findings), unchecked, cov)

    def noninterference(self, workload: Workload, horizon_s: float | None, roles, verdict: Verdict,
                        ) -> list[Finding] | None:
        """NONINTERFERENCE's two-run form on a run already judged (``verdict``), as the model's: the
        workload again with every other tenant's prompt contents relabelled, the adversaries
        observing; None when it is not claimed or no tenant has the adversary role."""
        observers = tuple(t for t, r in roles if r == "adversary")
        if "NONINTERFERENCE" not in verdict.claimed or not observers:
            return None
        from tenantry.spec.invariants_run import noninterference, noninterference_twin

        twin = self.plain(noninterference_twin(workload, observers), horizon_s, roles)
        return noninterference(verdict.history, twin, observers)

    def plain(self, workload: Workload, horizon_s: float, roles) -> History:
        return verify_workload(self.factory(roles), workload, horizon_s=horizon_s, timeout_s=self.timeout_s,
                               determinism=False, catalog=False).history

    def rerun_differs(self, workload: Workload, horizon_s: float | None, roles,
                      history: History) -> tuple[Finding | None, str]:
        """DETERMINISM across processes: the run again in a fresh process (the same import
        path, another ``PYTHONHASHSEED``).  Returns (a finding naming the first history
        line that differs, or None; what was checked, or why not)."""
        from tenantry.runner.history import history_lines, read_history
        from tenantry.runner.traces import write_workload_jsonl

        seed = RERUN_HASH_SEEDS[1] if os.environ.get("PYTHONHASHSEED") == RERUN_HASH_SEEDS[0] else RERUN_HASH_SEEDS[0]
        with tempfile.TemporaryDirectory(prefix="tenantry-rerun-") as tmp:
            wl_path, h_path = Path(tmp) / "workload.jsonl", Path(tmp) / "history.jsonl"
            write_workload_jsonl(workload, wl_path)
            args = [sys.executable, "-c", "from tenantry.verify.system import _rerun_main; _rerun_main()", self.target,
                    str(wl_path), str(h_path), json.dumps([horizon_s, self.tiered, self.timeout_s, self.path,
                                                           [list(r) for r in roles], self.weighted])]
            env = {**os.environ, "PYTHONHASHSEED": seed,
                   "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # imports what this process imports
            p = subprocess.run(args, env=env, capture_output=True, text=True, cwd=os.getcwd())
            if p.returncode < 0:  # killed by a signal (a crash in the scheduler's native code, os.kill, OOM)
                import signal

                try:
                    name = signal.Signals(-p.returncode).name
                except ValueError:
                    name = f"signal {-p.returncode}"
                return None, f"skipped: the fresh process running the target was killed by {name}"
            if p.returncode != 0 or not h_path.exists():
                why = (p.stderr.strip().splitlines() or ["no history written"])[-1][:200]
                return None, f"skipped: the fresh process could not run the target ({why})"
            other = list(history_lines(read_history(h_path)))
        checked = f"checked (a fresh process with PYTHONHASHSEED={seed}, byte for byte)"
        mine = list(history_lines(history))
        for n, (a, b) in enumerate(zip(mine, other)):
            if a != b:
                step = n - 1 if 0 < n <= len(history.steps) else None
                i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                lo = max(0, i - 40)  # the history is not saved: show where the two lines part
                return finding("DETERMINISM", step, f"a fresh process with PYTHONHASHSEED={seed} recorded another "
                               f"history, first at line {n + 1}" + (f" (step {step})" if step is not None else "")
                               + f", character {i + 1}", observed=a[lo:i + 80], allowed=b[lo:i + 80]), checked
        if len(mine) != len(other):
            return finding("DETERMINISM", None, f"a fresh process with PYTHONHASHSEED={seed} recorded "
                           f"{len(other)} history lines, this one {len(mine)}", observed=len(mine),
                           allowed=len(other)), checked
        return None, checked

    def replay_command(self, cell: Path, horizon_s: float, roles: Iterable[tuple[str, str]] = (),
                       name: str = "workload", replay_out: Path | None = None) -> str:
        """The command that re-runs a cell's workload (``name``: ``workload`` or ``shrunk``) on the
        target with the cell's tenant order and roles, into ``replay_out`` (default
        ``<cell>-replay``; a report passes a folder outside itself: ``<report>-replay/...``)."""
        import shlex

        roles = tuple(roles)
        adv = [t for t, r in roles if r == "adversary"]
        vic = [t for t, r in roles if r != "adversary"]
        return (f"tenantry verify --target {shlex.quote(self.target)} --workload "
                f"{shlex.quote(str(cell / f'{name}.jsonl'))} --horizon-s {horizon_s}"
                + (f" --adversaries {shlex.quote(','.join(adv))} --victims {shlex.quote(','.join(vic))}" if adv else "")
                + (" --tiered" if self.tiered else "") + (" --weighted" if self.weighted else "")
                + (f" --target-path {shlex.quote(self.path)}" if self.path else "")
                + f" --out {shlex.quote(str(replay_out) if replay_out is not None else str(cell) + ('' if name == 'workload' else '-' + name) + '-replay')}")

    def extras(self, out: Path | None, shown: Path | None = None):
        """The target's own extras in ``tenantry check``'s report: a short stateful run.
        ``out``: where the report is being written; ``shown``: where it will be (the folder
        the user named, which the replay commands name; default ``out``)."""
        def stateful() -> tuple[str, bool]:
            from tenantry.adversaries.outdir import replay_twin

            from .suite import TenantryFailure, stateful_check

            named = shown or out
            try:
                stateful_check(_load(self), target=self.target, out_dir=(out or Path(".")) / "stateful",
                               max_examples=10, timeout_s=self.timeout_s,
                               replay_dir=None if named is None else replay_twin(named) / "stateful",
                               shown_dir=None if named is None else named / "stateful", target_path=self.path)
            except TenantryFailure as e:
                return f"{e.title}; replay: {e.replay}", False
            return "10 stateful examples passed", True

        return [("stateful", stateful)]


def _load(system: TargetSystem) -> Callable[..., Any]:
    from .target import load_factory

    return load_factory(system.target, path=system.path)


#: (system, roles) -> (the claimed configuration, the description): one adapter built per process to read them.
_CONFIGS: dict[tuple, Any] = {}


def _rerun_main() -> None:
    """Entry of the fresh process of :meth:`TargetSystem.rerun_differs`: run the workload, write the history."""
    from tenantry.runner.history import write_history
    from tenantry.runner.traces import read_workload_jsonl

    target, wl_path, h_path, extra = sys.argv[1:5]
    horizon_s, tiered, timeout_s, path, roles, weighted = json.loads(extra)
    system = TargetSystem(target, tiered, timeout_s, path, weighted)
    v = verify_workload(system.factory([tuple(r) for r in roles]), read_workload_jsonl(wl_path), horizon_s=horizon_s,
                        timeout_s=timeout_s, determinism=False, catalog=False)
    write_history(v.history, h_path)
