"""History forms of the fairness invariants (SPEC.md 7.2): VTC-GAP, DRR-DEFICIT,
FLOOR, NO-BANKED-CREDIT and AGING, judged on a recorded run offline.

The same contract as :mod:`tenantry.spec.invariants_history` (which holds the
safety forms and the :class:`~tenantry.spec.invariants_history.HistoryContext`
they all read): each ``h_*(hctx) -> list[Finding]`` reads only what the history
records plus the claimed configuration, and returns nothing when the steps it
needs are absent.  Where a form judges step by step (the counters and deficits a
run records, the aging order), its judgement of one step is
``s_*(h, v, pv, carry)``, which is also the invariant's state form
(:func:`tenantry.spec.invariants_state.from_record`); the service gaps over
intervals are judged over the whole run only.
"""

from __future__ import annotations

from .invariants_core import (
    EPS, Finding, ample_kv, drr_charge_bound, drr_skip_rounds, largest_block_seconds, skip_budget_claimed, skip_slack,
    tier_share,
)
from .invariants_history import HistoryContext, _f, each_step, first_of
from .replay import StepView


# --- the books: findings about the counters and deficits a scheduler reports ---------

#: Messages of the findings judged on the recorded counters and deficits (the books)
#: rather than on the service: a scheduler under test reports them in its plan, or
#: from ``accounting()`` after ``take_results``, and a finding names that call
#: (:func:`from_books`).
COUNTER_MOVED = "a counter moved by other than the tenant's new weighted service over its weight"
COUNTER_AHEAD = "a backlogged tenant's counter ran ahead of the least backlogged counter by more than D/weight"
DEFICIT_OVER = "a deficit exceeds the carry bound"
DEFICIT_ROUNDS = "a deficit exceeds quantum x weight x its rounds"
DEFICIT_UNDER = "a deficit fell below -D"
IDLE_DEFICIT = "an idle tenant kept a DRR deficit"
BANKED_COUNTER = "a newly backlogged tenant's counter starts below the least backlogged counter"
BOOKS_MESSAGES = (COUNTER_MOVED, COUNTER_AHEAD, DEFICIT_OVER, DEFICIT_ROUNDS, DEFICIT_UNDER, IDLE_DEFICIT,
                  BANKED_COUNTER)


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
    ``2 guard_skips D / w_min`` (SPEC.md 8.3).  Step by step, where the history
    records counters, the premise and the spread on them (:func:`s_vtc_gap`; the first
    break of each)."""
    d = h.charge_bound
    extra = 2 * skip_slack(h.config, d)
    out = first_of(each_step(h, s_vtc_gap), lambda f: f.message) if any(s.counters for s in h.steps) else []
    return out + _pairwise_service(h, "VTC-GAP", lambda wa, wb: d / wa + d / wb + extra)


def s_vtc_gap(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """VTC-GAP's judgement of one step, on the counters it records (the state form's
    statement): a tenant that cannot have been lifted in it (backlogged before and
    nothing of it cancelled, or idle before and nothing of it queued or preempted)
    moves its counter by exactly its new service over its weight; among backlogged
    tenants every counter is within D / weight of the least one (plus
    ``guard_skips * D / w_min`` under the skip budget).  Each tenant that breaks either."""
    s = v.record
    counters = s.counters
    if not counters:
        return []
    out, d = [], h.charge_bound
    extra = skip_slack(h.config, d)
    prev = pv.record if pv is not None and pv.record.counters else None
    tenant = h.tenant_of.get
    if prev is not None:
        cancelled = {tenant(rid) for rid, _ in v.cancelled} if v.cancelled else ()
        joined = ({tenant(rid) for rid, a in v.answers if a == "queued"} | {tenant(rid) for rid in s.preempted}
                  if v.answers or s.preempted else ())
        weights = carry.setdefault("weights", {})  # h.weight, per tenant met
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
    back = [n for n, q in s.queued.items() if q and n in counters]
    if len(back) >= 2:
        lo = min(back, key=counters.__getitem__)
        for n in back:
            if counters[n] - counters[lo] > d / h.weight(n) + extra + EPS:
                out.append(_f("VTC-GAP", s.step_index, COUNTER_AHEAD + (" + guard_skips*D/w_min" if extra else ""),
                              counters[n] - counters[lo], d / h.weight(n) + extra, [n, lo]))
    return out


def _drr_tight(cfg) -> bool:
    """DRR-DEFICIT's tight deficit bounds are claimed: ``drr_tokens`` with ample KV, or
    either unit under the skip budget (SPEC.md 7.2, 8.4)."""
    o = cfg.order
    return (ample_kv(cfg) and o.policy == "drr_tokens") or (skip_budget_claimed(cfg) and o.policy.startswith("drr"))


def s_drr_deficit(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """DRR-DEFICIT's judgement of one step, on the deficits it records: each within the
    carry bound; where the tight bounds are claimed (:func:`_drr_tight`), within
    ``(-D, quantum * weight * rounds]`` (D: :func:`drr_charge_bound`; rounds:
    :func:`drr_skip_rounds`, 1 without a skip budget)."""
    cfg, o, s, out = h.config, h.config.order, v.record, []
    if not s.deficits:
        return out
    tight = _drr_tight(cfg)
    if tight:
        d_max = carry.get("D")
        if d_max is None:
            d_max = carry["D"] = drr_charge_bound(cfg)
            carry["rounds"] = drr_skip_rounds(cfg, d_max)
        rounds = carry["rounds"]
    for name, d in s.deficits.items():
        if o.drr_carry_bound is not None and d > o.drr_carry_bound + EPS:
            out.append(_f("DRR-DEFICIT", s.step_index, DEFICIT_OVER, d, o.drr_carry_bound, [name]))
        elif tight and d > o.drr_quantum * h.weight(name) * rounds + EPS:
            out.append(_f("DRR-DEFICIT", s.step_index, DEFICIT_ROUNDS, d, o.drr_quantum * h.weight(name) * rounds,
                          [name]))
        if tight and d < -d_max - EPS:
            out.append(_f("DRR-DEFICIT", s.step_index, DEFICIT_UNDER, d, -d_max, [name]))
    return out


def h_drr_deficit(h: HistoryContext) -> list[Finding]:
    """DRR-DEFICIT (SPEC.md 7.2), history form: step by step, the recorded deficits within
    their bounds (:func:`s_drr_deficit`); with token charging, ample KV and no truncating
    carry bound, the normalised service gap of two backlogged tenants grows by at most
    2 quantum + D/w_f + D/w_g (after Shreedhar and Varghese, SIGCOMM 1995, Lemma 2);
    under the skip budget plus 2 K (D/w_min + quantum), and under ``drr_block_seconds``
    (unit cost) the same for block-seconds with D_bs (:func:`largest_block_seconds`, SPEC.md 8.4)."""
    cfg, o = h.config, h.config.order
    out = each_step(h, s_drr_deficit)
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


def s_no_banked_credit(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """NO-BANKED-CREDIT's judgement of one step (:func:`h_no_banked_credit`)."""
    s, k = v.record, v.record.step_index
    if h.config.order.policy in ("drr_tokens", "drr_block_seconds"):
        if not s.deficits:
            return []
        running = {h.tenant_of.get(rid) for rid in s.running}
        return [_f("NO-BANKED-CREDIT", k, IDLE_DEFICIT, dft, 0.0, [n]) for n, dft in s.deficits.items()
                if not s.queued.get(n, 0) and n not in running and abs(dft) > EPS]
    if h.config.order.policy != "vtc" or pv is None or not s.counters:
        return []  # floors: its tier counters are not recorded (the state form's own part judges them)
    prev = pv.record
    before = [n for n, q in prev.queued.items() if q and n in prev.counters]
    gone = {rid for rid, _ in v.cancelled}
    # backlogged once the step's cancellations are done: a request of theirs waited and was not cancelled
    after = [n for n in before if any(rid not in gone for rid in pv.waiting.get(n, ()))] if gone else before
    tenant = h.tenant_of.get
    # joined: a request of it queued or preempted in the step, or (records without events) its queue refilled
    joined = {tenant(rid) for rid, a in v.answers if a == "queued"} | {tenant(rid) for rid in s.preempted} | {
        n for n, q in s.queued.items() if q and not prev.queued.get(n, 0)}
    out = []
    for n in sorted(x for x in joined if x is not None and x not in after):
        if n not in s.counters:  # a counter not recorded (a step whose adapter raised) is not judged
            continue
        others = [prev.counters[m] for m in after if m != n] or [prev.counters[m] for m in before if m != n]
        if others and s.counters[n] < min(others) - EPS:
            out.append(_f("NO-BANKED-CREDIT", k, BANKED_COUNTER, s.counters[n], min(others), [n]))
    return out


