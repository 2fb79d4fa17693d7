"""``tenantry check``'s engine: every pattern and search against every setup.

For each cell (setup, pattern) of the matrix, :func:`run_cell`:

1. runs each search (:data:`DEFAULT_SEARCHES`, plus ``z3`` where it has an
   abstract model) with its share of the cell's budget and a sub-seed of the
   check's seed, all through one executor;
2. takes the worst workload over the searches (largest objective; ties go to
   the earlier search);
3. replays it with every claimed invariant checked at depth ``full`` (state,
   history and two-run forms) and merges what broke during the search;
4. when it is a finding (objective at or above the pattern's finding level),
   shrinks it (:mod:`tenantry.testing.shrink`);
5. writes the cell folder (:mod:`tenantry.adversaries.report`).

:func:`run_check` runs the cells (``cell_threads`` of them at once, all
sharing the executor), optionally the proofs and the stateful suite, and
writes ``matrix.json``, ``matrix.md`` and ``report.md``.  Same seed and an
evaluation budget: same matrix and same workload files, whatever the number
of workers.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import shlex
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

from tenantry.model.config import ConfigError

from .outdir import staged_folder
from tenantry.model.setups import SETUPS, get_setup
from .evaluate import run_scenario, shrink_scenario
from .patterns import PATTERNS, get_pattern, make_scenario
from .report import dump_json, matrix_text, plot_cell, write_report, write_workload_files
from .search import Budget, SearchResult, run_search
from .z3search import supported as z3_supported

#: Searches every cell runs (z3 is added for ``timed_arrivals`` where supported).
DEFAULT_SEARCHES = ("random", "evolution", "hypothesis")
#: Default evaluations per cell, and per shrink.
DEFAULT_BUDGET = "12"
DEFAULT_SHRINK = 16


def sub_seed(seed: int, *names: str) -> int:
    """A seed for one search of one cell, fixed by the check's seed and the names."""
    words = [seed] + [int.from_bytes(n.encode()[:8].ljust(8, b"\0"), "big") % (2**32) for n in names]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


def searches_for(setup: str, pattern: str, searches: Sequence[str]) -> list[str]:
    """The searches a cell runs: ``searches``, with ``z3`` only where it applies."""
    out = [s for s in searches if s != "z3"]
    if "z3" in searches and pattern == "timed_arrivals" and z3_supported(setup):
        out.append("z3")
    return out


def run_cell(setup: str, pattern: str, *, seed: int, budget: Budget, executor: cf.Executor, out: Path | None,
             searches: Sequence[str] = DEFAULT_SEARCHES, shrink_evaluations: int = DEFAULT_SHRINK,
             plots: bool = False, progress: bool = False, victims: str = "excerpt",
             replay_root: str | os.PathLike | None = None) -> dict[str, Any]:
    """Search, replay, shrink and write one cell; returns its record (JSON-able).

    ``replay_root``: the report folder as the user named it (``out`` may be a staging
    folder); the cell's replay command names ``replay_root/cells/<setup>/<pattern>``
    so that it works from the folder where ``check`` ran.
    """
    pat = get_pattern(pattern)
    names = searches_for(setup, pattern, searches)
    share = budget.split(len(names))
    results: list[SearchResult] = [
        run_search(name, setup, pattern, seed=sub_seed(seed, setup, pattern, name), budget=share,
                   executor=executor, progress=progress, scenario_seed=seed, victims=victims)
        for name in names
    ]
    found = [r for r in results if r.best is not None]
    best = max(found, key=lambda r: r.best.score) if found else None  # max keeps the first of equals
    params = dict(best.best.params) if best else pat.space.defaults()
    scenario = make_scenario(pattern, params, seed, victims=victims)
    hist, base, twin, ev = run_scenario(setup, scenario, depth="full")
    findings = [f.to_json() for f in ev.findings]
    seen = {f.invariant for f in ev.findings}
    for r in results:  # what broke during the search and did not show on the replayed worst workload
        for inv, (idx, f) in r.broken.items():
            if inv not in seen:
                seen.add(inv)
                findings.append({**f.to_json(), "search": r.search, "candidate": idx})
    finding = ev.score >= pat.finding
    rel = Path("cells") / setup / pattern
    rec: dict[str, Any] = {
        "setup": setup, "pattern": pattern, "objective": pat.objective, "score": ev.score,
        "finding": finding, "search": best.search if best else None, "params": params,
        "metrics": dict(ev.metrics), "findings": findings, "unchecked": list(ev.unchecked),
        "evaluations": sum(r.evaluations for r in results),
        "searches": {r.search: {"evaluations": r.evaluations, "best": r.best.score if r.best else None,
                                "note": r.note} for r in results},
        "adversaries": list(scenario.adversaries), "victims": list(scenario.victims), "adversary_requests": sum(
            1 for x in scenario.workload if x.tenant in set(scenario.adversaries)),
        "workload": str(rel / "workload.jsonl"), "workload_name": "workload.jsonl",
        "replay": f"tenantry check --replay {shlex.quote(str(Path(replay_root or '.') / rel))}", "shrunk": None,
    }
    sh = None
    if finding and shrink_evaluations > 0:
        sh = shrink_scenario(setup, scenario, pat.finding, executor=executor, max_evaluations=shrink_evaluations,
                    progress=progress)
        if sh is not None:
            rec["evaluations"] += sh.evaluations
            rec.update(shrunk=str(rel / "shrunk.jsonl"), shrunk_requests=sh.requests, shrunk_score=sh.evaluation.score,
                       shrink_evaluations=sh.evaluations)
    if out is not None:
        folder = out / rel
        rec["files"] = write_workload_files(scenario, folder)
        if sh is not None:
            write_workload_files(sh.scenario, folder, name="shrunk")
        rec["plots"] = plot_cell(setup, scenario, hist, base, folder) if plots else []
        dump_json(rec, folder / "cell.json")
    return rec


