"""The reference model: step semantics, purity, determinism, history files, and
the seed-001 experiment with its numbers asserted."""

from __future__ import annotations

import copy
import math
import os
import signal
import subprocess
import sys
import textwrap

import attrs
import pytest

from tenantry.runner.setups import apply_setup, default_config, seed001_config
from tenantry.runner.simulate import tenant_table
from tenantry.model.config import (
    AdmissionConfig, Config, ConfigError, CostConfig, EvictionConfig, OrderConfig, TenantConfig,
)
from tenantry.model.state import free_blocks, initial_state
from tenantry.model.step import idle, step
from tenantry.model.workload import Request, StepInput, Workload, as_workload
from tenantry.runner.history import read_history, write_history
from tenantry.runner.simulate import simulate
from tenantry.runner.traces import seed001_workload
from tenantry.spec.invariants import check_state
from conftest import REPO


def unit_config(**kw) -> Config:
    base = dict(
        tenants=[TenantConfig("a"), TenantConfig("b")], num_blocks=64, max_num_seqs=8, token_budget=64,
        cost=CostConfig(mode="unit"),
    )
    base.update(kw)
    return Config(**base)


def R(i, tenant="a", t=0.0, prompt=16, out=4, **kw) -> Request:
    return Request(i, tenant, t, prompt, out, **kw)


# --- step semantics ---------------------------------------------------------------


def test_chunked_prefill_takes_ceil_prompt_over_budget_steps_to_first_token():
    cfg = unit_config(token_budget=64)
    h = simulate(cfg, [R(0, prompt=150, out=3)])
    rec = h.requests[0]
    # 150 prompt tokens at 64 per step: 3 steps, the third produces token 1; two more decode steps.
    assert rec.first_token_s == 3.0
    assert rec.finish_s == 5.0
    assert [s.batch for s in h.steps] == [((0, 64),), ((0, 64),), ((0, 22),), ((0, 1),), ((0, 1),)]


def test_decode_uses_one_token_per_running_sequence_and_budget_is_shared():
    cfg = unit_config(token_budget=40)
    h = simulate(cfg, [R(0, prompt=30, out=3), R(1, "b", prompt=30, out=3)])
    assert h.steps[0].batch == ((0, 30), (1, 10))
    assert h.steps[1].batch == ((0, 1), (1, 20))


def test_pool_exhaustion_preempts_newest_and_it_recomputes_prompt_plus_output():
    # 4 blocks of 16 tokens; two sequences that each grow to 2 blocks + 1 token.
    cfg = unit_config(num_blocks=4, token_budget=64, eviction=EvictionConfig(victim="newest"))
    h = simulate(cfg, [R(0, prompt=32, out=8), R(1, "b", prompt=32, out=8)])
    rec = {r.request_id: r for r in h.requests}
    assert rec[1].preemptions >= 1 and rec[0].preemptions == 0
    assert rec[1].wasted_prefill_tokens >= 32
    assert all(r.outcome == "finished" and r.tokens_generated == 8 for r in h.requests)
    for s in h.steps:
        assert not set(s.preempted) & {rid for rid, _ in s.batch}


def test_request_larger_than_pool_is_rejected_at_admission_and_does_not_block():
    cfg = unit_config(num_blocks=8)
    h = simulate(cfg, [R(0, prompt=200, out=1), R(1, prompt=16, out=1)])
    rec = {r.request_id: r for r in h.requests}
    assert (rec[0].outcome, rec[0].reason) == ("rejected", "too_large")
    assert rec[1].outcome == "finished" and rec[1].first_token_s == 1.0


def test_cancellation_releases_every_block():
    cfg = unit_config()
    h = simulate(cfg, [R(0, prompt=40, out=50, cancel_s=3.0), R(1, "b", prompt=40, out=50, cancel_s=3.0)])
    assert [r.outcome for r in h.requests] == ["cancelled", "cancelled"]
    assert h.steps[-1].free_blocks == 64 and sum(h.steps[-1].blocks_in_use.values()) == 0


