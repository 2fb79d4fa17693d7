"""Step mode: drive a scheduler under test through its adapter and check every step.

The :class:`Harness` owns the clock (the cost model of the claimed config),
the workload and token production; the scheduler only plans.  After every
plan it checks the protocol (:data:`~tenantry.verify.protocol.PROTOCOL`)
and the safety invariants it can see from the outside (KV-CAP, KV-CONSERVE,
BATCH-LIMITS, QUEUE-BOUND, NO-LOSS), plus the claimed ones (WORK-CONSERVING,
EVICT-BOUNDED, EVICT-COOLDOWN, SALT-ISOLATION); when the scheduler claims the
reference policy it runs the model in lockstep and reports the first step
whose decisions differ.  It records a :class:`~tenantry.model.history.History`
in the model's schema, so the invariant catalog's history checks apply as to
any other history.

The run stops at the first step with a protocol or safety finding (a model
checker's first counterexample); the history up to it is kept.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Callable, Iterable

import attrs

from tenantry.model.config import Config
from tenantry.model.history import REJECT_REASONS, History, RequestRecord, StepRecord
from tenantry.model.policies import step_duration_s
from tenantry.model.simulate import config_to_dict, drive
from tenantry.model.state import initial_state
from tenantry.model.workload import Request, StepInput, Workload

from .protocol import Claims, Plan, PlanError, StepResults, config_with_tenants, normalise_plan, plan_key
from .calls import Caller, CallFailure
from .harness_checks import Checks
from tenantry.spec.invariants_core import Finding

from .protocol import finding

#: Seconds the factory may take (at least): building a scheduler may import a
#: large package (vLLM takes 10-20 s on a loaded 2-core machine).
FACTORY_TIMEOUT_S = 120.0

#: Invariants whose finding stops a run (with every protocol id).
STOPPING = frozenset({"KV-CAP", "KV-CONSERVE", "BATCH-LIMITS", "QUEUE-BOUND", "NO-LOSS", "SALT-ISOLATION",
                      "EVICT-BOUNDED"})


class _Req:
    """The harness's own record of one request (mutable, harness-private)."""

    __slots__ = ("r", "salt", "status", "computed", "output_done", "blocks", "ids", "preemptions", "wasted",
                 "first_sched_s", "first_token_s", "admitted_step", "cached", "fresh", "reason", "retry",
                 "finish_s", "ready_step", "delivered_step", "qkey")

    def __init__(self, r: Request, salt: str, k: int) -> None:
        self.r, self.salt, self.status = r, salt, "waiting"
        self.computed = self.output_done = self.blocks = self.preemptions = self.wasted = self.cached = 0
        self.ids: tuple = ()
        self.first_sched_s = self.first_token_s = self.finish_s = self.retry = None
        self.admitted_step: int | None = k
        self.fresh, self.reason, self.ready_step, self.delivered_step = True, None, 0, k
        self.qkey = (1, r.request_id)  # queue order: preempted first (latest first), then by arrival

    @property
    def target(self) -> int:
        return self.r.prompt_tokens + self.output_done

    @property
    def live(self) -> bool:
        return self.status in ("waiting", "running")


def _fail_finding(f: CallFailure, k: int | None) -> Finding:
    inv = "ADAPTER-HANG" if f.kind == "timeout" else "ADAPTER-RAISED"
    where = f" at {f.where}" if f.where else ""
    return finding(inv, k, f"{f.call} {'hung' if f.kind == 'timeout' else 'raised'}: {f.detail}{where}",
                   call=f.call, observed=f.detail)


