"""Stateful runs of the reference model (SPEC.md 7): Hypothesis drives tenants that
submit requests of every size (tiny to larger than the pool), advance steps,
cancel and go idle, for every policy family; every applicable invariant's
state form is checked after every step and its history form at the end.
"""

from __future__ import annotations

from hypothesis import event, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from tenantry.model.config import (
    ORDER_POLICIES, PREFIX_CACHE_MODES, VICTIM_POLICIES, AdmissionConfig, Config, CostConfig, EvictionConfig,
    OrderConfig, TenantConfig,
)
from tenantry.model.simulate import Recorder, config_to_dict, has_work
from tenantry.model.state import initial_state
from tenantry.model.step import idle, step
from tenantry.model.workload import Request, StepInput
from tenantry.spec.invariants import INVARIANTS, check_history, check_state

MAX_CONTEXT = 512  # tokens: 32 blocks of 16


@st.composite
def configs(draw, policy=None):
    """A small replica for every policy family, with an ample or a tight pool."""
    n = draw(st.integers(2, 3))
    bucket = draw(st.booleans())
    tenants = tuple(
        TenantConfig(
            name, weight=draw(st.sampled_from((0.5, 1.0, 2.0))), tier=draw(st.integers(0, 1)),
            queue_bound=draw(st.sampled_from((None, 1, 3))), kv_block_cap=draw(st.sampled_from((None, None, 12))),
            token_rate_per_s=2000.0 if bucket else None, token_burst_tokens=600.0 if bucket else None,
        )
        for name in ("a", "b", "c")[:n]
    )
    max_num_seqs = draw(st.integers(1, 4))
    ample = draw(st.integers(0, 2)) == 0
    num_blocks = max_num_seqs * 32 if ample else draw(st.integers(8, 40))
    pol = policy or draw(st.sampled_from(ORDER_POLICIES))
    order = OrderConfig(policy=pol, drr_quantum=draw(st.sampled_from((32.0, 128.0))), drr_carry_bound=256.0,
                        aging_rate_per_s=draw(st.sampled_from((1.0, 20.0))), tier_floors=(0.6, 0.4))
    eviction = EvictionConfig(
        victim=draw(st.sampled_from(VICTIM_POLICIES)), min_free_blocks=draw(st.sampled_from((0, 0, 2))),
        cooldown_steps=draw(st.sampled_from((0, 2))), max_evictions=draw(st.sampled_from((None, 1, 3))),
    )
    return Config(
        tenants=tenants, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
        token_budget=draw(st.sampled_from((16, 48, 64))), max_context_tokens=MAX_CONTEXT, order=order,
        admission=AdmissionConfig(token_bucket=bucket, kv_cap=draw(st.booleans())),
        eviction=eviction, cost=CostConfig(mode="unit", unit_step_s=0.01),
        prefix_cache=draw(st.sampled_from(PREFIX_CACHE_MODES)),
    )


PROMPTS = st.one_of(st.sampled_from((1, 15, 16, 17, 48)), st.integers(1, MAX_CONTEXT - 1))


class SchedulerMachine(RuleBasedStateMachine):
    """Tenants act; the replica steps; the invariants judge every step."""

    submitted = Bundle("submitted")

    policy: str | None = None

    @initialize(data=st.data())
    def start(self, data) -> None:
        cfg = data.draw(configs(self.policy), label="config")
        for inv_id, inv in INVARIANTS.items():  # shown by --hypothesis-show-statistics
            if inv.applies(cfg) and (inv.check_state or inv.check_history):
                event(f"checks {inv_id}")
        self.cfg = cfg
        self.state = initial_state(cfg)
        self.rec = Recorder(cfg, True)
        self.arrivals: list[Request] = []
        self.cancels: list[int] = []
        self.next_id = 0
        self.steps = 0

    def _step(self) -> None:
        inputs = StepInput(tuple(self.arrivals), tuple(self.cancels))
        self.arrivals, self.cancels = [], []
        new, out = step(self.cfg, self.state, inputs)
        found = check_state(self.cfg, self.state, new, out, inputs)
        assert not found, "\n".join(map(str, found))
        self.rec.observe(new, out)
        self.state = new
        self.steps += 1
        for e in out.events:
            if e.kind in ("preempted", "rejected", "cancelled"):
                event(f"{e.kind} {e.reason or ''}".strip())

    @rule(target=submitted, tenant=st.integers(0, 2), prompt=PROMPTS, output=st.integers(1, 40),
          prefix=st.lists(st.integers(0, 1), max_size=4))
    def submit(self, tenant: int, prompt: int, output: int, prefix: list[int]) -> int:
        """A tenant sends a request (it arrives before the next step)."""
        names = [t.name for t in self.cfg.tenants]
        output = min(output, MAX_CONTEXT - prompt) if prompt < MAX_CONTEXT else output
        r = Request(self.next_id, names[tenant % len(names)], self.state.t_s, prompt, max(1, output),
                    prefix_ids=tuple(prefix[: prompt // 16]))
        self.next_id += 1
        self.arrivals.append(r)
        self.rec.offered(r)
        return r.request_id

    @rule(tenant=st.integers(0, 2), sizes=st.lists(st.tuples(PROMPTS, st.integers(1, 40)), min_size=2, max_size=6))
    def flood(self, tenant: int, sizes: list[tuple[int, int]]) -> None:
        """A tenant sends several requests at once."""
        for prompt, output in sizes:
            self.submit(tenant, prompt, output, [0, 1, 0])

    @rule(n=st.integers(1, 6))
    def advance(self, n: int) -> None:
        """The replica runs n steps."""
        for _ in range(n):
            self._step()

    @rule(rid=submitted)
    def cancel(self, rid: int) -> None:
        """A client cancels one of its requests (wherever it is, or after it ended)."""
        self.cancels.append(rid)

    @precondition(lambda self: not self.arrivals)
    @rule(dt_steps=st.integers(1, 200))
    def go_idle(self, dt_steps: int) -> None:
        """Nothing arrives for a while: the replica drains, then idles."""
        for _ in range(dt_steps):
            if not has_work(self.state) and not self.cancels:
                break
            self._step()
        if not has_work(self.state):
            self.state = idle(self.cfg, self.state, self.state.t_s + dt_steps * 0.01)

    @invariant()
    def books_balance(self) -> None:
        """Between rules: no tenant holds blocks without running sequences."""
        if getattr(self, "state", None) is not None:
            for t in self.state.tenants:
                assert t.running > 0 or t.blocks == 0

    def teardown(self) -> None:
        if getattr(self, "rec", None) is None:
            return
        history = self.rec.history(self.state, {"config": config_to_dict(self.cfg)})
        found = check_history(history, self.cfg)
        assert not found, "\n".join(map(str, found))


def _family(policy: str):
    machine = type(f"Machine_{policy}", (SchedulerMachine,), {"policy": policy})
    case = machine.TestCase
    # Half the profile's examples per family (20 by default, 1000 under ``deep``), at most 40 rules each.
    case.settings = settings(case.settings, max_examples=max(10, settings.default.max_examples // 2),
                             stateful_step_count=40)
    return case


TestFCFS = _family("fcfs")
TestRoundRobin = _family("round_robin")
TestVTC = _family("vtc")
TestVTCPredict = _family("vtc_predict")
TestDRRTokens = _family("drr_tokens")
TestDRRBlockSeconds = _family("drr_block_seconds")
TestPriority = _family("priority")
TestAging = _family("aging")
TestFloors = _family("floors")