def _proofs(timeout_s: float) -> tuple[str, bool]:
    """Every Z3 proof and twin with a short per-obligation timeout: (summary, all ok)."""
    from tenantry.proofs.core import run_all
    from tenantry.proofs.registry import PROOFS

    outs = run_all(PROOFS, twins=True, timeout_ms=int(timeout_s * 1000))
    proofs = [o for o in outs if o.kind == "proof"]
    twins = [o for o in outs if o.kind != "proof"]
    bad = [o.id for o in outs if not o.ok]
    text = (f"{sum(o.ok for o in proofs)}/{len(proofs)} proved, {sum(o.ok for o in twins)}/{len(twins)} twins "
            f"refuted and replayed (timeout {timeout_s:g} s per obligation)" + (f"; not ok: {', '.join(bad)}" if bad else ""))
    return text, not bad


def _stateful(out: Path | None, setups: Sequence[str], max_examples: int) -> tuple[str, bool]:
    """A short Hypothesis stateful run of the reference model under each setup (three victim
    tenants), every invariant the setup claims judged after every step
    (:class:`tenantry.testing.stateful.ModelMachine`); a failure's workload is written
    under ``out/stateful/`` (no example database is written anywhere)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from tenantry.model.traces import write_workload_jsonl
    from tenantry.testing.stateful import StatefulFinding, model_machine

    from tenantry.model.setups import build_config

    failed = []
    for setup in setups:
        cfg = build_config(setup, [(t, "victim") for t in ("t0", "t1", "t2")])
        s = settings(max_examples=max_examples, stateful_step_count=20, deadline=None, derandomize=True,
                     database=None, suppress_health_check=list(HealthCheck), print_blob=False,
                     phases=(Phase.generate,))
        try:
            run_state_machine_as_test(model_machine(cfg, name=f"Stateful_{setup}"), settings=s)
        except StatefulFinding as e:
            where = ""
            if out is not None:
                path = out / "stateful" / f"{setup}-{e.findings[0].invariant}.jsonl"
                write_workload_jsonl(e.workload, path)
                where = f"; workload: {path}"
            failed.append(f"{setup}: {e.findings[0].render()}{where}")
    text = (f"{len(setups) - len(failed)}/{len(setups)} setups passed {max_examples} stateful examples each"
            + ("; " + "; ".join(failed) if failed else ""))
    return text, not failed


#: Setups the stateful suite runs against in ``tenantry check`` (short run).
STATEFUL_SETUPS = ("protected", "hysteresis", "salted_cache")


def _extras(out: Path | None, proof_timeout_s: float = 2.0,
            stateful_examples: int = 8) -> tuple[dict[str, str], bool, dict[str, float]]:
    """A short run of the proofs and the stateful suite, when they can be imported.

    Returns ({name: one-line result}, whether the stateful suite found a broken invariant,
    {name: wall seconds}); the seconds go to timing.json only, never into matrix.json or report.md.
    A failing proof is reported, not counted as a broken claim of a setup.
    """
    out_d: dict[str, str] = {}
    seconds: dict[str, float] = {}
    broke = False
    for label, run in (("proofs", lambda: _proofs(proof_timeout_s)),
                       ("stateful", lambda: _stateful(out, STATEFUL_SETUPS, stateful_examples))):
        t0 = time.monotonic()
        try:
            text, ok = run()
        except ImportError as e:
            out_d[label] = f"not available ({e})"
            continue
        except Exception as e:  # an extra that crashes is reported, not fatal to the matrix
            out_d[label] = f"error: {type(e).__name__}: {e}"
            continue
        out_d[label] = text
        seconds[label] = round(time.monotonic() - t0, 1)
        if label == "stateful" and not ok:
            broke = True
    return out_d, broke, seconds


def run_check(*, setups: Sequence[str] | None = None, patterns: Sequence[str] | None = None, seed: int = 0,
              budget: Budget | None = None, searches: Sequence[str] = DEFAULT_SEARCHES + ("z3",),
              out: str | os.PathLike | None = None, workers: int | None = None, cell_threads: int | None = None,
              shrink_evaluations: int = DEFAULT_SHRINK, plots: str = "findings", extras: bool = True,
              progress: bool = True, executor: cf.Executor | None = None, victims: str = "excerpt",
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the matrix.

    Args:
        setups, patterns: names (default: all of :data:`SETUPS` / :data:`PATTERNS`).
        budget: per cell (default :data:`DEFAULT_BUDGET` evaluations).
        out: folder for the report (None: write nothing).
        workers: processes of the default executor (default: CPU count).
        cell_threads: cells run at once (default: workers); does not change results.
        plots: ``findings`` (one plot set per finding cell), ``all`` or ``none``.
        extras: run the proofs and stateful suite briefly when available.
        victims: the victims' trace source, ``excerpt`` (packaged) or ``shared`` (../shared/traces).
        executor: use this executor instead of making a process pool.

    Returns:
        {"summary": ..., "cells": {(setup, pattern): record}, "claimed_broken": bool}

    Raises:
        ConfigError: on an unknown setup, pattern or search name.
    """
    from .evaluate import make_executor

    setups = list(setups or SETUPS)
    patterns = list(patterns or PATTERNS)
    for s in setups:
        get_setup(s)
    for p in patterns:
        get_pattern(p)
    from .search import SEARCHES
    for s in searches:
        if s not in SEARCHES:
            raise ConfigError("search", s, f"unknown search; choose from {', '.join(SEARCHES)}")
    if plots not in ("findings", "all", "none"):
        raise ConfigError("--plots", plots, "choose findings, all or none")
    budget = budget or Budget.parse(DEFAULT_BUDGET)
    outp = Path(out) if out is not None else None
    root = outp
    stage = ExitStack()
    if outp is not None:
        outp = stage.enter_context(staged_folder(outp))  # the whole report, published at the end
    with stage:
        own = executor is None
        ex = executor or make_executor(workers)
        n_threads = cell_threads or max(1, workers if workers is not None else (os.cpu_count() or 1))
        t0 = time.monotonic()
        cells: dict[tuple[str, str], dict[str, Any]] = {}
        keys = [(s, p) for s in setups for p in patterns]
        bar = tqdm(total=len(keys), desc="tenantry check", unit="cell", disable=not progress, dynamic_ncols=True)
        try:
            with cf.ThreadPoolExecutor(max_workers=n_threads) as pool:
                futs = {pool.submit(run_cell, s, p, seed=seed, budget=budget, executor=ex, out=outp, searches=searches,
                                    shrink_evaluations=shrink_evaluations, plots=plots == "all",
                                    progress=False, victims=victims, replay_root=root): (s, p)
                        for s, p in keys}
                for f in cf.as_completed(futs):
                    cells[futs[f]] = f.result()
                    bar.update(1)
                    if log:
                        s, p = futs[f]
                        log(f"{s}/{p}: {cells[(s, p)]['score']:.3g}")
        finally:
            bar.close()
            if own:
                ex.shutdown()
        plotted: dict[tuple[str, str], list[str]] = {}
        if outp is not None and plots == "findings":
            for (s, p), c in sorted(cells.items()):
                if c["finding"]:
                    sc = make_scenario(p, c["params"], seed, victims=victims)
                    h, b, _, _ = run_scenario(s, sc, depth=None)
                    plotted[(s, p)] = plot_cell(s, sc, h, b, outp / "cells" / s / p)
        elif plots == "all":
            plotted = {k: c.get("plots", []) for k, c in cells.items()}
        extra, stateful_broke, extra_s = _extras(outp) if extras else ({}, False, {})
        if outp is not None and root is not None:  # replay commands name --out, not the staging folder
            extra = {k: v.replace(str(outp), str(root)) for k, v in extra.items()}
        wall_s = time.monotonic() - t0
        evaluations = sum(c["evaluations"] for c in cells.values()) + len(cells)
        summary = {
            "seed": seed, "budget": f"{budget.evaluations or '-'} evaluations" + (
                f", {budget.seconds:g} s" if budget.seconds else ""),
            "setups": setups, "patterns": patterns, "searches": list(searches), "victims": victims,
            "extras": extra,
        }
        claimed_broken = any(c["findings"] for c in cells.values()) or stateful_broke
        if outp is not None:
            ordered = [cells[k] for k in keys]
            dump_json({"summary": summary, "cells": ordered, "claimed_broken": claimed_broken}, outp / "matrix.json")
            from tenantry.model.history import atomic_write_text
            atomic_write_text(outp / "matrix.md", [matrix_text(setups, patterns, cells, markdown=True)])
            write_report(outp, summary, cells, plotted)
            dump_json({"wall_s": round(wall_s, 1), "evaluations": evaluations,
                       "evaluations_per_s": round(evaluations / wall_s, 2) if wall_s > 0 else None,
                       "workers": workers or os.cpu_count(), "extras_s": extra_s}, outp / "timing.json")
        return {"summary": summary, "cells": cells, "claimed_broken": claimed_broken, "wall_s": wall_s,
                "evaluations": evaluations, "extras_s": extra_s}
