"""Policies as small pure functions behind one signature each, in registries.

The step function never branches on a policy name: it looks the policy up here.
The rules that may stop or reorder the waiting phase beyond the order policy (slot
caps, preemption for priority, the starvation guard, the skip budget) are in
:mod:`tenantry.model.guards`.

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
from typing import Callable, Collection, Mapping, Sequence as Seq

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
