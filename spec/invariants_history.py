"""History forms of the invariants: judge a recorded run offline (SPEC.md 7).

They read only what :mod:`tenantry.model.history` records (request records and,
where present, per-step snapshots) plus the configuration the scheduler
claims, so the same checks judge a scheduler tenantry did not write.  Each
``check_*(hctx: HistoryContext) -> list[Finding]``; a check that needs step
snapshots returns nothing when the history has none.
"""

from __future__ import annotations

import heapq
from functools import cached_property

import attrs

from tenantry.model.config import Config
from tenantry.model.history import ADMISSION_REASONS, History, RequestRecord

from .invariants_core import EPS, Finding, ample_kv, caps_enforced, largest_charge, tier_share



@attrs.frozen
class HistoryContext:
    """A history plus the configuration it is judged against."""

    history: History
    config: Config

    @cached_property
    def steps(self):
        return self.history.steps

    @cached_property
    def requests(self) -> dict[int, RequestRecord]:
        return {r.request_id: r for r in self.history.requests}

    @cached_property
    def tenant_cfg(self) -> dict:
        return {t.name: t for t in self.config.tenants}

    def weight(self, name: str) -> float:
        t = self.tenant_cfg.get(name)
        return t.weight if t is not None else 1.0

    def tier(self, name: str) -> int:
        t = self.tenant_cfg.get(name)
        return t.tier if t is not None else 0

    @cached_property
    def charge_bound(self) -> float:
        """D from the workload actually seen (longest prompt, longest request)."""
        rs = self.history.requests
        if not rs:
            return 0.0
        return largest_charge(self.config, max(r.prompt_tokens for r in rs),
                              max(r.prompt_tokens + r.output_tokens for r in rs))

    @cached_property
    def cancel_steps(self) -> dict[str, set[int]]:
        """Per tenant, the steps in which one of its requests was cancelled."""
        starts = {s.start_s: s.step_index for s in self.steps}
        out: dict[str, set[int]] = {}
        for r in self.history.requests:
            if r.outcome == "cancelled" and r.finish_s in starts:
                out.setdefault(r.tenant, set()).add(starts[r.finish_s])
        return out

    @cached_property
    def first_step(self) -> dict[int, int]:
        """request id -> step index of its first scheduling."""
        starts = {s.start_s: s.step_index for s in self.steps}
        return {r.request_id: starts[r.first_scheduled_s] for r in self.history.requests
                if r.first_scheduled_s is not None and r.first_scheduled_s in starts}


def _f(inv, step, msg, observed, allowed, tenants=(), requests=()) -> Finding:
    return Finding(inv, step, tuple(tenants), tuple(requests), observed, allowed, msg)


# --- safety --------------------------------------------------------------------------


def h_kv_conserve(h: HistoryContext) -> list[Finding]:
    """KV-CONSERVE (SPEC.md 7.1), history form: free blocks within [0, pool]; with the
    cache off, free plus blocks held equals the pool; an empty batch holds nothing."""
    cfg, out = h.config, []
    for s in h.steps:
        held = sum(s.blocks_in_use.values())
        if not 0 <= s.free_blocks <= cfg.num_blocks:
            out.append(_f("KV-CONSERVE", s.step_index, "free blocks outside [0, num_blocks]", s.free_blocks,
                          cfg.num_blocks))
        elif cfg.prefix_cache == "off" and held + s.free_blocks != cfg.num_blocks:
            out.append(_f("KV-CONSERVE", s.step_index, "free blocks plus blocks held differ from the pool",
                          held + s.free_blocks, cfg.num_blocks))
        elif not s.running and (held or s.free_blocks != cfg.num_blocks):
            out.append(_f("KV-CONSERVE", s.step_index, "nothing runs but blocks are still in use",
                          cfg.num_blocks - s.free_blocks, 0))
    return out


def h_kv_cap(h: HistoryContext) -> list[Finding]:
    """KV-CAP (SPEC.md 7.1), history form: per-tenant blocks within enforced caps."""
    cfg, out = h.config, []
    if not caps_enforced(cfg):
        return out
    for s in h.steps:
        for name, n in s.blocks_in_use.items():
            t = h.tenant_cfg.get(name)
            if t is not None and t.kv_block_cap is not None and n > t.kv_block_cap:
                out.append(_f("KV-CAP", s.step_index, "a tenant holds more blocks than its cap", n, t.kv_block_cap,
                              [name]))
    return out


