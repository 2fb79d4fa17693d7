"""One definition per invariant (issue 30, SPEC.md 7): where a record form judges step by
step, the state form is that judgement run on one step of the model, the walk of the
records starting from the state before the step; the catalog says why a state form is
more than that, and SPEC.md's table of state forms is the registry; the record forms
that took over the state forms' statements judge what those judged."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings, strategies as st

from tenantry.model import policies
from tenantry.model.config import Config, CostConfig, EvictionConfig, OrderConfig, TenantConfig
from tenantry.model.step import Step
from tenantry.model.workload import Request
from tenantry.runner.history import History, StepRecord
from tenantry.runner.simulate import Recorder, config_to_dict, run_steps, simulate
from tenantry.spec.invariants import INVARIANTS, check_history, check_state, coverage
from tenantry.spec.invariants_history import HistoryContext
from tenantry.spec.invariants_state import StepContext
from tenantry.testing.mutants import MUTANTS
from tenantry.testing.strategies import workloads
from conftest import REPO

SPEC = REPO / "spec" / "SPEC.md"
_UNIT = CostConfig(mode="unit", unit_step_s=1.0)

#: Mutants whose configurations and workload shapes exercise every part of a step view: cancellations,
#: preemptions and cooldowns, prefix-cache hits, slot caps, queue bounds, refusals, counters and deficits.
VIEW_CASES = ("cancel_leaks_blocks", "victim_oldest", "evict_no_cooldown", "salt_ignored", "no_slot_cap",
              "queue_bound_off_by_one", "vtc_no_lift", "drr_no_idle_reset", "evict_max_off_by_one")
FIELDS = ("before", "running", "finished", "waiting", "fresh", "heads", "produced", "first", "answers",
          "cancelled", "entries", "evictions")


@pytest.mark.parametrize("mutant", VIEW_CASES)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_a_derived_state_form_sees_the_view_its_record_form_sees(mutant, data):
    """On the model's own runs, the view a derived state form judges for step k (the walk of
    step k's record started from the state before it, a waiting request made a record only
    when the step touches it) is the record form's view of step k in the recorded history,
    field by field, and the view before it is the record form's view of step k - 1."""
    cfg = MUTANTS[mutant].config
    wl = data.draw(workloads(cfg, **MUTANTS[mutant].shape), label="workload")
    rec, trs = Recorder(cfg, True, detail=True), []
    for r in wl.requests:
        rec.offered(r)
    for tr in run_steps(cfg, wl, max_steps=150):
        rec.observe(tr.state, tr.output)
        trs.append(tr)
    if not trs:
        return
    h = HistoryContext(rec.history(trs[-1].state, {"config": config_to_dict(cfg)}), cfg)
    for k, tr in enumerate(trs):
        one = StepContext(cfg, tr.prev, tr.inputs, tr.state, tr.output).history
        mine, theirs = one.views[0], h.views[k]
        assert mine.record == theirs.record
        for name in FIELDS:
            assert getattr(mine, name) == getattr(theirs, name), (k, name)
        assert list(mine.waiting) == list(theirs.waiting), k  # tenants in the same order
        assert one.replay.anomalies == []
        if k:
            before = h.views[k - 1]
            assert (one.start.waiting, one.start.fresh, one.start.running) == (
                before.waiting, before.fresh, before.running), k
            assert (one.start.record.counters, one.start.record.queued) == (before.record.counters,
                                                                           before.record.queued), k


def _state_forms_table() -> dict[str, tuple[str, str]]:
    text = SPEC.read_text()
    i = text.index("| id | state form | what it judges that no record carries (why) |")
    rows = {}
    for line in text[i:].splitlines()[2:]:
        if not line.startswith("| "):
            break
        inv, kind, why = (c.strip() for c in line.strip("|").split(" | "))
        rows[inv] = (kind, why)
    return rows


