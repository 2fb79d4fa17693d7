"""Mutants: deliberately broken variants of the reference model, each named
with the invariants that must catch it (SPEC.md 7.7).

A mutant is a subclass of :class:`tenantry.model.step.Step` that overrides one
phase, one helper, or one entry of the policy tables (``ORDER`` / ``VICTIM``),
passed to the model as an argument (``step(..., variant=cls)``,
``simulate(..., variant=cls)``, ``run_checked(..., variant=cls)``).  Nothing
global is patched: a mutant is a value, picklable by name (its class is a
module-level name), safe in threads and process pools, and the model's
source never branches on it.

Each :class:`Mutant` also carries the configuration in which its bug can show
(``config``) and the shape of workload that exposes it (``shape``, read by
:func:`tenantry.testing.strategies.workloads`).
"""

from __future__ import annotations

import itertools

import attrs

from tenantry.model import policies
from tenantry.model.config import (
    AdmissionConfig, Config, CostConfig, EvictionConfig, OrderConfig, TenantConfig,
)
from tenantry.model.admission import estimated_wait_s, queued_blocks
from tenantry.model.state import prefix_keys
from tenantry.model.step import Step


@attrs.frozen
class Mutant:
    """One broken variant.

    Attributes:
        name: stable name; killers: invariant ids that must each catch it.
        description: what is broken, in one line.
        variant: the :class:`~tenantry.model.step.Step` subclass with the bug.
        config: a configuration in which the bug can show.
        shape: keyword arguments for the workload strategy that exposes it.
        pair: None, ``"determinism"`` (two runs of one workload) or
            ``"noninterference"`` (the second run relabels tenant ``b``'s contents).
        examples: workloads its hunt draws (:func:`tenantry.testing.hunt.hunt`):
            more for a bug that needs a rare sequence of events.
    """

    name: str
    killers: tuple[str, ...]
    description: str
    variant: type[Step]
    config: Config
    shape: dict = attrs.field(factory=dict)
    pair: str | None = None
    examples: int = 400


def _with(table: dict, key: str, value) -> dict:
    """A copy of a policy table with one entry replaced."""
    out = dict(table)
    out[key] = value
    return out


# --- the broken variants ------------------------------------------------------------------


class NoLift(Step):
    """VTC without the counter lift."""

    def _on_backlogged(self, i):
        return None


class CancelKeepsLift(Step):
    """A queue emptied by cancellation leaves the lift l where it was (the model
    before the fix: a tenant served alone that cancels its last queued request
    hands a newcomer an old, low l, and the spread passes D when it returns)."""

    def cancel(self, rid):
        kept = (self.last_left, self.last_left_skips, self.last_left_tier, self.last_left_tier_skips)
        super().cancel(rid)
        self.last_left, self.last_left_skips, self.last_left_tier, self.last_left_tier_skips = kept


class PromptOnlyCounter(Step):
    """Generated tokens never reach the VTC counter."""

    def _charge_step(self, i, block_s, tokens, counted):
        super()._charge_step(i, block_s, tokens, 0)


def _uncapped_refill(view):
    cfg = view.config
    loose = attrs.evolve(cfg, order=attrs.evolve(cfg.order, drr_carry_bound=None))
    return policies.refill_drr(attrs.evolve(view, config=loose))


class UncappedRefill(Step):
    """DRR's refill ignores the carry bound."""

    ORDER = _with(policies.ORDER, "drr_tokens", policies.OrderPolicy(
        policies.select_drr, _uncapped_refill, deficit_unit="tokens"))


class DrrNoReset(Step):
    """An idle tenant keeps its DRR deficit."""

    def execute(self):
        cfg = self.cfg
        self.cfg = attrs.evolve(cfg, order=attrs.evolve(cfg.order, drr_reset_when_idle=False))
        try:
            super().execute()
        finally:
            self.cfg = cfg


class FloorsAsStrictPriority(Step):
    """Strict priority sold as weighted floors."""

    ORDER = _with(policies.ORDER, "floors", policies.OrderPolicy(policies.select_priority))


class AgingAsStrictPriority(Step):
    """Strict priority sold as priority with aging."""

    ORDER = _with(policies.ORDER, "aging", policies.OrderPolicy(policies.select_priority))


