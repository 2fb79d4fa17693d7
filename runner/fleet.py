"""A fleet: N replicas of the reference model behind a pure router (SPEC.md 5.3).

Each replica is the one-replica model (its own :class:`~tenantry.model.config.Config`,
pool sizes may differ) stepped by the public :func:`~tenantry.model.step.step`.
The fleet is a :class:`~tenantry.runner.simulate.Replica` for the one driver loop
(:func:`~tenantry.runner.simulate.drive`): ``drive(fleet, workload)`` delivers each
arrival to the first fleet step starting at or after it, and the fleet step routes
it, then runs every replica that has work on the one clock (lockstep).

Router policies (:data:`ROUTERS`) are small pure functions with one signature,
``route(view: RouteView) -> replica index``, like the order policies of
:mod:`tenantry.model.policies`.  Accounting is per replica (each replica its own
VTC counters) or fleet-level (one set of counters that every replica reads at the
start of each fleet step and that the fleet updates from their charges at its end).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, NamedTuple

import attrs

from tenantry.model.config import Config, ConfigError, config_to_dict
from tenantry.model.routers import (
    MAX_REPLICAS, ROUTERS, FleetConfig, RouteView, cached_blocks, load_bound, outstanding,
)
from tenantry.model.state import State
from tenantry.model.step import Step
from tenantry.model.workload import Request, StepInput, Workload, as_workload

from .history import FleetStepRecord, History
from .setups import read_toml
from .simulate import ModelReplica, Recorder, check_workload, drive

_NO_INPUT = StepInput()


class FleetTransition(NamedTuple):
    """One fleet step: the routing, the replicas' transitions (None for a replica that
    waited) and the fleet counters before (after the lift) and after."""

    record: FleetStepRecord
    replicas: tuple[Any, ...]
    counters_before: tuple[float, ...] | None
    counters_after: tuple[float, ...] | None


class Fleet:
    """The fleet as a :class:`~tenantry.runner.simulate.Replica` (SPEC.md 5.3).

    Args:
        config: the :class:`FleetConfig`.
        step_variant: a :class:`~tenantry.model.step.Step` subclass every replica runs (a mutant).

    Attributes:
        replicas: one :class:`~tenantry.runner.simulate.ModelReplica` per replica.
        counters: the fleet's VTC counters per tenant (fleet accounting).
        where: request id -> replica it was routed to.
        last: the last :class:`FleetTransition`.

    Subclasses that override :meth:`route_view`, :meth:`deliver` or :meth:`share` are the
    fleet mutants (:data:`tenantry.testing.mutants.FLEET_MUTANTS`).
    """

    stopped = False

    def __init__(self, config: FleetConfig, step_variant: type[Step] | None = None) -> None:
        self.config = config
        self.configs = config.run_configs
        self.replicas = [ModelReplica(c, variant=step_variant) for c in self.configs]
        self.tenant_index = {t.name: i for i, t in enumerate(self.configs[0].tenants)}
        self.weights = tuple(t.weight for t in self.configs[0].tenants)
        self.names = tuple(t.name for t in self.configs[0].tenants)
        self.counters = [0.0] * len(self.weights)
        self.last_left = 0.0
        self.rr_next = 0
        self.where: dict[int, int] = {}
        self.fleet_step = 0
        self.t_s = 0.0
        self.last: FleetTransition | None = None

    def has_work(self) -> bool:
        return any(r.has_work() for r in self.replicas)

    def idle(self, until_s: float) -> None:
        for r in self.replicas:
            r.idle(until_s)
        self.t_s = max(self.t_s, until_s)

    def route(self, request: Request, pending: list[int]) -> int:
        """The router's choice for one arrival (``pending``: requests routed to each
        replica earlier in this fleet step)."""
        return ROUTERS[self.config.router](self.route_view(request, pending))

    def route_view(self, request: Request, pending: list[int]) -> RouteView:
        """What the router sees for one arrival (:class:`RouteView`)."""
        cfgs, reps = self.configs, self.replicas
        loads = tuple(outstanding(rep.state) + p for rep, p in zip(reps, pending))
        view = RouteView(
            request=request, tenant=request.tenant, outstanding=loads,
            used_blocks=tuple(rep.state.kv.used_blocks for rep in reps),
            num_blocks=tuple(c.num_blocks for c in cfgs),
            cached_blocks=tuple(cached_blocks(c, rep.state, request) for c, rep in zip(cfgs, reps))
            if self.config.router == "prefix_affinity" else (0,) * len(reps),
            rr_next=self.rr_next, bound=load_bound(self.config.load_factor, sum(loads), len(reps)),
            subset=self.config.subset(request.tenant) if self.config.router == "tenant_affinity" else (),
        )
        return view

    def deliver(self, request: Request, replica: int, arrivals: list[list[Request]]) -> None:
        """Hand a routed arrival to its replica's step."""
        arrivals[replica].append(request)

    def share(self, replica: int, counters: list[float]) -> None:
        """Fleet accounting: write the fleet counters into the replica's state before its step."""
        rep = self.replicas[replica]
        if all(t.counter == c for t, c in zip(rep.state.tenants, counters)):
            return
        old = rep.state
        rep.state = attrs.evolve(old, tenants=tuple(t._replace(counter=c) for t, c in zip(old.tenants, counters)))

    def step(self, inputs: StepInput) -> FleetTransition:
        """One fleet step at the fleet clock: route the arrivals (in arrival order),
        send each cancellation to the replica of its request, apply the fleet lift,
        run every replica that has work or inputs, then advance every replica to the
        end of the longest step (SPEC.md 5.3)."""
        n = len(self.replicas)
        fleet_acc = self.config.accounting == "fleet"
        arrivals: list[list[Request]] = [[] for _ in range(n)]
        cancels: list[list[int]] = [[] for _ in range(n)]
        pending = [0] * n
        routed = []
        lift = fleet_acc and self.config.lift
        backlog: frozenset[int] = frozenset()
        if lift:
            backlog = frozenset().union(*(rep.state.backlogged() for rep in self.replicas))
        for req in inputs.arrivals:
            r = self.route(req, pending)
            routed.append((req.request_id, r))
            self.where[req.request_id] = r
            pending[r] += 1
            self.rr_next = r + 1
            self.deliver(req, r, arrivals)
        for rid in inputs.cancellations:
            r = self.where.get(rid)
            if r is not None:
                cancels[r].append(rid)
        before = None
        if fleet_acc:
            if lift and inputs.arrivals:
                self._lift(backlog, {self.tenant_index[q.tenant] for q in inputs.arrivals})
            before = tuple(self.counters)
        start = self.t_s
        trs: list[Any] = [None] * n
        services = []
        for r, rep in enumerate(self.replicas):
            if not (rep.has_work() or arrivals[r] or cancels[r]):
                continue
            if fleet_acc:
                self.share(r, self.counters)
                s0 = [t.service for t in rep.state.tenants]
            ins = StepInput(arrivals=tuple(arrivals[r]), cancellations=tuple(cancels[r])) \
                if arrivals[r] or cancels[r] else _NO_INPUT
            trs[r] = rep.step(ins)
            if fleet_acc:
                services.append([t.service - a for t, a in zip(rep.state.tenants, s0)])
        stepped = tuple(r for r in range(n) if trs[r] is not None)
        end = max(start, max(rep.t_s for rep in self.replicas))
        for rep in self.replicas:
            if rep.t_s < end:
                rep.idle(end)
        self.t_s = end
        after = None
        if fleet_acc:
            c, w = self.counters, self.weights
            for ds in services:
                for i, d in enumerate(ds):
                    if d:
                        c[i] += d / w[i]
            after = tuple(c)
            if lift and backlog:
                left = backlog.difference(*(rep.state.backlogged() for rep in self.replicas))
                if left:
                    self.last_left = max(c[i] for i in left)
        names = self.names
        rec = FleetStepRecord(
            fleet_step=self.fleet_step, start_s=start, duration_s=end - start, routed=tuple(routed), stepped=stepped,
            counters=None if after is None else dict(zip(names, after)),
        )
        self.fleet_step += 1
        self.last = FleetTransition(rec, tuple(trs), before, after)
        return self.last

    def _lift(self, backlog: set[int], arriving: set[int]) -> None:
        """The fleet's counter lift (SPEC.md 4.4 over the fleet): a tenant with nothing
        queued on any replica and an arrival in this step is lifted to the least counter
        of the tenants queued somewhere, or, with none, to the last-left counter."""
        c = self.counters
        low = min((c[j] for j in backlog), default=None)
        for i in sorted(arriving - backlog):
            c[i] = max(c[i], self.last_left if low is None else low)


