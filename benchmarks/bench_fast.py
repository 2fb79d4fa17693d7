"""Benchmark: the readable step (model/step.py) and the fast replica (runner/fast.py)
where a run keeps no step records, every ratio measured in the same run.

Run on demand (not a test):  python benchmarks/bench_fast.py [--quick] [--only simulate tenants running spread evaluations]

The readable step is the specification, written without speed tricks (issue 30);
to compare it with an older step, run this file at both commits (a ``git worktree``
of the older one, with its own editable install) on a quiet machine and compare
the printed figures.

* simulate: ``tenantry simulate``'s default work (the seed-001 workload, 2,827
  requests, under fcfs, rate_limit and vtc; no step records, as the command
  keeps none without ``--history``; then the same with step records kept),
  seconds: the fast replica (what the command runs) and the readable step (no
  step records), and the readable step with records; and the seed's own unchecked ``fairness.py`` (extracted from
  ../shared/seeds/001_*.txt when present) run in a subprocess, for the ratio
  the issue asks about;
* step at N tenants: microseconds per ``step()`` on a saturated replica
  (:func:`tenantry.adversaries.studies_load.saturated_state`), fcfs and vtc, at 3,
  100, 1,000 and 10,000 tenants;
* step at R running: microseconds per step with 16, 128, 512 sequences decoding
  (3 tenants, every one backlogged);
* tenants: 20,000 requests spread over 10,000 tenants against the same
  requests over 3 tenants (no step records), seconds;
* evaluations: ``tenantry check``'s evaluation (:func:`~tenantry.adversaries.evaluate.evaluate`)
  of a fixed list of flood tasks on fcfs and vtc, inline, evaluations per second.

Each timing is the CPU time of this process (``time.process_time``: the
benchmark is single-threaded, and CPU time is what a busy shared machine
disturbs least), the best of ``--repeats`` runs (default 3), alternating the
fast replica and the step so that a busy machine slows both alike;
``fairness.py`` is timed as its subprocess's CPU time.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from tenantry.adversaries.studies_load import saturated_state  # noqa: E402
from tenantry.runner import simulate as sim  # noqa: E402
from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig  # noqa: E402
from tenantry.runner.setups import apply_setup, seed001_config  # noqa: E402
from tenantry.model.step import step  # noqa: E402
from tenantry.runner.traces import seed001_workload  # noqa: E402
from tenantry.model.workload import Request, Workload  # noqa: E402

#: What ``simulate(fast=...)`` is given under each name of :func:`best_of` (``fast``: the
#: default, which takes the fast replica where it applies; ``step``: the readable step, never it).
FAST = {"fast": None, "step": False}


def best_of(fn, repeats: int, names=("step",)) -> dict[str, float]:
    """CPU seconds of ``fn(fast)`` for each of ``names`` (``fast``, ``step``), the best of
    ``repeats`` alternating runs; ``fn`` takes the name's ``fast`` argument (:data:`FAST`)."""
    best = {k: float("inf") for k in names}
    for _ in range(repeats):
        for name in names:
            t0 = time.process_time()
            fn(FAST[name])
            best[name] = min(best[name], time.process_time() - t0)
    return best


def line(label: str, t: dict[str, float], unit: str = "s", scale: float = 1.0) -> str:
    fast = f"fast {t['fast'] * scale:>8.3f} {unit:<3} " if "fast" in t else ""
    ratio = f"fast/step {t['fast'] / t['step']:.3f}" if "fast" in t else ""
    return f"{label:<34} {fast}step {t['step'] * scale:>8.3f} {unit:<3} " + ratio


def fairness_py_seconds() -> float | None:
    """CPU seconds of the seed's own ``fairness.py`` (None when the seed file is absent)."""
    seeds = sorted(glob.glob(str(HERE.parent.parent / "shared" / "seeds" / "001_*.txt")))
    if not seeds:
        return None
    text = Path(seeds[0]).read_text(encoding="utf-8").splitlines()
    start = next(i for i, s in enumerate(text) if s.startswith('"""fairness.py'))
    end = next(i for i, s in enumerate(text) if s.startswith("Run it with python3 fairness.py"))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "fairness.py"
        p.write_text("\n".join(text[start:end]) + "\n", encoding="utf-8")
        before = os.times()
        subprocess.run([sys.executable, str(p)], check=True, stdout=subprocess.DEVNULL)
        after = os.times()
        return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def bench_simulate(repeats: int, quick: bool) -> None:
    wl = seed001_workload(seed=9)
    horizon = 60.0 if quick else max(3 * wl.duration_s, wl.duration_s + 600.0)
    cfgs = [apply_setup(seed001_config(wl.tenants), n) for n in ("fcfs", "rate_limit", "vtc")]
    t = best_of(lambda fast: [sim.simulate(c, wl, horizon_s=horizon, record_steps=False, fast=fast) for c in cfgs],
                repeats, ("fast", "step"))
    print(line(f"simulate seed-001 x3 policies{' (60 s)' if quick else ''}", t))
    t_rec = best_of(lambda fast: [sim.simulate(c, wl, horizon_s=horizon) for c in cfgs], repeats)
    print(line("  the same, step records kept", t_rec))
    f = None if quick else min(fairness_py_seconds() or float("inf") for _ in range(repeats))
    if f is not None and f != float("inf"):
        print(f"{'  seed fairness.py':<34} {f:.3f} s: fast/fairness.py {t['fast'] / f:.2f}, step/fairness.py "
              f"{t['step'] / f:.1f} ({t_rec['step'] / f:.1f} with records)")