class NoCooldown(Step):
    """A preempted sequence is ready again the next step."""

    def _evict(self, v):
        super()._evict(v)
        t = self.tenants[v.tenant]
        if t.queue and t.queue[0].request_id == v.request_id:
            self._set(v.tenant, queue=(t.queue[0]._replace(ready_step=self.k + 1),) + t.queue[1:])


class EvictionsOffByOne(Step):
    """A sequence may be evicted max_evictions + 1 times."""

    def _evict(self, v):
        k_max = self.cfg.eviction.max_evictions
        if k_max is None or v.preemptions != k_max:
            return super()._evict(v)
        super()._evict(v._replace(preemptions=v.preemptions - 1))
        t = self.tenants[v.tenant]
        if t.queue and t.queue[0].request_id == v.request_id:
            self._set(v.tenant, queue=(t.queue[0]._replace(preemptions=k_max + 1),) + t.queue[1:])


class MinFreeIgnored(Step):
    """Victims freeing fewer than min_free_blocks are evicted."""

    def _make_room(self, s, need):
        cfg = self.cfg
        self.cfg = attrs.evolve(cfg, eviction=attrs.evolve(cfg.eviction, min_free_blocks=0))
        try:
            return super()._make_room(s, need)
        finally:
            self.cfg = cfg


class VictimOldest(Step):
    """The 'newest' victim policy evicts the oldest sequence."""

    VICTIM = _with(policies.VICTIM, "newest", lambda view, s: (s.arrival_seq,))


class NoTenantCap(Step):
    """Per-tenant KV caps are not enforced."""

    def _cap(self, i):
        return None


class SaltIgnored(Step):
    """The salted prefix cache keys blocks without the salt."""

    def _prefix_keys(self, r, salt):
        return prefix_keys(self.cfg, r, None)


class BucketChargesRejected(Step):
    """The token bucket charges requests refused queue_full or kv_watermark."""

    def _reject(self, r, i, reason, retry_after_s, t_s):
        tc = self.cfg.tenants[i]
        if self.cfg.admission.token_bucket and tc.token_rate_per_s is not None and reason in ("queue_full",
                                                                                                "kv_watermark"):
            t = self._refill(i)
            self._set(i, bucket_tokens=t.bucket_tokens - r.prompt_tokens)
        return super()._reject(r, i, reason, retry_after_s, t_s)


class CancelLeaks(Step):
    """Cancelling a running request does not free its blocks."""

    def cancel(self, rid):
        s = self.running.pop(rid, None)
        if s is not None:
            self._drop(s, "cancelled")  # forgets self._release(s)
            return
        return super().cancel(rid)


class CancelSilent(Step):
    """Cancelling a queued request leaves no terminal event."""

    def cancel(self, rid):
        for i, t in enumerate(self.tenants):
            for j, q in enumerate(t.queue):
                if q.request_id == rid:
                    self._set(i, queue=t.queue[:j] + t.queue[j + 1:],
                              fresh_queued=t.fresh_queued - (1 if q.never_scheduled else 0))
                    return  # forgets self._drop(q, "cancelled"): no event, no record
        return super().cancel(rid)


class StaleBatchEntry(Step):
    """A preempted sequence stays in its step's batch."""

    def _evict(self, v):
        kept = self.planned.get(v.request_id)
        super()._evict(v)
        if kept is not None:  # the plan keeps the victim's entry and its share of the budget
            self.planned[v.request_id] = kept
            self.budget -= kept

    def execute(self):
        stale = {rid: n for rid, n in self.planned.items() if rid not in self.running}
        self.planned = {rid: n for rid, n in self.planned.items() if rid in self.running}
        super().execute()
        self.planned.update(stale)


class QueueBoundOffByOne(Step):
    """The queue bound admits one request too many (compares with > instead of >=)."""

    def arrive(self, r):
        i = self.cfg.tenant_index(r.tenant)
        t, bound = self.tenants[i], self.cfg.tenants[i].queue_bound
        if bound is None or t.fresh_queued != bound:
            return super().arrive(r)
        self.tenants[i] = t._replace(fresh_queued=bound - 1)
        super().arrive(r)
        self.tenants[i] = self.tenants[i]._replace(fresh_queued=self.tenants[i].fresh_queued + 1)


