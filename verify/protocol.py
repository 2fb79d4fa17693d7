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
``(request_id, num_tokens, computed_tokens)``, with Python or NumPy integers,
lists or arrays; :func:`normalise_plan` turns every accepted spelling (SPEC.md
9, "What a plan may hold") into the frozen records below with plain values,
or raises :class:`PlanError` naming the field and the value.  The factory's
product is checked by :func:`adapter_problem`; :func:`load_factory` imports it.

(Past 500 lines on purpose: the records, the one normaliser of every spelling
they accept and the loading of a target are one contract, SPEC.md 9, read and
changed together.)
"""

from __future__ import annotations

import math
import numbers
from collections import abc
from typing import Any, Hashable, Mapping, Protocol, runtime_checkable

import attrs

from tenantry.model.config import Config, ConfigError, TenantConfig  # noqa: F401 - adapters import it from here
from tenantry.model.events import REJECT_REASONS
from tenantry.runner.setups import config_with_tenants
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
    "ADAPTER-RAISED": "a call into the scheduler raised an exception, or called os._exit, os.abort or sys.exit",
    "ADAPTER-HANG": "a call into the scheduler did not return within the per-call timeout",
    "ADAPTER-CLAIMS": "the adapter's `claims` changed during the run (or, without the preflight, the factory "
                      "built no adapter with valid claims)",
    "ADAPTER-MUTATED": "the scheduler wrote into a request or step results the harness gave it",
    "PLAN-MALFORMED": "plan_step (or add_request, accounting) returned something not of the protocol's types "
                      "and shape",
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


def _claims_bool(v: Any, field: str) -> bool:
    """A claim's flag as a plain bool: a bool or a NumPy bool (what reports and headers record)."""
    if isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool", "bool_")):
        return bool(v)
    raise ConfigError(field, v, "must be True or False")


def _claims_str(v: Any, field: str) -> str:
    """A claim's text as a plain str (a str subclass, e.g. NumPy's, is converted)."""
    if isinstance(v, str):
        return str.__str__(v)
    raise ConfigError(field, v, "must be a string (one line for reports)")


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
        ConfigError: on a non-Config ``config``, an unknown invariant id, a
            ``reference`` that is not a bool (Python's or NumPy's) or a
            ``describe`` that is not a string.
    """

    config: Config
    reference: bool = attrs.field(default=False, converter=lambda v: _claims_bool(v, "claims.reference"))
    invariants: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    describe: str = attrs.field(default="", converter=lambda v: _claims_str(v, "claims.describe"))

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
    (one of :data:`~tenantry.model.events.REJECT_REASONS`) and retry-after estimate (s)."""

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
            (each an int, a str, or a tuple of them such as ``("kv", salt,
            key)``; equal ids in two requests mean one shared block).  None:
            the scheduler does not report KV, and the KV checks are skipped.

    Every field may use the spellings listed in SPEC.md 9 ("What a plan may
    hold"): lists or NumPy arrays for tuples, NumPy integers for ints, ...;
    :func:`normalise_plan` turns them into one canonical form.
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
    :data:`~tenantry.model.events.REJECT_REASONS`) to refuse at once, or
    None (queued; it may still be rejected later in ``Plan.rejected``).  The
    request's ``output_tokens`` is the harness's secret: a scheduler must not
    read it (it learns of the end through ``StepResults.finished``).

    The request and the results are the harness's: the scheduler gets copies
    it may keep and read but not write (a write, even ``object.__setattr__``,
    raises in its code and is ADAPTER-MUTATED; to change one, change a copy
    made with ``attrs.evolve``).

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


# --- the spellings a plan may use (SPEC.md 9): each is turned into one canonical value here, at the
# boundary, so that what the harness records, compares for DETERMINISM and writes into a history is
# the same in every process and reads back as written; anything else is a PlanError naming the field.
# Integers: int (or a subclass, e.g. an IntEnum) or a NumPy integer scalar, as a plain int; a bool,
# NumPy bool or float of any kind is refused.  Sequences (batch, preempted, rejected, a request's
# block ids): tuple, list, range, a 1-D NumPy array or another iterable in order (a generator is
# read once); a set or a mapping is refused (it has no order).  Strings (reasons, tenant names,
# block ids): str or a subclass (NumPy's str_), as a plain str.  Numbers (counters, deficits,
# retry-after seconds): int, float or a NumPy number, finite.

_ORDERLESS = (set, frozenset, abc.Mapping, str, bytes, bytearray)


def _is_bool(v: Any) -> bool:
    """A Python or NumPy bool (NumPy's is no ``numbers.Integral``, and is named ``bool`` in NumPy 2)."""
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool", "bool_"))


