"""The driver: feed a workload to the step function and record the history.

``simulate(config, workload)`` is deterministic: the same configuration and
workload give the same :class:`~tenantry.model.history.History`, byte for byte
once written.  Time comes only from the cost model; there is no wall clock and
no random state.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Iterable, Iterator

import attrs

from .config import Config, ConfigError
from .history import History, RequestRecord, StepRecord
from .state import State, free_blocks, initial_state
from .step import StepOutput, idle, step
from .workload import Request, StepInput, Workload


_queue_of = itemgetter(0)  # TenantState.queue


def config_to_dict(config: Config) -> dict[str, Any]:
    """The configuration as plain JSON-able data (for history headers)."""
    return attrs.asdict(config, filter=lambda a, v: not a.name.startswith("_"))


def check_workload(config: Config, workload: Workload) -> None:
    """Every request names a configured tenant.

    Raises:
        ConfigError: naming the first request whose tenant is unknown.
    """
    known = {t.name for t in config.tenants}
    for r in workload.requests:
        if r.tenant not in known:
            raise ConfigError(
                "tenant", r.tenant,
                f"request {r.request_id} names a tenant the configuration does not have ({', '.join(sorted(known))})",
            )


def has_work(state: State) -> bool:
    """True while some sequence is running or queued."""
    return bool(state.running) or any(map(_queue_of, state.tenants))


class Recorder:
    """Builds request records and step snapshots from step outputs."""

    def __init__(self, config: Config, record_steps: bool = True) -> None:
        self.config = config
        self.record_steps = record_steps
        self.requests: dict[int, dict[str, Any]] = {}
        self.steps: list[StepRecord] = []

    def offered(self, r: Request) -> None:
        self.requests[r.request_id] = {
            "request_id": r.request_id, "tenant": r.tenant, "arrival_s": r.arrival_s,
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "outcome": "unfinished",
        }

    def observe(self, state: State, out: StepOutput) -> None:
        """Fold one step's output (and the state after it) into the records."""
        for e in out.events:
            rec = self.requests[e.request_id]
            if e.kind == "queued":
                rec["admitted_step"] = out.step_index
            elif e.kind == "rejected":
                rec.update(outcome="rejected", reason=e.reason, retry_after_s=e.retry_after_s, finish_s=e.t_s)
            elif e.kind == "first_token":
                rec["first_token_s"] = e.t_s
            elif e.kind in ("finished", "cancelled"):
                rec.update(outcome=e.kind, finish_s=e.t_s)
        for s in out.finished:
            self._fold_sequence(s)
        if self.record_steps:
            self.steps.append(snapshot(self.config, state, out))

    def _fold_sequence(self, s) -> None:
        rec = self.requests[s.request_id]
        rec.update(
            first_scheduled_s=s.first_scheduled_s, first_token_s=s.first_token_s, tokens_generated=s.output_done,
            preemptions=s.preemptions, wasted_prefill_tokens=s.wasted_tokens, cached_prompt_tokens=s.cached_tokens,
        )

    def history(self, state: State, header: dict[str, Any]) -> History:
        for s in state.sequences():
            self._fold_sequence(s)
        recs = tuple(RequestRecord(**self.requests[k]) for k in sorted(self.requests))
        return History(header=header, steps=tuple(self.steps), requests=recs)


def snapshot(config: Config, state: State, out: StepOutput) -> StepRecord:
    """The per-step snapshot of the history (SPEC.md 6)."""
    names = [t.name for t in config.tenants]
    ts = state.tenants
    return StepRecord(
        step_index=out.step_index,
        start_s=out.start_s,
        duration_s=out.duration_s,
        batch=out.batch,
        preempted=out.preempted,
        running=tuple(s.request_id for s in state.running),
        queued={n: len(t.queue) for n, t in zip(names, ts)},
        blocks_in_use={n: t.blocks for n, t in zip(names, ts)},
        free_blocks=free_blocks(config, state),
        counters={n: t.counter for n, t in zip(names, ts)},
        deficits={n: t.deficit for n, t in zip(names, ts)},
        service={n: t.service for n, t in zip(names, ts)},
        block_seconds={n: t.block_seconds for n, t in zip(names, ts)},
    )


