"""State forms of the invariants: judge one step of the reference model.

Each ``check_*`` reads a :class:`StepContext` (the configuration, the state
before and after the step, the step's inputs and output) and returns a list of
:class:`~tenantry.spec.invariants_core.Finding`, empty when the step is
legal.  The checks never call the model's step logic: they recompute what the
rules in SPEC.md section 7 require from the states alone, so a broken model
(a mutant) cannot vouch for itself.
"""

from __future__ import annotations

from collections import Counter
from functools import cached_property

import attrs

from tenantry.model.config import Config
from tenantry.model.events import ADMISSION_REASONS, TERMINAL
from tenantry.model.state import Sequence, State
from tenantry.model.step import StepOutput
from tenantry.model.workload import StepInput

from .invariants_core import EPS, Finding, at_slot_cap, hopeless, largest_charge, slot_caps, tier_share



@attrs.frozen
class StepContext:
    """One transition of the model: ``prev --inputs--> state``, with ``output``."""

    config: Config
    prev: State
    inputs: StepInput
    state: State
    output: StepOutput

    @property
    def k(self) -> int:
        return self.output.step_index

    def name(self, i: int) -> str:
        return self.config.tenants[i].name

    @cached_property
    def prev_seqs(self) -> dict[int, Sequence]:
        return {s.request_id: s for s in self.prev.sequences()}

    @cached_property
    def new_running(self) -> dict[int, Sequence]:
        return {s.request_id: s for s in self.state.running}

    @cached_property
    def new_queued(self) -> dict[int, Sequence]:
        return {s.request_id: s for t in self.state.tenants for s in t.queue}

    @cached_property
    def gone(self) -> dict[int, Sequence]:
        return {s.request_id: s for s in self.output.finished}

    @cached_property
    def terminal_kind(self) -> dict[int, str]:
        return {e.request_id: e.kind for e in self.output.events if e.kind in TERMINAL}

    @cached_property
    def cancelled_ids(self) -> set[int]:
        return {e.request_id for e in self.output.events if e.kind == "cancelled"}

    @cached_property
    def batch(self) -> dict[int, int]:
        return dict(self.output.batch)

    @cached_property
    def evictions(self) -> list:
        """Preempted and evicted_too_often events, in the order they happened."""
        return [e for e in self.output.events
                if e.kind == "preempted" or (e.kind == "rejected" and e.reason == "evicted_too_often")]

    @cached_property
    def admitted_from_queue(self) -> list[Sequence]:
        """Sequences that were waiting (or arrived) and entered the batch this step, as they are now."""
        prev_running = {s.request_id for s in self.prev.running}
        out = []
        for rid in self.batch:
            if rid in prev_running:
                continue
            s = self.new_running.get(rid) or self.gone.get(rid)
            if s is not None:
                out.append(s)
        return out

    def after(self, rid: int) -> Sequence | None:
        """The sequence rid after the step, wherever it is (None if it left)."""
        return self.new_running.get(rid) or self.new_queued.get(rid) or self.gone.get(rid)


def _f(ctx: StepContext, inv: str, msg: str, observed, allowed, tenants=(), requests=()) -> Finding:
    return Finding(inv, ctx.k, tuple(tenants), tuple(requests), observed, allowed, msg)


# --- safety --------------------------------------------------------------------------