def h_no_banked_credit(h: HistoryContext) -> list[Finding]:
    """NO-BANKED-CREDIT (SPEC.md 7.2), history form: for ``vtc``, a tenant that joins the
    backlog in a step (a request of it queued or preempted while none of its requests
    waited once the step's cancellations were done, or its queue empty before the step
    and not after it) ends the step with a counter no
    lower than the least counter of the others backlogged then, or, if cancellations
    emptied them all, of those backlogged before; for DRR with the idle reset, a tenant
    with nothing queued or running after a step keeps no deficit (the first that does not)
    (:func:`s_no_banked_credit`)."""
    out = each_step(h, s_no_banked_credit)
    idle = [f for f in out if f.message == IDLE_DEFICIT]
    return idle[:1] if idle else out


def s_aging(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """AGING's judgement of one step (:func:`h_aging`)."""
    if not v.first:
        return []
    cfg, out = h.config, []
    rate = cfg.order.aging_rate_per_s
    reqs = h.requests
    val = lambda rid: h.tier(reqs[rid].tenant) + rate * reqs[rid].arrival_s  # noqa: E731
    least = carry.setdefault("least", {})  # per tenant: (its fresh ids, the least value among them)
    lo = None
    for name, ids in v.fresh.items():
        got = least.get(name)
        if got is None or got[0] is not ids:
            got = least[name] = (ids, min((val(rid), rid) for rid in ids if rid in reqs) if ids else None)
        if got[1] is not None and (lo is None or got[1] < lo):
            lo = got[1]
    if lo is None:
        return out
    for rid in v.first:
        r = reqs.get(rid)
        if r is not None and val(rid) > lo[0] + EPS:
            out.append(_f("AGING", v.record.step_index, "a request was first scheduled ahead of one that had aged "
                          "past it", val(rid), lo[0], [r.tenant, reqs[lo[1]].tenant], [rid, lo[1]]))
    return out


def h_aging(h: HistoryContext) -> list[Finding]:
    """AGING (SPEC.md 7.2), history form: no request is first scheduled in a step while a
    request admitted and never scheduled waits after it with a smaller aging value
    (tier + aging_rate_per_s * arrival_s) (:func:`s_aging`)."""
    return each_step(h, s_aging)
