"""Live forms of the invariants: what a client sees of a server it replayed a workload
against (SPEC.md 7.10; the recording: SPEC.md 6 and 12.2).

A live recording (``tenantry replay``) holds request records only, with the client's times
(``sent_s``, ``first_token_s``, ``token_times``, ``finish_s``), the answer's status and body,
and why a stream failed.  No step record, no admission step, no scheduling time, no KV
block: the server's books are out of sight.  For an invariant with a live form the form
judges what a client observes (:data:`LIVE_FORMS`); every other invariant is reported not
observable from outside, with the reason (:func:`blind_reason`), through the catalog's one
coverage machinery (:func:`tenantry.spec.invariants.missing`).

**Waiting, from outside.**  A tenant *waits* at time t when it has a request that the server
had answered (status and headers: it had taken the request in) at or before t, that has not
got its first token by t, and has not ended (refused, cancelled, failed) by t: the client's
view of "backlogged" (SPEC.md 7.0: a queued request).  It over-approximates the server's
queue by the request's prefill and the delivery of its first token.  (From the send on
instead, the trip to the server counts as waiting: ``tenantry serve`` took requests of a
100-request burst in up to 3 s after they were sent, while the others' service went on.)  A request whose first token arrived is
not waiting even while it decodes: a tenant whose requests all run is not backlogged, and
VTC promises it nothing (a long decode beside a flood is fair); "sent and not finished"
would call a fair server unfair on every long request.

The forms: NO-LOSS (every request sent ends finished with all its tokens, refused with a
reason, or cancelled by the client; a failed stream is a lost request; a record open at the
recording's end is open only where the recording was cut), BOUNDED-WAIT (send to first token
within the tenant's ``max_wait_s``), VTC-GAP (the normalised service delivered to two tenants
while both wait, within the claimed bound), REFUSAL-TRUTH (a refusal's reason is one of the
model's and agrees with what the client knows: the request, the claimed configuration, the
requests it had open), NONINTERFERENCE (the prefix-cache timing probe: first-token latency
must not tell whether another tenant sent a prefix; :func:`probe_auc`).  :func:`measures`
gives the figures behind them for a report.

(Past 500 lines: the five live forms, the registry's reasons and the measures are one
concern, what a client can judge; splitting the probe out would split its label rule from
the form that reads it.)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

from tenantry.model.config import Config
from tenantry.model.events import REJECT_REASONS
from tenantry.runner.history import LIVE_REJECT_REASONS, History, RequestRecord

from .invariants_core import EPS, Finding, skip_slack
from .invariants_history import HistoryContext, _f

#: Fewest probes on each side (prefix sent before by another tenant / sent by nobody) for the
#: probe's AUC to be judged (as :data:`tenantry.adversaries.objectives.MIN_PROBES`).
MIN_PROBES = 5
#: NONINTERFERENCE's live form finds a leak when the probe's AUC is at least this far above
#: chance in standard deviations of the Mann-Whitney U under "no dependence" (one-sided
#: p ~ 0.0013) ...
PROBE_Z = 3.0
#: ... and at least this large (an effect a prober can use, not a statistical hair).
PROBE_AUC_MIN = 0.6


def is_live(history: History) -> bool:
    """A live recording: its header says ``live`` and it has no step records (SPEC.md 12.2)."""
    return isinstance(history.header.get("live"), dict) and not history.steps


def _live(h: History) -> dict:
    live = h.header.get("live")
    return live if isinstance(live, dict) else {}


def _ended_at(r: RequestRecord) -> float | None:
    """When the client saw request ``r`` end (its last token, the refusal, the disconnect), or None."""
    return r.finish_s if r.outcome != "unfinished" else None


# --- NO-LOSS -----------------------------------------------------------------------------------


def _incoherent(r: RequestRecord, cut: bool) -> str | None:
    """Why a live record cannot be what a client saw, or None."""
    if r.sent_s is None:
        if r.outcome != "unfinished" or r.tokens_generated or r.token_times or r.http_status is not None:
            return "a request never sent has an answer"
        return None
    if r.outcome == "rejected" and r.reason is None:
        return "rejected without a reason"
    if r.outcome != "rejected" and r.reason is not None:
        return "a reason on a request that was not rejected"
    if r.outcome in ("finished", "rejected", "cancelled") and r.finish_s is None:
        return f"{r.outcome} with no end time"
    if r.token_times:
        tt = r.token_times
        if len(tt) != r.tokens_generated:
            return f"{len(tt)} token times for {r.tokens_generated} tokens"
        if any(b < a - EPS for a, b in zip(tt, tt[1:])) or tt[0] < r.sent_s - EPS:
            return "token times out of order, or before the request was sent"
        if r.first_token_s is None or abs(tt[0] - r.first_token_s) > EPS:
            return "the first token time is not first_token_s"
    if r.first_token_s is not None and r.first_token_s < r.sent_s - EPS:
        return "a first token before the request was sent"
    if r.outcome == "unfinished" and r.failure is None and not cut:
        return ("left unfinished without a recorded failure, though the client waited for every request to end "
                "(no horizon, not stopped)")
    return None


def l_no_loss(h: HistoryContext) -> list[Finding]:
    """NO-LOSS (SPEC.md 7.1), live form: every request sent ends once, as the client saw it:
    ``finished`` with all its output tokens, ``rejected`` with a reason, or ``cancelled``
    (the client went away); a stream that failed (``failure``: a timeout, a connection
    refused or cut, a broken stream, an error event) is a lost request; a request is left
    ``unfinished`` without a failure only where the recording was cut (its horizon, a stop)
    with it open, or never sent.  A record that cannot be what a client saw is a finding."""
    live = _live(h.history)
    cut = live.get("horizon_s") is not None or live.get("stopped") is not None
    out = []
    for r in h.history.requests:
        bad = _incoherent(r, cut)
        if bad is not None:
            out.append(_f("NO-LOSS", None, f"request record incoherent: {bad}", r.outcome, "a coherent record",
                          [r.tenant], [r.request_id]))
        elif r.sent_s is not None and r.outcome == "unfinished" and r.failure is not None:
            got = f" after {r.tokens_generated} of {r.output_tokens} tokens" if r.tokens_generated else ""
            out.append(_f("NO-LOSS", None, f"request {r.request_id} was lost: its stream failed ({r.failure}){got}"
                          + (f": {r.detail[:160]}" if r.detail else ""), r.failure,
                          "finished, rejected with a reason, or cancelled", [r.tenant], [r.request_id]))
        elif r.outcome == "finished" and r.tokens_generated != r.output_tokens:
            out.append(_f("NO-LOSS", None, f"request {r.request_id} finished with {r.tokens_generated} of its "
                          f"{r.output_tokens} output tokens", r.tokens_generated, r.output_tokens,
                          [r.tenant], [r.request_id]))
    return out


# --- BOUNDED-WAIT ------------------------------------------------------------------------------


def l_bounded_wait(h: HistoryContext) -> list[Finding]:
    """BOUNDED-WAIT (SPEC.md 7.2), live form: a request of a tenant with ``max_wait_s`` gets
    its first token within ``max_wait_s`` of being sent, unless it ended first (refused,
    cancelled); one still waiting at the recording's end counts once the end is past its
    deadline.  From outside the wait ends at the first token, so it includes the request's
    prefill and the delivery of its first token: a server that schedules within the bound
    but whose first token comes later is reported (allow for one prefill in ``max_wait_s``).
    A stream that failed before its first token is NO-LOSS's finding, not judged here."""
    out, end = [], h.history.end_s
    for r in h.history.requests:
        tc = h.tenant_cfg.get(r.tenant)
        if tc is None or tc.max_wait_s is None or r.sent_s is None or r.outcome == "rejected":
            continue
        deadline = r.sent_s + tc.max_wait_s
        if r.first_token_s is not None:
            waited = r.first_token_s - r.sent_s
        elif r.failure is not None:
            continue
        elif r.finish_s is not None and r.finish_s <= deadline + EPS:
            continue
        elif (r.finish_s if r.finish_s is not None else end) > deadline + EPS:
            waited = (r.finish_s if r.finish_s is not None else end) - r.sent_s
        else:
            continue
        if waited > tc.max_wait_s + EPS:
            still = "" if r.first_token_s is not None else (" (cancelled first)" if r.outcome == "cancelled"
                                                            else " (and still waits)")
            out.append(_f("BOUNDED-WAIT", None, f"request {r.request_id} waited {waited:.6g} s from its send to "
                          f"its first token{still}", waited, tc.max_wait_s, [r.tenant], [r.request_id]))
    return out


