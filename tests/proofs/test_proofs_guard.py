"""The starvation guard's proof against the model (SPEC.md 8.14): on concrete runs, every
step that reserves the pool is one the encoding allows (the reserved head is overdue and
needs more blocks than were free; nothing enters the batch) and drops the running work
``mu`` by at least one token, as the obligations ``admit``, ``compute``, ``evict``,
``leave`` and ``progress`` say; and the guard bounds the wait of 8.12's pool-pressure case.
BOUNDED-WAIT[guard] (``proofs/guard_wait.py``): on runs of that shape without eviction, while a
request r waits overdue, ``V = mu + C * (queued before r)`` drops by >= 1 per step and an
admission's first pick is older than r; the same check fails without the guard."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings, strategies as st

from tenantry.model.guards import overdue
from tenantry.model.workload import Request
from tenantry.proofs.guard import GUARD, guard_config, held_with_guard
from tenantry.proofs.concrete import run_workload
from tenantry.proofs.core import PROVED, run_proof, run_twin
from tenantry.proofs.guard_wait import BOUNDED_WAIT_GUARD, BOUNDED_WAIT_GUARD_S, held_with_guard as guard_held
from tenantry.proofs.guard_wait import held_with_wait_guard, pressure_workload, wait_bound_s, wait_config
from tenantry.proofs.guard_wait import wait_bound_steps as guard_wait_bound_steps
from tenantry.spec.invariants_state import StepContext


def _mu(state) -> int:
    """The ranking function: sum over running sequences of (tokens left to compute + 1)."""
    return sum(s.request.prompt_tokens + s.request.output_tokens - 1 - s.computed_tokens + 1 for s in state.running)


@st.composite
def pressure(draw):
    """8.12's pool-pressure shape: a few large requests of ``lo`` among a stream of small ones of
    ``hi`` on a 4-block pool (contexts up to 48 tokens), so that heads are refused and overdue."""
    reqs, t = [], 0.0
    for rid in range(draw(st.integers(3, 14))):
        t = round(t + draw(st.sampled_from((0.0, 1.0, 2.0, 3.0))), 6)
        big = draw(st.integers(0, 3)) == 0
        prompt = draw(st.integers(33, 47)) if big else draw(st.integers(1, 17))
        out = draw(st.integers(1, 48 - prompt))
        reqs.append(Request(rid, "lo" if big else "hi", t, prompt, out))
    return reqs


@settings(max_examples=60, deadline=None)
@given(wl=pressure(), k=st.sampled_from((1, 2, 3)))
def test_every_reserving_step_is_an_encoded_one_and_drops_the_running_work(wl, k):
    cfg = guard_config(k)
    reserving = 0
    for tr in run_workload(cfg, wl, max_steps=400):
        rid = tr.output.reserved
        if rid is None:
            continue
        reserving += 1
        ctx = StepContext(cfg, tr.prev, tr.inputs, tr.state, tr.output)
        assert not ctx.admitted_from_queue, "an admission in a reserving step"
        head = ctx.after(rid)
        assert head is not None and head in [s for t in tr.state.tenants for s in t.queue]
        assert overdue(cfg, head, tr.output.step_index, tr.prev.t_s)
        during = list(tr.state.running) + [ctx.gone[e.request_id] for e in tr.output.events if e.kind == "finished"]
        free = cfg.num_blocks - sum(s.blocks_held for s in during)  # no prefix cache here
        assert cfg.blocks_for(min(head.target_tokens, cfg.token_budget)) > free  # refused: need > F
        if tr.prev.running:
            assert _mu(tr.state) <= _mu(tr.prev) - 1, "the running work did not drop in a reserving step"
    event(f"reserving steps > 0: {reserving > 0}")


def test_guard_is_proved_and_its_twin_replays():
    assert run_proof(GUARD).verdict == PROVED
    waited, bound = held_with_guard(3)
    assert waited <= bound and waited < 20.0
    h = guard_config(None)
    assert h.order.guard_steps is None


# --- BOUNDED-WAIT[guard] (proofs/guard_wait.py) ---------------------------------------------


@st.composite
def pressure_no_growth(draw):
    """The pressure shape with outputs that never need a block past the first chunk's (the
    proof's scope: no eviction): ``blocks_for(prompt + output - 1) = blocks_for(prompt)``."""
    reqs, t = [], 0.0
    for rid in range(draw(st.integers(3, 14))):
        t = round(t + draw(st.sampled_from((0.0, 1.0, 2.0, 3.0))), 6)
        big = draw(st.integers(0, 3)) == 0
        prompt = draw(st.integers(33, 47)) if big else draw(st.integers(1, 17))
        room = 16 * (-(-prompt // 16)) - prompt + 1
        out = draw(st.integers(1, max(1, min(48 - prompt, room))))
        reqs.append(Request(rid, "lo" if big else "hi", t, prompt, out))
    return reqs


@settings(max_examples=60, deadline=None)
@given(wl=pressure_no_growth(), k=st.sampled_from((1, 2, 3)))
def test_bounded_wait_under_the_guard_ranking_drops_and_the_first_pick_is_older(wl, k):
    checked = _check_bounded_wait_ranking(wl, k, guard_config(k))
    event(f"overdue waiting steps checked > 0: {checked > 0}")


def _check_bounded_wait_ranking(wl, k, cfg, wait_s=None):
    """On the model's run of ``wl`` under ``cfg``, for every request r waiting overdue (``k``
    steps since its admission; or, with ``wait_s``, that many seconds since its arrival at the
    step's start) and not scheduled in a step: V (the running work plus C times the queued
    requests admitted before r) drops by >= 1, and an admission is preceded by an older one;
    and every request starts within the proved bound."""
    C = cfg.max_num_seqs * cfg.max_context_tokens + 1
    if wait_s is None:
        bound_steps = guard_wait_bound_steps(guard_config(k))
        assert bound_steps == k + 96 + 97 * 2 + 1
        bound_s = bound_steps * cfg.cost.unit_step_s
        late = lambda tr, r: tr.output.step_index - r.admitted_step >= k  # noqa: E731
    else:
        bound_s = wait_bound_s(wait_config(wait_s))
        assert bound_s == wait_s + (96 + 97 * 2 + 1) * cfg.cost.unit_step_s
        late = lambda tr, r: tr.prev.t_s - r.request.arrival_s >= wait_s  # noqa: E731
    trs = list(run_workload(cfg, wl, max_steps=600))
    assert not any(e.kind == "preempted" for tr in trs for e in tr.output.events), "the scope: no eviction"
    checked = 0
    for tr in trs:
        k_now = tr.output.step_index
        for r in (s for t in tr.prev.tenants for s in t.queue):
            if not late(tr, r) or not r.never_scheduled:
                continue
            def V(state):  # noqa: E306
                older = sum(1 for t in state.tenants for s in t.queue if s.arrival_seq < r.arrival_seq)
                return _mu(state) + C * older
            scheduled = [e.request_id for e in tr.output.events if e.kind == "scheduled"]
            if r.request_id in scheduled:
                continue
            # cancelled / rejected in the step: its wait ended otherwise
            if not any(s.request_id == r.request_id for t in tr.state.tenants for s in t.queue):
                continue
            checked += 1
            assert V(tr.state) <= V(tr.prev) - 1, f"V did not drop in step {k_now} for request {r.request_id}"
            if scheduled:  # the obligation 'first': an unreserved step's first admission is older than r
                assert tr.output.reserved is None
                seq = {s.request_id: s for s in tr.state.sequences()}
                first = seq.get(scheduled[0])
                if first is not None:  # (unless it finished within the step)
                    assert first.arrival_seq < r.arrival_seq, "the first pick of an unreserved step is not older"
    for tr in trs:
        for s in tr.state.sequences():
            if s.first_scheduled_s is not None:
                assert s.first_scheduled_s - s.request.arrival_s <= bound_s
    return checked


@settings(max_examples=60, deadline=None)
@given(wl=pressure_no_growth(), w=st.sampled_from((0.5, 1.0, 2.5)))
def test_bounded_wait_under_the_guard_in_seconds_ranking_drops(wl, w):
    """BOUNDED-WAIT[guard_wait_s]: the same ranking once r has waited ``guard_wait_s`` seconds."""
    checked = _check_bounded_wait_ranking(wl, None, wait_config(w), wait_s=w)
    event(f"overdue waiting steps checked > 0: {checked > 0}")


_MODES = {  # the guard in steps (guard_steps = 3) and in seconds (guard_wait_s = 3 s): on, off, the check's args
    "steps": (BOUNDED_WAIT_GUARD, lambda: guard_config(3), lambda: guard_config(None), dict(k=3), lambda: guard_held(3)),
    "seconds": (BOUNDED_WAIT_GUARD_S, lambda: wait_config(3.0), lambda: wait_config(None), dict(k=None, wait_s=3.0),
                lambda: held_with_wait_guard(3.0)),
}


@pytest.mark.parametrize("mode", sorted(_MODES))
def test_the_ranking_check_fails_without_the_guard(mode):
    # the twin's workload (8.12's pool-pressure) without the guard: lo's head is passed over unpaid
    _, on, off, kw, _ = _MODES[mode]
    with pytest.raises(AssertionError, match="V did not drop in step 6 for request 1"):
        _check_bounded_wait_ranking(pressure_workload(30.0), cfg=off(), **kw)
    assert _check_bounded_wait_ranking(pressure_workload(30.0), cfg=on(), **kw) > 0


@pytest.mark.parametrize("mode", sorted(_MODES))
def test_bounded_wait_under_the_guard_is_proved_and_its_twin_replays(mode):
    proof, _, _, _, held = _MODES[mode]
    out = run_proof(proof)
    assert out.verdict == PROVED, out
    tw = run_twin(proof, proof.twins[0])
    assert tw.ok, tw
    waited, bound = held()
    assert bound == 294.0 and waited <= bound
