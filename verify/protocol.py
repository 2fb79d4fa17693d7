"""The adapter protocol: how tenantry drives a scheduler it did not write.

A scheduler under test is wrapped in an object with four methods and one
attribute (:class:`SchedulerAdapter`).  The harness
(:mod:`tenantry.verify.harness`) owns time, token production and the
workload; the scheduler only decides.  One step, in order:

1. ``add_request(request)`` for each arrival whose ``arrival_s`` is at or
   before the step's start, and ``abort_request(request_id)`` for each
   cancellation (the client gave up);
2. ``plan_step(t_s) -> Plan``: the scheduler says which requests run in this
   step and with how many tokens, which it preempted, which it rejected, and
   (optionally) the KV blocks each running request holds;
3. the harness checks the plan, runs the cost model, and works out which
   requests produced a token and which finished;
4. ``take_results(StepResults)`` hands those results back to the scheduler.

The adapter declares what the scheduler claims in ``claims`` (:class:`Claims`):
its limits and tenants as a :class:`~tenantry.model.config.Config`, and which
claim-level invariants it asserts.  Safety invariants are always checked; the
others only when claimed.  Protocol (Porcupine's model record: a few functions,
one place) and vocabulary: SPEC.md section 9, "Checking a scheduler someone else wrote".

A plan entry may be written as a plain tuple, ``(request_id, num_tokens)`` or
``(request_id, num_tokens, computed_tokens)``; :func:`normalise_plan` turns
every accepted spelling into the frozen records below, or raises
:class:`PlanError` naming the field and the value.
"""

from __future__ import annotations

import importlib
from typing import Any, Hashable, Mapping, Protocol, runtime_checkable

import attrs

from tenantry.model.config import Config, ConfigError, TenantConfig
from tenantry.model.history import REJECT_REASONS
from tenantry.model.setups import config_with_tenants
from tenantry.model.workload import Request
from tenantry.spec.invariants import CLAIMABLE as _CLAIMABLE
from tenantry.spec.invariants_core import Finding

#: Claim-level invariant ids an adapter may assert in ``Claims.invariants``
#: beyond those implied by its config (see :meth:`Claims.claimed`): the
#: catalog's claims (:data:`tenantry.spec.invariants.CLAIMABLE`).
CLAIMABLE = _CLAIMABLE

#: The harness's own finding ids: the scheduler broke the adapter protocol, not
#: an invariant.  Everything a plan decides is recorded as given and judged by
#: the invariant catalog: a request twice in the batch, or preempted and batched
#: in one step, is BATCH-LIMITS; an unknown or already ended request in a plan is
#: NO-LOSS; more blocks than the pool is KV-CAP; a refusal's reason is
#: REFUSAL-TRUTH.
PROTOCOL = {
    "ADAPTER-RAISED": "a call into the scheduler raised an exception",
    "ADAPTER-HANG": "a call into the scheduler did not return within the per-call timeout",
    "ADAPTER-CLAIMS": "the adapter has no valid `claims` (a tenantry.verify.protocol.Claims)",
    "PLAN-MALFORMED": "plan_step returned something that is not a Plan of the right shape",
    "STALLED": "the scheduler made no decision for longer than its cooldown while requests waited",
    "DETERMINISM": "two runs on the same inputs made different decisions",
    "REF-DIVERGENCE": "the scheduler claims a reference policy but decided differently from the reference model",
}


def finding(invariant: str, step: int | None, message: str, *, tenant: str | None = None,
            request_id: int | None = None, observed: Any = None, allowed: Any = None,
            call: str | None = None) -> Finding:
    """A :class:`~tenantry.spec.invariants_core.Finding` about one tenant and one request (the harness's usual case)."""
    return Finding(invariant, step, () if tenant is None else (tenant,), () if request_id is None else (request_id,),
                   observed, allowed, message, call)