# --- VTC-GAP: the service gap while both tenants wait -------------------------------------------


def waiting_intervals(history: History) -> dict[str, list[tuple[float, float]]]:
    """Per tenant, the merged intervals [from, to) in which it waits from outside (the module
    docstring): each request sent, from the server's answer (``answered_s``: the server had the
    request; ``sent_s`` when the recording has no answer time) to its first token, or to its end
    when it ended without one (refused requests never wait; a stream that failed without a token
    counts up to the recording's end only when its failure time is unknown: it is left out)."""
    end = history.end_s
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in history.requests:
        if r.sent_s is None or r.outcome == "rejected" or (r.first_token_s is None and r.failure is not None):
            continue
        start = r.answered_s if r.answered_s is not None else r.sent_s
        to = r.first_token_s if r.first_token_s is not None else (_ended_at(r) if _ended_at(r) is not None else end)
        if to > start:
            spans.setdefault(r.tenant, []).append((start, to))
    merged: dict[str, list[tuple[float, float]]] = {}
    for t, xs in spans.items():
        out: list[list[float]] = []
        for a, b in sorted(xs):
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        merged[t] = [(a, b) for a, b in out]
    return merged


def _deliveries(history: History, w_in: float, w_out: float) -> list[tuple[float, str, float]]:
    """(time, tenant, weighted service) of every delivery the client saw, in time order: ``w_in``
    x prompt plus ``w_out`` at the first token, ``w_out`` per later token (SPEC.md 7.0's service,
    charged when the client sees it)."""
    out = []
    for r in history.requests:
        for i, t in enumerate(r.token_times):
            out.append((t, r.tenant, w_out + (w_in * r.prompt_tokens if i == 0 else 0.0)))
    out.sort(key=lambda x: x[0])
    return out


