"""Objectives: what an abusive tenant does to the other tenants, as numbers.

Every function reads a :class:`~tenantry.runner.history.History` (and, for the
ratios, the baseline history of the same run without the adversary).  All of
them are larger-is-worse for the victims, so every search maximises.

Conventions:

* A victim request admitted but given no token by the end of the run has a
  *censored* TTFT: end of run minus arrival (a lower bound), so starvation
  shows in the percentiles instead of vanishing from them.  Refused requests
  (429) have no TTFT and are counted in ``victim_rejected``.
* The *actor* is every adversary tenant together (a sybil's ids are one actor).
* A step is *contended* when some victim had a request queued when it began.
* Percentiles use numpy's ``inverted_cdf`` method (an observed value).

:data:`OBJECTIVES` names every metric; :func:`all_metrics` computes them all.
"""

from __future__ import annotations

import bisect
import math
import operator
from typing import Iterable, Mapping, Sequence

import numpy as np

from tenantry.runner.fleet import moments, service_timeline, summed, tenant_weights
from tenantry.runner.history import History, RequestRecord
from tenantry.spec.invariants_live import roc_auc  # the one AUC (Mann-Whitney), also the live probe's

#: Victim TTFT service-level objective for goodput (seconds).
TTFT_SLO_S = 1.0
#: Smallest baseline latency used as a ratio's denominator (seconds): one step.
MIN_LATENCY_S = 0.025
#: Fewest labelled probes (guesses a victim had sent) for the probe AUC to mean
#: anything; with fewer, the AUC is reported as 0.5 (no evidence).
MIN_PROBES = 5

#: Metric name -> one-line description (units in the text).
OBJECTIVES: dict[str, str] = {
    "ttft_p50_inflation": "victim TTFT p50 with the adversary / without it (worst victim tenant)",
    "ttft_p99_inflation": "victim TTFT p99 with the adversary / without it (worst victim tenant)",
    "victim_ttft_p99_s": "victim TTFT p99 with the adversary (seconds, worst victim tenant)",
    "service_gap": "largest weighted-service difference between the actor and a victim over an interval "
                   "where both were backlogged, in units of the largest request's cost (on a fleet: summed over "
                   "the replicas, backlogged anywhere in the fleet: the fleet service gap)",
    "jain": "Jain's fairness index of service per actor over contended steps (1 = equal; lower is worse)",
    "unfairness": "1 - jain",
    "max_evictions": "most times one sequence was evicted",
    "evictions_per_seq": "evictions per admitted sequence (mean)",
    "wasted_prefill_tokens": "tokens whose KV was discarded by evictions and recomputed (all tenants)",
    "starvation_s": "longest wait of a victim request for its first scheduling (seconds; censored at the end)",
    "overtaken": "most adversary requests that arrived after a victim request yet were scheduled before it",
    "passed_over_s": "longest time a waiting victim request watched adversary requests enter the batch ahead of it "
                     "(seconds from its arrival to the last such admission)",
    "goodput": "victim requests with TTFT within the SLO per second of run",
    "goodput_loss": "1 - victim goodput with the adversary / without it",
    "probe_auc": "ROC AUC of the probe's TTFT for 'victim prefix cached' (0.5 = no information)",
    "contended_share": "the actor's share of weighted service over contended steps",
    "kv_share": "the actor's share of KV block-seconds",
    "victim_rejected": "victim requests refused (429)",
    "victims_outside_slo": "victim tenants whose TTFT p99 or TPOT p99 misses their target (slo_ttft_s, default "
                           "the goodput SLO; slo_tpot_s when set; a refused request misses it)",
}


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (``inverted_cdf``), or 0.0 for no data."""
    return float(np.percentile(np.asarray(xs, dtype=float), q, method="inverted_cdf")) if len(xs) else 0.0


def percentiles(xs: Sequence[float], qs: Sequence[float]) -> dict[float, float]:
    """q -> :func:`percentile` ``(xs, q)`` for each q of ``qs``, from one call to numpy (each
    an observed value, the same as one call per q)."""
    if not len(xs):
        return {q: 0.0 for q in qs}
    return {q: float(p) for q, p in zip(qs, np.percentile(np.asarray(xs, dtype=float), list(qs), method="inverted_cdf"))}


def _admitted(r: RequestRecord) -> bool:
    """Admitted by the system: not refused, and not an unfinished request that never entered a
    queue (the run ended before it arrived); a live recording (SPEC.md 12.2) knows no queue
    entry: there a request sent and not failed before any answer counts."""
    if r.outcome == "rejected":
        return False
    if r.outcome == "unfinished" and r.admitted_step is None:
        return r.sent_s is not None and not (r.failure is not None and r.http_status is None)
    return True


def censored_ttfts(history: History, tenants: Iterable[str]) -> dict[str, list[float]]:
    """Per tenant, the TTFT (seconds) of each admitted request, censored at the end of the run."""
    end, want = history.end_s, set(tenants)
    out: dict[str, list[float]] = {t: [] for t in tenants}
    for r in history.requests:
        if r.tenant in want and _admitted(r):
            out[r.tenant].append(r.ttft_s if r.ttft_s is not None else max(end - r.arrival_s, 0.0))
    return out


def ttft_inflation(hist: History, base: History, victims: Sequence[str], q: float) -> tuple[float, dict[str, float]]:
    """Worst victim's ratio of TTFT q-th percentiles (adversary / baseline), and each victim's."""
    a, b = censored_ttfts(hist, victims), censored_ttfts(base, victims)
    return _inflation(_percentiles_of(a, (q,)), _percentiles_of(b, (q,)), victims, q)


def _percentiles_of(ttfts: Mapping[str, list[float]], qs: Sequence[float]) -> dict[str, dict[float, float] | None]:
    """Per tenant, :func:`percentiles` of its values (None when it has none)."""
    return {t: percentiles(xs, qs) if xs else None for t, xs in ttfts.items()}


def _inflation(pa: Mapping[str, dict[float, float] | None], pb: Mapping[str, dict[float, float] | None],
               victims: Sequence[str], q: float) -> tuple[float, dict[str, float]]:
    """:func:`ttft_inflation` from each victim's TTFT percentiles with and without the adversary."""
    per = {v: pa[v][q] / max(pb[v][q], MIN_LATENCY_S) for v in victims if pa[v] is not None and pb[v] is not None}
    return (max(per.values()) if per else 1.0), per


