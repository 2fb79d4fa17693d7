#!/usr/bin/env python3
"""The planted-fault table: ``tenantry verify --target`` with its defaults on every
fault, clean scheduler and gap case of ``examples/faults`` (run on demand, not a test).

For each entry it runs, from ``examples/``::

    tenantry verify --target <faults.module:make_scheduler> --out <OUT>/<name>

(no flag but ``--out``), reads the report (``matrix.json``) and gives one row:

* caught by: every invariant found, with the cells it was found in and the
  findings it stands for (the stateful extra counts as one cell);
* time: the wall time of the whole run: the report records no time to the first
  finding, so this is an upper bound on it;
* witness: a stored workload that shows the expected invariant: the stateful
  extra's workload (shrunk by tenantry for that invariant), or a cell's workload
  whose own replay showed it, shrunk here with tenantry's shrinker
  (``tenantry.verify.suite.shrink_finding``) because tenantry shrinks a cell only
  for its objective; none when the invariant was seen only in a search candidate,
  whose workload the report does not keep;
* replay OK: ``tenantry verify --target T --workload <witness> --horizon-s 16``
  (the cells' replay command on the shrunk workload) reports the expected
  invariant again; DETERMINISM is also re-checked in two fresh processes
  (PYTHONHASHSEED 1 and 2), since a ``--workload`` replay re-runs in one process.

Writes ``<OUT>/table.md`` and ``<OUT>/table.json``; ``--write-witnesses`` also
copies the witnesses to ``examples/faults/witness/<name>.jsonl`` (listed in its
``index.json``; a witness written by hand is never replaced).  ``--out`` must be
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
import tempfile
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


def entries(only: list[str] | None) -> list[dict]:
    """Every registry entry (faults, clean, gaps) as dicts, in registry order, filtered by ``only``."""
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
        out = [e for e in out if e["name"] in only]
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
    t0 = time.monotonic()
    with open(log, "w") as fh:
        p = subprocess.run(cmd, cwd=EXAMPLES, stdout=fh, stderr=subprocess.STDOUT)
    return p.returncode, time.monotonic() - t0


STATEFUL = re.compile(r"breaks (\S+) \(shrunk from (\d+) to (\d+) requests\); replay: .* --workload (\S+)")


def read_report(folder: Path) -> dict:
    """Findings of a default verification: {invariant: [cells, findings]}, witnesses by invariant, notes."""
    m = json.loads((folder / "matrix.json").read_text())
    found: dict[str, list[int]] = {}
    direct: dict[str, list[Path]] = {}   # invariant -> cell workloads whose replay showed it
    candidate_only: dict[str, str] = {}
    for c in m["cells"]:
        seen = set()
        for f in c["findings"]:
            inv = f["invariant"]
            if inv not in seen:
                found.setdefault(inv, [0, 0])[0] += 1
                seen.add(inv)
            found[inv][1] += f.get("count", 1)
            if "search" in f:
                candidate_only.setdefault(inv, f"{c['pattern']}: {f['search']} candidate {f['candidate']}")
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
        stateful = (inv, int(hit.group(2)), int(hit.group(3)), Path(hit.group(4)))
    return {"found": found, "direct": direct, "candidate_only": candidate_only, "stateful": stateful,
            "stateful_text": text}


def invariants_on(target: str, workload, expected: list[str], timeout_s: float) -> set[str]:
    """Invariants the default checks find on ``workload`` (in this process; DETERMINISM in two fresh ones)."""
    from tenantry.verify.protocol import load_factory
    from tenantry.verify.run import bind, scenario_tenants, verify_workload

    roles = [(n, "victim") for n in workload.tenants]
    fac = bind(load_factory(target, path=str(EXAMPLES)), scenario_tenants(roles, False))
    v = verify_workload(fac, workload, horizon_s=HORIZON_S, timeout_s=timeout_s, determinism=False)
    found = set(v.invariants())
    if "DETERMINISM" in expected and fresh_processes_differ(target, workload):
        found.add("DETERMINISM")
    return found


def fresh_processes_differ(target: str, workload) -> bool:
    """The workload's history differs between two fresh processes with PYTHONHASHSEED 1 and 2."""
    from tenantry.model.traces import write_workload_jsonl

    with tempfile.TemporaryDirectory(prefix="faults-table-") as tmp:
        wl = Path(tmp) / "w.jsonl"
        write_workload_jsonl(workload, wl)
        lines = []
        for seed in ("1", "2"):
            h = Path(tmp) / f"h{seed}.jsonl"
            extra = json.dumps([HORIZON_S, False, 10.0, str(EXAMPLES), [[n, "victim"] for n in workload.tenants]])
            env = {**os.environ, "PYTHONHASHSEED": seed}
            subprocess.run([sys.executable, "-c", "from tenantry.verify.run import _rerun_main; _rerun_main()",
                            target, str(wl), str(h), extra], env=env, cwd=EXAMPLES, check=True, capture_output=True)
            lines.append(h.read_bytes())
        return lines[0] != lines[1]


