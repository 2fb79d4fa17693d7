"""A live server as an adversaries system: the pattern's objective on a replay.

:class:`LiveSystem` is a :class:`~tenantry.adversaries.evaluate.System` whose plain run is a
replay against the URL (:func:`~tenantry.live.client.run_replay`), so the one scoring
function (:func:`tenantry.adversaries.evaluate.scored`) runs the baseline (the victims alone)
and the prefix probe's control twin against the same server, and computes every metric
as ``tenantry check`` does.  A live history has no step records and no scheduling times:
the metrics that read them are not measured (:data:`OBSERVABLE` lists those that are).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import attrs

from tenantry.adversaries.outdir import STOP_REQUESTED
from tenantry.adversaries.patterns import Scenario, scenario_from_workload
from tenantry.model.config import Config, ConfigError
from tenantry.model.workload import Workload
from tenantry.runner.history import History
from tenantry.spec.invariants_run import CheckedRun

from .client import ReplayOptions, run_replay
from .record import live_history

#: The metrics a live recording measures (TTFTs, refusals, goodput: what a client sees);
#: the others read step records or first-scheduling times only the server knows.
OBSERVABLE = ("ttft_p50_inflation", "ttft_p99_inflation", "victim_ttft_p99_s", "goodput", "goodput_loss",
              "probe_auc", "victim_rejected", "victims_outside_slo")


def observable(metric: str) -> bool:
    """True for a metric a live recording measures (per-victim entries included)."""
    return metric.split("[")[0] in OBSERVABLE


def config_for(base: Config | None, roles: Iterable[tuple[str, str]]) -> Config:
    """``base`` with a default tenant added for each of ``roles`` it lacks, or the default
    replica for those tenants when there is no base."""
    from tenantry.runner.setups import config_with_tenants, default_config

    names = [n for n, _ in roles]
    return default_config(names) if base is None else config_with_tenants(base, names)


@attrs.frozen
class LiveSystem:
    """A server at a URL, as a system (its configuration: what the replay was told of it).

    Attributes:
        name: its label (the URL).  replay: how to replay.  base: the configuration given
            (``--config`` / ``--policy``), or None.
    """

    name: str
    replay: ReplayOptions
    base: Config | None = attrs.field(default=None, eq=False, hash=False)

    def config(self, roles: Iterable[tuple[str, str]]) -> Config:
        return config_for(self.base, roles)

    def describe(self) -> str:
        """One line: the server and how it is replayed."""
        return (f"a live server at {self.name} (model {self.replay.wire.model}), replayed at time scale "
                f"{self.replay.time_scale:g}")

    def options(self) -> dict[str, Any]:
        """The command-line options this system stands for (``tenantry replay``'s flags), as a
        resumed matrix run must match them."""
        o, w = self.replay, self.replay.wire
        return {"URL": self.name, "--time-scale": o.time_scale, "--max-in-flight": o.max_in_flight,
                "--timeout-s": o.timeout_s, "--priority": w.tiers is not None, "--cache-salt": w.salts is not None,
                "--block-size": w.block_size_tokens, "--vocab": [w.vocab_lo, w.vocab_hi],
                "--prompt-seed": w.prompt_seed, "--tenant-header": w.tenant_header,
                "--no-fairness-header": not w.fairness_header, "--model": w.model}

    def replay_command(self, cell: Path, horizon_s: float, roles: Iterable[tuple[str, str]] = (),
                       name: str = "workload", replay_out: Path | None = None) -> str:
        """The command that replays a cell's workload against the server again (the cell.json
        beside it gives the roles and the pattern; the baseline runs too)."""
        import shlex

        o, w = self.replay, self.replay.wire
        return (f"tenantry replay {shlex.quote(self.name)} --workload {shlex.quote(str(cell / f'{name}.jsonl'))} "
                f"--horizon {horizon_s:g} --time-scale {o.time_scale:g} --block-size {w.block_size_tokens}"
                + (" --priority" if w.tiers is not None else "") + (" --cache-salt tenant" if w.salts is not None
                                                                     else " --cache-salt off"))

    def checked(self, workload: Workload, horizon_s: float, depth: str, roles: Sequence[tuple[str, str]]) -> CheckedRun:
        return CheckedRun(self.plain(workload, horizon_s, roles), ())

    def plain(self, workload: Workload, horizon_s: float, roles: Sequence[tuple[str, str]]) -> History:
        opts = attrs.evolve(self.replay, horizon_s=horizon_s)
        rep = run_replay(workload, opts, stop=STOP_REQUESTED.is_set)
        if rep.stopped:
            raise KeyboardInterrupt
        return live_history(workload.requests, rep.seen, {"end_s": rep.end_s, "requests": len(workload)})


def cell_beside(workload: Path) -> dict[str, Any] | None:
    """The matrix cell a workload file was written into (``cell.json`` beside it, with its
    pattern, adversaries and victims), or None when there is none.

    Raises:
        ConfigError: for a cell.json that cannot be read as a cell's record."""
    path = workload.parent / "cell.json"
    if not path.is_file():
        return None
    try:
        cell = json.loads(path.read_text(encoding="utf-8"))
        cell["pattern"], list(cell["adversaries"]), list(cell["victims"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError("cell.json", str(path), f"beside the workload cannot be read as a cell's record ({e}); "
                          "re-run tenantry check to rewrite it", str(path)) from None
    return cell


def cell_scenario(workload: Workload, cell: dict[str, Any], wl_path: Path) -> Scenario:
    """The scenario of a cell's workload file (roles from cell.json; the prefix probe's twin
    read from beside it, :func:`tenantry.adversaries.report.twin_file`)."""
    from tenantry.adversaries.report import twin_file
    from tenantry.runner.traces import read_workload_jsonl

    adv, vic = tuple(cell["adversaries"]), tuple(cell["victims"])
    sc = scenario_from_workload(workload, adv, victims=vic, pattern=cell["pattern"])
    twin = wl_path.parent / twin_file(wl_path.stem)
    if twin.exists():
        sc = sc.with_workload(sc.workload, scenario_from_workload(read_workload_jsonl(twin), adv, victims=vic,
                                                                  pattern=cell["pattern"]))
    return sc


def live_patterns(patterns: Iterable[str] | None) -> list[str]:
    """The patterns a live matrix runs: ``patterns`` (each must have an objective a client
    measures), or every pattern whose objective a client measures (:func:`observable`).

    Raises:
        ConfigError: naming a pattern that is unknown or whose objective reads the server's steps."""
    from tenantry.adversaries.patterns import PATTERNS, get_pattern

    if patterns is None:
        return [p for p, pat in PATTERNS.items() if observable(pat.objective)]
    out = []
    for p in patterns:
        pat = get_pattern(p)
        if not observable(pat.objective):
            raise ConfigError("--patterns", p, f"its objective {pat.objective} reads the server's step records, which "
                              "a client does not see (a live matrix runs: " + ", ".join(live_patterns(None)) + ")")
        out.append(p)
    return out
