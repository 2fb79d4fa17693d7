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
of workers, whatever ``--out`` is named, and whether or not the run was killed
and resumed: each finished cell is recorded in the staging folder as it ends,
and ``resume`` runs only the missing ones (:mod:`tenantry.adversaries.resume`).

(About 800 lines, past the project's 500: the engine is one driver of the
matrix, whose cell, witness, extras and pacing parts share its state; the
resume machinery, the replay commands and the report's files live in their own
modules.)
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import queue
import re
import shlex
import threading
import sys
import time
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

from tenantry.model.config import ConfigError
from tenantry.runner.history import History
from tenantry.runner.setups import SETUPS, get_setup

from .evaluate import System, Task, evaluate_batch, hang_note, run_scenario, scenario_of, shrink_scenario
from .outdir import STOP_REQUESTED, Interrupted, report_folder, shielded, stop_if_requested
from .patterns import PATTERNS, Scenario, get_pattern
from .replay import in_report, text_in_report
from .resume import fingerprint, load_cells, prune, save_cell
from .report import (cell_plots, dump_json, folder_name, matrix_md, plot_cell, write_plots, write_report,
                     write_workload_files)
from .search import Budget, SearchResult, run_search
from .space import freeze
from .z3search import supported as z3_supported

#: Searches every cell runs (z3 is added for ``timed_arrivals`` where supported).
DEFAULT_SEARCHES = ("random", "evolution", "hypothesis")
#: Default evaluations per cell, and per shrink.
DEFAULT_BUDGET = "12"
DEFAULT_SHRINK = 16
#: Extra victim seeds (after the check's own) on which a verdict near the hurt level is re-scored.
SPREAD_SEEDS = 2
#: A verdict is "near the hurt level" when its objective is within this factor of it (either side).
SPREAD_BAND = 2.0


#: The patterns a fleet setup runs against in the default matrix (no ``--pattern``): the two
#: routing patterns and the three whose pressure a router moves (flood, sybil, slow decoders).
#: A fleet evaluation costs about three of a replica's, so all patterns on every fleet setup
#: would add minutes to the main job; ``--pattern`` names any pattern for any setup.
FLEET_PATTERNS = ("flood", "slow_decoders", "sybil", "prefix_herding", "replica_spreading")


def matrix_cells(setups: Sequence[str], patterns: Sequence[str] | None) -> list[tuple[str, str]]:
    """The (setup, pattern) cells of a matrix, setup by setup: every setup against ``patterns``;
    with ``patterns`` None (the default), every pattern for a one-replica setup and
    :data:`FLEET_PATTERNS` for a fleet setup (a setup that is not built in: every pattern).

    Raises:
        ConfigError: on an unknown pattern.
    """
    names = list(patterns) if patterns is not None else list(PATTERNS)
    for p in names:
        get_pattern(p)
    fleet = lambda s: s in SETUPS and SETUPS[s].fleet is not None
    return [(s, p) for s in setups for p in names
            if patterns is not None or not fleet(s) or p in FLEET_PATTERNS]


class _Gate:
    """Writes into the staging folder pass through here; once closed (Ctrl-C, an error), none starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.closed = False

    @contextmanager
    def open(self):
        with self._lock:
            if self.closed:
                raise Interrupted("")
            yield

    def close(self) -> None:
        with self._lock:
            self.closed = True


def near_threshold(score: float, threshold: float, band: float = SPREAD_BAND) -> bool:
    """True when ``score`` is within a factor ``band`` of ``threshold`` (either side)."""
    return threshold / band <= score < threshold * band


def verdict_of(hurt_on: list[bool]) -> str:
    """``hurt``, ``not hurt`` or ``seed-dependent`` from the verdicts on each seed."""
    return "hurt" if all(hurt_on) else "not hurt" if not any(hurt_on) else "seed-dependent"


def sub_seed(seed: int, *names: str) -> int:
    """A seed for one search of one cell, fixed by the check's seed and the names."""
    words = [seed] + [int.from_bytes(n.encode()[:8].ljust(8, b"\0"), "big") % (2**32) for n in names]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


def label(setup: "str | System") -> str:
    """A setup's name, or a system's label (its row in the matrix, its folder under ``cells/``)."""
    return setup if isinstance(setup, str) else setup.name


def searches_for(setup: "str | System", pattern: str, searches: Sequence[str]) -> list[str]:
    """The searches a cell runs: ``searches``, with ``z3`` only where it applies (a model
    setup it has an abstract model of)."""
    out = [s for s in searches if s != "z3"]
    if ("z3" in searches and pattern == "timed_arrivals" and isinstance(setup, str) and get_setup(setup).fleet is None
            and z3_supported(setup)):  # the abstract model is one replica
        out.append("z3")
    return out


def _replay_out(replay_root: "str | os.PathLike | None", rel: Path, suffix: str) -> Path | None:
    """Where a cell's replay command writes its report: ``<report>-replay/<rel><suffix>``,
    beside the report, never in it (None without a report folder: the command's default)."""
    if replay_root is None:
        return None
    from .outdir import replay_twin

    return replay_twin(replay_root) / f"{rel}{suffix}-replay"


