"""``tenantry verify``: check a scheduler tenantry did not write.

Two ways in (SPEC.md section 9, "Checking a scheduler someone else wrote"):

* ``--history FILE``: a recorded history (JSON Lines, spec/history_schema.json)
  is judged offline; each finding is printed with its step, tenant, request
  and numbers.
* ``--target module:factory``: the factory's adapter is driven in step mode on
  every adversary pattern (or on ``--workload FILE``), with the invariants
  checked after every step, the catalog over the history, a determinism
  re-run (a second instance in this process, and a fresh process with another
  ``PYTHONHASHSEED``, histories compared byte for byte), and each pattern's objective against the victims' baseline.

Both write ``report.json`` and ``report.md`` into ``--out`` (replaced only when
it is a tenantry verify report; the default ``verify-report`` never by a smaller
run; see :mod:`tenantry.adversaries.outdir`); the matrix uses ``tenantry
check``'s layout (``cells/<target>/<pattern>/`` with the workload in three
formats, ``cell.json`` and the command that replays it, into ``<out>-replay``).
Without ``--out``, ``--workload FILE`` with FILE in a report folder (a cell's replay command,
which the report writes as run from its folder) writes into ``<report>-replay/``.
A history naming tenants its header's configuration (or ``--config``) does
not, or with no request records, is bad input.  At most
:data:`PRINT_PER_INVARIANT` findings of one invariant are printed and
:data:`KEEP_PER_INVARIANT` kept in ``report.json`` (with the counts).
Exit status: 0 when nothing was found, 1 on a finding (or a matrix worker process
that died under the scheduler: one line), 2 on bad input (a target that does not
import, a factory whose product is no adapter), 130 / 143 on Ctrl-C / SIGTERM.  A
matrix run that stops keeps its finished cells beside ``--out``, and ``--resume``
finishes it; otherwise nothing is written.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import attrs

from tenantry.model.config import ConfigError
from tenantry.runner.files import atomic_write_text
from tenantry.runner.history import read_history

from .args import Names, budget, executor, non_negative_int, positive_float, positive_int

HELP = "Check a scheduler tenantry did not write: a recorded history, or a module:factory adapter in step mode."

#: The default report folder.
DEFAULT_OUT = "verify-report"
#: Evaluations per pattern of the target matrix (default, and with --quick).
DEFAULT_TARGET_BUDGET, QUICK_BUDGET = 64, 8
#: Findings of one invariant printed, and kept in report.json (the rest are counted).
PRINT_PER_INVARIANT = 10
KEEP_PER_INVARIANT = 100


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``verify`` args."""
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--history", metavar="FILE", help="judge this recorded history (JSON Lines) offline")
    way.add_argument("--target", metavar="MODULE:FACTORY", help="drive this adapter factory in step mode")
    p.add_argument("--config", metavar="TOML", help="history mode: the configuration the scheduler claims "
                   "(default: the history header's)")
    p.add_argument("--claims", default="", metavar="IDS", help="history mode: comma-separated claim-level "
                   "invariant ids the scheduler asserts (safety ones are always checked)")
    p.add_argument("--workload", metavar="FILE", help="target mode: run this workload (JSON Lines) instead of "
                   "the adversary matrix")
    p.add_argument("--cancellations", metavar="FILE", help="deprecated (workload lines carry cancel_s): target "
                   "mode with --workload: JSON list of [t_s, request_id] client cancellations")
    p.add_argument("--horizon-s", type=positive_float, default=None, help="target mode with --workload: stop at this time (s)")
    p.add_argument("--adversaries", default="", metavar="NAMES", help="target mode with --workload: the adversary "
                   "tenants (comma-separated; first in the tenant order, tier 0 with --tiered), as in the matrix cell "
                   "the workload came from")
    p.add_argument("--victims", default="", metavar="NAMES", help="target mode with --workload: the victim tenants "
                   "in tenant order (default: order of first arrival; without --adversaries: every tenant, in this order)")
    p.add_argument("--patterns", "--pattern", nargs="+", action=Names, default=None, metavar="NAME",
                   help="target mode: patterns, space- or comma-separated (default: all)")
    p.add_argument("--budget", type=budget, default=None,
                   help="target mode: PER PATTERN, shared by its searches: N evaluations, Ns seconds or N,Ns "
                        f"(default {DEFAULT_TARGET_BUDGET} evaluations; --quick: {QUICK_BUDGET})")
    p.add_argument("--total-budget", type=budget, default=None, metavar="BUDGET",
                   help="target mode: for the whole matrix (as tenantry check's)")
    p.add_argument("--search", nargs="+", default=None, metavar="SEARCH",
                   help="target mode: searches per pattern: random evolution hypothesis (default: all three)")
    p.add_argument("--quick", action="store_true",
                   help=f"target mode: a short run (about a minute on a fast scheduler): {QUICK_BUDGET} evaluations per "
                        "pattern, random and evolution searches, smaller shrinks, no stateful extra")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="target mode: worker processes (default: CPU count; 1 runs inline)")
    p.add_argument("--executor", type=executor, default="process", metavar="KIND",
                   help="target mode: where evaluations run: process (default), ray (a local Ray instance), "
                        "ray:ADDRESS (an existing cluster whose nodes can import the target), dask or dask:ADDRESS "
                        "(the same with Dask); same results")
    p.add_argument("--shrink", type=non_negative_int, default=None, metavar="N",
                   help="target mode: evaluations per shrink of a finding (default 16; --quick: 8; 0: off)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="victims' seed of the matrix scenarios (default 0)")
    p.add_argument("--tiered", action="store_true", help="give the adversary tier 0 and the victims tier 1 "
                   "(for a priority scheduler whose factory takes tenants=)")
    p.add_argument("--weighted", action="store_true", help="give the tenants the weights 1, 2, 0.5 in tenant order "
                   "(the adversary first; for a weighted fair scheduler whose factory takes tenants=; the stateful "
                   "extra always does)")
    p.add_argument("--timeout-s", type=positive_float, default=10.0, help="per-call timeout for the scheduler (s, default 10)")
    p.add_argument("--quiet", action="store_true", help="target mode: no progress bar")
    p.add_argument("--no-determinism", action="store_true", help="skip the determinism re-run")
    p.add_argument("--resume", action="store_true",
                   help="target mode: finish the interrupted matrix run of --out (killed, Ctrl-C, a full disk): only "
                        "its missing patterns run, with the same options; never automatic, so that a run after a "
                        "fix to the scheduler does not silently reuse the old cells")
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"report folder (default {DEFAULT_OUT}); an existing one is replaced only when it is a tenantry "
                        "verify report, and the default one never by a smaller run")
    p.add_argument("--target-path", default=None, metavar="DIR",
                   help="target mode: import the target from DIR first (default: the current folder, as pytest does)")