def test_the_spec_table_of_state_forms_is_the_registry():
    """SPEC.md 7's table of state forms says, for every invariant with a state form, what
    the registry says: whether it derives from the record form, and why it is more (the
    catalog's ``state_only``, word for word)."""
    want = {i: (inv.state_kind, inv.state_only or "-") for i, inv in INVARIANTS.items() if inv.check_state}
    assert _state_forms_table() == want
    kinds = {inv.state_kind for inv in INVARIANTS.values() if inv.check_state}
    assert kinds == {"derived from the record form", "derived, plus a state-only part", "its own (two forms)",
                     "its own (no record form)"}
    for inv in INVARIANTS.values():  # a state form that is not only the derived one says why
        assert bool(inv.state_only) == (inv.check_state is not None and inv.state_kind != "derived from the record form")


def test_a_history_coverage_says_why_an_invariant_has_no_record_form():
    cfg = MUTANTS["guard_ignored"].config
    h = simulate(cfg, [Request(0, "a", 0.0, 16, 2)])
    cov = coverage(h, cfg)
    for inv in ("GUARD", "PRIORITY-PREEMPT"):
        assert cov[inv] == f"no history form (state form only: {INVARIANTS[inv].state_only})"
        assert "BOUNDED-WAIT" in cov[inv]
    assert cov["DETERMINISM"] == "no history form (two-run property)"


# --- what the record forms judge now that the state forms derive from them ---------------------------


def test_queue_bound_record_form_counts_at_each_admission():
    """An arrival queued past its tenant's bound and scheduled in the same step: the queue is
    within the bound after the step, but not at the admission.  The state form always said so;
    the record form (after the step only) did not, so a history could not show it."""
    mutant = MUTANTS["queue_bound_off_by_one"].variant
    cfg = Config((TenantConfig("a", queue_bound=1),), num_blocks=64, max_num_seqs=4, token_budget=64,
                 max_context_tokens=64, admission=attrs.evolve(Config((TenantConfig("a"),)).admission,
                                                                  queue_bound=True), cost=_UNIT)
    wl = [Request(0, "a", 0.0, 8, 2), Request(1, "a", 0.0, 8, 2)]
    h = simulate(cfg, wl, variant=mutant)
    assert max(sum(s.queued.values()) for s in h.steps) <= 1  # never over the bound after a step
    found = check_history(h, cfg, ["QUEUE-BOUND"])
    assert [(f.step, f.requests, f.observed, f.allowed) for f in found] == [(0, (1,), 2, 1)]
    assert check_history(simulate(cfg, wl), cfg, ["QUEUE-BOUND"]) == []
    tr = next(iter(run_steps(cfg, wl, variant=mutant)))
    assert [f.requests for f in check_state(cfg, tr.prev, tr.state, tr.output, tr.inputs, ["QUEUE-BOUND"])] == [(1,)]


def _step(k: int, queued: dict, deficits: dict, running: tuple = ()) -> StepRecord:
    names = list(queued)
    return StepRecord(k, float(k), 1.0, (), (), running, queued, dict.fromkeys(names, 0), 100,
                      dict.fromkeys(names, 0.0), deficits, dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0))


def test_drr_deficit_record_form_holds_recorded_deficits_to_the_tight_bounds():
    """With ample KV under ``drr_tokens``, a recorded deficit above quantum x weight or below
    -D breaks DRR-DEFICIT (the summary's (-D, q*w]): the state form checked it, the record form
    only held deficits to the carry bound (none here)."""
    cfg = Config((TenantConfig("a"), TenantConfig("b")), num_blocks=64, max_num_seqs=2, token_budget=64,
                 max_context_tokens=64, order=OrderConfig(policy="drr_tokens", drr_quantum=64.0,
                                                          drr_carry_bound=None), cost=_UNIT)
    h = History({}, (_step(0, {"a": 1, "b": 1}, {"a": 64.0, "b": -10.0}),
                     _step(1, {"a": 1, "b": 1}, {"a": 200.0, "b": -1e6})), ())
    found = check_history(h, cfg, ["DRR-DEFICIT"])
    # D = min(w_in L + w_out M, max(w_in, w_out) M) = 2 x 128 with M = min(64 x 16, 2 slots x 64 tokens)
    assert [(f.step, f.tenants, f.observed, f.allowed) for f in found] == [(1, ("a",), 200.0, 64.0),
                                                                           (1, ("b",), -1e6, -256.0)]
    ok = History({}, (_step(0, {"a": 1, "b": 1}, {"a": 64.0, "b": -10.0}),), ())
    assert check_history(ok, cfg, ["DRR-DEFICIT"]) == []


