#!/usr/bin/env python3
"""The planted-fault table: ``tenantry verify --target`` with its defaults on every
fault, clean scheduler and gap case of ``examples/faults`` (run on demand, not a test).

For each entry it runs, from ``examples/``::

    tenantry verify --target <faults.module:make_scheduler> --out <OUT>/<name>

(no flag but ``--out``), reads the report (``matrix.json``) and gives one row:

* caught by: every invariant found, with the cells it was found in and the
  findings it stands for (the stateful extra counts as one cell);
* first finding: seconds from the start of the run to the end of the first cell
  that found the expected invariant (``timing.json``'s ``cells_done_s``; a cell
  reports its findings when it ends), or to the end of the run when only the
  stateful extra (which runs after every cell) found it; run: the wall time of
  the whole verification;
* witness: a stored workload that shows the expected invariant: the stateful
  extra's workload (shrunk by tenantry for that invariant) when it shows it
  again with the workload's own tenants, else tenantry's own witness of a cell
  (``finding-<ID>.jsonl``: the workload it broke on, shrunk by tenantry on that
  invariant), the smallest that shows it; for reports older than those
  witnesses, a cell's workload or the pattern's default scenario (candidate 0
  of the random and evolution searches) shrunk here with tenantry's shrinker
  (``tenantry.verify.suite.shrink_finding``); otherwise none;
* replay OK: ``tenantry verify --target T --workload <witness> --horizon-s 16``
  (the cells' replay command on the shrunk workload) reports the expected
  invariant again (it re-runs the workload in a fresh process with another
  ``PYTHONHASHSEED`` too); for DETERMINISM the witness is also judged as the
  matrix judges it
  (:meth:`tenantry.verify.system.TargetSystem.checked`: a fresh process with
  another ``PYTHONHASHSEED``); this script re-executes itself with
  ``PYTHONHASHSEED=2`` so that this check is the same on every run, while the
  verifications themselves run with the caller's environment, hash seed unset.

Writes ``<OUT>/table.md`` and ``<OUT>/table.json``; ``--write-witnesses`` also
copies the witnesses to ``examples/faults/witness/<name>.jsonl`` (or
``<name>.<INVARIANT>.jsonl`` for a fault expected to break several), listed in
its ``index.json`` with what ``tests/test_faults.py`` asserts of them: every
invariant found on the witness and the steps of the expected one's findings
(a witness written by hand is never replaced; ``--refresh-index`` re-judges
every stored witness without verifying anything).  ``--out`` must be
new, empty, or a folder this script made (its marker ``.faults-table`` lists what
it wrote); nothing it did not create is overwritten.  One run at a time: each
verification already uses every core.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
WITNESS = EXAMPLES / "faults" / "witness"
MARKER = ".faults-table"
#: Horizon of the adversary scenarios (the cells' replay commands use it).
HORIZON_S = 16.0
#: Evaluations the shrinker may spend on one witness.
SHRINK_EVALUATIONS = 80
#: PYTHONHASHSEED of this script's own checks (it re-executes itself with it), so that tenantry's
#: fresh-process re-run (seed 1 against a process of seed 2) judges DETERMINISM the same way every time.
HASH_SEED = "2"


def entries(only: list[str] | None) -> list[dict]:
    """Every registry entry (faults, clean, gaps) as dicts, in registry order, or those of ``only`` in its order."""
    sys.path.insert(0, str(EXAMPLES))
    from faults import CLEAN, FAULTS, GAPS, PENDING

    out = [dict(name=n, target=f.target, expected=list(f.expected), kind=f.kind, group="fault",
                pending=PENDING.get(n, "")) for n, f in FAULTS.items()]
    out += [dict(name=n, target=t, expected=[], kind="clean", group="clean", pending="") for n, t in CLEAN.items()]
    for n, (t, why) in GAPS.items():
        exp = ["TOKEN-BUCKET"] if "TOKEN-BUCKET" in why else ["SALT-ISOLATION"] if "SALT-ISOLATION" in why else []
        out.append(dict(name=n, target=t, expected=exp, kind="gap", group="gap", pending=why))
    if only:
        unknown = sorted(set(only) - {e["name"] for e in out})
        if unknown:
            raise SystemExit(f"faults_table: unknown name {unknown[0]!r}")
        out = sorted((e for e in out if e["name"] in only), key=lambda e: only.index(e["name"]))
    return out


# --- the output folder ------------------------------------------------------------------


def claim_out(out: Path) -> set[str]:
    """Take ``out`` (new, empty, or ours) and return what our marker lists; refuse anything else."""
    if out.is_symlink() or out.is_file():
        raise SystemExit(f"faults_table: --out {out} is a file or a link; give a folder")
    if out.exists():
        marker = out / MARKER
        names = {p.name for p in out.iterdir()}
        if names and not marker.exists():
            raise SystemExit(f"faults_table: --out {out} holds files this script did not write; give a new folder")
        if marker.exists():
            made = set(json.loads(marker.read_text())["made"])
            foreign = sorted(names - made - {MARKER} - {n for n in names if n.startswith(".")})
            if foreign:
                raise SystemExit(f"faults_table: --out {out} holds {foreign[0]!r}, which this script did not write")
            return made
    out.mkdir(parents=True, exist_ok=True)
    return set()


def remember(out: Path, made: set[str], *names: str) -> None:
    made.update(names)
    (out / MARKER).write_text(json.dumps({"tool": "scripts/faults_table.py", "made": sorted(made)}, indent=1))


# --- one entry ------------------------------------------------------------------------------


def run_verify(target: str, folder: Path, log: Path, extra: list[str] = ()) -> tuple[int, float]:
    """``tenantry verify --target target --out folder [extra]`` from examples/; (exit status, wall s)."""
    cmd = [sys.executable, "-m", "tenantry.cli", "verify", "--target", target, *extra, "--out", str(folder)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # as a user runs it: a random hash seed
    t0 = time.monotonic()
    with open(log, "w") as fh:
        p = subprocess.run(cmd, cwd=EXAMPLES, stdout=fh, stderr=subprocess.STDOUT, env=env)
    return p.returncode, time.monotonic() - t0


STATEFUL = re.compile(r"breaks (\S+) \(shrunk from (\d+) to (\d+) requests\); replay: .* --workload (\S+)")


def read_report(folder: Path) -> dict:
    """Findings of a default verification: {invariant: [cells, findings]}, witnesses by invariant, notes."""
    m = json.loads((folder / "matrix.json").read_text())
    timing = json.loads((folder / "timing.json").read_text())
    done_s = timing.get("cells_done_s", {})
    first_s: dict[str, float] = {}   # invariant -> seconds from the start to the end of the first cell showing it
    found: dict[str, list[int]] = {}
    direct: dict[str, list[Path]] = {}   # invariant -> cell workloads whose replay showed it
    candidate_only: dict[str, list[tuple[str, str, int]]] = {}   # invariant -> (pattern, search, candidate)
    for c in m["cells"]:
        seen = set()
        for f in c["findings"]:
            inv = f["invariant"]
            if inv not in seen:
                found.setdefault(inv, [0, 0])[0] += 1
                seen.add(inv)
            found[inv][1] += f.get("count", 1)
            t = done_s.get(f"{c['setup']}/{c['pattern']}")
            if t is not None:
                first_s[inv] = min(first_s.get(inv, t), t)
            if "search" in f:
                candidate_only.setdefault(inv, []).append((c["pattern"], f["search"], f["candidate"]))
            else:
                direct.setdefault(inv, []).append(folder / c["workload"])
    stateful = None
    text = m["summary"].get("extras", {}).get("stateful", "")
    hit = STATEFUL.search(text)
    if hit:
        inv = hit.group(1)
        found.setdefault(inv, [0, 0])
        found[inv][0] += 1
        found[inv][1] += 1
        first_s.setdefault(inv, timing["wall_s"])  # the stateful extra runs after every cell
        stateful = (inv, int(hit.group(2)), int(hit.group(3)), Path(hit.group(4)))
    # tenantry's own witnesses: each broken invariant's workload, shrunk on it (finding-<ID>.jsonl)
    witnesses = {inv: sorted(folder.glob(f"cells/*/*/finding-{inv}.jsonl"), key=lambda p: sum(1 for _ in open(p)))
                 for inv in found}
    return {"found": found, "direct": direct, "candidate_only": candidate_only, "stateful": stateful,
            "witnesses": witnesses,
            "stateful_text": text, "first_s": first_s, "wall_s": timing["wall_s"]}


def checked(target: str, workload, expected: list[str], timeout_s: float, horizon_s: float = HORIZON_S,
            weighted: bool = False):
    """The matrix's own check of ``workload`` on ``target`` (:meth:`TargetSystem.checked`: step mode,
    the catalog, and at depth ``full``, when DETERMINISM is expected, tenantry's fresh-process re-run),
    every tenant a victim, in the workload's order (``weighted``: with the stateful extra's weights):
    what ``verify --target T --workload W [--weighted]`` runs."""
    from tenantry.verify.system import TargetSystem

    depth = "full" if "DETERMINISM" in expected else "state"
    return TargetSystem(target, timeout_s=timeout_s, path=str(EXAMPLES), weighted=weighted).checked(
        workload, horizon_s, depth, [(n, "victim") for n in tenant_order(workload, weighted)])


def tenant_order(workload, weighted: bool) -> list[str]:
    """The tenants of a witness in the order its replay gives them: a weighted one comes from the
    stateful extra, whose tenants (and so weights) are in ``STATEFUL_TENANTS`` order (its replay's
    ``--victims``); any other in the workload's order of first arrival."""
    from tenantry.verify.suite import STATEFUL_TENANTS

    first = list(STATEFUL_TENANTS) if weighted else []
    return first + [t for t in workload.tenants if t not in first]