def capped(findings: list, per_invariant: int) -> tuple[list, dict[str, int]]:
    """(at most ``per_invariant`` findings of each invariant, in order; {invariant: total count})."""
    counts: dict[str, int] = {}
    kept = []
    for f in findings:
        counts[f.invariant] = counts.get(f.invariant, 0) + 1
        if counts[f.invariant] <= per_invariant:
            kept.append(f)
    return kept, counts


def _more_lines(counts: dict[str, int], shown: int) -> list[str]:
    return [f"... and {n - shown} more {inv} findings (report.json keeps the first {KEEP_PER_INVARIANT} of each, "
            f"and the counts)" for inv, n in counts.items() if n > shown]


def _findings_json(found: list) -> dict[str, Any]:
    kept, counts = capped(found, KEEP_PER_INVARIANT)
    return {"findings": [f.to_json() for f in kept], "findings_total": len(found), "findings_by_invariant": counts}


def _out(args: argparse.Namespace) -> tuple[Path, bool]:
    """The report folder and whether it is the default one.  Without ``--out``, a ``--workload``
    inside a tenantry report (a cell's replay command) writes beside that report, into
    ``<report>-replay/...`` (:func:`~tenantry.adversaries.replay.replay_out`)."""
    if args.out is not None:
        return Path(args.out), False
    if getattr(args, "workload", None) and getattr(args, "target", None):
        from tenantry.adversaries.replay import replay_out

        derived = replay_out(args.workload)
        if derived is not None:
            return derived, False
    return Path(DEFAULT_OUT), True


