"""History forms of the fairness invariants (SPEC.md 7.2): VTC-GAP, DRR-DEFICIT,
FLOOR, NO-BANKED-CREDIT and AGING, judged on a recorded run offline.

The same contract as :mod:`tenantry.spec.invariants_history` (which holds the
safety, admission, eviction and isolation forms and the
:class:`~tenantry.spec.invariants_history.HistoryContext` they all read): each
``h_*(hctx) -> list[Finding]`` reads only what the history records plus the
claimed configuration, and returns nothing when the steps it needs are absent.
"""

from __future__ import annotations

import heapq

from tenantry.runner.history import RequestRecord

from .invariants_core import (
    EPS, Finding, ample_kv, largest_block_seconds, skip_budget_claimed, skip_slack, tier_share,
)
from .invariants_history import HistoryContext, _f


# --- the books: findings about the counters and deficits a scheduler reports ---------

#: Messages of the findings judged on the recorded counters and deficits (the books)
#: rather than on the service: a scheduler under test reports them in its plan, or
#: from ``accounting()`` after ``take_results``, and a finding names that call
#: (:func:`from_books`).
COUNTER_MOVED = "a counter moved by other than the tenant's new weighted service over its weight"
COUNTER_AHEAD = "a backlogged tenant's counter ran ahead of the least backlogged counter by more than D/weight"
DEFICIT_OVER = "a deficit exceeds the carry bound"
IDLE_DEFICIT = "an idle tenant kept a DRR deficit"
BANKED_COUNTER = "a newly backlogged tenant's counter starts below the least backlogged counter"
BOOKS_MESSAGES = (COUNTER_MOVED, COUNTER_AHEAD, DEFICIT_OVER, IDLE_DEFICIT, BANKED_COUNTER)


def from_books(f: Finding) -> bool:
    """Whether ``f`` was judged on the recorded counters or deficits (not on the service)."""
    return f.message.startswith(BOOKS_MESSAGES)


# --- fairness ------------------------------------------------------------------------


def _runs(h: HistoryContext, a: set[str], b: set[str]):
    """Maximal runs of step positions where groups a and b both have queued work at
    the step's end and no request of either was cancelled inside the run."""
    canc = set()
    for n in a | b:
        canc |= h.cancel_steps.get(n, set())
    run: list[int] = []
    for pos, s in enumerate(h.steps):
        ok = any(s.queued.get(n, 0) for n in a) and any(s.queued.get(n, 0) for n in b)
        if ok and run and s.step_index not in canc:
            run.append(pos)
        else:
            if len(run) > 1:
                yield run
            run = [pos] if ok else []
    if len(run) > 1:
        yield run


def _gap_check(h: HistoryContext, inv, run, x, bound, tenants) -> list[Finding]:
    """The first point of ``run`` (step positions) where x moved by more than
    ``bound`` from an earlier point of the run, as a finding."""
    lo = hi = run[0]
    for pos in run[1:]:
        for ref, grew in ((lo, x[pos] - x[lo]), (hi, x[hi] - x[pos])):
            if grew > bound + EPS:
                return [_f(inv, h.steps[pos].step_index, "normalised service gap grew by more than the bound "
                           f"between steps {h.steps[ref].step_index} and {h.steps[pos].step_index} while both "
                           "were backlogged", grew, bound, tenants)]
        if x[pos] < x[lo]:
            lo = pos
        if x[pos] > x[hi]:
            hi = pos
    return []


def _normalised(h: HistoryContext, names, divisor: float, field: str = "service") -> list[float]:
    """Per step, the cumulative ``field`` (``service`` or ``block_seconds``) of ``names`` over ``divisor``."""
    return [sum(getattr(s, field).get(n, 0.0) for n in names) / divisor for s in h.steps]


def _pairwise_service(h: HistoryContext, inv: str, slack, field: str = "service") -> list[Finding]:
    """Pairwise gap check over tenants that are ever backlogged (O(pairs x steps)), of the
    normalised ``field`` (weighted service, or block-seconds)."""
    names = [n for n in h.tenant_cfg if any(s.queued.get(n, 0) for s in h.steps)]
    xs = {n: _normalised(h, (n,), h.weight(n), field) for n in names}
    out = []
    for ia, a in enumerate(names):
        for b in names[ia + 1:]:
            x = [p - q for p, q in zip(xs[a], xs[b])]
            bound = slack(h.weight(a), h.weight(b))
            for run in _runs(h, {a}, {b}):
                out += _gap_check(h, inv, run, x, bound, [a, b])
    return out


