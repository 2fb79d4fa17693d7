"""Step mode: drive a scheduler under test through its adapter and record every step.

The :class:`Harness` is a replica of the one driver loop
(:func:`tenantry.runner.simulate.drive`): it owns the clock (the cost model of
the claimed config), the workload's secrets (output lengths) and token
production; the scheduler only decides.  Each step it delivers arrivals and
cancellations, asks for a plan, executes what can be executed, hands back the
results, and records the step in the model's history format (events, batch,
KV blocks per request), exactly as the model's own driver records a model
step.  The invariant catalog then judges that history like any other
(:mod:`tenantry.spec.invariants`): the harness checks no invariant itself.

The harness's own findings are the protocol's (:data:`~tenantry.verify.protocol.PROTOCOL`):
a call that raised, hung or tried to end the process, claims that are not
valid or change during the run, a plan that is not a plan, a scheduler that
changes what it was given, a scheduler that stalls, and (when it claims the
reference policy) the first step where it decides differently from the model.

The harness owns the truth: the scheduler is handed copies of the requests and
results (:func:`~tenantry.verify.calls.given`), which it cannot write into,
every plan and answer is turned into the harness's own canonical values
(:func:`~tenantry.verify.protocol.normalise_plan`) before it is used, and the
claims are copied when the run starts.  An attempt to write a request or the
results is ADAPTER-MUTATED, naming the call, the field and both values.

A plan that names requests it cannot act on (unknown, ended, twice, tokens
out of range) is recorded as given and executed as far as it can be; the
catalog reports it under the invariant it breaks.  The run goes on after
every finding except the protocol's own (a call that raised, hung or ended
the process, a write into what it was given, claims that changed, a
malformed plan, a stall).

(Past 500 lines on purpose: one step of the replica, from delivery to the
record, and the protocol checks around each call read best in one place.)
"""

from __future__ import annotations

import copy
from itertools import chain
from typing import Any, Callable, Iterable

import attrs

from tenantry.model.config import Config, TenantConfig
from tenantry.model.policies import step_duration_s
from tenantry.model.state import initial_state
from tenantry.model.step import idle, step as model_step
from tenantry.model.workload import Request, StepInput, Workload
from tenantry.runner.history import History, RequestRecord, StepEvent, StepRecord
from tenantry.runner.setups import config_with_tenants
from tenantry.runner.simulate import drive
from tenantry.spec.invariants_core import Finding

from .calls import Caller, CallFailure, given
from .offline import history_header
from .protocol import Claims, Plan, PlanError, StepResults, answer, finding, normalise_plan, per_tenant, plan_key
from .target import adapter_problem

#: Seconds the factory may take (at least): building a scheduler may import a
#: large package (vLLM takes 10-20 s on a loaded 2-core machine).
FACTORY_TIMEOUT_S = 120.0

#: Groups of a step record's events, in their canonical order (SPEC.md 6):
#: cancellations, the answers to the step's arrivals (in arrival order),
#: evictions (the plan's preemptions, then its rejections of running requests),
#: other rejections, entries into the batch, tokens.
EVENT_GROUPS = ("cancelled", "answers", "preempted", "evicted", "rejected", "scheduled", "tokens")


class _Req:
    """The harness's own record of one request (mutable, harness-private)."""

    __slots__ = ("r", "salt", "status", "computed", "output_done", "held", "ids", "preemptions", "wasted",
                 "first_sched_s", "first_token_s", "admitted_step", "cached", "fresh", "reason", "retry",
                 "finish_s", "ready_step", "delivered_step")

    def __init__(self, r: Request, salt: str, k: int) -> None:
        self.r, self.salt, self.status = r, salt, "waiting"
        self.computed = self.output_done = self.held = self.preemptions = self.wasted = self.cached = 0
        self.ids: tuple = ()
        self.first_sched_s = self.first_token_s = self.finish_s = self.retry = None
        self.admitted_step: int | None = k
        self.fresh, self.reason, self.ready_step, self.delivered_step = True, None, 0, k

    @property
    def target(self) -> int:
        return self.r.prompt_tokens + self.output_done

    @property
    def live(self) -> bool:
        return self.status in ("waiting", "running")


