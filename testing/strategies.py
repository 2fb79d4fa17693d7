"""Hypothesis strategies for the invariant suite: workloads shaped to stress a
configuration, from tiny requests to ones larger than the pool.

``workloads(config, **shape)`` draws a :class:`~tenantry.model.workload.Workload`:
requests with ids 0..n-1 in arrival order, some cancelled by their client
(``cancel_s``) when asked, as :func:`tenantry.spec.invariants_run.run_checked`
takes it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from hypothesis import strategies as st

from tenantry.model.config import (
    ORDER_POLICIES, PREFIX_CACHE_MODES, SKIP_POLICIES, VICTIM_POLICIES, AdmissionConfig, Config, CostConfig,
    EvictionConfig, OrderConfig, TenantConfig,
)
import attrs

from tenantry.model.workload import Request, Workload


@st.composite
def workloads(draw, config: Config, *, max_requests: int = 20, idle_gaps: bool = False, long_outputs: bool = False,
              big: bool = False, shared_prefixes: bool = False, bursty: bool = False, cancels: bool = False,
              step_s: float = 0.01):
    """Draw a workload for ``config``.

    Shape switches: ``idle_gaps`` (quiet periods of 100 steps), ``long_outputs``
    (up to 60 output tokens), ``big`` (prompts up to the context limit, so the
    pool binds), ``shared_prefixes`` (prefix content ids from a 2-letter
    alphabet, so prompts share blocks), ``bursty`` (many arrivals at once),
    ``cancels`` (clients cancel some requests); ``step_s`` is the step length
    the gaps are measured in.
    """
    names = [t.name for t in config.tenants]
    ctx = config.max_context_tokens
    n = draw(st.integers(1, max_requests))
    gaps = (0.0, 0.0, 0.0, step_s) if bursty else (0.0, step_s, 3 * step_s, 10 * step_s)
    out_max = min(60 if long_outputs else 8, ctx - 1)
    t = 0.0
    reqs = []
    for rid in range(n):
        gap = gaps[draw(_index4)]
        if idle_gaps and draw(_index6) == 5:
            gap = 100 * step_s
        t = round(t + gap, 6)
        output = draw(st.integers(1, out_max))
        room = ctx - output
        kind = draw(_index6)
        if kind < 4:
            prompt = min((1, 16, 17, 32)[kind], room)
        else:
            prompt = draw(st.integers(1, room if big else min(64, room)))
        prefix = ()
        if shared_prefixes:
            prefix = tuple(draw(_bit) for _ in range(prompt // 16))
        reqs.append(Request(rid, names[draw(st.integers(0, len(names) - 1))], t, prompt, output, prefix_ids=prefix))
    if cancels:
        for rid in draw(st.lists(st.integers(0, n - 1), max_size=max(1, n // 3), unique=True)):
            delay = (0.0, step_s, 2 * step_s, 5 * step_s)[draw(_index4)]
            reqs[rid] = attrs.evolve(reqs[rid], cancel_s=round(reqs[rid].arrival_s + delay, 6))
    return Workload(tuple(reqs))


_index4 = st.integers(0, 3)
_index6 = st.integers(0, 5)
_bit = st.integers(0, 1)


#: Context limit of :func:`configs` (tokens: 32 blocks of 16).
MAX_CONTEXT = 512


@st.composite
def configs(draw, policy: str | None = None, lanes: bool = True):
    """A small replica for every policy family (or ``policy``), with an ample or a tight pool:
    2-3 tenants of mixed weights and tiers, optional queue bounds, KV caps, batch-slot
    caps (per tenant and per tier) and token buckets (with or without output
    reservation), every victim policy and hysteresis setting (and preemption for
    priority under ``priority``), with or without the starvation guard and the skip budget
    (every policy of ``SKIP_POLICIES``, so both DRR units; under DRR a carry bound of 256 or
    none), every prefix-cache mode, unit-cost steps of 10 ms.  With ``lanes`` (default), also the gateway lab's
    mechanisms: strict tiers, KV watermarks per tier (counting queued blocks or not) and
    estimated-wait shedding (False: none of them, for a reference that predates them)."""
    n = draw(st.integers(2, 3))
    bucket = draw(st.booleans())
    tenants = tuple(
        TenantConfig(
            name, weight=draw(st.sampled_from((0.5, 1.0, 2.0))), tier=draw(st.integers(0, 1)),
            queue_bound=draw(st.sampled_from((None, 1, 3))), kv_block_cap=draw(st.sampled_from((None, None, 12))),
            token_rate_per_s=2000.0 if bucket else None, token_burst_tokens=600.0 if bucket else None,
            max_running_seqs=draw(st.sampled_from((None, None, 1, 2))),
        )
        for name in ("a", "b", "c")[:n]
    )
    max_num_seqs = draw(st.integers(1, 4))
    ample = draw(st.integers(0, 2)) == 0
    num_blocks = max_num_seqs * 32 if ample else draw(st.integers(8, 40))
    pol = policy or draw(st.sampled_from(ORDER_POLICIES))
    # no carry bound sometimes: then DRR-DEFICIT's tight bounds are claimed under the skip budget (8.4)
    carry = draw(st.sampled_from((256.0, 256.0, None))) if pol.startswith("drr") else 256.0
    order = OrderConfig(policy=pol, drr_quantum=draw(st.sampled_from((32.0, 128.0))), drr_carry_bound=carry,
                        aging_rate_per_s=draw(st.sampled_from((1.0, 20.0))), tier_floors=(0.6, 0.4),
                        guard_steps=draw(st.sampled_from((None, None, 3))),
                        guard_skips=draw(st.sampled_from((None, None, 0, 2))) if pol in SKIP_POLICIES else None,
                        strict_tiers=lanes and draw(st.sampled_from((False, False, True))))
    watermarks = draw(st.sampled_from(((), (), (0.9, 0.5)))) if lanes else ()
    shed = lanes and draw(st.sampled_from((False, False, True)))
    eviction = EvictionConfig(
        victim=draw(st.sampled_from(VICTIM_POLICIES)), min_free_blocks=draw(st.sampled_from((0, 0, 2))),
        cooldown_steps=draw(st.sampled_from((0, 2))), max_evictions=draw(st.sampled_from((None, 1, 3))),
        preempt_for_priority=pol == "priority" and draw(st.booleans()),
    )
    return Config(
        tenants=tenants, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
        token_budget=draw(st.sampled_from((16, 48, 64))), max_context_tokens=MAX_CONTEXT, order=order,
        admission=AdmissionConfig(token_bucket=bucket, kv_cap=draw(st.booleans()),
                                  tier_slot_caps=draw(st.sampled_from(((), (), (3, 1)))),
                                  reserve_output=bucket and draw(st.booleans()),
                                  kv_watermarks=watermarks,
                                  kv_watermark_queued=bool(watermarks) and draw(st.booleans()),
                                  wait_limits_s=(0.05, 0.2) if shed else (),
                                  wait_service_rate_tokens_per_s=2000.0 if shed else None),
        eviction=eviction, cost=CostConfig(mode="unit", unit_step_s=0.01),
        prefix_cache=draw(st.sampled_from(PREFIX_CACHE_MODES)),
    )


@st.composite
def fleets(draw, accounting: str | None = None):
    """A small fleet (SPEC.md 5.3): 1-3 replicas of one drawn replica (:func:`configs`), pools
    that may differ (one may be twice the others'), any router, load factor 1 to 2, hashed or
    explicit affinity subsets, and either accounting (or ``accounting``).  Fleet accounting runs
    ``vtc``; half of those fleets are plain (no cap, no strict tiers, every pool ample), so that
    FLEET-VTC-GAP is claimed."""
    from tenantry.model.routers import ACCOUNTING, ROUTERS, FleetConfig

    acc = accounting or draw(st.sampled_from(ACCOUNTING))
    base = draw(configs("vtc" if acc == "fleet" else None))
    if acc == "fleet" and draw(st.booleans()):
        base = attrs.evolve(base, tenants=tuple(attrs.evolve(t, kv_block_cap=None, max_running_seqs=None)
                                                for t in base.tenants),
                            num_blocks=base.max_num_seqs * base.blocks_for(base.max_context_tokens),
                            order=attrs.evolve(base.order, strict_tiers=False),
                            admission=attrs.evolve(base.admission, tier_slot_caps=()))
    n = draw(st.integers(1, 3))
    pools = [draw(st.sampled_from((base.num_blocks, base.num_blocks, 2 * base.num_blocks))) for _ in range(n)]
    names = [t.name for t in base.tenants]
    pinned = draw(st.dictionaries(st.sampled_from(names), st.lists(st.integers(0, n - 1), min_size=1, max_size=n),
                                  max_size=2))
    return FleetConfig(tuple(attrs.evolve(base, num_blocks=b) for b in pools),
                       router=draw(st.sampled_from(sorted(ROUTERS))),
                       accounting=acc, load_factor=draw(st.sampled_from((1.0, 1.25, 2.0))),
                       affinity_replicas=draw(st.one_of(st.none(), st.integers(1, n))), tenant_replicas=pinned)


@contextlib.contextmanager
def without_local_constants() -> Iterator[None]:
    """Inside, Hypothesis draws no literal constants from the source of the local modules
    loaded in the process (Hypothesis 6.13x and later, cached on first use), so a
    derandomised or seeded search draws the same examples whatever else the process
    imported: a mutant hunt (:func:`tenantry.testing.hunt.hunt`) and ``tenantry check``'s
    ``hypothesis`` search give the same results from the CLI, a test or a user's script.
    A Hypothesis without that pool (or with other internals) is left as it is."""
    try:
        from hypothesis.internal.cache import LRUCache
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants

        saved = providers._get_local_constants, providers.CONSTANTS_CACHE
    except (ImportError, AttributeError):
        yield
        return
    providers._get_local_constants, providers.CONSTANTS_CACHE = Constants, LRUCache(1024)
    try:
        yield
    finally:
        providers._get_local_constants, providers.CONSTANTS_CACHE = saved
