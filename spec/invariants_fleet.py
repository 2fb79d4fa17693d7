"""Fleet invariants (SPEC.md 7.9) and the offline check of a fleet history.

A fleet history (SPEC.md 6.2) is split into one history per replica
(:func:`fleet_parts`), each judged by the one catalog
(:func:`tenantry.spec.invariants.check_history`, every applicable per-replica
invariant, nothing re-implemented here), plus the fleet's own invariants over
the fleet step records:

* FLEET-NO-LOSS: every request is routed to exactly one replica, at its arrival,
  is answered there in that fleet step, and appears on no other replica;
* ROUTE-LOAD-BOUND: a load-bounded router never sends a request to a replica
  that would then hold more than ``ceil(c * (m + 1) / R)`` outstanding requests;
* FLEET-VTC-GAP: with fleet-level accounting, the shared counters move by the
  fleet's charges (the premise), and a tenant picked on a replica never runs more
  than ``D_F / w`` ahead of a tenant that has waited there since (the spread).

Public surface::

    FLEET_INVARIANTS: dict[str, FleetInvariant]
    fleet_parts(history) -> list[History]
    SpreadRelation(replicas)        # FLEET-VTC-GAP's pairs, fleet step by fleet step
    check_fleet_history(history, ids=None) -> list[Finding]
    check_fleet_step(ctx, before, transition, fleet) -> list[Finding]   # the state forms
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import attrs

from tenantry.model.config import Config, ConfigError
from tenantry.model.routers import LOAD_BOUNDED, load_bound
from tenantry.runner.fleet import service_timeline
from tenantry.runner.history import History, StepRecord
from tenantry.runner.setups import config_from_dict

from .invariants import check_state
from .invariants_core import Finding, ample_kv, batch_token_capacity, check_raised, owed

_TERMINAL = ("finished", "cancelled", "rejected")


@attrs.frozen
class FleetView:
    """A fleet history read once: its fleet header, replica configs, and per fleet step
    the replica step records (None for a replica that waited)."""

    history: History
    fleet: dict[str, Any]
    configs: tuple[Config, ...]
    steps: tuple[tuple[StepRecord | None, ...], ...]  # [fleet step][replica]


def _read(history: History) -> FleetView:
    """The :class:`FleetView` of a fleet history.

    Raises:
        ConfigError: when the header has no ``fleet`` or a step record does not
            match its fleet step.
    """
    fleet = history.header.get("fleet")
    if not isinstance(fleet, dict) or not isinstance(fleet.get("replicas"), list) or not fleet["replicas"]:
        raise ConfigError("fleet", fleet if fleet is None else "...", "not a fleet history: the header has no fleet "
                          "with replicas (SPEC.md 6.2)", "history header")
    configs = tuple(config_from_dict(d, f"history header: fleet.replicas[{r}]") for r, d in enumerate(fleet["replicas"]))
    n = len(configs)
    for q in history.requests:
        if q.replica is not None and not 0 <= q.replica < n:
            raise ConfigError("replica", q.replica, f"request {q.request_id} names a replica this fleet does not have "
                              f"(replicas 0..{n - 1})", f"request {q.request_id}")
    queues: list[list[StepRecord]] = [[] for _ in range(n)]
    for s in history.steps:
        if s.replica is None or not 0 <= s.replica < n:
            raise ConfigError("replica", s.replica, f"a fleet history's step names a replica 0..{n - 1}",
                              f"step {s.step_index}")
        queues[s.replica].append(s)
    pos = [0] * n
    rows = []
    for f in history.fleet_steps:
        row: list[StepRecord | None] = [None] * n
        for r in f.stepped:
            if not 0 <= r < n or pos[r] >= len(queues[r]) or queues[r][pos[r]].start_s != f.start_s:
                raise ConfigError("stepped", r, "names a replica without a step record starting with this fleet step",
                                  f"fleet step {f.fleet_step}")
            row[r] = queues[r][pos[r]]
            pos[r] += 1
        rows.append(tuple(row))
    for r in range(n):
        if pos[r] != len(queues[r]):
            raise ConfigError("replica", r, "has step records that no fleet step lists in 'stepped'",
                              f"step {queues[r][pos[r]].step_index}")
    return FleetView(history, fleet, configs, tuple(rows))


def fleet_parts(history: History) -> list[History]:
    """One one-replica :class:`History` per replica of a fleet history: its step
    records, the requests routed to it, and a header with its configuration: what
    the per-replica catalog judges.

    Raises:
        ConfigError: when ``history`` is not a fleet history.
    """
    v = _read(history)
    out = []
    for r, d in enumerate(v.fleet["replicas"]):
        hdr = {k: x for k, x in history.header.items() if k != "fleet"}
        hdr.update(config=d, replica=r)
        out.append(History(header=hdr, steps=tuple(s for s in history.steps if s.replica == r),
                           requests=tuple(q for q in history.requests if q.replica == r)))
    return out


def _end_steps(v: FleetView) -> dict[int, int]:
    """request id -> the fleet step of its terminal event."""
    out = {}
    for k, row in enumerate(v.steps):
        for s in row:
            if s is not None:
                for e in s.events:
                    if e.kind in _TERMINAL:
                        out.setdefault(e.request_id, k)
    return out


def h_no_loss(v: FleetView) -> list[Finding]:
    """FLEET-NO-LOSS (SPEC.md 7.9): each request is routed once, to the replica its
    record names, at the first fleet step starting at or after its arrival, and
    answered (queued or refused) by that replica in that fleet step; no replica's step
    names a request routed elsewhere or not yet routed."""
    out: list[Finding] = []
    h, n = v.history, len(v.configs)
    F = lambda k, rids, obs, allowed, msg, tenants=(): Finding("FLEET-NO-LOSS", k, tenants, rids, obs, allowed, msg)
    recs: dict[int, Any] = {}
    for q in h.requests:
        if q.request_id in recs:
            out.append(F(None, (q.request_id,), 2, 1, "a request has two records (it ended on two replicas)", (q.tenant,)))
        recs[q.request_id] = q
    starts = [f.start_s for f in h.fleet_steps]
    routed_at: dict[int, tuple[int, int]] = {}
    for k, f in enumerate(h.fleet_steps):
        for rid, r in f.routed:
            if rid in routed_at:
                out.append(F(k, (rid,), f"replicas {routed_at[rid][1]} and {r}", "one replica",
                             "a request is routed twice"))
                continue
            routed_at[rid] = (k, r)
            q = recs.get(rid)
            if q is None:
                out.append(F(k, (rid,), "routed", "a request of the workload", "a request routed that has no record"))
                continue
            if q.replica != r:
                out.append(F(k, (rid,), q.replica, r, "the request's record names another replica than it was "
                             "routed to", (q.tenant,)))
            due = bisect.bisect_left(starts, q.arrival_s)  # the Feed rule, exactly: arrival_s <= start_s
            if due != k:
                out.append(F(k, (rid,), f.start_s, starts[due] if due < len(starts) else None,
                             "routed at another fleet step than the first starting at or after its arrival",
                             (q.tenant,)))
            s = v.steps[k][r] if 0 <= r < n else None
            answered = s is not None and any(e.request_id == rid and e.kind in ("queued", "rejected") for e in s.events)
            if not answered:
                out.append(F(k, (rid,), "no answer", "queued or rejected on its replica in the fleet step it was "
                             "routed in", f"replica {r} did not answer a request routed to it (lost)", (q.tenant,)))
    for q in h.requests:
        if q.request_id not in routed_at and (q.replica is not None or q.outcome != "unfinished"):
            out.append(F(None, (q.request_id,), q.outcome, "unfinished and on no replica",
                         "a request never routed has a replica or an outcome", (q.tenant,)))
    for k, row in enumerate(v.steps):
        for r, s in enumerate(row):
            if s is None:
                continue
            named = ({rid for rid, _ in s.batch} | set(s.running) | set(s.preempted)
                     | {e.request_id for e in s.events})
            for rid in sorted(named):
                at = routed_at.get(rid)
                if at is None or at[1] != r or at[0] > k:
                    out.append(F(k, (rid,), f"on replica {r}", "only on the replica it was routed to, after its "
                                 "routing", "a replica's step names a request not routed to it"))
    return out


def h_load_bound(v: FleetView) -> list[Finding]:
    """ROUTE-LOAD-BOUND (SPEC.md 7.9): each routed request's replica holds, with it,
    at most ``ceil(c * (m + 1) / R)`` outstanding requests, the loads recomputed from
    the records (routed and not ended before the fleet step, plus those routed
    earlier in it), not read from the router."""
    out: list[Finding] = []
    n, c = len(v.configs), float(v.fleet.get("load_factor", 1.0))
    end = _end_steps(v)
    ending: dict[int, list[int]] = {}
    load = [0] * n
    home: dict[int, int] = {}
    for k, f in enumerate(v.history.fleet_steps):
        for rid, r in f.routed:
            if not 0 <= r < n:
                continue
            bound = load_bound(c, sum(load), n)
            if load[r] + 1 > bound:
                out.append(Finding("ROUTE-LOAD-BOUND", k, (), (rid,), load[r] + 1, bound,
                                   f"routed to replica {r}, which then holds more outstanding requests than the load "
                                   f"bound ceil({c:g} * (m + 1) / {n}) allows"))
            load[r] += 1
            home[rid] = r
            ending.setdefault(end.get(rid, 1 << 60), []).append(rid)
        for rid in ending.pop(k, ()):
            load[home[rid]] -= 1
    return out


def fleet_largest_charge(configs: Sequence[Config], max_total_tokens: int) -> float:
    """D_F: the most weighted tokens a tenant can be charged across the fleet after its last
    pick: the sum over replicas of ``max(w_in, w_out) * M_r`` (SPEC.md 7.9), M_r the batch
    token capacity (:func:`~tenantry.spec.invariants_core.batch_token_capacity`) with T =
    ``max_total_tokens``, the longest request."""
    return sum(max(c.order.w_in, c.order.w_out) * batch_token_capacity(c, max_total_tokens) for c in configs)


def fleet_charge_bound(v: FleetView) -> float:
    """D_F of a fleet history (:func:`fleet_largest_charge`), T the longest request of its records."""
    rs = v.history.requests
    return fleet_largest_charge(v.configs, max((q.prompt_tokens + q.output_tokens for q in rs), default=1))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def _service_deltas(v: FleetView, names: list[str]) -> list[list[dict[str, float]]]:
    """[fleet step][replica] -> tenant -> service charged by that replica in that step."""
    n = len(v.configs)
    prev = [dict.fromkeys(names, 0.0) for _ in range(n)]
    out = []
    for row in v.steps:
        ds = []
        for r, s in enumerate(row):
            if s is None:
                ds.append(dict.fromkeys(names, 0.0))
            else:
                ds.append({i: s.service[i] - prev[r][i] for i in names})
                prev[r] = dict(s.service)
        out.append(ds)
    return out


def fleet_service_counters(history: History) -> list[dict[str, float]]:
    """Per fleet step, each tenant's normalised fleet service ``sum_r S_i^r / w_i``
    after it: the fleet counters without lifts, what per-replica accounting is judged
    on when FLEET-VTC-GAP's spread is asked of it (its refuted twin, SPEC.md 7.9); the
    fleet's service as :func:`tenantry.runner.fleet.service_timeline` reads it.

    Raises:
        ConfigError: when ``history`` is not a fleet history.
    """
    v = _read(history)
    w = {t.name: t.weight for t in v.configs[0].tenants}
    return [{i: service.get(i, 0.0) / w[i] for i in w} for service, _ in service_timeline(history)]


class SpreadRelation:
    """The pairs FLEET-VTC-GAP's spread ranges over, kept fleet step by fleet step (SPEC.md 7.9):
    ``since[r][g]``, the first fleet step of tenant g's current queued run on replica r (queued
    at the end of every fleet step from it on), and ``last_pick[f] = (j, replicas)``, the fleet
    step of f's last pick (an entry of one of its requests into a batch) and the replicas it was
    picked on in that step.  The proof's encoding (``proofs.fleet.fleet_step``) updates its
    ``sn``, ``lp`` and ``P`` by the same rule, and the encoding test holds them to this.

    Args:
        replicas: the number of replicas.
    """

    def __init__(self, replicas: int) -> None:
        self.since: list[dict[str, int]] = [{} for _ in range(replicas)]
        self.last_pick: dict[str, tuple[int, frozenset[int]]] = {}

    def advance(self, k: int, picked: Sequence[Iterable[str]], queued: Sequence[Mapping[str, int]]) -> None:
        """Fold fleet step k: ``picked[r]`` the tenants picked on replica r in it, ``queued[r]``
        tenant -> requests queued on r at its end."""
        for r, names in enumerate(picked):
            for i in sorted(set(names)):
                at = self.last_pick.get(i)
                self.last_pick[i] = (k, (at[1] if at and at[0] == k else frozenset()) | {r})
        for r, qs in enumerate(queued):
            for i, q in qs.items():
                if q > 0:
                    self.since[r].setdefault(i, k)
                else:
                    self.since[r].pop(i, None)

    def pairs(self) -> Iterator[tuple[str, str, int, int]]:
        """Every related ``(f, g, r, j)``: f's last pick was in fleet step j, on replica r, and g
        has been queued on r since a step at or before j (sorted, deterministic)."""
        for f in sorted(self.last_pick):
            j, reps = self.last_pick[f]
            for r in sorted(reps):
                for g in sorted(self.since[r]):
                    if g != f and self.since[r][g] <= j:
                        yield f, g, r, j


def picked_tenants(step: StepRecord | None, tenant_of: Mapping[int, str]) -> set[str]:
    """The tenants with a ``scheduled`` event in a replica's step record (none for a replica that waited)."""
    if step is None:
        return set()
    return {tenant_of[e.request_id] for e in step.events if e.kind == "scheduled" and e.request_id in tenant_of}