def h_queue_bound(h: HistoryContext) -> list[Finding]:
    """QUEUE-BOUND (SPEC.md 7.1), history form: after every step, each tenant's
    admitted, never-scheduled, not-ended requests number at most its bound."""
    cfg, out = h.config, []
    if not cfg.admission.queue_bound or not h.steps:
        return out
    starts = {s.start_s: s.step_index for s in h.steps}
    n = len(h.steps)
    delta: dict[str, list[int]] = {}
    for r in h.history.requests:
        t = h.tenant_cfg.get(r.tenant)
        if r.admitted_step is None or t is None or t.queue_bound is None:
            continue
        # Fresh after step k for admitted_step <= k < the step it was first scheduled or cancelled in.
        leave = min(h.first_step.get(r.request_id, n), starts.get(r.finish_s, n) if r.finish_s is not None else n)
        d = delta.setdefault(r.tenant, [0] * (n + 1))
        if r.admitted_step < leave:
            d[r.admitted_step] += 1
            d[leave] -= 1
    for name, d in delta.items():
        bound, fresh = h.tenant_cfg[name].queue_bound, 0
        for k in range(n):
            fresh += d[k]
            if fresh > bound:
                out.append(_f("QUEUE-BOUND", h.steps[k].step_index, "more never-scheduled requests queued than the "
                              "bound", fresh, bound, [name]))
                break
    return out


def h_no_loss(h: HistoryContext) -> list[Finding]:
    """NO-LOSS (SPEC.md 7.1), history form: each request ends once with a coherent
    record, and steps only name requests between their admission and their end."""
    out = []
    for r in h.history.requests:
        bad = None
        if r.outcome == "rejected" and r.reason is None:
            bad = "rejected without a reason"
        elif r.outcome != "rejected" and r.reason is not None:
            bad = "a reason on a request that was not rejected"
        elif r.outcome == "finished" and r.tokens_generated != r.output_tokens:
            bad = "finished without producing all its tokens"
        elif r.outcome == "rejected" and r.reason in ADMISSION_REASONS and r.admitted_step is not None:
            bad = "refused at admission yet recorded as admitted"
        elif r.outcome == "finished" and r.admitted_step is None:
            bad = "never admitted yet recorded as served"
        if bad:
            out.append(_f("NO-LOSS", None, f"request record incoherent: {bad}", r.outcome, "a coherent record",
                          [r.tenant], [r.request_id]))
    reqs = h.requests
    for s in h.steps:
        for rid in set(s.running) | {b[0] for b in s.batch}:
            r = reqs.get(rid)
            if r is None:
                out.append(_f("NO-LOSS", s.step_index, "a step names an unknown request", rid, "a known id",
                              requests=[rid]))
            elif r.admitted_step is None or r.admitted_step > s.step_index or (
                    r.finish_s is not None and r.finish_s < s.start_s - EPS):
                out.append(_f("NO-LOSS", s.step_index, "a request runs outside its admission..end interval",
                              s.step_index, r.admitted_step, [r.tenant], [rid]))
        if len(set(s.running)) != len(s.running):
            out.append(_f("NO-LOSS", s.step_index, "a request is listed as running twice", len(s.running),
                          len(set(s.running))))
    return out


def h_batch_limits(h: HistoryContext) -> list[Finding]:
    """BATCH-LIMITS (SPEC.md 7.1), history form."""
    cfg, out = h.config, []
    for s in h.steps:
        ids = [b[0] for b in s.batch]
        total = sum(b[1] for b in s.batch)
        if len(s.running) > cfg.max_num_seqs:
            out.append(_f("BATCH-LIMITS", s.step_index, "more sequences running than max_num_seqs", len(s.running),
                          cfg.max_num_seqs))
        if total > cfg.token_budget:
            out.append(_f("BATCH-LIMITS", s.step_index, "more tokens in the batch than the budget", total,
                          cfg.token_budget, requests=ids))
        if len(set(ids)) != len(ids) or any(b[1] < 1 for b in s.batch):
            out.append(_f("BATCH-LIMITS", s.step_index, "a batch entry repeats or computes no token", len(ids),
                          len(set(ids)), requests=ids))
        both = set(ids) & set(s.preempted)
        if both:
            out.append(_f("BATCH-LIMITS", s.step_index, "a request preempted in this step is in its batch",
                          len(both), 0, requests=sorted(both)))
    return out


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