def test_token_bucket_refuses_with_retry_after_and_never_charges_refused_requests():
    t = TenantConfig("a", token_rate_per_s=10.0, token_burst_tokens=100.0)
    cfg = unit_config(tenants=[t], admission=AdmissionConfig(token_bucket=True))
    h = simulate(cfg, [R(0, prompt=80, out=1), R(1, prompt=80, out=1, t=0.0)])
    rec = {r.request_id: r for r in h.requests}
    assert rec[0].outcome == "finished"
    assert (rec[1].outcome, rec[1].reason) == ("rejected", "token_bucket")
    assert rec[1].retry_after_s == pytest.approx((80 - 20) / 10.0)


def test_token_bucket_ignores_refused_requests_and_refills_exactly():
    """Step mechanics of the bucket (SPEC.md 4.2, 7.3), read from the state's ``bucket_tokens``
    and ``bucket_t_s``, which no history records: a refused request costs nothing, each step
    refills at its start, a quiet period refills by its length, and never past the burst."""
    cfg = Config((TenantConfig("a", queue_bound=1, token_rate_per_s=100.0, token_burst_tokens=500.0),),
                 num_blocks=64, max_num_seqs=1, token_budget=512, max_context_tokens=512,
                 order=OrderConfig(policy="fcfs"), admission=AdmissionConfig(token_bucket=True),
                 cost=CostConfig(mode="unit", unit_step_s=1.0))
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


def test_output_reservation_takes_the_allowance_at_admission_and_refunds_it_on_cancel():
    """``reserve_output`` (SPEC.md 4.2): the bucket takes prompt + output at admission,
    generated tokens cost nothing more, and a cancelled request gives back what it did not
    generate (capped at the burst); the exact books are TOKEN-BUCKET's state form."""
    cfg = Config((TenantConfig("a", token_rate_per_s=10.0, token_burst_tokens=500.0),),
                 num_blocks=64, max_num_seqs=2, token_budget=512, max_context_tokens=512,
                 order=OrderConfig(policy="fcfs"), admission=AdmissionConfig(token_bucket=True, reserve_output=True),
                 cost=CostConfig(mode="unit", unit_step_s=1.0))
    s0 = initial_state(cfg)
    inputs = StepInput((Request(0, "a", 0.0, 100, 50), Request(1, "a", 0.0, 300, 60)))
    s1, out1 = step(cfg, s0, inputs)
    assert [e.reason for e in out1.events if e.kind == "rejected"] == ["token_bucket"]  # 150 + 360 > 500
    assert s1.tenants[0].bucket_tokens == 500 - 150  # the first token is not charged again
    s2, out2 = step(cfg, s1, StepInput(cancellations=(0,)))
    assert s2.tenants[0].bucket_tokens == 350 + 10 * 1.0 + (50 - 1)  # refill, then 49 tokens back
    for prev, new, o, i in ((s0, s1, out1, inputs), (s1, s2, out2, StepInput(cancellations=(0,)))):
        assert check_state(cfg, prev, new, o, i) == []


def test_slot_caps_bound_a_tenant_and_a_tier_in_the_batch():
    """``max_running_seqs`` and ``tier_slot_caps`` (SPEC.md 4.3): a head past a cap waits
    with free seats and blocks (SLOT-CAP), and WORK-CONSERVING does not count it."""
    tenants = (TenantConfig("a", max_running_seqs=1), TenantConfig("b", tier=1), TenantConfig("c", tier=1))
    cfg = Config(tenants, num_blocks=64, max_num_seqs=8, token_budget=512, max_context_tokens=512,
                 order=OrderConfig(policy="fcfs"), admission=AdmissionConfig(tier_slot_caps=(8, 2)),
                 cost=CostConfig(mode="unit", unit_step_s=1.0))
    reqs = [Request(i, n, 0.0, 16, 4) for i, n in enumerate("aaabbcc")]
    s0 = initial_state(cfg)
    s1, out = step(cfg, s0, StepInput(tuple(reqs)))
    running = [cfg.tenants[s.tenant].name for s in s1.running]
    assert running.count("a") == 1 and running.count("b") + running.count("c") == 2
    assert check_state(cfg, s0, s1, out, StepInput(tuple(reqs))) == []
    off = attrs.evolve(cfg, admission=AdmissionConfig(slot_cap=False, tier_slot_caps=(8, 2)))
    assert len(step(off, s0, StepInput(tuple(reqs)))[0].running) == 7