def run_fleet(config: FleetConfig, workload: Workload | Iterable[Request], *, horizon_s: float | None = None,
              max_steps: int | None = None, variant: type[Fleet] | None = None,
              step_variant: type[Step] | None = None):
    """:func:`~tenantry.runner.simulate.drive` over a fleet, yielding each
    :class:`FleetTransition` and the fleet (``(transition, fleet)``).

    Args:
        variant: a :class:`Fleet` subclass to run instead (a fleet mutant).
        step_variant: a :class:`~tenantry.model.step.Step` subclass every replica runs.

    Raises:
        ConfigError: if a request names an unknown tenant (before any step).
    """
    wl = as_workload(workload)
    check_workload(config.replicas[0], wl)
    fleet = (variant or Fleet)(config, step_variant)
    for _ in drive(fleet, wl, horizon_s=horizon_s, max_steps=max_steps):
        yield fleet.last, fleet


class FleetRecorder:
    """Builds a fleet history (SPEC.md 6.2) from a fleet's transitions, as they happen: one
    :class:`~tenantry.runner.simulate.Recorder` per replica (``replica`` set on its step and
    request records) and one ``fleet_step`` record per fleet step.  What :func:`simulate_fleet`
    and the stateful machine (:mod:`tenantry.testing.stateful`) record with.

    Args:
        config: the fleet; detail: as :class:`~tenantry.runner.simulate.Recorder`'s.
    """

    def __init__(self, config: FleetConfig, detail: bool = False) -> None:
        self.config = config
        self.recs = [Recorder(c, True, detail, replica=r) for r, c in enumerate(config.run_configs)]
        self.offered: dict[int, Request] = {}
        self.steps: list[Any] = []
        self.fleet_steps: list[FleetStepRecord] = []

    def offer(self, request: Request) -> None:
        """A request of the workload (routed or not, it gets a record)."""
        self.offered[request.request_id] = request

    def observe(self, tr: FleetTransition) -> None:
        """Fold one fleet step."""
        for rid, r in tr.record.routed:
            self.recs[r].offered(self.offered[rid])
        for r, t in enumerate(tr.replicas):
            if t is not None:
                self.recs[r].observe(t.state, t.output)
                self.steps.append(self.recs[r].steps[-1])
        self.fleet_steps.append(tr.record)

    def history(self, fleet: Fleet | None, header: dict[str, Any] | None = None) -> History:
        """The fleet history so far (``fleet`` the fleet run, None when it never stepped): every
        offered request has a record, ``unfinished`` on no replica when it was never routed."""
        from .history import RequestRecord
        requests = []
        routed = fleet.where if fleet is not None else {}
        if fleet is not None:
            for r, rec in enumerate(self.recs):
                part = rec.history(fleet.replicas[r].state, {})
                requests += [attrs.evolve(q, replica=r) for q in part.requests]
        seen = {q.request_id for q in requests}
        for q in self.offered.values():  # never routed (the run stopped before its arrival)
            if q.request_id not in seen and q.request_id not in routed:
                requests.append(RequestRecord(request_id=q.request_id, tenant=q.tenant, arrival_s=q.arrival_s,
                                              prompt_tokens=q.prompt_tokens, output_tokens=q.output_tokens,
                                              outcome="unfinished", prefix_ids=q.prefix_ids))
        hdr = {"config": config_to_dict(self.config.run_configs[0]), "fleet": self.config.to_dict(),
               "requests": len(self.offered), **(header or {})}
        requests.sort(key=lambda q: q.request_id)
        return History(header=hdr, steps=tuple(self.steps), requests=tuple(requests),
                       fleet_steps=tuple(self.fleet_steps))