def _history_tenants(path: str, history: Any, config: Any, config_path: str | None) -> None:
    """Refuse a history whose records name tenants the configuration does not, or a --config that does
    not match the header's tenants (one line naming the file)."""
    from tenantry.runner.files import json_lines

    header_cfg = history.header.get("config") if isinstance(history.header.get("config"), dict) else None
    header_tenants = (header_cfg or {}).get("tenants")
    header_names = [t.get("name") for t in header_tenants if isinstance(t, dict)] \
        if isinstance(header_tenants, list) else []  # another shape: config_from_dict names it
    names = [t.name for t in config.tenants] if config is not None else header_names
    source = f"--config {config_path}" if config is not None else "the header's configuration"
    if config is not None and header_names and sorted(header_names) != sorted(names):
        raise ConfigError("--config", config_path, f"names tenants {', '.join(sorted(names))}, but the history's "
                          f"header names {', '.join(sorted(header_names))}: not the configuration of this history",
                          str(path))
    if not names:
        return
    known = set(names)
    def line_of(kind: str, key: str, value: Any) -> str:  # file:line of that record (only on an error path)
        return next((w for w, obj in json_lines(path) if obj.get("kind") == kind and obj.get(key) == value), str(path))

    bad = next((r for r in history.requests if r.tenant not in known), None)
    if bad is not None:
        raise ConfigError("tenant", bad.tenant, f"request {bad.request_id} names a tenant that {source} does not "
                          f"(tenants: {', '.join(sorted(known))})", line_of("request", "request_id", bad.request_id))
    for s in history.steps:
        extra = sorted(set(s.queued) - known)
        if extra:
            raise ConfigError("queued", extra[0], f"step {s.step_index} names a tenant that {source} does not "
                              f"(tenants: {', '.join(sorted(known))})", line_of("step", "step_index", s.step_index))


def run_history(args: argparse.Namespace) -> int:
    """History mode (see the module docstring)."""
    from tenantry.adversaries.outdir import report_folder

    out, default = _out(args)
    with report_folder(out, "verify", default=default, size=1, unit="history",
                       inputs=[args.history, args.config]) as tmp:
        history = read_history(args.history)
        if not history.requests:  # one replica or a fleet: a pass on nothing must not look like a pass
            raise ConfigError("request records", 0, "none in this file: there is nothing to check (a history has "
                              "a header line, optional step lines and one request line per request)",
                              str(args.history))
        judge = _fleet_history if "fleet" in history.header else _replica_history
        found = judge(args, history, tmp)
    print(f"report: {out}")
    return 1 if found else 0


