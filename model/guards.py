"""The rules around the order policy in the waiting phase (SPEC.md 4.3, 4.5), as pure
functions of a view, each returning a decision the step applies
(:class:`~tenantry.model.waiting.WaitingPhase`):

* batch-slot caps: :func:`slot_room`, whether a tenant may put one more sequence in the batch;
* preemption for priority: :func:`plan_priority_preemption`, the lower-tier running
  sequences to evict so that waiting higher tiers get in;
* the starvation guard: :func:`guard_reservation`, the overdue head the waiting phase
  stops filling for;
* the skip budget: :func:`skip_pass` (and :func:`tier_skip_pass` under ``floors``,
  :func:`drr_skip_pass` under DRR), the tenant a pick may not pass over again, and
  :func:`inherited_skips`, a joiner's count.
"""

from __future__ import annotations

import math
from typing import Collection, Iterable, Mapping, Sequence as Seq

import attrs

from .config import Config
from .policies import VICTIM, VictimView
from .state import Sequence, TenantState


# --- preemption for priority (SPEC.md 4.5) ---------------------------------------------------


@attrs.frozen
class PriorityView:
    """What the priority-preemption plan may look at, at the start of the waiting phase.

    Attributes:
        config: the configuration.
        tenants: per-tenant records (running counts and blocks for the caps).
        ready: every ready queued sequence, as (tenant index, sequence).
        running: the running sequences, in batch order.
        freeable: request id -> blocks its eviction would free now (blocks).
        free_blocks: free blocks of the pool now (blocks).
    """

    config: Config
    tenants: Seq[TenantState]
    ready: Seq[tuple[int, Sequence]]
    running: Seq[Sequence]
    freeable: Mapping[int, int]
    free_blocks: int


def plan_priority_preemption(view: PriorityView) -> list[int]:
    """The running sequences to evict so that waiting higher tiers get in (request ids, in order).

    The ready queued sequences are taken in the order strict priority admits
    them (tier, then ``arrival_seq``).  Each claims a batch slot and the most
    blocks it can hold on entry (:func:`first_chunk_blocks_bound`).  One its
    own tenant's KV cap or slot caps refuse (counting the ones claimed before
    it) is passed over: evicting others cannot help it.  When the slots or
    blocks left do not hold it, the victims are running sequences of a strictly
    lower tier (larger tier number) that free at least ``min_free_blocks`` and
    have been evicted fewer than ``max_evictions`` times, in the order of the
    victim policy; they are taken until it fits, and only if it can be made to
    fit.  The plan ends when no running sequence of a lower tier than the next
    one is left.  Pure: reads the view only.
    """
    cfg = view.config
    key = VICTIM[cfg.eviction.victim]
    vv = VictimView(cfg, view.tenants)
    k_max, min_free = cfg.eviction.max_evictions, cfg.eviction.min_free_blocks
    tier_of = lambda i: cfg.tenants[i].tier  # noqa: E731
    seats = cfg.max_num_seqs - len(view.running)
    free = view.free_blocks
    alive = {s.request_id: s for s in view.running if (k_max is None or s.preemptions < k_max)
             and view.freeable[s.request_id] >= min_free}
    claimed: dict[int, int] = {}  # tenant -> sequences claimed by the plan
    claimed_blocks: dict[int, int] = {}
    claimed_tier: dict[int, int] = {}
    victims: list[int] = []
    for i, h in sorted(view.ready, key=lambda p: (tier_of(p[0]), p[1].arrival_seq)):
        tier = tier_of(i)
        if not any(tier_of(s.tenant) > tier for s in alive.values()):
            break  # no lower tier left to take a slot or blocks from, for this one or any after it
        need = first_chunk_blocks_bound(cfg, h)
        cap = cfg.tenants[i].kv_block_cap if cfg.admission.kv_cap else None
        if cap is not None and view.tenants[i].blocks + claimed_blocks.get(i, 0) + need > cap:
            continue
        if not _slot_room_after(cfg, view.tenants, i, claimed, claimed_tier):
            continue
        cands = sorted((s for s in alive.values() if tier_of(s.tenant) > tier), key=lambda s: key(vv, s))
        take: list[Sequence] = []
        s_left, f_left = seats, free
        for c in cands:
            if s_left >= 1 and need <= f_left:
                break
            take.append(c)
            s_left += 1
            f_left += view.freeable[c.request_id]
        if s_left < 1 or need > f_left:
            continue
        for c in take:
            del alive[c.request_id]
            victims.append(c.request_id)
        seats, free = s_left - 1, f_left - need
        claimed[i] = claimed.get(i, 0) + 1
        claimed_blocks[i] = claimed_blocks.get(i, 0) + need
        claimed_tier[tier] = claimed_tier.get(tier, 0) + 1
    return victims


