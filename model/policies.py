"""Policies as small pure functions behind one signature each, in registries.

The step function never branches on a policy name: it looks the policy up here.

* Order (SPEC.md 4.3): ``select(view) -> tenant index | None`` picks which
  backlogged tenant's request enters the batch next, among ``view.candidates``
  (backlogged tenants not blocked in this step).  An optional
  ``refill(view) -> {tenant: deficit}`` runs before ``select`` (DRR rounds).
* Victim (SPEC.md 4.5): ``victim_key(view, seq) -> sortable``; the candidate
  with the smallest key is evicted first.
* Cost (SPEC.md 4.7): :func:`step_duration_s`.
"""

from __future__ import annotations

import math
from typing import Callable, Collection, Iterable, Mapping, Sequence as Seq

import attrs

from .config import Config
from .state import Sequence, TenantState


@attrs.frozen
class SelectView:
    """What an order policy may look at when it picks a tenant.

    Attributes:
        config: the configuration.
        tenants: per-tenant records as of this pick (accounting already updated
            by earlier picks in the same step).
        candidates: backlogged tenants not blocked in this step (a collection in
            no particular order; every policy breaks ties by the queue head's
            unique ``arrival_seq``, so the order never matters).
        t_s: start of the current step (seconds).
        rr_next: round robin's next tenant index.
        tier_counters: per-tier counters (``floors``).
        provisional: per-tenant charges made earlier in this step that the
            accounting does not hold yet (``drr_block_seconds``).
        backlogged: every backlogged tenant, blocked or not (None: derive
            from the queues).
        step_index: the step being planned: a tenant's head is its first
            request ready at this step (a preempted one in its cooldown is passed over).
    """

    config: Config
    tenants: Seq[TenantState]
    candidates: Seq[int]
    t_s: float
    rr_next: int
    tier_counters: Seq[float]
    provisional: Mapping[int, float]
    backlogged: Collection[int] | None = None
    step_index: int = 0


def _group_min(view: SelectView, key: Callable[[SelectView, int], tuple],
               group: Callable[[SelectView, int], object] | None = None) -> dict[object, int]:
    """For each group of candidates (one group when ``group`` is None), the
    candidate with the least ``key(view, i)``: one scan of the candidates.  Keys
    are unique (they end with the head's ``arrival_seq``), so the order of the
    candidates never matters."""
    gof = _no_group if group is None else group
    best: dict[object, tuple[tuple, int]] = {}
    for i in view.candidates:
        g, k = gof(view, i), key(view, i)
        if g not in best or k < best[g][0]:
            best[g] = (k, i)
    return {g: i for g, (k, i) in best.items()}


def _no_group(view: SelectView, i: int) -> None:
    return None


def _argmin(view: SelectView, key: Callable[[SelectView, int], tuple]) -> int | None:
    """The candidate with the least ``key(view, i)``."""
    return _group_min(view, key).get(None)


def _head(view: SelectView, i: int) -> Sequence:
    """Tenant i's head: its first request ready at this step (what it would put in the
    batch), or its first request when none is ready (the tenant is then skipped)."""
    q = view.tenants[i].queue
    return next((s for s in q if s.ready_step <= view.step_index), q[0])


def key_fcfs(view: SelectView, i: int) -> tuple:
    return (_head(view, i).arrival_seq,)


def select_fcfs(view: SelectView) -> int | None:
    """First come, first served across tenants: the oldest queue head (by admission order)."""
    return _argmin(view, key_fcfs)


def select_round_robin(view: SelectView) -> int | None:
    """Request round robin: the first candidate at or after ``rr_next``, cyclically.

    One request per tenant per turn, whatever its size: the naive baseline.
    """
    if not view.candidates:
        return None
    r, cands = view.rr_next, view.candidates
    after = [i for i in cands if i >= r]
    return min(after) if after else min(cands)


def key_vtc(view: SelectView, i: int) -> tuple:
    t = view.tenants[i]
    return (t.counter, _head(view, i).arrival_seq)


def select_vtc(view: SelectView) -> int | None:
    """Virtual Token Counter: the candidate with the least counter, ties to the oldest head.

    Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024, Algorithm 2.
    """
    return _argmin(view, key_vtc)


def key_drr(view: SelectView, i: int) -> tuple:
    t = view.tenants[i]
    return (-(t.deficit - view.provisional.get(i, 0.0)), _head(view, i).arrival_seq)


