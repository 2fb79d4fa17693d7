"""The tenantry adapter of minisched: the only file that knows tenantry.

``make_scheduler`` is the factory named on the command line or to the pytest
plugin::

    tenantry verify --target minisched.tenantry_adapter:make_scheduler
    pytest --tenantry-target=minisched.tenantry_adapter:make_scheduler

The claims: the pool and batch limits it runs with, and that it is
work-conserving (it never leaves a tenant's next request waiting while a seat,
budget and blocks are free).  It claims no reference policy: its counter is
VTC-like, but its tie-breaks are its own.
"""

from __future__ import annotations

from tenantry.model.config import Config, CostConfig, EvictionConfig, OrderConfig, TenantConfig
from tenantry.verify.protocol import Claims, Plan, Scheduled, StepResults

from .scheduler import Scheduler, SchedulerOutput

#: The replica minisched is run with in the examples: 8 sequences, 256 tokens a
#: step, a 384-block pool of 16 tokens (the context: prompt + output within the pool),
#: and a slow accelerator's step times.
NUM_BLOCKS, BLOCK_SIZE, MAX_SEQS, BUDGET = 384, 16, 8, 256
COST = CostConfig(weight_read_s=0.025, kv_read_s_per_token=1e-6, flop_s_per_token=1.2e-4, overhead_s=0.002)


class MiniSchedAdapter:
    """minisched behind the tenantry adapter protocol (tenantry.verify.protocol)."""

    def __init__(self, tenants: tuple[TenantConfig, ...] = (), num_blocks: int = NUM_BLOCKS) -> None:
        tenants = tuple(tenants) or (TenantConfig("default"),)
        self.sched = Scheduler(num_blocks, BLOCK_SIZE, MAX_SEQS, BUDGET,
                               weights={t.name: t.weight for t in tenants})
        config = Config(tenants=tenants, block_size_tokens=BLOCK_SIZE, num_blocks=num_blocks, max_num_seqs=MAX_SEQS,
                        token_budget=BUDGET, max_context_tokens=num_blocks * BLOCK_SIZE, order=OrderConfig(policy="vtc"),
                        eviction=EvictionConfig(victim="newest"), cost=COST)
        self.claims = Claims(config, invariants=("WORK-CONSERVING",), describe=f"minisched ({type(self).__module__})")
        self._last: SchedulerOutput | None = None

    def add_request(self, request) -> str | None:
        if request.prompt_tokens + request.output_tokens > self.claims.config.max_context_tokens:
            return "too_long"  # the API server's check: prompt + max_tokens within the context, the whole pool
        self.sched.add_request(request.request_id, request.tenant, request.prompt_tokens)
        return None

    def abort_request(self, request_id: int) -> None:
        self.sched.abort_request(request_id)

    def plan_step(self, t_s: float) -> Plan:
        out = self._last = self.sched.schedule()
        batch = tuple(Scheduled(rid, n, out.computed_before[rid]) for rid, n in out.num_scheduled_tokens.items())
        blocks = {s.seq_id: tuple(s.block_ids) for s in self.sched.running}
        return Plan(batch=batch, preempted=tuple(out.preempted), blocks=blocks,
                    free_blocks=self.sched.pool.num_free_blocks, counters=dict(self.sched.counters))

    def take_results(self, results: StepResults) -> None:
        self.sched.update_from_output(self._last, list(results.tokens), list(results.finished))


def make_scheduler(tenants: tuple[TenantConfig, ...] = ()) -> MiniSchedAdapter:
    """The factory: a fresh minisched for the given tenants (their weights)."""
    return MiniSchedAdapter(tenants)
