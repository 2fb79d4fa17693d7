"""``tenantry check``: what does a genuinely abusive tenant do to the other tenants?

With no arguments: every pattern and search, with a modest budget, against
every built-in setup, on the embedded default (the small replica and the
default victims); then a short run of the proofs and the stateful suite when
they exist.  Prints the setup x pattern matrix (each cell: the objective, a
hurt mark "*", "?" when that verdict changes with the victims' seed, "~"
when the pattern should hurt the setup and did not, a broken-invariant mark
"!"), one line per cell with the worst
workload's file, the wall time and evaluations per second, and writes the
report folder (``--out``, replaced only when it is a check report; the
default folder never by a smaller run).  ``--budget`` is per cell,
``--total-budget`` for the whole run.  Exit status 1 when an invariant that
a setup claims broke or an extra failed (a proof or twin of the short run did
not hold; one undecided within its short timeout is listed, not a failure)
(with ``--strict``, also when a pattern did not hurt a
setup it is expected to hurt), else 0; 2 on bad input; 130 / 143 on Ctrl-C /
SIGTERM (the finished cells are kept beside ``--out``; ``--resume`` finishes the run).

``--replay CELL`` re-runs one cell folder's workload file and prints its metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tenantry.model.config import ConfigError
from tenantry.runner.traces import read_workload_jsonl

from .args import Names, budget, executor, non_negative_int, positive_int

HELP = "Run every abusive-tenant pattern and search against every built-in policy setup; print the matrix."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tenantry.runner.setups import SETUPS
    from tenantry.adversaries.check import matrix_cells

    n = len(matrix_cells(list(SETUPS), None))
    p.add_argument("--budget", type=budget, default=None,
                   help=f"PER CELL, shared by the cell's searches: N evaluations, Ns seconds, or N,Ns (default 12 "
                        f"evaluations); the full matrix has {n} cells, so --budget 20s allows up to {n} x 20 s")
    p.add_argument("--total-budget", type=budget, default=None, metavar="BUDGET",
                   help="for the WHOLE run: N evaluations shared evenly by the cells, and/or Ns of wall time that "
                        "the cells are paced to fit (the run ends somewhat after it: cells past it run one "
                        "evaluation per search and do not shrink; the proofs and stateful extras are skipped)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 also when a pattern did not hurt a setup it is expected to hurt (marked ~)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the victims and the searches (default 0)")
    p.add_argument("--policy", nargs="+", action=Names, default=None, metavar="SETUP",
                   help="setups to run, space- or comma-separated (default: all; see --list)")
    p.add_argument("--pattern", "--patterns", nargs="+", action=Names, default=None, metavar="PATTERN",
                   help="patterns to run, space- or comma-separated (default: all)")
    p.add_argument("--search", nargs="+", default=None, metavar="SEARCH",
                   help="searches per cell: random evolution hypothesis z3 (default: all)")
    p.add_argument("--out", type=Path, default=None,
                   help="report folder (default ./tenantry-check); an existing one is replaced only when it is a "
                        "tenantry check report, and the default one never by a smaller run")
    p.add_argument("--victims", choices=("excerpt", "shared"), default="excerpt",
                   help="victim traffic from the packaged Azure excerpts (default) or the full traces in ../shared/traces")
    p.add_argument("--workers", type=positive_int, default=None, help="worker processes (default: CPU count; 1 runs inline)")
    p.add_argument("--executor", type=executor, default="process", metavar="KIND",
                   help="where evaluations run: process (a process pool here, default), ray (a local Ray instance "
                        "of --workers CPUs), ray:ADDRESS (an existing Ray cluster, e.g. ray:auto), dask (a local Dask cluster of "
                        "--workers processes) or dask:ADDRESS (a Dask scheduler, e.g. dask:tcp://10.0.0.5:8786); same results")
    p.add_argument("--shrink", type=non_negative_int, default=None, metavar="N", help="evaluations per shrink of a finding (default 16; 0: off)")
    p.add_argument("--plots", choices=("findings", "all", "none"), default="findings", help="which cells get plots")
    p.add_argument("--no-extras", action="store_true", help="skip the short run of the proofs and the stateful suite")
    p.add_argument("--resume", action="store_true",
                   help="finish the interrupted run of --out (killed, Ctrl-C, a full disk): only its missing cells "
                        "run, with the same options (refused, naming the option, when one differs); the report is "
                        "the one an uninterrupted run gives")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--list", action="store_true", help="list the setups and patterns and exit")
    p.add_argument("--replay", type=Path, default=None, metavar="CELL", help="re-run a cell folder's workload (or a "
                   "file in it: a finding's finding-<ID>.jsonl witness, shrunk.jsonl) and print its metrics and findings")


def _list() -> int:
    from tenantry.runner.setups import SETUPS
    from tenantry.adversaries.patterns import PATTERNS
    from tenantry.adversaries.check import FLEET_PATTERNS

    w = max(map(len, SETUPS))
    print("setups:")
    for s in SETUPS.values():
        print(f"  {s.name:<{w}} {s.summary}")
    print(f"  (fleet setups run against {', '.join(FLEET_PATTERNS)} unless --pattern names others)")
    w = max(map(len, PATTERNS))
    print("patterns:")
    for p in PATTERNS.values():
        print(f"  {p.name:<{w}} [{p.objective}] {p.exploits}")
    return 0


def replay(folder: Path) -> int:
    """Re-run a cell folder's workload (and the probe's twin) on its setup, or one of its files
    (``cells/<setup>/<pattern>/finding-<ID>.jsonl``: a finding's witness, ``shrunk.jsonl``);
    print the metrics and the invariants broken.

    Raises:
        ConfigError: if the folder has no cell.json, a truncated or incomplete one, or an empty workload file.
        OSError: if the workload file cannot be read.
    """
    from tenantry.adversaries.evaluate import run_scenario
    from tenantry.adversaries.patterns import scenario_from_workload
    from tenantry.adversaries.report import twin_file

    given = folder
    wl_path = folder / "workload.jsonl"
    if folder.is_file() or folder.suffix == ".jsonl":
        folder, wl_path = folder.parent, folder
    cell_path = folder / "cell.json"
    if not cell_path.exists():
        raise ConfigError("--replay", str(given), "no cell.json " + ("in this folder" if given == folder else
                          f"beside it in {folder}") + " (give a cells/<setup>/<pattern> folder, or a workload "
                          "file in one)")
    try:
        cell = json.loads(cell_path.read_text(encoding="utf-8"))
        adv, vic = tuple(cell["adversaries"]), tuple(cell["victims"])
        cell["setup"], cell["pattern"], cell["objective"], float(cell["score"])
    except json.JSONDecodeError as e:
        raise ConfigError("--replay", str(folder), f"not valid JSON ({e.msg} at line {e.lineno}); "
                          "re-run tenantry check to rewrite the cell", str(cell_path)) from None
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError("--replay", str(folder), f"cell.json lacks a valid {e} entry; re-run tenantry check",
                          str(cell_path)) from None
    wl = read_workload_jsonl(wl_path)
    if len(wl) == 0:
        raise ConfigError("--replay", str(folder), "no requests in this file; re-run tenantry check", str(wl_path))
    sc = scenario_from_workload(wl, adv, victims=vic, pattern=cell["pattern"])
    twin_path = folder / twin_file(wl_path.stem)
    if twin_path.exists():
        sc = sc.with_workload(sc.workload, scenario_from_workload(read_workload_jsonl(twin_path), adv, victims=vic,
                                                                  pattern=cell["pattern"]))
    _, _, _, ev = run_scenario(cell["setup"], sc, depth="full")
    recorded, differ = _against_record(cell, wl_path.name, ev)
    recorded = recorded or f"{wl_path.name}, {len(wl)} requests"
    print(f"{cell['setup']} / {cell['pattern']}: {cell['objective']} = {ev.score:.6g} ({recorded})")
    for k in sorted(ev.metrics):
        print(f"  {k:<32} {ev.metrics[k]:.6g}" + (f"  (recorded {differ[k]})" if k in differ else ""))
    print("invariants: " + ("; ".join(f.render() for f in ev.findings) or "none broken")
          + (f" (unchecked: {', '.join(ev.unchecked)})" if ev.unchecked else ""))
    return 1 if ev.findings else 0


def _against_record(cell: dict, name: str, ev) -> tuple[str | None, dict[str, Any]]:
    """How a replay of cell file ``name`` compares with what cell.json recorded:
    (``recorded <score>: same`` or ``DIFFERENT``, or None when nothing was recorded for
    that file; {metric: recorded value} of every metric that differs).  ``workload.jsonl``
    is compared on its score and every metric, ``shrunk.jsonl`` on ``shrunk_score``; a value is
    compared as cell.json stores it (a non-finite float as its repr)."""
    from tenantry.adversaries.report import as_json

    if name == "workload.jsonl":
        want, metrics = cell["score"], cell.get("metrics") or {}
    elif name == "shrunk.jsonl" and "shrunk_score" in cell:
        want, metrics = cell["shrunk_score"], {}
    else:
        return None, {}
    differ = {k: metrics[k] for k in sorted(metrics) if k in ev.metrics and as_json(ev.metrics[k]) != metrics[k]}
    same = as_json(ev.score) == want and not differ
    head = f"recorded {want:.6g}" if isinstance(want, (int, float)) else f"recorded {want}"
    return f"{head}: {'same' if same else 'DIFFERENT'}", differ


DEFAULT_OUT = Path("tenantry-check")


def run(args: argparse.Namespace) -> int:
    from tenantry.adversaries.check import DEFAULT_BUDGET, DEFAULT_SHRINK, run_check
    from tenantry.adversaries.outdir import check_out
    from tenantry.adversaries.patterns import PATTERNS, get_pattern
    from tenantry.adversaries.report import LEGEND, cell_lines, matrix_text
    from tenantry.runner.setups import SETUPS, get_setup
    from tenantry.adversaries.search import Budget, SEARCHES

    if args.list:
        return _list()
    if args.replay is not None:
        return replay(args.replay)
    budget = args.budget or Budget.parse(DEFAULT_BUDGET)
    if args.victims == "shared":
        from tenantry.adversaries.victims import require_shared
        require_shared()  # before any worker starts: one line naming the flag
    setups = None if not args.policy or args.policy == ["all"] else args.policy
    patterns = None if not args.pattern or args.pattern == ["all"] else args.pattern
    out = args.out if args.out is not None else DEFAULT_OUT
    for name in setups or ():
        get_setup(name)
    for name in patterns or ():
        get_pattern(name)
    from tenantry.adversaries.search import SEARCHES

    for name in args.search or ():
        if name not in SEARCHES:
            raise ConfigError("--search", name, f"unknown search; choose from {', '.join(SEARCHES)}")
    from tenantry.adversaries.check import matrix_cells

    n = len(matrix_cells(setups or list(SETUPS), patterns))
    check_out(out, "check", default=args.out is None, size=n)  # refused before the plan line and any work
    total = args.total_budget

    def announce(kept: int) -> None:  # once --out is taken (a refusal is the only line)
        if not args.quiet:
            print(f"tenantry check: {n} cells, budget {_budget_words(budget)} per cell"
                  + (f", {_budget_words(total)} in total" if total else "")
                  + (f"; resuming: {kept} finished, {n - kept} to run" if args.resume else "")
                  + f"; report: {out}", file=sys.stderr)

    t0 = time.monotonic()
    res = run_check(setups=setups, patterns=patterns, seed=args.seed, budget=budget,
                    searches=tuple(args.search or SEARCHES), out=out, workers=args.workers, executor_kind=args.executor,
                    shrink_evaluations=DEFAULT_SHRINK if args.shrink is None else args.shrink, plots=args.plots,
                    extras=not args.no_extras, progress=not args.quiet, victims=args.victims,
                    total_budget=total, out_is_default=args.out is None, resume=args.resume, announce=announce)
    return report(res, out, time.monotonic() - t0, strict=args.strict)


def report(res: dict, out: Path, wall: float, *, strict: bool = False, what: str = "a claimed invariant broke") -> int:
    """Print a matrix run (:func:`~tenantry.adversaries.check.run_check`'s result) as ``check``
    does, and return the exit status: 1 when an invariant broke, an extra failed (a proof
    of the short run did not hold, or an extra raised) or, ``strict``, an expectation was not
    met; else 0.  ``tenantry verify --target`` prints the same."""
    from tenantry.adversaries.report import ABBREV, LEGEND, cell_lines, fleet_text, matrix_text

    s, cells = res["summary"], res["cells"]
    print(matrix_text(s["setups"], s["patterns"], cells))
    print()
    cols = ", ".join(f"{a}={p}" for p, a in ABBREV.items() if a != p and p in s["patterns"])
    print(LEGEND + (f"\ncolumns: {cols}" if cols else ""))
    print()
    for line in cell_lines(s["setups"], s["patterns"], cells):
        print(line)
    fleet = fleet_text(s["setups"], s["patterns"], cells)
    if fleet:
        print()
        print(fleet)
    from tenantry.adversaries.replay import text_runnable

    for k, v in sorted((s.get("extras") or {}).items()):
        secs = (res.get("extras_s") or {}).get(k)
        print(f"{k}: {text_runnable(v, out)}" + (f" ({secs:.1f} s)" if secs is not None else ""))
    unmet, unstable = res.get("unmet", []), res.get("seed_dependent", [])
    if s.get("expected"):
        print(f"expectations: {s.get('expected', 0) - len(unmet)} of {s.get('expected', 0)} \"should hurt\" met"
              + (f"; not met (~): {', '.join(f'{a}/{b}' for a, b in unmet)}" if unmet else "")
              + f"; {len(unstable)} verdicts change with the victims' seed (?)")
    ev = res["evaluations"]
    print(f"\n{len(cells)} cells, {ev} evaluations in {wall:.1f} s ({ev / wall:.2f} evaluations/s); report: {out / 'report.md'}")
    for line in _replay_hint(cells, out):
        print(line)
    code = 0
    if res["claimed_broken"]:
        print(f"{what}: exit 1", file=sys.stderr)
        code = 1
    failed = res.get("extras_failed") or []
    if failed:
        print(f"{' and '.join(failed)} failed: exit 1", file=sys.stderr)
        code = 1
    if strict and unmet:
        print(f"--strict: {len(unmet)} expected to hurt and did not: exit 1", file=sys.stderr)
        code = 1
    return code


def _replay_hint(cells: dict, out: Path | None = None) -> list[str]:
    """The one replay command printed under the matrix (every cell's and finding's is in
    report.md and cell.json): a broken invariant's witness that broke it again when replayed
    (its ``finding-<ID>.jsonl``), else the cell replay of a finding shown on the cell's own
    workload, else the first hurt cell's; none when nothing broke or hurt.  With ``out`` (the
    report folder) the command is printed runnable from here, not from the report folder."""
    lines = _hint(cells)
    if out is None:
        return lines
    from tenantry.adversaries.replay import text_runnable

    return [text_runnable(line, out) for line in lines]


def _hint(cells: dict) -> list[str]:
    found = [(c, f) for c in cells.values() for f in c.get("findings") or ()]
    for c, f in found:
        if f.get("reproduced") and f.get("replay"):
            return [f"replay {c['setup']}/{c['pattern']} (broke {f['invariant']}): {f['replay']}"]
    for c, f in found:
        if "search" not in f and c.get("replay"):
            return [f"replay {c['setup']}/{c['pattern']} (broke {f['invariant']}): {c['replay']}"]
    if found:
        c, f = found[0]
        return [f"{c['setup']}/{c['pattern']} broke {f['invariant']} on a search candidate that did not break it "
                "again when replayed: see report.md"]
    hurt = next((c for c in cells.values() if c.get("finding") and c.get("replay")), None)
    return [f"replay {hurt['setup']}/{hurt['pattern']} (hurt): {hurt['replay']}"] if hurt else []


def _budget_words(b) -> str:
    parts = ([f"{b.evaluations} evaluations"] if b.evaluations is not None else []) + (
        [f"{b.seconds:g} s"] if b.seconds is not None else [])
    return " and ".join(parts)