def select_drr(view: SelectView) -> int | None:
    """DRR, largest deficit first among candidates with a positive deficit.

    Returns None when no candidate has a positive deficit: the step then runs
    :func:`refill_drr` and asks again.  Shreedhar and Varghese, "Efficient fair
    queueing using deficit round robin", SIGCOMM 1995, with the charge made as
    service is received (surplus form).
    """
    i = _argmin(view, key_drr)
    if i is None:
        return None
    t = view.tenants[i]
    return i if t.deficit - view.provisional.get(i, 0.0) > 0 else None


def refill_drr(view: SelectView) -> dict[int, float]:
    """Start as many DRR rounds as it takes for some candidate to have a positive deficit.

    Called by the step only when :func:`select_drr` found no positive candidate.

    One round adds ``drr_quantum * weight`` to every backlogged tenant's deficit,
    then caps it at ``drr_carry_bound`` (bounded carry).  Returns the new
    deficits of the tenants that changed (empty when no round is needed).
    """
    if not view.candidates:
        return {}
    cfg, ts, prov = view.config, view.tenants, view.provisional
    if any(ts[i].deficit - prov.get(i, 0.0) > 0 for i in view.candidates):
        return {}
    q = cfg.order.drr_quantum
    rounds = min(
        math.floor((prov.get(i, 0.0) - ts[i].deficit) / (q * cfg.tenants[i].weight)) + 1 for i in view.candidates
    )
    cap = cfg.order.drr_carry_bound
    out = {}
    backlogged = view.backlogged if view.backlogged is not None else [i for i, t in enumerate(ts) if t.queue]
    for i in backlogged:
        d = ts[i].deficit + rounds * q * cfg.tenants[i].weight
        out[i] = d if cap is None else min(d, cap)
    return out


def key_priority(view: SelectView, i: int) -> tuple:
    return (view.config.tenants[i].tier, _head(view, i).arrival_seq)


def select_priority(view: SelectView) -> int | None:
    """Strict priority: the lowest tier number wins; FCFS within a tier.  Starves under load."""
    return _argmin(view, key_priority)


def key_aging(view: SelectView, i: int) -> tuple:
    """``tier + aging_rate_per_s * arrival_s`` of the head, then its ``arrival_seq``: the
    head's effective tier at ``t_s`` (``tier - aging_rate_per_s * (t_s - arrival_s)``)
    plus ``aging_rate_per_s * t_s``, the same for every tenant, so it orders tenants as
    the effective tier does (exactly so in real arithmetic, SPEC.md 4.3); it does not
    read the clock, so equal effective tiers tie exactly and go to the older head."""
    h = _head(view, i)
    return (view.config.tenants[i].tier + view.config.order.aging_rate_per_s * h.request.arrival_s, h.arrival_seq)


def select_aging(view: SelectView) -> int | None:
    """Priority with aging: effective tier = tier - aging_rate_per_s * wait of the queue head.

    A request waiting w seconds outranks any fresh request of a tier up to
    aging_rate_per_s * w better, so every wait is bounded (SPEC.md 7, AGING).
    """
    return _argmin(view, key_aging)


def _tier_of(view: SelectView, i: int) -> int:
    return view.config.tenants[i].tier


def select_floors(view: SelectView) -> int | None:
    """Weighted floors between tiers: the tier least served relative to its floor,
    then FCFS inside the tier.

    Tier k's counter grows by its weighted service divided by its floor share,
    so the backlogged tier with the least counter is the one furthest below its
    guaranteed share (VTC applied to tiers).  Ties between tiers go to the
    older queue head.
    """
    heads = _group_min(view, key_fcfs, _tier_of)
    if not heads:
        return None
    tc = view.tier_counters
    return min(heads.values(), key=lambda i: (tc[view.config.tenants[i].tier], _head(view, i).arrival_seq))


@attrs.frozen
class OrderPolicy:
    """An order policy: ``select``, an optional ``refill`` run before it, and
    how it is charged.

    Attributes:
        select: picks the next tenant (see module docstring).
        refill: DRR rounds, or None.
        deficit_unit: what the deficit is charged in: ``tokens`` (weighted
            tokens), ``block_seconds``, or None (no deficit).
        charge_predicted: charge the predicted output length when a request is
            first scheduled and reconcile as tokens are produced (``vtc_predict``).
    """

    select: Callable[[SelectView], int | None]
    refill: Callable[[SelectView], dict[int, float]] | None = None
    deficit_unit: str | None = None
    charge_predicted: bool = False