@pytest.mark.parametrize(("build", "field"), [
    (lambda: TenantConfig("a", max_running_seqs=0), "max_running_seqs"),
    (lambda: AdmissionConfig(tier_slot_caps=(2, 0)), "tier_slot_caps"),
    (lambda: AdmissionConfig(reserve_output=True), "reserve_output"),
    (lambda: OrderConfig(guard_steps=0), "guard_steps"),
    (lambda: OrderConfig(guard_wait_s=-1.0), "guard_wait_s"),
    (lambda: OrderConfig(guard_skips=-1), "guard_skips"),
    (lambda: OrderConfig(policy="aging", guard_skips=2), "guard_skips"),
    (lambda: Config((TenantConfig("a"),), order=OrderConfig(policy="vtc"),
                    eviction=EvictionConfig(preempt_for_priority=True)), "eviction.preempt_for_priority"),
])
def test_issue_12_options_refuse_bad_values_in_one_line(build, field):
    with pytest.raises(ConfigError) as e:
        build()
    assert e.value.field == field and "\n" not in str(e.value)


def test_skip_budget_counts_pool_refusals_not_own_caps_stops_at_k_and_is_recorded(tmp_path):
    """A pick past a lower-counter tenant whose head the pool refuses counts one skip;
    at guard_skips the step stops filling and records why; an own-cap refusal counts nothing."""
    from tenantry.proofs.concrete import SeqSpec, TenantSpec, build_state
    cfg = unit_config(num_blocks=3, block_size_tokens=4, max_num_seqs=3, max_context_tokens=8,
                      order=OrderConfig(policy="vtc", guard_skips=1))
    def state(skips, cap=False):  # b: least counter, its 7-token head needs 2 blocks, 1 is free
        c = attrs.evolve(cfg, tenants=(TenantConfig("a"), TenantConfig("b", kv_block_cap=2 if cap else None)))
        return c, build_state(c, [TenantSpec(counter=10.0, seqs=(SeqSpec(2, 1), SeqSpec(2, 1))),
                                  TenantSpec(counter=1.0, skips=skips, seqs=(SeqSpec(5, 2, done=1, running=True),
                                                                             SeqSpec(7, 1)))])
    c, s0 = state(0)  # a's first head goes in past b (b's count 1); its second would pass b again: stop
    s1, out = step(c, s0)
    assert [t.skips for t in s1.tenants] == [0, 1] and len(out.batch) == 2
    assert out.reserved == s0.tenants[1].queue[0].request_id and out.reserved_reason == "skips"
    c, s0 = state(1)
    s1, out = step(c, s0)
    assert out.reserved == s0.tenants[1].queue[0].request_id and out.reserved_reason == "skips"
    assert len(out.batch) == 1 and [t.skips for t in s1.tenants] == [0, 1]
    c, s0 = state(1, cap=True)  # now b's own cap refuses it: not passed over, a is served
    s1, out = step(c, s0)
    assert out.reserved is None and len(out.batch) == 2 and s1.tenants[1].skips == 1
    reqs = [R(j, "a", 0.0, prompt=1, out=2) for j in range(40)] + [R(100 + j, "b", 0.0, prompt=7, out=1)
                                                                   for j in range(10)]
    c = attrs.evolve(cfg, order=OrderConfig(policy="vtc", guard_skips=0))
    h = simulate(c, reqs)
    stops = [s for s in h.steps if s.reserved_reason == "skips"]
    assert stops and all(s.reserved is not None for s in stops)
    write_history(h, tmp_path / "h.jsonl")
    assert read_history(tmp_path / "h.jsonl").steps == h.steps
    off = simulate(attrs.evolve(cfg, order=OrderConfig(policy="vtc")), reqs)
    assert not any(s.reserved_reason for s in off.steps)
    write_history(off, tmp_path / "off.jsonl")  # off by default: the field is left out of every line
    assert '"reserved_reason":"skips"' in (tmp_path / "h.jsonl").read_text()
    assert "reserved_reason" not in (tmp_path / "off.jsonl").read_text()