def pick_witness(e: dict, rep: dict, timeout_s: float) -> tuple[object | None, str]:
    """(a small workload showing the expected invariant, where it came from) or (None, why not)."""
    from tenantry.model.traces import read_workload_jsonl
    from tenantry.verify.suite import shrink_finding

    want = e["expected"]
    if not want:
        return None, ""
    inv = want[0]
    st = rep["stateful"]
    if st is not None and st[0] == inv and st[3].exists():
        return read_workload_jsonl(st[3]), f"stateful extra, shrunk by tenantry from {st[1]} to {st[2]} requests"
    cells = rep["direct"].get(inv, [])
    for path in sorted(cells, key=lambda p: sum(1 for _ in open(p))):
        wl = read_workload_jsonl(path)
        if inv not in invariants_on(e["target"], wl, want, timeout_s):
            continue
        small = shrink_finding(lambda w: _Verdict(invariants_on(e["target"], w, want, timeout_s)), inv, wl,
                               max_evaluations=SHRINK_EVALUATIONS)
        return small, (f"cell {path.parent.name} ({len(wl)} requests), shrunk by this script with tenantry's "
                       f"shrinker ({SHRINK_EVALUATIONS} evaluations at most)")
    if inv in rep["candidate_only"]:
        return None, f"only in a search candidate ({rep['candidate_only'][inv]}); the report keeps no such workload"
    return None, "not found"


class _Verdict:
    """The shape ``shrink_finding`` reads: ``.findings`` with ``.invariant``."""

    def __init__(self, invariants: set[str]) -> None:
        self.findings = [type("F", (), {"invariant": i})() for i in invariants]


def replay(e: dict, witness_path: Path, folder: Path, log: Path) -> tuple[bool, str]:
    """Re-run the witness with the cells' replay command; (expected invariant reported, detail)."""
    code, _ = run_verify(e["target"], folder, log, ["--workload", str(witness_path), "--horizon-s", str(HORIZON_S)])
    rep = json.loads((folder / "report.json").read_text()) if (folder / "report.json").exists() else {}
    got = set(rep.get("findings_by_invariant", {}))
    inv = e["expected"][0]
    if inv in got:
        return True, f"exit {code}, {', '.join(sorted(got))}"
    if inv == "DETERMINISM":
        from tenantry.model.traces import read_workload_jsonl

        fresh = fresh_processes_differ(e["target"], read_workload_jsonl(witness_path))
        return fresh, (f"the --workload replay runs both runs in one process ({', '.join(sorted(got)) or 'no finding'}); "
                       f"two fresh processes (PYTHONHASHSEED 1, 2) {'differ' if fresh else 'agree'}")
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
    md = ["# Planted faults: `tenantry verify --target` with its defaults", "",
          "Time: wall time of the whole default run (the report records no time to the first finding). "
          "Shrunk: requests in the witness workload. Replay: the cells' replay command on the witness "
          f"(`--workload W --horizon-s {HORIZON_S:g}`) reports the expected invariant.", "",
          "| name | kind | expected | caught by | verdict | time s | shrunk | replay OK | witness |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['name']} | {r['kind']} | {', '.join(r['expected']) or '-'} | {r['caught_by']} | "
                  f"{r['verdict']} | {r['wall_s']:.0f} | {r['shrunk'] if r['shrunk'] is not None else '-'} | "
                  f"{r['replay_ok'] if r['replay_ok'] is not None else '-'} | {r['witness_source'] or '-'} |")
    md += ["", f"Total: {total_s:.0f} s for {len(rows)} entries.", ""]
    for r in rows:
        if r["note"]:
            md.append(f"- **{r['name']}**: {r['note']}")
    (out / "table.md").write_text("\n".join(md) + "\n")