def _run_steps(cfg: Config, st, steps: int) -> None:
    for _ in range(steps):
        st, _ = step(cfg, st)


def bench_tenants(repeats: int, counts: list[int], steps: int) -> None:
    for n in counts:
        for policy in ("fcfs", "vtc"):
            cfg, st = saturated_state(n, policy)
            t = best_of(lambda _: _run_steps(cfg, st, steps), repeats)
            print(line(f"step, {n} tenants, {policy}, {len(st.running)} run", t, "us", 1e6 / steps))


def bench_running(repeats: int, steps: int) -> None:
    for r in (16, 128, 512):
        cfg, st = saturated_state(3, "vtc", max_num_seqs=r)
        t = best_of(lambda _: _run_steps(cfg, st, steps), repeats)
        print(line(f"step, 3 tenants, vtc, {len(st.running)} running", t, "us", 1e6 / steps))


def spread_workload(n_tenants: int, n_requests: int = 20_000) -> tuple[Config, Workload]:
    """``n_requests`` small requests over 200 s, tenant j % n_tenants for the j-th."""
    tenants = [TenantConfig(f"t{i}") for i in range(n_tenants)]
    cfg = Config(tenants=tenants, num_blocks=100_000, max_num_seqs=256, token_budget=4096,
                 order=OrderConfig(policy="vtc"), cost=CostConfig(mode="unit", unit_step_s=0.01))
    reqs = tuple(Request(j, f"t{j % n_tenants}", round(j * 200.0 / n_requests, 6), 64 + j % 64, 8 + j % 8)
                 for j in range(n_requests))
    return cfg, Workload(reqs)


def bench_spread(repeats: int, quick: bool) -> None:
    n_req = 4_000 if quick else 20_000
    res = {}
    for n in (3, 10_000):
        cfg, wl = spread_workload(n, n_req)
        res[n] = best_of(lambda fast: sim.simulate(cfg, wl, record_steps=False, fast=fast), repeats,
                         ("fast", "step"))
        print(line(f"{n_req} requests over {n} tenants", res[n]))
    print(f"{'  10,000 / 3 tenants':<34} " + ", ".join(f"{k} {res[10_000][k] / res[3][k]:.2f}x" for k in res[3]))


def bench_evaluations(repeats: int, quick: bool) -> None:
    import random

    from tenantry.adversaries.evaluate import Task, evaluate
    from tenantry.adversaries.patterns import get_pattern
    from tenantry.adversaries.space import freeze

    space = get_pattern("flood").space
    rng = random.Random(1)
    k = 3 if quick else 10
    tasks = [Task(s, "flood", freeze(space.decode([rng.random() for _ in space.params])), 1)
             for s in ("fcfs", "vtc") for _ in range(k)]
    for t in tasks[:2]:
        evaluate(t)  # the baselines' per-process memo
    t = best_of(lambda _: [evaluate(x) for x in tasks], repeats)
    print(line(f"check evaluations ({len(tasks)} flood)", t))
    print(f"{'  evaluations/s':<34} step {len(tasks) / t['step']:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs (a smoke test of the benchmark)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tenants", type=int, nargs="+", default=[3, 100, 1000, 10000])
    ap.add_argument("--only", nargs="+", default=["simulate", "tenants", "running", "spread", "evaluations"])
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    if "simulate" in args.only:
        bench_simulate(args.repeats, args.quick)
    if "tenants" in args.only:
        bench_tenants(args.repeats, [n for n in args.tenants if not args.quick or n <= 1000], args.steps)
    if "running" in args.only:
        bench_running(args.repeats, args.steps)
    if "spread" in args.only:
        bench_spread(args.repeats, args.quick)
    if "evaluations" in args.only:
        bench_evaluations(args.repeats, args.quick)


if __name__ == "__main__":
    main()