def _replica_history(args: argparse.Namespace, history: Any, tmp: Any) -> list:
    """History mode on one replica's history: the catalog with the claims of ``--claims`` or the
    header, on ``--config`` or the header's configuration; returns the findings."""
    from tenantry.verify.offline import verify_history

    config = None
    if args.config:
        from tenantry.runner.setups import load_config_toml

        config = load_config_toml(args.config)
    if config is None and "config" not in history.header:
        raise ConfigError("config", None, "the header has no configuration: give the scheduler's with --config TOML",
                          f"{args.history}:1")
    _history_tenants(args.history, history, config, args.config)
    from tenantry.spec.invariants import config_from_dict, coverage
    from tenantry.verify.protocol import CLAIMABLE, Claims

    claimed = tuple(c.strip() for c in args.claims.split(",") if c.strip())
    if not args.claims:  # the claims the recording harness wrote into the header
        header_claims = history.header.get("claims") or []
        if not isinstance(header_claims, list) or not all(isinstance(c, str) for c in header_claims):
            raise ConfigError("claims", header_claims, "must be a list of invariant ids", f"{args.history}: header")
        claimed = tuple(c for c in header_claims if c in CLAIMABLE)
    try:
        cfg = config if config is not None else config_from_dict(history.header.get("config") or {})
    except ConfigError as e:  # the header's configuration: name the file
        raise ConfigError(e.field, e.value, e.why, f"{args.history}: {e.where or 'header'}") from None
    try:
        Claims(cfg, invariants=claimed)  # validates the ids
    except ConfigError as e:  # the ids came from --claims (the command line) or from the header
        if args.claims:
            raise ConfigError("--claims", args.claims, e.why) from None
        raise ConfigError(e.field, e.value, e.why, f"{args.history}: header") from None
    try:
        found = verify_history(history, config, claimed)
    except ConfigError as e:
        raise ConfigError(e.field, e.value, e.why, f"{args.history}: {e.where or 'header'}") from None
    cov = coverage(history, Claims(cfg, invariants=claimed))
    from tenantry.spec.invariants import INVARIANTS

    for i in claimed:  # claimed but not judged: said where the checked ones are, as target mode warns
        if cov.get(i, "").startswith("not applicable"):
            cov[i] = (f"skipped: claimed, but it does not apply to this configuration (SPEC.md "
                      f"{INVARIANTS[i].spec} says where it is claimed): not judged")
            print(f"tenantry verify: {args.history}: {i} is claimed but does not apply to the configuration "
                  f"(SPEC.md {INVARIANTS[i].spec}): not judged", file=sys.stderr)
    summary = f"{len(history.steps)} steps, {len(history.requests)} requests, {len(found)} findings"
    fields: dict[str, Any] = {"claimed": list(claimed), "steps": len(history.steps), "requests": len(history.requests)}
    from tenantry.spec.invariants_live import is_live, measures

    if is_live(history):  # a client's recording (SPEC.md 7.10): the figures behind the live forms
        fields["live"] = measures(history, cfg)
        summary = f"a live recording of {history.header['live'].get('url', 'a server')}: {summary}"
    _history_report(args, tmp, found, cov, summary,
                    f"{summary}; claimed: {', '.join(claimed) or 'nothing beyond safety'}.", fields)
    return found


def live_lines(m: dict[str, Any]) -> list[str]:
    """The figures of :func:`tenantry.spec.invariants_live.measures`, one line each."""
    lines = ["measured from outside (a live recording, SPEC.md 7.10):"]
    if m["max_wait_s"]:
        lines.append("  longest wait, send to first token: " + ", ".join(
            f"{t} {w:.3g} s" for t, w in m["max_wait_s"].items()))
    for pair, g in m["service_gap"].items():
        lines.append(f"  service gap while both waited, {pair}: {g['gap']:.6g} weighted tokens, VTC bound "
                     f"{g['bound']:.6g} (ratio {g['ratio']:.3g}; {g['from_s']:.3f} s to {g['to_s']:.3f} s)")
    for t, p in m["probe"].items():
        lines.append(f"  prefix probe of {t}: AUC {p['auc']:.3f} ({p['positives']} prompts whose prefix another tenant "
                     f"had sent, {p['negatives']} with a new prefix; z {p['z']:.3g})")
    lines.append(f"  lost (stream failed): {m['lost']}; refusals: " + (", ".join(
        f"{k} {v}" for k, v in sorted(m["refusals"].items())) or "none"))
    return lines