@attrs.frozen
class Claims:
    """What a scheduler under test says about itself.

    Attributes:
        config: the replica as the scheduler runs it: KV pool
            (``num_blocks``, ``block_size_tokens``), batch limits
            (``max_num_seqs``, ``token_budget``), the tenants it knows (weights,
            tiers, queue bounds, KV caps; tenants a workload names beyond these
            get :class:`TenantConfig` defaults), the eviction bound
            (``eviction.max_evictions``), the prefix-cache mode and the cost
            model the harness uses for step times.
        reference: the scheduler claims to decide exactly as the reference
            model under ``config`` (e.g. "VTC with w_in=1, w_out=2" is
            ``order=OrderConfig("vtc", w_in=1, w_out=2)`` plus
            ``reference=True``); the harness runs the model in lockstep and
            reports the first step where the decisions differ.
        invariants: further claim-level ids from :data:`CLAIMABLE`.
        describe: one line for reports, e.g. ``"vLLM 0.33 fcfs"``.

    Raises:
        ConfigError: on a non-Config ``config`` or an unknown invariant id.
    """

    config: Config
    reference: bool = False
    invariants: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    describe: str = ""

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.config, Config):
            raise ConfigError("claims.config", type(self.config).__name__, "must be a tenantry.model.config.Config")
        for inv in self.invariants:
            if inv not in CLAIMABLE:
                raise ConfigError("claims.invariants", inv, f"unknown claim; choose from {', '.join(CLAIMABLE)}")

    def claimed(self) -> frozenset[str]:
        """Every claim-level id in force: the explicit ones plus those the config implies.

        ``eviction.max_evictions`` implies EVICT-BOUNDED, a positive
        ``cooldown_steps`` EVICT-COOLDOWN, ``prefix_cache="salted"``
        SALT-ISOLATION.
        """
        c = self.config
        out = set(self.invariants)
        if c.eviction.max_evictions is not None:
            out.add("EVICT-BOUNDED")
        if c.eviction.cooldown_steps > 0:
            out.add("EVICT-COOLDOWN")
        if c.prefix_cache == "salted":
            out.add("SALT-ISOLATION")
        return frozenset(out)


@attrs.frozen
class Scheduled:
    """One batch entry: request ``request_id`` computes ``num_tokens`` tokens in this step.

    ``computed_tokens`` is the number of tokens whose KV the request already
    has before the step (prefix-cache hits for a request entering the batch);
    None means "as the harness tracks it" (0 for a request entering the batch).
    """

    request_id: int
    num_tokens: int
    computed_tokens: int | None = None


@attrs.frozen
class Rejection:
    """An admitted or arriving request the scheduler refused (a 429), with its reason
    (one of :data:`~tenantry.model.history.REJECT_REASONS`) and retry-after estimate (s)."""

    request_id: int
    reason: str | None
    retry_after_s: float | None = None