def invariants_on(target: str, workload, expected: list[str], timeout_s: float, weighted: bool = False) -> set[str]:
    """Invariant ids :func:`checked` finds on ``workload``."""
    return {f.invariant for f in checked(target, workload, expected, timeout_s, weighted=weighted).findings}


def pick_witness(e: dict, rep: dict, inv: str, timeout_s: float) -> tuple[object | None, str, bool]:
    """(a small workload showing ``inv``, where it came from, whether it runs with the stateful
    extra's weights) or (None, why there is none, False)."""
    from tenantry.runner.traces import read_workload_jsonl
    from tenantry.verify.suite import shrink_finding

    want = e["expected"]
    st = rep["stateful"]
    if st is not None and st[0] == inv and st[3].exists():
        wl = read_workload_jsonl(st[3])
        # its replay command names the workload only: the stateful run's tenants (t0, t1, t2) become the
        # workload's own, in the order they appear, and a finding that follows the tenant order is lost
        if inv in invariants_on(e["target"], wl, want, timeout_s, weighted=True):  # the extra's weights
            return wl, f"stateful extra, shrunk by tenantry from {st[1]} to {st[2]} requests", True
    for path in rep.get("witnesses", {}).get(inv, []):  # tenantry already shrank it on this invariant
        wl = read_workload_jsonl(path)
        if inv in invariants_on(e["target"], wl, want, timeout_s):
            return wl, f"tenantry's witness of cell {path.parent.name} ({len(wl)} requests)", False

    def shrunk(wl):  # reports older than tenantry's per-invariant witnesses
        return shrink_finding(lambda w: checked(e["target"], w, want, timeout_s), inv, wl,
                              max_evaluations=SHRINK_EVALUATIONS)

    cells = rep["direct"].get(inv, [])
    for path in sorted(cells, key=lambda p: sum(1 for _ in open(p))):
        wl = read_workload_jsonl(path)
        if inv not in invariants_on(e["target"], wl, want, timeout_s):
            continue
        return shrunk(wl), (f"cell {path.parent.name} ({len(wl)} requests), shrunk by this script with tenantry's "
                            f"shrinker ({SHRINK_EVALUATIONS} evaluations at most)"), False
    for pattern, search, index in rep["candidate_only"].get(inv, []):
        if index != 0 or search not in ("random", "evolution"):
            continue
        wl = default_scenario(e["target"], pattern)  # candidate 0 of these searches is the pattern's defaults
        if inv not in invariants_on(e["target"], wl, want, timeout_s):
            continue
        return shrunk(wl), (f"{pattern} at its defaults ({search} candidate 0, {len(wl)} requests), regenerated and "
                            f"shrunk by this script with tenantry's shrinker ({SHRINK_EVALUATIONS} evaluations at most)"), False
    if inv in rep["candidate_only"]:
        where = ", ".join(f"{p}: {s} candidate {i}" for p, s, i in rep["candidate_only"][inv][:3])
        return None, f"only in search candidates ({where}); the report keeps no such workload", False
    return None, "not found", False