def h_vtc_gap(h: HistoryContext) -> list[Finding]:
    """VTC-GAP (SPEC.md 7.2), history form: over any run of steps in which tenants f
    and g are both backlogged, |dS_f/w_f - dS_g/w_g| <= D/w_f + D/w_g, which is
    2 max(w_in L_input, w_out M) for equal unit weights and w_in <= w_out
    (Sheng et al., OSDI 2024, Theorem 4.4); under the skip budget plus
    ``2 guard_skips D / w_min`` (SPEC.md 8.3)."""
    d = h.charge_bound
    extra = 2 * skip_slack(h.config, d)
    return _vtc_counters(h) + _pairwise_service(h, "VTC-GAP", lambda wa, wb: d / wa + d / wb + extra)


def _vtc_counters(h: HistoryContext) -> list[Finding]:
    """VTC-GAP's counter part, when the history records counters (the state form's
    statement on records): between two snapshots a tenant that cannot have been
    lifted (backlogged before and nothing of it cancelled, or idle before and
    nothing of it queued or preempted) moves its counter by exactly its new
    service over its weight; among backlogged tenants every counter is within
    D / weight of the least one.  The first break of each kind."""
    if not any(s.counters for s in h.steps):
        return []
    out, d, prev = [], h.charge_bound, None
    extra = skip_slack(h.config, d)
    books = gap = False
    tenant = h.tenant_of.get
    weights: dict[str, float] = {}  # h.weight, per tenant met
    for v in h.views:
        s = v.record
        counters = s.counters
        if not counters:
            prev = None
            continue
        if prev is not None and not books:
            cancelled = {tenant(rid) for rid, _ in v.cancelled} if v.cancelled else ()
            joined = ({tenant(rid) for rid, a in v.answers if a == "queued"} | {tenant(rid) for rid in s.preempted}
                      if v.answers or s.preempted else ())
            for n in counters:
                was = prev.queued.get(n, 0) > 0
                if n not in prev.counters or not ((was and n not in cancelled) or (not was and n not in joined)):
                    continue
                w = weights.get(n)
                if w is None:
                    w = weights[n] = h.weight(n)
                want = (s.service.get(n, 0.0) - prev.service.get(n, 0.0)) / w
                got = counters[n] - prev.counters[n]
                if abs(got - want) > EPS * max(1.0, abs(want)):
                    out.append(_f("VTC-GAP", s.step_index, COUNTER_MOVED, got, want, [n]))
                    books = True
                    break
        if not gap:
            back = [n for n, q in s.queued.items() if q and n in counters]
            if len(back) >= 2:
                lo = min(back, key=counters.__getitem__)
                for n in back:
                    if counters[n] - counters[lo] > d / h.weight(n) + extra + EPS:
                        out.append(_f("VTC-GAP", s.step_index,
                                      COUNTER_AHEAD + (" + guard_skips*D/w_min" if extra else ""),
                                      counters[n] - counters[lo], d / h.weight(n) + extra, [n, lo]))
                        gap = True
                        break
        prev = s
    return out


def h_drr_deficit(h: HistoryContext) -> list[Finding]:
    """DRR-DEFICIT (SPEC.md 7.2), history form: deficits within the carry bound; with
    token charging, ample KV and no truncating carry bound, the normalised service
    gap of two backlogged tenants grows by at most 2 quantum + D/w_f + D/w_g
    (after Shreedhar and Varghese, SIGCOMM 1995, Lemma 2); under the skip budget
    plus 2 K (D/w_min + quantum), and under ``drr_block_seconds`` (unit cost) the same
    for block-seconds with D_bs (:func:`largest_block_seconds`, SPEC.md 8.4)."""
    cfg, o, out = h.config, h.config.order, []
    for s in h.steps:
        for name, d in s.deficits.items():
            if o.drr_carry_bound is not None and d > o.drr_carry_bound + EPS:
                out.append(_f("DRR-DEFICIT", s.step_index, DEFICIT_OVER, d, o.drr_carry_bound,
                              [name]))
    wmax = max(t.weight for t in cfg.tenants)
    if o.policy == "drr_tokens" and ((ample_kv(cfg) and (
            o.drr_carry_bound is None or o.drr_carry_bound >= o.drr_quantum * wmax)) or skip_budget_claimed(cfg)):
        d, q = h.charge_bound, o.drr_quantum
        extra = 2 * skip_slack(cfg, d)  # the skip budget (SPEC.md 8.4): 2 K (D / w_min + q)
        out += _pairwise_service(h, "DRR-DEFICIT", lambda wa, wb: 2 * q + d / wa + d / wb + extra)
    elif o.policy == "drr_block_seconds" and skip_budget_claimed(cfg):  # DRR-GAP[skips,block_seconds], SPEC.md 8.4
        d, q = largest_block_seconds(cfg), o.drr_quantum
        extra = 2 * skip_slack(cfg, d)
        out += _pairwise_service(h, "DRR-DEFICIT", lambda wa, wb: 2 * q + d / wa + d / wb + extra, "block_seconds")
    return out