def service_gaps(h: HistoryContext) -> list[tuple[str, str, float, float, float, float]]:
    """For every pair of tenants (f, g) that wait together, the largest move of
    ``S_f/w_f - S_g/w_g`` (service as delivered, :func:`_deliveries`) within one interval in
    which both wait: (f, g, largest move, bound, from, to) with the bound of VTC-GAP (SPEC.md
    7.2: ``D/w_f + D/w_g``, D from the records, plus the skip budget's slack) and the two
    instants between which the largest move happened."""
    cfg = h.config
    waits = waiting_intervals(h.history)
    order = {n: i for i, n in enumerate(h.tenant_cfg)}  # the configuration's tenant order, then by name
    names = sorted((n for n in waits if waits[n]), key=lambda n: (order.get(n, len(order)), n))
    d = h.charge_bound
    extra = 2 * skip_slack(cfg, d)
    events = _deliveries(h.history, cfg.order.w_in, cfg.order.w_out)
    times = [e[0] for e in events]
    out = []
    for i, f in enumerate(names):
        for g in names[i + 1:]:
            both = _intersect(waits[f], waits[g])
            if not both:
                continue
            wf, wg = h.weight(f), h.weight(g)
            best = (0.0, both[0][0], both[0][0])
            for a, b in both:
                best = max(best, _largest_move(events, times, a, b, f, g, wf, wg), key=lambda x: x[0])
            out.append((f, g, best[0], d / wf + d / wg + extra, best[1], best[2]))
    return out


