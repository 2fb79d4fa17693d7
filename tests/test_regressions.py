"""Regression cases (issue 3, part 4): small scenarios with their expected values.

Every run here also goes through the whole invariant catalog (``run_checked``),
so each case asserts both its own numbers and that no invariant broke.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tenantry.model.config import AdmissionConfig, Config, CostConfig, EvictionConfig, OrderConfig, TenantConfig
from tenantry.model.simulate import simulate
from tenantry.model.state import initial_state
from tenantry.model.step import idle, step
from tenantry.model.workload import Request, StepInput
from tenantry.spec.invariants import check_history, check_state
from tenantry.spec.invariants_core import largest_charge
from tenantry.spec.invariants_run import run_checked
from tenantry.testing.mutants import MUTANTS

UNIT = CostConfig(mode="unit", unit_step_s=1.0)


def test_long_prompt_resumed_after_preemption_thrashes_at_most_k_times():
    """A 480-token prompt next to a growing decoder in a 40-block pool: each residency
    gets one chunk per step (63 tokens beside the decoder's 1), runs out of KV and is
    preempted again; hysteresis stops it at K = 2 preemptions; every resume progresses."""
    cfg = Config((TenantConfig("a"),), num_blocks=40, max_num_seqs=4, token_budget=64, max_context_tokens=2048,
                 order=OrderConfig(policy="fcfs"),
                 eviction=EvictionConfig(victim="newest", cooldown_steps=1, max_evictions=2), cost=UNIT)
    run = run_checked(cfg, [Request(0, "a", 0.0, 160, 400), Request(1, "a", 0.0, 480, 4)])
    assert run.findings == ()
    long = run.history.requests[1]
    assert (long.outcome, long.reason, long.preemptions, long.finish_s) == ("rejected", "evicted_too_often", 2, 27.0)
    assert long.preemptions <= cfg.eviction.max_evictions
    assert long.wasted_prefill_tokens == 410 + 441 <= cfg.eviction.max_evictions * long.prompt_tokens
    chunks = {s.step_index: dict(s.batch).get(1) for s in run.history.steps[:28]}
    preempted_at = [s.step_index for s in run.history.steps if 1 in s.preempted]
    assert preempted_at == [9, 18]
    # After each preemption: out for the cooldown, then one 63-token chunk per step until the next eviction.
    assert [chunks[k] for k in range(9, 18)] == [None, None] + [63] * 7
    assert [chunks[k] for k in range(18, 27)] == [None, None] + [63] * 7
    assert chunks[27] is None  # chosen a third time: rejected instead of preempted


def test_prompt_larger_than_the_pool_is_refused_at_once_and_blocks_nothing():
    cfg = Config((TenantConfig("a"),), num_blocks=16, max_num_seqs=4, token_budget=64, max_context_tokens=1024,
                 order=OrderConfig(policy="fcfs"), cost=UNIT)
    reqs = [Request(0, "a", 0.0, 300, 4), Request(1, "a", 0.0, 20, 2), Request(2, "a", 0.0, 30, 2)]
    run = run_checked(cfg, reqs)
    assert run.findings == ()
    big, *rest = run.history.requests
    assert (big.outcome, big.reason, big.admitted_step, big.finish_s, big.retry_after_s) == (
        "rejected", "too_large", None, 0.0, None)
    assert [(r.outcome, r.first_scheduled_s, r.finish_s) for r in rest] == [("finished", 0.0, 2.0),
                                                                           ("finished", 0.0, 2.0)]


def _priority_thrash():
    cfg = Config((TenantConfig("hi", tier=0), TenantConfig("lo", tier=1)), num_blocks=20, max_num_seqs=4,
                 token_budget=64, max_context_tokens=512, order=OrderConfig(policy="priority"),
                 eviction=EvictionConfig(victim="lowest_priority", cooldown_steps=2), cost=UNIT)
    return cfg, [Request(0, "lo", 0.0, 100, 150), Request(1, "hi", 1.0, 108, 150)]


def test_priority_preempted_request_is_never_in_its_steps_batch():
    cfg, reqs = _priority_thrash()
    run = run_checked(cfg, reqs)
    assert run.findings == ()
    steps = run.history.steps
    preempting = [s for s in steps if s.preempted]
    assert len(preempting) == 23 and preempting[0].step_index == 56
    # lo decoded in step 55 and comes first in batch order, so in step 56 it is planned
    # before hi (8 tokens ahead) needs a block and evicts it.
    assert dict(steps[55].batch).get(0) == 1
    for s in preempting:
        assert s.preempted == (0,) and 0 not in dict(s.batch)
    bad = run_checked(cfg, reqs, ids=("BATCH-LIMITS",), variant=MUTANTS["preempted_left_in_batch"].variant)
    assert bad.findings and bad.findings[0].step == 56 and bad.findings[0].requests == (0,)


def _service_gaps(policy: str):
    cfg = Config((TenantConfig("a"), TenantConfig("b")), num_blocks=4 * 544, max_num_seqs=4, token_budget=512,
                 max_context_tokens=8704, order=OrderConfig(policy=policy))
    reqs = [Request(i, "a", 0.0, 8000, 512) for i in range(40)]
    reqs += [Request(1000 + i, "b", 0.0, 200, 64) for i in range(2000)]
    h = simulate(cfg, reqs, max_steps=5000)
    assert all(s.queued["a"] and s.queued["b"] for s in h.steps)  # both backlogged throughout
    return cfg, h, [s.service["a"] - s.service["b"] for s in h.steps]


def test_round_robin_gap_grows_while_vtc_stays_under_the_bound():
    """Equal weights, 8,000/512-token requests against 200/64: request round robin
    lets the token service gap grow linearly; VTC keeps it under its bound
    D/w_a + D/w_b = 2 max(w_in L, w_out M) (Sheng et al., OSDI 2024, Theorem 4.4)."""
    vtc_cfg, vtc_h, vtc_gap = _service_gaps("vtc")
    bound = 2 * largest_charge(vtc_cfg, 8000, 8512)
    assert bound == 2 * 2.0 * 4 * 8512 == 136192.0
    assert max(abs(g) for g in vtc_gap) == 8000.0 < bound
    assert check_history(vtc_h, vtc_cfg) == []
    _, rr_h, rr_gap = _service_gaps("round_robin")
    assert [rr_gap[k] for k in (999, 1999, 2999, 3999, 4999)] == [68440.0, 136488.0, 189576.0, 242656.0, 310768.0]
    assert rr_gap[4999] > 2 * bound
    judged = check_history(rr_h, vtc_cfg, ids=("VTC-GAP",))  # the RR history, judged against VTC's claim
    assert judged and judged[0].observed > bound


@pytest.mark.parametrize("mode", ["salted", "shared"])
def test_salt_separates_equal_prefixes_and_sharing_shows_in_ttft(mode):
    """Same 64-block aligned prefix for two tenants: salted, tenant b never hits a's
    blocks; shared, b reuses 63 blocks (the last prompt token is always computed)
    and its TTFT drops more than five-fold."""
    cfg = Config((TenantConfig("a"), TenantConfig("b")), num_blocks=512, max_num_seqs=4, token_budget=512,
                 max_context_tokens=4096, prefix_cache=mode, cost=CostConfig())
    prefix = tuple(range(100, 164))
    run = run_checked(cfg, [Request(0, "a", 0.0, 1024, 2, prefix_ids=prefix),
                            Request(1, "b", 0.5, 1024, 2, prefix_ids=prefix)])
    assert run.findings == ()
    a, b = run.history.requests
    if mode == "salted":
        assert b.cached_prompt_tokens == 0 and b.ttft_s == pytest.approx(a.ttft_s, rel=1e-9)
    else:
        assert b.cached_prompt_tokens == 63 * 16
        assert b.ttft_s < a.ttft_s / 5


def test_arrivals_at_twice_the_service_rate_fill_the_queue_and_the_excess_is_refused_at_once():
    """One request served per 1 s step, two arriving per second, queue bound 4: after
    the first steps every step admits one and refuses one, with queue_full at its arrival."""
    cfg = Config((TenantConfig("a", queue_bound=4),), num_blocks=64, max_num_seqs=1, token_budget=64,
                 max_context_tokens=256, order=OrderConfig(policy="fcfs"), cost=UNIT)
    run = run_checked(cfg, [Request(i, "a", i * 0.5, 16, 1) for i in range(200)])
    assert run.findings == ()
    h = run.history
    assert Counter((r.outcome, r.reason) for r in h.requests) == {("finished", None): 104,
                                                                   ("rejected", "queue_full"): 96}
    refused = [r for r in h.requests if r.outcome == "rejected"]
    assert all(r.finish_s == r.arrival_s and r.retry_after_s == 4.0 for r in refused)
    # After each step one of the bound's 4 was scheduled: 3 wait, the 4th slot refills from the next arrivals.
    assert [s.queued["a"] for s in h.steps[:8]] == [0, 1, 2, 3, 3, 3, 3, 3]
    assert all(s.queued["a"] == 3 for s in h.steps[3:100])


def test_token_bucket_ignores_refused_requests_and_refills_exactly():
    cfg = Config((TenantConfig("a", queue_bound=1, token_rate_per_s=100.0, token_burst_tokens=500.0),),
                 num_blocks=64, max_num_seqs=1, token_budget=512, max_context_tokens=512,
                 order=OrderConfig(policy="fcfs"), admission=AdmissionConfig(token_bucket=True), cost=UNIT)
    s0 = initial_state(cfg)
    inputs = StepInput((Request(0, "a", 0.0, 400, 3), Request(1, "a", 0.0, 100, 1)))
    s1, out = step(cfg, s0, inputs)
    assert [(e.kind, e.request_id, e.reason) for e in out.events][:2] == [("queued", 0, None),
                                                                         ("rejected", 1, "queue_full")]
    assert s1.tenants[0].bucket_tokens == 500 - 400 - 1  # the refused 100 tokens cost nothing
    s2, _ = step(cfg, s1)
    s3, _ = step(cfg, s2)
    assert (s2.tenants[0].bucket_tokens, s3.tenants[0].bucket_tokens) == (99 + 100 - 1, 198 + 100 - 1)
    assert s3.tenants[0].bucket_t_s == 2.0  # last refilled when step 2 charged its token
    quiet = idle(cfg, s3, 3.5)  # 1.5 s after that refill
    s4, _ = step(cfg, quiet, StepInput((Request(2, "a", 3.5, 50, 1),)))
    assert s4.tenants[0].bucket_tokens == 297 + 100 * 1.5 - 50 - 1
    late, last = idle(cfg, s4, 60.0), StepInput((Request(3, "a", 60.0, 10, 1),))
    s5, out5 = step(cfg, late, last)
    assert s5.tenants[0].bucket_tokens == 500 - 10 - 1  # a long quiet period refills only up to the burst
    for prev, new, o, i in ((s0, s1, out, inputs), (late, s5, out5, last)):
        assert check_state(cfg, prev, new, o, i) == []


def test_cancelling_at_every_stage_returns_every_block():
    """Cancel one request while queued, prefilling, decoding and preempted (after step 15,
    the newest in each stage; a preempted one as soon as there is one): once all
    drains, no block is in use."""
    cfg = Config((TenantConfig("a"), TenantConfig("b")), num_blocks=24, max_num_seqs=3, token_budget=32,
                 max_context_tokens=512, order=OrderConfig(policy="fcfs"),
                 eviction=EvictionConfig(victim="newest", cooldown_steps=3), cost=UNIT)
    reqs = [Request(0, "a", 0.0, 40, 300), Request(1, "b", 0.0, 200, 10), Request(2, "a", 0.0, 100, 50),
            Request(3, "b", 0.0, 16, 200), Request(4, "a", 0.0, 64, 8), Request(5, "b", 0.0, 30, 5)]
    state, arrivals, cancels, done = initial_state(cfg), reqs, [], {}
    while True:
        inputs = StepInput(tuple(arrivals), tuple(cancels))
        new, out = step(cfg, state, inputs)
        assert check_state(cfg, state, new, out, inputs) == []
        state, arrivals, cancels = new, [], []
        stages: dict[str, int] = {}
        for q in state.running:
            name = "decoding" if q.output_done else "prefilling"
            stages[name] = max(stages.get(name, -1), q.request_id)
        for q in (q for t in state.tenants for q in t.queue):
            name = "preempted" if q.preemptions else "queued"
            stages[name] = max(stages.get(name, -1), q.request_id)
        for name, rid in stages.items():
            if name not in done and (name == "preempted" or state.step_index >= 15):
                done[name] = (rid, state.step_index)
                cancels.append(rid)
        if not state.running and not any(t.queue for t in state.tenants) and not cancels:
            break
    assert done == {"decoding": (2, 15), "queued": (5, 15), "prefilling": (4, 18), "preempted": (3, 171)}
    assert state.kv.used_blocks == 0 and state.kv.refs == {}
    assert [(t.blocks, t.running) for t in state.tenants] == [(0, 0), (0, 0)]
    assert state.step_index == 301
