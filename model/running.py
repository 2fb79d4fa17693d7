"""Phase 3 of the step, the running sequences (SPEC.md 4.3, 4.5 and 5).

:class:`RunningPhase` is a part of :class:`tenantry.model.step.Step` (which
inherits it): every running sequence, in batch order, gets its next chunk
(prefill) or token (decode) within the token budget, allocating KV blocks and
preempting victims when the pool or the tenant's cap is full.  It works on the
step's scratch state (the attributes :class:`~tenantry.model.step.Step` sets up)
and is not used alone; a variant of the model overrides its methods on a
subclass of ``Step`` like any other.
"""

from __future__ import annotations

from .events import Event
from .policies import VictimView
from .state import Sequence


class RunningPhase:
    """The running phase of :class:`~tenantry.model.step.Step`."""

    # --- 3. running sequences ------------------------------------------------------

    def schedule_running(self) -> None:
        """Each running sequence, in batch order, gets its next chunk or token: the tokens
        up to its target (its whole prompt, or one decode token), at most what is left of
        the token budget, once the KV blocks they need are allocated (evicting victims
        when the pool or its tenant's cap is short, :meth:`_make_room`).  The phase ends
        when the budget is spent."""
        bs = self.cfg.block_size_tokens
        for rid in list(self.running):
            if self.budget <= 0:
                break
            s = self.running.get(rid)
            if s is None:  # evicted earlier in this loop
                continue
            n = min(s.target_tokens - s.computed_tokens, self.budget)
            need = -(-(s.computed_tokens + n) // bs) - s.blocks_held  # blocks_for(computed + n) - blocks held
            if need > 0:
                if not self._make_room(s, need):
                    continue
                self._reclaim(need)
                self.used += need
                t = self.tenants[s.tenant]
                self._set(s.tenant, blocks=t.blocks + need)
                self.running[rid] = s._replace(private_blocks=s.private_blocks + need)
            self.planned[rid] = n
            self.budget -= n

    def _make_room(self, s: Sequence, need: int) -> bool:
        """Evict victims until s can allocate ``need`` blocks.  False if s stalls or is evicted itself."""
        cfg, cap = self.cfg, self._cap(s.tenant)
        key = self.VICTIM[cfg.eviction.victim]
        while True:
            pool_short = need - (cfg.num_blocks - self.used)
            cap_short = 0 if cap is None else self.tenants[s.tenant].blocks + need - cap
            if pool_short <= 0 and cap_short <= 0:
                return True
            view = VictimView(cfg, self.tenants)
            cands = [
                c for c in self.running.values()
                if (cap_short <= 0 or c.tenant == s.tenant)
                and (c is s or self._freeable(c) >= cfg.eviction.min_free_blocks)
            ]
            victim = min(cands, key=lambda c: key(view, c))
            self._evict(victim)
            if victim.request_id == s.request_id:
                return False

    def _evict(self, v: Sequence, reason: str | None = None) -> None:
        """Sequence v is preempted by recompute (or rejected if evicted too often).
        ``reason``: None when evicted to make room for a running sequence,
        ``priority`` when for a waiting higher tier (recorded on the event)."""
        rid = v.request_id
        del self.running[rid]
        if rid in self.planned:
            self.budget += self.planned.pop(rid)
        freed = self._release(v)
        k_max = self.cfg.eviction.max_evictions
        if k_max is not None and v.preemptions >= k_max:
            self._drop(v, "rejected", reason="evicted_too_often", blocks=freed)
            return
        self.preempted.append(rid)
        self.events.append(Event("preempted", rid, v.tenant, self.t, reason=reason, tokens=v.computed_tokens,
                                 blocks=freed))
        back = v._replace(computed_tokens=0, shared_keys=(), private_blocks=0, preemptions=v.preemptions + 1,
            wasted_tokens=v.wasted_tokens + v.computed_tokens,
            ready_step=self.k + 1 + self.cfg.eviction.cooldown_steps,
        )
        t = self.tenants[v.tenant]
        self._set(v.tenant, queue=(back,) + t.queue)
        if not t.queue:
            self._on_backlogged(v.tenant)