def _history_report(args: argparse.Namespace, tmp: Any, found: list, cov: dict[str, str], summary: str,
                    md_summary: str, fields: dict[str, Any]) -> None:
    """Print history mode's findings (at most PRINT_PER_INVARIANT per invariant), what was and was
    not checked and ``summary``; write report.json (``fields`` beside the findings and coverage) and
    report.md into the staging folder ``tmp``."""
    shown, counts = capped(found, PRINT_PER_INVARIANT)
    lines = [f.render() for f in shown] + _more_lines(counts, PRINT_PER_INVARIANT)
    for line in lines:
        print(line)
    measured = live_lines(fields["live"]) if "live" in fields else []
    for line in measured:
        print(line)
    checked = [i for i, why in cov.items() if why.startswith("checked")]
    skipped = {i: why for i, why in cov.items() if why.startswith("skipped")}
    print(f"checked: {', '.join(checked) or 'nothing'}" + "".join(
        f"\nnot checked: {i}: {why}" for i, why in skipped.items()))
    print(f"{args.history}: {summary}")
    report = {"kind": "verify-history", "history": str(args.history), **fields, "coverage": cov,
              **_findings_json(found)}
    md = [f"# tenantry verify --history {args.history}", "", md_summary, ""]
    md += [f"- {line}" for line in lines]
    if measured:
        md += ["", "## Measured from outside", ""] + [f"- {line.strip()}" for line in measured[1:]]
    md += ["", "## What was checked", ""] + [f"- {i}: {why}" for i, why in cov.items()]
    atomic_write_text(tmp / "report.json", [json.dumps(report, sort_keys=True, indent=1, allow_nan=False)])
    atomic_write_text(tmp / "report.md", md)


def _fleet_history(args: argparse.Namespace, history: Any, tmp: Any) -> list:
    """History mode on a fleet history (SPEC.md 6.2, 7.9): each replica's part by the catalog
    (the claims its configuration implies) and the fleet invariants; the configuration is the header's."""
    from tenantry.spec.invariants import coverage
    from tenantry.spec.invariants_core import dedup
    from tenantry.spec.invariants_fleet import check_fleet_history, fleet_coverage, fleet_parts

    for flag, value in (("--config", args.config), ("--claims", args.claims)):
        if value:
            raise ConfigError(flag, value, "a fleet history is judged on its header's fleet and replica "
                              "configurations (SPEC.md 7.9); leave it out", str(args.history))
    try:
        found = dedup(check_fleet_history(history))
        parts = fleet_parts(history)
    except ConfigError as e:
        raise ConfigError(e.field, e.value, e.why, f"{args.history}: {e.where or 'header'}") from None
    found.sort(key=lambda f: (f.step if f.step is not None else 1 << 60, f.invariant))
    # a replica the router sent nothing ran no step: one line says so, not a catalog of "no step records"
    idle = [r for r, part in enumerate(parts) if not part.steps and not part.requests]
    cov = {}
    for r, part in enumerate(parts):
        if r in idle:
            cov[f"replica {r}"] = "skipped: the router sent it no requests and it ran no step: nothing on it to check"
            continue
        for i, why in coverage(part, None).items():
            cov[f"replica {r}: {i}"] = why.replace("the history has no step records",
                                                   f"replica {r} has no step records in this history")
    cov.update(fleet_coverage(history))
    who = f" ({'replica' if len(idle) == 1 else 'replicas'} {', '.join(map(str, idle))} got none)" if idle else ""
    summary = (f"fleet of {len(parts)} replicas, {len(history.fleet_steps)} fleet steps, "
               f"{len(history.requests)} requests{who}, {len(found)} findings")
    _history_report(args, tmp, found, cov, summary, summary[0].upper() + summary[1:] + ".",
                    {"fleet": len(parts), "steps": len(history.steps), "requests": len(history.requests)})
    return found


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(f"tenantry: warning: {line}", file=sys.stderr)


def _cell_json(c: Any, replay: str | None) -> dict[str, Any]:
    return {"pattern": c.pattern, "objective": c.objective, "score": c.score, "threshold": c.threshold,
            "hurt": c.hurt, "metrics": c.metrics, "stats": c.verdict.stats,
            **_findings_json(list(c.verdict.findings)), "replay": replay}