def simulate_fleet(config: FleetConfig, workload: Workload | Iterable[Request], *, horizon_s: float | None = None,
                   max_steps: int | None = None, header: dict[str, Any] | None = None,
                   variant: type[Fleet] | None = None, step_variant: type[Step] | None = None,
                   detail: bool = False) -> History:
    """Run ``workload`` on the fleet and return its fleet history (SPEC.md 6.2): every
    replica's step records (``replica`` set), one ``fleet_step`` record per fleet step,
    and every request record with the replica it was routed to (:class:`FleetRecorder`).
    Deterministic: the same fleet and workload give the same bytes.

    Raises:
        ConfigError: if a request names an unknown tenant.
    """
    wl = as_workload(workload)
    rec = FleetRecorder(config, detail)
    for q in wl.requests:
        rec.offer(q)
    fleet = None
    for tr, fleet in run_fleet(config, wl, horizon_s=horizon_s, max_steps=max_steps, variant=variant,
                               step_variant=step_variant):
        rec.observe(tr)
    return rec.history(fleet, {"requests": len(wl), **(header or {})})


# --- Measurements of a fleet history (``tenantry simulate --replicas``) ----------------------------------------

def prefix_hit_rate(history: History) -> float:
    """Share of the prompt tokens of the requests that were scheduled that came from a
    prefix cache (``cached_prompt_tokens`` over ``prompt_tokens``; NaN when none was)."""
    rs = [r for r in history.requests if r.first_scheduled_s is not None]
    total = sum(r.prompt_tokens for r in rs)
    return sum(r.cached_prompt_tokens for r in rs) / total if total else math.nan