def check_kv_conserve(ctx: StepContext) -> list[Finding]:
    """KV-CONSERVE (SPEC.md 7.1): the pool's books balance after every step."""
    cfg, st, out = ctx.config, ctx.state, []
    kv = st.kv
    holders: Counter = Counter()
    private = 0
    for s in st.running:
        holders.update(s.shared_keys)
        private += s.private_blocks
        want = cfg.blocks_for(s.computed_tokens)
        if s.blocks_held != want:
            out.append(_f(ctx, "KV-CONSERVE", f"running request {s.request_id} holds {s.blocks_held} blocks "
                          f"for {s.computed_tokens} computed tokens", s.blocks_held, want,
                          [ctx.name(s.tenant)], [s.request_id]))
    expected_used = private + len(holders)
    if kv.used_blocks != expected_used:
        out.append(_f(ctx, "KV-CONSERVE", "blocks in use differ from the blocks running sequences hold "
                      f"({private} private + {len(holders)} shared)", kv.used_blocks, expected_used))
    if not 0 <= kv.used_blocks <= cfg.num_blocks:
        out.append(_f(ctx, "KV-CONSERVE", "blocks in use outside [0, num_blocks]", kv.used_blocks, cfg.num_blocks))
    if dict(holders) != dict(kv.refs):
        bad = sorted(set(holders.items()) ^ set(kv.refs.items()))[:3]
        out.append(_f(ctx, "KV-CONSERVE", f"prefix-cache reference counts differ from the sequences holding them {bad}",
                      len(kv.refs), len(holders)))
    both = set(kv.retained) & set(kv.refs)
    if both:
        out.append(_f(ctx, "KV-CONSERVE", "a block is both referenced and on the free (retained) list", len(both), 0))
    if len(kv.retained) > cfg.num_blocks - kv.used_blocks:
        out.append(_f(ctx, "KV-CONSERVE", "more retained cache blocks than free blocks",
                      len(kv.retained), cfg.num_blocks - kv.used_blocks))
    for i, t in enumerate(st.tenants):
        mine = [s for s in st.running if s.tenant == i]
        held = sum(s.blocks_held for s in mine)
        if t.blocks != held or t.running != len(mine):
            out.append(_f(ctx, "KV-CONSERVE", f"tenant's books say {t.running} running holding {t.blocks} blocks, "
                          f"its sequences are {len(mine)} holding {held}", t.blocks, held, [ctx.name(i)]))
        for s in t.queue:
            if s.blocks_held or s.computed_tokens:
                out.append(_f(ctx, "KV-CONSERVE", "a waiting request holds KV", s.blocks_held, 0,
                              [ctx.name(i)], [s.request_id]))
    return out


def check_kv_cap(ctx: StepContext) -> list[Finding]:
    """KV-CAP (SPEC.md 7.1): the pool and every enforced tenant cap are respected."""
    cfg, st, out = ctx.config, ctx.state, []
    if st.kv.used_blocks > cfg.num_blocks:
        out.append(_f(ctx, "KV-CAP", "blocks in use exceed the pool", st.kv.used_blocks, cfg.num_blocks))
    if cfg.admission.kv_cap:
        for i, t in enumerate(st.tenants):
            cap = cfg.tenants[i].kv_block_cap
            held = sum(s.blocks_held for s in st.running if s.tenant == i)
            if cap is not None and held > cap:
                out.append(_f(ctx, "KV-CAP", "a tenant's sequences hold more blocks than its cap", held, cap,
                              [ctx.name(i)], [s.request_id for s in st.running if s.tenant == i]))
    return out


def check_slot_cap(ctx: StepContext) -> list[Finding]:
    """SLOT-CAP (SPEC.md 7.1): with ``slot_cap``, the sequences of a tenant in the
    step's batch (running after the waiting phase: running after the step plus
    those that finished in it) number at most its ``max_running_seqs``, and
    those of a tier at most the tier's ``tier_slot_caps`` entry."""
    cfg, out = ctx.config, []
    if not cfg.admission.slot_cap:
        return out
    during = list(ctx.state.running) + [ctx.gone[e.request_id] for e in ctx.output.events if e.kind == "finished"]
    per, tiers = Counter(s.tenant for s in during), Counter(cfg.tenants[s.tenant].tier for s in during)
    seen_tiers = set()
    for i, tc in enumerate(cfg.tenants):
        own, tier_cap = slot_caps(cfg, tc.name)
        if own is not None and per[i] > own:
            out.append(_f(ctx, "SLOT-CAP", "a tenant has more sequences in the batch than its slot cap", per[i], own,
                          [tc.name], [s.request_id for s in during if s.tenant == i]))
        if tier_cap is not None and tiers[tc.tier] > tier_cap and tc.tier not in seen_tiers:
            seen_tiers.add(tc.tier)
            out.append(_f(ctx, "SLOT-CAP", f"tier {tc.tier} has more sequences in the batch than its slot cap",
                          tiers[tc.tier], tier_cap, sorted({cfg.tenants[s.tenant].name for s in during
                                                            if cfg.tenants[s.tenant].tier == tc.tier}),
                          [s.request_id for s in during if cfg.tenants[s.tenant].tier == tc.tier]))
    return out