class Harness(Checks):
    """Drives one adapter instance.  Build with :meth:`start`; then :meth:`step` or :meth:`run`.

    Attributes:
        config: the claimed config, extended with the workload's tenants.
        claims: the adapter's :class:`Claims`.
        findings: every finding so far, in order.
        stopped: True once a stopping finding was made (no further steps run).
        plans: the normalised plan keys and add_request answers, in call order
            (compared by the determinism check).
        stats: counters for reports: ``steps``, ``preemptions``,
            ``cache_hit_blocks``, ``cross_tenant_hit_blocks``.
    """

    def __init__(self, adapter: Any, claims: Claims, config: Config, caller: Caller, *,
                 reference: bool, record_steps: bool = True) -> None:
        self.adapter, self.claims, self.config, self.caller = adapter, claims, config, caller
        self.claimed = claims.claimed()
        self.record_steps = record_steps
        self.reqs: dict[int, _Req] = {}
        self.live: dict[int, _Req] = {}  # waiting or running, in delivery order
        self.order: list[int] = []  # request ids in delivery order (per-tenant queue order)
        self.k, self.t_s = 0, 0.0
        self.findings: list[Finding] = []
        self.stopped = False
        self.steps: list[StepRecord] = []
        self.plans: list[Any] = []
        self.service = {t.name: 0.0 for t in config.tenants}
        self.block_seconds = {t.name: 0.0 for t in config.tenants}
        self.writer: dict[Any, str] = {}
        self.idle_steps = 0
        self.preempt_no = 0
        self.running_order: list[int] = []
        self._step_rejections: set[int] = set()
        self.used_blocks = 0
        self.stats = {"steps": 0, "preemptions": 0, "cache_hit_blocks": 0, "cross_tenant_hit_blocks": 0}
        self.ref_state = initial_state(config) if reference else None
        self.diverged = False

    # --- construction ---------------------------------------------------------------

    @classmethod
    def start(cls, factory: Callable[[], Any], tenants: Iterable[str] = (), *, timeout_s: float | None = 10.0,
              record_steps: bool = True) -> "Harness":
        """Build the adapter with ``factory()`` and read its claims.

        A factory or ``claims`` that raises, hangs or is invalid gives a
        stopped harness holding one finding (never an exception).  The factory
        gets ``max(FACTORY_TIMEOUT_S, timeout_s)``; every other call ``timeout_s``.
        """
        caller = Caller(timeout_s)
        build_s = None if timeout_s is None else max(FACTORY_TIMEOUT_S, timeout_s)
        ok, adapter = caller.call("factory", factory, timeout_s=build_s)
        if ok:
            ok, claims = caller.call("claims", getattr, adapter, "claims")
            if not ok:
                adapter = claims
        if not ok:
            h = cls(None, Claims(_empty_config(tenants)), _empty_config(tenants), caller, reference=False)
            h._stop(_fail_finding(adapter, None))
            return h
        if not isinstance(claims, Claims):
            h = cls(None, Claims(_empty_config(tenants)), _empty_config(tenants), caller, reference=False)
            h._stop(finding("ADAPTER-CLAIMS", None, f"adapter.claims is a {type(claims).__name__}, not a Claims",
                            call="claims", observed=type(claims).__name__))
            return h
        config = config_with_tenants(claims.config, tenants)
        return cls(adapter, claims, config, caller, reference=claims.reference, record_steps=record_steps)

    # --- findings -------------------------------------------------------------------

    def _find(self, f: Finding) -> None:
        self.findings.append(f)

    def _stop(self, f: Finding) -> None:
        self.findings.append(f)
        self.stopped = True

    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        ok, v = self.caller.call(name, fn, *args)
        if not ok:
            self._stop(_fail_finding(v, self.k))
        return ok, v

    # --- the environment's actions ----------------------------------------------------

    def has_work(self) -> bool:
        """True while some request is waiting or running."""
        return bool(self.live)

    def deliver(self, arrivals: Iterable[Request], cancellations: Iterable[int]) -> tuple[list, list]:
        """Hand arrivals and cancellations to the scheduler (before the step's plan)."""
        arrived, cancelled = [], []
        for rid in cancellations:
            q = self.reqs.get(rid)
            if q is None or not q.live or self.stopped:
                continue
            ok, _ = self._call("abort_request", self.adapter.abort_request, rid)
            if not ok:
                break
            self._end(q, "cancelled", self.t_s)
            cancelled.append(rid)
        for r in arrivals:
            if self.stopped:
                break
            q = _Req(r, self.config.tenants[self.config.tenant_index(r.tenant)].salt, self.k)
            self.reqs[r.request_id] = q
            self.live[r.request_id] = q
            q.qkey = (1, len(self.order))
            self.order.append(r.request_id)
            ok, answer = self._call("add_request", self.adapter.add_request, r)
            if not ok:
                break
            self.plans.append(("add", r.request_id, answer))
            arrived.append(r)
            if answer is not None:
                self._reject(q, answer, None, r.arrival_s, call="add_request")
        return arrived, cancelled

    def _end(self, q: _Req, outcome: str, t_s: float) -> None:
        self.live.pop(q.r.request_id, None)
        if q.status == "running":
            q.blocks, q.ids = 0, ()
        q.status, q.finish_s = outcome, t_s

    def _reject(self, q: _Req, reason: Any, retry: Any, t_s: float, call: str) -> None:
        if reason not in REJECT_REASONS:
            self._find(finding("NO-LOSS", self.k, f"request {q.r.request_id} was rejected with reason {reason!r}, "
                               f"not one of {', '.join(REJECT_REASONS)}", tenant=q.r.tenant,
                               request_id=q.r.request_id, observed=reason, allowed=list(REJECT_REASONS), call=call))
            reason = None
        if q.fresh and q.delivered_step == self.k:
            q.admitted_step = None
        q.reason, q.retry = reason, retry
        self._step_rejections.add(q.r.request_id)
        self._end(q, "rejected", t_s)

    # --- one step -----------------------------------------------------------------------

    def idle(self, until_s: float) -> None:
        """The empty replica waits until ``until_s`` (seconds)."""
        self.t_s = max(self.t_s, until_s)

    def step(self, inputs: StepInput = StepInput()) -> StepRecord | None:
        """Deliver the inputs, get the scheduler's plan, check it, execute it.

        Returns the step's snapshot, or None if the run is stopped (a finding
        was made that makes further steps meaningless).
        """
        if self.stopped:
            return None
        arrivals, cancellations = tuple(inputs.arrivals), tuple(inputs.cancellations)
        k, t = self.k, self.t_s
        self._step_rejections = set()
        arrived, _ = self.deliver(arrivals, cancellations)
        if self.stopped:
            return None
        ok, raw = self._call("plan_step", self.adapter.plan_step, t)
        if not ok:
            return None
        try:
            plan = normalise_plan(raw)
        except PlanError as e:
            self._stop(finding("PLAN-MALFORMED", k, f"plan_step returned a bad plan: {e}", call="plan_step",
                               observed=repr(e.value)[:200]))
            return None
        self.plans.append(("plan", k, plan_key(plan)))
        entries = self._apply(plan)
        if entries is None:
            return None
        if self.ref_state is not None and not self.diverged:
            self._compare_reference(arrivals, cancellations, plan, entries)
        rec = self._execute(plan, entries)
        if rec is None:
            return None
        progress = bool(plan.batch or plan.preempted or plan.rejected)
        self.idle_steps = 0 if progress else self.idle_steps + 1
        if self.idle_steps > self.config.eviction.cooldown_steps + 1 and self.has_work():
            head = min(self.live.values(), key=lambda q: q.r.request_id)
            self._stop(finding("NO-LOSS", k, f"the scheduler made no progress for {self.idle_steps} steps while "
                               f"{len(self.live)} requests wait; request "
                               f"{head.r.request_id} can never end", tenant=head.r.tenant,
                               request_id=head.r.request_id, observed=self.idle_steps,
                               allowed=self.config.eviction.cooldown_steps + 1, call="plan_step"))
        return rec

    def _proto(self, inv: str, msg: str, q: _Req | None = None, rid: int | None = None, **kw: Any) -> None:
        self._stop(finding(inv, self.k, msg, tenant=q.r.tenant if q else None,
                           request_id=q.r.request_id if q else rid, call="plan_step", **kw))

    def _live(self, rid: int, what: str) -> _Req | None:
        q = self.reqs.get(rid)
        if q is None:
            self._proto("NO-LOSS", f"the plan {what} request {rid}, which the scheduler was never given", rid=rid)
            return None
        if not q.live:
            self._proto("NO-LOSS", f"the plan {what} request {rid}, which already ended ({q.status})", q,
                        observed=q.status)
            return None
        return q

    def _apply(self, plan: Plan) -> list[tuple[_Req, int, int, bool]] | None:
        """Validate the plan against the harness's records and apply its rejections,
        preemptions and batch.  Returns (request, num_tokens, computed_before,
        entering) per batch entry, or None when the plan is impossible."""
        cfg, k, t = self.config, self.k, self.t_s
        seen: set[int] = set()
        for rj in plan.rejected:
            q = self._live(rj.request_id, "rejects")
            if q is None:
                return None
            if rj.request_id in seen:
                return self._proto("BATCH-LIMITS", f"the plan rejects request {rj.request_id} twice", q)
            seen.add(rj.request_id)
            admission = q.fresh and q.delivered_step == k and q.status == "waiting"
            self._reject(q, rj.reason, rj.retry_after_s, q.r.arrival_s if admission else t, call="plan_step")
        self._check_queue_bound()
        seen.clear()
        for rid in plan.preempted:
            q = self._live(rid, "preempts")
            if q is None:
                return None
            if rid in seen:
                return self._proto("BATCH-LIMITS", f"the plan preempts request {rid} twice", q)
            seen.add(rid)
            if q.status != "running":
                return self._proto("PLAN-NOT-RUNNING", f"the plan preempts request {rid}, which is waiting, not "
                                   "running (it holds no KV)", q, observed=q.status, allowed="running")
            q.status, q.wasted, q.computed = "waiting", q.wasted + q.computed, 0
            q.blocks, q.ids = 0, ()
            q.preemptions += 1
            q.ready_step = k + 1 + cfg.eviction.cooldown_steps
            self.preempt_no += 1
            q.qkey = (0, -self.preempt_no)
            self.stats["preemptions"] += 1
            kmax = cfg.eviction.max_evictions
            if "EVICT-BOUNDED" in self.claimed and kmax is not None and q.preemptions > kmax:
                self._find(finding("EVICT-BOUNDED", k, f"request {rid} was preempted {q.preemptions} times; the "
                                   f"scheduler claims at most {kmax} (then reject evicted_too_often)",
                                   tenant=q.r.tenant, request_id=rid, observed=q.preemptions, allowed=kmax,
                                   call="plan_step"))
                self.stopped = True
        entries = []
        in_batch: set[int] = set()
        for e in plan.batch:
            rid = e.request_id
            if rid in seen:
                return self._proto("BATCH-LIMITS", f"the plan preempts request {rid} and runs it in "
                                   "the same step", self.reqs.get(rid), rid=rid)
            q = self._live(rid, "schedules")
            if q is None:
                return None
            if rid in in_batch:
                return self._proto("BATCH-LIMITS", f"request {rid} is twice in the batch", q)
            in_batch.add(rid)
            entering = q.status == "waiting"
            if entering:
                c0 = e.computed_tokens or 0
                B = cfg.block_size_tokens
                if c0 and (cfg.prefix_cache == "off" or c0 % B or c0 >= q.target or c0 < 0):
                    return self._proto("PLAN-COMPUTED", f"request {rid} enters the batch with {c0} tokens already "
                                       f"computed; allowed: 0, or cache hits in whole {B}-token blocks below its "
                                       f"{q.target} tokens with the prefix cache on ({cfg.prefix_cache})", q,
                                       observed=c0, allowed=0)
                if "EVICT-COOLDOWN" in self.claimed and q.ready_step > k:
                    self._find(finding("EVICT-COOLDOWN", k, f"request {rid} re-enters the batch at step {k}, before "
                                       f"its cooldown ends (step {q.ready_step})", tenant=q.r.tenant,
                                       request_id=rid, observed=k, allowed=q.ready_step, call="plan_step"))
            else:
                c0 = q.computed
                if e.computed_tokens is not None and e.computed_tokens != c0:
                    return self._proto("PLAN-COMPUTED", f"request {rid} is running with {c0} tokens computed; the "
                                       f"plan says {e.computed_tokens}", q, observed=e.computed_tokens, allowed=c0)
            if e.num_tokens < 1 or c0 + e.num_tokens > q.target:
                return self._proto("PLAN-TOKENS", f"request {rid} is given {e.num_tokens} tokens with {c0} of "
                                   f"{q.target} computed (allowed 1..{q.target - c0})", q,
                                   observed=e.num_tokens, allowed=q.target - c0)
            entries.append((q, e.num_tokens, c0, entering))
        return entries

    def _execute(self, plan: Plan, entries: list) -> StepRecord | None:
        """Apply the batch, check KV and batch limits, run the cost model, hand back results."""
        cfg, k, t, B = self.config, self.k, self.t_s, self.config.block_size_tokens
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
        self._check_kv(plan, running, after, entries)
        if self.stopped:
            return None
        batched = sum(n for _, n, _, _ in entries)
        if batched > cfg.token_budget or len(running) > cfg.max_num_seqs:
            self._stop(finding("BATCH-LIMITS", k, f"the step batches {batched} tokens over {len(running)} running "
                               f"requests; limits: {cfg.token_budget} tokens, {cfg.max_num_seqs} sequences",
                               observed=[batched, len(running)], allowed=[cfg.token_budget, cfg.max_num_seqs],
                               call="plan_step"))
            return None
        if "WORK-CONSERVING" in self.claimed and plan.blocks is not None:
            self._check_work_conserving(running, batched)
        dur = step_duration_s(cfg, batched, sum(c0 + n for _, n, c0, _ in entries))
        end = t + dur
        per_tenant: dict[str, int] = {}
        for q in running:
            per_tenant[q.r.tenant] = per_tenant.get(q.r.tenant, 0) + q.blocks
        for name, b in per_tenant.items():
            self.block_seconds[name] += b * dur
        tokens, finished = [], []
        for q, n, c0, _ in entries:
            q.computed = c0 + n
            if q.computed == q.target:
                q.output_done += 1
                tokens.append(q.r.request_id)
                self.service[q.r.tenant] += w_out
                if q.first_token_s is None:
                    q.first_token_s = end
                if q.output_done == q.r.output_tokens:
                    finished.append(q.r.request_id)
                    self._end(q, "finished", end)
        results = StepResults(k, t, dur, tuple(tokens), tuple(finished))
        ok, _ = self._call("take_results", self.adapter.take_results, results)
        rec = self._snapshot(plan, entries, dur)
        self.k, self.t_s = k + 1, end
        self.stats["steps"] += 1
        return rec if ok else None

    # --- records --------------------------------------------------------------------------

    def _snapshot(self, plan: Plan, entries: list, dur: float) -> StepRecord:
        cfg = self.config
        names = [t.name for t in cfg.tenants]
        queued = {n: 0 for n in names}
        blocks = {n: 0 for n in names}
        counted = 0
        running = []
        order = self._running_order(entries)
        for q in order:
            running.append(q.r.request_id)
            blocks[q.r.tenant] += q.blocks
            counted += q.blocks
        ids = set(chain.from_iterable(q.ids for q in order))
        for q in self.live.values():
            if q.status == "waiting":
                queued[q.r.tenant] += 1
        used = len(ids) if ids else counted
        rec = StepRecord(
            step_index=self.k, start_s=self.t_s, duration_s=dur,
            batch=tuple((q.r.request_id, n) for q, n, _, _ in entries), preempted=tuple(plan.preempted),
            running=tuple(running), queued=queued, blocks_in_use=blocks, free_blocks=cfg.num_blocks - used,
            counters=dict(plan.counters), deficits=dict(plan.deficits), service=dict(self.service),
            block_seconds=dict(self.block_seconds),
        )
        if self.record_steps:
            self.steps.append(rec)
        return rec

    def _running_order(self, entries: list) -> list[_Req]:
        """Running requests in batch-entry order: those running before the step first."""
        prev = [self.reqs[rid] for rid in self.running_order if self.reqs[rid].status == "running"]
        seen = {q.r.request_id for q in prev}
        new = [q for q, _, _, entering in entries if entering and q.status == "running" and q.r.request_id not in seen]
        self.running_order = [q.r.request_id for q in prev + new]
        return prev + new

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
                cached_prompt_tokens=q.cached))
        for r in unoffered:
            if r.request_id not in self.reqs:
                recs.append(RequestRecord(r.request_id, r.tenant, r.arrival_s, r.prompt_tokens, r.output_tokens,
                                          "unfinished"))
        recs.sort(key=lambda x: x.request_id)
        hdr = {"config": config_to_dict(self.config), "requests": len(recs), "scheduler": self.claims.describe,
               "claims": sorted(self.claimed), **(header or {})}
        return History(header=hdr, steps=tuple(self.steps), requests=tuple(recs))

    # --- a whole workload -----------------------------------------------------------------

    def run(self, workload: Workload | Iterable[Request], *, horizon_s: float | None = None,
            max_steps: int | None = 100_000) -> None:
        """Run a workload (cancellations included) to its end, the horizon or the
        step limit, through the one driver loop :func:`~tenantry.model.simulate.drive`."""
        for _ in drive(self, workload, horizon_s=horizon_s, max_steps=max_steps):
            pass

    def close(self) -> None:
        """Release the worker thread."""
        self.caller.close()


def _empty_config(tenants: Iterable[str]) -> Config:
    from tenantry.model.config import TenantConfig

    names = tuple(dict.fromkeys(tenants)) or ("_",)
    return Config(tenants=tuple(TenantConfig(n) for n in names))