def starvation_s(history: History, victims: Iterable[str]) -> float:
    """Longest wait of a victim request before it was first scheduled (seconds, censored)."""
    end, want, worst = history.end_s, set(victims), 0.0
    for r in history.requests:
        if r.tenant in want and _admitted(r):
            t = r.first_scheduled_s if r.first_scheduled_s is not None else end
            worst = max(worst, t - r.arrival_s)
    return worst


def overtaken(history: History, adversaries: Iterable[str], victims: Iterable[str]) -> int:
    """Most adversary requests that arrived after a victim request and were first
    scheduled before it (or before the end, if it never was).  0 under FCFS; large
    when banked credit or a priority lets the adversary jump the queue."""
    adv, vic, end = set(adversaries), set(victims), history.end_s
    a = sorted(((r.arrival_s, r.first_scheduled_s) for r in history.requests
                if r.tenant in adv and r.first_scheduled_s is not None), reverse=True)
    waits = sorted(((r.arrival_s, r.first_scheduled_s if r.first_scheduled_s is not None else end)
                    for r in history.requests if r.tenant in vic and _admitted(r)), reverse=True)
    # Victims latest-arriving first: the adversary requests that arrived after one are those
    # arrived after the victim before it, plus the next ones; keep their first schedulings sorted.
    later: list[float] = []
    i, worst = 0, 0
    for arrival, done in waits:
        while i < len(a) and a[i][0] > arrival:
            bisect.insort(later, a[i][1])
            i += 1
        worst = max(worst, bisect.bisect_left(later, done))
    return worst


def passed_over_s(history: History, adversaries: Iterable[str], victims: Iterable[str]) -> float:
    """Longest span from a victim request's arrival to the last adversary admission
    (first scheduling) made while it still waited.  Waiting for a busy replica with
    nobody admitted counts 0: this isolates being passed over by the order policy."""
    adv, vic, end = set(adversaries), set(victims), history.end_s
    admits = sorted(r.first_scheduled_s for r in history.requests if r.tenant in adv and r.first_scheduled_s is not None)
    worst = 0.0
    for r in history.requests:
        if r.tenant in vic and _admitted(r):
            done = r.first_scheduled_s if r.first_scheduled_s is not None else end
            i = bisect.bisect_left(admits, done) - 1
            if i >= 0 and admits[i] >= r.arrival_s:
                worst = max(worst, admits[i] - r.arrival_s)
    return worst


def goodput(history: History, victims: Iterable[str], horizon_s: float, slo_s: float = TTFT_SLO_S) -> float:
    """Victim requests finished with TTFT <= slo_s, per second of ``horizon_s``."""
    want = set(victims)
    ok = sum(1 for r in history.requests if r.tenant in want and r.ttft_s is not None and r.ttft_s <= slo_s
             and r.outcome == "finished")
    return ok / horizon_s