def spread_findings(history: History, counters: list[dict[str, float]]) -> list[Finding]:
    """FLEET-VTC-GAP's spread over the given counters per fleet step: for every pair of
    :class:`SpreadRelation` at the end of each fleet step, ``c_f - c_g <= D_F / w_f``."""
    v = _read(history)
    out: list[Finding] = []
    n = len(v.configs)
    w = {t.name: t.weight for t in v.configs[0].tenants}
    tenant_of = {q.request_id: q.tenant for q in v.history.requests}
    d_f = fleet_charge_bound(v)
    rel = SpreadRelation(n)
    queued: list[Mapping[str, int]] = [{} for _ in range(n)]
    for k, (row, c) in enumerate(zip(v.steps, counters)):
        for r, s in enumerate(row):
            if s is not None:
                queued[r] = s.queued
        rel.advance(k, [picked_tenants(s, tenant_of) for s in row], queued)
        for fi, g, r, j in rel.pairs():
            if c[fi] - c[g] > d_f / w[fi] * (1 + 1e-9):
                out.append(Finding("FLEET-VTC-GAP", k, (fi, g), (), c[fi] - c[g], d_f / w[fi],
                                   f"tenant {fi}, last picked on replica {r} at fleet step {j}, runs ahead of "
                                   f"{g}, waiting there since, by more than D_F / w"))
    return out