def run_cell(setup: "str | System", pattern: str, *, seed: int, budget: Budget, executor: cf.Executor, out: Path | None,
             searches: Sequence[str] = DEFAULT_SEARCHES, shrink_evaluations: int = DEFAULT_SHRINK,
             plots: bool = False, progress: bool = False, victims: str = "excerpt",
             replay_root: str | os.PathLike | None = None, spread_seeds: int = SPREAD_SEEDS,
             gate: _Gate | None = None, depth: str = "full",
             search_on: "str | System | None" = None) -> dict[str, Any]:
    """Search, replay, shrink and write one cell; returns its record (JSON-able).

    ``search_on``: the system the searches run on (default ``setup``): the worst workload found
    there is then run on ``setup`` (a live server's cell searched on a model setup).

    Once a search finds that the system hangs (ADAPTER-HANG), the cell's later searches are
    skipped (their record says so): each would first wait out the per-call timeout.

    ``replay_root``: the report folder as the user named it (``out`` may be a staging
    folder); the cell's replay commands are written as run from it
    (:func:`~tenantry.adversaries.replay.in_report`: ``cells/<setup>/<pattern>``), so that the
    report's bytes do not depend on its name.

    ``spread_seeds``: when the objective is near the hurt level (:func:`near_threshold`),
    the worst workload's parameters are evaluated again with the victims' traffic drawn
    from seeds ``seed + 1 .. seed + spread_seeds``; the record's ``spread`` holds the
    scores per seed and ``verdict`` says ``hurt``, ``not hurt`` or ``seed-dependent``.

    ``gate``: writes happen inside ``gate.open()`` (closed on Ctrl-C: nothing is written after).
    """
    pat = get_pattern(pattern)
    name_ = label(setup)
    searcher = setup if search_on is None else search_on
    names = searches_for(searcher, pattern, searches)
    share = budget.split(max(1, len(names)))  # no search (a live cell of default workloads): unused
    results: list[SearchResult] = []
    for name in names:
        hung = next((r.search for r in results if "ADAPTER-HANG" in r.broken), None)
        if hung is not None:  # every further search would first wait out the call timeout, at least once
            results.append(SearchResult(name, name_, pattern, sub_seed(seed, name_, pattern, name), None, 0,
                                        note=f"skipped: the system hung (ADAPTER-HANG) in the {hung} search"))
            continue
        results.append(run_search(name, searcher, pattern, seed=sub_seed(seed, name_, pattern, name), budget=share,
                                  executor=executor, progress=progress, scenario_seed=seed, victims=victims))
    found = [r for r in results if r.best is not None]
    best = max(found, key=lambda r: r.best.score) if found else None  # max keeps the first of equals
    params = dict(best.best.params) if best else pat.space.defaults()
    scenario = scenario_of(Task(setup, pattern, freeze(params), seed, victims=victims))
    hist, base, twin, ev = run_scenario(setup, scenario, depth=depth)
    findings = [f.to_json() for f in ev.findings]
    sources: list[tuple[Scenario, History | None]] = [(scenario, hist) for _ in findings]
    seen = {f.invariant for f in ev.findings}
    for r in results if search_on is None else ():  # what broke during the search and did not show on the
        for inv, (idx, f, cand) in r.broken.items():  # replayed worst workload (of this system's searches)
            if inv not in seen:
                seen.add(inv)
                findings.append({**f.to_json(), "search": r.search, "candidate": idx})
                sources.append((scenario_of(Task(setup, pattern, freeze(cand), seed, victims=victims)), None))
    finding = ev.score >= pat.finding
    spread = {str(seed): ev.score}
    if spread_seeds > 0 and near_threshold(ev.score, pat.finding):
        tasks = [Task(setup, pattern, freeze(params), seed + k, depth=None, victims=victims) for k in range(1, spread_seeds + 1)]
        for k, e in enumerate(evaluate_batch(executor, tasks), 1):
            spread[str(seed + k)] = e.score
    verdict = verdict_of([v >= pat.finding for v in spread.values()])
    expected = name_ in pat.hurts
    rel = Path("cells") / folder_name(name_) / pattern
    rec: dict[str, Any] = {
        "setup": name_, "pattern": pattern, "objective": pat.objective, "score": ev.score,
        "finding": finding, "threshold": pat.finding, "spread": spread, "verdict": verdict,
        "expected_hurt": expected, "expectation_met": (finding if expected else None),
        "search": best.search if best else None, "params": params,
        **({"searched_on": label(search_on)} if search_on is not None else {}),
        "metrics": dict(ev.metrics), "findings": findings, "unchecked": list(ev.unchecked),
        "coverage": dict(ev.coverage), "steps": len(hist.steps),
        "evaluations": sum(r.evaluations for r in results) + len(spread) - 1,
        "searches": {r.search: {"evaluations": r.evaluations, "best": r.best.score if r.best else None,
                                "note": r.note} for r in results},
        **({"fleet": _fleet_of(setup)} if _fleet_of(setup) else {}),
        "adversaries": list(scenario.adversaries), "victims": list(scenario.victims), "adversary_requests": sum(
            1 for x in scenario.workload if x.tenant in set(scenario.adversaries)),
        "workload": str(rel / "workload.jsonl"), "workload_name": "workload.jsonl",
        "replay": (setup.replay_command(Path(replay_root or ".") / rel, scenario.horizon_s, scenario.roles,
                                        replay_out=_replay_out(replay_root, rel, ""))
                   if hasattr(setup, "replay_command")
                   else f"tenantry check --replay {shlex.quote(str(Path(replay_root or '.') / rel))}"), "shrunk": None,
    }
    sh = None
    if finding and shrink_evaluations > 0 and hang_note(ev):
        rec["shrunk_note"] = hang_note(ev)
    elif finding and shrink_evaluations > 0:
        sh = shrink_scenario(setup, scenario, pat.finding, executor=executor, max_evaluations=shrink_evaluations,
                    progress=progress)
        if sh is not None:
            rec["evaluations"] += sh.evaluations
            rec.update(shrunk=str(rel / "shrunk.jsonl"), shrunk_requests=sh.requests, shrunk_score=sh.evaluation.score,
                       shrink_evaluations=sh.evaluations)
            if hasattr(setup, "replay_command"):
                rec["shrunk_replay"] = setup.replay_command(Path(replay_root or ".") / rel, scenario.horizon_s,
                                                            scenario.roles, name="shrunk",
                                                            replay_out=_replay_out(replay_root, rel, "-shrunk"))
    witnesses = _witnesses(setup, findings, sources, rel=rel, replay_root=replay_root, depth=depth,
                           executor=executor, shrink_evaluations=shrink_evaluations, progress=progress)
    rec["evaluations"] += sum(w[2] for w in witnesses)
    if replay_root is not None:  # the report's files hold the commands as run from the report folder
        for d in [rec, *findings]:
            for k in ("replay", "shrunk_replay"):
                if isinstance(d.get(k), str):
                    d[k] = in_report(d[k], replay_root)
    if out is not None:
        with gate.open() if gate is not None else nullcontext():
            folder = out / rel
            rec["files"] = write_workload_files(scenario, folder)
            if sh is not None:
                write_workload_files(sh.scenario, folder, name="shrunk")
            for name, sc, _ in witnesses:
                write_workload_files(sc, folder, name=name)
            rec["plots"] = plot_cell(name_, scenario, hist, base, folder) if plots else []
            dump_json(rec, folder / "cell.json")
    return rec