def tpot_s(r: RequestRecord) -> float | None:
    """Time per output token after the first (seconds): ``(finish - first token) / (tokens - 1)``,
    for a finished request of at least two output tokens; else None."""
    if r.outcome != "finished" or r.tokens_generated < 2 or r.finish_s is None or r.first_token_s is None:
        return None
    return (r.finish_s - r.first_token_s) / (r.tokens_generated - 1)


def outside_slo(history: History, targets: Mapping[str, tuple[float | None, float | None]]) -> list[str]:
    """The tenants of ``targets`` (name -> (TTFT target, TPOT target), seconds, None: none) that miss
    their service-level objective in ``history``: TTFT p99 over their admitted requests (censored
    at the end of the run, :func:`censored_ttfts`) above the TTFT target, or TPOT p99 over their
    finished requests (:func:`tpot_s`) above the TPOT target; a tenant with a refused request
    misses it too (a 429 is no service).  In ``targets`` order."""
    ttfts = censored_ttfts(history, list(targets))
    return _outside_slo(history, targets, {n: percentile(ttfts[n], 99) for n in targets})


def _outside_slo(history: History, targets: Mapping[str, tuple[float | None, float | None]],
                 ttft_p99: Mapping[str, float]) -> list[str]:
    """:func:`outside_slo` given each tenant's TTFT p99 (censored, :func:`censored_ttfts`)."""
    names = list(targets)
    tpots: dict[str, list[float]] = {n: [] for n in names}
    refused = set()
    for r in history.requests:
        if r.tenant in tpots:
            if r.outcome == "rejected":
                refused.add(r.tenant)
            t = tpot_s(r)
            if t is not None:
                tpots[r.tenant].append(t)
    out = []
    for n in names:
        ttft_target, tpot_target = targets[n]
        if (n in refused or (ttft_target is not None and ttft_p99[n] > ttft_target)
                or (tpot_target is not None and percentile(tpots[n], 99) > tpot_target)):
            out.append(n)
    return out


def _actor(tenant: str, adversaries: frozenset[str]) -> str:
    return "<adversary>" if tenant in adversaries else tenant


def contended_service(history: History, adversaries: Iterable[str], victims: Iterable[str]) -> dict[str, float]:
    """Weighted service per actor received in contended steps (weight 1 per tenant); on a
    fleet history, fleet steps with service summed over the replicas (:func:`service_timeline`).
    A contended step is one that starts with a victim queued; an actor queued at the start of
    one is in the map even if it was never served (0.0): it was competing."""
    return _contended(service_timeline(history), adversaries, victims)


def _contended(timeline: Iterable[tuple[Mapping[str, float], Mapping[str, int]]], adversaries: Iterable[str],
               victims: Iterable[str]) -> dict[str, float]:
    """:func:`contended_service` over a history's :func:`service_timeline`."""
    adv, vic = frozenset(adversaries), tuple(victims)
    out: dict[str, float] = {}
    prev_service: Mapping[str, float] = {}
    prev_queued: Mapping[str, int] = {}
    for service, queued in timeline:
        if any(prev_queued.get(v, 0) > 0 for v in vic):
            for t, x in service.items():
                d = x - prev_service.get(t, 0.0)
                if d:
                    a = _actor(t, adv)
                    out[a] = out.get(a, 0.0) + d
            for t, q in prev_queued.items():  # after the served ones: their order (and sums) as before
                if q > 0:
                    out.setdefault(_actor(t, adv), 0.0)
        prev_service, prev_queued = service, queued
    return out


def contended_share(history: History, adversaries: Iterable[str], victims: Iterable[str]) -> float:
    """The actor's share of weighted service over contended steps (0 when none)."""
    return _share(contended_service(history, adversaries, victims))


def _share(svc: Mapping[str, float]) -> float:
    total = sum(svc.values())
    return svc.get("<adversary>", 0.0) / total if total > 0 else 0.0


def jain(history: History, adversaries: Iterable[str], victims: Iterable[str]) -> float:
    """Jain's fairness index (Jain, Chiu and Hawe, DEC-TR-301, 1984) over the actors'
    contended service: (sum x)^2 / (n sum x^2), n the actors that competed (served, or queued
    at the start of a contended step: an actor that queued and got nothing counts as 0, so
    the adversary alone served among k actors gives 1/k); 1.0 when fewer than two actors
    competed or none was served."""
    return _jain(contended_service(history, adversaries, victims))