def h_fleet_vtc_gap(v: FleetView) -> list[Finding]:
    """FLEET-VTC-GAP (SPEC.md 7.9), history form: the premise (each replica read the
    fleet counters, a tenant that cannot have been lifted moves by exactly its fleet
    charges, and one joining the fleet's backlog is lifted to exactly the least counter
    of the tenants queued, when some are) and the spread (:func:`spread_findings` on
    the recorded counters)."""
    out: list[Finding] = []
    h, n = v.history, len(v.configs)
    names = [t.name for t in v.configs[0].tenants]
    w = {t.name: t.weight for t in v.configs[0].tenants}
    tenant_of = {q.request_id: q.tenant for q in h.requests}
    queued = [dict.fromkeys(names, 0) for _ in range(n)]
    counters = dict.fromkeys(names, 0.0)
    for k, (f, row, ds) in enumerate(zip(h.fleet_steps, v.steps, _service_deltas(v, names))):
        if f.counters is None or set(f.counters) != set(names):
            return out + [Finding("FLEET-VTC-GAP", k, (), (), f.counters, "the fleet counters of every tenant",
                                  "a fleet step under fleet accounting records no fleet counters")]
        backlog = {i for r in range(n) for i in names if queued[r].get(i, 0) > 0}
        arriving = {tenant_of.get(rid) for rid, _ in f.routed}
        for i in names:
            charge = sum(d[i] for d in ds) / w[i]
            lifted = f.counters[i] - charge  # the counter every replica read (after the fleet lift)
            for r, s in enumerate(row):
                if s is not None and not _close(s.counters[i], lifted + ds[r][i] / w[i]):
                    out.append(Finding("FLEET-VTC-GAP", k, (i,), (), s.counters[i], lifted + ds[r][i] / w[i],
                                       f"replica {r} did not read the fleet counter (its counter after the step is "
                                       "not the fleet's before it plus its own charges)"))
            if i in backlog or i not in arriving:
                if not _close(lifted, counters[i]):
                    out.append(Finding("FLEET-VTC-GAP", k, (i,), (), f.counters[i] - counters[i], charge,
                                       "a tenant that cannot have been lifted moved its fleet counter by other than "
                                       "its fleet charges"))
            else:
                others = [counters[j] for j in backlog if j != i]
                if others:  # the lift is exactly up to the least counter of the tenants queued somewhere
                    want = max(counters[i], min(others))
                    if not _close(lifted, want):
                        out.append(Finding("FLEET-VTC-GAP", k, (i,), (), lifted, want,
                                           "a tenant joining the fleet's backlog was not lifted to the least counter "
                                           "of the tenants queued (banked credit, or a lift above it)"))
                elif lifted < counters[i] - 1e-6 * max(1.0, abs(counters[i])):
                    out.append(Finding("FLEET-VTC-GAP", k, (i,), (), lifted, counters[i],
                                       "the fleet lift lowered a counter"))
        counters = dict(f.counters)
        for r, s in enumerate(row):
            if s is not None:
                queued[r] = dict(s.queued)
    return out + spread_findings(h, [f.counters for f in h.fleet_steps])