def default_scenario(target: str, pattern: str):
    """The workload of ``pattern`` at its default parameters and seed 0 against ``target``,
    as the searches generate it (a pattern that reads limits gets the target's)."""
    from tenantry.adversaries.patterns import ADVERSARY, get_pattern, limits_of, make_scenario
    from tenantry.adversaries.victims import DEFAULT_VICTIMS
    from tenantry.verify.system import TargetSystem

    limits = None
    if get_pattern(pattern).uses_limits:
        roles = ((ADVERSARY, "adversary"),) + tuple((v.name, "victim") for v in DEFAULT_VICTIMS)
        limits = limits_of(TargetSystem(target, path=str(EXAMPLES)).config(roles), ADVERSARY)
    return make_scenario(pattern, None, 0, limits=limits).workload


def replay(e: dict, inv: str, witness_path: Path, folder: Path, log: Path, weighted: bool = False) -> tuple[bool, str]:
    """Re-run the witness with the cells' replay command; (``inv`` reported again, detail)."""
    from tenantry.runner.traces import read_workload_jsonl

    order = tenant_order(read_workload_jsonl(witness_path), weighted)
    code, _ = run_verify(e["target"], folder, log, ["--workload", str(witness_path), "--horizon-s", str(HORIZON_S)]
                         + (["--victims", ",".join(order), "--weighted"] if weighted else []))
    rep = json.loads((folder / "report.json").read_text()) if (folder / "report.json").exists() else {}
    got = set(rep.get("findings_by_invariant", {}))
    if inv in got:
        return True, f"exit {code}, {', '.join(sorted(got))}"
    if inv == "DETERMINISM":  # the --workload replay compares two runs in one process: same hash seed
        from tenantry.runner.traces import read_workload_jsonl
        from tenantry.verify.system import RERUN_HASH_SEEDS

        fresh = "DETERMINISM" in invariants_on(e["target"], read_workload_jsonl(witness_path), [inv], 10.0)
        return fresh, (f"the --workload replay compares two runs in one process ({', '.join(sorted(got)) or 'no finding'}); "
                       f"tenantry's fresh-process re-run (PYTHONHASHSEED {HASH_SEED} here, "
                       f"{RERUN_HASH_SEEDS[0]} there) {'differs' if fresh else 'agrees'}")
    return False, f"exit {code}, {', '.join(sorted(got)) or 'no finding'}"