def _slot_room_after(config: Config, tenants: Seq[TenantState], i: int, claimed: Mapping[int, int],
                     claimed_tier: Mapping[int, int]) -> bool:
    """:func:`slot_room` with ``claimed`` more sequences per tenant (and per tier) already in the batch."""
    adm = config.admission
    if not adm.slot_cap:
        return True
    tc = config.tenants[i]
    if tc.max_running_seqs is not None and tenants[i].running + claimed.get(i, 0) >= tc.max_running_seqs:
        return False
    if adm.tier_slot_caps:
        cap = adm.tier_slot_caps[min(tc.tier, len(adm.tier_slot_caps) - 1)]
        now = sum(t.running for j, t in enumerate(tenants) if config.tenants[j].tier == tc.tier)
        if now + claimed_tier.get(tc.tier, 0) >= cap:
            return False
    return True


def first_chunk_blocks_bound(config: Config, s: Sequence) -> int:
    """The most blocks sequence s can hold after entering the batch (blocks), counted
    against the pool and its tenant's KV cap: its first chunk at the whole token
    budget, ``blocks_for(min(target, token_budget))``; with a prefix cache its whole
    target, ``blocks_for(target)``, since cache hits add to the chunk (and a revived
    cached block takes a free one)."""
    if config.prefix_cache != "off":
        return config.blocks_for(s.target_tokens)
    return config.blocks_for(min(s.target_tokens, config.token_budget))


def slot_room(config: Config, tenants: Seq[TenantState], i: int) -> bool:
    """Tenant i may put one more sequence in the batch under the slot caps
    (its ``max_running_seqs`` and its tier's ``tier_slot_caps``, when
    ``admission.slot_cap``; SPEC.md 4.3)."""
    adm = config.admission
    if not adm.slot_cap:
        return True
    tc = config.tenants[i]
    if tc.max_running_seqs is not None and tenants[i].running >= tc.max_running_seqs:
        return False
    if adm.tier_slot_caps:
        cap = adm.tier_slot_caps[min(tc.tier, len(adm.tier_slot_caps) - 1)]
        if sum(t.running for j, t in enumerate(tenants) if config.tenants[j].tier == tc.tier) >= cap:
            return False
    return True


# --- starvation guard (SPEC.md 4.3) ----------------------------------------------------------


@attrs.frozen
class GuardView:
    """What the starvation guard may look at, at the start of the waiting phase.

    Attributes:
        config: the configuration.
        tenants: per-tenant records (blocks and running counts for the caps).
        heads: each backlogged tenant's first ready queued sequence, as (tenant index, sequence).
        free_blocks: free blocks of the pool now (blocks).
        step_index: the step; t_s: its start (seconds).
    """

    config: Config
    tenants: Seq[TenantState]
    heads: Seq[tuple[int, Sequence]]
    free_blocks: int
    step_index: int
    t_s: float


def overdue(config: Config, s: Sequence, step_index: int, t_s: float) -> bool:
    """A ready head is overdue: it has waited ``guard_steps`` steps since it became
    ready (``ready_step``), or, never scheduled, ``guard_wait_s`` seconds since its arrival."""
    o = config.order
    if o.guard_steps is not None and step_index - s.ready_step >= o.guard_steps:
        return True
    return o.guard_wait_s is not None and s.never_scheduled and t_s - s.request.arrival_s >= o.guard_wait_s


def guard_reservation(view: GuardView) -> int | None:
    """The request the waiting phase reserves the pool for, or None (SPEC.md 4.3).

    The oldest (by ``arrival_seq``) overdue head whose own tenant's KV cap and
    slot caps would take it, but the most blocks it can hold on entry
    (:func:`first_chunk_blocks_bound`) exceed the free blocks.  Pure: reads the
    view only.
    """
    cfg = view.config
    for i, h in sorted(view.heads, key=lambda p: p[1].arrival_seq):
        if not overdue(cfg, h, view.step_index, view.t_s):
            continue
        need = first_chunk_blocks_bound(cfg, h)
        cap = cfg.tenants[i].kv_block_cap if cfg.admission.kv_cap else None
        if (cap is not None and view.tenants[i].blocks + need > cap) or not slot_room(cfg, view.tenants, i):
            continue
        if need > view.free_blocks:
            return h.request_id
    return None


# --- skip budget (SPEC.md 4.3) ----------------------------------------------------------------


@attrs.frozen
class SkipView:
    """What the skip budget may look at when the order policy has picked a tenant.

    Attributes:
        config: the configuration (``order.guard_skips`` is K_skip).
        tenants: per-tenant records (``counter``, ``skips``).
        backlogged: the backlogged tenants (indices).
        candidates: the tenants not blocked in this step (backlogged; with strict tiers
            the policy picks among the best tier of these).
        capped: tenants whose head their own KV cap or slot cap refused in this step.
        picked: the tenant the policy picked.
        tier_counters, tier_skips: per tier (``floors``): counters and skip counts.
        provisional: provisional DRR charges of the step (``drr_block_seconds``'s
            reservations, block-seconds; ``drr_tokens``: none).
    """

    config: Config
    tenants: Seq[TenantState]
    backlogged: Iterable[int]
    candidates: Collection[int]
    capped: Collection[int]
    picked: int
    tier_counters: Seq[float] = ()
    tier_skips: Seq[int] = ()
    provisional: Mapping[int, float] = attrs.field(factory=dict)