def _jain(svc: Mapping[str, float]) -> float:
    x = np.array(list(svc.values()), dtype=float)
    if len(x) < 2 or not np.any(x > 0):
        return 1.0
    return float(x.sum() ** 2 / (len(x) * (x ** 2).sum()))


def service_gap(history: History, adversaries: Iterable[str] | None = None, victims: Iterable[str] | None = None,
                unit: float = 1.0) -> float:
    """The service gap: the largest swing of ``N_a - N_v`` over an interval where both
    sides were backlogged (requests queued) at the start of every step, divided by
    ``unit``; N is weighted service over weight, summed over a side's tenants
    (``S_t / w_t``, weights from the history's header, 1 without one).

    The sides: the actor (every tenant of ``adversaries`` together: a sybil's ids are one
    actor) against each tenant of ``victims``; with both None, every pair of tenants (the
    fleet service gap that ``tenantry simulate --replicas`` prints).  On a fleet history
    (SPEC.md 6.2) a step is a fleet step, service is summed over the replicas and a side
    is backlogged when it has a request queued on any replica
    (:func:`tenantry.runner.fleet.service_timeline`): the quantity VTC-GAP bounds on one
    replica (SPEC.md 7.2) and FLEET-VTC-GAP across the fleet (SPEC.md 7.9).

    Units: weighted service tokens / ``unit`` (the matrix passes the largest request's
    cost, so 2 means two of the largest requests).  The VTC service-difference bound
    (Sheng et al., OSDI 2024, section 4) keeps this near 2 for two backlogged tenants of
    equal weight on one replica.  0 when two sides were never backlogged together.
    """
    return _gap(list(service_timeline(history)), tenant_weights(history), adversaries, victims, unit)


def _gap(timeline: list[tuple[Mapping[str, float], Mapping[str, int]]], w: Mapping[str, float],
         adversaries: Iterable[str] | None, victims: Iterable[str] | None, unit: float) -> float:
    """:func:`service_gap` over a history's :func:`service_timeline` and its tenant weights ``w``."""
    if adversaries is None and victims is None:
        names = sorted({t for sv, _ in timeline for t in sv})
        pairs = [((a,), (b,)) for i, a in enumerate(names) for b in names[i + 1:]]
    else:
        adv = tuple(adversaries or ())
        pairs = [(adv, (v,)) for v in (victims or ())]
    # Per tenant, then per side (a tuple of tenants, summed in its order), per step: N, and
    # whether it had a request queued.
    members = dict.fromkeys(t for pair in pairs for side in pair for t in side)
    norm = {t: [service.get(t, 0.0) / wt for service, _ in timeline] for t, wt in ((t, w.get(t, 1.0)) for t in members)}
    busy = {t: [queued.get(t, 0) > 0 for _, queued in timeline] for t in members}
    sides: dict[tuple[str, ...], tuple[list, list[bool]]] = {}
    for side in (x for pair in pairs for x in pair):
        if side not in sides:
            sides[side] = ((list(map(sum, zip(*(norm[t] for t in side)))), list(map(any, zip(*(busy[t] for t in side)))))
                           if side else ([0] * len(timeline), [False] * len(timeline)))
    worst = 0.0
    for left, right in pairs:
        (n_left, q_left), (n_right, q_right) = sides[left], sides[right]
        lo = hi = None  # range of D = N(left) - N(right) over the current common-backlog period
        prev_d, prev_both = 0.0, False
        for d, both in zip(map(operator.sub, n_left, n_right), map(operator.and_, q_left, q_right)):
            if prev_both:  # both backlogged when this step began
                if lo is None:
                    lo = hi = prev_d
                if d < lo:  # lo, hi = min(lo, d), max(hi, d); worst = max(worst, hi - lo)
                    lo = d
                if d > hi:
                    hi = d
                if hi - lo > worst:
                    worst = hi - lo
            else:
                lo = hi = None
            prev_d, prev_both = d, both
    return worst / unit if unit > 0 else 0.0


def kv_share(history: History, adversaries: Iterable[str]) -> float:
    """The actor's share of KV block-seconds over the run (a fleet's: summed over its replicas'
    last records, :func:`tenantry.runner.fleet.moments`)."""
    last = None
    for _, recs in moments(history):
        last = recs
    if not last:
        return 0.0
    bs = summed(last, "block_seconds")
    total = sum(bs.values())
    return sum(x for t, x in bs.items() if t in set(adversaries)) / total if total > 0 else 0.0


