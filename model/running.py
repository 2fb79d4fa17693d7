"""Phase 3 of the step, the running sequences, and the lazy decode ledger (SPEC.md 3 and 5).

:class:`RunningPhase` is a part of :class:`tenantry.model.step.Step` (which
inherits it): every running sequence, in batch order, gets its next chunk
(prefill) or token (decode) within the token budget, allocating KV blocks and
preempting victims when the pool or the tenant's cap is full.  It works on the
step's scratch state (the attributes :class:`~tenantry.model.step.Step` sets up)
and is not used alone; a variant of the model overrides its methods on a
subclass of ``Step`` like any other.

Decode progress is lazy: a sequence in steady decode is kept as it was at the
start of its mark step and brought up to date only when it must be treated alone
(:meth:`RunningPhase._materialize`).
"""

from __future__ import annotations

from .events import Event
from .policies import VictimView
from .state import Sequence, decoded, with_private_blocks


class RunningPhase:
    """The running phase and the lazy ledger of :class:`~tenantry.model.step.Step`."""

    # --- the lazy ledger ---------------------------------------------------------------

    def _materialize(self, rid: int) -> None:
        """Bring running sequence ``rid`` up to date if it is lazy (it stops being lazy)."""
        mark = self.lazy.pop(rid, None)
        if mark is not None:
            self.running[rid] = decoded(self.running[rid], self.k - mark)

    def _materialize_all(self) -> None:
        """Bring every lazy running sequence up to date (before anything compares them)."""
        if self.lazy:
            running, k = self.running, self.k
            for rid, mark in self.lazy.items():
                running[rid] = decoded(running[rid], k - mark)
            self.lazy.clear()
        self.due = {}

    def _due_at(self, s: Sequence, mark: int) -> int:
        """The first step at which sequence ``s``, exact at the start of step ``mark`` and
        decoding one token a step, needs a new KV block or generates its last token."""
        blocks_at = mark + (len(s.shared_keys) + s.private_blocks) * self.cfg.block_size_tokens - s.computed_tokens
        last_at = mark + s.request.output_tokens - 1 - s.output_done
        return blocks_at if blocks_at < last_at else last_at

    def _lazify(self, rid: int, s: Sequence) -> None:
        """Sequence ``s`` (up to date after this step, in steady decode) becomes lazy
        from the next step on, unless it needs a KV block or finishes there already."""
        mark = self.k + 1
        due = self._due_at(s, mark)
        if due > mark:
            self.lazy[rid] = mark
            self.due[due] = self.due.get(due, ()) + (rid,)

    # --- 3. running sequences ------------------------------------------------------

    def schedule_running(self) -> None:
        """Each running sequence, in batch order, gets its next chunk or token.

        A lazy sequence (steady decode, no KV block due in this step: the ones
        due were brought up to date first) gets its one token without being
        read: the runs of lazy sequences between the others are planned whole."""
        bs = self.cfg.block_size_tokens
        running, planned, lazy, k = self.running, self.planned, self.lazy, self.k
        grow = set()  # lazy sequences whose next token needs a KV block in this step (and is not their last)
        for rid in self.due.pop(k, ()):
            mark = lazy.get(rid)
            if mark is None:
                continue
            s, d = running[rid], k - mark
            if s.output_done + d + 1 < s.request.output_tokens and \
                    s.computed_tokens + d >= (len(s.shared_keys) + s.private_blocks) * bs:
                grow.add(rid)
            else:
                self._materialize(rid)  # its last token (or it was listed early): treated alone
        get = running.get
        order = list(running)
        end = len(order)
        if not lazy:
            spots: list[int] | range = range(end)
        elif end - len(lazy) + len(grow) <= 8:  # positions of the sequences not lazy or growing, ascending
            spots = sorted(map(order.index, (running.keys() - lazy.keys()) | grow))
        else:
            spots = [j for j, rid in enumerate(order) if rid not in lazy or rid in grow]
        budget = self.budget  # kept in step with self.budget around anything that may evict
        p = 0
        for q in (*spots, end):
            if p < q:  # order[p:q]: lazy sequences, one token each (up to date and due nothing if evictions came)
                run = order[p:q] if len(running) == end else [rid for rid in order[p:q] if rid in running]
                if len(run) > budget:
                    run = run[:max(budget, 0)]
                planned.update(dict.fromkeys(run, 1))
                budget -= len(run)
            if q == end or budget <= 0:
                break
            rid = order[q]
            p = q + 1
            if rid in lazy:  # growing by one block: stays lazy when no eviction is needed
                grow.discard(rid)
                s = running[rid]
                i = s.tenant
                t, cap = self.tenants[i], self._cap(i)
                if self.used < self.cfg.num_blocks and (cap is None or t.blocks < cap):
                    self._reclaim(1)
                    self.used += 1
                    self._set(i, blocks=t.blocks + 1)
                    running[rid] = s = with_private_blocks(s, s.private_blocks + 1)  # as of its mark
                    due = self._due_at(s, lazy[rid])
                    self.due[due] = self.due.get(due, ()) + (rid,)
                    planned[rid] = 1
                    budget -= 1
                    continue
                self._materialize(rid)
            s = get(rid)
            if s is None:  # evicted earlier in this loop
                continue
            computed = s.computed_tokens
            n = s.request.prompt_tokens + s.output_done - computed
            if n > budget:
                n = budget
            need = -(-(computed + n) // bs) - len(s.shared_keys) - s.private_blocks
            if need > 0:
                self.budget = budget
                room = self._make_room(s, need)
                budget = self.budget  # an eviction gives back what its victim had planned
                if not room:
                    continue
                self._reclaim(need)
                self.used += need
                t = self.tenants[s.tenant]
                self._set(s.tenant, blocks=t.blocks + need)
                running[rid] = with_private_blocks(s, s.private_blocks + need)
            planned[rid] = n
            budget -= n
        self.budget = budget
        for rid in grow:  # left out by the budget: treated alone from the next step on
            self._materialize(rid)

    def _make_room(self, s: Sequence, need: int) -> bool:
        """Evict victims until s can allocate ``need`` blocks.  False if s stalls or is evicted itself."""
        cfg, cap = self.cfg, self._cap(s.tenant)
        key = self.VICTIM[cfg.eviction.victim]
        while True:
            pool_short = need - (cfg.num_blocks - self.used)
            cap_short = 0 if cap is None else self.tenants[s.tenant].blocks + need - cap
            if pool_short <= 0 and cap_short <= 0:
                return True
            self._materialize_all()  # the victim policy compares every running sequence
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