# --- State forms: one fleet step, judged as it happens (the stateful machine) -------------------------------------

class FleetStepContext:
    """What the fleet's state forms carry from one fleet step to the next: the
    :class:`SpreadRelation` and the longest request routed so far (T of D_F).

    Args:
        config: the :class:`~tenantry.model.routers.FleetConfig` the fleet runs.
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.fleet = config.to_dict()
        self.configs = tuple(config.run_configs)
        self.names = [t.name for t in self.configs[0].tenants]
        self.relation = SpreadRelation(len(self.configs))
        self.longest = 1


def _state_no_loss(ctx: FleetStepContext, before: Sequence[Any], tr: Any, fleet: Any) -> list[Finding]:
    """FLEET-NO-LOSS, state form: every request routed in the step is answered (queued or
    refused) by its replica in that step."""
    out = []
    for rid, r in tr.record.routed:
        t = tr.replicas[r] if 0 <= r < len(tr.replicas) else None
        if t is None or not any(e.request_id == rid and e.kind in ("queued", "rejected") for e in t.output.events):
            out.append(Finding("FLEET-NO-LOSS", tr.record.fleet_step, (), (rid,), "no answer",
                               "queued or rejected on its replica in the fleet step it was routed in",
                               f"replica {r} did not answer a request routed to it (lost)"))
    return out


def _state_load_bound(ctx: FleetStepContext, before: Sequence[Any], tr: Any, fleet: Any) -> list[Finding]:
    """ROUTE-LOAD-BOUND, state form: the loads the routing met, recomputed from the replicas'
    states before the step (running plus queued) and the requests routed earlier in it."""
    from tenantry.model.routers import outstanding
    load = [outstanding(st) for st in before]
    c, n, out = float(ctx.fleet.get("load_factor", 1.0)), len(load), []
    for rid, r in tr.record.routed:
        bound = load_bound(c, sum(load), n)
        if load[r] + 1 > bound:
            out.append(Finding("ROUTE-LOAD-BOUND", tr.record.fleet_step, (), (rid,), load[r] + 1, bound,
                               f"routed to replica {r}, which then holds more outstanding requests than the load "
                               f"bound ceil({c:g} * (m + 1) / {n}) allows"))
        load[r] += 1
    return out


def _state_vtc_gap(ctx: FleetStepContext, before: Sequence[Any], tr: Any, fleet: Any) -> list[Finding]:
    """FLEET-VTC-GAP, state form: every replica that stepped read the fleet counters, the
    counters moved by exactly the replicas' charges over the weight, and the proved invariant
    (SPEC.md 8.15) holds on every pair of the :class:`SpreadRelation`: ``c_f + owed_f <= c_g +
    D_F / w_f``, owed_f what f's running sequences on every replica still owe (a strengthening
    of the history form's spread; D_F with T the longest request routed so far)."""
    k, names, cfgs = tr.record.fleet_step, ctx.names, ctx.configs
    w = [t.weight for t in cfgs[0].tenants]
    out = []
    c0, c1 = tr.counters_before, tr.counters_after
    for r, t in enumerate(tr.replicas):
        if t is not None and any(not _close(a.counter, b) for a, b in zip(t.prev.tenants, c0)):
            out.append(Finding("FLEET-VTC-GAP", k, (), (), [a.counter for a in t.prev.tenants], list(c0),
                               f"replica {r} did not read the fleet counters at the fleet step's start"))
    for i, name in enumerate(names):
        charge = sum(rep.state.tenants[i].service - st.tenants[i].service
                     for rep, st in zip(fleet.replicas, before)) / w[i]
        if not _close(c1[i], c0[i] + charge):
            out.append(Finding("FLEET-VTC-GAP", k, (name,), (), c1[i] - c0[i], charge,
                               "a fleet counter moved by other than the replicas' charges over the weight"))
    g = [0.0] * len(names)
    for c, rep in zip(cfgs, fleet.replicas):
        g = [a + float(b) for a, b in zip(g, owed(c, rep.state.running, len(names)))]
    d_f = fleet_largest_charge(cfgs, ctx.longest)
    ix = {x: i for i, x in enumerate(names)}
    for f, gname, r, j in ctx.relation.pairs():
        a, b = ix[f], ix[gname]
        if c1[a] + g[a] > c1[b] + d_f / w[a] + 1e-9 * max(1.0, abs(c1[b])):
            out.append(Finding("FLEET-VTC-GAP", k, (f, gname), (), c1[a] + g[a] - c1[b], d_f / w[a],
                               f"tenant {f}, last picked on replica {r} at fleet step {j}, with what it still owes, "
                               f"runs ahead of {gname}, waiting there since, by more than D_F / w"))
    return out


