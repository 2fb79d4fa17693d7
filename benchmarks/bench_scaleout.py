"""Benchmark: the same matrix on 1, 2 and 4 local workers (and on Ray or Dask where installed).

Run on demand (not a test):

    python benchmarks/bench_scaleout.py                       # process pool: 1, 2, 4 workers
    python benchmarks/bench_scaleout.py --executors process ray dask --workers 1 2
    python benchmarks/bench_scaleout.py --record              # benchmarks/results/scaleout.json

Each run is ``tenantry check`` on a fixed part of the matrix (``--args``,
default four setups by four patterns at 8 evaluations per cell, no extras), in
a fresh process, with ``--workers N`` and ``--executor E``.  Reported per run:
wall time, evaluations per second (from the report's ``timing.json``), the
speed-up against one worker of the same executor, and whether ``matrix.json``
has the same bytes as the first run's (it must: the executor and the workers
change no result).  On a machine with C cores, more than C workers cannot go
faster; the figure to read is how close 2 workers on 2 cores come to 2x.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from record import machine, save  # noqa: E402

DEFAULT_ARGS = "--policy fcfs vtc drr_tokens shared_cache --pattern flood sybil cancellations few_huge --budget 8 --no-extras"


def available(executor: str) -> bool:
    """Whether the executor's library is installed (the process pool always is)."""
    return executor == "process" or importlib.util.find_spec({"ray": "ray", "dask": "distributed"}[executor]) is not None


def run(executor: str, workers: int, args: list[str]) -> dict:
    """One ``tenantry check`` with ``--workers`` and ``--executor``: wall time, evaluations/s, digest."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    out = scratch / "report"
    argv = [str(Path(sys.executable).parent / "tenantry"), "check", "--out", str(out), "--workers", str(workers),
            "--executor", executor, "--quiet", *args]
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").exists() else {}
    digest = hashlib.sha256((out / "matrix.json").read_bytes()).hexdigest()[:16] if (out / "matrix.json").exists() \
        else None
    shutil.rmtree(scratch, ignore_errors=True)
    return {"wall_s": wall, "eval_per_s": timing.get("evaluations_per_s"), "evaluations": timing.get("evaluations"),
            "matrix": digest, "exit": p.returncode, "tail": (p.stdout.strip().splitlines() or [""])[-1][:100]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executors", nargs="+", default=["process"], choices=["process", "ray", "dask"])
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--args", default=DEFAULT_ARGS, help="the matrix part, as tenantry check arguments")
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/scaleout.json")
    a = ap.parse_args(argv)
    started = machine()
    extra = shlex.split(a.args)
    rows, digests = [], set()
    for ex in a.executors:
        if not available(ex):
            print(f"{ex}: not installed, skipped")
            continue
        base = None
        for w in a.workers:
            r = run(ex, w, extra)
            base = base or r["wall_s"]
            digests.add(r["matrix"])
            speedup = base / r["wall_s"] if r["wall_s"] else float("nan")
            print(f"{ex:>8} x{w}: {r['wall_s']:.1f} s, {r['eval_per_s']} evaluations/s, {speedup:.2f}x against 1 "
                  f"worker, matrix {r['matrix']}, exit {r['exit']}", flush=True)
            rows.append([ex, w, round(r["wall_s"], 1), r["eval_per_s"], round(speedup, 2), r["matrix"] or "-"])
    same = len(digests) == 1
    notes = ("matrix.json: the same bytes on every executor and worker count." if same else
             f"matrix.json DIFFERS between runs: {sorted(map(str, digests))}.")
    print(notes)
    if a.record:
        path = save("scaleout", title="The same matrix on 1, 2 and 4 workers",
                    command=f"python benchmarks/bench_scaleout.py --executors {' '.join(a.executors)} --workers "
                            f"{' '.join(map(str, a.workers))}",
                    columns=["executor", "workers", "wall s", "evaluations/s", "speed-up vs 1 worker", "matrix.json"],
                    rows=rows, notes=notes + f" Matrix part: `tenantry check {a.args}`.", started=started)
        print(f"recorded {path}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