# --- the table ----------------------------------------------------------------------------------


def fmt_found(found: dict[str, list[int]]) -> str:
    return "; ".join(f"{inv} ({c} cells, {n} findings)" for inv, (c, n) in sorted(found.items())) or "none"


def verdict(e: dict, found: dict) -> str:
    if e["group"] == "clean":
        return "clean" if not found else "FALSE POSITIVE"
    if e["group"] == "gap":
        return "gap: caught" if set(e["expected"]) <= set(found) else "gap: not caught"
    return "caught" if set(e["expected"]) <= set(found) else "MISSED"


def write_tables(out: Path, rows: list[dict], total_s: float) -> None:
    (out / "table.json").write_text(json.dumps({"rows": rows, "total_s": round(total_s, 1)}, indent=1))
    md = ["| fault | kind | expected | caught by (cells, findings) | verdict | first finding s | run s | shrunk | "
          "replay OK |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['name']} | {r['kind']} | {', '.join(r['expected']) or '-'} | {r['caught_by']} | "
                  f"{r['verdict']} | {r['first_s'] or '-'} | {r['wall_s']:.0f} | "
                  f"{r['shrunk'] if r['shrunk'] is not None else '-'} | "
                  f"{r['replay_ok'] if r['replay_ok'] is not None else '-'} |")
    md += ["", f"Total: {total_s:.0f} s for {len(rows)} entries.", "", "Witnesses:", ""]
    for r in rows:
        for w in r.get("witnesses", []):
            md.append(f"- {r['name']} {w['invariant']}: {w['source']}; replay: {w['replay'] or '-'}")
    notes = [r for r in rows if r["note"]]
    if notes:
        md += ["", "Notes:", ""] + [f"- **{r['name']}**: {r['note']}" for r in notes]
    (out / "table.md").write_text("\n".join(md) + "\n")