def check_fleet_step(ctx: FleetStepContext, before: Sequence[Any], tr: Any, fleet: Any) -> list[Finding]:
    """Judge one fleet step as it happens: the state form of every applicable fleet invariant
    (``before``: the replicas' states before the step; ``tr``: the fleet's
    :class:`~tenantry.runner.fleet.FleetTransition`; ``fleet``: the fleet after it).  Advances
    ``ctx`` (the spread's relation, T).  The per-replica state forms are the caller's
    (:func:`tenantry.spec.invariants.check_state` on each replica's transition)."""
    for t in tr.replicas:
        if t is not None:
            for q in t.inputs.arrivals:
                ctx.longest = max(ctx.longest, q.prompt_tokens + q.output_tokens)
    names = ctx.names
    picked = [set() if t is None else {names[e.tenant] for e in t.output.events if e.kind == "scheduled"}
              for t in tr.replicas]
    queued = [{x: len(q.queue) for x, q in zip(names, rep.state.tenants)} for rep in fleet.replicas]
    ctx.relation.advance(tr.record.fleet_step, picked, queued)
    out = []
    for inv in FLEET_INVARIANTS.values():
        if inv.check_state is not None and inv.applies(ctx.fleet, ctx.configs):
            try:
                out += inv.check_state(ctx, before, tr, fleet)
            except Exception as e:  # one check that raises must not end the run: a finding
                out.append(check_raised(inv.id, e, tr.record.fleet_step))
    return out