def h_floor(h: HistoryContext) -> list[Finding]:
    """FLOOR (SPEC.md 7.2), history form: over any run of steps in which tiers a and
    b are both backlogged, |dS_a/f_a - dS_b/f_b| <= D/f_a + D/f_b, f the floors; so a
    backlogged tier receives at least its floor's share of the service up to that slack."""
    cfg, out = h.config, []
    tiers: dict[int, set[str]] = {}
    for t in cfg.tenants:
        tiers.setdefault(t.tier, set()).add(t.name)
    d = h.charge_bound
    extra = 2 * skip_slack(cfg, d)  # the skip budget (SPEC.md 8.5): 2 guard_skips D / f_min
    keys = sorted(tiers)
    for ia, a in enumerate(keys):
        for b in keys[ia + 1:]:
            fa, fb = tier_share(cfg, a), tier_share(cfg, b)
            x = [p - q for p, q in zip(_normalised(h, tiers[a], fa), _normalised(h, tiers[b], fb))]
            for run in _runs(h, tiers[a], tiers[b]):
                out += _gap_check(h, "FLOOR", run, x, d / fa + d / fb + extra, sorted(tiers[a] | tiers[b]))
    return out


def h_no_banked_credit(h: HistoryContext) -> list[Finding]:
    """NO-BANKED-CREDIT (SPEC.md 7.2), history form: for ``vtc``, a tenant whose queue
    goes from empty to non-empty between two snapshots ends the step with a counter
    no lower than the least counter of the others backlogged before it; for DRR with
    the idle reset, a tenant with nothing queued or running after a step keeps no deficit."""
    out = []
    if h.config.order.policy in ("drr_tokens", "drr_block_seconds"):
        for s in h.steps:
            running = {h.requests[rid].tenant for rid in s.running if rid in h.requests}
            for n, dft in s.deficits.items():
                if not s.queued.get(n, 0) and n not in running and abs(dft) > EPS:
                    return [_f("NO-BANKED-CREDIT", s.step_index, IDLE_DEFICIT, dft, 0.0, [n])]
        return out
    for prev, s in zip(h.steps, h.steps[1:]):
        back = [n for n, q in prev.queued.items() if q and n in prev.counters]
        for n, q in s.queued.items():  # a counter not recorded (a step whose adapter raised) is not judged
            if q and not prev.queued.get(n, 0) and n in s.counters:
                others = [prev.counters[m] for m in back if m != n]
                if others and s.counters[n] < min(others) - EPS:
                    out.append(_f("NO-BANKED-CREDIT", s.step_index, BANKED_COUNTER, s.counters[n], min(others), [n]))
    return out


def h_aging(h: HistoryContext) -> list[Finding]:
    """AGING (SPEC.md 7.2), history form: no request is first scheduled while a request
    with a smaller aging value (tier + aging_rate_per_s * arrival_s) waits."""
    cfg, out = h.config, []
    rate = cfg.order.aging_rate_per_s
    val = lambda r: h.tier(r.tenant) + rate * r.arrival_s
    first = h.first_step
    starts = [s.start_s for s in h.steps]
    by_admit: dict[int, list[RequestRecord]] = {}
    by_first: dict[int, list[RequestRecord]] = {}
    for r in h.history.requests:
        if r.admitted_step is not None:
            by_admit.setdefault(r.admitted_step, []).append(r)
        if r.request_id in first:
            by_first.setdefault(first[r.request_id], []).append(r)
    heap: list = []
    never = 1 << 60
    for s in h.steps:
        k = s.step_index
        for r in by_admit.get(k, []):
            heapq.heappush(heap, (val(r), r.request_id))
        while heap:  # lazily drop requests that started by step k or were cancelled before it
            rid = heap[0][1]
            r = h.requests[rid]
            if first.get(rid, never) <= k or (r.outcome == "cancelled" and r.finish_s <= starts[k] + EPS):
                heapq.heappop(heap)
            else:
                break
        lo = heap[0] if heap else None
        for r in by_first.get(k, []):
            if lo is not None and val(r) > lo[0] + EPS:
                out.append(_f("AGING", k, "a request was first scheduled ahead of one that had aged past it",
                              val(r), lo[0], [r.tenant, h.requests[lo[1]].tenant], [r.request_id, lo[1]]))
    return out