def check_queue_bound(ctx: StepContext) -> list[Finding]:
    """QUEUE-BOUND (SPEC.md 7.1): never-scheduled queued requests stay within the
    bound, an arrival that finds the queue full is refused ``queue_full`` at once,
    and ``queue_full`` is never given while there is room."""
    cfg, out = ctx.config, []
    if not cfg.admission.queue_bound:
        return out
    fresh = [sum(1 for s in t.queue if s.never_scheduled) for t in ctx.prev.tenants]
    for i, t in enumerate(ctx.state.tenants):
        n = sum(1 for s in t.queue if s.never_scheduled)
        if t.fresh_queued != n:
            out.append(_f(ctx, "QUEUE-BOUND", "the queue-bound count differs from the never-scheduled queued requests",
                          t.fresh_queued, n, [ctx.name(i)]))
    arrivals = {r.request_id: r for r in ctx.inputs.arrivals}
    for e in ctx.output.events:
        i, bound = e.tenant, cfg.tenants[e.tenant].queue_bound
        if e.kind == "cancelled":
            s = ctx.prev_seqs.get(e.request_id)
            if s is not None and s.never_scheduled:
                fresh[i] -= 1
        elif e.kind == "queued" and e.request_id in arrivals:
            fresh[i] += 1
            if bound is not None and fresh[i] > bound:
                out.append(_f(ctx, "QUEUE-BOUND", "a request was queued past the tenant's queue bound",
                              fresh[i], bound, [ctx.name(i)], [e.request_id]))
        elif e.kind == "rejected" and e.reason == "queue_full":
            if bound is None or fresh[i] < bound:
                out.append(_f(ctx, "QUEUE-BOUND", "queue_full given while the queue had room",
                              fresh[i], f"refuse only at {bound}", [ctx.name(i)], [e.request_id]))
    return out


def check_no_loss(ctx: StepContext) -> list[Finding]:
    """NO-LOSS (SPEC.md 7.1): every request is in exactly one place, and leaves
    only through exactly one terminal event; a request that can never finish
    (:func:`hopeless`) is never queued."""
    out = []
    events_by: dict[int, list[str]] = {}
    for e in ctx.output.events:
        events_by.setdefault(e.request_id, []).append(e.kind if e.kind != "rejected" else f"rejected:{e.reason}")
    places = Counter(s.request_id for s in ctx.state.sequences())
    for rid, n in places.items():
        if n > 1:
            out.append(_f(ctx, "NO-LOSS", "a request is in more than one place", n, 1, requests=[rid]))
    for i, t in enumerate(ctx.state.tenants):
        for s in t.queue:
            if s.tenant != i:
                out.append(_f(ctx, "NO-LOSS", "a request waits in another tenant's queue", ctx.name(i),
                              ctx.name(s.tenant), requests=[s.request_id]))
    known = set(ctx.prev_seqs)
    for r in ctx.inputs.arrivals:
        ev = [k for k in events_by.get(r.request_id, []) if k == "queued" or k.split(":")[-1] in ADMISSION_REASONS]
        if len(ev) != 1:
            out.append(_f(ctx, "NO-LOSS", "an arrival was not answered exactly once (queued or refused)",
                          len(ev), 1, requests=[r.request_id]))
        if "queued" in ev:
            known.add(r.request_id)
            if hopeless(ctx.config, r.prompt_tokens, r.output_tokens):
                out.append(_f(ctx, "NO-LOSS", "a request whose KV can never fit the pool was queued (it can never "
                              "finish; it is refused too_large)", r.total_tokens - 1,
                              ctx.config.num_blocks * ctx.config.block_size_tokens, requests=[r.request_id]))
    for rid in known:
        here = rid in places
        kinds = [k for k in events_by.get(rid, []) if k.split(":")[0] in TERMINAL]
        if here and kinds:
            out.append(_f(ctx, "NO-LOSS", f"a request ended ({kinds[0]}) but is still held", len(kinds), 0,
                          requests=[rid]))
        if not here:
            if len(kinds) != 1 or rid not in ctx.gone:
                out.append(_f(ctx, "NO-LOSS", "a request left the state without exactly one terminal event",
                              len(kinds), 1, requests=[rid]))
            elif kinds[0] == "finished":
                s = ctx.gone[rid]
                if s.output_done != s.request.output_tokens:
                    out.append(_f(ctx, "NO-LOSS", "a request finished before producing all its tokens",
                                  s.output_done, s.request.output_tokens, requests=[rid]))
    stray = set(places) - known
    if stray:
        out.append(_f(ctx, "NO-LOSS", "a request appeared that was never admitted", len(stray), 0,
                      requests=sorted(stray)))
    return out