def check_fleet_transition(ctx: FleetStepContext, before: Sequence[Any], tr: Any, fleet: Any,
                           ids: Iterable[str] | None = None) -> list[Finding]:
    """Judge one fleet step whole: the per-replica state forms ``ids`` (None: every
    applicable one; :func:`tenantry.spec.invariants.check_state`) on each replica that
    stepped, a finding's message beginning ``replica r:``, then :func:`check_fleet_step`.
    The one judge of a fleet step, for the stateful machine and the checked fleet run
    (:func:`tenantry.spec.invariants_run.run_fleet_checked`)."""
    wanted = None if ids is None else list(ids)
    out: list[Finding] = []
    for r, t in enumerate(tr.replicas):
        if t is not None and (wanted is None or wanted):
            out += [attrs.evolve(x, message=f"replica {r}: {x.message}")
                    for x in check_state(ctx.configs[r], t.prev, t.state, t.output, t.inputs, wanted)]
    return out + check_fleet_step(ctx, before, tr, fleet)


@attrs.frozen
class FleetInvariant:
    """A fleet invariant (SPEC.md 7.9): its id, one line, when it is claimed
    (``applies(fleet_header) -> bool``, the header's ``fleet`` object with its replica
    configurations), its history form ``check(view) -> list[Finding]`` and its state form
    ``check_state(ctx, before, transition, fleet)`` (:func:`check_fleet_step`)."""

    id: str
    summary: str
    applies: Callable[[dict[str, Any], tuple[Config, ...]], bool]
    check: Callable[[FleetView], list[Finding]]
    source: str = ""
    check_state: Callable[..., list[Finding]] | None = None