class AdmitsTooLarge(Step):
    """Admission checks the context limit only: a request larger than the pool is queued
    (it can never finish)."""

    def arrive(self, r):
        cfg = self.cfg
        if r.total_tokens > cfg.max_context_tokens or cfg.blocks_for(r.total_tokens) <= cfg.num_blocks:
            return super().arrive(r)
        super().arrive(attrs.evolve(r, prompt_tokens=1, output_tokens=1))  # queued as if it fitted ...
        i = cfg.tenant_index(r.tenant)
        t = self.tenants[i]
        self.tenants[i] = t._replace(queue=tuple(s._replace(request=r) if s.request_id == r.request_id else s
                                                 for s in t.queue))  # ... with its real size


class StopAtFirstMisfit(Step):
    """The batch stops filling at the first request that does not fit."""

    def _admit_head(self, i):
        ok = super()._admit_head(i)
        if not ok:
            self.budget = 0
        return ok


_tiebreak_calls = itertools.count()


def _select_vtc_global_tiebreak(view):
    """VTC whose ties go to a candidate picked by a process-wide call counter."""
    ts = view.tenants
    lo = min((ts[i].counter for i in view.candidates), default=None)
    if lo is None:
        return None
    ties = [i for i in view.candidates if ts[i].counter == lo]
    return ties[next(_tiebreak_calls) % len(ties)]


class VtcGlobalTiebreak(Step):
    """VTC breaks ties with a process-wide counter."""

    ORDER = _with(policies.ORDER, "vtc", policies.OrderPolicy(_select_vtc_global_tiebreak))


class RateLimitRefusesEarly(Step):
    """The request-rate limit refuses while the bucket still holds a request (below 2, not below 1)."""

    def arrive(self, r):
        i = self.cfg.tenant_index(r.tenant)
        tc = self.cfg.tenants[i]
        if self.cfg.admission.request_rate_limit and tc.request_rate_per_s is not None:
            t = self._refill(i)
            if 1.0 <= t.bucket_requests < 2.0:
                return self._reject(r, i, "rate_limit", (2.0 - t.bucket_requests) / tc.request_rate_per_s,
                                    r.arrival_s)
        return super().arrive(r)


class RequestBucketNotCharged(Step):
    """Admitted requests do not take from the request-rate bucket."""

    def arrive(self, r):
        i = self.cfg.tenant_index(r.tenant)
        before = self._refill(i).bucket_requests
        super().arrive(r)
        self.tenants[i] = self.tenants[i]._replace(bucket_requests=before)


class TokenBucketNotCharged(Step):
    """Admitted requests do not take their prompt from the token bucket."""

    def arrive(self, r):
        i = self.cfg.tenant_index(r.tenant)
        before = self._refill(i).bucket_tokens
        super().arrive(r)
        self.tenants[i] = self.tenants[i]._replace(bucket_tokens=before)


def _select_fcfs_skipping_last(view):
    """FCFS that never picks the last tenant (a starvation bug)."""
    last = len(view.tenants) - 1
    return policies.select_fcfs(attrs.evolve(view, candidates=[i for i in view.candidates if i != last]))


class SkipsLastTenant(Step):
    """The order policy never serves the last tenant."""

    ORDER = _with(policies.ORDER, "fcfs", policies.OrderPolicy(_select_fcfs_skipping_last))


class TenantQueueLifo(Step):
    """A tenant's newest waiting request enters the batch first."""

    def _admit_head(self, i):
        t = self.tenants[i]
        self.tenants[i] = t._replace(queue=tuple(reversed(t.queue)))
        ok = super()._admit_head(i)
        t2 = self.tenants[i]
        self.tenants[i] = t2._replace(queue=tuple(reversed(t2.queue)))
        return ok


def _select_by_tenant_index(view):
    """'FCFS' that serves the backlogged tenant with the smallest index first."""
    return min(view.candidates, default=None)