def check_batch_limits(ctx: StepContext) -> list[Finding]:
    """BATCH-LIMITS (SPEC.md 7.1): sequences, tokens and chunks within the limits;
    a request preempted in a step is not in that step's batch."""
    cfg, out = ctx.config, []
    if len(ctx.state.running) > cfg.max_num_seqs:
        out.append(_f(ctx, "BATCH-LIMITS", "more sequences running than max_num_seqs",
                      len(ctx.state.running), cfg.max_num_seqs))
    total = sum(n for _, n in ctx.output.batch)
    if total > cfg.token_budget:
        out.append(_f(ctx, "BATCH-LIMITS", "the batch has more tokens than the step's token budget", total,
                      cfg.token_budget, requests=[r for r, _ in ctx.output.batch]))
    ids = [r for r, _ in ctx.output.batch]
    if len(set(ids)) != len(ids):
        out.append(_f(ctx, "BATCH-LIMITS", "a request is in the batch twice", len(ids), len(set(ids))))
    both = set(ids) & set(ctx.output.preempted)
    if both:
        out.append(_f(ctx, "BATCH-LIMITS", "a request preempted in this step is still in its batch", len(both), 0,
                      requests=sorted(both)))
    prev_running = {s.request_id for s in ctx.prev.running}
    for rid, n in ctx.output.batch:
        before = ctx.prev_seqs.get(rid)
        after = ctx.new_running.get(rid) or ctx.gone.get(rid)
        if after is None:
            out.append(_f(ctx, "BATCH-LIMITS", "a batch entry's request is neither running nor finished", n, 0,
                          requests=[rid]))
            continue
        done = before.output_done if before is not None else 0
        target = after.request.prompt_tokens + done
        computed0 = before.computed_tokens if rid in prev_running else after.computed_tokens - n
        if n < 1 or computed0 < 0 or computed0 + n > target:
            out.append(_f(ctx, "BATCH-LIMITS", "a batch entry computes no token or more than the request has left",
                          n, target - max(computed0, 0), [ctx.name(after.tenant)], [rid]))
    return out


def check_work_conserving(ctx: StepContext) -> list[Finding]:
    """WORK-CONSERVING (SPEC.md 7.1): a step leaves no sequence slot and no
    budget unused while a ready waiting request would certainly have fitted
    (unless the starvation guard reserved the pool in the step: GUARD)."""
    cfg, st = ctx.config, ctx.state
    finished = [ctx.gone[e.request_id] for e in ctx.output.events if e.kind == "finished"]
    at_wait = list(st.running) + finished
    slots = cfg.max_num_seqs - len(at_wait)
    budget = cfg.token_budget - sum(n for _, n in ctx.output.batch)
    if slots <= 0 or budget <= 0 or ctx.output.reserved is not None:  # a guard's reservation: GUARD judges it
        return []
    keys: set = set()
    private = 0
    per_tenant = Counter()
    for s in at_wait:
        keys.update(s.shared_keys)
        private += s.private_blocks
        per_tenant[s.tenant] += s.blocks_held
    free = cfg.num_blocks - private - len(keys)
    in_batch = [ctx.name(s.tenant) for s in at_wait]
    out = []
    for i, t in enumerate(st.tenants):
        ready = next((s for s in t.queue if s.ready_step <= ctx.k), None)
        if ready is None or at_slot_cap(cfg, ctx.name(i), in_batch):
            continue
        need = cfg.blocks_for(ready.target_tokens)
        cap = cfg.tenants[i].kv_block_cap if cfg.admission.kv_cap else None
        if need <= free and (cap is None or per_tenant[i] + need <= cap):
            out.append(_f(ctx, "WORK-CONSERVING", f"the step left {slots} slots and {budget} tokens unused while a "
                          f"ready request needing {need} blocks waited with {free} free", budget, 0,
                          [ctx.name(i)], [ready.request_id]))
    return out
