"""The reference model behind the adapter protocol.

:class:`ReferenceAdapter` wraps :func:`tenantry.model.step.step` so the
harness can drive it like any other scheduler: a self-test of the harness (its
history must equal :func:`~tenantry.runner.simulate.simulate`'s, step for
step) and a baseline for the reports.  :func:`model_plan` turns one model
step into the :class:`~tenantry.verify.protocol.Plan` a scheduler would have
returned; the harness uses it for the lockstep comparison when an adapter
claims the reference policy.

Block ids: the model has no physical block numbers, so a sequence's blocks are
reported as :func:`tenantry.model.state.block_ids` (its prefix-cache keys, then
named private blocks), as the model's own step records do.
"""

from __future__ import annotations

from typing import Any

from tenantry.model.config import Config
from tenantry.model.state import State, block_ids, initial_state
from tenantry.model.step import Step, StepOutput, idle, step
from tenantry.model.workload import Request, StepInput

from .protocol import Claims, Plan, Rejection, Scheduled, StepResults


def model_plan(config: Config, before: State, out: StepOutput, after: State, *, blocks: str = "ids") -> Plan:
    """The plan the model made in one step (``before`` -> ``after``, output ``out``).

    ``computed_tokens`` of each batch entry is the tokens computed before the
    step; ``blocks`` are held at the end of the step by every sequence that
    was running in it, as ``"ids"`` (see the module docstring), ``"counts"``
    (cheaper; exact when the prefix cache is off), or ``"none"``.
    """
    seqs = {s.request_id: s for s in after.running}
    seqs.update({s.request_id: s for s in out.finished if s.request_id not in seqs})
    batch = tuple(Scheduled(rid, n, seqs[rid].computed_tokens - n) for rid, n in out.batch)
    rejected = tuple(Rejection(e.request_id, e.reason, e.retry_after_s) for e in out.events if e.kind == "rejected")
    evicted = tuple(e.request_id for e in out.events
                    if e.kind == "preempted" or (e.kind == "rejected" and e.reason == "evicted_too_often"))
    held = None
    if blocks != "none":
        form = block_ids if blocks == "ids" else (lambda s: s.blocks_held)
        in_batch = {rid for rid, _ in out.batch}
        held = {s.request_id: form(s) for s in after.running}
        for s in out.finished:
            if s.request_id in in_batch and s.request_id not in held and s.blocks_held:
                held[s.request_id] = form(s)
    names = [t.name for t in config.tenants]
    return Plan(
        batch=batch, preempted=evicted, rejected=rejected, blocks=held,
        counters={n: t.counter for n, t in zip(names, after.tenants)},
        deficits={n: t.deficit for n, t in zip(names, after.tenants)},
        freed={e.request_id: e.blocks for e in out.events
               if e.kind == "preempted" or (e.kind == "rejected" and e.reason == "evicted_too_often")},
    )


class ReferenceAdapter:
    """The reference model as a scheduler under test.

    ``plan_step`` runs one whole model step (arrivals and cancellations given
    since the last step included) and reports it; ``take_results`` checks that
    the harness's token accounting and step time equal the model's and raises
    ``AssertionError`` otherwise (which the harness reports as ADAPTER-RAISED:
    a disagreement between harness and model is a bug in one of them).

    Args:
        config: the replica and its policies (must list every tenant used).
        reference: claim the reference policy (the lockstep comparison then
            must never diverge).
        invariants: claim-level invariant ids to assert.
        variant: a :class:`~tenantry.model.step.Step` subclass to run instead of
            the model (a mutant of :mod:`tenantry.testing.mutants`: a faulty
            scheduler in step mode, as the regression cases use it).
    """

    def __init__(self, config: Config, *, reference: bool = True, invariants: tuple[str, ...] = (),
                 variant: type[Step] | None = None) -> None:
        self.config, self.variant = config, variant
        self.claims = Claims(config, reference=reference, invariants=invariants,
                             describe=f"tenantry reference model ({config.order.policy})")
        self.state = initial_state(config)
        self.arrivals: list[Request] = []
        self.cancellations: list[int] = []
        self.last: StepOutput | None = None

    def add_request(self, request: Request) -> str | None:
        """Queue an arrival for the next step (admission is decided in the step)."""
        self.arrivals.append(request)
        return None

    def abort_request(self, request_id: int) -> None:
        """Queue a cancellation for the next step."""
        self.cancellations.append(request_id)

    def plan_step(self, t_s: float) -> Plan:
        """Run one model step starting at ``t_s`` (idling up to it first)."""
        if t_s > self.state.t_s:
            self.state = idle(self.config, self.state, t_s)
        before = self.state
        inputs = StepInput(tuple(self.arrivals), tuple(self.cancellations))
        self.arrivals, self.cancellations = [], []
        self.state, self.last = step(self.config, before, inputs, self.variant)
        form = "counts" if self.config.prefix_cache == "off" else "ids"
        return model_plan(self.config, before, self.last, self.state, blocks=form)

    def take_results(self, results: StepResults) -> None:
        """Check the harness's results against the model's step."""
        out = self.last
        assert out is not None and results.step_index == out.step_index, (results.step_index, out)
        assert results.duration_s == out.duration_s, ("duration_s", results.duration_s, out.duration_s)
        produced = sorted(e.request_id for e in out.events if e.kind == "first_token")
        finished = sorted(e.request_id for e in out.events if e.kind == "finished")
        assert sorted(results.finished) == finished, ("finished", sorted(results.finished), finished)
        assert set(produced) <= set(results.tokens), ("first tokens", produced, results.tokens)


def make_reference(config: Config, **kwargs: Any):
    """A zero-argument factory of :class:`ReferenceAdapter` for ``config``."""
    return lambda: ReferenceAdapter(config, **kwargs)
