"""The VTC bound from the other side: a workload on which the model's service
gap is as large as it can be made (SPEC.md 8.3).

VTC-GAP proves that two tenants backlogged over an interval receive normalised
service differing by at most ``D/w_f + D/w_g`` (2D for unit weights).  The
gap reaches ``2 (2T - 1)`` here, against ``2D = 4T`` (T = max_context_tokens;
with one batch slot the largest charge after a pick is ``w_in + w_out (T -
1)`` = 2T - 1, one prompt token short of D = w_out * T).  The construction:

* one batch slot, w_in = 1, w_out = 2, every request 1 prompt token and T - 1
  output tokens (the largest charge a request can carry);
* g's first request is the oldest head: it runs first and g's counter ends
  2T - 1 ahead of f's;
* f is then picked (least counter), runs 2T - 1 of service and ties g;
  the tie goes to the oldest head, which is f's second request: f runs
  another 2T - 1 while g, backlogged, gets nothing.

Over the interval from g's first finish to f's second, f receives
``2 (2T - 1)`` and g nothing: a fraction ``1 - 1/(2T)`` of the proven bound.
"""

from __future__ import annotations

import attrs

from tenantry.model.config import Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.workload import Request, Workload

from .concrete import run_workload
from .vtc import charge_bound


@attrs.frozen
class Tight:
    """The measured gap.

    Attributes:
        gap: the largest normalised service gap (weighted tokens) over an
            interval in which both tenants were backlogged at every step end.
        bound: the proven bound D/w_f + D/w_g.
        u: D (the "U" of the issue: the counter-spread bound for unit weight).
        fraction: gap / bound.
        steps: (first, last) step of the interval.
        config, workload: the replica and the workload that produce it.
    """

    gap: float
    bound: float
    u: float
    fraction: float
    steps: tuple[int, int]
    config: Config
    workload: Workload


def tight_config(max_context_tokens: int = 64) -> Config:
    """Two unit-weight tenants under VTC with one batch slot."""
    return Config(tenants=(TenantConfig("f"), TenantConfig("g")), max_num_seqs=1, token_budget=max_context_tokens,
                  num_blocks=max(8, 2 * -(-max_context_tokens // 16)), max_context_tokens=max_context_tokens,
                  order=OrderConfig(policy="vtc", w_in=1.0, w_out=2.0, lift=True), cost=CostConfig(mode="unit"))


def tight_workload(max_context_tokens: int = 64) -> Workload:
    """g1 (oldest), f1, f2, then g2, f3, g3: all at t = 0, each 1 + (T - 1) tokens."""
    out = max_context_tokens - 1
    order = ("g", "f", "f", "g", "f", "g")
    return Workload(tuple(Request(n, t, 0.0, 1, out) for n, t in enumerate(order)))


def largest_gap(config: Config, transitions, a: int = 0, b: int = 1) -> tuple[float, tuple[int, int]]:
    """The largest |d(S_a/w_a - S_b/w_b)| over stretches of step ends at which
    both tenants have queued work; returns (gap, (first step, last step))."""
    wa, wb = config.tenants[a].weight, config.tenants[b].weight
    best, where = 0.0, (0, 0)
    run: list[tuple[int, float]] = []
    for tr in transitions:
        ts = tr.state.tenants
        if ts[a].queue and ts[b].queue:
            x = ts[a].service / wa - ts[b].service / wb
            run.append((tr.output.step_index, x))
            lo = min(run, key=lambda p: p[1])
            hi = max(run, key=lambda p: p[1])
            for p, q in ((lo, hi), (hi, lo)):
                if abs(q[1] - p[1]) > best and p[0] <= q[0]:
                    best, where = abs(q[1] - p[1]), (p[0], q[0])
        else:
            run = []
    return best, where


def measure(max_context_tokens: int = 64) -> Tight:
    """Run the construction and measure its gap against the proven bound."""
    cfg, wl = tight_config(max_context_tokens), tight_workload(max_context_tokens)
    trs = list(run_workload(cfg, wl, max_steps=20 * max_context_tokens))
    gap, where = largest_gap(cfg, trs)
    d = charge_bound(cfg)
    bound = d / cfg.tenants[0].weight + d / cfg.tenants[1].weight
    return Tight(gap, bound, d, gap / bound, where, cfg, wl)