@attrs.frozen
class Plan:
    """The scheduler's decisions for one step.

    Attributes:
        batch: requests computed in the step, in batch order.
        preempted: running requests evicted in the step (recompute), in the order
            the scheduler evicted them; never in ``batch``.  A victim it rejects
            instead (evicted too often) may stand here too, at its place in that
            order, when it is also in ``rejected``.
        rejected: requests refused in the step (at admission or later).
        blocks: KV blocks each running request holds during the step (after
            this step's allocation), as a count or as a tuple of block ids
            (hashable; equal ids in two requests mean one shared block).  None:
            the scheduler does not report KV, and the KV checks are skipped.
        used_blocks: distinct blocks in use (needed only when counts are
            reported and blocks are shared); None: derived from ``blocks``.
        free_blocks: free blocks as the scheduler sees them, if it says.
        counters, deficits: per tenant name, the scheduler's own VTC counters
            / DRR deficits, if it has them (recorded in the history).
        freed: per preempted request, the KV blocks its eviction freed, if the
            scheduler knows (else the harness counts the blocks it held at
            the end of the previous step, which misses blocks allocated to it
            earlier in the same step).
    """

    batch: tuple[Scheduled, ...] = ()
    preempted: tuple[int, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    blocks: Mapping[int, int | tuple[Hashable, ...]] | None = None
    used_blocks: int | None = None
    free_blocks: int | None = None
    counters: Mapping[str, float] = attrs.field(factory=dict)
    deficits: Mapping[str, float] = attrs.field(factory=dict)
    freed: Mapping[int, int] = attrs.field(factory=dict)


@attrs.frozen
class StepResults:
    """What one step produced, as the harness computed it from the plan.

    Attributes:
        step_index: the step; start_s, duration_s: seconds (cost model).
        tokens: request ids that produced one output token, batch order.
        finished: request ids that produced their last token (a subset of ``tokens``).
    """

    step_index: int
    start_s: float
    duration_s: float
    tokens: tuple[int, ...]
    finished: tuple[int, ...]


@runtime_checkable
class SchedulerAdapter(Protocol):
    """A scheduler under test (see the module docstring for one step's calls).

    ``add_request`` may return a rejection reason (a string from
    :data:`~tenantry.model.history.REJECT_REASONS`) to refuse at once, or
    None (queued; it may still be rejected later in ``Plan.rejected``).  The
    request's ``output_tokens`` is the harness's secret: a scheduler must not
    read it (it learns of the end through ``StepResults.finished``).

    Optional: ``accounting() -> (counters, deficits)`` (per tenant name, as in
    :class:`Plan`).  When the adapter defines it, the harness calls it after
    ``take_results`` and records those values for the step instead of the plan's:
    a scheduler that charges output as results come back, or resets an idle
    tenant's deficit when its last request finishes, can only report its books
    after the step's results (SPEC.md 9).
    """

    claims: Claims

    def add_request(self, request: Request) -> str | None: ...

    def abort_request(self, request_id: int) -> None: ...

    def plan_step(self, t_s: float) -> Plan: ...

    def take_results(self, results: StepResults) -> None: ...


class PlanError(ValueError):
    """A plan is not a plan: wrong type or shape.  ``field`` and ``value`` name the part."""

    def __init__(self, field: str, value: Any, why: str) -> None:
        self.field, self.value, self.why = field, value, why
        super().__init__(f"{field}={value!r}: {why}")


def _int(v: Any, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise PlanError(field, v, "must be an integer")
    return v


def _seq(v: Any, field: str) -> tuple:
    """A plan's list field as a tuple (None: empty)."""
    if v is None:
        return ()
    if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__iter__"):
        raise PlanError(field, v, "must be a tuple or list")
    return tuple(v)


def per_tenant(v: Any, field: str) -> dict[str, float]:
    """A plan's per-tenant numbers (counters, deficits) as a dict (None: empty)."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise PlanError(field, v, "must be a mapping tenant name -> number")
    out = {}
    for k, x in v.items():
        if not isinstance(k, str):
            raise PlanError(f"{field} key", k, "must be a tenant name (str)")
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
            raise PlanError(f"{field}[{k!r}]", x, "must be a finite number")
        out[k] = x
    return out


def _scheduled(e: Any, i: int) -> Scheduled:
    if isinstance(e, Scheduled):
        parts = (e.request_id, e.num_tokens, e.computed_tokens)
    elif isinstance(e, (tuple, list)) and len(e) in (2, 3):
        parts = (e[0], e[1], e[2] if len(e) == 3 else None)
    else:
        raise PlanError(f"batch[{i}]", e, "must be Scheduled or (request_id, num_tokens[, computed_tokens])")
    rid, n = _int(parts[0], f"batch[{i}].request_id"), _int(parts[1], f"batch[{i}].num_tokens")
    c = None if parts[2] is None else _int(parts[2], f"batch[{i}].computed_tokens")
    return Scheduled(rid, n, c)


def _rejection(e: Any, i: int) -> Rejection:
    if isinstance(e, Rejection):
        parts = (e.request_id, e.reason, e.retry_after_s)
    elif isinstance(e, (tuple, list)) and len(e) in (2, 3):
        parts = (e[0], e[1], e[2] if len(e) == 3 else None)
    else:
        raise PlanError(f"rejected[{i}]", e, "must be Rejection or (request_id, reason[, retry_after_s])")
    if parts[1] is not None and not isinstance(parts[1], str):
        raise PlanError(f"rejected[{i}].reason", parts[1], "must be a string or None")
    return Rejection(_int(parts[0], f"rejected[{i}].request_id"), parts[1], parts[2])


def normalise_plan(plan: Any) -> Plan:
    """The plan in canonical form: tuples of records, ints checked, block tuples.

    Raises:
        PlanError: if ``plan`` is not a :class:`Plan` or a part has the wrong shape.
    """
    if not isinstance(plan, Plan):
        raise PlanError("plan", type(plan).__name__, "plan_step must return a tenantry.verify.protocol.Plan")
    batch = tuple(_scheduled(e, i) for i, e in enumerate(_seq(plan.batch, "batch")))
    preempted = tuple(_int(r, f"preempted[{i}]") for i, r in enumerate(_seq(plan.preempted, "preempted")))
    rejected = tuple(_rejection(e, i) for i, e in enumerate(_seq(plan.rejected, "rejected")))
    blocks = None
    if plan.blocks is not None:
        if not isinstance(plan.blocks, Mapping):
            raise PlanError("blocks", type(plan.blocks).__name__, "must be a mapping request_id -> count or block ids")
        blocks = {}
        for rid, b in plan.blocks.items():
            _int(rid, "blocks key")
            if isinstance(b, (tuple, list)):
                blocks[rid] = tuple(b)
            else:
                if _int(b, f"blocks[{rid}]") < 0:
                    raise PlanError(f"blocks[{rid}]", b, "must be >= 0")
                blocks[rid] = b
    for name in ("used_blocks", "free_blocks"):
        v = getattr(plan, name)
        if v is not None:
            _int(v, name)
    if plan.freed is not None and not isinstance(plan.freed, Mapping):
        raise PlanError("freed", plan.freed, "must be a mapping request_id -> blocks")
    freed = {_int(r, "freed key"): _int(n, f"freed[{r}]") for r, n in dict(plan.freed or {}).items()}
    return Plan(batch=batch, preempted=preempted, rejected=rejected, blocks=blocks,
                used_blocks=plan.used_blocks, free_blocks=plan.free_blocks,
                counters=per_tenant(plan.counters, "counters"), deficits=per_tenant(plan.deficits, "deficits"),
                freed=freed)


def plan_key(plan: Plan) -> tuple:
    """A hashable, comparable form of a normalised plan (for the determinism check)."""
    blocks = None if plan.blocks is None else tuple(sorted((k, v) for k, v in plan.blocks.items()))
    return (plan.batch, plan.preempted, plan.rejected, blocks, plan.used_blocks, plan.free_blocks,
            tuple(sorted(plan.counters.items())), tuple(sorted(plan.deficits.items())), tuple(sorted(plan.freed.items())))


def load_factory(spec: str, path: str | None = None) -> Any:
    """Import ``module:attribute`` (attribute may be dotted) and return it.

    The module is looked up, before ``sys.path``, in ``path`` (default: the
    current folder), as ``python -m pytest`` does: ``tenantry verify --target
    mypkg.sched:make`` works from the folder holding ``mypkg`` without
    ``PYTHONPATH=.``.

    Raises:
        ConfigError: naming the spec if it lacks a colon, the module does not
            import, or the attribute is missing or not callable; naming ``path``
            when it is not a folder.
    """
    import os
    import sys

    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError("target", spec, "must be module:factory, e.g. mypkg.sched:make_scheduler")
    folder = os.path.abspath(path if path is not None else os.getcwd())
    if not os.path.isdir(folder):
        raise ConfigError("--target-path", path, "is not a folder")
    if folder not in (os.path.abspath(p or os.getcwd()) for p in sys.path):
        sys.path.insert(0, folder)
    mod_name, attr = spec.split(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError("target", spec, f"cannot import {mod_name} ({e})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError("target", spec, f"{mod_name} has no attribute {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError("target", spec, "is not callable; name a factory that returns an adapter")
    return obj


__all__ = [
    "CLAIMABLE", "Claims", "Scheduled", "Rejection", "Plan", "StepResults", "SchedulerAdapter",
    "PlanError", "normalise_plan", "plan_key", "config_with_tenants", "load_factory", "REJECT_REASONS",
]
