"""Workloads: the requests offered to the replica, and the inputs of one step.

A :class:`Request` is what a client sends; a :class:`Workload` is a tuple of
them sorted by arrival time.  The readers for real traces and the project's own
JSON Lines live in :mod:`tenantry.runner.traces`.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import attrs

from .config import ConfigError


@attrs.frozen
class Request:
    """One prompt plus its generation, as offered by a tenant.

    Attributes:
        request_id: unique non-negative integer id.
        tenant: the sending tenant's name.
        arrival_s: arrival time (seconds from the start of the run).
        prompt_tokens: prompt (input) length, tokens, >= 1.
        output_tokens: tokens the model will generate, >= 1 (the true length;
            schedulers may not read it, only the model's accounting does).
        prefix_ids: content ids of the prompt's leading full KV blocks, one per
            block of ``block_size_tokens`` tokens; equal ids at equal positions
            behind equal ids mean equal content (a shareable prefix).  Blocks
            past the end of this tuple have content unique to this request;
            ids past the prompt's full blocks (``prompt_tokens //
            block_size_tokens``) are ignored (SPEC.md 4.6), not an error: the
            request does not know the replica's block size.
        predicted_output_tokens: the client's or predictor's estimate of the
            output length (for ``vtc_predict``); None means unknown.
        prompt_bytes: prompt length in bytes (for the byte-length estimate);
            None means 4 bytes per token.
        cancel_s: the client cancels the request at this time (seconds, at
            least ``arrival_s``): it is delivered to the first step starting at
            or after it (SPEC.md 5.1); None: never cancelled.  Cancellations are part of the
            workload, so removing a request removes its cancellation.
    """

    request_id: int
    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_ids: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    predicted_output_tokens: int | None = None
    prompt_bytes: int | None = None
    cancel_s: float | None = None

    def __attrs_post_init__(self) -> None:
        check_request_fields(self)

    @property
    def total_tokens(self) -> int:
        """Prompt plus output tokens: the full context the sequence reaches."""
        return self.prompt_tokens + self.output_tokens


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_request_fields(r: Request, where: str = "") -> None:
    """Validate a request's fields.

    Raises:
        ConfigError: naming the field and its value (and ``where`` when given).
    """
    if not _is_int(r.request_id) or r.request_id < 0:
        raise ConfigError("request_id", r.request_id, "must be a non-negative integer", where)
    if not isinstance(r.tenant, str) or not r.tenant:
        raise ConfigError("tenant", r.tenant, "must be a non-empty string", where)
    if not r.tenant.isprintable():  # a newline would break every table it is printed in, an escape the terminal
        raise ConfigError("tenant", r.tenant, "must be printable: no control or format characters (a newline, "
                          "a tab, an escape, a bidirectional override)", where)
    if isinstance(r.arrival_s, bool) or not isinstance(r.arrival_s, (int, float)) or not math.isfinite(r.arrival_s) or r.arrival_s < 0:
        raise ConfigError("arrival_s", r.arrival_s, "must be a finite number of seconds >= 0", where)
    if not _is_int(r.prompt_tokens) or r.prompt_tokens < 1:
        raise ConfigError("prompt_tokens", r.prompt_tokens, "must be an integer >= 1", where)
    if not _is_int(r.output_tokens) or r.output_tokens < 1:
        raise ConfigError("output_tokens", r.output_tokens, "must be an integer >= 1", where)
    if r.predicted_output_tokens is not None and (not _is_int(r.predicted_output_tokens) or r.predicted_output_tokens < 0):
        raise ConfigError("predicted_output_tokens", r.predicted_output_tokens, "must be an integer >= 0", where)
    if r.prompt_bytes is not None and (not _is_int(r.prompt_bytes) or r.prompt_bytes < 0):
        raise ConfigError("prompt_bytes", r.prompt_bytes, "must be an integer >= 0", where)
    if r.cancel_s is not None and (isinstance(r.cancel_s, bool) or not isinstance(r.cancel_s, (int, float))
                                   or not math.isfinite(r.cancel_s) or r.cancel_s < 0):
        raise ConfigError("cancel_s", r.cancel_s, "must be a finite number of seconds >= 0, or absent", where)
    if r.cancel_s is not None and r.cancel_s < r.arrival_s:
        raise ConfigError("cancel_s", r.cancel_s, f"before the arrival_s of request {r.request_id} ({r.arrival_s!r}): "
                          "a request cannot be cancelled before it is sent", where)
    if not all(type(x) is int for x in r.prefix_ids):
        raise ConfigError("prefix_ids", r.prefix_ids, "must be integers", where)


@attrs.frozen
class Workload:
    """Requests sorted by (arrival_s, request_id), with unique ids (cancellations included:
    :attr:`Request.cancel_s`).

    ``origin`` maps a request id to where it was read (``file:line``, set by
    :func:`~tenantry.runner.traces.read_workload_jsonl`), for errors found later
    (:func:`~tenantry.runner.simulate.check_workload`); not part of equality, and empty
    for a workload built in code.

    Raises:
        ConfigError: on a duplicate request id.
    """

    requests: tuple[Request, ...] = attrs.field(converter=lambda rs: tuple(sorted(rs, key=lambda r: (r.arrival_s, r.request_id))))
    origin: Mapping[int, str] = attrs.field(factory=dict, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        seen: set[int] = set()
        for r in self.requests:
            if r.request_id in seen:
                raise ConfigError("request_id", r.request_id, "duplicate request id in workload")
            seen.add(r.request_id)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self):
        return iter(self.requests)

    @property
    def tenants(self) -> tuple[str, ...]:
        """Tenant names in order of first appearance."""
        return tuple(dict.fromkeys(r.tenant for r in self.requests))

    @property
    def cancellations(self) -> tuple[tuple[float, int], ...]:
        """(cancel_s, request_id) of every cancelled request, in delivery order."""
        return tuple(sorted((r.cancel_s, r.request_id) for r in self.requests if r.cancel_s is not None))

    def with_cancellations(self, cancellations: Iterable[tuple[float, int]]) -> "Workload":
        """This workload with the requests named in ``(t_s, request_id)`` pairs cancelled at t_s
        (the earliest when a request is named twice; unknown ids are ignored).

        Raises:
            ConfigError: when a t_s is before its request's ``arrival_s``."""
        when: dict[int, float] = {}
        for t_s, rid in cancellations:
            when[rid] = min(t_s, when.get(rid, t_s))
        return Workload(tuple(attrs.evolve(r, cancel_s=when[r.request_id]) if r.request_id in when else r
                              for r in self.requests))

    @property
    def duration_s(self) -> float:
        """Last arrival time (seconds); 0 for an empty workload."""
        return self.requests[-1].arrival_s if self.requests else 0.0