def _target(args: argparse.Namespace) -> Any:
    """The :class:`~tenantry.verify.system.TargetSystem` the options name."""
    from tenantry.verify.system import TargetSystem

    return TargetSystem(args.target, tiered=args.tiered, timeout_s=args.timeout_s, path=args.target_path,
                        weighted=args.weighted)


def run_target(args: argparse.Namespace) -> int:
    """Target mode (see the module docstring): one workload, or the adversary matrix."""
    from tenantry.adversaries.outdir import check_out, report_folder
    from tenantry.adversaries.patterns import PATTERNS, get_pattern
    from tenantry.runner.traces import read_workload_jsonl
    from tenantry.verify.target import load_factory
    from tenantry.verify.run import bind, scenario_tenants, verify_workload

    out, default = _out(args)
    patterns = args.patterns
    for name in patterns or ():
        get_pattern(name)
    if not args.workload:
        check_out(out, "verify", default=default, size=len(patterns or PATTERNS))  # refused before any work
        load_factory(args.target, path=args.target_path)  # a bad target is one line before any work
        code = run_target_matrix(args, out, default, patterns)
        if code is None:  # a worker died under the scheduler: said in one line, no report
            return 1
        print(f"report: {out / 'report.md'}")
        return code
    with report_folder(out, "verify", default=default, size=1, unit="workload",
                       inputs=[args.workload, args.cancellations]) as tmp:
        wl = read_workload_jsonl(args.workload)  # bad input before importing the target
        if len(wl) == 0:
            raise ConfigError("--workload", args.workload, "no requests in this file", args.workload)
        if args.cancellations:  # deprecated: workloads carry cancel_s
            try:
                wl = wl.with_cancellations(_read_cancellations(args.cancellations))
            except ConfigError as e:  # a cancellation before its request's arrival
                raise ConfigError(e.field, e.value, e.why, e.where or str(args.cancellations)) from None
        factory = load_factory(args.target, path=args.target_path)
        roles = [(n, "victim") for n in wl.tenants]
        adversaries = tuple(n.strip() for n in args.adversaries.split(",") if n.strip())
        scenario, cell = None, None
        if adversaries:  # the tenant order and roles of the matrix cell the workload came from
            from tenantry.adversaries.patterns import scenario_from_workload

            victims = tuple(n.strip() for n in args.victims.split(",") if n.strip()) or None
            cell = _cell_beside(Path(args.workload))
            scenario = scenario_from_workload(wl, adversaries, victims=victims,
                                              pattern=cell["pattern"] if cell else "replay",
                                              **({"horizon_s": args.horizon_s} if args.horizon_s else {}))
            roles = list(scenario.roles)
        elif args.victims:  # the tenant order alone (every tenant a victim), as a stateful run had it
            victims = tuple(n.strip() for n in args.victims.split(",") if n.strip())
            missing = [n for n in wl.tenants if n not in victims]
            if missing:
                raise ConfigError("--victims", args.victims, f"tenant {missing[0]} of the workload is not listed")
            roles = [(n, "victim") for n in victims]
        _warn(_target(args).preflight(roles))
        v = verify_workload(bind(factory, scenario_tenants(roles, args.tiered, args.weighted)), wl,
                            horizon_s=args.horizon_s, timeout_s=args.timeout_s, determinism=not args.no_determinism)
        if not args.no_determinism and not any(f.invariant in ("DETERMINISM", "ADAPTER-HANG", "ADAPTER-RAISED")
                                               for f in v.findings):
            # and across processes, as the matrix checks it: a finding of the matrix's fresh-process
            # re-run (another PYTHONHASHSEED) replays with the command its cell prints
            system = _target(args)
            d, _ = system.rerun_differs(wl, args.horizon_s, roles, v.history)
            if d is not None:
                v = attrs.evolve(v, findings=v.findings + (d,))
        if not any(f.invariant in ("ADAPTER-HANG", "ADAPTER-RAISED") for f in v.findings):
            # a matrix cell's NONINTERFERENCE finding replays: the run again with the others' contents relabelled
            ni = _target(args).noninterference(wl, args.horizon_s, roles, v)
            if ni:
                v = attrs.evolve(v, findings=v.findings + tuple(ni))
        found = list(v.findings)
        shown, counts = capped(found, PRINT_PER_INVARIANT)
        for f in shown:
            print(f.render())
        for line in _more_lines(counts, PRINT_PER_INVARIANT):
            print(line)
        metrics = (_cell_metrics(args, scenario, cell, v.history, found)
                   if scenario is not None and args.horizon_s else [])  # a cell's replay names its horizon
        for line in metrics:
            print(line)
        print(f"{args.target} on {args.workload}: {v.stats.get('steps', 0)} steps, {len(found)} findings")
        report = {"kind": "verify-target", "target": args.target, "describe": v.describe,
                  "claimed": list(v.claimed), "workload": str(args.workload), "stats": v.stats,
                  **_findings_json(found)}
        atomic_write_text(tmp / "report.json", [json.dumps(report, sort_keys=True, indent=1, allow_nan=False)])
        atomic_write_text(tmp / "report.md", [f"# tenantry verify --target {args.target} --workload {args.workload}",
                                              "", v.render(limit=50)] + (["", "```", *metrics, "```"] if metrics else []))
    print(f"report: {out}")
    return 1 if found else 0