def update_witness_index(name: str, src_path: Path, source: str, expected: list[str]) -> str:
    """Copy a witness into examples/faults/witness (never over a hand-written one); what happened."""
    WITNESS.mkdir(exist_ok=True)
    index_path = WITNESS / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    old = index.get(name)
    if old is not None and not old.get("source", "").startswith("faults_table.py"):
        return f"kept the hand-written witness/{name}.jsonl"
    shutil.copyfile(src_path, WITNESS / f"{name}.jsonl")
    index[name] = {"expected": expected, "horizon_s": HORIZON_S, "source": f"faults_table.py: {source}"}
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=1, sort_keys=True) + "\n")
    return f"wrote witness/{name}.jsonl"


def main(argv: list[str] | None = None) -> int:
    """Run the table; returns 1 when a fault is missed or a clean scheduler has a finding."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the reports and the table (new, empty or made by this script)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these registry names")
    ap.add_argument("--write-witnesses", action="store_true", help="copy the witnesses to examples/faults/witness/")
    ap.add_argument("--shrink-timeout-s", type=float, default=2.0,
                    help="per-call timeout while shrinking (a hang costs this much per evaluation; default 2)")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    todo = entries(args.only)
    made = claim_out(out)
    from tenantry.model.traces import write_workload_jsonl

    rows, t_all = [], time.monotonic()
    for i, e in enumerate(todo, 1):
        name = e["name"]
        print(f"[{i}/{len(todo)}] {name}: tenantry verify --target {e['target']} --out {out / name}", flush=True)
        remember(out, made, name, f"{name}.log")
        code, wall = run_verify(e["target"], out / name, out / f"{name}.log")
        row = dict(name=name, kind=e["kind"], expected=e["expected"], group=e["group"], wall_s=round(wall, 1),
                   exit=code, shrunk=None, replay_ok=None, witness_source="", note=e["pending"])
        if not (out / name / "matrix.json").exists():
            row.update(caught_by="(no report)", verdict="ERROR", found={})
            rows.append(row)
            print(f"    no report (exit {code}); see {out / f'{name}.log'}", flush=True)
            continue
        rep = read_report(out / name)
        row.update(found=rep["found"], caught_by=fmt_found(rep["found"]), verdict=verdict(e, rep["found"]))
        print(f"    {wall:.0f} s, exit {code}: {row['caught_by']} -> {row['verdict']}", flush=True)
        if e["group"] != "clean" and set(e["expected"]) <= set(rep["found"]):
            wl, source = pick_witness(e, rep, args.shrink_timeout_s)
            row["witness_source"] = source
            if wl is not None:
                wpath = out / f"{name}.witness.jsonl"
                write_workload_jsonl(wl, wpath)
                remember(out, made, wpath.name, f"{name}-replay", f"{name}-replay.log")
                row["shrunk"] = len(wl)
                ok, detail = replay(e, wpath, out / f"{name}-replay", out / f"{name}-replay.log")
                row["replay_ok"] = "yes" if ok else "NO"
                row["replay"] = detail
                print(f"    witness: {len(wl)} requests ({source}); replay {'ok' if ok else 'FAILED'}: {detail}",
                      flush=True)
                if args.write_witnesses and e["group"] == "fault":
                    print(f"    {update_witness_index(name, wpath, source, e['expected'])}", flush=True)
            else:
                print(f"    no witness: {source}", flush=True)
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