def _intersect(xs: Sequence[tuple[float, float]], ys: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _largest_move(events, times, a: float, b: float, f: str, g: str, wf: float, wg: float):
    """(largest |x(t2) - x(t1)| for a <= t1 <= t2 <= b, t1, t2), x = S_f/w_f - S_g/w_g counted
    from a; deliveries at a count (the interval is closed at its start), at b not."""
    from bisect import bisect_left

    x, lo, hi, t_lo, t_hi = 0.0, 0.0, 0.0, a, a
    best = (0.0, a, a)
    for t, who, s in events[bisect_left(times, a):bisect_left(times, b)]:
        if who == f:
            x += s / wf
        elif who == g:
            x -= s / wg
        else:
            continue
        for grew, t0 in ((x - lo, t_lo), (hi - x, t_hi)):
            if grew > best[0]:
                best = (grew, t0, t)
        if x < lo:
            lo, t_lo = x, t
        if x > hi:
            hi, t_hi = x, t
    return best


def l_vtc_gap(h: HistoryContext) -> list[Finding]:
    """VTC-GAP (SPEC.md 7.2), live form: within any interval in which tenants f and g both wait
    (from outside: a request sent and without its first token), the weighted service the client
    saw delivered to them, normalised by their weights, moves apart by at most the claimed
    bound ``D/w_f + D/w_g`` (D from the records' longest prompt and request).  The waits seen
    from outside are longer than the server's backlog by each request's trip to the server and
    its first token's prefill and delivery; the bound's D (a whole batch's tokens) is far above
    what a few steps deliver, and the findings name the interval to look at."""
    out = []
    for f, g, move, bound, t0, t1 in service_gaps(h):
        if move > bound + EPS:
            out.append(_f("VTC-GAP", None, f"while both waited (from outside), the service delivered to {f} and {g} "
                          f"moved apart by more than the bound between {t0:.6g} s and {t1:.6g} s", move, bound,
                          [f, g]))
    return out


# --- REFUSAL-TRUTH -----------------------------------------------------------------------------


class _Unknown:
    """A bucket whose level the client cannot know: read as empty, so that no refusal it
    would explain is called false."""

    level = 0.0

    def at(self, t_s: float) -> float:
        return 0.0


def outside_queue(history: History, r: RequestRecord) -> set[int]:
    """The requests that may have been queued, never scheduled, when the server answered
    ``r``: sent before its answer came, not refused, with no first token before ``r`` was sent
    and not ended before then (an over-approximation of the server's queue: a request is
    queued only between its arrival and its first scheduling, which precedes its first token)."""
    at = r.finish_s if r.finish_s is not None else r.sent_s
    out = set()
    for q in history.requests:
        if q.request_id == r.request_id or q.sent_s is None or q.outcome == "rejected" or q.sent_s > at + EPS:
            continue
        if q.first_token_s is not None and q.first_token_s < r.sent_s - EPS:
            continue
        end = _ended_at(q)
        if end is not None and end < r.sent_s - EPS:
            continue
        out.add(q.request_id)
    return out


def l_refusal_truth(h: HistoryContext) -> list[Finding]:
    """REFUSAL-TRUTH (SPEC.md 7.3), live form: a refusal that names a reason names one of the
    model's (:data:`~tenantry.model.events.REJECT_REASONS`) and agrees with what the client
    knows, by the record form's one rule (``invariants_claims._false_refusal``) fed with it:
    the request and the claimed configuration (``too_long``, ``too_large``; a mechanism the
    configuration does not have: ``rate_limit``, ``token_bucket``, ``queue_full``,
    ``kv_watermark``, ``estimated_wait``, ``evicted_too_often`` without ``max_evictions``), the
    requests it had open (``queue_full`` when fewer than the bound could have been queued,
    ``estimated_wait`` on the service they could have held).  What only the server knows is
    read in the server's favour: the buckets' levels (as empty) and the blocks in use (as the
    whole pool).  A refusal that names no reason (``refused``, ``http_error``: the server gave
    a status, not a reason) is not judged."""
    from .invariants_claims import _false_refusal

    cfg, out = h.config, []
    unknown = {t.name: _Unknown() for t in cfg.tenants}
    rate = {t.name: unknown[t.name] for t in cfg.tenants if t.request_rate_per_s is not None}
    tokens = {t.name: unknown[t.name] for t in cfg.tenants if t.token_rate_per_s is not None}
    for r in h.history.requests:
        if r.outcome != "rejected" or r.reason is None or r.reason in LIVE_REJECT_REASONS:
            continue
        tc = h.tenant_cfg.get(r.tenant)
        if r.reason == "evicted_too_often":
            why = (None if cfg.eviction.max_evictions is not None else
                   ("no max_evictions is configured, so no request is refused for its evictions", r.reason,
                    "no evicted_too_often refusal"))
        else:
            ids = outside_queue(h.history, r)
            fresh: dict[str, int] = {}
            for q in ids:
                fresh[h.requests[q].tenant] = fresh.get(h.requests[q].tenant, 0) + 1
            why = _false_refusal(h, r, tc, r.reason, r.sent_s if r.sent_s is not None else r.arrival_s, rate,
                                 tokens, fresh, ids, cfg.num_blocks, False)
        if why is not None:
            text, observed, allowed = why
            out.append(_f("REFUSAL-TRUTH", None, f"request {r.request_id} was refused {r.reason!r}, but {text} "
                          "(from what the client knows)", observed, allowed, [r.tenant], [r.request_id]))
    return out


# --- NONINTERFERENCE: the prefix-cache timing probe ---------------------------------------------


def mann_whitney(positives: Sequence[float], negatives: Sequence[float]) -> tuple[float, int, float]:
    """(U, n1 * n2, variance of U when both samples come from one distribution): U counts the
    pairs in which the positive scores higher, ties 1/2.  ``U / (n1 n2)`` is the ROC AUC."""
    import numpy as np

    n1, n2 = len(positives), len(negatives)
    if not n1 or not n2:
        return 0.0, 0, 0.0
    p = np.asarray(positives, dtype=float)[:, None]
    q = np.asarray(negatives, dtype=float)[None, :]
    return float((p > q).sum() + 0.5 * (p == q).sum()), n1 * n2, n1 * n2 * (n1 + n2 + 1) / 12.0


def roc_auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """P(score of a positive > score of a negative), ties counted 1/2 (Mann-Whitney U / (n1 n2)).
    0.5 when either side is empty."""
    u, n, _ = mann_whitney(positives, negatives)
    return u / n if n else 0.5


def _full_blocks(r: RequestRecord, block: int) -> tuple[int, ...]:
    return tuple(r.prefix_ids[:r.prompt_tokens // block]) if block > 0 else ()


def probe_labels(history: History, block_size_tokens: int) -> dict[int, bool]:
    """Request id -> True (its prompt's first block was sent before by another tenant, whose
    request had its first token, so its prefill was done, before this one was sent; and not by
    its own tenant) or False (nobody had sent that block before): the prefix-cache probe's
    positives and negatives among the requests with a first token and at least one full block
    of prefix ids.  Others (its own tenant sent it, or another's was still in prefill) are left
    out.  ``block_size_tokens``: the server's block size the prompts were built for."""
    first: dict[Any, list[RequestRecord]] = {}
    for r in history.requests:
        blocks = _full_blocks(r, block_size_tokens)
        if blocks and r.sent_s is not None:
            first.setdefault(blocks[0], []).append(r)
    out: dict[int, bool] = {}
    for r in history.requests:
        blocks = _full_blocks(r, block_size_tokens)
        if not blocks or r.sent_s is None or r.first_token_s is None:
            continue
        before = [q for q in first[blocks[0]] if q.request_id != r.request_id and q.sent_s < r.sent_s]
        if not before:
            out[r.request_id] = False
        elif (all(q.tenant != r.tenant for q in before)
              and any(q.first_token_s is not None and q.first_token_s < r.sent_s for q in before)):
            out[r.request_id] = True
    return out


def probe_auc(history: History, tenant: str, block_size_tokens: int) -> tuple[float, int, int, float]:
    """The prefix-cache timing probe of ``tenant`` from outside: (AUC, positives, negatives, z).

    Positives and negatives: :func:`probe_labels` among the tenant's requests; score: minus the
    time from send to first token (a cached prefix answers sooner).  The AUC is computed within
    groups of equal prompt length and pooled (Mann-Whitney U summed over the groups), so prompt
    length cannot stand in for the cache; ``z``: (U - n/2) over U's standard deviation under
    "no dependence".  Fewer than :data:`MIN_PROBES` on either side (in groups with both):
    (0.5, n_pos, n_neg, 0.0)."""
    labels = probe_labels(history, block_size_tokens)
    groups: dict[int, tuple[list[float], list[float]]] = {}
    for r in history.requests:
        if r.tenant != tenant or r.request_id not in labels:
            continue
        pos, neg = groups.setdefault(r.prompt_tokens, ([], []))
        (pos if labels[r.request_id] else neg).append(-(r.first_token_s - r.sent_s))
    u = n = var = 0.0
    n_pos = n_neg = 0
    for pos, neg in groups.values():
        if pos and neg:
            a, b, c = mann_whitney(pos, neg)
            u, n, var, n_pos, n_neg = u + a, n + b, var + c, n_pos + len(pos), n_neg + len(neg)
    if n_pos < MIN_PROBES or n_neg < MIN_PROBES:
        return 0.5, n_pos, n_neg, 0.0
    return u / n, n_pos, n_neg, (u - n / 2) / math.sqrt(var) if var > 0 else 0.0


def block_size_of(history: History, config: Config) -> int:
    """The block size the recording's prompts were built for (its header's ``live``), else the
    configuration's."""
    b = _live(history).get("block_size_tokens")
    return b if isinstance(b, int) and not isinstance(b, bool) and b > 0 else config.block_size_tokens


def l_noninterference(h: HistoryContext) -> list[Finding]:
    """NONINTERFERENCE (SPEC.md 7.5), live form: the prefix-cache timing probe.  For each
    tenant, its first-token latency must not tell whether another tenant had sent its prompt's
    prefix (:func:`probe_auc`): a finding when the AUC is at least :data:`PROBE_AUC_MIN` and
    :data:`PROBE_Z` standard deviations above 0.5.  One run stands for the two-run form's pair:
    the probes with and without another tenant's prefix are its two samples."""
    block = block_size_of(h.history, h.config)
    out = []
    for t in h.history.by_tenant():
        auc, n_pos, n_neg, z = probe_auc(h.history, t, block)
        if auc >= PROBE_AUC_MIN and z >= PROBE_Z:
            out.append(_f("NONINTERFERENCE", None, f"{t}'s first tokens came sooner when another tenant had sent "
                          f"its prompt's prefix ({n_pos} such requests against {n_neg} with a new prefix, "
                          f"z = {z:.3g}): the prefix cache leaks across tenants", round(auc, 6),
                          f"< {PROBE_AUC_MIN:g} or z < {PROBE_Z:g}", [t]))
    return out


# --- the registry's view ---------------------------------------------------------------------------

#: The invariants a client can judge, by id: their live forms.
LIVE_FORMS: dict[str, Callable[[HistoryContext], list[Finding]]] = {
    "NO-LOSS": l_no_loss,
    "BOUNDED-WAIT": l_bounded_wait,
    "VTC-GAP": l_vtc_gap,
    "REFUSAL-TRUTH": l_refusal_truth,
    "NONINTERFERENCE": l_noninterference,
}

_BLOCKS = "the server's KV block table"
_BATCH = "the server's batches (what ran in each step)"
_QUEUE = "when the server queued and first scheduled each request"
_EVICT = "the server's preemptions (a client sees a preempted stream only slow down)"
#: Why an invariant without a live form is not observable from outside: what it needs that
#: only the server knows.
BLIND: dict[str, str] = {
    "KV-CONSERVE": f"needs {_BLOCKS}",
    "KV-CAP": f"needs {_BLOCKS}",
    "SLOT-CAP": f"needs {_BATCH}",
    "QUEUE-BOUND": f"needs {_QUEUE}; a client sees only the refusals (REFUSAL-TRUTH judges queue_full)",
    "BATCH-LIMITS": f"needs {_BATCH}",
    "WORK-CONSERVING": f"needs {_BATCH} and {_BLOCKS}",
    "NO-BANKED-CREDIT": "needs the scheduler's own books (VTC counters, DRR deficits)",
    "DRR-DEFICIT": "needs the scheduler's DRR deficits",
    "FLOOR": "needs the tiers' service while each tier is backlogged in the server's queues; from outside, "
             "VTC-GAP's live form measures the service gap between tenants",
    "AGING": f"needs {_QUEUE}: the order in which waiting requests were first scheduled",
    "GUARD": f"has a state form only (it reads the reserved pool and the skip counts); and needs {_QUEUE}",
    "FCFS-TENANT": f"needs {_QUEUE}: first-token order mixes scheduling with prefill lengths and delivery",
    "FCFS-TIER": f"needs {_QUEUE} and {_BLOCKS}",
    "TIER-ORDER": f"needs {_QUEUE} and {_BLOCKS}",
    "TOKEN-BUCKET": "needs the admission instants at the server and the tokens it charged (a client knows only "
                    "when it sent)",
    "TOKEN-LIMIT": "needs the admission instants at the server and the tokens it charged",
    "REQUEST-RATE": "needs the admission instants at the server (a client knows only when it sent)",
    "EVICT-MIN-FREE": f"needs {_EVICT} and {_BLOCKS}",
    "EVICT-COOLDOWN": f"needs {_EVICT}",
    "EVICT-BOUNDED": f"needs {_EVICT}",
    "PRIORITY-PREEMPT": f"has a state form only, and needs {_EVICT}",
    "EVICT-MINIMAL": f"needs {_EVICT} and {_BLOCKS}",
    "EVICT-PROGRESS": f"needs {_EVICT} and {_BLOCKS}",
    "VICTIM": f"needs {_EVICT}",
    "SALT-ISOLATION": f"needs {_BLOCKS} with block ids; from outside, NONINTERFERENCE's live form (the timing "
                      "probe) looks for the leak",
    "DETERMINISM": "needs two runs whose every step is the server's: a live server's timing is not repeatable",
}


def blind_reason(invariant_id: str, needs: Iterable[str] = ()) -> str:
    """Why ``invariant_id`` has no live form: :data:`BLIND`'s reason, or one from what its
    history form needs (an invariant added to the registry without a reason here)."""
    if invariant_id in BLIND:
        return BLIND[invariant_id]
    needs = tuple(needs)
    if "steps" in needs:
        return "needs the server's step records"
    return "has no live form"


def live_missing(invariant_id: str, needs: Iterable[str], history: History) -> str | None:
    """What a live recording lacks for ``invariant_id``: why it is not observable from outside
    (no live form), what the recording does not keep, or None."""
    if invariant_id not in LIVE_FORMS:
        return "not observable from outside: it " + blind_reason(invariant_id, needs)
    if invariant_id == "VTC-GAP" and any(r.tokens_generated > 1 and not r.token_times for r in history.requests):
        return "the recording keeps no token times (replay --no-token-times): the service delivered is not known"
    if invariant_id == "NONINTERFERENCE" and not any(r.prefix_ids for r in history.requests):
        return "no request carries prefix ids: nothing probes the prefix cache"
    return None


def measures(history: History, config: Config) -> dict[str, Any]:
    """The figures a client measures for the live forms (whatever is claimed), for a report:

    ``max_wait_s`` per tenant (send to first token, the longest), ``service_gap`` per pair of
    tenants that waited together (the largest move, the bound, its ratio), ``probe`` per tenant
    with labelled probes (AUC, positives, negatives, z), ``lost`` (requests whose stream failed)
    and ``refusals`` per reason.
    """
    h = HistoryContext(history, config)
    waits: dict[str, float] = {}
    for r in history.requests:
        if r.sent_s is not None and r.first_token_s is not None:
            waits[r.tenant] = max(waits.get(r.tenant, 0.0), r.first_token_s - r.sent_s)
    block = block_size_of(history, config)
    probes = {}
    for t in history.by_tenant():
        auc, n_pos, n_neg, z = probe_auc(history, t, block)
        if n_pos or n_neg:
            probes[t] = {"auc": round(auc, 6), "positives": n_pos, "negatives": n_neg, "z": round(z, 3)}
    refusals: dict[str, int] = {}
    for r in history.requests:
        if r.outcome == "rejected":
            refusals[str(r.reason)] = refusals.get(str(r.reason), 0) + 1
    gaps = {f"{f}/{g}": {"gap": round(m, 6), "bound": round(b, 6), "ratio": round(m / b, 6) if b > 0 else None,
                         "from_s": round(t0, 6), "to_s": round(t1, 6)}
            for f, g, m, b, t0, t1 in service_gaps(h)} if any(r.token_times for r in history.requests) else {}
    return {"max_wait_s": {t: round(w, 6) for t, w in waits.items()}, "service_gap": gaps, "probe": probes,
            "lost": sum(1 for r in history.requests if r.sent_s is not None and r.failure is not None),
            "refusals": refusals}
