"""Phase 4 of the step, the waiting sequences (SPEC.md 4.3-4.5 and 5).

:class:`WaitingPhase` is a part of :class:`tenantry.model.step.Step` (which
inherits it): the order policy picks tenants whose first ready request joins
the batch while sequences, budget and blocks allow; the starvation guard and the
skip budget may stop the filling and reserve for a head that does not fit, and a
waiting higher tier may preempt a running lower one.  The policies it calls are
the pure functions of :mod:`tenantry.model.policies` and :mod:`tenantry.model.guards`;
this class applies their choices to the step's scratch state and is not used alone.
"""

from __future__ import annotations

from .config import Config
from .events import Event
from .guards import (
    GuardView, PriorityView, SkipView, drr_skip_pass, guard_reservation, plan_priority_preemption, skip_pass,
    slot_room, tier_skip_pass,
)
from .policies import SelectView
from .state import Sequence


def strict_tier_candidates(cfg: Config, avail: set[int]) -> set[int]:
    """The tenants of ``avail`` in its best (lowest-numbered) tier: with
    ``order.strict_tiers`` the order policy picks among these only, and a lower tier
    is served only when none of them can go in this step (SPEC.md 4.3)."""
    best = min(cfg.tenants[j].tier for j in avail)
    return {j for j in avail if cfg.tenants[j].tier == best}