def _fail_finding(f: CallFailure, k: int | None) -> Finding:
    inv = "ADAPTER-HANG" if f.kind == "timeout" else "ADAPTER-RAISED"
    where = f" at {f.where}" if f.where else ""
    if f.kind == "exit":  # it would have ended tenantry with no report
        return finding(inv, k, f"{f.call} {f.detail}{where}: a scheduler's call may not end the process; the run "
                       "stops here", call=f.call, observed=f.detail)
    return finding(inv, k, f"{f.call} {'hung' if f.kind == 'timeout' else 'raised'}: {f.detail}{where}",
                   call=f.call, observed=f.detail)


def _empty_config(tenants: Iterable[str]) -> Config:
    names = tuple(dict.fromkeys(tenants)) or ("_",)
    return Config(tenants=tuple(TenantConfig(n) for n in names))


class Harness:
    """Drives one adapter instance.  Build with :meth:`start`; then :meth:`step` or :meth:`run`.

    Attributes:
        config: the claimed config, extended with the workload's tenants.
        claims: the adapter's :class:`Claims`.
        findings: the protocol findings so far, in order.
        stopped: True once the run cannot go on (no further steps run).
        plans: the normalised plan keys and add_request answers, in call order
            (compared by the determinism check).
        stats: counters for reports: ``steps``, ``preemptions``,
            ``cache_hit_blocks``, ``cross_tenant_hit_blocks``.
        unusable: why the factory's product is no adapter (a usage error: the
            preflight refuses the target with this line), or None.
        mutations: attempts of the scheduler to write what it was given
            (see :func:`~tenantry.verify.calls.given`).
    """

    def __init__(self, adapter: Any, claims: Claims, config: Config, caller: Caller, *,
                 reference: bool, record_steps: bool = True) -> None:
        self.adapter, self.claims, self.config, self.caller = adapter, claims, config, caller
        self.claimed = claims.claimed()
        self.record_steps = record_steps
        self.reqs: dict[int, _Req] = {}
        self.live: dict[int, _Req] = {}  # waiting or running, in delivery order
        self.k, self.t_s = 0, 0.0
        self.findings: list[Finding] = []
        self.stopped = False
        self.steps: list[StepRecord] = []
        self.plans: list[Any] = []
        self.service = {t.name: 0.0 for t in config.tenants}
        self.block_seconds = {t.name: 0.0 for t in config.tenants}
        self.writer: dict[Any, str] = {}  # block id -> tenant that last wrote it (for the cache-hit stats)
        self.idle_steps = 0
        self.running_order: list[int] = []
        self.stats = {"steps": 0, "preemptions": 0, "cache_hit_blocks": 0, "cross_tenant_hit_blocks": 0}
        self.ref_state = initial_state(config) if reference else None
        self.diverged = False
        self.unusable: str | None = None
        self.mutations: list[tuple] = []
        self.claims_seen: Any = None  # the adapter's own claims object, as last seen equal to ``claims``

    # --- construction ---------------------------------------------------------------

    @classmethod
    def start(cls, factory: Callable[[], Any], tenants: Iterable[str] = (), *, timeout_s: float | None = 10.0,
              record_steps: bool = True) -> "Harness":
        """Build the adapter with ``factory()`` and read its claims.

        A factory or ``claims`` that raises or hangs gives a stopped harness
        holding one finding (never an exception); so does a factory whose product
        is no adapter (None, a class, an object without the protocol's methods or
        without a :class:`Claims`): an ADAPTER-CLAIMS finding, the reason in
        :attr:`unusable` (:func:`~tenantry.verify.run.preflight` refuses such a
        target before any run, as a usage error).  The harness judges the run on a
        copy of the claims taken here (a scheduler that changes its claims later
        is ADAPTER-CLAIMS).  The factory gets ``max(FACTORY_TIMEOUT_S, timeout_s)``;
        every other call ``timeout_s``.
        """
        caller = Caller(timeout_s)
        build_s = None if timeout_s is None else max(FACTORY_TIMEOUT_S, timeout_s)
        ok, adapter = caller.call("factory", factory, timeout_s=build_s)
        if ok:
            ok, got = caller.call("claims", adapter_problem, adapter)
            if not ok:
                adapter = got
        if not ok:
            h = cls(None, Claims(_empty_config(tenants)), _empty_config(tenants), caller, reference=False)
            h._stop(_fail_finding(adapter, None))
            return h
        problem, claims = got
        if problem is None:
            try:
                own = copy.deepcopy(claims)
            except Exception as e:  # noqa: BLE001 - a Claims subclass holding what cannot be copied
                problem = f"the factory's adapter has claims that cannot be copied ({type(e).__name__}: {e})"
        if problem is not None:
            h = cls(None, Claims(_empty_config(tenants)), _empty_config(tenants), caller, reference=False)
            h.unusable = problem
            h._stop(finding("ADAPTER-CLAIMS", None, problem, call="factory"))
            return h
        config = config_with_tenants(own.config, tenants)
        h = cls(adapter, own, config, caller, reference=own.reference, record_steps=record_steps)
        h.claims_seen = claims
        return h

    # --- findings -------------------------------------------------------------------

    def _stop(self, f: Finding) -> None:
        self.findings.append(f)
        self.stopped = True

    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        ok, v = self.caller.call(name, fn, *args)
        if self.mutations:  # it wrote into what it was given (its write was refused, in its own code)
            self._stop(self._mutated(name))
            return False, None
        if not ok:
            self._stop(_fail_finding(v, self.k))
            return ok, v
        mine = getattr(self.adapter, "__dict__", None)  # a rebound claims attribute (no adapter code runs)
        now = mine.get("claims", self.claims_seen) if mine is not None else self.claims_seen
        if now is not self.claims_seen and not self._same_claims(now, name, name):
            return False, None
        return ok, v

    def _mutated(self, call: str) -> Finding:
        """ADAPTER-MUTATED: the first write the scheduler attempted into what it was given."""
        obj, field, old, new, where = self.mutations[0]
        if isinstance(obj, StepResults):
            what, tenant, rid = f"the results of step {obj.step_index}", None, None
        else:
            what, rid = f"request {obj.request_id}'s", obj.request_id
            tenant = self.reqs[rid].r.tenant if rid in self.reqs else None
        more = f" (and {len(self.mutations) - 1} more writes)" if len(self.mutations) > 1 else ""
        return finding("ADAPTER-MUTATED", self.k, f"{call} changed {what} {field} from {old!r} to {new!r} at {where}"
                       f"{more}: what the harness gives a scheduler is the harness's (change a copy: attrs.evolve); "
                       "the write was refused and the run stops here", tenant=tenant, request_id=rid,
                       observed=repr(new)[:200], allowed=repr(old)[:200], call=call)

    def _same_claims(self, now: Any, call: str, during: str) -> bool:
        """True if the adapter's claims ``now`` equal those the run started with; else stop on ADAPTER-CLAIMS
        (blaming ``call``; they changed ``during`` a call, or the run)."""
        try:
            same = isinstance(now, Claims) and now == self.claims
        except Exception:  # noqa: BLE001 - a Claims subclass whose comparison raises
            same = False
        if same:
            self.claims_seen = now
            return True
        self._stop(finding("ADAPTER-CLAIMS", self.k, f"the adapter's claims changed during {during}: "
                           f"{_claims_change(self.claims, now)}; the run was judged on the claims it started "
                           "with, and stops here", call=call, observed=repr(now)[:200],
                           allowed=repr(self.claims)[:200]))
        return False

    @property
    def books_call(self) -> str:
        """The call that reports the scheduler's counters and deficits: ``accounting``
        when the adapter has that method (read after ``take_results``), else ``plan_step``."""
        return "accounting" if getattr(self.adapter, "accounting", None) is not None else "plan_step"

    # --- the replica of the driver loop ------------------------------------------------

    def has_work(self) -> bool:
        """True while some request is waiting or running."""
        return bool(self.live)

    def idle(self, until_s: float) -> None:
        """The empty replica waits until ``until_s`` (seconds)."""
        self.t_s = max(self.t_s, until_s)

    def run(self, workload: Workload | Iterable[Request], *, horizon_s: float | None = None,
            max_steps: int | None = 100_000) -> None:
        """Run a workload (cancellations included) to its end, the horizon or the
        step limit, through the one driver loop :func:`~tenantry.runner.simulate.drive`."""
        for _ in drive(self, workload, horizon_s=horizon_s, max_steps=max_steps):
            pass
        self.finish()

    def finish(self) -> None:
        """At the end of a run: ADAPTER-CLAIMS if the adapter's claims now differ from those
        the run started with (changed in place, or the attribute rebound)."""
        if self.stopped or self.adapter is None:
            return
        ok, now = self.caller.call("claims", getattr, self.adapter, "claims")
        self.k, k = max(self.k - 1, 0), self.k  # the finding is about the run up to its last step
        try:
            if not ok:
                self._stop(_fail_finding(now, self.k))
            else:
                self._same_claims(now, "claims", "the run")
        finally:
            self.k = k

    def close(self) -> None:
        """Release the worker thread."""
        self.caller.close()

    # --- one step -----------------------------------------------------------------------

    def step(self, inputs: StepInput = StepInput()) -> StepRecord | None:
        """Deliver the inputs, get the scheduler's plan, execute it, record the step.

        Returns the step record, or None if the run is stopped.
        """
        if self.stopped:
            return None
        k = self.k
        events: dict[str, list[StepEvent]] = {g: [] for g in EVENT_GROUPS}
        arrived = self._deliver(inputs, events)
        if self.stopped:
            return None
        ok, raw = self._call("plan_step", self.adapter.plan_step, self.t_s)
        if not ok:
            return None
        try:
            plan = normalise_plan(raw)
        except PlanError as e:
            self._stop(finding("PLAN-MALFORMED", k, f"plan_step returned a bad plan: {e}", call="plan_step",
                               observed=repr(e.value)[:200]))
            return None
        self.plans.append(("plan", k, plan_key(plan)))
        live, preemptions = len(self.live), self.stats["preemptions"]
        entries = self._apply(plan, arrived, events)
        if self.ref_state is not None and not self.diverged:
            self._compare_reference(inputs, plan, entries, arrived)
        rec = self._execute(plan, entries, events)
        if rec is None:
            return None
        # progress is what the plan did, not what it named: a plan of ended requests is no progress
        progress = bool(entries) or len(self.live) < live or self.stats["preemptions"] > preemptions
        self.idle_steps = 0 if progress else self.idle_steps + 1
        if self.idle_steps > self.config.eviction.cooldown_steps + 1 and self.has_work():
            head = min(self.live.values(), key=lambda q: q.r.request_id)
            self._stop(finding("STALLED", k, f"the scheduler made no progress for {self.idle_steps} steps while "
                               f"{len(self.live)} requests wait (the oldest: request {head.r.request_id}); the run stops here",
                               tenant=head.r.tenant, request_id=head.r.request_id, observed=self.idle_steps,
                               allowed=self.config.eviction.cooldown_steps + 1, call="plan_step"))
        return rec

    def _deliver(self, inputs: StepInput, events: dict[str, list[StepEvent]]) -> list[_Req]:
        """Hand cancellations, then arrivals, to the scheduler (before the step's plan)."""
        for rid in inputs.cancellations:
            q = self.reqs.get(rid)
            if q is None or not q.live:
                continue  # unknown or already ended: nothing to do (SPEC.md 5.1)
            ok, _ = self._call("abort_request", self.adapter.abort_request, rid)
            if not ok:
                return []
            self._end(q, "cancelled", self.t_s)
            events["cancelled"].append(StepEvent("cancelled", rid))
        arrived = []
        for r in inputs.arrivals:
            q = _Req(r, self.config.tenants[self.config.tenant_index(r.tenant)].salt, self.k)
            self.reqs[r.request_id] = q
            self.live[r.request_id] = q
            ok, raw = self._call("add_request", self.adapter.add_request, given(r, self.mutations))
            if not ok:
                return arrived
            try:
                reason = answer(raw)
            except PlanError as e:
                self._stop(finding("PLAN-MALFORMED", self.k, f"add_request of request {r.request_id} returned a bad "
                                   f"answer: {e}", call="add_request", tenant=r.tenant, request_id=r.request_id,
                                   observed=repr(raw)[:200]))
                return arrived
            self.plans.append(("add", r.request_id, reason))
            arrived.append(q)
            if reason is not None:
                self._reject(q, reason, None, r.arrival_s)
        return arrived

    def _end(self, q: _Req, outcome: str, t_s: float) -> None:
        self.live.pop(q.r.request_id, None)
        if q.status == "running":
            q.held, q.ids = 0, ()
        q.status, q.finish_s = outcome, t_s

    def _reject(self, q: _Req, reason: Any, retry: Any, t_s: float) -> None:
        if q.fresh and q.delivered_step == self.k and q.status == "waiting":
            q.admitted_step = None  # refused at admission: never queued
        q.reason, q.retry = reason, retry
        self._end(q, "rejected", t_s)

    def _apply(self, plan: Plan, arrived: list[_Req], events: dict[str, list[StepEvent]],
               ) -> list[tuple[_Req, int, int, bool]]:
        """Record the plan's rejections, preemptions and batch as events; apply those that can be.

        Returns (request, num_tokens, computed before, entering) for each batch
        entry that can be executed (a live request, not preempted in this
        step, given 1..remaining tokens, entering with a whole-block cache hit
        at most).
        """
        cfg, k, t, B = self.config, self.k, self.t_s, self.config.block_size_tokens
        rejected = {rj.request_id: rj for rj in plan.rejected}
        evicting = [rid for rid in plan.preempted if rid in rejected]  # evicted, then rejected (too often)
        for rj in plan.rejected:
            if rj.request_id in evicting:
                continue
            q = self.reqs.get(rj.request_id)
            was_running = q is not None and q.status == "running"
            if q is not None and q.live:
                at_admission = q.fresh and q.delivered_step == k and q.status == "waiting"
                self._reject(q, rj.reason, rj.retry_after_s, q.r.arrival_s if at_admission else t)
            if q is None or q.admitted_step is not None:
                events["evicted" if was_running else "rejected"].append(
                    StepEvent("rejected", rj.request_id, rj.reason, rj.retry_after_s))
        for q in arrived:  # the answers to this step's arrivals, in arrival order
            if q.status == "rejected" and q.admitted_step is None:
                events["answers"].append(StepEvent("rejected", q.r.request_id, q.reason, q.retry))
            else:
                events["answers"].append(StepEvent("queued", q.r.request_id))
        preempted: set[int] = set()
        for rid in plan.preempted:  # evictions in the order the scheduler made them
            q = self.reqs.get(rid)
            if rid in rejected:
                rj = rejected[rid]
                freed = 0
                if q is not None and q.status == "running":
                    others = set(chain.from_iterable(o.ids for o in self.live.values() if o is not q and o.status == "running"))
                    freed = plan.freed.get(rid, len(set(q.ids) - others) if q.ids else q.held)
                if q is not None and q.live:
                    self._reject(q, rj.reason, rj.retry_after_s, t)
                events["preempted"].append(StepEvent("rejected", rid, rj.reason, rj.retry_after_s, blocks=freed))
                continue
            freed = wasted = 0
            if q is not None and q.status == "running" and rid not in preempted:
                wasted = q.computed
                others = set(chain.from_iterable(o.ids for o in self.live.values() if o is not q and o.status == "running"))
                freed = plan.freed.get(rid, len(set(q.ids) - others) if q.ids else q.held)
                q.status, q.wasted, q.computed = "waiting", q.wasted + q.computed, 0
                q.held, q.ids = 0, ()
                q.preemptions += 1
                q.ready_step = k + 1 + cfg.eviction.cooldown_steps
                self.stats["preemptions"] += 1
            preempted.add(rid)
            events["preempted"].append(StepEvent("preempted", rid, tokens=wasted, blocks=freed))
        entries, seen = [], set()
        for e in plan.batch:
            rid = e.request_id
            q = self.reqs.get(rid)
            ok = q is not None and q.live and rid not in seen and rid not in preempted
            seen.add(rid)
            if not ok:
                continue
            entering = q.status == "waiting"
            c0 = (e.computed_tokens or 0) if entering else q.computed
            if entering:
                if c0 < 0 or c0 >= q.target or (c0 and (cfg.prefix_cache == "off" or c0 % B)):
                    c0 = 0  # recorded as declared below; executed from scratch
                events["scheduled"].append(StepEvent("scheduled", rid, tokens=e.computed_tokens or 0))
            if not 1 <= e.num_tokens <= q.target - c0:
                continue
            entries.append((q, e.num_tokens, c0, entering))
        return entries

    def _execute(self, plan: Plan, entries: list, events: dict[str, list[StepEvent]]) -> StepRecord | None:
        """Run the batch: blocks held, the cost model's duration, tokens produced; hand back the results."""
        cfg, k, t = self.config, self.k, self.t_s
        w_in, w_out = cfg.order.w_in, cfg.order.w_out
        for q, n, c0, entering in entries:
            if entering:
                q.status, q.computed = "running", c0
                q.cached += min(c0, q.r.prompt_tokens)
                if q.fresh:
                    q.fresh, q.first_sched_s = False, t
                    self.service[q.r.tenant] += w_in * q.r.prompt_tokens
        running = [q for q in self.live.values() if q.status == "running"]
        after = {q.r.request_id: q.computed + n for q, n, _, _ in entries}
        self._take_blocks(plan, running, after, entries)
        dur = step_duration_s(cfg, sum(n for _, n, _, _ in entries), sum(c0 + n for _, n, c0, _ in entries))
        end = t + dur
        per_tenant: dict[str, int] = {}
        for q in running:
            per_tenant[q.r.tenant] = per_tenant.get(q.r.tenant, 0) + q.held
        for name, b in per_tenant.items():
            self.block_seconds[name] = self.block_seconds.get(name, 0.0) + b * dur
        tokens, finished = [], []
        for q, n, c0, _ in entries:
            q.computed = c0 + n
            if q.computed == q.target:
                q.output_done += 1
                tokens.append(q.r.request_id)
                self.service[q.r.tenant] = self.service.get(q.r.tenant, 0.0) + w_out
                if q.first_token_s is None:
                    q.first_token_s = end
                    events["tokens"].append(StepEvent("first_token", q.r.request_id))
                if q.output_done == q.r.output_tokens:
                    finished.append(q)
                    events["tokens"].append(StepEvent("finished", q.r.request_id, tokens=q.output_done))
        freed_at_end = self._freed_by(finished, running)
        finishing = {q.r.request_id: q.ids for q in finished if q.ids}  # their blocks as they finished
        for q in finished:
            self._end(q, "finished", end)
        results = StepResults(k, t, dur, tuple(tokens), tuple(q.r.request_id for q in finished))
        ok, _ = self._call("take_results", self.adapter.take_results, given(results, self.mutations))
        if ok and getattr(self.adapter, "accounting", None) is not None:
            plan = self._books_after_results(plan)
            if plan is None:
                return None
        rec = self._record(plan, events, dur, freed_at_end, finishing)
        self.k, self.t_s = k + 1, end
        self.stats["steps"] += 1
        return rec if ok else None

    def _books_after_results(self, plan: Plan) -> Plan | None:
        """The plan with the counters and deficits of the adapter's ``accounting()``, read
        after ``take_results`` (None: the call failed or returned a bad value; the run stops)."""
        ok, raw = self._call("accounting", self.adapter.accounting)
        if not ok:
            return None
        try:
            counters, deficits = raw
            return attrs.evolve(plan, counters=per_tenant(counters, "accounting counters"),
                                deficits=per_tenant(deficits, "accounting deficits"))
        except (TypeError, ValueError) as e:
            self._stop(finding("PLAN-MALFORMED", self.k, f"accounting() returned bad books: {e}",
                               call="accounting", observed=repr(raw)[:200]))
            return None

    def _take_blocks(self, plan: Plan, running: list[_Req], after: dict[int, int], entries: list) -> None:
        """Take each running request's blocks from the plan (held during the step), and count cache hits."""
        cfg, B = self.config, self.config.block_size_tokens
        for q in running:
            b = plan.blocks.get(q.r.request_id, 0) if plan.blocks is not None else None
            if b is None:
                q.held, q.ids = cfg.blocks_for(after.get(q.r.request_id, q.computed)), ()
            elif isinstance(b, tuple):
                q.held, q.ids = len(b), b
            else:
                q.held, q.ids = b, ()
        for q, n, c0, entering in entries:
            if not q.ids:
                continue
            if entering and c0:
                for bid in q.ids[: c0 // B]:
                    self.stats["cache_hit_blocks"] += 1
                    w = self.writer.get(bid)
                    if w is not None and w != q.r.tenant:
                        self.stats["cross_tenant_hit_blocks"] += 1
            for bid in q.ids[c0 // B: cfg.blocks_for(c0 + n)]:
                self.writer[bid] = q.r.tenant

    def _freed_by(self, finished: list[_Req], running: list[_Req]) -> int | None:
        """Blocks that the requests finishing in this step free at its end (None when
        counts alone cannot tell: shared blocks reported without ids)."""
        if not finished:
            return 0
        if all(q.ids for q in finished):
            stay = set(chain.from_iterable(q.ids for q in running if q not in finished))
            return len(set(chain.from_iterable(q.ids for q in finished)) - stay)
        if self.config.prefix_cache == "off":
            return sum(q.held for q in finished)
        return None

    def _record(self, plan: Plan, events: dict[str, list[StepEvent]], dur: float,
                freed_at_end: int | None, finishing: dict[int, tuple] | None = None) -> StepRecord:
        """The step record, in the model's history format (SPEC.md 6): the state after the step
        (``finishing``: the block ids of the requests that finished in it, as they finished)."""
        cfg = self.config
        names = [t.name for t in cfg.tenants]
        queued = {n: 0 for n in names}
        blocks = {n: 0 for n in names}
        prev = [rid for rid in self.running_order if self.reqs[rid].status == "running"]
        new = [e.request_id for e in plan.batch if self.reqs.get(e.request_id) is not None
               and self.reqs[e.request_id].status == "running" and e.request_id not in set(prev)]
        self.running_order = list(dict.fromkeys(prev + new))
        reported = plan.blocks is not None
        held: dict[int, int] = {}
        ids: dict[int, tuple] = {}
        for rid in self.running_order:
            q = self.reqs[rid]
            blocks[q.r.tenant] = blocks.get(q.r.tenant, 0) + q.held
            held[rid] = q.held
            if q.ids:
                ids[rid] = q.ids
        for q in self.live.values():
            if q.status == "waiting":
                queued[q.r.tenant] = queued.get(q.r.tenant, 0) + 1
        used = len(set(chain.from_iterable(ids.values()))) if ids else sum(held.values())
        ids.update(finishing or {})
        if reported and plan.used_blocks is not None and not ids and freed_at_end is not None:
            used = plan.used_blocks - freed_at_end
        free = cfg.num_blocks - used
        if plan.free_blocks is not None and freed_at_end is not None:
            free = plan.free_blocks + freed_at_end  # the scheduler's own count, after the step's finishes
        rec = StepRecord(
            step_index=self.k, start_s=self.t_s, duration_s=dur,
            batch=tuple((e.request_id, e.num_tokens) for e in plan.batch),
            preempted=tuple(rid for rid in plan.preempted if rid not in {r.request_id for r in plan.rejected}),
            running=tuple(self.running_order), queued=queued, blocks_in_use=blocks, free_blocks=free,
            counters=dict(plan.counters), deficits=dict(plan.deficits), service=dict(self.service),
            block_seconds=dict(self.block_seconds), events=tuple(chain.from_iterable(events[g] for g in EVENT_GROUPS)),
            used_blocks=used if reported else None, held=held if reported else None,
            block_ids=ids if ids else None,
        )
        if self.record_steps:
            self.steps.append(rec)
        return rec

    # --- the reference model in lockstep ----------------------------------------------

    def _compare_reference(self, inputs: StepInput, plan: Plan, entries: list, arrived: list[_Req]) -> None:
        """REF-DIVERGENCE: step the model on the same inputs and compare the decisions."""
        from .reference import model_plan

        cfg, k = self.config, self.k
        st = self.ref_state
        if self.t_s > st.t_s:
            st = idle(cfg, st, self.t_s)
        after, out = model_step(cfg, st, inputs)
        self.ref_state = after
        ref = model_plan(cfg, st, out, after, blocks="none")
        ours_batch = {e.request_id: (e.num_tokens, e.computed_tokens or 0) for e in plan.batch}
        ref_batch = {e.request_id: (e.num_tokens, e.computed_tokens or 0) for e in ref.batch}
        ours_rej = {q.r.request_id: q.reason for q in arrived if q.status == "rejected"}
        ours_rej.update({r.request_id: r.reason for r in plan.rejected})
        ref_rej = {r.request_id: r.reason for r in ref.rejected}
        for what, ours, theirs in (("batch", ours_batch, ref_batch), ("preempted", set(plan.preempted),
                                   set(ref.preempted)), ("rejected", ours_rej, ref_rej)):
            if ours != theirs:
                self.diverged = True
                rid, mine, ref_v = _first_difference(ours, theirs)
                self.findings.append(finding(
                    "REF-DIVERGENCE", k, f"the {what} differs from the reference model ({cfg.order.policy}) first "
                    f"at step {k}: request {rid} is {mine} here, {ref_v} in the reference", request_id=rid,
                    tenant=self.reqs[rid].r.tenant if rid in self.reqs else None, observed=mine, allowed=ref_v,
                    call="plan_step"))
                return

    # --- the record of the whole run -----------------------------------------------------

    def history(self, unoffered: Iterable[Request] = (), header: dict[str, Any] | None = None) -> History:
        """The run as a :class:`History` (request records in id order; ``unoffered``
        requests, never delivered, are recorded as unfinished)."""
        recs = []
        for q in self.reqs.values():
            outcome = q.status if q.status in ("finished", "rejected", "cancelled") else "unfinished"
            recs.append(RequestRecord(
                request_id=q.r.request_id, tenant=q.r.tenant, arrival_s=q.r.arrival_s,
                prompt_tokens=q.r.prompt_tokens, output_tokens=q.r.output_tokens, outcome=outcome,
                reason=q.reason, retry_after_s=q.retry, admitted_step=q.admitted_step,
                first_scheduled_s=q.first_sched_s, first_token_s=q.first_token_s, finish_s=q.finish_s,
                tokens_generated=q.output_done, preemptions=q.preemptions, wasted_prefill_tokens=q.wasted,
                cached_prompt_tokens=q.cached, prefix_ids=q.r.prefix_ids))
        for r in unoffered:
            if r.request_id not in self.reqs:
                recs.append(RequestRecord(r.request_id, r.tenant, r.arrival_s, r.prompt_tokens, r.output_tokens,
                                          "unfinished", prefix_ids=r.prefix_ids))
        recs.sort(key=lambda x: x.request_id)
        hdr = history_header(self.config, len(recs), self.claims.describe, self.claimed, header)
        return History(header=hdr, steps=tuple(self.steps), requests=tuple(recs))


def _claims_change(before: Claims, now: Any) -> str:
    """What differs between the claims a run started with and ``now``, in words (the first field)."""
    if not isinstance(now, Claims):
        return f"claims is now a {type(now).__name__}, not a Claims"
    for name in ("reference", "invariants", "describe"):
        if getattr(before, name) != getattr(now, name):
            return f"claims.{name} was {getattr(before, name)!r}, now {getattr(now, name)!r}"
    for a in attrs.fields(type(before.config)):
        was, is_ = getattr(before.config, a.name), getattr(now.config, a.name, None)
        if was != is_:
            return f"claims.config.{a.name} was {str(was)[:80]}, now {str(is_)[:80]}"
    return "the claims object differs"


def _first_difference(ours: Any, theirs: Any) -> tuple[Any, Any, Any]:
    """(request id, ours, theirs) of the smallest request id where two decisions differ."""
    if isinstance(ours, set):
        rid = min(ours ^ theirs)
        return rid, "preempted" if rid in ours else "not preempted", "preempted" if rid in theirs else "not preempted"
    rid = min(set(ours) ^ set(theirs) | {r for r in set(ours) & set(theirs) if ours[r] != theirs[r]})
    return rid, ours.get(rid, "absent"), theirs.get(rid, "absent")
