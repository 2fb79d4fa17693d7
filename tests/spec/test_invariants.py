"""The invariant catalog (spec/invariants*.py): every invariant passes on the model
in the configuration where its mutant is caught, findings render to one
sentence, history forms judge a history read back from disk, and claims
select what is checked."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings, strategies as st

from tenantry.model.config import AdmissionConfig, Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.workload import Request
from tenantry.runner.history import read_history, write_history
from tenantry.runner.simulate import simulate
from tenantry.spec.invariants import (
    INVARIANTS, Finding, check_history, check_pair, config_from_dict, relabel_contents, unknown_without_steps,
)
from tenantry.spec.invariants_core import ample_kv, dedup, largest_charge
from tenantry.spec.invariants_run import run_checked
from tenantry.testing.mutants import MUTANTS
from tenantry.testing.strategies import workloads

KILLERS = {k: m for m in MUTANTS.values() for k in m.killers}


def test_every_invariant_has_a_mutant_and_a_documented_form():
    assert set(KILLERS) == set(INVARIANTS)
    for inv in INVARIANTS.values():
        assert inv.forms, inv.id
        assert inv.spec.startswith("7."), inv.id
        for f in (inv.check_state, inv.check_history, inv.check_pair):
            if f is not None and not f.__name__ == "<lambda>":
                assert inv.id in (f.__doc__ or ""), (inv.id, f.__name__)


@pytest.mark.parametrize("inv_id", sorted(INVARIANTS))
@given(data=st.data())
def test_invariant_holds_on_the_model(inv_id, data):
    """The model passes each invariant on the workloads that kill its mutant."""
    m = KILLERS[inv_id]
    cfg = m.config
    assert INVARIANTS[inv_id].applies(cfg)
    wl = data.draw(workloads(cfg, **m.shape), label="workload")
    if inv_id in ("DETERMINISM", "NONINTERFERENCE"):
        a = run_checked(cfg, wl, max_steps=300, ids=()).history
        other = wl if inv_id == "DETERMINISM" else relabel_contents(wl, "b", 1 << 20)
        b = run_checked(cfg, other, max_steps=300, ids=()).history
        found = check_pair(inv_id, a, b, **({} if inv_id == "DETERMINISM" else {"observer": "a"}))
    else:
        found = run_checked(cfg, wl, max_steps=300, ids=(inv_id,)).findings
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize(("mutant", "inv_id"), [(m.name, k) for m in MUTANTS.values() for k in m.killers
                                                if k not in ("DETERMINISM", "NONINTERFERENCE")])
@settings(max_examples=15)
@given(data=st.data())
def test_clean_model_passes_each_mutants_killer_on_its_config(mutant, inv_id, data):
    """The clean model on every mutant's configuration and workload shape passes the
    invariants that kill that mutant (above, one mutant per invariant gets the full profile)."""
    m = MUTANTS[mutant]
    wl = data.draw(workloads(m.config, **m.shape), label="workload")
    found = run_checked(m.config, wl, max_steps=300, ids=(inv_id,)).findings
    assert not found, "\n".join(map(str, found))


def test_finding_renders_one_line_and_round_trips_as_json():
    f = Finding("KV-CAP", 7, ("a",), (3, 4), 13, 12, "a tenant's sequences hold more blocks than its cap")
    assert f.render() == str(f) == ("KV-CAP step 7 tenant a requests 3, 4: a tenant's sequences hold more blocks "
                                    "than its cap (observed 13, allowed 12)")
    assert str(Finding("DETERMINISM", None, message="x", observed=1.5, allowed=2, call="plan_step")) == (
        "DETERMINISM whole run call plan_step: x (observed 1.5, allowed 2)")
    assert Finding.from_json(f.to_json()) == f


def test_dedup_folds_repeats_into_the_first_with_a_count():
    a = [Finding("KV-CONSERVE", k, (), (), 1, 0, "leak") for k in (3, 4, 5)]
    b = Finding("NO-LOSS", 4, ("t",), (9,), 0, 1, "lost")
    out = dedup(a + [b, Finding("NO-LOSS", 6, ("t",), (9,), 0, 1, "lost")])
    assert [(f.invariant, f.step, f.count) for f in out] == [("KV-CONSERVE", 3, 3), ("NO-LOSS", 4, 2)]
    assert out[0].render().endswith("[3 times from this step on]")


def _cap_mutant_history():
    m = MUTANTS["no_tenant_kv_cap"]
    reqs = [Request(0, "a", 0.0, 200, 4), Request(1, "b", 0.0, 20, 2)]
    return m.config, simulate(m.config, reqs, variant=m.variant)


def test_history_form_judges_a_history_read_back(tmp_path):
    cfg, h = _cap_mutant_history()
    found = check_history(h, cfg)
    assert [(f.invariant, f.tenants, f.observed, f.allowed) for f in found][:1] == [("KV-CAP", ("a",), 8, 6)]  # 128 of 200 prompt tokens after two 64-token chunks
    write_history(h, tmp_path / "h.jsonl")
    back = read_history(tmp_path / "h.jsonl")
    assert check_history(back) == found  # configuration read from the header
    assert config_from_dict(back.header["config"]) == cfg


def test_claims_select_the_claimed_invariants():
    cfg, h = _cap_mutant_history()

    class Claims:
        config = cfg

        @staticmethod
        def claimed():
            return {"VTC-GAP"}

    assert [f.invariant for f in check_history(h, Claims())][:1] == ["KV-CAP"]  # safety: always checked
    assert check_history(h, cfg, ids=("VTC-GAP", "NO-LOSS")) == []


def test_largest_charge_is_the_paper_constant_when_w_in_le_w_out():
    """D = max(w_in L, w_out M) for w_in <= w_out (Sheng et al., Theorem 4.4's constant)."""
    cfg = Config((TenantConfig("a"),), num_blocks=4096, max_num_seqs=8, max_context_tokens=1024,
                 order=OrderConfig(w_in=1.0, w_out=2.0))
    assert largest_charge(cfg, 1000, 1024) == 2.0 * 8 * 1024
    hi_in = Config((TenantConfig("a"),), num_blocks=4096, max_num_seqs=1, max_context_tokens=100,
                   order=OrderConfig(w_in=3.0, w_out=1.0))
    # w_in > w_out: min(w_in L + w_out M, w_in M) = min(3*99 + 100, 300) = 300, above max(297, 100).
    assert largest_charge(hi_in) == 300.0


def test_ample_kv_is_the_pool_never_binding():
    base = dict(tenants=(TenantConfig("a"),), max_num_seqs=4, max_context_tokens=512)
    assert ample_kv(Config(num_blocks=128, **base))
    assert not ample_kv(Config(num_blocks=127, **base))
    capped = Config(tenants=(TenantConfig("a", kv_block_cap=10),), num_blocks=1000, max_num_seqs=4,
                    max_context_tokens=512)
    assert not ample_kv(capped) and not INVARIANTS["VTC-GAP"].applies(capped)
    slots = Config(tenants=(TenantConfig("a", max_running_seqs=1),), num_blocks=1000, max_num_seqs=4,
                   max_context_tokens=512)
    assert not ample_kv(slots) and ample_kv(attrs.evolve(slots, admission=AdmissionConfig(slot_cap=False)))
    # Strict tiers over two tiers: the lower lane waits whatever its counter (CI's stateful run once
    # called FLOOR broken under floors + strict tiers); over one tier the order is the policy's.
    two = Config(tenants=(TenantConfig("a", tier=1), TenantConfig("b", tier=0)), num_blocks=128, max_num_seqs=4,
                 max_context_tokens=512, order=OrderConfig(policy="floors", tier_floors=(0.6, 0.4)))
    assert ample_kv(two) and INVARIANTS["FLOOR"].applies(two)
    lanes = attrs.evolve(two, order=attrs.evolve(two.order, strict_tiers=True))
    assert not ample_kv(lanes) and not INVARIANTS["FLOOR"].applies(lanes)
    one = attrs.evolve(lanes, tenants=(TenantConfig("a"), TenantConfig("b")))
    assert ample_kv(one)


def test_vtc_gap_bound_without_the_last_left_lift_is_exceeded():
    """Regression for the lift fix: a tenant idle while another is served alone,
    which rejoins first, used to start with its old counter (gap 1568 > D = 800)."""
    cfg = Config((TenantConfig("a"), TenantConfig("b")), num_blocks=1000, max_num_seqs=2, token_budget=64,
                 max_context_tokens=200, cost=CostConfig(mode="unit", unit_step_s=1.0))
    reqs = [Request(i, "a", float(3 * i), 30, 2) for i in range(50)]
    reqs += [Request(100 + i, "b", 151.0, 30, 2) for i in range(10)]
    reqs += [Request(200 + i, "a", 153.0, 30, 2) for i in range(10)]
    run = run_checked(cfg, reqs)
    assert run.findings == ()
    gaps = [f.observed for f in run_checked(cfg, reqs, ids=("VTC-GAP",), variant=MUTANTS["vtc_no_lift"].variant).findings]
    assert largest_charge(cfg) == 800.0
    assert max(gaps) == 1568.0


@pytest.mark.parametrize(("policy", "waits"), [("priority", (50.0, 100.0)), ("aging", (1.0, 1.0))])
def test_strict_priority_starves_and_aging_does_not(policy, waits):
    """A tier-1 request at t=0 under a sustained tier-0 flood (one slot, one step
    per request): under strict priority it waits as long as the flood lasts; under
    aging (1 tier per second of waiting) its wait does not depend on the flood."""
    cfg = Config((TenantConfig("hi", tier=0), TenantConfig("lo", tier=1)), num_blocks=64, max_num_seqs=1,
                 token_budget=64, max_context_tokens=64, order=OrderConfig(policy=policy, aging_rate_per_s=1.0),
                 cost=CostConfig(mode="unit", unit_step_s=1.0))
    got = []
    for flood_s in (50, 100):
        reqs = [Request(0, "hi", 0.0, 16, 1), Request(1, "lo", 0.0, 16, 1)]
        reqs += [Request(2 + i, "hi", float(i), 16, 1) for i in range(1, flood_s)]
        h = simulate(cfg, reqs)
        got.append(h.requests[1].first_scheduled_s)
        if policy == "priority":  # judged as if it claimed aging: overtaken by later tier-0 arrivals
            aging = attrs.evolve(cfg, order=OrderConfig(policy="aging", aging_rate_per_s=1.0))
            assert any(f.invariant == "AGING" for f in check_history(h, aging, ids=("AGING",)))
        else:
            assert check_history(h, cfg) == []
    assert tuple(got) == waits


def test_aging_ties_in_effective_tier_go_to_the_older_head_whatever_the_clock():
    """Two heads with the same effective tier in real arithmetic (tier 0 queued at 10 s, tier 1 at
    0 s, 0.1 tier per second): aging picks the older one at every step start.  The effective tier
    computed with the clock, ``tier - rate * (t_s - arrival_s)``, rounds the tie away at some
    starts (at 20.73 s the younger tier-0 head would win by 2e-16)."""
    from tenantry.model.state import initial_state
    from tenantry.model.step import Step

    cfg = Config((TenantConfig("hi", tier=0), TenantConfig("lo", tier=1)), num_blocks=64, max_num_seqs=1,
                 token_budget=64, max_context_tokens=64, order=OrderConfig(policy="aging", aging_rate_per_s=0.1),
                 cost=CostConfig(mode="unit", unit_step_s=1.0))
    assert 0 - 0.1 * (20.73 - 10.0) < 1 - 0.1 * (20.73 - 0.0)  # the rounding the clock-free key avoids
    picks = {}
    for t_s in (10.74, 20.73, 31.1):  # both queued, the pick planned at a step starting at t_s
        s = Step(cfg, attrs.evolve(initial_state(cfg), t_s=t_s))
        s.arrive(Request(1, "lo", 0.0, 16, 1))
        s.arrive(Request(2, "hi", 10.0, 16, 1))
        picks[t_s] = cfg.tenants[s.policy.select(s._view(set(s.backlogged)))].name
    assert picks == {10.74: "lo", 20.73: "lo", 31.1: "lo"}


def test_token_bucket_history_form_counts_the_refund_of_a_reservation_taken_before_the_window():
    """With ``reserve_output``, a request admitted at 0 s reserves 999 output tokens and waits (b holds
    the one slot); 490 prompt tokens are admitted at 5.01 s, the waiting request is cancelled at 5.06 s
    (its 999 come back) and 990 more are admitted at 5.07 s: 1,480 prompt tokens in 0.06 s, legal.
    The history form once judged prompts alone against burst + rate x window and flagged the
    model here (the state form passed); refunds in the window now count against them."""
    cfg = Config((TenantConfig("a", token_rate_per_s=100.0, token_burst_tokens=1000.0), TenantConfig("b")),
                 num_blocks=1000, max_num_seqs=1, token_budget=2048, max_context_tokens=4096,
                 admission=AdmissionConfig(token_bucket=True, reserve_output=True),
                 cost=CostConfig(mode="unit", unit_step_s=0.01))
    wl = [Request(9, "b", 0.0, 1, 3000), Request(0, "a", 0.001, 1, 999, cancel_s=5.05), Request(1, "a", 5.0, 490, 1),
          Request(2, "a", 5.06, 990, 1)]
    run = run_checked(cfg, wl, depth="state")
    assert [r.admitted_step is not None for r in run.history.requests] == [True, True, True, True]  # all admitted
    assert run.findings == ()
    cheat = attrs.evolve(run.history, requests=tuple(attrs.evolve(r, outcome="unfinished", finish_s=None)
                                                     if r.request_id == 0 else r for r in run.history.requests))
    got = check_history(cheat, cfg, ids=("TOKEN-BUCKET",))  # without the refund the 990 could not have come in
    assert [f.invariant for f in got] == ["TOKEN-BUCKET"] and got[0].observed == 1480 - 100.0 * 0.06  # less rate x window


def _worst_gap_ratio(history, cfg, policy):
    """Largest (normalised service gap growth over an interval) / (its bound), over tenant pairs."""
    from tenantry.spec.invariants_history import HistoryContext
    from tenantry.spec.invariants_history_fair import _runs

    h = HistoryContext(history, cfg)
    d, q = h.charge_bound, cfg.order.drr_quantum
    worst = 0.0
    names = [t.name for t in cfg.tenants]
    for ia, a in enumerate(names):
        for b in names[ia + 1:]:
            wa, wb = h.weight(a), h.weight(b)
            bound = d / wa + d / wb + (2 * q if policy == "drr_tokens" else 0.0)
            for run in _runs(h, {a}, {b}):
                xs = [h.steps[pos].service[a] / wa - h.steps[pos].service[b] / wb for pos in run]
                worst = max(worst, (max(xs) - min(xs)) / bound)
    return worst


@pytest.mark.parametrize("policy", ["vtc", "drr_tokens", "floors", "aging"])
def test_fairness_bounds_hold_when_pushed(policy):
    """Workloads steered (hypothesis.target) towards the largest gap/bound ratio:
    every applicable invariant still holds, and the ratio stays <= 1."""
    from hypothesis import target

    tenants = (TenantConfig("a", weight=1.0, tier=0), TenantConfig("b", weight=2.0, tier=1),
               TenantConfig("c", weight=0.5, tier=1))
    cfg = Config(tenants, num_blocks=2 * 6, max_num_seqs=2, token_budget=32, max_context_tokens=96,
                 order=OrderConfig(policy=policy, drr_quantum=32.0, drr_carry_bound=None, tier_floors=(0.7, 0.3),
                                   aging_rate_per_s=5.0),
                 cost=CostConfig(mode="unit", unit_step_s=0.01))
    assert ample_kv(cfg)

    @settings(max_examples=max(10, settings.default.max_examples // 2))
    @given(workloads(cfg, max_requests=14, long_outputs=True, idle_gaps=True))
    def pushed(wl):
        run = run_checked(cfg, wl, max_steps=600)
        assert run.findings == (), "\n".join(map(str, run.findings))
        if policy in ("vtc", "drr_tokens"):
            ratio = _worst_gap_ratio(run.history, cfg, policy)
            target(ratio, label="gap / bound")
            assert ratio <= 1.0

    pushed()


def test_history_forms_of_the_gap_bounds_bite():
    """VTC-GAP and FLOOR judged on histories alone: the no-lift mutant's rejoin lets
    the idle tenant catch up far past 2D; strict priority sold as floors starves tier 1."""
    cfg = Config((TenantConfig("a"), TenantConfig("b")), num_blocks=1000, max_num_seqs=2, token_budget=64,
                 max_context_tokens=200, cost=CostConfig(mode="unit", unit_step_s=1.0))
    reqs = [Request(i, "a", float(3 * i), 30, 2) for i in range(50)]
    reqs += [Request(100 + i, "b", 151.0, 30, 2) for i in range(30)]
    reqs += [Request(200 + i, "a", 153.0, 30, 2) for i in range(10)]
    h = simulate(cfg, reqs, variant=MUTANTS["vtc_no_lift"].variant)
    found = check_history(h, cfg, ids=("VTC-GAP",))
    counter, service = found[0], found[-1]  # the recorded counters break first, then the service gap
    assert "counter ran ahead" in counter.message and counter.allowed == 128.0  # D / w = 128
    assert "service gap" in service.message and service.allowed == 256.0 and service.tenants == ("a", "b")  # 2 D
    assert check_history(simulate(cfg, reqs), cfg) == []
    no_counters = attrs.evolve(h, steps=tuple(attrs.evolve(s, counters={}) for s in h.steps))
    assert [f.allowed for f in check_history(no_counters, cfg, ids=("VTC-GAP",))] == [256.0]  # service alone

    floors = Config((TenantConfig("hi", tier=0), TenantConfig("lo", tier=1)), num_blocks=64, max_num_seqs=1,
                    token_budget=64, max_context_tokens=64, order=OrderConfig(policy="floors", tier_floors=(0.5, 0.5)),
                    cost=CostConfig(mode="unit", unit_step_s=1.0))
    flood = [Request(i, "hi", float(i), 16, 4) for i in range(60)] + [Request(100 + i, "lo", 0.0, 16, 4)
                                                                      for i in range(10)]
    starved = simulate(floors, flood, variant=MUTANTS["floors_strict_priority"].variant)
    found = check_history(starved, floors, ids=("FLOOR",))
    assert found and found[0].allowed == 2 * 2.0 * 20 / 0.5  # D = w_out * M = 2 * (1 slot * 20 tokens)
    assert check_history(simulate(floors, flood), floors) == []


def test_history_forms_of_admission_and_records_bite():
    """TOKEN-BUCKET on a history whose scheduler enforced no bucket, judged against a
    claimed bucket; NO-LOSS on an incoherent record."""
    free = Config((TenantConfig("a", token_rate_per_s=10.0, token_burst_tokens=100.0),), num_blocks=64,
                  max_num_seqs=4, token_budget=64, max_context_tokens=128, cost=CostConfig(mode="unit", unit_step_s=1.0))
    h = simulate(free, [Request(i, "a", 0.0, 40, 1) for i in range(4)])
    claimed = attrs.evolve(free, admission=attrs.evolve(free.admission, token_bucket=True))
    found = check_history(h, claimed, ids=("TOKEN-BUCKET",))
    assert [(f.observed, f.allowed) for f in found] == [(120.0, 100.0)]  # 3 x 40 admitted at t = 0
    bad = attrs.evolve(h, requests=(attrs.evolve(h.requests[0], tokens_generated=0),) + h.requests[1:])
    assert [f.message for f in check_history(bad, free, ids=("NO-LOSS",))] == [
        "request record incoherent: finished without producing all its tokens"]


def test_a_history_without_steps_says_which_checks_are_unknown():
    cfg, h = _cap_mutant_history()
    records_only = attrs.evolve(h, steps=())
    assert check_history(records_only, cfg) == []  # KV-CAP needs snapshots: nothing to judge
    unknown = unknown_without_steps(records_only, cfg)
    assert "KV-CAP" in unknown and "NO-LOSS" not in unknown and "VTC-GAP" not in unknown  # VTC-GAP: not vtc
    assert unknown_without_steps(h, cfg) == []


# --- block_reads: incremental, against checking every held position every step ------------------


def _block_reads_every_position(h):
    """The oracle: block_reads as first written (every held position of every request, every step)."""
    from tenantry.spec.invariants_history_blocks import _key

    cfg, B, out = h.config, h.config.block_size_tokens, []
    salt = {t.name: (t.salt if cfg.prefix_cache == "salted" else None) for t in cfg.tenants}
    writer, keys, bad = {}, {}, set()
    for v in h.views:
        s, k = v.record, v.record.step_index
        if not s.block_ids:
            continue
        entered = {e.request_id: e.tokens for e in s.events if e.kind == "scheduled"}
        held = [(rid, c, s.block_ids.get(rid), h.requests.get(rid))
                for rid, c in (*v.running.items(), *v.finished.items())]
        for rid, c, ids, r in held:
            if ids and r is not None:
                start = entered[rid] // B if rid in entered else v.before.get(rid, (0, 0))[0] // B
                for j in range(start, min(cfg.blocks_for(c), len(ids))):
                    writer[ids[j]] = (salt.get(r.tenant), _key(keys, r, j), r.tenant, rid)
        for rid, c, ids, r in held:
            if not ids or r is None or rid in bad:
                continue
            for j in range(min(cfg.blocks_for(c), len(ids))):
                w = writer.get(ids[j])
                if w is None:
                    writer[ids[j]] = (salt.get(r.tenant), _key(keys, r, j), r.tenant, rid)
                elif w[0] != salt.get(r.tenant) or w[1] != _key(keys, r, j):
                    out.append((k, rid, j, ids[j], w))
                    bad.add(rid)
                    break
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_block_reads_checking_what_changed_equals_checking_every_position(data):
    """block_reads checks only new, changed and rewritten positions (cost follows what changed);
    on runs with a prefix cache, with the salt ignored (a mutant) and with block ids corrupted
    (another request's, another step's, one id swapped, none, or none while another request
    holds them, over a few steps) it finds exactly what
    checking every held position of every request at every step finds."""
    from tenantry.spec.invariants_history import HistoryContext
    from tenantry.spec.invariants_history_blocks import block_reads
    from tenantry.testing.strategies import configs

    cfg = attrs.evolve(data.draw(configs(lanes=False)), prefix_cache=data.draw(st.sampled_from(("shared", "salted"))))
    wl = data.draw(workloads(cfg, max_requests=14, long_outputs=True, shared_prefixes=True, cancels=True))
    variant = data.draw(st.sampled_from((None, MUTANTS["salt_ignored"].variant)))
    h = simulate(cfg, wl, detail=True, max_steps=600, variant=variant)
    steps = list(h.steps)
    for _ in range(data.draw(st.integers(0, 4))):
        with_ids = [i for i, s in enumerate(steps) if s.block_ids]
        if not with_ids:
            break
        i = data.draw(st.sampled_from(with_ids))
        ids = dict(steps[i].block_ids)
        a, b = data.draw(st.sampled_from(sorted(ids))), data.draw(st.sampled_from(sorted(ids)))
        other = steps[data.draw(st.sampled_from(with_ids))].block_ids
        c = data.draw(st.sampled_from(sorted(other)))
        bad = data.draw(st.sampled_from((ids[b], other[c], ids[a][:1] + ids[b][1:], ids[a][::-1], None, "take")))
        for k in range(i, min(len(steps), i + data.draw(st.integers(1, 20)))):
            if steps[k].block_ids and a in steps[k].block_ids:
                d = dict(steps[k].block_ids)
                if bad == "take" and b in d and b != a:  # b holds a's blocks while a shows none: b's
                    d[b] = (d[a] + d[b][len(d[a]):])[:len(d[b])]  # writes there count when a shows them again
                if bad is None or bad == "take":  # no ids for a few steps: not checked there
                    del d[a]
                else:
                    d[a] = (bad + d[a][len(bad):])[:len(d[a])]
                steps[k] = attrs.evolve(steps[k], block_ids=d or None)
    ctx = HistoryContext(attrs.evolve(h, steps=tuple(steps)), cfg)
    assert block_reads(ctx) == _block_reads_every_position(ctx)


def test_a_block_rewritten_while_its_holder_shows_no_ids_is_found_when_it_shows_them_again():
    """Request 0 shows no block ids for ten steps while request 1 holds (and writes into) request 0's
    blocks; when request 0 shows its ids again, the block request 1 overwrote is a bad read,
    although nothing was written into it in that step (the rewrite is remembered, not re-read)."""
    from tenantry.spec.invariants_history import HistoryContext
    from tenantry.spec.invariants_history_blocks import block_reads

    cfg = Config(tenants=(TenantConfig("a"), TenantConfig("b")), num_blocks=64, max_num_seqs=2, token_budget=256,
                 max_context_tokens=512, cost=CostConfig(mode="unit", unit_step_s=0.01), prefix_cache="shared")
    h = simulate(cfg, [Request(0, "a", 0.0, 64, 60), Request(1, "b", 0.0, 64, 60)], detail=True)
    steps = list(h.steps)
    for k in range(10, 20):
        d = dict(steps[k].block_ids)
        d[1] = (d[0] + d[1][len(d[0]):])[:len(d[1])]
        del d[0]
        steps[k] = attrs.evolve(steps[k], block_ids=d)
    ctx = HistoryContext(attrs.evolve(h, steps=tuple(steps)), cfg)
    reads = block_reads(ctx)
    assert reads == _block_reads_every_position(ctx)
    assert [(k, rid, w[3]) for k, rid, _, _, w in reads] == [(10, 1, 0), (steps[20].step_index, 0, 1)]


def test_determinism_tells_an_int_from_an_equal_float_and_zero_from_minus_zero():
    """Two histories equal as Python values but not as bytes (1 against 1.0, 0.0 against -0.0)
    break DETERMINISM: the fast path compares reprs, which keep the type, not ==."""
    a = simulate(Config(tenants=(TenantConfig("a"),), cost=CostConfig(mode="unit", unit_step_s=0.01)),
                 [Request(0, "a", 0.0, 16, 3)])
    s = a.steps[0]
    for changed in ({"free_blocks": float(s.free_blocks)}, {"start_s": -0.0}):
        b = attrs.evolve(a, steps=(attrs.evolve(s, **changed),) + a.steps[1:])
        assert b == a  # equal values, other bytes
        (f,) = check_pair("DETERMINISM", a, b)
        assert "differ first at line 2" in f.message
    assert check_pair("DETERMINISM", a, attrs.evolve(a)) == []


def test_a_check_that_raises_is_a_finding_naming_it_not_the_end_of_the_run(monkeypatch):
    """A check that raises (a tenantry bug, or records it does not expect) gives one CHECK-RAISED
    finding naming the invariant and the error; the other checks still judge the run."""
    from tenantry.model.routers import FleetConfig
    from tenantry.spec import invariants_fleet as IF
    from tenantry.spec.invariants import CHECK_RAISED
    from tenantry.spec.invariants_run import run_fleet_checked

    def boom(*_a, **_k):
        raise IndexError("list index out of range")

    cfg = KILLERS["KV-CAP"].config
    wl = [Request(i, t, 0.01 * i, 40, 4) for i, t in enumerate(("a", "b") * 3)]
    for form in ("check_state", "check_history", "check_pair"):
        inv_id = "DETERMINISM" if form == "check_pair" else "KV-CAP"
        monkeypatch.setitem(INVARIANTS, inv_id, attrs.evolve(INVARIANTS[inv_id], **{form: boom}))
        run = run_checked(cfg, wl, depth="full", max_steps=300)
        raised = [f for f in run.findings if f.invariant == CHECK_RAISED]
        assert len(raised) == 1, (form, [str(f) for f in run.findings])
        assert f"the {inv_id} check raised IndexError: list index out of range" in raised[0].message
        assert (raised[0].step is not None) == (form == "check_state"), form
        assert "NO-LOSS" in run.coverage and run.coverage["NO-LOSS"].startswith("checked")
        monkeypatch.undo()
    gap = IF.FLEET_INVARIANTS["FLEET-NO-LOSS"]
    for form in ("check", "check_state"):
        monkeypatch.setitem(IF.FLEET_INVARIANTS, gap.id, attrs.evolve(gap, **{form: boom}))
        run = run_fleet_checked(FleetConfig((cfg, cfg)), wl, depth="state", max_steps=300)
        assert [f.message.split(",")[0] for f in run.findings if f.invariant == CHECK_RAISED] == [
            "the FLEET-NO-LOSS check raised IndexError: list index out of range"], form
        monkeypatch.undo()
