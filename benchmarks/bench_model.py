"""Benchmark: steps per second and microseconds per scheduling decision of the
reference model at 3, 100, 1,000 and 10,000 tenants.

Run on demand (not a test):  python benchmarks/bench_model.py [--tenants 3 100 1000 10000]

* decision (cold): one call of the order policy's ``select`` on a fresh view
  where every tenant is backlogged (no memo: a full scan);
* decision (in step): the waiting phase of a step that admits requests from
  a backlog of every tenant, divided by the requests admitted (the memoised
  keys make later picks in a step cheaper); both per policy, with the ratio to
  FCFS measured in the same run.
* step: ``step()`` on a saturated replica (max_num_seqs sequences decoding,
  every tenant backlogged), steps/s and microseconds per step.
"""

from __future__ import annotations

import argparse
import time

import attrs

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


def time_in_step_decision_us(cfg: Config, st, repeats: int = 5) -> tuple[float, int]:
    """Mean microseconds per admitted request in the waiting phase of one step
    whose batch starts empty, and the number admitted per step."""
    from tenantry.model.step import Step

    st = attrs.evolve(st, running=(), kv=attrs.evolve(st.kv, used_blocks=0),
                      tenants=tuple(t._replace(running=0, blocks=0) for t in st.tenants))
    total, admitted = 0.0, 0
    for _ in range(repeats):
        s = Step(cfg, st)
        t0 = time.perf_counter()
        s.schedule_waiting()
        total += time.perf_counter() - t0
        admitted += len(s.planned)
    return total / admitted * 1e6, admitted // repeats


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
    print(f"{'tenants':>8} {'policy':<12} {'us/dec cold':>12} {'x fcfs':>7} {'us/dec step':>12} {'x fcfs':>7} "
          f"{'picks':>6} {'us/step':>9} {'steps/s':>8} {'running':>8}")
    for n in args.tenants:
        base = base_in = None
        for policy in POLICIES:
            cfg, st = saturated_state(n, policy)
            repeats = max(20, 200_000 // n)
            dec = time_decision_us(cfg, st, repeats)
            base = base or dec
            dec_in, picks = time_in_step_decision_us(cfg, st)
            base_in = base_in or dec_in
            stp = time_step_us(cfg, st, args.steps)
            print(f"{n:>8} {policy:<12} {dec:>12.1f} {dec / base:>7.2f} {dec_in:>12.1f} {dec_in / base_in:>7.2f} "
                  f"{picks:>6} {stp:>9.0f} {1e6 / stp:>8.0f} {len(st.running):>8}")


if __name__ == "__main__":
    main()