def witness_file(name: str, inv: str, expected: list[str]) -> str:
    """``<name>.jsonl``, or ``<name>.<INVARIANT>.jsonl`` for a fault expected to break several."""
    return f"{name}.jsonl" if len(expected) == 1 else f"{name}.{inv}.jsonl"


def judged(target: str, inv: str, path: Path, horizon_s: float, weighted: bool = False) -> dict:
    """What ``tests/test_faults.py`` asserts of a stored witness: every invariant :func:`checked` finds on
    it (``raises``) and the steps of the findings of ``inv``, in order (``steps``; None: a whole-run one)."""
    from tenantry.runner.traces import read_workload_jsonl

    found = checked(target, read_workload_jsonl(path), [inv], 10.0 if inv != "ADAPTER-HANG" else 1.0, horizon_s,
                    weighted).findings
    return {"raises": sorted({f.invariant for f in found}), "steps": [f.step for f in found if f.invariant == inv]}


def update_witness_index(name: str, inv: str, src_path: Path, source: str, expected: list[str],
                         weighted: bool = False) -> str:
    """Copy a witness into examples/faults/witness (never over a hand-written one); what happened."""
    WITNESS.mkdir(exist_ok=True)
    index_path = WITNESS / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    fname = witness_file(name, inv, expected)
    old = index.get(fname)
    if old is not None and not old.get("source", "").startswith("faults_table.py"):
        return f"kept the hand-written witness/{fname}"
    shutil.copyfile(src_path, WITNESS / fname)
    index[fname] = {"fault": name, "invariant": inv, "horizon_s": HORIZON_S, "source": f"faults_table.py: {source}",
                    **({"weighted": True} if weighted else {}),
                    **judged(f"faults.{name}:make_scheduler", inv, WITNESS / fname, HORIZON_S, weighted)}
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=1, sort_keys=True) + "\n")
    return f"wrote witness/{fname}"