ORDER: dict[str, OrderPolicy] = {
    "fcfs": OrderPolicy(select_fcfs),
    "round_robin": OrderPolicy(select_round_robin),
    "vtc": OrderPolicy(select_vtc),
    "vtc_predict": OrderPolicy(select_vtc, charge_predicted=True),
    "drr_tokens": OrderPolicy(select_drr, refill_drr, deficit_unit="tokens"),
    "drr_block_seconds": OrderPolicy(select_drr, refill_drr, deficit_unit="block_seconds"),
    "priority": OrderPolicy(select_priority),
    "aging": OrderPolicy(select_aging),
    "floors": OrderPolicy(select_floors),
}


# --- victims -----------------------------------------------------------------


@attrs.frozen
class VictimView:
    """What a victim policy may look at: the config and per-tenant records."""

    config: Config
    tenants: Seq[TenantState]


def victim_largest(view: VictimView, s: Sequence) -> tuple:
    """Largest sequence first (most blocks), newest first among equals."""
    return (-s.blocks_held, -s.arrival_seq)


def victim_newest(view: VictimView, s: Sequence) -> tuple:
    """Newest sequence first (latest admitted): preserves work already done."""
    return (-s.arrival_seq,)


def victim_lowest_priority(view: VictimView, s: Sequence) -> tuple:
    """Lowest priority first (highest tier number), newest first within a tier."""
    return (-view.config.tenants[s.tenant].tier, -s.arrival_seq)


def victim_most_over_share(view: VictimView, s: Sequence) -> tuple:
    """The tenant most over its fair share of the pool first: largest KV blocks
    held per unit weight, then its newest sequence."""
    t = view.tenants[s.tenant]
    return (-(t.blocks / view.config.tenants[s.tenant].weight), -s.arrival_seq)


VICTIM: dict[str, Callable[[VictimView, Sequence], tuple]] = {
    "largest": victim_largest,
    "newest": victim_newest,
    "lowest_priority": victim_lowest_priority,
    "most_over_share": victim_most_over_share,
}


# --- cost model ----------------------------------------------------------------


def step_duration_s(config: Config, batched_tokens: int, kv_tokens: int) -> float:
    """Duration of one step (seconds).

    Args:
        batched_tokens: tokens processed in the step (prefill chunks + decode tokens).
        kv_tokens: context tokens whose KV is read (sum over the batch of the
            tokens each sequence attends to).

    ``unit`` mode returns ``unit_step_s``.  ``roofline`` mode returns
    max(weight_read_s + kv_tokens * kv_read_s_per_token, batched_tokens *
    flop_s_per_token) + overhead_s (Williams, Waterman and Patterson, "Roofline",
    CACM 2009, applied per step); an empty step costs :attr:`CostConfig.empty_step_s`.
    """
    c = config.cost
    if c.mode == "unit":
        return c.unit_step_s
    if batched_tokens == 0:
        return c.empty_step_s
    memory = c.weight_read_s + kv_tokens * c.kv_read_s_per_token
    return max(memory, batched_tokens * c.flop_s_per_token) + c.overhead_s


def step_s_max(config: Config) -> float:
    """The longest step (seconds, SPEC.md 4.7): ``unit_step_s``, or the roofline with every
    sequence at the context limit and the whole token budget (kv_tokens is at most
    ``max_num_seqs * max_context_tokens``; an empty step is shorter)."""
    c = config.cost
    if c.mode == "unit":
        return c.unit_step_s
    memory = c.weight_read_s + config.max_num_seqs * config.max_context_tokens * c.kv_read_s_per_token
    return max(memory, config.token_budget * c.flop_s_per_token) + c.overhead_s


def step_s_min(config: Config) -> float:
    """The shortest step (seconds, SPEC.md 4.7), the cost model's floor: ``empty_step_s``.
    In ``unit`` mode every step lasts ``unit_step_s``; in ``roofline`` mode a step with
    work lasts at least ``weight_read_s + overhead_s`` and an empty one ``overhead_s``
    (``weight_read_s`` when there is no overhead), so the empty step is the shortest.
    0 when both are 0 (no floor)."""
    return config.cost.empty_step_s


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