def _kind(v: Any) -> str:
    return "a bool" if _is_bool(v) else "a float" if isinstance(v, numbers.Real) else f"a {type(v).__name__}"


def _int(v: Any, field: str, low: int | None = 0) -> int:
    """``v`` as a plain int (>= ``low`` unless None); NumPy integers are converted."""
    if type(v) is not int:
        if _is_bool(v) or not isinstance(v, numbers.Integral):
            raise PlanError(field, v, f"must be an integer, not {_kind(v)}")
        v = int(v)
    if low is not None and v < low:
        raise PlanError(field, v, f"must be an integer >= {low}")
    return v


def _number(v: Any, field: str, low: float | None = None, what: str = "a finite number") -> int | float:
    """``v`` as a plain int or float, finite (and >= ``low`` unless None); NumPy numbers are converted."""
    t = type(v)
    if t is not float and t is not int:
        if _is_bool(v) or not isinstance(v, numbers.Real):
            raise PlanError(field, v, f"must be {what}")
        v = int(v) if isinstance(v, numbers.Integral) else float(v)
    if not math.isfinite(v) or (low is not None and v < low):
        raise PlanError(field, v, f"must be {what}")
    return v


def _str(v: Any, field: str, what: str) -> str:
    if type(v) is str:
        return v
    if isinstance(v, str):
        return str.__str__(v)
    raise PlanError(field, v, f"must be {what}")


def _seq(v: Any, field: str) -> tuple:
    """A plan's list field as a tuple (None: empty); see the spellings above."""
    if v is None:
        return ()
    t = type(v)
    if t is tuple:
        return v
    if t is list:
        return tuple(v)
    if isinstance(v, _ORDERLESS) or not hasattr(v, "__iter__") or getattr(v, "ndim", 1) == 0:
        why = "must be a tuple or list (a set has no order)" if isinstance(v, (set, frozenset)) else \
            "must be a tuple or list"
        raise PlanError(field, v, why)
    return tuple(v)


#: Block ids of the exact types JSON carries as they are (the fast path of :func:`_block_ids`).
_PLAIN_IDS = frozenset((int, str))


def _block_id(v: Any, field: str, part: bool = False) -> Any:
    """One block id in canonical form: an int, a str, or a tuple of block ids (or None) such as
    ``("kv", salt, key)``; a list inside is read as a tuple, NumPy integers and strings as plain ones."""
    t = type(v)
    if t is int or t is str or (part and v is None):
        return v
    if isinstance(v, (tuple, list)):
        return tuple(_block_id(x, field, part=True) for x in v)
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, numbers.Integral) and not _is_bool(v):
        return int(v)
    raise PlanError(field, v, f"a block id must be an integer, a string or a tuple of them, not {_kind(v)} "
                    "(SPEC.md 9)")


def _block_ids(b: Any, field: str) -> tuple:
    """A request's block ids as a tuple of canonical block ids (see :func:`_block_id`)."""
    ids = _seq(b, field)
    if set(map(type, ids)) <= _PLAIN_IDS:
        return ids
    return tuple(_block_id(x, f"{field}[{i}]") for i, x in enumerate(ids))


def per_tenant(v: Any, field: str) -> dict[str, float]:
    """A plan's per-tenant numbers (counters, deficits) as a dict (None: empty)."""
    if v is None:
        return {}
    if type(v) is not dict and not isinstance(v, abc.Mapping):
        raise PlanError(field, v, "must be a mapping tenant name -> number")
    out = {}
    for k, x in v.items():
        k = _str(k, f"{field} key", "a tenant name (str)")
        out[k] = _number(x, f"{field}[{k!r}]")
    return out


def _parts(e: Any, cls: type, names: tuple[str, ...], field: str, shape: str) -> tuple:
    """(first, second, third or None) of a batch or rejected entry written as a record or a tuple."""
    if isinstance(e, cls):
        return tuple(getattr(e, n) for n in names)
    if isinstance(e, (tuple, list)) or (getattr(e, "ndim", None) == 1 and hasattr(e, "tolist")):
        if len(e) in (2, 3):
            return (e[0], e[1], e[2] if len(e) == 3 else None)
    raise PlanError(field, e, f"must be {cls.__name__} or {shape}")