class FcfsByTenantIndex(Step):
    """FCFS keyed by tenant index instead of arrival."""

    ORDER = _with(policies.ORDER, "fcfs", policies.OrderPolicy(_select_by_tenant_index))


def _select_lowest_tier_first(view):
    """Priority with the tiers inverted: the largest tier number first."""
    ts = view.tenants
    return max(view.candidates, key=lambda i: (view.config.tenants[i].tier, -ts[i].queue[0].arrival_seq), default=None)


class PriorityInverted(Step):
    """Strict priority that serves the lowest tier first."""

    ORDER = _with(policies.ORDER, "priority", policies.OrderPolicy(_select_lowest_tier_first))


class EvictsOneMore(Step):
    """Eviction takes one more victim after the requester fits."""

    def _make_room(self, s, need):
        before = len(self.preempted)
        ok = super()._make_room(s, need)
        if ok and len(self.preempted) > before:
            others = [c for c in self.running.values() if c is not s]
            if others:
                view = policies.VictimView(self.cfg, self.tenants)
                key = self.VICTIM[self.cfg.eviction.victim]
                self._evict(min(others, key=lambda c: key(view, c)))
        return ok


class EvictsWithoutNeed(Step):
    """The newest running sequence is evicted whenever the pool is more than half full."""

    def schedule_running(self):
        if len(self.running) >= 2 and self.used * 2 > self.cfg.num_blocks:
            self._evict(max(self.running.values(), key=lambda c: c.arrival_seq))
        super().schedule_running()


class NoSlotCap(Step):
    """Batch-slot caps are not enforced (the queue head is admitted past its tenant's cap)."""

    def _admit_head(self, i):
        cfg = self.cfg
        self.cfg = attrs.evolve(cfg, admission=attrs.evolve(cfg.admission, slot_cap=False))
        try:
            return super()._admit_head(i)
        finally:
            self.cfg = cfg


class OutputNotReserved(Step):
    """The token bucket takes only the prompt at admission under ``reserve_output``, and
    charges generated tokens as they are produced (the behaviour before the option)."""

    def _reserved_output(self, i, tokens):
        return 0


class NoPriorityPreemption(Step):
    """``preempt_for_priority`` is ignored: a waiting higher tier never preempts."""

    def _preempt_for_priority(self):
        return None


class GuardIgnored(Step):
    """The starvation guard never reserves: an overdue head that does not fit is skipped."""

    def _guard(self):
        return False


class SkipBudgetIgnored(Step):
    """The skip budget counts the picks past a tenant (DRR: the refills past it) but never
    stops filling for it: the budget is judged as if it were unlimited."""

    def _skip_guard(self, i, avail, cands=None):
        cfg = self.cfg
        self.cfg = attrs.evolve(cfg, order=attrs.evolve(cfg.order, guard_skips=10 ** 9))
        try:
            return super()._skip_guard(i, avail, cands)
        finally:
            self.cfg = cfg


class StrictTiersIgnored(Step):
    """``strict_tiers`` is ignored: the policy picks across every tier."""

    def schedule_waiting(self):
        cfg = self.cfg
        self.cfg = attrs.evolve(cfg, order=attrs.evolve(cfg.order, strict_tiers=False))
        try:
            super().schedule_waiting()
        finally:
            self.cfg = cfg


class WaitCountsEveryTier(Step):
    """Estimated-wait shedding counts the queued work of every tier, not the arrival's own."""

    def _estimated_wait_s(self, tier):
        return sum(estimated_wait_s(self.cfg, self.tenants, t) for t in {tc.tier for tc in self.cfg.tenants})


class WatermarkCountsEveryTier(Step):
    """A queued-blocks watermark counts the queued blocks of every tier, lower ones too."""

    def _queued_blocks(self, tier):
        return queued_blocks(self.cfg, self.tenants, max(tc.tier for tc in self.cfg.tenants))


# --- configurations in which the bugs show --------------------------------------------


def _tenants(n: int = 3, **kw) -> tuple[TenantConfig, ...]:
    names, weights, tiers = ("a", "b", "c", "d"), (1.0, 2.0, 1.0, 0.5), (0, 1, 1, 2)
    return tuple(TenantConfig(names[i], weight=weights[i], tier=tiers[i], **kw) for i in range(n))