def _cell_beside(workload: Path) -> dict[str, Any] | None:
    """The matrix cell a workload file was written into (its folder's ``cell.json``), or None
    when there is none or it cannot be read (the replay then prints metrics without a record)."""
    try:
        cell = json.loads((workload.parent / "cell.json").read_text(encoding="utf-8"))
        return cell if isinstance(cell, dict) and isinstance(cell.get("pattern"), str) else None
    except (OSError, ValueError):
        return None


def _cell_metrics(args: argparse.Namespace, scenario: Any, cell: dict[str, Any] | None, history: Any,
                  findings: list) -> list[str]:
    """The lines a matrix cell's replay prints besides its findings: the pattern's objective and
    every metric of the run (the victims alone are run once more for the baseline), each
    against what the cell recorded for that file, as ``tenantry check --replay`` prints them."""
    from tenantry.adversaries.evaluate import scored
    from tenantry.adversaries.patterns import scenario_from_workload
    from tenantry.adversaries.report import twin_file
    from tenantry.runner.traces import read_workload_jsonl
    from tenantry.spec.invariants_run import CheckedRun
    from .check import _against_record

    wl_path = Path(args.workload)
    twin_path = wl_path.parent / twin_file(wl_path.stem)
    if twin_path.exists():  # the prefix probe's control twin, written beside its workload
        twin = read_workload_jsonl(twin_path)
        scenario = scenario.with_workload(scenario.workload, scenario_from_workload(
            twin, scenario.adversaries, victims=scenario.victims, pattern=scenario.pattern,
            horizon_s=scenario.horizon_s))
    _, _, _, ev = scored(_target(args), scenario, CheckedRun(history, tuple(findings)))
    recorded, differ = _against_record(cell, wl_path.name, ev) if cell else (None, {})
    objective = cell["objective"] if cell and isinstance(cell.get("objective"), str) else "ttft_p99_inflation"
    lines = [f"{scenario.pattern}: {objective} = {ev.metrics.get(objective, ev.score):.6g}"
             + (f" ({recorded})" if recorded else "")]
    return lines + [f"  {k:<32} {ev.metrics[k]:.6g}" + (f"  (recorded {differ[k]})" if k in differ else "")
                    for k in sorted(ev.metrics)]


