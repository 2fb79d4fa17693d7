"""The starvation guard's proof against the model (SPEC.md 8.14): on concrete runs, every
step that reserves the pool is one the encoding allows (the reserved head is overdue and
needs more blocks than were free; nothing enters the batch) and drops the running work
``mu`` by at least one token, as the obligations ``admit``, ``compute``, ``evict``,
``leave`` and ``progress`` say; and the guard bounds the wait of 8.12's pool-pressure case."""

from __future__ import annotations

from hypothesis import event, given, settings, strategies as st

from tenantry.model.policies import overdue
from tenantry.model.workload import Request
from tenantry.proofs.guard import GUARD, guard_config, held_with_guard
from tenantry.proofs.concrete import run_workload
from tenantry.proofs.core import PROVED, run_proof
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