def test_prefix_cache_shared_hits_across_tenants_and_salted_does_not():
    reqs = [R(0, "a", 0.0, prompt=64, out=2, prefix_ids=(1, 2, 3)), R(1, "b", 5.0, prompt=64, out=2, prefix_ids=(1, 2, 3))]
    shared = simulate(unit_config(prefix_cache="shared"), reqs)
    salted = simulate(unit_config(prefix_cache="salted"), reqs)
    assert shared.requests[1].cached_prompt_tokens == 48
    assert salted.requests[1].cached_prompt_tokens == 0


def test_step_is_pure():
    cfg = unit_config(num_blocks=6, prefix_cache="shared")
    st = initial_state(cfg)
    st, _ = step(cfg, st, StepInput(arrivals=[R(0, prompt=40, out=9, prefix_ids=(1, 2)), R(1, "b", prompt=40, out=9, prefix_ids=(1, 2))]))
    before = copy.deepcopy(st)
    refs_id = id(st.kv.refs)
    for _ in range(3):
        st2, out = step(cfg, st, StepInput(cancellations=[0]))
    assert st == before and id(st.kv.refs) == refs_id and st.kv.refs == before.kv.refs
    assert st2 != st


def test_unknown_tenant_in_workload_is_a_clear_error():
    with pytest.raises(ConfigError, match="request 0 names a tenant the configuration does not have"):
        simulate(unit_config(), [R(0, "zzz")])


@pytest.mark.parametrize("field,value", [("weight", 0), ("weight", -1.0), ("queue_bound", -1), ("kv_block_cap", 0)])
def test_tenant_config_errors_name_field_and_value(field, value):
    with pytest.raises(ConfigError) as e:
        TenantConfig("a", **{field: value})
    assert str(e.value).startswith(f"{field}={value!r}")


def test_unknown_policy_name_is_a_clear_error():
    with pytest.raises(ConfigError, match="policy='lifo': unknown; choose one of fcfs"):
        OrderConfig(policy="lifo")


# --- determinism and history files ------------------------------------------------------


def _feature_run() -> Config:
    tenants = [
        TenantConfig("a", weight=2.0, tier=0, kv_block_cap=40, queue_bound=4, token_rate_per_s=400.0, token_burst_tokens=800.0),
        TenantConfig("b", tier=1),
    ]
    return unit_config(tenants=tenants, num_blocks=48, prefix_cache="salted",
                       admission=AdmissionConfig(token_bucket=True),
                       eviction=EvictionConfig(victim="largest", max_evictions=2, cooldown_steps=1))


def test_same_inputs_give_byte_identical_history(tmp_path):
    # request 7 arrives at 4.9 and is cancelled at 6.0 (4.0, before its arrival, is refused: SPEC.md 6.1)
    wl = [R(i, "ab"[i % 3 == 0], i * 0.7, prompt=20 + 37 * i % 300, out=1 + 13 * i % 60, prefix_ids=(i % 2, 5)) for i in range(60)]
    paths = []
    for k in range(2):
        p = tmp_path / f"h{k}.jsonl"
        write_history(simulate(_feature_run(), as_workload(wl).with_cancellations([(6.0, 7)]), header={"seed": 1}), p)
        paths.append(p)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    back = read_history(paths[0])
    assert back.requests == simulate(_feature_run(), as_workload(wl).with_cancellations([(6.0, 7)])).requests