def run_target_matrix(args: argparse.Namespace, out: Path, default: bool, patterns: list[str] | None) -> int | None:
    """The adversary matrix on the target: ``tenantry check``'s engine (searches over each
    pattern's parameters, the worst workload replayed with every check, shrinking, the
    same report layout) with the target as its one system
    (:class:`tenantry.verify.system.TargetSystem`).  Returns the exit status, or None when a
    worker process died under the scheduler (one line printed; nothing written)."""
    import time
    from concurrent.futures import BrokenExecutor

    from tenantry.adversaries.check import DEFAULT_SHRINK, run_check
    from tenantry.adversaries.search import Budget
    from .check import report

    system = _target(args)
    # before any worker: a claim that cannot be checked is one line now, not a silent skip later
    _warn(system.preflight([("adv", "adversary"), ("chat", "victim"), ("conv", "victim"), ("code", "victim")]))
    b = args.budget or Budget(QUICK_BUDGET if args.quick else DEFAULT_TARGET_BUDGET)
    searches = tuple(args.search or (("random", "evolution") if args.quick else ("random", "evolution", "hypothesis")))
    shrink = args.shrink if args.shrink is not None else (8 if args.quick else DEFAULT_SHRINK)
    t0 = time.monotonic()
    try:
        res = run_check(setups=[system], patterns=patterns, seed=args.seed, budget=b, searches=searches, out=out,
                        workers=args.workers, executor_kind=args.executor, shrink_evaluations=shrink,
                        extras=not args.quick,
                        progress=not args.quiet, total_budget=args.total_budget, out_is_default=default, kind="verify",
                        replay_depth="full" if not args.no_determinism else "state", resume=args.resume)
    except BrokenExecutor as e:
        # a worker process died under the scheduler (a crash in native code, os.kill, the OOM killer): no
        # finding can name the call, but the user gets one line; the old report is left as it was, and the
        # finished cells are kept for --resume
        print(f"tenantry: error: a worker process died while it ran {args.target} (killed by a signal: a crash "
              f"in the scheduler or its native code, os.kill, or the out-of-memory killer) after "
              f"{time.monotonic() - t0:.0f} s; the run stopped: "
              f"{getattr(e, 'kept', None) or (f'{out} is as it was' if out.exists() else f'{out} was not created')}",
              file=sys.stderr)
        return None
    return report(res, out, time.monotonic() - t0, what=f"{args.target}: an invariant broke or the protocol was broken")


def _read_cancellations(path: str) -> tuple[tuple[float, int], ...]:
    """[[t_s, request_id], ...] from a JSON file.

    Raises:
        ConfigError: naming the file and the entry that is not a [seconds, id] pair.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError("cancellations", path, f"not JSON ({e.msg})", path) from None
    out = []
    for i, e in enumerate(data if isinstance(data, list) else [data]):
        ok = isinstance(e, list) and len(e) == 2 and isinstance(e[0], (int, float)) and isinstance(e[1], int)
        if not ok:
            raise ConfigError(f"cancellations[{i}]", e, "must be [t_s, request_id]", path)
        out.append((float(e[0]), e[1]))
    return tuple(out)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``tenantry verify``; returns the exit status."""
    if args.timeout_s is not None and not args.timeout_s > 0:
        raise ConfigError("--timeout-s", args.timeout_s, "must be > 0")
    if args.resume and (args.history or args.workload):
        raise ConfigError("--resume", True, "only with --target's matrix (a history or a single workload is "
                          "judged again in full, not resumed)")
    if args.history:
        for flag, value in (("--workload", args.workload), ("--cancellations", args.cancellations),
                            ("--patterns", args.patterns and ",".join(args.patterns)), ("--target-path", args.target_path)):
            if value:
                raise ConfigError(flag, value, "only with --target (--history judges the recorded history as is)")
    else:
        for flag, value in (("--claims", args.claims), ("--config", args.config)):
            if value:
                raise ConfigError(flag, value, "only with --history (a --target's adapter states its own claims "
                                  "and configuration)")
        if args.cancellations and not args.workload:
            raise ConfigError("--cancellations", args.cancellations, "needs --workload (the request ids are "
                              "that workload's)")
    return run_history(args) if args.history else run_target(args)