@attrs.frozen
class StepInput:
    """What arrives from outside during one step (the environment's actions).

    Attributes:
        arrivals: requests arriving before this step is planned, in arrival order.
        cancellations: ids of requests the client cancels before this step.
    """

    arrivals: tuple[Request, ...] = attrs.field(default=(), converter=tuple)
    cancellations: tuple[int, ...] = attrs.field(default=(), converter=tuple)


def as_workload(workload: "Workload | Iterable[Request]") -> Workload:
    """``workload`` itself, or the :class:`Workload` of an iterable of requests."""
    return workload if isinstance(workload, Workload) else Workload(tuple(workload))


def with_request_id(r: Request, request_id: int) -> Request:
    """``r`` with another id (``attrs.evolve(r, request_id=...)`` without validating again the
    fields ``r`` was built with: only the new id is checked).

    Raises:
        ConfigError: when ``request_id`` is not a non-negative integer.
    """
    if not _is_int(request_id) or request_id < 0:
        raise ConfigError("request_id", request_id, "must be a non-negative integer")
    cls = type(r)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(a.name for a in attrs.fields(cls))
    new = object.__new__(cls)
    put = object.__setattr__  # Request is frozen: its own __init__ sets its fields this way too
    for name in names:
        put(new, name, getattr(r, name))
    put(new, "request_id", request_id)
    return new


#: Field names per request class (:func:`with_request_id`).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def renumber(requests: Iterable[Request], start: int = 0) -> tuple[Request, ...]:
    """Give requests consecutive ids from ``start`` in (arrival_s, old id) order.

    Raises:
        ConfigError: when ``start`` is not a non-negative integer (and some request is given).
    """
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id, r.tenant))
    return tuple(with_request_id(r, start + i) for i, r in enumerate(ordered))