def test_a_killed_writer_leaves_the_old_file(tmp_path):
    target = tmp_path / "history.jsonl"
    target.write_text("old\n")
    child = textwrap.dedent(f"""
        import sys, time
        from tenantry.runner.files import atomic_write_text
        def lines():
            for i in range(10**6):
                if i == 1000:
                    print("midway", flush=True)
                    time.sleep(60)
                yield "x" * 100
        atomic_write_text({str(target)!r}, lines())
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "midway"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert target.read_text() == "old\n"


# --- the seed-001 experiment ------------------------------------------------------------------


@pytest.fixture(scope="module")
def seed001():
    wl = seed001_workload(seed=9)
    base = seed001_config(wl.tenants)
    out = {}
    for name in ("fcfs", "rate_limit", "vtc"):
        cfg = apply_setup(base, name)
        h = simulate(cfg, wl, horizon_s=900.0, record_steps=False)
        out[name] = {r["tenant"]: r for r in tenant_table(h, window_s=300.0, w_in=1.0, w_out=2.0)}
    return out


def test_seed001_fcfs_makes_chat_wait_50x_longer_than_vtc(seed001):
    fcfs, vtc = seed001["fcfs"]["chat"]["ttft_p95_s"], seed001["vtc"]["chat"]["ttft_p95_s"]
    assert vtc < 1.0
    assert fcfs >= 50 * vtc


def test_seed001_vtc_keeps_total_weighted_throughput_within_5_percent_of_fcfs(seed001):
    total = lambda name: sum(r["weighted_tokens_per_s"] for r in seed001[name].values())
    assert total("vtc") == pytest.approx(total("fcfs"), rel=0.05)
    assert total("rate_limit") < 0.8 * total("fcfs")  # the rate limit turns work away while capacity is free


def test_seed001_rate_limit_rejects_a_large_share_of_app(seed001):
    app = seed001["rate_limit"]["app"]
    assert app["rejected"] / app["sent"] >= 0.25
    assert seed001["rate_limit"]["chat"]["rejected"] == 0
    assert seed001["fcfs"]["app"]["rejected"] == 0


def test_history_lines_follow_the_published_json_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    import json
    from pathlib import Path

    schema = json.loads((REPO / "spec" / "history_schema.json").read_text())
    p = tmp_path / "h.jsonl"
    write_history(simulate(_feature_run(), [R(i, "ab"[i % 2], i * 0.5, prompt=30, out=5) for i in range(12)]), p)
    lines = [json.loads(l) for l in p.read_text().splitlines()]
    assert {l["kind"] for l in lines} == {"header", "step", "request"}
    for line in lines:
        jsonschema.validate(line, schema)
    bad = dict(lines[-1], surprise=1)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_a_step_line_is_written_byte_for_byte():
    """The step line's exact text: keys sorted as strings (request 10 before request 9 in
    ``held`` and ``block_ids``), tuples as lists, optional fields at their default left out,
    events as objects; a step record written without the generic walk (the fast path of the
    history writer) must give these bytes."""
    from tenantry.runner.history import History, StepEvent, StepRecord, history_lines

    full = StepRecord(3, 1.5, 0.25, ((9, 1), (10, 16)), (7,), (9, 10), {"b": 0, "a": 2}, {"b": 1, "a": 3}, 12,
                      {"b": 0.5, "a": 1.0}, {"b": 0.0, "a": 0.0}, {"b": 2.0, "a": 1.0}, {"b": 0.25, "a": 0.0},
                      (StepEvent("preempted", 7, blocks=2), StepEvent("first_token", 9)), 4, {9: 1, 10: 3},
                      {9: ("p9:0",), 10: ("s:ab", "p10:1")}, 11, "skips", 1)
    bare = StepRecord(0, 0.0, 0.1, (), (), (), {"a": 0}, {"a": 0}, 10, {"a": 0.0}, {"a": 0.0}, {"a": 0.0}, {"a": 0.0})
    lines = list(history_lines(History({}, (full, bare), ())))
    assert lines[1] == (
        '{"batch":[[9,1],[10,16]],"block_ids":{"10":["s:ab","p10:1"],"9":["p9:0"]},"block_seconds":{"a":0.0,"b":0.25},'
        '"blocks_in_use":{"a":3,"b":1},"counters":{"a":1.0,"b":0.5},"deficits":{"a":0.0,"b":0.0},"duration_s":0.25,'
        '"events":[{"blocks":2,"kind":"preempted","request_id":7},{"kind":"first_token","request_id":9}],'
        '"free_blocks":12,"held":{"10":3,"9":1},"kind":"step","preempted":[7],"queued":{"a":2,"b":0},"replica":1,'
        '"reserved":11,"reserved_reason":"skips","running":[9,10],"service":{"a":1.0,"b":2.0},"start_s":1.5,'
        '"step_index":3,"used_blocks":4}')
    assert lines[2] == ('{"batch":[],"block_seconds":{"a":0.0},"blocks_in_use":{"a":0},"counters":{"a":0.0},'
                        '"deficits":{"a":0.0},"duration_s":0.1,"free_blocks":10,"kind":"step","preempted":[],'
                        '"queued":{"a":0},"running":[],"service":{"a":0.0},"start_s":0.0,"step_index":0}')


def test_cancel_s_before_arrival_is_refused_and_at_the_arrival_step_is_applied_at_the_next():
    """SPEC.md 5.1 / 6.1: a cancellation before the arrival is an error; one due at the
    arrival's own step is delivered at the next step (applied before the arrival, it would find
    nothing and the cancelled request would run to the end)."""
    with pytest.raises(ConfigError) as e:
        R(1, t=2.5, cancel_s=1.0)
    assert e.value.field == "cancel_s" and "before the arrival_s of request 1 (2.5)" in str(e.value)
    cfg = unit_config()  # steps of 1 s: the arrival at 0.5 is delivered to the step starting at 1.0
    h = simulate(cfg, [R(0, out=20), R(1, t=0.5, cancel_s=0.5), R(2, t=0.5, cancel_s=0.9), R(3, t=0.5, cancel_s=1.5)])
    assert [r.outcome for r in h.requests] == ["finished", "cancelled", "cancelled", "cancelled"]
    assert [r.finish_s for r in h.requests[1:]] == [2.0, 2.0, 2.0]  # each at the step after its arrival's (1.0)


def test_prefix_ids_past_the_prompts_full_blocks_are_ignored():
    """SPEC.md 4.6 / 6.1: ids past floor(prompt / B) are not an error and change nothing."""
    cfg = attrs.evolve(unit_config(), prefix_cache="shared")
    def run(ids):
        h = simulate(cfg, [R(0, prompt=40, out=3, prefix_ids=ids[0]), R(1, "b", t=5.0, prompt=40, out=3,
                                                                         prefix_ids=ids[1])])
        return [(r.outcome, r.first_token_s, r.finish_s) for r in h.requests], [s.batch for s in h.steps]
    exact = run(((1, 2), (1, 2)))  # 40 tokens, B = 16: two full blocks
    assert run(((1, 2, 3, 4, 5), (1, 2, 9))) == exact and run(((1, 2), (1, 2, 7, 8))) == exact
    assert run(((1, 9), (1, 2))) != exact  # the ids within the full blocks do matter (the reuse)


def test_idle_keeps_every_field_of_the_state_but_the_clock():
    """idle builds the waiting state field by field (faster than attrs.evolve): every field that
    __init__ takes, a new one included, is kept, only t_s moves."""
    from tenantry.model.state import State

    fields = [a for a in attrs.fields(State) if a.init]
    values = {a.name: object() for a in fields}
    values["t_s"] = 1.0
    quiet = idle(default_config(["a"]), State(**values), 2.0)
    assert {a.name: getattr(quiet, a.name) for a in fields} == {**values, "t_s": 2.0}
