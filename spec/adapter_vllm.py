"""vLLM's real scheduler behind the adapter protocol (tenantry.spec.adapter).

:class:`VllmAdapter` drives :class:`~tenantry.spec.vllm_adapter.VllmScheduler`
(vLLM 0.33's ``vllm.v1.core.sched.scheduler.Scheduler`` on CPU, no model) in
step mode.  ``plan_step`` runs one engine step (schedule, a fabricated forward
pass, update) and reports what vLLM decided; the KV blocks are read from
vLLM's ``KVCacheManager`` between ``schedule()`` and ``update_from_output()``,
i.e. as held during the step, with their block ids, so the harness sees
sharing and prefix-cache reuse from the outside.  ``take_results`` checks that
vLLM finished exactly the requests the harness finished.

vLLM promises no tenant fairness, so an adapter claims only its limits (and
SALT-ISOLATION when it runs with per-tenant cache salts): the safety
invariants are checked, the matrix measures what the absence of fairness
costs.  The factories take ``tenants=`` so the priority policy can map a
tenant's tier to vLLM's ``priority`` (lower runs first, as tiers).

The replica matches the adversary setups (:data:`tenantry.adversaries.configs.REPLICA`:
8 sequences, 256 tokens per step, 16-token blocks, 8,192-token contexts, the
same roofline step times), so a vLLM cell compares with the model's cell of
the same policy.  ``max_model_len`` is the context limit: like vLLM's front
end, the adapter refuses a longer request (``too_long``) instead of handing
it to the scheduler, which would wait for it forever.
"""

from __future__ import annotations

from typing import Any

from tenantry.model.config import Config, EvictionConfig, OrderConfig, TenantConfig

from .adapter import Claims, Plan, Scheduled, StepResults

#: Pools: "ample" as the order-policy setups (8 sequences of the longest
#: context fit), "small" as the eviction setups (preemption happens).
AMPLE_BLOCKS, SMALL_BLOCKS = 4096, 512


def _replica() -> tuple[dict[str, Any], Any]:
    from tenantry.adversaries.configs import COST, REPLICA

    return dict(REPLICA), COST


class VllmAdapter:
    """vLLM's V1 scheduler as a scheduler under test.

    Args:
        policy: ``fcfs`` or ``priority`` (vLLM's two policies).
        tenants: the tenants (tiers become vLLM priorities).
        num_blocks: KV pool (the adapter adds vLLM's null block itself).
        cache: ``off``, ``shared`` (vLLM's prefix cache, no salt) or
            ``salted`` (prefix cache, ``cache_salt`` = the tenant's salt).

    Raises:
        RuntimeError: if vLLM is not installed or not the supported version.
    """

    def __init__(self, *, policy: str = "fcfs", tenants: tuple[TenantConfig, ...] = (),
                 num_blocks: int = AMPLE_BLOCKS, cache: str = "off") -> None:
        from .vllm_adapter import VllmScheduler, vllm_available

        replica, cost = _replica()
        tenants = tuple(tenants) or (TenantConfig("default"),)
        self.max_context_tokens = min(replica["max_context_tokens"], num_blocks * replica["block_size_tokens"])
        self.vs = VllmScheduler(num_blocks=num_blocks, block_size_tokens=replica["block_size_tokens"],
                                max_num_seqs=replica["max_num_seqs"], token_budget=replica["token_budget"],
                                policy=policy, enable_prefix_caching=cache != "off",
                                max_model_len=self.max_context_tokens)
        config = Config(
            tenants=tenants, block_size_tokens=replica["block_size_tokens"], num_blocks=num_blocks,
            max_num_seqs=replica["max_num_seqs"], token_budget=replica["token_budget"],
            max_context_tokens=self.max_context_tokens, order=OrderConfig(policy=policy),
            eviction=EvictionConfig(victim="newest" if policy == "fcfs" else "lowest_priority"),
            prefix_cache=cache, cost=cost,
        )
        self.claims = Claims(config, describe=f"{vllm_available()[1]} scheduler, policy {policy}, "
                             f"{num_blocks} blocks, prefix cache {cache}")
        self.cache = cache
        self.tiers = {t.name: t.tier for t in tenants}
        self.salts = {t.name: t.salt for t in tenants}
        self._held: dict[int, tuple[int, ...]] = {}
        self._free = num_blocks
        self._last: dict[str, Any] = {}
        sched = self.vs.scheduler
        original = sched.update_from_output

        def snapshot_then_update(scheduler_output: Any, model_output: Any) -> Any:
            # KV as held during the step: after schedule(), before finished requests free theirs.
            kvm = sched.kv_cache_manager
            self._held = {int(r.request_id): tuple(kvm.get_block_ids(r.request_id)[0]) for r in sched.running}
            self._free = kvm.block_pool.get_num_free_blocks()
            return original(scheduler_output, model_output)

        sched.update_from_output = snapshot_then_update

    def add_request(self, request: Any) -> str | None:
        """Queue the request; refuse one longer than the context limit, as vLLM's front end does."""
        if request.prompt_tokens + request.output_tokens > self.max_context_tokens:
            return "too_long"
        self.vs.add_request(request.request_id, request.tenant, request.prompt_tokens, request.output_tokens,
                            prefix_ids=tuple(request.prefix_ids), priority=self.tiers.get(request.tenant, 0),
                            cache_salt=self.salts.get(request.tenant, request.tenant) if self.cache == "salted"
                            else None)
        return None

    def abort_request(self, request_id: int) -> None:
        self.vs.abort_request(request_id)

    def plan_step(self, t_s: float) -> Plan:
        """One vLLM engine step, reported as a plan."""
        d = self._last = self.vs.step()
        hits = d["cached_hits"]
        batch = tuple(Scheduled(rid, n, hits.get(rid)) for rid, n in d["batch"])
        return Plan(batch=batch, preempted=tuple(d["preempted"]), blocks=dict(self._held),
                    free_blocks=self._free)

    def take_results(self, results: StepResults) -> None:
        """vLLM must have finished exactly the requests the harness finished."""
        mine = sorted(self._last.get("finished", ()))
        if sorted(results.finished) != mine:
            raise AssertionError(f"vLLM finished {mine} in step {results.step_index}, the harness "
                                 f"{sorted(results.finished)}")


def make_fcfs(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM fcfs, ample pool."""
    return VllmAdapter(policy="fcfs", tenants=tenants)


def make_priority(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM priority (tier = priority), ample pool."""
    return VllmAdapter(policy="priority", tenants=tenants)


def make_fcfs_small(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM fcfs on the small pool (preemption happens)."""
    return VllmAdapter(policy="fcfs", tenants=tenants, num_blocks=SMALL_BLOCKS)


def make_priority_small(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM priority on the small pool."""
    return VllmAdapter(policy="priority", tenants=tenants, num_blocks=SMALL_BLOCKS)


def make_shared_cache(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM fcfs with its prefix cache and no cache salt."""
    return VllmAdapter(policy="fcfs", tenants=tenants, cache="shared")


def make_salted_cache(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM fcfs with its prefix cache and ``cache_salt`` per tenant (claims SALT-ISOLATION)."""
    return VllmAdapter(policy="fcfs", tenants=tenants, cache="salted")