_UNIT = CostConfig(mode="unit", unit_step_s=0.01)


def _cfg(policy: str = "vtc", *, ample: bool = True, tenants=None, order=None, admission=None, eviction=None,
         prefix_cache: str = "off", **kw) -> Config:
    if tenants is None:
        tenants = _tenants()
    base = dict(block_size_tokens=16, max_num_seqs=4, token_budget=64, max_context_tokens=256)
    base.update(kw)
    if "num_blocks" not in base:
        base["num_blocks"] = base["max_num_seqs"] * -(-base["max_context_tokens"] // 16) if ample else 24
    return Config(tenants=tenants, order=order or OrderConfig(policy=policy, drr_quantum=64.0, drr_carry_bound=128.0),
                  admission=admission or AdmissionConfig(), eviction=eviction or EvictionConfig(),
                  cost=_UNIT, prefix_cache=prefix_cache, **base)


_TIGHT = EvictionConfig(victim="newest", min_free_blocks=0, cooldown_steps=0)

MUTANTS: dict[str, Mutant] = {m.name: m for m in (
    Mutant("vtc_no_lift", ("NO-BANKED-CREDIT",), "VTC without the counter lift: an idle tenant banks credit",
           NoLift, _cfg("vtc"), dict(idle_gaps=True)),
    Mutant("vtc_cancel_keeps_lift", ("VTC-GAP",),
           "a queue emptied by cancellation does not raise the lift l: a newcomer inherits an old l",
           CancelKeepsLift, _cfg("vtc", tenants=(TenantConfig("a"), TenantConfig("b")), max_num_seqs=1, max_context_tokens=16),
           dict(idle_gaps=True, cancels=True, max_requests=24), examples=1500),  # killed at the 1,123rd
    Mutant("vtc_prompt_only", ("VTC-GAP",), "VTC counters charge prompts but not generated tokens",
           PromptOnlyCounter, _cfg("vtc"), dict(long_outputs=True)),
    Mutant("drr_unbounded_carry", ("DRR-DEFICIT",), "DRR refill ignores the carry bound",
           UncappedRefill,
           _cfg("drr_tokens", order=OrderConfig(policy="drr_tokens", drr_quantum=64.0, drr_carry_bound=64.0))),
    Mutant("drr_no_idle_reset", ("NO-BANKED-CREDIT",), "DRR keeps an idle tenant's deficit",
           DrrNoReset, _cfg("drr_tokens"), dict(idle_gaps=True)),
    Mutant("floors_strict_priority", ("FLOOR",), "strict priority sold as weighted floors",
           FloorsAsStrictPriority,
           _cfg("floors", order=OrderConfig(policy="floors", tier_floors=(0.5, 0.3, 0.2)), max_num_seqs=1,
                max_context_tokens=48), dict(bursty=True)),
    Mutant("aging_strict_priority", ("AGING",), "strict priority sold as priority with aging",
           AgingAsStrictPriority,
           _cfg("aging", order=OrderConfig(policy="aging", aging_rate_per_s=50.0), max_num_seqs=1)),
    Mutant("evict_no_cooldown", ("EVICT-COOLDOWN",), "a preempted sequence is readmitted the next step",
           NoCooldown,
           _cfg("fcfs", ample=False, eviction=EvictionConfig(victim="newest", cooldown_steps=3)), dict(big=True)),
    Mutant("evict_max_off_by_one", ("EVICT-BOUNDED",), "a sequence may be evicted max_evictions + 1 times",
           EvictionsOffByOne,
           _cfg("fcfs", ample=False, eviction=EvictionConfig(victim="newest", max_evictions=1)), dict(big=True)),
    Mutant("evict_min_free_ignored", ("EVICT-MIN-FREE",), "victims freeing fewer than min_free_blocks are evicted",
           MinFreeIgnored,
           _cfg("fcfs", ample=False, eviction=EvictionConfig(victim="newest", min_free_blocks=3)), dict(big=True),
           examples=1000),
    Mutant("victim_oldest", ("VICTIM",), "the 'newest' victim policy evicts the oldest sequence",
           VictimOldest,
           _cfg("fcfs", ample=False, eviction=_TIGHT), dict(big=True)),
    Mutant("no_tenant_kv_cap", ("KV-CAP",), "per-tenant KV block caps are not enforced",
           NoTenantCap, _cfg("fcfs", tenants=_tenants(kv_block_cap=6)), dict(big=True)),
    Mutant("salt_ignored", ("SALT-ISOLATION", "NONINTERFERENCE"), "the salted prefix cache keys blocks without the salt",
           SaltIgnored, _cfg("fcfs", prefix_cache="salted"), dict(shared_prefixes=True), pair="noninterference"),
    Mutant("bucket_charges_rejected", ("TOKEN-BUCKET",), "the token bucket charges requests refused queue_full",
           BucketChargesRejected,
           _cfg("fcfs", tenants=_tenants(queue_bound=1, token_rate_per_s=2000.0, token_burst_tokens=400.0),
                admission=AdmissionConfig(token_bucket=True)), dict(bursty=True)),
    Mutant("token_bucket_not_charged", ("TOKEN-BUCKET",), "admitted requests do not take their prompt from the "
           "token bucket", TokenBucketNotCharged,
           _cfg("fcfs", tenants=_tenants(token_rate_per_s=200.0, token_burst_tokens=64.0),
                admission=AdmissionConfig(token_bucket=True)), dict(bursty=True)),
    Mutant("cancel_leaks_blocks", ("KV-CONSERVE",), "cancelling a running request does not free its blocks",
           CancelLeaks, _cfg("fcfs"), dict(cancels=True)),
    Mutant("cancel_drops_silently", ("NO-LOSS",), "cancelling a queued request leaves no terminal event",
           CancelSilent, _cfg("fcfs", max_num_seqs=1), dict(cancels=True)),
    Mutant("preempted_left_in_batch", ("BATCH-LIMITS",), "a preempted sequence stays in the step's batch",
           StaleBatchEntry, _cfg("priority", ample=False, eviction=_TIGHT), dict(big=True)),
    Mutant("queue_bound_off_by_one", ("QUEUE-BOUND",), "the queue bound admits one request too many",
           QueueBoundOffByOne, _cfg("fcfs", tenants=_tenants(queue_bound=2), max_num_seqs=1),
           dict(bursty=True)),
    Mutant("admits_too_large", ("NO-LOSS",), "a request larger than the pool is queued, not refused too_large",
           AdmitsTooLarge, _cfg("fcfs", num_blocks=8, eviction=_TIGHT), dict(big=True)),
    Mutant("stop_at_first_misfit", ("WORK-CONSERVING",), "the batch stops filling at the first request that does "
           "not fit", StopAtFirstMisfit, _cfg("fcfs", ample=False, eviction=_TIGHT),
           dict(big=True)),
    Mutant("vtc_global_tiebreak", ("DETERMINISM",), "VTC breaks ties with a process-wide counter",
           VtcGlobalTiebreak, _cfg("vtc"),
           pair="determinism"),
    Mutant("rate_limit_refuses_early", ("REFUSAL-TRUTH",), "the request-rate limit refuses with a request left "
           "in the bucket", RateLimitRefusesEarly,
           _cfg("fcfs", tenants=_tenants(request_rate_per_s=20.0, request_burst=3.0),
                admission=AdmissionConfig(request_rate_limit=True)), dict(bursty=True)),
    Mutant("request_bucket_not_charged", ("REQUEST-RATE",), "admitted requests do not take from the request "
           "bucket", RequestBucketNotCharged,
           _cfg("fcfs", tenants=_tenants(request_rate_per_s=20.0, request_burst=3.0),
                admission=AdmissionConfig(request_rate_limit=True)), dict(bursty=True)),
    Mutant("skips_last_tenant", ("BOUNDED-WAIT",), "the order policy never serves the last tenant",
           SkipsLastTenant, _cfg("fcfs", tenants=_tenants(max_wait_s=0.3), max_num_seqs=24, token_budget=256)),
    Mutant("tenant_queue_lifo", ("FCFS-TENANT",), "a tenant's newest request is served first", TenantQueueLifo,
           _cfg("fcfs", max_num_seqs=1), dict(bursty=True)),
    Mutant("fcfs_by_tenant_index", ("FCFS-TIER",), "FCFS serves the tenant with the smallest index first",
           FcfsByTenantIndex, _cfg("fcfs", max_num_seqs=1), dict(bursty=True)),
    Mutant("priority_inverted", ("TIER-ORDER",), "strict priority serves the lowest tier first", PriorityInverted,
           _cfg("priority", max_num_seqs=1), dict(bursty=True)),
    Mutant("evicts_one_more", ("EVICT-MINIMAL",), "eviction takes one more victim after the requester fits",
           EvictsOneMore, _cfg("fcfs", ample=False, eviction=_TIGHT), dict(big=True)),
    Mutant("no_slot_cap", ("SLOT-CAP",), "per-tenant batch-slot caps are not enforced", NoSlotCap,
           _cfg("fcfs", tenants=_tenants(max_running_seqs=1)), dict(bursty=True)),
    Mutant("output_not_reserved", ("TOKEN-LIMIT", "TOKEN-BUCKET"), "the token bucket does not reserve the output "
           "allowance at admission", OutputNotReserved,
           _cfg("fcfs", tenants=_tenants(token_rate_per_s=100.0, token_burst_tokens=120.0),
                admission=AdmissionConfig(token_bucket=True, reserve_output=True)), dict(bursty=True)),
    Mutant("no_priority_preemption", ("PRIORITY-PREEMPT",), "a waiting higher tier never preempts a running lower "
           "tier", NoPriorityPreemption,
           _cfg("priority", max_num_seqs=1, eviction=EvictionConfig(victim="lowest_priority",
                                                                     preempt_for_priority=True)),
           dict(long_outputs=True)),
    Mutant("guard_ignored", ("GUARD",), "the starvation guard never stops filling for an overdue head",
           GuardIgnored, _cfg("fcfs", ample=False, eviction=_TIGHT,
                              order=OrderConfig(policy="fcfs", guard_steps=3)), dict(big=True)),
    Mutant("skip_budget_ignored", ("GUARD",), "the skip budget never stops filling for a tenant passed over "
           "guard_skips times", SkipBudgetIgnored,
           _cfg("vtc", ample=False, eviction=_TIGHT, order=OrderConfig(policy="vtc", guard_skips=1)),
           dict(big=True, long_outputs=True)),
    Mutant("skip_budget_ignored_block_seconds", ("GUARD", "DRR-DEFICIT"), "under drr_block_seconds the skip budget never stops "
           "filling for a tenant a refill passed over guard_skips times", SkipBudgetIgnored,
           _cfg("drr_block_seconds", ample=False, eviction=_TIGHT,
                order=OrderConfig(policy="drr_block_seconds", drr_quantum=64.0, drr_carry_bound=None, guard_skips=1)),
           dict(big=True, long_outputs=True), examples=1500),
    Mutant("strict_tiers_ignored", ("TIER-ORDER",), "strict_tiers has no effect: DRR picks across tiers",
           StrictTiersIgnored,
           _cfg("drr_tokens", max_num_seqs=1, order=OrderConfig(policy="drr_tokens", drr_quantum=64.0,
                                                                drr_carry_bound=128.0, strict_tiers=True)),
           dict(bursty=True)),
    Mutant("wait_counts_every_tier", ("REFUSAL-TRUTH",), "estimated-wait shedding counts every tier's queued "
           "work", WaitCountsEveryTier,
           _cfg("fcfs", max_num_seqs=1, admission=AdmissionConfig(wait_limits_s=(0.05,),
                                                                  wait_service_rate_tokens_per_s=2000.0)),
           dict(bursty=True)),
    Mutant("watermark_counts_every_tier", ("REFUSAL-TRUTH",), "a queued-blocks KV watermark counts the queued "
           "blocks of lower tiers too", WatermarkCountsEveryTier,
           _cfg("fcfs", ample=False, max_num_seqs=1, admission=AdmissionConfig(kv_watermarks=(0.9,),
                                                                               kv_watermark_queued=True)),
           dict(bursty=True)),
    Mutant("evicts_without_need", ("EVICT-PROGRESS",), "the newest sequence is evicted whenever the pool is half "
           "full", EvictsWithoutNeed, _cfg("fcfs", ample=False, eviction=_TIGHT), dict(big=True)),
)}


# --- Fleet mutants (SPEC.md 7.9): subclasses of the fleet, not of the step -------------------------------------

from typing import Callable  # noqa: E402

from tenantry.runner.fleet import Fleet
from tenantry.model.routers import FleetConfig
from tenantry.model.workload import Request  # noqa: E402


class RouteLoses(Fleet):
    """The router records a route for every third arrival but never hands it to the replica."""

    def deliver(self, request, replica, arrivals):
        if request.request_id % 3 != 2:
            super().deliver(request, replica, arrivals)


class AffinityUnbounded(Fleet):
    """Prefix affinity without its load bound: every request follows its cached prefix."""

    def route_view(self, request, pending):
        return attrs.evolve(super().route_view(request, pending), bound=1 << 60)


class CountersUnread(Fleet):
    """Fleet accounting whose replicas never read the fleet counters (each keeps its own)."""

    def share(self, replica, counters):
        pass


class FleetNoLift(Fleet):
    """Fleet accounting without the fleet's lift: a tenant back from idle keeps its old counter (banked credit)."""

    def _lift(self, backlog, arriving):
        pass


@attrs.frozen
class FleetMutant:
    """One broken fleet: its name, the fleet invariants that must catch it, what is broken,
    the :class:`~tenantry.runner.fleet.Fleet` subclass, and the fleet and workload that
    expose it (``fleet()`` and ``workload()``, deterministic)."""

    name: str
    killers: tuple[str, ...]
    description: str
    variant: type
    fleet: Callable[[], FleetConfig]
    workload: Callable[[], list[Request]]


def _fleet_replica(policy: str = "vtc", prefix_cache: str = "off") -> Config:
    return _cfg(policy, tenants=(TenantConfig("a"), TenantConfig("b"), TenantConfig("c")), prefix_cache=prefix_cache,
                max_context_tokens=512, token_budget=256)


def _three_floods() -> list[Request]:
    """a, b and c each send a 300-token, 40-token-output request every 30 ms for 9 s."""
    return [Request(i, "abc"[i % 3], i * 0.01, 300, 40) for i in range(900)]


def _idle_return() -> list[Request]:
    """:func:`_three_floods` with tenant c silent from 1 s to 5 s: it comes back with a counter far behind."""
    return [q for q in _three_floods() if not (q.tenant == "c" and 1.0 <= q.arrival_s < 5.0)]


def _one_prefix() -> list[Request]:
    """60 requests sharing one 8-block prefix, 10 ms apart (affinity wants them all on one replica)."""
    return [Request(i, "abc"[i % 3], i * 0.01, 160, 20, prefix_ids=tuple(range(8))) for i in range(60)]


FLEET_MUTANTS: dict[str, FleetMutant] = {m.name: m for m in (
    FleetMutant("route_loses", ("FLEET-NO-LOSS",), "every third arrival is routed and never delivered", RouteLoses,
                lambda: FleetConfig((_fleet_replica(),) * 2, router="round_robin"), _three_floods),
    FleetMutant("affinity_unbounded", ("ROUTE-LOAD-BOUND",), "prefix affinity ignores its load bound",
                AffinityUnbounded,
                lambda: FleetConfig((_fleet_replica(prefix_cache="shared"),) * 4, router="prefix_affinity"),
                _one_prefix),
    FleetMutant("counters_unread", ("FLEET-VTC-GAP",), "fleet accounting whose replicas keep their own counters",
                CountersUnread,
                lambda: FleetConfig((_fleet_replica(),) * 2, router="tenant_affinity", accounting="fleet",
                                    tenant_replicas={"a": (0,), "b": (0, 1), "c": (1,)}), _three_floods),
    FleetMutant("fleet_no_lift", ("FLEET-VTC-GAP",), "fleet accounting without the fleet's counter lift",
                FleetNoLift,
                lambda: FleetConfig((_fleet_replica(),) * 2, router="round_robin", accounting="fleet"), _idle_return),
)}
