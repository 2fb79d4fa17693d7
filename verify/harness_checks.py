"""Checks of the adapter harness, over one step's plan (a mixin of
:class:`~tenantry.verify.harness.Harness`).

Each method reads the harness's records of the requests and appends
:class:`~tenantry.spec.invariants_core.Finding` values; those that make the
run meaningless stop it.  Ids: KV-CAP, KV-CONSERVE, SALT-ISOLATION,
QUEUE-BOUND, WORK-CONSERVING (SPEC.md section 7) and REF-DIVERGENCE.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain
from typing import Any

from tenantry.model.step import idle, step as model_step
from tenantry.model.workload import StepInput

from .protocol import Plan
from tenantry.spec.invariants_core import Finding

from .protocol import finding


class Checks:
    """Plan checks; expects the attributes of :class:`~tenantry.verify.harness.Harness`."""

    def _check_queue_bound(self) -> None:
        cfg = self.config
        if not cfg.admission.queue_bound:
            return
        fresh: dict[str, int] = {}
        for q in self.live.values():
            if q.status == "waiting" and q.fresh:
                fresh[q.r.tenant] = fresh.get(q.r.tenant, 0) + 1
        for name, n in fresh.items():
            bound = cfg.tenants[cfg.tenant_index(name)].queue_bound
            if bound is not None and n > bound:
                newest = max((q for q in self.live.values() if q.status == "waiting" and q.fresh
                              and q.r.tenant == name), key=lambda q: q.r.request_id)
                self._stop(finding("QUEUE-BOUND", self.k, f"tenant {name} has {n} requests queued, over its bound "
                                   f"{bound}; request {newest.r.request_id} should have been refused queue_full",
                                   tenant=name, request_id=newest.r.request_id, observed=n, allowed=bound,
                                   call="add_request"))

    def _check_kv(self, plan: Plan, running: list, after: dict[int, int], entries: list) -> None:
        """KV-CAP, KV-CONSERVE and SALT-ISOLATION on the blocks the plan reports."""
        cfg, k, B = self.config, self.k, self.config.block_size_tokens
        if plan.blocks is None:
            for q in running:  # not reported: assume exactly what the tokens need
                q.blocks = cfg.blocks_for(after.get(q.r.request_id, q.computed))
            return
        live = {q.r.request_id for q in running}
        for rid, b in plan.blocks.items():
            if rid not in live and (b if isinstance(b, int) else len(b)):
                q = self.reqs.get(rid)
                state = q.status if q else "never given"
                self._stop(finding("KV-CONSERVE", k, f"request {rid} holds {b if isinstance(b, int) else len(b)} "
                                   f"KV blocks but is not running ({state}): the blocks leak",
                                   tenant=q.r.tenant if q else None, request_id=rid, observed=b, allowed=0,
                                   call="plan_step"))
                return
        tenant_blocks: dict[str, int] = {}
        with_ids = []
        for q in running:
            rid = q.r.request_id
            b = plan.blocks.get(rid, 0)
            ids = b if isinstance(b, tuple) else ()
            q.ids, q.blocks = ids, (len(ids) if isinstance(b, tuple) else b)
            need = cfg.blocks_for(after.get(rid, q.computed))
            if q.blocks < need:
                return self._stop(finding("KV-CONSERVE", k, f"request {rid} has {after.get(rid, q.computed)} tokens "
                                          f"of KV in {q.blocks} blocks; it needs {need}", tenant=q.r.tenant,
                                          request_id=rid, observed=q.blocks, allowed=need, call="plan_step"))
            tenant_blocks[q.r.tenant] = tenant_blocks.get(q.r.tenant, 0) + q.blocks
            if ids:
                with_ids.append(q)
        distinct = None
        if with_ids:
            distinct = set(chain.from_iterable(q.ids for q in with_ids))
            if len(distinct) < sum(len(q.ids) for q in with_ids) and self._check_sharing(with_ids):
                return
        used = len(distinct) if distinct is not None else (
            plan.used_blocks if plan.used_blocks is not None else sum(q.blocks for q in running))
        self.used_blocks = used
        if used > cfg.num_blocks:
            return self._stop(finding("KV-CAP", k, f"{used} KV blocks are in use; the pool has {cfg.num_blocks}",
                                      observed=used, allowed=cfg.num_blocks, call="plan_step"))
        if plan.free_blocks is not None and plan.free_blocks + used != cfg.num_blocks:
            return self._stop(finding("KV-CONSERVE", k, f"free blocks ({plan.free_blocks}) plus blocks held ({used}) "
                                      f"is {plan.free_blocks + used}, not the pool's {cfg.num_blocks}",
                                      observed=plan.free_blocks + used, allowed=cfg.num_blocks, call="plan_step"))
        if cfg.admission.kv_cap:
            for name, b in tenant_blocks.items():
                cap = cfg.tenants[cfg.tenant_index(name)].kv_block_cap
                if cap is not None and b > cap:
                    return self._stop(finding("KV-CAP", k, f"tenant {name} holds {b} KV blocks, over its cap {cap}",
                                              tenant=name, observed=b, allowed=cap, call="plan_step"))
        for q, n, c0, entering in entries:
            ids = q.ids
            if not ids:
                continue
            if entering and c0:
                for bid in ids[: c0 // B]:
                    self.stats["cache_hit_blocks"] += 1
                    w = self.writer.get(bid)
                    if w is None or w[0] == q.r.tenant:
                        continue
                    self.stats["cross_tenant_hit_blocks"] += 1
                    if "SALT-ISOLATION" in self.claimed and w[1] != q.salt:
                        return self._stop(finding("SALT-ISOLATION", k, f"request {q.r.request_id} (tenant "
                                                  f"{q.r.tenant}) reuses cached block {bid!r} written by tenant "
                                                  f"{w[0]} under another salt", tenant=q.r.tenant,
                                                  request_id=q.r.request_id, observed=w[0], call="plan_step"))
            for bid in ids[c0 // B: cfg.blocks_for(c0 + n)]:
                self.writer[bid] = (q.r.tenant, q.salt)

    def _check_sharing(self, with_ids: list) -> bool:
        """A block held by two requests: KV-CONSERVE with the cache off, SALT-ISOLATION
        across salts.  True if the run stopped."""
        cfg, k = self.config, self.k
        counts = Counter(chain.from_iterable(q.ids for q in with_ids))
        shared = {bid for bid, n in counts.items() if n > 1}
        holders: dict[Any, Any] = {}
        for q in with_ids:
            for bid in shared.intersection(q.ids):
                other = holders.setdefault(bid, q)
                if other is q:
                    continue
                rid = q.r.request_id
                if cfg.prefix_cache == "off":
                    self._stop(finding("KV-CONSERVE", k, f"block {bid!r} is held by requests {other.r.request_id} "
                                       f"and {rid} with the prefix cache off", tenant=q.r.tenant, request_id=rid,
                                       observed=other.r.request_id, call="plan_step"))
                    return True
                if other.salt != q.salt and cfg.prefix_cache == "salted":
                    self._stop(finding("SALT-ISOLATION", k, f"block {bid!r} is shared by request "
                                       f"{other.r.request_id} (tenant {other.r.tenant}) and request {rid} "
                                       f"(tenant {q.r.tenant}) under different salts", tenant=q.r.tenant,
                                       request_id=rid, observed=other.r.tenant, call="plan_step"))
                    return True
        return False

    def _check_work_conserving(self, running: list, batched: int) -> None:
        """WORK-CONSERVING, seen from outside: no tenant's first ready waiting request
        is left out while a seat, some token budget, and the blocks of the largest
        first chunk it could be given (``min(tokens, token_budget)``; its whole
        context with the prefix cache on) are free, within its tenant's cap.

        The chunk is bounded by the whole budget, not by what is left at the end
        of the step, because a greedy scheduler sizes a chunk when it picks it.
        """
        cfg, k = self.config, self.k
        seats = cfg.max_num_seqs - len(running)
        budget = cfg.token_budget - batched
        if seats <= 0 or budget <= 0:
            return
        free = cfg.num_blocks - self.used_blocks
        held: dict[str, int] = {}
        for q in running:
            held[q.r.tenant] = held.get(q.r.tenant, 0) + q.blocks
        heads: dict[str, Any] = {}
        for q in self._queue_order():
            if q.ready_step <= k and q.r.tenant not in heads:
                heads[q.r.tenant] = q
        for name, q in heads.items():
            need = cfg.blocks_for(q.target if cfg.prefix_cache != "off" else min(q.target, cfg.token_budget))
            cap = cfg.tenants[cfg.tenant_index(name)].kv_block_cap if cfg.admission.kv_cap else None
            if need <= free and (cap is None or held.get(name, 0) + need <= cap):
                self._find(finding("WORK-CONSERVING", k, f"request {q.r.request_id} of tenant {name} waits although "
                                   f"it fits: {seats} free seats, {budget} tokens of budget and {free} free blocks "
                                   f"left, it needs {need} blocks", tenant=name, request_id=q.r.request_id,
                                   observed=need, allowed=free, call="plan_step"))
                return

    def _queue_order(self) -> list:
        """Waiting requests in queue order: preempted ones first (latest preemption first), then by delivery."""
        return sorted((q for q in self.live.values() if q.status == "waiting"), key=lambda q: q.qkey)

    # --- the reference model in lockstep ----------------------------------------------

    def _compare_reference(self, arrivals: tuple, cancellations: tuple, plan: Plan, entries: list) -> None:
        """REF-DIVERGENCE: step the model on the same inputs and compare the decisions."""
        from .reference import model_plan

        cfg, k = self.config, self.k
        st = self.ref_state
        if self.t_s > st.t_s:
            st = idle(cfg, st, self.t_s)
        after, out = model_step(cfg, st, StepInput(arrivals, cancellations))
        self.ref_state = after
        ref = model_plan(cfg, st, out, after, blocks="none")
        ours_batch = {q.r.request_id: (n, c0) for q, n, c0, _ in entries}
        ref_batch = {e.request_id: (e.num_tokens, e.computed_tokens) for e in ref.batch}
        ours_rej = {rid: self.reqs[rid].reason for rid in self._step_rejections}
        ref_rej = {r.request_id: r.reason for r in ref.rejected}
        for what, ours, theirs in (("batch", ours_batch, ref_batch), ("preempted", set(plan.preempted),
                                   set(ref.preempted)), ("rejected", ours_rej, ref_rej)):
            if ours != theirs:
                self.diverged = True
                diff = _first_difference(ours, theirs)
                self._find(finding("REF-DIVERGENCE", k, f"the {what} differs from the reference model "
                                   f"({cfg.order.policy}) first at step {k}: request {diff[0]} is {diff[1]} here, "
                                   f"{diff[2]} in the reference", request_id=diff[0],
                                   tenant=self.reqs[diff[0]].r.tenant if diff[0] in self.reqs else None,
                                   observed=diff[1], allowed=diff[2], call="plan_step"))
                return


def _first_difference(ours: Any, theirs: Any) -> tuple[Any, Any, Any]:
    """(request id, ours, theirs) of the smallest request id where two decisions differ."""
    if isinstance(ours, set):
        rid = min(ours ^ theirs)
        return rid, "preempted" if rid in ours else "not preempted", "preempted" if rid in theirs else "not preempted"
    rid = min(set(ours) ^ set(theirs) | {r for r in ours if r in theirs and ours[r] != theirs[r]})
    return rid, ours.get(rid, "absent"), theirs.get(rid, "absent")