class Feed:
    """Delivers a workload's arrivals and cancellations to the steps that are due.

    The one rule every driver shares (SPEC.md 5.1): a request arrives at the
    first step starting at or after its ``arrival_s``; a cancellation (t_s,
    request_id) at the first step starting at or after t_s.
    """

    def __init__(self, requests: Iterable[Request], cancellations: Iterable[tuple[float, int]] = ()) -> None:
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self.cancels = sorted(cancellations)
        self.i = self.c = 0

    @property
    def exhausted(self) -> bool:
        """Every arrival has been delivered."""
        return self.i == len(self.requests)

    @property
    def next_arrival_s(self) -> float | None:
        """Arrival time of the next undelivered request, or None."""
        return None if self.exhausted else self.requests[self.i].arrival_s

    def due(self, t_s: float) -> StepInput:
        """The arrivals and cancellations due at a step starting at ``t_s``."""
        reqs, cancels = self.requests, self.cancels
        j = self.i
        while j < len(reqs) and reqs[j].arrival_s <= t_s:
            j += 1
        d = self.c
        while d < len(cancels) and cancels[d][0] <= t_s:
            d += 1
        out = StepInput(arrivals=reqs[self.i:j], cancellations=tuple(rid for _, rid in cancels[self.c:d]))
        self.i, self.c = j, d
        return out


def run_steps(
    config: Config,
    workload: Workload | Iterable[Request],
    *,
    horizon_s: float | None = None,
    max_steps: int | None = None,
    cancellations: Iterable[tuple[float, int]] = (),
) -> Iterator[tuple[State, StepInput, State, StepOutput]]:
    """The driver loop of :func:`simulate`, one step at a time.

    Yields ``(state before, inputs, state after, output)`` for every step;
    idles the empty replica to the next arrival in between.  Stops as
    :func:`simulate` does.

    Raises:
        ConfigError: if a request names an unknown tenant (before any step).
    """
    wl = workload if isinstance(workload, Workload) else Workload(tuple(workload))
    check_workload(config, wl)
    feed = Feed(wl.requests, cancellations)
    state = initial_state(config)
    while max_steps is None or state.step_index < max_steps:
        if not has_work(state):
            nxt = feed.next_arrival_s
            if nxt is None or (horizon_s is not None and nxt >= horizon_s):
                return
            if nxt > state.t_s:
                state = idle(config, state, nxt)
        if horizon_s is not None and state.t_s >= horizon_s:
            return
        inputs = feed.due(state.t_s)
        new, out = step(config, state, inputs)
        yield state, inputs, new, out
        state = new


def simulate(
    config: Config,
    workload: Workload | Iterable[Request],
    *,
    horizon_s: float | None = None,
    max_steps: int | None = None,
    cancellations: Iterable[tuple[float, int]] = (),
    record_steps: bool = True,
    header: dict[str, Any] | None = None,
) -> History:
    """Run ``workload`` on the replica ``config`` and return its history.

    Arrivals are delivered to the first step that starts at or after their
    ``arrival_s``; when nothing is queued or running the replica idles until
    the next arrival.  The run ends when every request has ended, or at
    ``horizon_s`` (seconds) / ``max_steps`` steps, whichever comes first;
    requests still in flight then are recorded as ``unfinished``.

    Args:
        cancellations: (t_s, request_id) pairs: the client cancels the request
            at the first step starting at or after t_s.
        record_steps: keep a snapshot per step (costly with many tenants).
        header: extra header fields (e.g. a seed, a workload name).

    Raises:
        ConfigError: if a request names an unknown tenant.
    """
    wl = workload if isinstance(workload, Workload) else Workload(tuple(workload))
    rec = Recorder(config, record_steps)
    for r in wl.requests:
        rec.offered(r)
    state = initial_state(config)
    for _, _, state, out in run_steps(config, wl, horizon_s=horizon_s, max_steps=max_steps, cancellations=cancellations):
        rec.observe(state, out)
    hdr = {"config": config_to_dict(config), "requests": len(wl), **(header or {})}
    return rec.history(state, hdr)