def tenant_weights(history: History) -> dict[str, float]:
    """Tenant name -> weight from a history's header (a fleet's replica 0, else the
    replica's ``config``); empty when the header has no configuration (weight 1 then)."""
    fleet = history.header.get("fleet")
    cfg = fleet["replicas"][0] if isinstance(fleet, dict) and fleet.get("replicas") else history.header.get("config")
    tenants = cfg.get("tenants", ()) if isinstance(cfg, dict) else ()
    return {t["name"]: float(t.get("weight", 1.0)) for t in tenants if isinstance(t, dict) and "name" in t}


def moments(history: History) -> Iterable[tuple[float, tuple[Any, ...]]]:
    """A history as one sequence of moments, for one replica or a fleet: per moment, its
    end (seconds) and the step records that hold at its end.

    A one-replica history has a moment per step (that step's record).  A fleet history
    (SPEC.md 6.2) has a moment per fleet step: every replica's latest record (a replica
    that waited keeps its last one; one that has not stepped yet has none).  The fleet
    step's replica records are the next ``len(stepped)`` step records in order, as
    :func:`simulate_fleet` writes them.
    """
    if not history.fleet_steps:
        for s in history.steps:
            yield s.start_s + s.duration_s, (s,)
        return
    latest: dict[int, Any] = {}
    steps = iter(history.steps)
    for f in history.fleet_steps:
        for _ in f.stepped:
            s = next(steps, None)
            if s is not None:
                latest[s.replica] = s
        yield f.start_s + f.duration_s, tuple(latest[r] for r in sorted(latest))


def summed(records: Iterable[Any], field: str) -> dict[str, float]:
    """A per-tenant field (``service``, ``queued``, ``blocks_in_use``, ...) summed over step records."""
    out: dict[str, float] = {}
    for s in records:
        for t, x in getattr(s, field).items():
            out[t] = out.get(t, 0) + x
    return out


def service_timeline(history: History) -> Iterable[tuple[dict[str, float], dict[str, int]]]:
    """Per moment (:func:`moments`), (cumulative weighted service per tenant, requests queued
    per tenant) at its end, summed over the replicas of a fleet: the fleet's service as one
    replica's (SPEC.md 5.3, "Service over a fleet")."""
    for _, recs in moments(history):
        if len(recs) == 1:
            yield recs[0].service, recs[0].queued
        else:
            yield summed(recs, "service"), summed(recs, "queued")


def load_fleet_toml(path: str, replica: Config) -> FleetConfig | None:
    """The ``[fleet]`` table of a configuration file (SPEC.md 2.7) over the file's
    replica, or None when there is none.

    Keys: ``replicas`` (count, default 1), ``router``, ``accounting``,
    ``load_factor``, ``affinity_replicas``, ``tenant_replicas`` (a table: tenant name
    -> list of replica numbers), ``num_blocks`` (a list, one KV pool size per
    replica; default the replica's).

    Raises:
        ConfigError: naming the file, ``[fleet]``, the key and the value.
    """
    where = f"{path}: [fleet]"
    doc = read_toml(path)
    table = doc.get("fleet")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("fleet", table, "must be a table", str(path))
    known = ("replicas", "router", "accounting", "load_factor", "affinity_replicas", "tenant_replicas", "num_blocks")
    for key in table:
        if key not in known:
            raise ConfigError(key, table[key], f"unknown key; expected one of {', '.join(sorted(known))}", where)
    n = table.get("replicas", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REPLICAS:
        raise ConfigError("replicas", n, f"must be an integer from 1 to {MAX_REPLICAS}", where)
    pools = table.get("num_blocks", [replica.num_blocks] * n)
    if not isinstance(pools, list) or len(pools) != n:
        raise ConfigError("num_blocks", pools, f"give a list of {n} pool sizes, one per replica", where)
    try:
        reps = tuple(attrs.evolve(replica, num_blocks=b) for b in pools)
        kw = {k: table[k] for k in ("router", "accounting", "load_factor", "affinity_replicas", "tenant_replicas")
              if k in table}
        if "tenant_replicas" in kw and not isinstance(kw["tenant_replicas"], dict):
            raise ConfigError("tenant_replicas", kw["tenant_replicas"], "must be a table: tenant = [replicas]")
        return FleetConfig(reps, **kw)
    except ConfigError as e:
        raise ConfigError(e.field, e.value, e.why, where) from None
    except TypeError as e:
        raise ConfigError("fleet", table, str(e), where) from None
