"""The history of a run: per-request records and per-step snapshots, as JSON Lines.

A history file is UTF-8 JSON Lines.  Line 1 is a ``header`` object, then one
``step`` object per step in order, then one ``request`` object per request in
request-id order.  ``spec/history_schema.json`` is the JSON Schema of each line
kind; SPEC.md section 6 describes the fields.  The same run always serialises
to the same bytes (keys sorted, floats in ``repr`` form, no wall clock), and
files are written atomically (temporary file in the same folder, then rename),
so a killed run leaves the old file or none.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterator

import attrs

from tenantry.model.config import ConfigError, excerpt
from tenantry.model.events import EVENT_KINDS, OUTCOMES, PREEMPT_REASONS, REJECT_REASONS

from .files import atomic_write_text, json_lines

#: Version of the history format; bumped on any incompatible change.  Format 2
#: adds optional step fields (events, used_blocks, held, block_ids) and request
#: prefix ids; readers take format 1 files as well.
HISTORY_FORMAT = 2

#: Reasons of a live recording's refusal that names no model reason (``tenantry replay``,
#: SPEC.md 12.2): ``refused`` an HTTP 429 or 503 (the server shed the request), ``http_error``
#: any other status that is not 200.
LIVE_REJECT_REASONS = ("refused", "http_error")
#: Why a live recording's stream ended before its end (``failure``, outcome ``unfinished``):
#: nothing from the server within the client's timeout, the connection refused or cut, a
#: stream that does not follow the protocol, an error the server sent in the stream.
FAILURES = ("timeout", "connection", "bad_stream", "server_error")



@attrs.frozen
class StepEvent:
    """One thing that happened to one request in a step (an ``events`` entry of a step line).

    Attributes:
        kind: one of :data:`EVENT_KINDS`.
        request_id: whose.
        reason, retry_after_s: for ``rejected`` (a 429): one of
            :data:`REJECT_REASONS` (a scheduler's other string is recorded as it
            gave it, and is a REFUSAL-TRUTH finding) and the retry-after estimate
            (seconds) or None;
            for ``preempted``: None, or one of :data:`PREEMPT_REASONS`.
        tokens: ``scheduled``: tokens computed at entry (cache hits);
            ``preempted``: computed tokens discarded; ``finished``: tokens generated.
        blocks: ``preempted``: KV blocks the eviction freed.
    """

    kind: str
    request_id: int
    reason: str | None = None
    retry_after_s: float | None = None
    tokens: int = 0
    blocks: int = 0


@attrs.frozen
class RequestRecord:
    """What happened to one request (one ``request`` line).

    Times are seconds from the start of the run; ``None`` where the event did
    not happen.  Attributes:
        request_id, tenant, arrival_s, prompt_tokens, output_tokens: as offered.
        outcome: one of :data:`OUTCOMES`; reason: one of :data:`REJECT_REASONS`
            when rejected (or a scheduler's other string, as it gave it: a
            REFUSAL-TRUTH finding), else None; retry_after_s: the 429's retry-after
            estimate (seconds) or None.
        admitted_step: step at which it entered a queue (None if refused).
        first_scheduled_s: start of the step that first put it in the batch.
        first_token_s: end of the step that produced its first output token.
        finish_s: end of the step that produced its last token, or the time
            it was cancelled or rejected.
        tokens_generated: output tokens produced.
        preemptions: times it was evicted (recompute).
        wasted_prefill_tokens: tokens whose KV was discarded by evictions and
            had to be recomputed (SPEC.md 4.5).
        cached_prompt_tokens: prompt tokens served from the prefix cache.
        prefix_ids: content ids of the prompt's leading blocks, as offered (see
            :class:`~tenantry.model.workload.Request`); what salt isolation
            compares when a block is reused.
        replica: in a fleet history (SPEC.md 6.2), the replica the router sent
            it to; None in a one-replica history.

    Optional, of a live recording (``tenantry replay``, SPEC.md 12.2; absent elsewhere):
        sent_s: when the client sent it (``arrival_s`` plus the client's lag).
        answered_s: when the server's answer (its status and headers) reached the client: the
            server had the request then (None: no answer).
        token_times: when each output token reached the client, in order (one per token
            generated: the first is ``first_token_s``).
        http_status: the status of the server's answer (None: no answer).
        failure: why the stream ended early (one of :data:`FAILURES`), or None.
        detail: a refusal's body, or what went wrong (one line, at most 2,000 characters).
    """

    request_id: int
    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    outcome: str
    reason: str | None = None
    retry_after_s: float | None = None
    admitted_step: int | None = None
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    tokens_generated: int = 0
    preemptions: int = 0
    wasted_prefill_tokens: int = 0
    cached_prompt_tokens: int = 0
    prefix_ids: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    replica: int | None = None
    sent_s: float | None = None
    answered_s: float | None = None
    token_times: tuple[float, ...] = attrs.field(default=(), converter=tuple)
    http_status: int | None = None
    failure: str | None = None
    detail: str | None = None

    @property
    def ttft_s(self) -> float | None:
        """Time to first token (seconds), or None if no token was produced."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (seconds), or None."""
        if self.first_token_s is None or self.finish_s is None or self.tokens_generated < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.tokens_generated - 1)

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency of a finished request (seconds), or None."""
        return self.finish_s - self.arrival_s if self.outcome == "finished" and self.finish_s is not None else None


@attrs.frozen
class StepRecord:
    """A snapshot after one step (one ``step`` line).

    Attributes:
        step_index: 0-based step number.
        start_s, duration_s: when the step started and how long it took (seconds).
        batch: (request_id, num_tokens) scheduled in the step, in batch order;
            num_tokens is the prefill chunk or 1 for decode.
        preempted: request ids evicted during the step (never in ``batch``).
        running: request ids holding KV blocks after the step.
        queued: per tenant (by name), the number of requests waiting after the step.
        blocks_in_use: per tenant, KV blocks its running sequences reference after
            the step, summed over the sequences (a prefix block shared by k of
            them counts k times: what a per-tenant KV cap is charged).
        free_blocks: KV blocks free after the step (cached-but-unreferenced
            prefix blocks count as free).
        counters: per tenant, the VTC counter after the step (weighted tokens / weight).
        deficits: per tenant, the DRR deficit after the step.
        service: per tenant, cumulative weighted service (w_in * prefill tokens
            + w_out * output tokens), unnormalised.
        block_seconds: per tenant, cumulative KV block-seconds held.

    Optional (format 2; None or empty when the source does not record them):
        events: what happened to requests in the step, in order (:class:`StepEvent`).
        used_blocks: distinct KV blocks in use after the step (a block shared
            by several sequences counts once): with a prefix cache, the pool's
            books balance only with it (``free_blocks + used_blocks = num_blocks``).
        held: per running request, the KV blocks it references after the step.
        block_ids: per running request, and per request finishing in the step
            (its blocks as it finished, the blocks it wrote in its last step
            included), the ids of its blocks in token order, where the source
            knows them (an adapter's block ids; the model's prefix-cache keys,
            then its private blocks by request and position): what salt
            isolation follows from block to block.
        reserved: the request the step's starvation guard stopped admitting for
            (an overdue queue head that did not fit), or None.
        reserved_reason: why it stopped, when not for an overdue head: ``skips``
            (the skip budget: the head of a tenant passed over ``guard_skips``
            times, SPEC.md 4.3); None otherwise.
    """

    step_index: int
    start_s: float
    duration_s: float
    batch: tuple[tuple[int, int], ...]
    preempted: tuple[int, ...]
    running: tuple[int, ...]
    queued: dict[str, int]
    blocks_in_use: dict[str, int]
    free_blocks: int
    counters: dict[str, float]
    deficits: dict[str, float]
    service: dict[str, float]
    block_seconds: dict[str, float]
    events: tuple[StepEvent, ...] = ()
    used_blocks: int | None = None
    held: dict[int, int] | None = None
    block_ids: dict[int, tuple] | None = None
    reserved: int | None = None
    reserved_reason: str | None = None
    replica: int | None = None


@attrs.frozen
class FleetStepRecord:
    """One step of a fleet (one ``fleet_step`` line of a fleet history, SPEC.md 6.2).

    Attributes:
        fleet_step: 0-based fleet step number; start_s, duration_s: seconds (the
            duration is the longest of its replicas' steps).
        routed: (request_id, replica) for each arrival of the step, in routing order.
        stepped: the replicas that ran a step (the others waited).
        counters: the fleet's VTC counters after the step, by tenant name, under
            fleet-level accounting; None under per-replica accounting.
    """

    fleet_step: int
    start_s: float
    duration_s: float
    routed: tuple[tuple[int, int], ...]
    stepped: tuple[int, ...]
    counters: dict[str, float] | None = None


@attrs.frozen
class History:
    """A whole run: the header, every step snapshot and every request record.

    Attributes:
        header: free-form JSON object: format version, configuration, seed, ...
        steps: step snapshots in step order.
        requests: request records in request-id order.
    """

    header: dict[str, Any]
    steps: tuple[StepRecord, ...]
    requests: tuple[RequestRecord, ...]
    fleet_steps: tuple[FleetStepRecord, ...] = ()

    def by_tenant(self) -> dict[str, list[RequestRecord]]:
        """Request records grouped by tenant name (order of first appearance)."""
        out: dict[str, list[RequestRecord]] = {}
        for r in self.requests:
            out.setdefault(r.tenant, []).append(r)
        return out

    @property
    def end_s(self) -> float:
        """End of the last step (seconds; a fleet's: of its last fleet step, the longest of its
        replicas' steps); without steps, the header's ``end_s`` (a live recording's end), else 0."""
        if self.fleet_steps:
            f = self.fleet_steps[-1]
            return f.start_s + f.duration_s
        if self.steps:
            return self.steps[-1].start_s + self.steps[-1].duration_s
        end = self.header.get("end_s")
        return float(end) if _is_seconds(end) else 0.0


#: Optional fields left out of a line when they hold their default (format 2's additions).
_OPTIONAL = {
    StepRecord: ("events", "used_blocks", "held", "block_ids", "reserved", "reserved_reason", "replica"),
    RequestRecord: ("prefix_ids", "replica", "sent_s", "answered_s", "token_times", "http_status", "failure", "detail"),
    StepEvent: ("reason", "retry_after_s", "tokens", "blocks"),
}


#: Per record class, (field, optional, default) of each field; and the types written as they are.
_PLANS: dict[type, tuple[tuple[str, bool, Any], ...]] = {}
_PLAIN = frozenset({int, float, str, bool, type(None)})


#: How :func:`_step_to_json` writes each StepRecord field: ``as is`` (numbers, strings, None,
#: tuples of them or of such tuples, maps from tenant names to numbers: JSON encodes them
#: exactly as their :func:`_to_json` copy), ``keys`` (a map by request id: keys as strings,
#: values as is) or ``records`` (a tuple of records, each by :func:`_to_json`).
_STEP_KINDS = {"events": "records", "held": "keys", "block_ids": "keys"}


def _step_to_json(s: "StepRecord") -> dict[str, Any]:
    """:func:`_to_json` of a step record, without copying what JSON writes as it is (a step
    record is most of a history's text: the generic walk was two thirds of writing one)."""
    plan = _PLANS.get(StepRecord) or _to_json_plan(StepRecord)
    out = {}
    for k, optional, default in plan:
        v = getattr(s, k)
        if optional and v == default:
            continue
        kind = _STEP_KINDS.get(k)
        if kind == "records":
            v = [_to_json(e) for e in v]
        elif kind == "keys" and v is not None:
            v = {str(r): x for r, x in v.items()}
        out[k] = v
    return out


def _to_json_plan(cls: type) -> tuple[tuple[str, bool, Any], ...]:
    return _PLANS.setdefault(cls, tuple((a.name, a.name in _OPTIONAL.get(cls, ()), a.default)
                                        for a in attrs.fields(cls)))


def _to_json(obj: Any) -> Any:
    cls = type(obj)
    if cls in _PLAIN:
        return obj
    if cls is StepRecord:
        return _step_to_json(obj)
    if attrs.has(cls):  # an optional field at its default is left out
        plan = _PLANS.get(cls) or _to_json_plan(cls)
        out = {}
        for k, optional, default in plan:
            v = getattr(obj, k)
            if not (optional and v == default):
                out[k] = _to_json(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [_to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _to_json(v) for k, v in obj.items()}
    return obj


def history_lines(history: History) -> Iterator[str]:
    """Serialise a history, one JSON text per line (no newline), deterministically."""
    dump = lambda d: json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False)
    yield dump({"kind": "header", "format": HISTORY_FORMAT, **_to_json(history.header)})
    for s in history.steps:
        yield dump({"kind": "step", **_to_json(s)})
    for f in history.fleet_steps:
        yield dump({"kind": "fleet_step", **_to_json(f)})
    for r in history.requests:
        yield dump({"kind": "request", **_to_json(r)})


def write_history(history: History, path: str | os.PathLike) -> None:
    """Write ``history`` as JSON Lines to ``path`` atomically (see module docstring)."""
    atomic_write_text(path, history_lines(history))


#: What a refusal's reason must be when read: a string.  One of :data:`REJECT_REASONS` is a true or
#: false refusal; another string is read as written and REFUSAL-TRUTH reports it (a history must
#: carry what a scheduler under test said, or the catalog could not judge it).
_REASON_SHAPE = (f"must be a string, one of {', '.join(REJECT_REASONS)} (another is read as given and judged by "
                 "REFUSAL-TRUTH)")


#: A step record's ``reserved_reason``: None (an overdue head, the starvation guard) or
#: ``skips`` (the skip budget, SPEC.md 4.3).
RESERVE_REASONS = (None, "skips")


def _fields(cls: type) -> set[str]:
    return {a.name for a in attrs.fields(cls)}


def _record(cls: type, obj: dict[str, Any], where: str) -> Any:
    expected = _fields(cls)
    missing = sorted(k for k in expected if k not in obj and attrs.fields_dict(cls)[k].default is attrs.NOTHING)
    if missing:
        raise ConfigError(missing[0], None, f"missing field in a {obj.get('kind')} line", where)
    unknown = sorted(set(obj) - expected - {"kind"})
    if unknown:
        raise ConfigError(unknown[0], obj[unknown[0]], f"unknown field in a {obj.get('kind')} line", where)
    kwargs = {k: v for k, v in obj.items() if k != "kind"}
    defaults = attrs.fields_dict(cls)
    for name, (ok, what) in _SHAPES.get(cls, {}).items():
        if name in kwargs and not (kwargs[name] is None and defaults[name].default is None) and not ok(kwargs[name]):  # before any conversion: a wrong type is one line, not a traceback
            raise ConfigError(name, kwargs[name], f"must be {what}", where)
    if cls is StepRecord:
        kwargs["batch"] = tuple(tuple(x) for x in kwargs["batch"])
        kwargs["preempted"] = tuple(kwargs["preempted"])
        kwargs["running"] = tuple(kwargs["running"])
        kwargs["events"] = tuple(_event(e, where) for e in kwargs.get("events") or ())
        for name in ("held", "block_ids"):
            if kwargs.get(name) is not None:
                kwargs[name] = _by_request(kwargs[name], name, where)
    if cls is StepRecord and kwargs.get("reserved_reason") not in RESERVE_REASONS:
        raise ConfigError("reserved_reason", kwargs["reserved_reason"],
                          f"must be one of {', '.join(map(str, RESERVE_REASONS))}", where)
    if cls is FleetStepRecord:
        kwargs["routed"] = tuple(tuple(x) for x in kwargs["routed"])
        kwargs["stepped"] = tuple(kwargs["stepped"])
    if cls is RequestRecord and kwargs.get("prefix_ids") is not None:
        if not isinstance(kwargs["prefix_ids"], list) or not all(type(x) is int for x in kwargs["prefix_ids"]):
            raise ConfigError("prefix_ids", kwargs["prefix_ids"], "must be a list of integers", where)
    if cls is RequestRecord:
        if kwargs.get("outcome") not in OUTCOMES:
            raise ConfigError("outcome", kwargs.get("outcome"), f"must be one of {', '.join(OUTCOMES)}", where)
        if kwargs.get("reason") is not None and not isinstance(kwargs["reason"], str):
            raise ConfigError("reason", kwargs["reason"], _REASON_SHAPE, where)
        if kwargs.get("failure") is not None and kwargs["failure"] not in FAILURES:
            raise ConfigError("failure", kwargs["failure"], f"must be one of {', '.join(FAILURES)}", where)
        if kwargs.get("token_times") is not None:
            if not isinstance(kwargs["token_times"], list) or not all(_is_seconds(x) for x in kwargs["token_times"]):
                raise ConfigError("token_times", excerpt(repr(kwargs["token_times"])), "must be a list of finite "
                                  "numbers of seconds >= 0", where)
        status = kwargs.get("http_status")
        if status is not None and not (_is_count(status) and 100 <= status <= 599):
            raise ConfigError("http_status", status, "must be an HTTP status (an integer from 100 to 599)", where)
    for name in _COUNTS.get(cls, ()):
        v = kwargs.get(name)
        low = 1 if name in ("prompt_tokens", "output_tokens") else 0
        if name not in kwargs or (v is None and defaults[name].default is None):
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ConfigError(name, v, f"must be an integer >= {low}", where)
    for name in _INTS.get(cls, ()):
        v = kwargs.get(name)
        if name in kwargs and not (v is None and defaults[name].default is None) and not _is_int(v):
            raise ConfigError(name, v, "must be an integer", where)
    for name in _TIMES.get(cls, ()):
        v = kwargs.get(name)
        if name not in kwargs or (v is None and defaults[name].default is None):
            continue
        if not _is_seconds(v):
            raise ConfigError(name, v, "must be a finite number of seconds >= 0", where)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(cls.__name__, kwargs, str(e), where) from None


def _event(e: Any, where: str) -> StepEvent:
    if not isinstance(e, dict) or e.get("kind") not in EVENT_KINDS or not _is_count(e.get("request_id")):
        raise ConfigError("events", e, f"each event is an object with a kind ({', '.join(EVENT_KINDS)}) and a "
                          "request_id", where)
    unknown = sorted(set(e) - _fields(StepEvent))
    if unknown:
        raise ConfigError(f"events.{unknown[0]}", e[unknown[0]], "unknown field in an event", where)
    allowed = PREEMPT_REASONS if e.get("kind") == "preempted" else REJECT_REASONS
    if e.get("kind") == "rejected" and e.get("reason") is not None:  # a refusal: recorded as given (REFUSAL-TRUTH)
        if not isinstance(e["reason"], str):
            raise ConfigError("events.reason", e["reason"], _REASON_SHAPE, where)
    elif e.get("reason") is not None and e["reason"] not in allowed:
        raise ConfigError("events.reason", e["reason"], f"must be one of {', '.join(allowed)}", where)
    for name in ("tokens", "blocks"):
        if name in e and not _is_count(e[name]):
            raise ConfigError(f"events.{name}", e[name], f"must be an integer >= 0 (event {e['kind']} of "
                              f"request {e['request_id']})", where)
    if e.get("retry_after_s") is not None and not _is_seconds(e["retry_after_s"]):
        raise ConfigError("events.retry_after_s", e["retry_after_s"], "must be a finite number of seconds >= 0",
                          where)
    return StepEvent(**e)


def _by_request(d: Any, name: str, where: str) -> dict[int, Any]:
    """A per-request map read back from JSON (keys are request ids written as strings; a list
    of block ids a tuple, each list id in it a tuple too)."""
    if not isinstance(d, dict):
        raise ConfigError(name, d, "must be an object keyed by request id", where)
    out = {}
    for k, v in d.items():
        try:
            rid = int(k)
        except ValueError:
            raise ConfigError(name, k, "keys must be request ids", where) from None
        out[rid] = _block_ids(v) if isinstance(v, list) else v
    return out


_COUNTS = {
    RequestRecord: ("request_id", "prompt_tokens", "output_tokens", "admitted_step", "tokens_generated",
                    "preemptions", "wasted_prefill_tokens", "cached_prompt_tokens", "replica"),
    StepRecord: ("step_index", "replica"),
    FleetStepRecord: ("fleet_step",),
}
#: Integer fields that may be negative: a scheduler's books as it kept them (free blocks it
#: over-committed, distinct blocks in use it under-counted) are recorded as given, and
#: KV-CONSERVE judges them; the reader must carry what the harness recorded.
_INTS = {StepRecord: ("free_blocks", "used_blocks")}
_TIMES = {
    RequestRecord: ("arrival_s", "retry_after_s", "first_scheduled_s", "first_token_s", "finish_s", "sent_s",
                    "answered_s"),
    StepRecord: ("start_s", "duration_s"),
    FleetStepRecord: ("start_s", "duration_s"),
}


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_seconds(v: Any) -> bool:
    return _is_number(v) and v >= 0


def _list_of(ok: Any) -> Any:
    if ok is _is_count:  # the common shapes without a call per element (a history has one per step)
        return lambda v: type(v) is list and all(type(x) is int and x >= 0 for x in v)
    if ok is _is_pair:
        return lambda v: type(v) is list and all(type(x) is list and len(x) == 2 and type(x[0]) is int
                                                 and type(x[1]) is int and x[0] >= 0 and x[1] >= 0 for x in v)
    if ok is _is_batch_entry:
        return lambda v: type(v) is list and all(type(x) is list and len(x) == 2 and type(x[0]) is int
                                                 and type(x[1]) is int and x[0] >= 0 for x in v)
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


def _map_of(ok: Any) -> Any:
    if ok is _is_count:
        return lambda v: type(v) is dict and all(type(x) is int and x >= 0 for x in v.values())
    if ok is _is_number:
        return lambda v: type(v) is dict and all((type(x) is float or type(x) is int) and math.isfinite(x)
                                                 for x in v.values())
    return lambda v: isinstance(v, dict) and all(ok(x) for x in v.values())


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_batch_entry(v: Any) -> bool:
    """[request_id, tokens]: a request id >= 0 and any integer of tokens (a plan's 0 or negative
    entry is recorded as given; BATCH-LIMITS judges it)."""
    return type(v) is list and len(v) == 2 and type(v[0]) is int and v[0] >= 0 and type(v[1]) is int


def _is_pair(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_is_count(x) for x in v)


def _is_block_id(v: Any, part: bool = False) -> bool:
    """An adapter's block id or a model's key: an int, a string, or a list of block ids (a tuple
    id such as ``("kv", salt, key)``, written as a JSON list), inside which null may stand."""
    t = type(v)
    return (t is str or t is int or (part and v is None)
            or (t is list and all(_is_block_id(x, True) for x in v)))


def _block_ids(v: list) -> tuple:
    """A request's block ids read back: a tuple, each list id (at any depth) a tuple again."""
    if all(type(x) is not list for x in v):
        return tuple(v)
    return tuple(_block_ids(x) if type(x) is list else x for x in v)


#: The JSON shape of each structured field of a step and fleet_step line: (test, what it must be).  A
#: field whose default is None may also be null.  Scalar counts and times are checked by _COUNTS and _TIMES.
_SHAPES = {
    StepRecord: {
        "batch": (_list_of(_is_batch_entry), "a list of [request_id, tokens] pairs of integers, the request id >= 0"),
        "preempted": (_list_of(_is_count), "a list of request ids (integers >= 0)"),
        "running": (_list_of(_is_count), "a list of request ids (integers >= 0)"),
        "queued": (_map_of(_is_count), "an object of tenant name: requests waiting (integers >= 0)"),
        "blocks_in_use": (_map_of(_is_count), "an object of tenant name: KV blocks (integers >= 0)"),
        "counters": (_map_of(_is_number), "an object of tenant name: finite number"),
        "deficits": (_map_of(_is_number), "an object of tenant name: finite number"),
        "service": (_map_of(_is_number), "an object of tenant name: finite number"),
        "block_seconds": (_map_of(_is_number), "an object of tenant name: finite number"),
        "events": (lambda v: v is None or isinstance(v, list), "a list of event objects"),
        "held": (_map_of(_is_count), "an object of request id: KV blocks (integers >= 0)"),
        "block_ids": (_map_of(_list_of(_is_block_id)),
                      "an object of request id: list of block ids (integers, strings or lists of them)"),
        "reserved": (_is_count, "a request id (an integer >= 0) or null"),
    },
    FleetStepRecord: {
        "routed": (_list_of(_is_pair), "a list of [request_id, replica] pairs of integers >= 0"),
        "stepped": (_list_of(_is_count), "a list of replica numbers (integers >= 0)"),
        "counters": (_map_of(_is_number), "an object of tenant name: finite number, or null"),
    },
    RequestRecord: {
        "tenant": (lambda v: isinstance(v, str) and v != "", "a tenant name (a non-empty string)"),
        "detail": (lambda v: isinstance(v, str), "a string"),
    },
}


def read_history(path: str | os.PathLike) -> History:
    """Read a history written by :func:`write_history` (or by another scheduler).

    Step lines are optional (a history from request logs alone has none).

    Raises:
        ConfigError: naming the file, line and field on malformed input; an
            empty file; a file that looks truncated (a last line cut off
            mid-way, fewer request lines than the header's ``requests``, or
            step lines and no request line at all), naming its last line.
    """
    header: dict[str, Any] | None = None
    steps: list[StepRecord] = []
    fleet_steps: list[FleetStepRecord] = []
    requests: list[RequestRecord] = []
    last: dict[int | None, StepRecord] = {}  # the previous step of each replica (a fleet history, 6.2)
    where = None
    for where, obj in json_lines(path):
        kind = obj.get("kind")
        if kind == "header":
            header = {k: v for k, v in obj.items() if k != "kind"}
        elif kind == "step":
            rec = _record(StepRecord, obj, where)
            prev = last.get(rec.replica)
            if prev is not None and rec.start_s < prev.start_s:
                raise ConfigError("start_s", rec.start_s, f"goes back in time (the previous step started at {prev.start_s})", where)
            if prev is not None and rec.step_index <= prev.step_index:
                raise ConfigError("step_index", rec.step_index, f"not after the previous step's ({prev.step_index})", where)
            last[rec.replica] = rec
            steps.append(rec)
        elif kind == "fleet_step":
            rec = _record(FleetStepRecord, obj, where)
            if fleet_steps and rec.fleet_step <= fleet_steps[-1].fleet_step:
                raise ConfigError("fleet_step", rec.fleet_step, f"not after the previous fleet step's ({fleet_steps[-1].fleet_step})", where)
            fleet_steps.append(rec)
        elif kind == "request":
            requests.append(_record(RequestRecord, obj, where))
        elif kind is None and "request_id" in obj and "arrival_s" in obj:
            raise ConfigError("kind", kind, "must be header, step, fleet_step or request: this line is a request of "
                              "a workload, not of a history (run it with simulate --workload FILE --history OUT, or "
                              "verify --target ... --workload FILE)", where)
        else:
            raise ConfigError("kind", kind, "must be header, step, fleet_step or request", where)
    _complete(path, where, header, steps, requests)
    return History(header=header or {}, steps=tuple(steps), requests=tuple(sorted(requests, key=lambda r: r.request_id)),
                   fleet_steps=tuple(fleet_steps))


def _complete(path: Any, last: str | None, header: dict | None, steps: list, requests: list) -> None:
    """Refuse a history that is empty or looks truncated (see :func:`read_history`); ``last`` is
    ``file:line`` of its last record, or None when it has none."""
    if last is None:
        raise ConfigError("lines", 0, "empty file: a history is a header line, then step lines and request "
                          "lines (SPEC.md 6)", str(path))
    want = (header or {}).get("requests")
    kind = "request" if requests else "step" if steps else "header"
    ends = f"the file ends after this {kind} line"
    if kind == "step" and (steps[-1].running or any(steps[-1].queued.values())):
        s = steps[-1]
        ends += f", with requests in flight (step {s.step_index}: {len(s.running)} running, " \
                f"{sum(s.queued.values())} queued)"
    if _is_count(want) and len(requests) < want:
        raise ConfigError("request records", len(requests), f"the header says {want}, but {ends}: it looks "
                          "truncated (cut before its end)", last)
    if steps and not requests and want is None:
        raise ConfigError("request records", 0, f"{len(steps)} step lines and no request line, and {ends}: it "
                          "looks truncated (request lines follow the steps)", last)
