"""``tenantry serve``'s model side: the reference model in scaled real time.

The model's clock is the wall clock (monotonic) times the time scale, from the first
request on.  A request is offered to the model at the instant it was received
(:class:`LiveFeed`, the driver's :class:`~tenantry.runner.simulate.Feed` open to arrivals
as they come); a client that goes away is a cancellation at that instant.  The one driver
loop (:func:`~tenantry.runner.simulate.drive`) runs each step when the model's clock reaches
its start, and what the step produced is handed to the requests' streams when the clock
reaches its end: a refusal at once (an HTTP 429), each output token (one per request per
step), the finish.  When the model falls behind the wall clock (a step took longer to
compute than its duration over the scale), steps run back to back until it caught up; the
largest lag is kept (:attr:`Engine.max_lag_s`).

Everything runs on one event loop: the HTTP handlers (:mod:`.server`) call
:meth:`Engine.submit` and :meth:`Engine.disconnect`; :meth:`Engine.run` is the loop's one
task that steps the model.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from typing import Any

from tenantry.model.config import Config, config_to_dict
from tenantry.model.events import ADMISSION_REASONS
from tenantry.model.routers import FleetConfig
from tenantry.model.workload import Request
from tenantry.runner.fleet import Fleet, FleetRecorder
from tenantry.runner.history import History
from tenantry.runner.simulate import Feed, ModelReplica, Recorder, drive

from .wire import WireError, WireRequest

#: Seconds between two looks at the stop request while waiting.
POLL_S = 0.1


class LiveFeed(Feed):
    """A :class:`~tenantry.runner.simulate.Feed` whose requests and cancellations come while
    the model runs (:meth:`add`, :meth:`cancel`); :func:`~tenantry.runner.simulate.drive`
    waits for them while it is open, and ends once it is closed (:meth:`close`) and empty."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.cancels: list[tuple[float, int]] = []
        self.i = self.c = 0
        self.held: tuple[int, ...] = ()
        self.open = True

    def add(self, r: Request) -> None:
        """A request arriving at ``r.arrival_s`` (not before the last one added)."""
        if self.requests and r.arrival_s < self.requests[-1].arrival_s:
            raise ValueError(f"arrival {r.arrival_s} before the last one ({self.requests[-1].arrival_s})")
        self.requests.append(r)

    def cancel(self, t_s: float, request_id: int) -> None:
        """The client of ``request_id`` went away at ``t_s``."""
        bisect.insort(self.cancels, (t_s, request_id), lo=self.c)

    def close(self) -> None:
        """No more requests: the driver ends once the model is empty."""
        self.open = False


class Stream:
    """One request's answer as the model produces it.

    Attributes:
        request: as offered.  answer: resolves to None (admitted: stream) or a refusal
            (reason, retry_after_s in model seconds).  items: what to stream, in order:
            ``(tokens, finish_reason)`` pairs; None ends the stream (the server stopped);
            an ``("error", reason)`` pair ends it with an error (evicted too often).
        emitted: output tokens handed to the stream so far.
    """

    __slots__ = ("request", "answer", "items", "emitted", "gone")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.answer: asyncio.Future = asyncio.get_running_loop().create_future()
        self.items: asyncio.Queue = asyncio.Queue()
        self.emitted = 0
        self.gone = False

    def put(self, item: Any) -> None:
        """Hand ``item`` to the stream (dropped once its client went away)."""
        if not self.gone:
            self.items.put_nowait(item)

    def end(self) -> None:
        """End the stream (its client went away, or the server stops)."""
        self.items.put_nowait(None)


def tokens_done(transition: Any) -> dict[int, int]:
    """Output tokens generated so far by each request in a step's batch (after the step)."""
    state, out = transition.state, transition.output
    done = {s.request_id: s.output_done for s in out.finished}
    batch = {rid for rid, _ in out.batch}
    for s in state.running:
        if s.request_id in batch:
            done.setdefault(s.request_id, s.output_done)
    return done


