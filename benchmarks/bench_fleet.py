"""Benchmark: a fleet step of R replicas against R replica steps (SPEC.md 5.3), in one run.

Run on demand (not a test):  python benchmarks/bench_fleet.py [--quick] [--repeats 3]

For R = 1, 2, 4, 8 replicas of the adversary search's small replica (``vtc``
setup), a synthetic three-tenant workload scaled with R (the same load per
replica) is run

* as a fleet (:func:`tenantry.runner.fleet.run_fleet`, round robin; per-replica
  and fleet-level accounting), and
* as R independent one-replica runs (:func:`tenantry.runner.simulate.run_steps`),
  each on the requests the fleet routed to that replica,

without history records.  The figure is the CPU time per replica step (a fleet
step of R replicas that all step counts R) of the fleet over that of the
independent runs: 1.0 means a fleet step costs exactly R replica steps; above
it is the router's and the lockstep's overhead.  Each timing is the process's
CPU time (``time.process_time``), the best of ``--repeats`` runs, alternating
fleet and replicas so that a busy shared machine slows both alike.
"""

from __future__ import annotations

import argparse
import time

from tenantry.model.routers import FleetConfig
from tenantry.model.workload import Request
from tenantry.runner.fleet import run_fleet
from tenantry.runner.setups import build_config
from tenantry.runner.simulate import run_steps

ROLES = [("a", "adversary"), ("b", "victim"), ("c", "victim")]


def workload(replicas: int, per_replica: int) -> list[Request]:
    """``per_replica`` requests per replica, three tenants, 40 ms apart per replica."""
    n = replicas * per_replica
    return [Request(i, "abc"[i % 3], i * 0.04 / replicas, 200 + (i * 37) % 600, 20 + (i * 13) % 100) for i in range(n)]


def time_fleet(fc: FleetConfig, wl: list[Request]) -> tuple[float, int, dict[int, list[Request]]]:
    t0 = time.process_time()
    steps = 0
    fleet = None
    for tr, fleet in run_fleet(fc, wl):
        steps += len(tr.record.stepped)
    dt = time.process_time() - t0
    by = {}
    for r in wl:
        by.setdefault(fleet.where[r.request_id], []).append(r)
    return dt, steps, by


def time_replicas(cfg, parts: dict[int, list[Request]]) -> tuple[float, int]:
    t0 = time.process_time()
    steps = 0
    for reqs in parts.values():
        for _ in run_steps(cfg, reqs):
            steps += 1
    return time.process_time() - t0, steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (a first look)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    per = 60 if args.quick else 200
    cfg = build_config("vtc", ROLES)
    print(f"{'R':>2}  {'accounting':<10}  {'fleet steps':>11}  {'us/replica step':>15}  "
          f"{'solo steps':>10}  {'us/solo step':>12}  {'ratio':>5}")
    for r in (1, 2, 4, 8):
        wl = workload(r, per)
        for acc in ("replica", "fleet"):
            fc = FleetConfig((cfg,) * r, router="round_robin", accounting=acc)
            best_f = best_s = float("inf")
            for _ in range(args.repeats):
                tf, nf, parts = time_fleet(fc, wl)
                ts, ns = time_replicas(cfg, parts)
                best_f, best_s = min(best_f, tf), min(best_s, ts)
            uf, us = best_f / nf * 1e6, best_s / ns * 1e6
            print(f"{r:>2}  {acc:<10}  {nf:>11,}  {uf:>15.1f}  {ns:>10,}  {us:>12.1f}  {uf / us:>5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