class WaitingPhase:
    """The waiting phase of :class:`~tenantry.model.step.Step`."""

    # --- 4. waiting sequences ------------------------------------------------------

    def schedule_waiting(self) -> None:
        """The order policy picks tenants whose first ready request joins the batch."""
        cfg, policy = self.cfg, self.policy
        if cfg.eviction.preempt_for_priority and self.backlogged:
            self._preempt_for_priority()
        if len(self.running) >= cfg.max_num_seqs or self.budget <= 0 or not self.backlogged:
            return
        if (cfg.order.guard_steps is not None or cfg.order.guard_wait_s is not None) and self._guard():
            return
        avail = set(self.backlogged)  # backlogged and not blocked in this step
        while avail and len(self.running) < cfg.max_num_seqs and self.budget > 0:
            cands = strict_tier_candidates(cfg, avail) if cfg.order.strict_tiers else avail
            view = self._view(cands)
            i = policy.select(view)
            if i is None and policy.refill is not None:
                refilled = ()
                if cfg.order.guard_skips is not None and cands:
                    stop, refilled = self._skip_guard(-1, avail, cands)
                    if stop:
                        return
                for j, d in policy.refill(view).items():
                    self._set(j, deficit=d)
                for g in refilled:
                    self._set(g, skips=self.tenants[g].skips + 1)
                i = policy.select(self._view(cands))
            if i is None:
                if cands is avail:
                    return
                avail -= cands  # nothing of this tier can go: the next tier's turn
                continue
            passed = ()
            if cfg.order.guard_skips is not None and policy.refill is None:
                stop, passed = self._skip_guard(i, avail)
                if stop:
                    return
            admitted = self._admit_head(i)
            if admitted and policy.refill is not None and self.tenants[i].skips \
                    and self.tenants[i].deficit <= cfg.order.drr_quantum * cfg.tenants[i].weight:
                self._set(i, skips=0)  # DRR: back within one round, the count starts again
            for g in passed if admitted else ():
                if self._tier_skips_on:
                    self.tier_skips[g] += 1
                else:
                    self._set(g, skips=self.tenants[g].skips + 1)
            if not admitted or not self.tenants[i].queue:
                avail.discard(i)

    def _preempt_for_priority(self) -> None:
        """Evict lower-tier running sequences so that waiting higher-tier requests fit
        (``eviction.preempt_for_priority``; the plan is
        :func:`~tenantry.model.guards.plan_priority_preemption`).  Each victim is
        evicted as in 4.5 (back to its queue's front, cooldown) with reason ``priority``."""
        ready = [(i, q) for i in self.backlogged for q in self.tenants[i].queue if q.ready_step <= self.k]
        if not ready:
            return
        view = PriorityView(self.cfg, self.tenants, ready, tuple(self.running.values()),
                            {rid: self._freeable(s) for rid, s in self.running.items()},
                            self.cfg.num_blocks - self.used)
        for rid in plan_priority_preemption(view):
            self._evict(self.running[rid], reason="priority")

    def _ready_heads(self) -> list[tuple[int, Sequence]]:
        """Each backlogged tenant's first ready queued sequence, as (tenant, sequence)."""
        heads = []
        for i in self.backlogged:
            h = next((q for q in self.tenants[i].queue if q.ready_step <= self.k), None)
            if h is not None:
                heads.append((i, h))
        return heads

    def _guard(self) -> bool:
        """The starvation guard (``guard_steps`` / ``guard_wait_s``): True, and the
        request recorded in :attr:`reserved`, when an overdue head does not fit and
        the waiting phase must admit nothing (:func:`~tenantry.model.guards.guard_reservation`)."""
        view = GuardView(self.cfg, self.tenants, self._ready_heads(), self.cfg.num_blocks - self.used, self.k, self.t)
        self.reserved = guard_reservation(view)
        return self.reserved is not None

    def _skip_guard(self, i: int, avail: set[int], cands: set[int] | None = None) -> tuple[bool, tuple[int, ...]]:
        """The skip budget (``guard_skips``) on the pick of tenant i, ``avail`` the tenants
        not blocked in this step (a lower tier waiting its strict-tier turn is not passed over):
        (True, ()) and the reservation recorded, when the pick would pass over a tenant
        whose budget is spent (the waiting phase stops filling); else (False, the
        tenants the pick passes over) (:func:`~tenantry.model.guards.skip_pass`).  Under DRR
        it runs before a refill (``i`` = -1, ``cands`` the refill's candidates)."""
        if self.policy.refill is not None:  # DRR: a refill past blocked tenants (drr_skip_pass)
            tried = self.backlogged - (avail - cands)  # a lower tier waiting its strict-tier turn was not tried
            view = SkipView(self.cfg, self.tenants, tried, cands, self.capped, i, provisional=self.provisional)
            g, passed = drr_skip_pass(view)
        else:
            view = SkipView(self.cfg, self.tenants, self.backlogged, avail, self.capped, i, self.tier_counters,
                            self.tier_skips)
            g, passed = (tier_skip_pass if self._tier_skips_on else skip_pass)(view)
        if g is None:
            return False, passed
        q = self.tenants[g].queue
        self.reserved = next((s for s in q if s.ready_step <= self.k), q[0]).request_id
        self.reserved_reason = "skips"
        return True, ()

    def _view(self, cands: set[int]) -> SelectView:
        """What the order policy sees when it picks among ``cands``."""
        return SelectView(self.cfg, self.tenants, cands, self.t, self.rr_next, self.tier_counters, self.provisional,
                          self.backlogged, self.k)

    def _admit_head(self, i: int) -> bool:
        """Move tenant i's first ready sequence into the batch; False if none is ready or it does not fit."""
        cfg, t = self.cfg, self.tenants[i]
        idx = next((j for j, q in enumerate(t.queue) if q.ready_step <= self.k), None)
        if idx is None:
            return False
        if not slot_room(cfg, self.tenants, i):
            self.capped.add(i)
            return False
        s = t.queue[idx]
        B = cfg.block_size_tokens
        hit = self._lookup(s.prefix_keys)
        hit = hit[: (s.target_tokens - 1) // B]
        computed0 = len(hit) * B
        n = min(s.target_tokens - computed0, self.budget)
        total = cfg.blocks_for(computed0 + n)
        private = total - len(hit)
        revived = sum(1 for key in hit if key not in self.refs)
        cap = self._cap(i)
        if cap is not None and t.blocks + total > cap:
            self.capped.add(i)
            return False
        if private + revived > cfg.num_blocks - self.used:
            return False
        if hit:
            for key in hit:
                if key in self.refs:
                    self.refs[key] += 1
                else:
                    del self.retained[key]
                    self.refs[key] = 1
            self.used += revived
        self._reclaim(private)
        self.used += private
        first = s.never_scheduled
        s = s._replace(computed_tokens=computed0, shared_keys=hit, private_blocks=private,
            cached_tokens=s.cached_tokens + min(computed0, s.request.prompt_tokens),
            first_scheduled_s=self.t if first else s.first_scheduled_s,
        )
        changes = {
            "queue": t.queue[:idx] + t.queue[idx + 1:],
            "running": t.running + 1,
            "blocks": t.blocks + total,
            "fresh_queued": t.fresh_queued - (1 if first else 0),
        }
        if first:
            s = self._charge_prompt(i, s, changes)
        if self.policy.deficit_unit == "block_seconds":
            self.provisional[i] = self.provisional.get(i, 0.0) + total * self.st.last_step_s
        t = self._set(i, **changes)
        if not t.queue:  # i leaves the backlog by being served: its counter is the lift (Algorithm 2's l)
            self.last_left = t.counter
            self.last_left_skips = t.skips
            tier = cfg.tenants[i].tier
            if all(cfg.tenants[j].tier != tier for j in self.backlogged):
                self.last_left_tier = self.tier_counters[tier]
                if self._tier_skips_on:
                    self.last_left_tier_skips = self.tier_skips[tier]
        self.running[s.request_id] = s
        self.planned[s.request_id] = n
        self.budget -= n
        self.rr_next = (i + 1) % len(self.tenants)
        self.events.append(Event("scheduled", s.request_id, i, self.t, tokens=computed0))
        return True

    def _charge_prompt(self, i: int, s: Sequence, changes: dict) -> Sequence:
        """Charge a sequence's prompt to its tenant when it is first scheduled (SPEC.md 4.4)."""
        cfg, t, tc = self.cfg, self.tenants[i], self.cfg.tenants[i]
        o = cfg.order
        cost = o.w_in * s.request.prompt_tokens
        predicted = (s.request.predicted_output_tokens or 0) if self.policy.charge_predicted else 0
        changes["counter"] = t.counter + (cost + o.w_out * predicted) / tc.weight
        changes["service"] = t.service + cost
        if self.policy.deficit_unit == "tokens":
            changes["deficit"] = t.deficit - cost
        self.tier_counters[tc.tier] += cost / o.tier_floors[min(tc.tier, len(o.tier_floors) - 1)]
        if s.charged_prompt_tokens and s.charged_prompt_tokens != s.request.prompt_tokens:
            changes["bucket_tokens"] = t.bucket_tokens - (s.request.prompt_tokens - s.charged_prompt_tokens)
        return s._replace(predicted_charge=predicted, charged_prompt_tokens=s.request.prompt_tokens)

    def _lookup(self, keys: tuple[int, ...]) -> tuple[int, ...]:
        """The longest prefix of ``keys`` present in the cache (referenced or retained)."""
        n = 0
        for key in keys:
            if key in self.refs or key in self.retained:
                n += 1
            else:
                break
        return keys[:n]
