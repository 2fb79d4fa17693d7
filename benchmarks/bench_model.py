"""Benchmark: steps per second and microseconds per scheduling decision of the
reference model at 3, 100, 1,000 and 10,000 tenants.

Run on demand (not a test):  python benchmarks/bench_model.py [--tenants 3 100 1000 10000]

* decision (cold): one call of the order policy's ``select`` on a fresh view
  where every tenant is backlogged (a scan of every candidate);
* decision (in step): the waiting phase of a step that admits requests from
  a backlog of every tenant, divided by the requests admitted (each pick
  scans the candidates); both per policy, with the ratio to FCFS measured in
  the same run.
* decision (warm): the same in the step after it: what every step of a
  steady run but the first sees.
* step: ``step()`` on a saturated replica (the replica and the timings are
  ``tenantry study accounting-cost``'s: :mod:`tenantry.studies.load`) (max_num_seqs sequences decoding,
  every tenant backlogged), steps/s and microseconds per step.
"""

from __future__ import annotations

import argparse
import time

from tenantry.model.config import Config
from tenantry.model.policies import ORDER, SelectView
from tenantry.studies.load import in_step_decision_us, saturated_state, step_us, warm_decision_us

POLICIES = ("fcfs", "round_robin", "vtc", "drr_tokens", "priority", "aging", "floors")


def time_decision_us(cfg: Config, st, repeats: int) -> float:
    """Mean microseconds per ``select`` call with every tenant a candidate."""
    cands = [i for i, t in enumerate(st.tenants) if t.queue]
    view = SelectView(cfg, st.tenants, cands, st.t_s, st.rr_next, st.tier_counters, {})
    sel = ORDER[cfg.order.policy].select
    t0 = time.perf_counter()
    for _ in range(repeats):
        sel(view)
    return (time.perf_counter() - t0) / repeats * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", type=int, nargs="+", default=[3, 100, 1000, 10000])
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    print(f"{'tenants':>8} {'policy':<12} {'us/dec cold':>12} {'x fcfs':>7} {'us/dec step':>12} {'x fcfs':>7} "
          f"{'picks':>6} {'us/dec warm':>12} {'picks':>6} {'us/step':>9} {'steps/s':>8} {'running':>8}")
    for n in args.tenants:
        base = base_in = None
        for policy in POLICIES:
            cfg, st = saturated_state(n, policy)
            repeats = max(20, 200_000 // n)
            dec = time_decision_us(cfg, st, repeats)
            base = base or dec
            dec_in, picks = in_step_decision_us(cfg, st)
            base_in = base_in or dec_in
            dec_warm, picks_warm = warm_decision_us(cfg, st)
            stp = step_us(cfg, st, args.steps)
            print(f"{n:>8} {policy:<12} {dec:>12.1f} {dec / base:>7.2f} {dec_in:>12.1f} {dec_in / base_in:>7.2f} "
                  f"{picks:>6} {dec_warm:>12.1f} {picks_warm:>6} {stp:>9.0f} {1e6 / stp:>8.0f} {len(st.running):>8}")


if __name__ == "__main__":
    main()
