"""The stateful machine: tenants act, a replica steps, every step is judged.

One Hypothesis :class:`~hypothesis.stateful.RuleBasedStateMachine` for every
replica the driver loop can feed (:class:`tenantry.runner.simulate.Replica`):
the reference model (:class:`ModelMachine`, judged by the catalog's state
forms after every step and its history forms at the end), a fleet of it behind a
router (:class:`FleetMachine`: the same rules drive the fleet; every replica's state
forms and the fleet invariants' state forms after every fleet step, the fleet
history at the end), and a scheduler
under test behind the harness (built by :func:`tenantry.verify.suite.stateful_check`,
judged by the harness's findings).  Its rules are the environment's actions
of SPEC.md 5.1, one to one: a tenant sends a request (of any size, from one
token to more than the pool; a scheduler under test also gets requests at its
claimed limits), a tenant floods, a client cancels, the replica runs steps,
nothing arrives for a while.

A finding raises :class:`StatefulFinding`, which carries the run's inputs as a
workload (arrival times are the replica's clock when each request was sent;
cancellations are ``cancel_s``), so every failure can be shrunk by the one
shrinker and written as a replay file.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import event, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, precondition, rule

from tenantry.model.config import Config
from tenantry.model.routers import FleetConfig
from tenantry.model.workload import Request, StepInput, Workload
from tenantry.runner.fleet import Fleet, FleetRecorder
from tenantry.runner.simulate import ModelReplica, Recorder, Replica, config_to_dict
from tenantry.spec.invariants import INVARIANTS, check_history, check_state
from tenantry.spec.invariants_core import Finding
from tenantry.spec.invariants_fleet import (
    FLEET_INVARIANTS, FleetStepContext, check_fleet_history, check_fleet_transition,
)

#: Steps the teardown runs at most to let every request end.
DRAIN_STEPS = 2000


class StatefulFinding(AssertionError):
    """A stateful run made a finding.

    Attributes:
        findings: what was found (the first is the one to shrink for).
        workload: the run's inputs so far, cancellations included.
        fail_t_s: the replica's clock when it was found (seconds).
        config: the configuration the replica ran (the model's, drawn per example), or None.
    """

    def __init__(self, findings: list[Finding], workload: Workload, fail_t_s: float, config=None) -> None:
        self.findings, self.workload, self.fail_t_s, self.config = list(findings), workload, fail_t_s, config
        super().__init__("\n".join(f.render() for f in self.findings[:5])
                         + f"\n(after {len(workload)} requests, at t_s={fail_t_s:.6g})")


class ReplicaMachine(RuleBasedStateMachine):
    """Requests arrive, clients cancel, the replica steps; every step is judged.

    Subclasses say what the replica is and how it is judged: :meth:`build`
    (the replica and its tenant names for one example), :meth:`judge_step`
    (findings of the step just run) and :meth:`judge_end` (findings of the
    whole run, after the teardown drained it).
    """

    submitted = Bundle("submitted")
    #: Prompt and output lengths a rule may draw (tokens); subclasses narrow them.
    max_prompt_tokens: int = 511
    max_output_tokens: int = 40
    #: Seconds an idle rule moves the clock per step it stands for.
    idle_step_s: float = 0.01
    #: (prompt, output) tokens of requests at the replica's claimed limits (the token
    #: budget, a block, the pool, the context, a KV cap, a token burst, one below and one
    #: above each), sent whole by :meth:`at_limit`; a subclass sets them, empty: no such rule.
    limit_sizes: tuple[tuple[int, int], ...] = ()

    # --- what a subclass provides ------------------------------------------------------------

    def build(self, data: st.DataObject) -> tuple[Replica, tuple[str, ...]]:
        """The replica for one example and its tenants' names."""
        raise NotImplementedError

    def judge_step(self) -> list[Finding]:
        """Findings of the step just run."""
        raise NotImplementedError

    def judge_end(self) -> list[Finding]:
        """Findings of the whole run (after the teardown's drain)."""
        return []

    def close(self) -> None:
        """Release what :meth:`build` made."""

    # --- the environment ----------------------------------------------------------------------

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        self.replica, self.names = self.build(data)
        self.requests: list[Request] = []
        self.cancel_at: dict[int, float] = {}
        self.pending: list[Request] = []
        self.pending_cancels: list[int] = []

    def workload(self) -> Workload:
        """The inputs so far, cancellations included."""
        return Workload(tuple(attrs.evolve(r, cancel_s=self.cancel_at.get(r.request_id)) for r in self.requests))

    def _fail(self, found: list[Finding]) -> None:
        raise StatefulFinding(found, self.workload(), self.replica.t_s, getattr(self.replica, "config", None))

    def _step(self) -> None:
        if self.replica.stopped or not (self.replica.has_work() or self.pending or self.pending_cancels):
            return  # as the driver loop: an empty replica takes no step (it idles), so the workload replays
        inputs = StepInput(tuple(self.pending), tuple(self.pending_cancels))
        self.pending, self.pending_cancels = [], []
        self.replica.step(inputs)
        found = self.judge_step()
        if found:
            self._fail(found)

    def _prompt(self, data: st.DataObject) -> int:
        """A prompt length: an edge size (1, 15, 16, 17, 48 tokens) or anything up to the largest."""
        p = data.draw(st.one_of(st.sampled_from((1, 15, 16, 17, 48)), st.integers(1, self.max_prompt_tokens),
                                st.integers(self.max_prompt_tokens // 2, self.max_prompt_tokens)))
        return min(p, self.max_prompt_tokens)

    @rule(target=submitted, tenant=st.integers(0, 2), data=st.data(), prefix=st.lists(st.integers(0, 1), max_size=4))
    def submit(self, tenant: int, data: Any, prefix: list[int]) -> int:
        """Tenant ``tenant`` sends a request; it arrives before the next step."""
        return self._send(tenant, self._prompt(data), data.draw(st.integers(1, self.max_output_tokens)), prefix)

    def _send(self, tenant: int, prompt: int, output: int, prefix: list[int]) -> int:
        r = Request(len(self.requests), self.names[tenant % len(self.names)], self.replica.t_s, prompt, output,
                    prefix_ids=tuple(prefix[: prompt // 16]))
        self.requests.append(r)
        self.pending.append(r)
        return r.request_id

    @precondition(lambda self: self.limit_sizes)
    @rule(tenant=st.integers(0, 2), i=st.integers(0, 1 << 16))
    def at_limit(self, tenant: int, i: int) -> None:
        """Tenant ``tenant`` sends a request at one of the claimed limits (:attr:`limit_sizes`):
        larger than any size the other rules draw (up to the pool and past it)."""
        prompt, output = self.limit_sizes[i % len(self.limit_sizes)]
        self._send(tenant, prompt, output, [])

    @rule(tenant=st.integers(0, 2), n=st.integers(2, 6), data=st.data())
    def flood(self, tenant: int, n: int, data: Any) -> None:
        """Tenant ``tenant`` sends ``n`` requests of one size at once."""
        prompt, output = self._prompt(data), data.draw(st.integers(1, self.max_output_tokens))
        for _ in range(n):
            self._send(tenant, prompt, output, [0, 1, 0])

    @rule(rid=submitted)
    def cancel(self, rid: int) -> None:
        """A client cancels one of its requests (wherever it is, or after it ended)."""
        if rid not in self.cancel_at:
            self.cancel_at[rid] = self.replica.t_s
            self.pending_cancels.append(rid)

    @rule(n=st.integers(1, 8))
    def advance(self, n: int) -> None:
        """The replica runs ``n`` steps."""
        for _ in range(n):
            self._step()

    @precondition(lambda self: not self.pending)
    @rule(dt_steps=st.integers(1, 200))
    def go_idle(self, dt_steps: int) -> None:
        """Nothing arrives for a while: the replica drains, then idles."""
        for _ in range(dt_steps):
            if not self.replica.has_work() and not self.pending_cancels:
                break
            self._step()
        if not self.replica.has_work():
            self.replica.idle(self.replica.t_s + dt_steps * self.idle_step_s)

    def teardown(self) -> None:
        if getattr(self, "replica", None) is None:
            return
        try:
            for _ in range(DRAIN_STEPS):
                if self.replica.stopped or not (self.replica.has_work() or self.pending or self.pending_cancels):
                    break
                self._step()
            found = self.judge_end()
            if found:
                self._fail(found)
        finally:
            self.close()


class ModelMachine(ReplicaMachine):
    """The reference model under a configuration drawn per example (:attr:`configs`),
    judged by every applicable invariant's state form after every step and its
    history form at the end; a variant (a mutant) runs when :attr:`variant` is set."""

    #: A strategy of configurations (set by :func:`model_machine`).
    configs: Any = None
    variant: Any = None

    def build(self, data: st.DataObject) -> tuple[Replica, tuple[str, ...]]:
        cfg: Config = data.draw(self.configs, label="config")
        for inv_id, inv in INVARIANTS.items():  # shown by --hypothesis-show-statistics
            if inv.applies(cfg) and (inv.check_state or inv.check_history):
                event(f"checks {inv_id}")
        self.cfg = cfg
        self.rec = Recorder(cfg, True, detail=True)
        self.max_prompt_tokens = cfg.max_context_tokens - 1
        self.max_output_tokens = max(1, min(40, cfg.max_context_tokens // 8))
        return ModelReplica(cfg, variant=self.variant), tuple(t.name for t in cfg.tenants)

    def _send(self, tenant: int, prompt: int, output: int, prefix: list[int]) -> int:
        rid = super()._send(tenant, prompt, output, prefix)
        self.rec.offered(self.requests[rid])
        return rid

    def judge_step(self) -> list[Finding]:
        tr = self.replica.last
        self.rec.observe(tr.state, tr.output)
        for e in tr.output.events:
            if e.kind in ("preempted", "rejected", "cancelled"):
                event(f"{e.kind} {e.reason or ''}".strip())
        steps = self.rec.steps
        return check_state(self.cfg, tr.prev, tr.state, tr.output, tr.inputs, record=steps[-1],
                           prev_record=steps[-2] if len(steps) > 1 else None)

    def judge_end(self) -> list[Finding]:
        history = self.rec.history(self.replica.state, {"config": config_to_dict(self.cfg)})
        return check_history(history, self.cfg)


def model_machine(configs: Any, variant: Any = None, name: str = "ModelMachine") -> type[ModelMachine]:
    """A :class:`ModelMachine` class over ``configs`` (a strategy, or one Config)."""
    strat = configs if isinstance(configs, st.SearchStrategy) else st.just(configs)
    return type(name, (ModelMachine,), {"configs": strat, "variant": variant})


class FleetMachine(ReplicaMachine):
    """A fleet of the reference model (SPEC.md 5.3) drawn per example from :attr:`fleets`
    (1 to 3 replicas, any router, either accounting): the machine's rules drive it as they
    drive one replica (the router spreads what a tenant sends), plus :meth:`spread`, one
    request per replica at once.  After every fleet step, every
    applicable per-replica state form on each replica that stepped (a finding's message begins
    ``replica r:``) and every applicable fleet invariant's state form
    (:func:`~tenantry.spec.invariants_fleet.check_fleet_step`: FLEET-NO-LOSS, ROUTE-LOAD-BOUND,
    FLEET-VTC-GAP's premise and its proved invariant); at the end the fleet history by
    :func:`~tenantry.spec.invariants_fleet.check_fleet_history` (each replica's part by every
    history form, and the fleet invariants).  :attr:`variant` (a fleet mutant, a
    :class:`~tenantry.runner.fleet.Fleet` subclass) and :attr:`step_variant` (a replica mutant)
    run when set."""

    #: A strategy of :class:`FleetConfig` (set by :func:`fleet_machine`).
    fleets: Any = None
    variant: Any = None
    step_variant: Any = None

    def build(self, data: st.DataObject) -> tuple[Replica, tuple[str, ...]]:
        fc: FleetConfig = data.draw(self.fleets, label="fleet")
        self.fc = fc
        event(f"fleet {len(fc.replicas)} x {fc.router}, {fc.accounting} accounting")
        self.ctx = FleetStepContext(fc)
        for inv_id, inv in FLEET_INVARIANTS.items():
            if inv.applies(self.ctx.fleet, self.ctx.configs):
                event(f"checks {inv_id}")
        self.rec = FleetRecorder(fc, detail=True)
        ctx_tokens = min(c.max_context_tokens for c in fc.replicas)
        self.max_prompt_tokens = ctx_tokens - 1
        self.max_output_tokens = max(1, min(40, ctx_tokens // 8))
        fleet = (self.variant or Fleet)(fc, self.step_variant)
        return fleet, tuple(t.name for t in fc.replicas[0].tenants)

    def _send(self, tenant: int, prompt: int, output: int, prefix: list[int]) -> int:
        rid = super()._send(tenant, prompt, output, prefix)
        self.rec.offer(self.requests[rid])
        return rid

    def _step(self) -> None:
        self.before = [rep.state for rep in self.replica.replicas]
        super()._step()

    @rule(tenant=st.integers(0, 2), data=st.data())
    def spread(self, tenant: int, data: Any) -> None:
        """Tenant ``tenant`` sends one request per replica at once, each with its own prefix
        (the spreading pattern of issue 14: a load-balancing or prefix router puts one on every
        replica, so it can stay under each replica's share)."""
        prompt, output = self._prompt(data), data.draw(st.integers(1, self.max_output_tokens))
        for r in range(len(self.replica.replicas)):
            self._send(tenant, prompt, output, [r + 2] * 4)

    def judge_step(self) -> list[Finding]:
        tr = self.replica.last
        self.rec.observe(tr)
        return check_fleet_transition(self.ctx, self.before, tr, self.replica)

    def judge_end(self) -> list[Finding]:
        return check_fleet_history(self.rec.history(self.replica))


def fleet_machine(fleets: Any, variant: Any = None, step_variant: Any = None,
                  name: str = "FleetMachine") -> type[FleetMachine]:
    """A :class:`FleetMachine` class over ``fleets`` (a strategy, or one FleetConfig)."""
    strat = fleets if isinstance(fleets, st.SearchStrategy) else st.just(fleets)
    return type(name, (FleetMachine,), {"fleets": strat, "variant": variant, "step_variant": step_variant})