def inherited_skips(others: Iterable[tuple[float, int]], counter: float, last_left: int) -> int:
    """The skip count of a tenant (``floors``: a tier) that joins the backlog with
    (lifted) ``counter`` (SPEC.md 4.3): the least count among ``others``, (counter,
    count) pairs of the accounts its lift may have copied (the other backlogged ones,
    or when none is, those emptied by cancellation in this step), whose counter is
    at most ``counter``; ``last_left`` (the last leaver's count) when there is none.
    A tenant passed over has others ahead of it by up to its count of charges, and
    they are as far ahead of a joiner lifted to its counter (SPEC.md 8.3).  Pure."""
    counts = [n for c, n in others if c <= counter]
    return min(counts) if counts else last_left


def skip_pass(view: SkipView) -> tuple[int | None, tuple[int, ...]]:
    """The skip budget's decision on one pick (SPEC.md 4.3): (the tenant to reserve
    for, or None; the tenants the pick passes over).

    The pick *passes over* every backlogged tenant that is not among the
    candidates (it was tried in this step and its head did not go in), whose counter is below the picked tenant's (it would have been
    picked had its head gone in) and whose head was not refused by its own KV
    or slot cap (a cap limits the tenant's share on purpose; only its own
    work makes room under it, as for the starvation guard).  If one of them has already been passed
    over ``guard_skips`` times in its backlog period, the waiting phase must stop
    filling: the result names the one with the least counter (then the oldest
    index) and passes nobody.  Pure: reads the view only.
    """
    ts, i, k = view.tenants, view.picked, view.config.order.guard_skips
    cands = view.candidates
    c = ts[i].counter
    capped = view.capped
    passed = tuple(sorted(g for g in view.backlogged
                          if g != i and g not in cands and g not in capped and ts[g].counter < c))
    full = [g for g in passed if ts[g].skips >= k]
    if full:
        return min(full, key=lambda g: (ts[g].counter, g)), ()
    return None, passed


def tier_skip_pass(view: SkipView) -> tuple[int | None, tuple[int, ...]]:
    """:func:`skip_pass` for ``floors``, over tiers (SPEC.md 4.3): (a tenant of the tier
    to reserve for, or None; the tiers the pick passes over).

    The pick passes over every tier other than the picked tenant's that has a
    backlogged tenant, none of them among the candidates, one of them not refused
    by its own caps, and a tier counter below the picked tier's.  If one of them
    was passed over ``guard_skips`` times, the result names the first uncapped
    backlogged tenant of the one with the least counter (then the lowest tier) and
    passes nobody.  Pure: reads the view only.
    """
    cfg, k = view.config, view.config.order.guard_skips
    tier_of = [t.tier for t in cfg.tenants]
    tc, ts = view.tier_counters, view.tier_skips
    mine = tier_of[view.picked]
    members: dict[int, list[int]] = {}
    for g in sorted(view.backlogged):
        members.setdefault(tier_of[g], []).append(g)
    passed = tuple(x for x, gs in sorted(members.items())
                   if x != mine and tc[x] < tc[mine] and not any(g in view.candidates for g in gs)
                   and any(g not in view.capped for g in gs))
    full = [x for x in passed if ts[x] >= k]
    if full:
        x = min(full, key=lambda y: (tc[y], y))
        return next(g for g in members[x] if g not in view.capped), ()
    return None, passed


def drr_skip_pass(view: SkipView) -> tuple[int | None, tuple[int, ...]]:
    """:func:`skip_pass` for DRR (``drr_tokens`` and ``drr_block_seconds``), on a refill
    (SPEC.md 4.3): (the tenant to reserve for, or None; the tenants the refill passes over).

    The refill gives every backlogged tenant the rounds ``r`` that make the first
    candidate positive (:func:`refill_drr`).  It passes over every backlogged tenant
    that is not a candidate, not refused by its own caps, and would have needed
    fewer rounds (``floor((provisional - deficit) / (q w)) + 1 < r``: it ends above
    one round; ``provisional`` is the step's block-second reservations under
    ``drr_block_seconds``, none under ``drr_tokens``, so one rule serves both units).
    If one of them was passed over ``guard_skips`` times, the result
    names the one with the fewest rounds needed (then the lowest index) and passes
    nobody.  ``view.picked`` is not read.  Pure.
    """
    cfg, ts, prov = view.config, view.tenants, view.provisional
    if not view.candidates:
        return None, ()
    q = cfg.order.drr_quantum
    need = lambda j: math.floor((prov.get(j, 0.0) - ts[j].deficit) / (q * cfg.tenants[j].weight)) + 1  # noqa: E731
    rounds = min(need(j) for j in view.candidates)
    passed = tuple(sorted(g for g in view.backlogged
                          if g not in view.candidates and g not in view.capped and need(g) < rounds))
    full = [g for g in passed if ts[g].skips >= cfg.order.guard_skips]
    if full:
        return min(full, key=lambda g: (need(g), g)), ()
    return None, passed
