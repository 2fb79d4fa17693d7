"""Benchmark: whole commands as a user runs them, and the same command at two commits.

Run on demand (not a test):

    python benchmarks/bench_commands.py check                    # the main job, at the defaults
    python benchmarks/bench_commands.py check --base HEAD~3      # at HEAD~3 and at the working tree, one after the other
    python benchmarks/bench_commands.py tests                    # the README's test command
    python benchmarks/bench_commands.py verify                   # verify --target on examples/tiny_fcfs.py at the defaults
    python benchmarks/bench_commands.py prove
    python benchmarks/bench_commands.py check --args "--policy vtc fcfs --budget 4" --repeats 3 --record

Each run is a fresh process of the installed ``tenantry`` (or ``python -m
pytest``) in a scratch folder; the figures are its wall time, its CPU time
(user + system of it and every process it waited for) and its peak resident
memory.  For ``check`` and ``verify`` the SHA-256 of the report's
``matrix.json`` is compared between runs and commits: the same seed must give
the same bytes.

With ``--base REV`` the same command also runs at commit REV, from a git
worktree of it with a venv of its own (made once under ``--cache``, default
``~/.cache/tenantry-bench``), alternating the two so that a machine whose load
changes slows both alike; the ratio is new over base (below 1: faster).

``--record`` writes ``benchmarks/results/commands-<job>.json`` for the
measurements page (``python benchmarks/measurements.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from record import machine, save  # noqa: E402

JOBS = {
    "check": ["{tenantry}", "check", "--out", "{out}"],
    "verify": ["{tenantry}", "verify", "--target", "tiny_fcfs:make_adapter", "--target-path", "{repo}/examples",
               "--out", "{out}"],
    "prove": ["{tenantry}", "prove"],
    "tests": ["{python}", "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider"],
}


def _venv_for(rev: str, cache: Path) -> tuple[Path, Path]:
    """(worktree, venv) of commit ``rev``, made on first use (git worktree + pip install -e .[test])."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    tree, venv = cache / sha[:12], cache / f"{sha[:12]}-venv"
    if not tree.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=REPO, check=True,
                       capture_output=True)
    if not (venv / "bin" / "tenantry").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", f"{tree}[test]"], check=True)
    return tree, venv


def run_once(job: str, extra: list[str], tree: Path, venv: Path | None) -> dict:
    """One run of ``job`` from ``tree`` with ``venv``'s tenantry (this interpreter's when None)."""
    bindir = (venv / "bin") if venv else Path(sys.executable).parent
    scratch = Path(tempfile.mkdtemp(prefix="bench-"))
    out = scratch / "report"
    argv = [a.format(tenantry=bindir / "tenantry", python=bindir / "python", out=out, repo=tree)
            for a in JOBS[job]] + extra
    cwd = tree if job == "tests" else scratch
    usage = scratch / "usage.json"
    # a wrapper process per run, so that CPU and peak memory are this run's alone (its children's rusage)
    wrapper = ("import json, resource, subprocess, sys; p = subprocess.run(sys.argv[2:]); "
               "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
               "open(sys.argv[1], 'w').write(json.dumps([u.ru_utime + u.ru_stime, u.ru_maxrss])); "
               "sys.exit(p.returncode)")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", wrapper, str(usage)] + [str(x) for x in argv], cwd=cwd,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    cpu, rss_kb = json.loads(usage.read_text()) if usage.exists() else (float("nan"), 0)
    matrix = out / "matrix.json"
    digest = hashlib.sha256(matrix.read_bytes()).hexdigest()[:16] if matrix.exists() else None
    tail = p.stdout.strip().splitlines()[-1:] if p.stdout.strip() else [""]
    shutil.rmtree(scratch, ignore_errors=True)
    return {"wall_s": wall, "cpu_s": cpu, "peak_mb": rss_kb / 1024, "exit": p.returncode, "matrix": digest, "last_line": tail[0][:120]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", choices=sorted(JOBS))
    ap.add_argument("--args", default="", help="more arguments for the command, as one string")
    ap.add_argument("--base", metavar="REV", help="also run at this git commit, alternating, and report the ratio")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "tenantry-bench")
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/commands-<job>.json")
    a = ap.parse_args(argv)
    extra = shlex.split(a.args)
    started = machine()
    systems = [("working tree", REPO, None)]
    if a.base:
        tree, venv = _venv_for(a.base, a.cache)
        systems.insert(0, (f"base {a.base}", tree, venv))
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in systems}
    for k in range(a.repeats):
        for name, tree, venv in systems:
            r = run_once(a.job, extra, tree, venv)
            runs[name].append(r)
            print(f"{name:>16} run {k + 1}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, "
                  f"{r['peak_mb']:.0f} MB, exit {r['exit']}, matrix {r['matrix']}  | {r['last_line']}", flush=True)
    rows = []
    for name, _, _ in systems:
        best = min(runs[name], key=lambda r: r["wall_s"])
        rows.append([name, round(best["wall_s"], 1), round(best["cpu_s"], 1), round(best["peak_mb"]),
                     best["exit"], best["matrix"] or "-"])
    digests = {r["matrix"] for rs in runs.values() for r in rs}
    same = len(digests) == 1
    notes = f"Best of {a.repeats} per system (wall time). matrix.json: " + (
        "the same bytes in every run." if same else f"DIFFERENT bytes between runs: {sorted(map(str, digests))}.")
    if a.base:
        ratio = rows[1][1] / rows[0][1] if rows[0][1] else float("nan")
        cpu_ratio = rows[1][2] / rows[0][2] if rows[0][2] else float("nan")
        notes += f" Working tree over base: {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU."
    print(notes)
    if a.record:
        cmd = " ".join(["python benchmarks/bench_commands.py", a.job] + (["--args", shlex.quote(a.args)] if a.args else [])
                       + (["--base", a.base] if a.base else []) + ["--repeats", str(a.repeats)])
        path = save(f"commands-{a.job}", title=f"`{a.job}` as a user runs it" + (" (A/B)" if a.base else ""),
                    command=cmd, columns=["system", "wall s", "CPU s", "peak MB", "exit", "matrix.json"],
                    rows=rows, notes=notes, started=started)
        print(f"recorded {path}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