def _scheduled(e: Any, i: int) -> Scheduled:
    if type(e) is Scheduled and type(e.request_id) is int and type(e.num_tokens) is int \
            and e.request_id >= 0 and (e.computed_tokens is None or (
                type(e.computed_tokens) is int and e.computed_tokens >= 0)):
        return e  # the common case: already canonical (frozen, plain ints)
    rid, n, c = _parts(e, Scheduled, ("request_id", "num_tokens", "computed_tokens"), f"batch[{i}]",
                       "(request_id, num_tokens[, computed_tokens])")
    return Scheduled(_int(rid, f"batch[{i}].request_id"), _int(n, f"batch[{i}].num_tokens", None),
                     None if c is None else _int(c, f"batch[{i}].computed_tokens"))


def _rejection(e: Any, i: int) -> Rejection:
    rid, reason, retry = _parts(e, Rejection, ("request_id", "reason", "retry_after_s"), f"rejected[{i}]",
                                "(request_id, reason[, retry_after_s])")
    return Rejection(_int(rid, f"rejected[{i}].request_id"),
                     None if reason is None else _str(reason, f"rejected[{i}].reason", "a string or None"),
                     None if retry is None else _number(retry, f"rejected[{i}].retry_after_s", 0,
                                                       "a finite number of seconds >= 0, or None"))


def answer(v: Any) -> str | None:
    """``add_request``'s answer in canonical form: None (queued) or the refusal's reason as a plain
    str (a reason tenantry does not know is recorded as given: REFUSAL-TRUTH judges it).

    Raises:
        PlanError: on anything else, naming the value.
    """
    return None if v is None else _str(v, "add_request answer", "a rejection reason (a string) or None")


def normalise_plan(plan: Any) -> Plan:
    """The plan in canonical form: tuples of records, plain ints, block-id tuples, plain numbers
    (the spellings accepted are listed above :func:`_int`; SPEC.md 9).

    Raises:
        PlanError: if ``plan`` is not a :class:`Plan` or a part has the wrong shape or type,
            naming the field and the value.
    """
    if not isinstance(plan, Plan):
        raise PlanError("plan", type(plan).__name__, "plan_step must return a tenantry.verify.protocol.Plan")
    batch = tuple(_scheduled(e, i) for i, e in enumerate(_seq(plan.batch, "batch")))
    preempted = tuple(_int(r, f"preempted[{i}]") for i, r in enumerate(_seq(plan.preempted, "preempted")))
    rejected = tuple(_rejection(e, i) for i, e in enumerate(_seq(plan.rejected, "rejected")))
    blocks = None
    if plan.blocks is not None:
        if type(plan.blocks) is not dict and not isinstance(plan.blocks, abc.Mapping):
            raise PlanError("blocks", type(plan.blocks).__name__, "must be a mapping request_id -> count or block ids")
        blocks = {}
        for rid, b in plan.blocks.items():
            rid = _int(rid, "blocks key")
            t = type(b)
            if t is int and b >= 0:
                blocks[rid] = b
            elif t is tuple or t is list or (not isinstance(b, numbers.Number) and hasattr(b, "__iter__")
                                             and getattr(b, "ndim", 1) != 0):
                blocks[rid] = _block_ids(b, f"blocks[{rid}]")
            else:
                blocks[rid] = _int(b, f"blocks[{rid}]")
    used, free = (None if v is None else _int(v, name, None) for name, v in (("used_blocks", plan.used_blocks),
                                                                              ("free_blocks", plan.free_blocks)))
    if plan.freed is not None and type(plan.freed) is not dict and not isinstance(plan.freed, abc.Mapping):
        raise PlanError("freed", plan.freed, "must be a mapping request_id -> blocks")
    freed = {}
    for r, n in dict(plan.freed or {}).items():
        r = _int(r, "freed key")
        freed[r] = _int(n, f"freed[{r}]")
    return Plan(batch=batch, preempted=preempted, rejected=rejected, blocks=blocks, used_blocks=used,
                free_blocks=free, counters=per_tenant(plan.counters, "counters"),
                deficits=per_tenant(plan.deficits, "deficits"), freed=freed)


def plan_key(plan: Plan) -> tuple:
    """A hashable, comparable form of a normalised plan (for the determinism check)."""
    blocks = None if plan.blocks is None else tuple(sorted((k, v) for k, v in plan.blocks.items()))
    return (plan.batch, plan.preempted, plan.rejected, blocks, plan.used_blocks, plan.free_blocks,
            tuple(sorted(plan.counters.items())), tuple(sorted(plan.deficits.items())), tuple(sorted(plan.freed.items())))


__all__ = [
    "CLAIMABLE", "Claims", "Scheduled", "Rejection", "Plan", "StepResults", "SchedulerAdapter",
    "PlanError", "normalise_plan", "plan_key", "config_with_tenants", "REJECT_REASONS", "answer",
]