def _vtc_gap_why_not(fleet: dict[str, Any], configs: tuple[Config, ...]) -> str | None:
    """Why FLEET-VTC-GAP is not claimed on this fleet (SPEC.md 7.9), or None when it is.

    Ample KV is needed on every replica: one replica whose pool refuses a head breaks the
    spread (the proof's limit ``pool-refused``, SPEC.md 8.15); the skip budget has no fleet form."""
    if fleet.get("accounting") != "fleet":
        return f"per-replica accounting (accounting={fleet.get('accounting')!r}); it needs fleet accounting"
    if not fleet.get("lift"):
        return "the fleet lift is off (lift=false)"
    for r, c in enumerate(configs):
        if c.order.policy != "vtc":
            return f"replica {r} runs order policy {c.order.policy!r}, not 'vtc'"
        if not ample_kv(c):
            need = c.max_num_seqs * c.blocks_for(c.max_context_tokens)
            return (f"replica {r} is not ample KV (SPEC.md 7.0: num_blocks={c.num_blocks} against max_num_seqs x "
                    f"blocks of the context = {need}, or a cap, priority preemption or strict tiers)")
    return None


def _vtc_gap_applies(fleet: dict[str, Any], configs: tuple[Config, ...]) -> bool:
    return _vtc_gap_why_not(fleet, configs) is None


#: The fleet invariants by id.
FLEET_INVARIANTS: dict[str, FleetInvariant] = {i.id: i for i in (
    FleetInvariant("FLEET-NO-LOSS", "every request is routed to exactly one replica, at its arrival, and is answered "
                   "and ends there", lambda f, c: True, h_no_loss, check_state=_state_no_loss),
    FleetInvariant("ROUTE-LOAD-BOUND", "a load-bounded router keeps each receiving replica within ceil(c (m+1) / R) "
                   "outstanding requests", lambda f, c: f.get("router") in LOAD_BOUNDED, h_load_bound,
                   "Mirrokni, Thorup and Zadimoghaddam, Consistent Hashing with Bounded Loads, SODA 2018",
                   _state_load_bound),
    FleetInvariant("FLEET-VTC-GAP", "fleet VTC counters move by the fleet's charges, and a tenant picked on a replica "
                   "stays within D_F / w of those waiting there", _vtc_gap_applies, h_fleet_vtc_gap,
                   "Sheng et al., OSDI 2024, Algorithm 2 and Theorem 4.4, over shared counters", _state_vtc_gap),
)}


def check_fleet_history(history: History, ids: Iterable[str] | None = None, *, replicas: bool = True) -> list[Finding]:
    """Judge a fleet history: each replica's part by the catalog's history forms
    (:func:`tenantry.spec.invariants.check_history`; a finding's message then begins
    with ``replica r:``) and every applicable fleet invariant.

    Args:
        ids: restrict to these ids (fleet or per-replica).
        replicas: also judge each replica's part (default True).

    Raises:
        ConfigError: when ``history`` is not a fleet history.
    """
    from .invariants import check_history

    v = _read(history)
    want = None if ids is None else set(ids)
    out: list[Finding] = []
    if replicas:
        per = None if want is None else [i for i in want if i not in FLEET_INVARIANTS]
        if per is None or per:
            for r, part in enumerate(fleet_parts(history)):
                out += [attrs.evolve(x, message=f"replica {r}: {x.message}") for x in check_history(part, None, per)]
    for inv in FLEET_INVARIANTS.values():
        if (want is None or inv.id in want) and inv.applies(v.fleet, v.configs):
            try:
                out += inv.check(v)
            except Exception as e:  # one check that raises must not end the run: a finding
                out.append(check_raised(inv.id, e))
    return out


def fleet_coverage(history: History) -> dict[str, str]:
    """For every fleet invariant, ``checked`` or why not (what a report prints)."""
    v = _read(history)
    why = {"ROUTE-LOAD-BOUND": lambda: f"skipped: the router {v.fleet.get('router')!r} is not load-bounded "
                                       f"(load-bounded: {', '.join(sorted(LOAD_BOUNDED))})",
           "FLEET-VTC-GAP": lambda: f"skipped: {_vtc_gap_why_not(v.fleet, v.configs)}"}
    return {i.id: "checked" if i.applies(v.fleet, v.configs) else why.get(i.id, lambda: "skipped: not applicable")()
            for i in FLEET_INVARIANTS.values()}