def test_no_banked_credit_record_form_sees_a_queue_emptied_and_refilled_in_one_step():
    """Tenant b's only waiting request is cancelled in the step a new one of b's arrives: its
    queue is never empty at a snapshot, yet it joins the backlog again and must be lifted.  The
    no-lift mutant leaves b far below a; the record form judged joins by queue counts alone and
    missed it, the state form (and now the record form, by the step's events) does not."""
    cfg = Config((TenantConfig("a"), TenantConfig("b")), num_blocks=64, max_num_seqs=1, token_budget=64,
                 max_context_tokens=64, order=OrderConfig(policy="vtc"), cost=_UNIT)
    wl = [Request(i, "a", float(i), 8, 8) for i in range(12)]
    wl += [Request(100, "b", 0.5, 8, 8, cancel_s=6.0), Request(101, "b", 6.0, 8, 8)]
    h = simulate(cfg, wl, variant=MUTANTS["vtc_no_lift"].variant)
    found = check_history(h, cfg, ["NO-BANKED-CREDIT"])
    assert found and all(f.tenants == ("b",) for f in found)
    k = found[0].step
    assert h.steps[k - 1].queued["b"] and h.steps[k].queued["b"]  # never empty at a snapshot
    assert check_history(simulate(cfg, wl), cfg, ["NO-BANKED-CREDIT"]) == []


class _VictimSmallest(Step):
    """The 'largest' victim policy evicts the smallest sequence (a test's mutant)."""

    VICTIM = {**policies.VICTIM, "largest": lambda view, s: (s.blocks_held, s.arrival_seq)}


def test_victim_record_form_judges_the_largest_policy():
    """Victim ``largest`` with the cache off: a history shows which request held more blocks
    before the step (its computed tokens) and what the victim freed; the record form judged
    only ``newest`` and ``lowest_priority``."""
    cfg = attrs.evolve(MUTANTS["victim_oldest"].config,
                       eviction=EvictionConfig(victim="largest", min_free_blocks=0, cooldown_steps=0))
    wl = [Request(0, "a", 0.0, 200, 40), Request(1, "b", 0.0, 30, 200), Request(2, "c", 0.0, 30, 200)]
    h = simulate(cfg, wl, variant=_VictimSmallest, max_steps=300)
    assert any(s.preempted for s in h.steps)
    found = check_history(h, cfg, ["VICTIM"])
    assert found and "held more blocks than the 'largest' victim" in found[0].message
    assert check_history(simulate(cfg, wl, max_steps=300), cfg, ["VICTIM"]) == []


def test_evict_bounded_record_form_counts_the_evictions_its_steps_show():
    """Request records that under-report preemptions (1, the bound) while the steps show a
    second eviction: the record form read the records' totals only."""
    m = MUTANTS["evict_max_off_by_one"]
    wl = [Request(0, "a", 0.0, 100, 60), Request(1, "b", 0.0, 100, 120), Request(2, "c", 0.1, 100, 120)]
    h = simulate(m.config, wl, variant=m.variant, max_steps=300)
    over = [r for r in h.requests if r.preemptions > 1]
    assert over, "the workload no longer makes the mutant evict a request twice"
    told = attrs.evolve(h, requests=tuple(attrs.evolve(r, preemptions=1) if r in over else r for r in h.requests))
    found = check_history(told, m.config, ["EVICT-BOUNDED"])
    assert {f.requests for f in found} == {(over[0].request_id,)} and all(f.step is not None for f in found)
    assert (found[0].message, found[0].observed, found[0].allowed) == ("preempted more than max_evictions times", 2, 1)