def _fleet_of(setup: "str | System") -> dict[str, Any] | None:
    """A fleet setup's router, accounting and replicas (a cell record's ``fleet``), else None."""
    f = get_setup(setup).fleet if isinstance(setup, str) else None
    return None if f is None else {"router": f.router, "accounting": f.accounting, "replicas": f.replicas}


#: Findings not shrunk to a witness: DETERMINISM compares whole runs in fresh processes; a
#: hang costs the call timeout per evaluation.
NOT_SHRUNK = ("DETERMINISM", "ADAPTER-HANG")
#: Most invariants of one cell whose witness is shrunk (the others' witness is the workload they broke on).
MAX_WITNESSES = 4


def _witnesses(setup: "str | System", findings: list[dict[str, Any]], sources: list[tuple[Scenario, History | None]],
               *, rel: Path, replay_root: "str | os.PathLike | None", depth: str, executor: cf.Executor,
               shrink_evaluations: int, progress: bool) -> list[tuple[str, Scenario, int]]:
    """Give each finding (in place) a witness: the smallest workload found on which its invariant
    still breaks, written as ``finding-<ID>.jsonl`` beside the cell's workload, with the command
    that replays it.

    Each finding's source is the workload it showed on (the cell's replayed worst workload, or
    the search candidate's).  That workload is evaluated again first: ``reproduced`` says whether
    the invariant broke again (False: the finding depends on something the workload does not fix,
    e.g. timing or hash seed, or on a race in the scheduler); it is then shrunk with
    :func:`~tenantry.adversaries.evaluate.shrink_scenario` (``invariant=``; cut after the step it
    showed at).  One witness per invariant (the first finding's; the invariant's other findings
    name the same file), at most :data:`MAX_WITNESSES` shrunk per cell, sharing ``2 x shrink_evaluations``
    evaluations (at least 4 each; with ``shrink_evaluations`` 0, one: the replay).  An invariant
    past those, or one of :data:`NOT_SHRUNK`, broken on a search candidate gets that candidate's
    workload unshrunk as its witness (one evaluation: the replay); broken on the cell's own
    workload, it keeps the cell's replay.  A finding
    gets ``witness`` (file), ``witness_requests``, ``reproduced``, ``witness_note`` (why it was
    not shrunk: the system hangs on it, :func:`~tenantry.adversaries.evaluate.hang_note`), ``witness_finding`` (the
    finding on the witness), ``witness_first`` (when another invariant breaks at an earlier
    step on the witness: its first finding, the likelier cause) and ``replay`` (a command).

    Returns [(file stem, scenario, evaluations spent)] to write.
    """
    out: list[tuple[str, Scenario, int]] = []
    first: dict[str, int] = {}
    for i, f in enumerate(findings):
        first.setdefault(f["invariant"], i)
    shrunk = [inv for inv in first if inv not in NOT_SHRUNK][:MAX_WITNESSES]
    todo = [(findings[i], sources[i]) for i in first.values()]
    each = max(4, 2 * shrink_evaluations // max(1, len(shrunk)))  # the shrunk witnesses share 2 x --shrink
    for f, (src, hist) in todo:
        inv = f["invariant"]
        cut = None
        if hist is not None and f.get("step") is not None and 0 <= f["step"] < len(hist.steps):
            s = hist.steps[f["step"]]
            cut = s.start_s + s.duration_s
        if inv not in shrunk and hist is not None:
            continue  # not shrunk and broken on the cell's own workload: the cell's replay is its witness
        sh = (shrink_scenario(setup, src, invariant=inv, depth=depth, executor=executor, cut_after_s=cut,
                              max_evaluations=each if shrink_evaluations > 0 and inv in shrunk else 1,
                              progress=progress))
        stem = f"finding-{inv}"
        sc = sh.scenario if sh is not None else src
        out.append((stem, sc, sh.evaluations if sh is not None else 1))
        f.update(reproduced=sh is not None, witness=str(rel / f"{stem}.jsonl"), witness_requests=len(sc.workload))
        if sh is not None and sh.note:
            f["witness_note"] = sh.note
        if sh is not None and sh.finding is not None:
            f["witness_finding"] = sh.finding.to_json()
            first_step = _breaks_first(sh.evaluation.findings, inv)
            if first_step is not None:
                f["witness_first"] = first_step.to_json()
        cell = Path(replay_root or ".") / rel
        f["replay"] = (setup.replay_command(cell, sc.horizon_s, sc.roles, name=stem,
                                            replay_out=_replay_out(replay_root, rel, f"-{stem}"))
                       if hasattr(setup, "replay_command")
                       else f"tenantry check --replay {shlex.quote(str(cell / f'{stem}.jsonl'))}")
    for i, f in enumerate(findings):  # the invariant's other findings name the same witness
        j = first.get(f["invariant"])
        if j is not None and j != i:
            f.update({k: v for k, v in findings[j].items()
                      if k in ("reproduced", "witness", "witness_requests", "witness_note", "witness_finding",
                               "witness_first", "replay")})
    return out


def _breaks_first(findings: "Sequence[Finding]", invariant: str) -> "Finding | None":
    """On one run: the finding of another invariant at the earliest step, if it is earlier than
    ``invariant``'s first (a knock-on finding points away from the bug: a leaked block also shows
    as an eviction that did not need to happen); None when ``invariant`` breaks first."""
    own = min((f.step for f in findings if f.invariant == invariant and f.step is not None), default=None)
    if own is None:
        return None
    return min((f for f in findings if f.invariant != invariant and f.step is not None and f.step < own),
               key=lambda f: f.step, default=None)


def _proofs(timeout_s: float) -> tuple[str, bool]:
    """Every Z3 proof and twin with a short per-obligation timeout: (summary, none failed).

    Failed: a proof refuted, a twin or limit that Z3 proved (its mechanism not needed) or whose
    counterexample does not replay on the model.  A row Z3 did not decide within ``timeout_s``
    (``unknown``) is run again with ``tenantry prove``'s timeout
    (:data:`~tenantry.proofs.core.TIMEOUT_MS`), so that a loaded machine does not turn the
    summary into "31/33 proved" (a fresh user saw that at load 6); one still undecided then is
    listed as undecided and is not a failure."""
    from tenantry.proofs.core import TIMEOUT_MS, UNKNOWN, run_all, run_proof, run_twin
    from tenantry.proofs.registry import PROOFS

    outs = run_all(PROOFS, twins=True, timeout_ms=int(timeout_s * 1000))
    again = {o.id for o in outs if o.verdict == UNKNOWN}
    if again:
        rows = {p.id: (lambda p=p: run_proof(p, TIMEOUT_MS)) for p in PROOFS}
        rows.update({f"{p.id}~{tw.name}": (lambda p=p, tw=tw: run_twin(p, tw, TIMEOUT_MS))
                     for p in PROOFS for tw in p.twins})
        outs = [rows[o.id]() if o.id in again else o for o in outs]
    of = {k: [o for o in outs if o.kind == k] for k in ("proof", "twin", "limit")}
    failed = [o.id for o in outs if not o.ok and o.verdict != UNKNOWN]
    undecided = [o.id for o in outs if o.verdict == UNKNOWN]
    count = lambda k: f"{sum(o.ok for o in of[k])}/{len(of[k])}"  # noqa: E731
    text = (f"{count('proof')} proved, {count('twin')} twins and {count('limit')} limits refuted and replayed "
            f"(at most {timeout_s:g} s per obligation, {TIMEOUT_MS / 1000:g} s on a second try)"
            + (f"; FAILED: {', '.join(failed)}" if failed else "")
            + (f"; undecided in {TIMEOUT_MS / 1000:g} s (not failures): {', '.join(undecided)}" if undecided else ""))
    return text, not failed


def _stateful(out: Path | None, setups: Sequence[str], max_examples: int) -> tuple[str, bool]:
    """A short Hypothesis stateful run of the reference model under each setup (three victim
    tenants), every invariant the setup claims judged after every step
    (:class:`tenantry.testing.stateful.ModelMachine`); a failure's workload is written
    under ``out/stateful/`` (no example database is written anywhere)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from tenantry.runner.traces import write_workload_jsonl
    from tenantry.testing.stateful import StatefulFinding, model_machine

    from tenantry.runner.setups import build_config

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
                where = f"; workload: {path.relative_to(out)} in the report"
            failed.append(f"{setup}: {e.findings[0].render()}{where}")
    text = (f"{len(setups) - len(failed)}/{len(setups)} setups passed {max_examples} stateful examples each"
            + ("; " + "; ".join(failed) if failed else ""))
    return text, not failed


#: Setups the stateful suite runs against in ``tenantry check`` (short run).
STATEFUL_SETUPS = ("protected", "hysteresis", "salted_cache")


def _extras(out: Path | None, systems: Sequence = (), proof_timeout_s: float = 2.0,
            stateful_examples: int = 8, note: Callable[[str], None] | None = None,
            shown: Path | None = None) -> tuple[dict[str, str], bool, list[str], dict[str, float]]:
    """A short run of the proofs and the stateful suite of the model setups, and each
    other system's own extras (``system.extras(out, shown)``: a scheduler under test's
    stateful run and its determinism across processes; ``out`` the report folder being
    written, ``shown`` the one the user named, which replay commands name).

    Returns ({name: one-line result}, whether an extra found a broken invariant,
    [names of the extras that failed], {name: wall seconds}); the seconds go to timing.json
    only, never into matrix.json or report.md.  A failing proof is not a broken claim of a
    setup but fails the run (``proofs`` in the failed names), as does an extra that raised
    (reported as ``error: ...``); one whose library is missing is ``not available``, not
    failed.  ``note`` is told when each extra starts and ends (the progress lines after the
    matrix's bar).
    """
    out_d: dict[str, str] = {}
    seconds: dict[str, float] = {}
    broke = False
    failed: list[str] = []
    runs = []
    if any(isinstance(s, str) for s in systems) or not systems:
        runs += [("proofs", lambda: _proofs(proof_timeout_s)),
                 ("stateful", lambda: _stateful(out, STATEFUL_SETUPS, stateful_examples))]
    for sys_ in systems:
        if not isinstance(sys_, str) and hasattr(sys_, "extras"):
            runs += [(name, (lambda f=f: f())) for name, f in sys_.extras(out, shown)]
    for n, (label, run) in enumerate(runs, 1):
        t0 = time.monotonic()
        if note:
            note(f"{label} ({n} of {len(runs)} after the matrix)...")
        try:
            text, ok = run()
        except ImportError as e:
            out_d[label] = f"not available ({e})"
            continue
        except Exception as e:  # an extra that crashes is reported, not fatal to the matrix
            if STOP_REQUESTED.is_set():  # the crash is a Ctrl-C surfacing in a library (ctypes wraps it)
                raise KeyboardInterrupt from None
            out_d[label] = f"error: {type(e).__name__}: {e}"
            failed.append(label)
            continue
        if STOP_REQUESTED.is_set():  # a Ctrl-C that a library swallowed: no report from a cut run
            raise KeyboardInterrupt
        out_d[label] = text
        seconds[label] = round(time.monotonic() - t0, 1)
        if note:
            note(f"{label}: {text} ({seconds[label]:.0f} s)")
        if label == "proofs" and not ok:
            failed.append(label)
        elif not ok:
            broke = True
    return out_d, broke, failed, seconds


#: Of a cell's share of the total time: the part for its searches, and for shrinking (the rest: replay, files).
SEARCH_SHARE, SHRINK_SHARE = 0.4, 0.2


def cell_budget(budget: Budget, total: Budget | None, *, cells_left: int, n_cells: int, threads: int,
                seconds_left: float | None, seconds_per_evaluation: float | None = None,
                shrink_evaluations: int = DEFAULT_SHRINK) -> tuple[Budget, int]:
    """The budget of the next cell and its shrink evaluations: ``budget`` (per cell) within its share of
    ``total`` (the whole run).

    ``total``'s evaluations are divided evenly over the cells (at least 1 each).  Its
    seconds are paced: a cell starting with ``seconds_left`` on the run's clock has a share
    of ``seconds_left * threads / cells_left``; :data:`SEARCH_SHARE` of it goes to its
    searches (as seconds, and, once ``seconds_per_evaluation`` has been measured on the
    cells done, as that many evaluations: a time budget is only checked between batches)
    and :data:`SHRINK_SHARE` to shrinking; past the deadline a cell runs one evaluation
    per search and does not shrink.
    """
    if total is None:
        return budget, shrink_evaluations
    ev = budget.evaluations
    if total.evaluations is not None:
        ev = max(1, total.evaluations // max(1, n_cells)) if ev is None else min(ev, max(1, total.evaluations // n_cells))
    sec = budget.seconds
    shrink_n = shrink_evaluations
    if seconds_left is not None:
        share = max(0.0, seconds_left) * threads / max(1, cells_left)
        search_s = max(0.01, SEARCH_SHARE * share)
        sec = search_s if sec is None else min(sec, search_s)
        if seconds_left <= 0:
            ev, shrink_n = 1, 0
        elif seconds_per_evaluation:
            fit = int(SEARCH_SHARE * share / seconds_per_evaluation)
            ev = max(1, fit if ev is None else min(ev, fit))
            shrink_n = min(shrink_n, int(SHRINK_SHARE * share / seconds_per_evaluation))
    return Budget(ev, sec), shrink_n


def _cells_in_threads(keys: list, fn: Callable[[Any], dict], n_threads: int,
                      on_done: Callable[[Any, dict], None]) -> None:
    """Run ``fn(key)`` for every key on ``n_threads`` daemon threads (1: in this thread); ``on_done`` in this thread.

    Daemon threads, unlike a ThreadPoolExecutor's, are not waited for at exit:
    Ctrl-C ends the run at once.  The first exception in a cell is raised here.
    """
    if n_threads <= 1 or len(keys) <= 1:
        for k in keys:
            stop_if_requested()
            on_done(k, fn(k))
        return
    todo: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()
    for k in keys:
        todo.put(k)

    def worker() -> None:
        while True:
            try:
                k = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((k, fn(k), None))
            except BaseException as e:  # handed to the main thread, which stops the run
                done.put((k, None, e))
                return

    for _ in range(min(n_threads, len(keys))):
        threading.Thread(target=worker, name="tenantry-cell", daemon=True).start()
    for _ in keys:
        while True:
            stop_if_requested()
            try:
                k, rec, err = done.get(timeout=0.5)
                break
            except queue.Empty:
                continue
        if err is not None:
            raise err
        on_done(k, rec)


def plots_of(task: Task, title: str) -> dict[str, bytes]:
    """The plots of a cell's worst workload (:func:`~tenantry.adversaries.report.cell_plots`,
    titled ``title``), run unchecked; top level and picklable, so the executor makes them
    while other cells run."""
    sc = scenario_of(task)
    h, b, _, _ = run_scenario(task.setup, sc, depth=None)
    return cell_plots(title, sc, h, b)


def run_check(*, setups: Sequence[str] | None = None, patterns: Sequence[str] | None = None, seed: int = 0,
              budget: Budget | None = None, searches: Sequence[str] = DEFAULT_SEARCHES + ("z3",),
              out: str | os.PathLike | None = None, workers: int | None = None, cell_threads: int | None = None,
              shrink_evaluations: int = DEFAULT_SHRINK, plots: str = "findings", extras: bool = True,
              progress: bool = True, executor: cf.Executor | None = None, executor_kind: str = "process",
              victims: str = "excerpt",
              log: Callable[[str], None] | None = None, total_budget: Budget | None = None,
              spread_seeds: int = SPREAD_SEEDS, out_is_default: bool = False, kind: str = "check",
              replay_depth: str = "full", resume: bool = False,
              announce: Callable[[int], None] | None = None,
              search_on: "str | System | None" = None) -> dict[str, Any]:
    """Run the matrix.

    Args:
        setups: setup names or :class:`~tenantry.adversaries.evaluate.System` values
            (default: all of :data:`SETUPS`); patterns: names (default: all of :data:`PATTERNS`,
            a fleet setup :data:`FLEET_PATTERNS`: :func:`matrix_cells`).
        kind: the report's kind (``check``; ``verify`` for a scheduler under test).
        replay_depth: how deep each cell's worst workload is checked (``full``: with the
            two-run forms; ``state`` skips them).
        budget: per cell (default :data:`DEFAULT_BUDGET` evaluations), shared by the cell's searches.
        total_budget: for the whole run (see :func:`cell_budget`); None: no limit.  Once its
            seconds are spent, the remaining cells skip shrinking and the extras are skipped.
        out: folder for the report (None: write nothing); replaced only when it is a check
            report (:func:`~tenantry.adversaries.outdir.report_folder`).
        out_is_default: ``out`` is the command's default folder (never replaced by a smaller run).
        workers: processes of the default executor (default: CPU count).
        cell_threads: cells run at once (default: twice the workers, one when inline); does not
            change results.
        plots: ``findings`` (one plot set per finding cell), ``all`` or ``none``.
        extras: run the proofs and stateful suite briefly when available.
        victims: the victims' trace source, ``excerpt`` (packaged) or ``shared`` (../shared/traces).
        spread_seeds: extra victim seeds for verdicts near the hurt level (see :func:`run_cell`).
        executor: use this executor instead of making one.
        executor_kind: the executor to make (:func:`~tenantry.adversaries.evaluate.make_executor`:
            ``process``, ``ray``, ``ray:ADDRESS``, ``dask`` or ``dask:ADDRESS``); results do not depend on it.
        resume: finish the interrupted run of ``out`` with the same options
            (:mod:`tenantry.adversaries.resume`): only its missing cells run, and the report is the
            bytes an uninterrupted run gives.  ``--total-budget``'s seconds continue the
            interrupted run's clock from when its last kept cell ended.
        announce: called with the number of finished cells resumed once ``out`` is taken (before
            any work: a refusal comes before it).
        search_on: the system every cell's searches run on (default: the cell's own); the worst
            workload found there is run on the cell's system (``tenantry replay URL --matrix
            --searched-on SETUP``).

    Returns:
        {"summary": ..., "cells": {(setup, pattern): record}, "claimed_broken": bool,
        "extras_failed": [extra names that failed: a proof did not hold, an extra raised],
        "unmet": [(setup, pattern), ...] (expected to hurt, did not), ...}

    Raises:
        ConfigError: on an unknown setup, pattern or search name, or an ``out`` it may not replace.
        Interrupted: on Ctrl-C (or SIGTERM through the CLI): worker processes killed, ``out``
            as it was; the finished cells kept in the staging folder for ``resume`` (none: removed).
        WriteError: a file could not be written (a full disk): naming it and what was kept.
    """
    from .evaluate import executor_slots, make_executor, same_tasks_once, terminate_executor
    from .search import private_hypothesis_home

    systems = list(setups or SETUPS)
    for s in systems:
        if isinstance(s, str):
            get_setup(s)
    setups = [label(s) for s in systems]
    by_label = dict(zip(setups, systems))
    explicit_patterns = bool(patterns)
    keys = matrix_cells(setups, patterns or None)
    patterns = [p for p in (patterns or PATTERNS) if any(k[1] == p for k in keys)]  # the matrix's columns
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
    kept: dict[tuple[str, str], dict[str, Any]] = {}  # a resumed run's finished cells
    index = {k: i for i, k in enumerate(keys)}
    rel = lambda k: Path("cells") / folder_name(k[0]) / k[1]  # noqa: E731
    if outp is not None:  # refused here, before any work, when it may not be replaced
        fp = fingerprint(kind, systems, explicit_patterns and list(patterns), keys, seed=seed, budget=budget,
                          total_budget=total_budget, searches=searches, shrink=shrink_evaluations, plots=plots,
                          extras=extras, victims=victims, spread_seeds=spread_seeds, depth=replay_depth)
        if search_on is not None:
            fp["searched on"] = label(search_on)
        outp = stage.enter_context(report_folder(outp, kind, default=out_is_default, size=len(keys), fingerprint=fp,
                                                 resume=resume))
        if resume:
            kept = load_cells(outp, keys)
            with shielded():
                prune(outp, {index[k]: rel(k) for k in kept})
    elif resume:
        raise ConfigError("--resume", None, "needs the report folder (--out) of the run to finish")
    if announce is not None:
        announce(len(kept))
    with stage, private_hypothesis_home(), same_tasks_once():
        own = executor is None
        ex: cf.Executor | None = executor
        # two cells per worker: while one cell replays, writes or solves in this process, the other keeps
        # the worker busy (one per worker left a fifth of the CPU idle); inline (1 worker), one
        n_workers = max(1, workers if workers is not None else (os.cpu_count() or 1))
        n_threads = [cell_threads or (2 * n_workers if n_workers > 1 else 1)]
        # a resumed run continues the interrupted run's clock from when its last kept cell ended
        t0 = time.monotonic() - max((c["done_s"] for c in kept.values()), default=0.0)
        deadline = t0 + total_budget.seconds if total_budget is not None and total_budget.seconds else None
        cells: dict[tuple[str, str], dict[str, Any]] = {k: c["record"] for k, c in kept.items()}
        gate = _Gate()
        started = [len(kept)]
        start_lock = threading.Lock()
        bar = None  # made once the executor is up (an unreachable cluster is one line, no bar)

        # cell-thread seconds and evaluations of the cells done (the kept ones' too: --total-budget's pacing)
        spent = {"seconds": sum(c["cell_s"] for c in kept.values()),
                 "evaluations": sum(c["record"]["evaluations"] + 1 for c in kept.values())}

        def one(key: tuple[str, str]) -> dict[str, Any]:
            with start_lock:
                left = len(keys) - started[0]
                started[0] += 1
                per_eval = spent["seconds"] / spent["evaluations"] if spent["evaluations"] else None
            now = time.monotonic()
            b, shrink_n = cell_budget(budget, total_budget, cells_left=left, n_cells=len(keys), threads=n_threads[0],
                                      seconds_left=None if deadline is None else deadline - now,
                                      seconds_per_evaluation=per_eval, shrink_evaluations=shrink_evaluations)
            s, p = key
            rec = run_cell(by_label[s], p, seed=seed, budget=b, executor=ex, out=outp, searches=searches,
                           shrink_evaluations=shrink_n, plots=plots == "all", progress=False, victims=victims,
                           replay_root=root, spread_seeds=spread_seeds, gate=gate, depth=replay_depth,
                           search_on=search_on)
            cell_s = time.monotonic() - now
            with start_lock:
                spent["seconds"] += cell_s
                spent["evaluations"] += rec["evaluations"] + 1  # + the replay of the worst workload
            if outp is not None:  # the cell is finished once its record is written, after all its files
                with gate.open():
                    rec = save_cell(outp, index[key], key, rec, done_s=round(time.monotonic() - t0, 1),
                                    cell_s=cell_s)
            return rec

        # "setup/pattern" -> seconds from the start when the cell was done
        done_s: dict[str, float] = {f"{k[0]}/{k[1]}": c["done_s"] for k, c in kept.items()}

        plot_jobs: dict[tuple[str, str], cf.Future] = {}  # a finding cell's plots, made by the executor meanwhile

        def done(key: tuple[str, str], rec: dict[str, Any]) -> None:
            cells[key] = rec
            done_s[f"{key[0]}/{key[1]}"] = round(time.monotonic() - t0, 1)
            bar.update(1)
            if log:
                log(f"{key[0]}/{key[1]}: {rec['score']:.3g}")
            if outp is not None and plots == "findings" and rec["finding"]:
                s, p = key
                plot_jobs[key] = ex.submit(plots_of, Task(by_label[s], p, freeze(rec["params"]), seed, victims=victims), s)

        try:
            if ex is None:
                ex = make_executor(workers, executor_kind)
            if cell_threads is None and workers is None and executor_slots(ex):  # a cluster: two cells per CPU
                n_threads[0] = max(n_threads[0], 2 * executor_slots(ex))
            bar = tqdm(total=len(keys), initial=len(kept), desc=f"tenantry {kind}", unit="cell", disable=not progress,
                       dynamic_ncols=True)
            for k in keys:  # the plots of a resumed run's kept finding cells, as if they had just ended
                if k in kept and outp is not None and plots == "findings" and cells[k]["finding"]:
                    plot_jobs[k] = ex.submit(plots_of, Task(by_label[k[0]], k[1], freeze(cells[k]["params"]), seed,
                                                            victims=victims), k[0])
            try:
                _cells_in_threads([k for k in keys if k not in kept], one, n_threads[0], done)
            finally:
                bar.close()
            plotted: dict[tuple[str, str], list[str]] = {}
            note = (lambda m: print(f"tenantry {kind}: {m}", file=sys.stderr, flush=True)) if progress else None
            if plot_jobs and note:
                note(f"plotting the {len(plot_jobs)} cells where the victims were hurt...")
            for (s, p) in sorted(plot_jobs):
                plotted[(s, p)] = write_plots(plot_jobs[(s, p)].result(), outp / "cells" / folder_name(s) / p)
            if plots == "all":
                plotted = {k: c.get("plots", []) for k, c in cells.items()}
            skip_extras = deadline is not None and time.monotonic() >= deadline
            extra, stateful_broke, extras_failed, extra_s = (_extras(outp, systems, note=note, shown=root)
                                                             if extras and not skip_extras else ({}, False, [], {}))
            if extras and skip_extras:
                extra = {"proofs": "skipped: the total budget was spent", "stateful": "skipped: the total budget was spent"}
        except BaseException as e:
            with shielded():
                gate.close()  # no cell thread writes into the staging folder from here on
                if own and ex is not None:
                    terminate_executor(ex)
            if isinstance(e, KeyboardInterrupt):
                raise Interrupted(f"after {len(cells)} of {len(keys)} cells ({time.monotonic() - t0:.0f} s)") from None
            raise
        if own:
            ex.shutdown()
        if outp is not None and root is not None:  # replay commands as run from the report folder
            extra = {k: text_in_report(v.replace(str(outp), str(root)), root) for k, v in extra.items()}
        wall_s = time.monotonic() - t0
        evaluations = sum(c["evaluations"] for c in cells.values()) + len(cells)
        unmet = [k for k in keys if cells[k]["expected_hurt"] and not cells[k]["finding"]]
        unstable = [k for k in keys if cells[k]["verdict"] == "seed-dependent"]
        cells = {k: cells[k] for k in keys if k in cells}  # the matrix's order, not the order cells ended in
        summary = {
            "seed": seed, "budget": budget.describe(),
            "total_budget": None if total_budget is None else total_budget.describe(),
            "spread_seeds": [seed + k for k in range(spread_seeds + 1)], "spread_band": SPREAD_BAND,
            "setups": setups, "patterns": patterns, "searches": list(searches), "victims": victims,
            **({"fleet_patterns": list(FLEET_PATTERNS)} if not explicit_patterns and any(
                _fleet_of(s) for s in systems) else {}),
            "describe": {label(s): s.describe() for s in systems if hasattr(s, "describe")},
            "extras": extra, "extras_failed": extras_failed,
            "expected": sum(1 for k in keys if cells[k]["expected_hurt"]),
            "unmet": [list(k) for k in unmet], "seed_dependent": [list(k) for k in unstable],
        }
        claimed_broken = any(c["findings"] for c in cells.values()) or stateful_broke
        if outp is not None:
            dump_json({"summary": summary, "cells": list(cells.values()), "claimed_broken": claimed_broken},
                      outp / "matrix.json")
            from tenantry.runner.files import atomic_write_text
            atomic_write_text(outp / "matrix.md", matrix_md(setups, patterns, cells))
            write_report(outp, summary, cells, plotted, title=f"tenantry {kind}" + (
                f" --target {setups[0]}" if kind == "verify" else ""))
            dump_json({"wall_s": round(wall_s, 1), "evaluations": evaluations,
                       "evaluations_per_s": round(evaluations / wall_s, 2) if wall_s > 0 else None,
                       "workers": workers or os.cpu_count(), "extras_s": extra_s, "cells_done_s": done_s},
                      outp / "timing.json")
    return {"summary": summary, "cells": cells, "claimed_broken": claimed_broken,
            "extras_failed": extras_failed, "wall_s": wall_s,
            "evaluations": evaluations, "extras_s": extra_s, "unmet": unmet, "seed_dependent": unstable}