def refresh_index() -> int:
    """Re-judge every stored witness and rewrite ``raises`` and ``steps`` in its index (no verification)."""
    index_path = WITNESS / "index.json"
    index = json.loads(index_path.read_text())
    for fname, meta in sorted(index.items()):
        meta.update(judged(f"faults.{meta['fault']}:make_scheduler", meta["invariant"], WITNESS / fname,
                           meta["horizon_s"], meta.get("weighted", False)))
        print(f"{fname}: {', '.join(meta['raises']) or 'nothing'}; {meta['invariant']} at steps {meta['steps']}",
              flush=True)
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=1, sort_keys=True) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the table; returns 1 when a fault is missed or a clean scheduler has a finding."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for the reports and the table (new, empty or made by this script)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these registry names, in this order")
    ap.add_argument("--write-witnesses", action="store_true", help="copy the witnesses to examples/faults/witness/")
    ap.add_argument("--refresh-index", action="store_true",
                    help="only re-judge the stored witnesses and rewrite what their index records (no verification)")
    ap.add_argument("--shrink-timeout-s", type=float, default=2.0,
                    help="per-call timeout while shrinking (a hang costs this much per evaluation; default 2)")
    args = ap.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:  # see HASH_SEED
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv)],
                  {**os.environ, "PYTHONHASHSEED": HASH_SEED})
    if args.refresh_index:
        sys.path.insert(0, str(EXAMPLES))
        return refresh_index()
    if not args.out:
        ap.error("--out is required (unless --refresh-index)")
    out = Path(args.out).resolve()
    todo = entries(args.only)
    made = claim_out(out)
    from tenantry.runner.traces import write_workload_jsonl

    rows, t_all = [], time.monotonic()
    for i, e in enumerate(todo, 1):
        name = e["name"]
        print(f"[{i}/{len(todo)}] {name}: tenantry verify --target {e['target']} --out {out / name}", flush=True)
        remember(out, made, name, f"{name}.log")
        code, wall = run_verify(e["target"], out / name, out / f"{name}.log")
        row = dict(name=name, kind=e["kind"], expected=e["expected"], group=e["group"], wall_s=round(wall, 1),
                   exit=code, first_s="", shrunk=None, replay_ok=None, witness_source="", note=e["pending"])
        if not (out / name / "matrix.json").exists():
            row.update(caught_by="(no report)", verdict="ERROR", found={})
            rows.append(row)
            print(f"    no report (exit {code}); see {out / f'{name}.log'}", flush=True)
            continue
        rep = read_report(out / name)
        row.update(found=rep["found"], caught_by=fmt_found(rep["found"]), verdict=verdict(e, rep["found"]),
                   first_s=", ".join(f"{rep['first_s'][i]:.0f}" for i in e["expected"] if i in rep["first_s"]))
        print(f"    {wall:.0f} s, exit {code}: {row['caught_by']} -> {row['verdict']}", flush=True)
        witnesses = []
        for inv in [i for i in e["expected"] if i in rep["found"]] if e["group"] != "clean" else []:
            wl, source, weighted = pick_witness(e, rep, inv, args.shrink_timeout_s)
            w = dict(invariant=inv, source=source, shrunk=None, replay_ok=None, replay="")
            witnesses.append(w)
            if wl is None:
                print(f"    {inv}: no witness: {source}", flush=True)
                continue
            wpath = out / witness_file(name, inv, e["expected"]).replace(".jsonl", ".witness.jsonl")
            write_workload_jsonl(wl, wpath)
            rdir = wpath.name.replace(".witness.jsonl", "-replay")
            remember(out, made, wpath.name, rdir, f"{rdir}.log")
            ok, detail = replay(e, inv, wpath, out / rdir, out / f"{rdir}.log", weighted)
            w.update(shrunk=len(wl), replay_ok="yes" if ok else "NO", replay=detail)
            print(f"    {inv}: witness of {len(wl)} requests ({source}); replay {'ok' if ok else 'FAILED'}: {detail}",
                  flush=True)
            if args.write_witnesses and e["group"] == "fault":
                print(f"    {update_witness_index(name, inv, wpath, source, e['expected'], weighted)}", flush=True)
        row["witnesses"] = witnesses
        if witnesses:
            row["shrunk"] = ", ".join(str(w["shrunk"]) if w["shrunk"] is not None else "-" for w in witnesses)
            row["replay_ok"] = ", ".join(w["replay_ok"] or "-" for w in witnesses)
            row["witness_source"] = "; ".join(w["source"] for w in witnesses)
        rows.append(row)
        remember(out, made, "table.md", "table.json")
        write_tables(out, rows, time.monotonic() - t_all)
    total = time.monotonic() - t_all
    write_tables(out, rows, total)
    print((out / "table.md").read_text())
    bad = [r["name"] for r in rows if r["verdict"] in ("MISSED", "FALSE POSITIVE", "ERROR") and not r["note"]]
    print(f"total {total:.0f} s; table: {out / 'table.md'}" + (f"; unexpected: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