class Engine:
    """The reference model behind ``tenantry serve``: one replica (a :class:`Config`) or a
    fleet (a :class:`FleetConfig`), stepped in scaled real time.

    Args:
        system: the replica or the fleet.
        time_scale: model seconds per wall second.
        record: keep the model's history (step records included) for :meth:`history`.

    Attributes:
        served: requests offered to the model so far.  max_lag_s: the most the model's clock
            fell behind the wall clock's (model seconds).
    """

    def __init__(self, system: Config | FleetConfig, time_scale: float = 1.0, record: bool = False) -> None:
        self.system = system
        self.fleet = isinstance(system, FleetConfig)
        self.config = system.replicas[0] if self.fleet else system
        self.replica = Fleet(system) if self.fleet else ModelReplica(system)
        self.scale = time_scale
        self.feed = LiveFeed()
        self.streams: dict[int, Stream] = {}
        self.recorder = (FleetRecorder(system) if self.fleet else Recorder(system)) if record else None
        self.served = 0
        self.max_lag_s = 0.0
        self._ids: set[int] = set()
        self._next_id = 0
        self._t0: float | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False

    def now_s(self) -> float:
        """The model's time now: wall seconds since the first request, times the scale (0 before it)."""
        return 0.0 if self._t0 is None else (time.monotonic() - self._t0) * self.scale

    def _wall(self, t_s: float) -> float:
        return self._t0 + t_s / self.scale

    def _request_id(self, wanted: int | None) -> int:
        if wanted is not None and wanted not in self._ids:
            rid = wanted
        else:
            while self._next_id in self._ids:
                self._next_id += 1
            rid = self._next_id
        self._ids.add(rid)
        return rid

    def submit(self, read: Any, wanted_id: int | None = None) -> Stream:
        """Offer a request to the model now.  ``read(request_id, arrival_s)`` builds it
        (:func:`tenantry.live.wire.from_wire`); ``wanted_id``: the client's id, taken when unused.

        Raises:
            WireError: from ``read``, or for a tenant the configuration does not have.
        """
        if self._stopping:
            raise WireError("the server is stopping")
        if self._t0 is None:
            self._t0 = time.monotonic()
        arrival = self.now_s()
        if self.feed.requests:
            arrival = max(arrival, self.feed.requests[-1].arrival_s)
        rid = self._request_id(wanted_id)
        try:
            wr: WireRequest = read(rid, round(arrival, 6))
            self.config.tenant_index(wr.request.tenant)
        except Exception as e:
            self._ids.discard(rid)
            if isinstance(e, WireError):
                raise
            raise WireError(str(e)) from None
        r = wr.request
        stream = Stream(r)
        self.streams[rid] = stream
        self.feed.add(r)
        self.served += 1
        if self.recorder is not None:
            (self.recorder.offer if self.fleet else self.recorder.offered)(r)
        if self._wake is not None:
            self._wake.set()
        return stream

    def disconnect(self, request_id: int) -> None:
        """The client of ``request_id`` went away: cancel it at this instant (unless it ended)."""
        s = self.streams.pop(request_id, None)
        if s is None:
            return
        s.gone = True
        self.feed.cancel(max(self.now_s(), s.request.arrival_s), request_id)
        if self._wake is not None:
            self._wake.set()

    def stop(self) -> None:
        """End every stream and the run (the server is shutting down)."""
        self._stopping = True
        self.feed.close()
        for s in self.streams.values():
            if not s.answer.done():
                s.answer.set_result(("stopping", None))
            s.end()
        self.streams.clear()
        if self._wake is not None:
            self._wake.set()

    async def _sleep_until(self, t_s: float) -> None:
        """Wait until the model's time ``t_s`` (at least a pass of the loop, so handlers run)."""
        await asyncio.sleep(0)
        while not self._stopping:
            left = self._wall(t_s) - time.monotonic()
            if left <= 0:
                self.max_lag_s = max(self.max_lag_s, -left * self.scale)
                return
            await asyncio.sleep(min(left, POLL_S))

    async def run(self) -> None:
        """Step the model until :meth:`stop` (the one driver loop over the live feed)."""
        self._wake = asyncio.Event()
        steps = drive(self.replica, self.feed)
        while not self._stopping:
            inputs = next(steps, StopIteration)
            if inputs is StopIteration:
                return
            if inputs is None:  # empty, nothing arrived yet
                self._wake.clear()
                if self.feed.next_arrival_s is None and not self._stopping:
                    await self._wake.wait()
                continue
            await self._emit()

    async def _emit(self) -> None:
        """Hand the last step's results to the streams: refusals at once, tokens at the end of
        the step (of each replica's step, in a fleet)."""
        last = self.replica.last
        parts = [t for t in last.replicas if t is not None] if self.fleet else [last]
        if self.recorder is not None:
            if self.fleet:
                self.recorder.observe(last)
            else:
                self.recorder.observe(last.state, last.output)
        for tr in parts:
            for e in tr.output.events:
                s = self.streams.get(e.request_id)
                if s is None:
                    continue
                if e.kind == "queued" and not s.answer.done():
                    s.answer.set_result(None)
                elif e.kind == "rejected" and e.reason in ADMISSION_REASONS and not s.answer.done():
                    s.answer.set_result((e.reason, e.retry_after_s))
                    self.streams.pop(e.request_id, None)
        for tr in sorted(parts, key=lambda t: t.output.duration_s):
            out = tr.output
            await self._sleep_until(out.start_s + out.duration_s)
            done = tokens_done(tr)
            for rid, _ in out.batch:
                s = self.streams.get(rid)
                if s is None or rid not in done:
                    continue
                n = done[rid] - s.emitted
                if n > 0:
                    s.emitted = done[rid]
                    s.put((n, "length" if s.emitted >= s.request.output_tokens else None))
            for e in out.events:
                if e.kind in ("finished", "cancelled") or (e.kind == "rejected" and e.reason not in ADMISSION_REASONS):
                    s = self.streams.pop(e.request_id, None)
                    if s is not None and e.kind == "rejected":
                        s.put(("error", e.reason))
                    elif s is not None and e.kind == "finished" and s.emitted < s.request.output_tokens:
                        s.put((0, "length"))

    def history(self, header: dict[str, Any] | None = None) -> History:
        """The model's history of what it served (step records included): requests still in
        flight are ``unfinished``.  Needs ``record=True``."""
        if self.recorder is None:
            raise ValueError("Engine(record=False) keeps no history")
        hdr = {"requests": self.served, "live_serve": {"time_scale": self.scale,
                                                      "max_lag_s": round(self.max_lag_s, 6)}, **(header or {})}
        if self.fleet:
            return self.recorder.history(self.replica, hdr)
        return self.recorder.history(self.replica.state, {"config": config_to_dict(self.config), **hdr})