def probe_auc(hist: History, twin: History, adversaries: Iterable[str], cached_before: Mapping[int, bool]) -> float:
    """AUC of the probe: can its TTFT tell a cached victim prefix from an uncached one?

    Slot i is the i-th adversary request in arrival order.  Positives: slots
    whose guessed prefix a victim had sent before the probe (``cached_before``),
    scored by -TTFT in the run with the guess; negatives: the same slots'
    -TTFT in the twin run where the guess is replaced by a fresh decoy.  When
    nothing the adversary sends changes what it observes (salted or no cache)
    the two samples are the same multiset and the AUC is exactly 0.5.
    Fewer than :data:`MIN_PROBES` positive slots give 0.5 (too little evidence).
    """
    adv = set(adversaries)

    def slots(h: History) -> list[float]:
        recs = sorted((r for r in h.requests if r.tenant in adv and _admitted(r)), key=lambda r: (r.arrival_s, r.request_id))
        return [-(r.ttft_s if r.ttft_s is not None else h.end_s - r.arrival_s) for r in recs]

    a, b = slots(hist), slots(twin)
    idx = [i for i in range(min(len(a), len(b))) if cached_before.get(i, False)]
    if len(idx) < MIN_PROBES:
        return 0.5
    return roc_auc([a[i] for i in idx], [b[i] for i in idx])


def eviction_stats(history: History) -> tuple[int, float, int]:
    """(most evictions of one sequence, mean evictions per admitted sequence, wasted prefill tokens)."""
    adm = [r for r in history.requests if _admitted(r)]
    if not adm:
        return 0, 0.0, 0
    return (max(r.preemptions for r in adm), sum(r.preemptions for r in adm) / len(adm),
            sum(r.wasted_prefill_tokens for r in adm))


def all_metrics(hist: History, base: History, *, adversaries: Sequence[str], victims: Sequence[str],
                horizon_s: float, unit_cost: float, twin: History | None = None,
                cached_before: Mapping[int, bool] | None = None,
                slos: Mapping[str, tuple[float | None, float | None]] | None = None) -> dict[str, float]:
    """Every metric of :data:`OBJECTIVES` (plus per-victim inflation entries
    ``ttft_p99_inflation[<victim>]``) for one run and its baseline; ``slos``: per victim
    (TTFT target, TPOT target) in seconds (default: :data:`TTFT_SLO_S` and no TPOT target)."""
    pa = _percentiles_of(censored_ttfts(hist, victims), (50, 99))
    pb = _percentiles_of(censored_ttfts(base, victims), (50, 99))
    p50, _ = _inflation(pa, pb, victims, 50)
    p99, per99 = _inflation(pa, pb, victims, 99)
    p99_of = {v: pa[v][99] if pa[v] is not None else 0.0 for v in victims}
    max_ev, mean_ev, wasted = eviction_stats(hist)
    gp, gp0 = goodput(hist, victims, horizon_s), goodput(base, victims, horizon_s)
    timeline = list(service_timeline(hist))  # read by the service gap and the contended service
    contended = _contended(timeline, adversaries, victims)
    j = _jain(contended)
    m = {
        "ttft_p50_inflation": p50,
        "ttft_p99_inflation": p99,
        "victim_ttft_p99_s": max((pa[v][99] for v in victims if pa[v] is not None), default=0.0),
        "service_gap": _gap(timeline, tenant_weights(hist), adversaries, victims, unit_cost),
        "jain": j,
        "unfairness": 1.0 - j,
        "max_evictions": float(max_ev),
        "evictions_per_seq": mean_ev,
        "wasted_prefill_tokens": float(wasted),
        "starvation_s": starvation_s(hist, victims),
        "overtaken": float(overtaken(hist, adversaries, victims)),
        "passed_over_s": passed_over_s(hist, adversaries, victims),
        "goodput": gp,
        "goodput_loss": 1.0 - gp / gp0 if gp0 > 0 else 0.0,
        "probe_auc": probe_auc(hist, twin, adversaries, cached_before or {}) if twin is not None else 0.5,
        "contended_share": _share(contended),
        "kv_share": kv_share(hist, adversaries),
        "victim_rejected": float(sum(1 for r in hist.requests if r.tenant in set(victims) and r.outcome == "rejected")),
        "victims_outside_slo": float(len(_outside_slo(hist, {v: (slos or {}).get(v, (TTFT_SLO_S, None))
                                                              for v in victims}, p99_of))),
    }
    for v, x in sorted(per99.items()):
        m[f"ttft_p99_inflation[{v}]"] = x
    return {k: (float(v) if math.isfinite(v) else 1e9) for k, v in m.items()}