def _normalised(h: HistoryContext, names, divisor: float) -> list[float]:
    return [sum(s.service.get(n, 0.0) for n in names) / divisor for s in h.steps]


def _pairwise_service(h: HistoryContext, inv: str, slack) -> list[Finding]:
    """Pairwise gap check over tenants that are ever backlogged (O(pairs x steps))."""
    names = [n for n in h.tenant_cfg if any(s.queued.get(n, 0) for s in h.steps)]
    xs = {n: _normalised(h, (n,), h.weight(n)) for n in names}
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
    (Sheng et al., OSDI 2024, Theorem 4.4)."""
    d = h.charge_bound
    return _pairwise_service(h, "VTC-GAP", lambda wa, wb: d / wa + d / wb)


def h_drr_deficit(h: HistoryContext) -> list[Finding]:
    """DRR-DEFICIT (SPEC.md 7.2), history form: deficits within the carry bound; with
    token charging, ample KV and no truncating carry bound, the normalised service
    gap of two backlogged tenants grows by at most 2 quantum + D/w_f + D/w_g
    (after Shreedhar and Varghese, SIGCOMM 1995, Lemma 2)."""
    cfg, o, out = h.config, h.config.order, []
    for s in h.steps:
        for name, d in s.deficits.items():
            if o.drr_carry_bound is not None and d > o.drr_carry_bound + EPS:
                out.append(_f("DRR-DEFICIT", s.step_index, "a deficit exceeds the carry bound", d, o.drr_carry_bound,
                              [name]))
    wmax = max(t.weight for t in cfg.tenants)
    if o.policy == "drr_tokens" and ample_kv(cfg) and (
            o.drr_carry_bound is None or o.drr_carry_bound >= o.drr_quantum * wmax):
        d, q = h.charge_bound, o.drr_quantum
        out += _pairwise_service(h, "DRR-DEFICIT", lambda wa, wb: 2 * q + d / wa + d / wb)
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
    keys = sorted(tiers)
    for ia, a in enumerate(keys):
        for b in keys[ia + 1:]:
            fa, fb = tier_share(cfg, a), tier_share(cfg, b)
            x = [p - q for p, q in zip(_normalised(h, tiers[a], fa), _normalised(h, tiers[b], fb))]
            for run in _runs(h, tiers[a], tiers[b]):
                out += _gap_check(h, "FLOOR", run, x, d / fa + d / fb, sorted(tiers[a] | tiers[b]))
    return out


def h_no_banked_credit(h: HistoryContext) -> list[Finding]:
    """NO-BANKED-CREDIT (SPEC.md 7.2), history form for ``vtc``: a tenant whose queue
    goes from empty to non-empty between two snapshots ends the step with a counter
    no lower than the least counter of the others backlogged before it."""
    out = []
    for prev, s in zip(h.steps, h.steps[1:]):
        back = [n for n, q in prev.queued.items() if q]
        for n, q in s.queued.items():
            if q and not prev.queued.get(n, 0):
                others = [prev.counters[m] for m in back if m != n]
                if others and s.counters[n] < min(others) - EPS:
                    out.append(_f("NO-BANKED-CREDIT", s.step_index, "a newly backlogged tenant's counter starts below "
                                  "the least backlogged counter", s.counters[n], min(others), [n]))
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


# --- admission and eviction ----------------------------------------------------------


def h_token_bucket(h: HistoryContext) -> list[Finding]:
    """TOKEN-BUCKET (SPEC.md 7.3), history form: the prompt tokens a tenant had
    admitted in any window [t1, t2] of admission times total at most
    burst + rate * (t2 - t1)."""
    cfg, out = h.config, []
    if not cfg.admission.token_bucket or cfg.admission.prompt_estimate != "tokens":
        return out
    start = {s.step_index: s.start_s for s in h.steps}
    for t in cfg.tenants:
        if t.token_rate_per_s is None:
            continue
        adm = sorted((start.get(r.admitted_step, r.arrival_s), r.request_id, r.prompt_tokens)
                     for r in h.history.requests if r.tenant == t.name and r.admitted_step is not None)
        total, best, best_i = 0.0, None, None
        for ts, rid, p in adm:
            key = total - t.token_rate_per_s * ts
            if best is None or key < best:
                best, best_i = key, (ts, rid)
            total += p
            excess = total - t.token_rate_per_s * ts - best
            if excess > t.token_burst_tokens + EPS:
                out.append(_f("TOKEN-BUCKET", None, f"prompt tokens admitted between t={best_i[0]:.6g}s and "
                              f"t={ts:.6g}s exceed burst + rate x window", excess, t.token_burst_tokens,
                              [t.name], [best_i[1], rid]))
                break
    return out


def h_evict_cooldown(h: HistoryContext) -> list[Finding]:
    """EVICT-COOLDOWN (SPEC.md 7.4), history form: a request preempted in step k is
    in no batch before step k + 1 + cooldown_steps."""
    c, out = h.config.eviction.cooldown_steps, []
    until: dict[int, tuple[int, int]] = {}
    for s in h.steps:
        for rid, _ in s.batch:
            if rid in until and s.step_index < until[rid][0]:
                out.append(_f("EVICT-COOLDOWN", s.step_index, f"request ran again {s.step_index - until[rid][1]} "
                              f"steps after its preemption", s.step_index, until[rid][0], requests=[rid]))
                del until[rid]
        for rid in s.preempted:
            until[rid] = (s.step_index + 1 + c, s.step_index)
    return out


def h_evict_bounded(h: HistoryContext) -> list[Finding]:
    """EVICT-BOUNDED (SPEC.md 7.4), history form: preemptions <= max_evictions,
    evicted_too_often only at max_evictions, recomputed tokens <= preemptions x
    (prompt + output - 1)."""
    k_max, out = h.config.eviction.max_evictions, []
    for r in h.history.requests:
        if k_max is not None and r.preemptions > k_max:
            out.append(_f("EVICT-BOUNDED", None, "preempted more than max_evictions times", r.preemptions, k_max,
                          [r.tenant], [r.request_id]))
        if r.reason == "evicted_too_often" and r.preemptions != k_max:
            out.append(_f("EVICT-BOUNDED", None, "evicted_too_often before max_evictions evictions", r.preemptions,
                          k_max, [r.tenant], [r.request_id]))
        cap = r.preemptions * (r.prompt_tokens + r.output_tokens - 1)
        if r.wasted_prefill_tokens > cap:
            out.append(_f("EVICT-BOUNDED", None, "recomputed tokens exceed preemptions x (prompt + output - 1)",
                          r.wasted_prefill_tokens, cap, [r.tenant], [r.request_id]))
    return out


def h_victim(h: HistoryContext) -> list[Finding]:
    """VICTIM (SPEC.md 7.4), history form for ``newest`` / ``lowest_priority``: each
    preempted request is the first by the policy's order among those running."""
    cfg, out = h.config, []
    order = {}
    for r in h.history.requests:
        if r.admitted_step is not None:
            order[r.request_id] = (r.admitted_step, r.arrival_s, r.request_id)
    pol = cfg.eviction.victim
    rank = (lambda rid: tuple(-x for x in order[rid])) if pol == "newest" else (
        lambda rid: (-h.tier(h.requests[rid].tenant),) + tuple(-x for x in order[rid]))
    starts = {s.start_s for s in h.steps}
    gone_at = {}
    for r in h.history.requests:
        if r.finish_s in starts and (r.outcome == "cancelled" or r.reason == "evicted_too_often"):
            gone_at.setdefault(r.finish_s, set()).add(r.request_id)
    prev_running: tuple = ()
    for s in h.steps:
        cands = set(prev_running) - gone_at.get(s.start_s, set())
        for rid in s.preempted:
            cands.discard(rid)
            better = [c for c in cands if c in order and rank(c) < rank(rid)]
            if better:
                out.append(_f("VICTIM", s.step_index, f"the {pol} policy ranks request {min(better, key=rank)} before "
                              "the victim", rid, min(better, key=rank), requests=[rid, min(better, key=rank)]))
        prev_running = s.running
    return out
