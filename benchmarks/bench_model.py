"""Benchmark: steps per second and microseconds per scheduling decision of the
reference model at 3, 100, 1,000 and 10,000 tenants.

Run on demand (not a test):  python benchmarks/bench_model.py [--tenants 3 100 1000 10000]

* decision: one call of the order policy's ``select`` on a view where every
  tenant is backlogged (the cost paid per admitted request, every step);
  reported per policy with its ratio to FCFS measured in the same run.
* step: ``step()`` on a saturated replica (max_num_seqs sequences decoding,
  every tenant backlogged), steps/s and microseconds per step.
"""

from __future__ import annotations

import argparse
import time

from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.policies import ORDER, SelectView
from tenantry.model.simulate import has_work
from tenantry.model.state import initial_state
from tenantry.model.step import step
from tenantry.model.workload import Request, StepInput

POLICIES = ("fcfs", "round_robin", "vtc", "drr_tokens", "priority", "aging", "floors")


def saturated_state(n_tenants: int, policy: str, max_num_seqs: int = 256, warm_steps: int = 30):
    """A replica with every tenant backlogged and the batch full, after ``warm_steps`` steps."""
    tenants = [TenantConfig(f"t{i}", weight=1.0 + (i % 3), tier=i % 2) for i in range(n_tenants)]
    cfg = Config(tenants=tenants, num_blocks=200_000, max_num_seqs=max_num_seqs, token_budget=2048,
                 order=OrderConfig(policy=policy), cost=CostConfig(mode="unit"))
    per = max(2, (2 * max_num_seqs) // n_tenants + 1)
    reqs = [Request(i * per + j, f"t{i}", 0.0, 64 + (i * 7 + j) % 64, 4000) for i in range(n_tenants) for j in range(per)]
    st = initial_state(cfg)
    st, _ = step(cfg, st, StepInput(arrivals=reqs))
    for _ in range(warm_steps):
        st, _ = step(cfg, st)
    return cfg, st


def time_decision_us(cfg: Config, st, repeats: int) -> float:
    """Mean microseconds per ``select`` call with every tenant a candidate."""
    cands = [i for i, t in enumerate(st.tenants) if t.queue]
    view = SelectView(cfg, st.tenants, cands, st.t_s, st.rr_next, st.tier_counters, {})
    sel = ORDER[cfg.order.policy].select
    t0 = time.perf_counter()
    for _ in range(repeats):
        sel(view)
    return (time.perf_counter() - t0) / repeats * 1e6


def time_step_us(cfg: Config, st, steps: int) -> float:
    """Mean microseconds per ``step`` on the saturated replica."""
    t0 = time.perf_counter()
    for _ in range(steps):
        st, _ = step(cfg, st)
    assert has_work(st)
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", type=int, nargs="+", default=[3, 100, 1000, 10000])
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    print(f"{'tenants':>8} {'policy':<12} {'us/decision':>12} {'x fcfs':>7} {'us/step':>10} {'steps/s':>9} {'running':>8}")
    for n in args.tenants:
        base = None
        for policy in POLICIES:
            cfg, st = saturated_state(n, policy)
            repeats = max(20, 200_000 // n)
            dec = time_decision_us(cfg, st, repeats)
            base = base or dec
            stp = time_step_us(cfg, st, args.steps)
            print(f"{n:>8} {policy:<12} {dec:>12.1f} {dec / base:>7.2f} {stp:>10.0f} {1e6 / stp:>9.0f} {len(st.running):>8}")


if __name__ == "__main__":
    main()
