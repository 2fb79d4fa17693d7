"""``tenantry replay``'s client: send a workload to a server as it arrives, and record it.

:func:`replay` sends each request at its ``arrival_s`` divided by the time scale (a
monotonic clock from the run's start), as a streaming ``/v1/completions`` request built by
:func:`tenantry.live.wire.to_wire`; reads its chunks as they come; disconnects at its
``cancel_s`` (the server sees a client that went away); and records what it saw per request
(:class:`~tenantry.live.record.Seen`).  At most ``max_in_flight`` requests are open at once
(a request due while all are busy waits, and its lag shows in ``sent_s``).  Nothing is kept
per token but its arrival time.  Every failure ends in the request's record, never in an
exception: a refusal (its status, reason and body), no byte for ``timeout_s`` seconds
(``timeout``), a connection refused or cut (``connection``), a stream that does not follow
the protocol (``bad_stream``), an error sent in the stream (``server_error``, or the model's
reason when it names one).  Only the URL given is contacted (no proxy from the environment,
no redirect).  Needs httpx and httpx-sse (``tenantry[live]``).
"""

from __future__ import annotations

import asyncio
import math
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

import attrs

from tenantry.model.config import ConfigError
from tenantry.model.workload import Request, Workload, as_workload

from . import MissingExtra, require_extra
from .record import DETAIL_CHARS, Seen
from .wire import FAIRNESS_HEADER, WireError, WireOptions, read_chunk, refusal_reason, to_wire

#: Largest refusal body read (bytes); the rest is not read.
MAX_BODY_BYTES = 64 << 10
#: Seconds between two looks at the stop request while waiting.
POLL_S = 0.05


class LiveError(Exception):
    """Nothing can be done against this URL (one line: a bad URL, a server that cannot be
    reached or does not speak the API)."""


def endpoints(url: str) -> tuple[str, str]:
    """(completions URL, models URL) of a server URL: ``URL/v1/completions`` and
    ``URL/v1/models``, or ``URL/completions`` and ``URL/models`` when URL ends in ``/v1``.

    Raises:
        LiveError: for a URL that is not ``http://`` or ``https://`` with a host.
    """
    require_extra()
    import httpx

    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as e:
        raise LiveError(f"{url!r} is not a URL ({e})") from None
    if u.scheme not in ("http", "https") or not u.host:
        raise LiveError(f"{url!r} is not an http:// or https:// URL with a host (e.g. http://127.0.0.1:8000)")
    base = str(u.copy_with(query=None, fragment=None)).rstrip("/")
    root = base if base.endswith("/v1") else base + "/v1"
    return root + "/completions", root + "/models"


@attrs.frozen
class ReplayOptions:
    """How to replay.

    Attributes:
        url: the server (see :func:`endpoints`).
        wire: the wire mapping's options (the model name is filled in by :func:`preflight`).
        time_scale: workload seconds per wall second (2: twice as fast as written).
        max_in_flight: most requests open at once.
        timeout_s: wall seconds to wait for anything from the server on one request (the
            answer, the first token, the next token) before giving it up as ``timeout``.
        horizon_s: workload seconds: requests still open then are disconnected and recorded
            ``unfinished``, requests not sent by then are not sent; None: run until every
            request ended.
        token_times: keep each token's arrival time in the record.
    """

    url: str
    wire: WireOptions = WireOptions()
    time_scale: float = 1.0
    max_in_flight: int = 256
    timeout_s: float = 60.0
    horizon_s: float | None = None
    token_times: bool = True


def _client(opts: ReplayOptions):
    import httpx

    return httpx.AsyncClient(
        timeout=httpx.Timeout(opts.timeout_s), trust_env=False, follow_redirects=False,
        limits=httpx.Limits(max_connections=opts.max_in_flight, max_keepalive_connections=opts.max_in_flight))


def _why(e: BaseException) -> str:
    """One line for a transport error (httpx's, or an OS error under it)."""
    import os

    cause = e
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
        if isinstance(cause, OSError) and cause.errno:
            return os.strerror(cause.errno)  # "Connection refused", not "[Errno 111] Connect call failed (...)"
    text = str(cause) or str(e) or type(e).__name__
    return " ".join(text.split())[:300]


async def preflight(opts: ReplayOptions) -> tuple[str, int | None]:
    """Ask the server its models (``GET /v1/models``); returns the first model's id and its
    ``max_model_len`` (vLLM lists it; None when the server does not).

    Raises:
        LiveError: the URL is bad, the server cannot be reached or answers with an error, or
            the answer lists no model.
    """
    import httpx

    _, models = endpoints(opts.url)
    try:
        async with _client(opts) as c:
            resp = await c.get(models)
    except httpx.TimeoutException:
        raise LiveError(f"{models}: no answer within {opts.timeout_s:g} s (--timeout-s)") from None
    except httpx.HTTPError as e:
        raise LiveError(f"cannot reach {models}: {_why(e)}") from None
    if resp.status_code != 200:
        raise LiveError(f"{models} answered HTTP {resp.status_code}: {' '.join(resp.text.split())[:200]}")
    try:
        first = resp.json()["data"][0]
        length = first.get("max_model_len")
        return str(first["id"]), length if isinstance(length, int) and not isinstance(length, bool) else None
    except (ValueError, KeyError, IndexError, TypeError):
        raise LiveError(f"{models} did not list a model (an OpenAI-compatible server answers "
                        f"{{\"data\": [{{\"id\": ...}}]}}): {' '.join(resp.text.split())[:120]}") from None


class Replay:
    """One replay in progress: the requests, what was seen of each, and the clock.

    Attributes:
        requests: the workload's requests in arrival order.
        seen: request id -> :class:`Seen`, for every request sent.
        stopped: why the run stopped early (``interrupted``), or None.
        end_s: the run's end (workload seconds), once it ended.
        max_lag_s: the longest a request was sent after its time (workload seconds).
    """

    def __init__(self, workload: Workload | Iterable[Request], opts: ReplayOptions,
                 on_end: Callable[[Request, Seen], None] | None = None,
                 stop: Callable[[], bool] | None = None) -> None:
        require_extra()
        self.requests = as_workload(workload).requests
        self.opts = opts
        self.seen: dict[int, Seen] = {}
        self.on_end = on_end
        self.stop = stop or (lambda: False)
        self.stopped: str | None = None
        self.end_s: float | None = None
        self.max_lag_s = 0.0
        self._t0 = 0.0
        self.completions, _ = endpoints(opts.url)

    def now_s(self) -> float:
        """Workload seconds since the run started."""
        return (time.monotonic() - self._t0) * self.opts.time_scale

    async def _until(self, t_s: float) -> bool:
        """Sleep until workload time ``t_s``; False when stopped first."""
        while True:
            if self.stop():
                return False
            left = (t_s - self.now_s()) / self.opts.time_scale
            if left <= 0:
                return True
            await asyncio.sleep(min(left, POLL_S))

    async def run(self) -> None:
        """Send every request at its time, wait for them to end (or the horizon, or a stop)."""
        import httpx_sse  # noqa: F401  (imported before the clock starts, not by the first request)

        opts = self.opts
        horizon = math.inf if opts.horizon_s is None else opts.horizon_s
        tasks: set[asyncio.Task] = set()
        slots = asyncio.Semaphore(opts.max_in_flight)
        async with _client(opts) as client:
            try:  # warm up before the clock starts: the client's lazy imports and its first connection
                await client.get(endpoints(opts.url)[1])
            except Exception:  # noqa: BLE001 - the requests will meet (and record) whatever is wrong
                pass
            self._t0 = time.monotonic()
            try:
                for r in self.requests:
                    if r.arrival_s >= horizon or not await self._until(r.arrival_s):
                        break
                    await slots.acquire()
                    if self.stop():
                        slots.release()
                        break
                    self.max_lag_s = max(self.max_lag_s, self.now_s() - r.arrival_s)
                    seen = self.seen[r.request_id] = Seen(opts.token_times)
                    task = asyncio.create_task(self._one(client, r, seen))
                    tasks.add(task)
                    task.add_done_callback(lambda t, r=r, s=seen: (tasks.discard(t), slots.release(),
                                                                    self._ended(r, s)))
                while tasks and await self._until(min(horizon, self.now_s() + POLL_S * opts.time_scale)):
                    if self.now_s() >= horizon:
                        break
            finally:
                if self.stop():
                    self.stopped = "interrupted"
                for t in list(tasks):
                    t.cancel()
                if tasks:
                    await asyncio.gather(*tasks, return_exceptions=True)
        self.end_s = self.now_s() if opts.horizon_s is None else min(self.now_s(), opts.horizon_s)

    def _ended(self, r: Request, seen: Seen) -> None:
        if self.on_end is not None:
            self.on_end(r, seen)

    async def _one(self, client, r: Request, seen: Seen) -> None:
        """One request: its exchange, cut at its ``cancel_s`` (a disconnect: ``cancelled``)."""
        task = asyncio.ensure_future(self._exchange(client, r, seen))
        try:
            if r.cancel_s is None:
                await task
                return
            while not task.done():
                left = (r.cancel_s - self.now_s()) / self.opts.time_scale
                if left <= 0:
                    break
                await asyncio.wait({task}, timeout=min(left, POLL_S))
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                if not seen.ended:
                    seen.outcome, seen.finish_s = "cancelled", self.now_s()
        except asyncio.CancelledError:  # the horizon or a stop: the connection is closed, the record stays open
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise

    async def _exchange(self, client, r: Request, seen: Seen) -> None:
        """Send ``r``, read its answer and stream into ``seen``; every failure is recorded."""
        import httpx
        from httpx_sse import EventSource, SSEError

        body, headers = to_wire(r, self.opts.wire)
        seen.sent_s = self.now_s()
        try:
            async with client.stream("POST", self.completions, json=body, headers=headers) as resp:
                seen.answered_s, seen.http_status = self.now_s(), resp.status_code
                if resp.status_code != 200:
                    await self._refused(resp, seen)
                    return
                kind = resp.headers.get("content-type", "")
                if not kind.startswith("text/event-stream"):
                    seen.fail("bad_stream", f"HTTP 200 with content-type {kind or 'none'!r}, not text/event-stream "
                              "(was stream: true ignored?)")
                    return
                finish, done = None, False
                async for event in EventSource(resp).aiter_sse():
                    if event.data == "[DONE]":
                        done = True
                        break
                    if not event.data and event.event == "message":
                        continue
                    try:
                        n, reason = read_chunk(event.data)
                    except WireError as e:
                        self._stream_error(seen, str(e), event.data)
                        return
                    seen.got(n, self.now_s())
                    finish = reason or finish
                if done or finish is not None:
                    seen.outcome = "finished"
                    if seen.finish_s is None:
                        seen.finish_s = self.now_s()
                else:
                    seen.fail("connection", f"the stream ended after {seen.tokens} tokens without [DONE]")
        except httpx.TimeoutException:
            seen.fail("timeout", f"no answer or token for {self.opts.timeout_s:g} s (--timeout-s) after "
                      f"{seen.tokens} tokens")
        except SSEError as e:
            seen.fail("bad_stream", f"not a server-sent event stream: {e}")
        except httpx.HTTPError as e:
            seen.fail("connection", f"{type(e).__name__}: {_why(e)} (after {seen.tokens} tokens)")

    async def _refused(self, resp, seen: Seen) -> None:
        """A status other than 200: ``rejected`` with the model's reason when the body names
        one, else ``refused`` (429, 503) or ``http_error``; its body and retry-after kept."""
        raw = b""
        async for part in resp.aiter_bytes():
            raw += part
            if len(raw) >= MAX_BODY_BYTES:
                break
        text = raw[:MAX_BODY_BYTES].decode("utf-8", errors="replace")
        reason, retry = refusal_reason(text)
        if reason is None:
            reason = "refused" if resp.status_code in (429, 503) else "http_error"
        if retry is None:
            retry = _retry_after(resp.headers.get("retry-after"), self.opts.time_scale)
        seen.outcome, seen.reason, seen.retry_after_s = "rejected", reason, retry
        seen.finish_s = self.now_s()
        seen.detail = (" ".join(text.split()) or f"HTTP {resp.status_code} with an empty body")[:DETAIL_CHARS]

    def _stream_error(self, seen: Seen, why: str, data: str) -> None:
        """An event that is not a chunk: an error the server sent (``rejected`` with the model's
        reason when it names one, else ``server_error``) or bad text (``bad_stream``)."""
        reason, retry = refusal_reason(data)
        if reason is not None:
            seen.outcome, seen.reason, seen.retry_after_s = "rejected", reason, retry
            seen.finish_s = self.now_s()
            seen.detail = data[:DETAIL_CHARS]
        elif why.startswith("the server sent an error"):
            seen.fail("server_error", why)
        else:
            seen.fail("bad_stream", why)


def _retry_after(text: str | None, scale: float) -> float | None:
    """A ``Retry-After`` header in delay seconds, as workload seconds; None when absent or a date."""
    try:
        s = float(text) if text is not None else None
    except ValueError:
        return None
    return s * scale if s is not None and math.isfinite(s) and s >= 0 else None


def check_options(opts: ReplayOptions) -> None:
    """Refuse options no replay can run with.

    Raises:
        ConfigError: naming the option and its value."""
    if not (math.isfinite(opts.time_scale) and opts.time_scale > 0):
        raise ConfigError("--time-scale", opts.time_scale, "must be a positive number")
    if opts.max_in_flight < 1:
        raise ConfigError("--max-in-flight", opts.max_in_flight, "must be at least 1")
    if not opts.timeout_s > 0:
        raise ConfigError("--timeout-s", opts.timeout_s, "must be > 0")


def run_replay(workload: Workload | Iterable[Request], opts: ReplayOptions, *,
               on_end: Callable[[Request, Seen], None] | None = None,
               stop: Callable[[], bool] | None = None) -> Replay:
    """Run :meth:`Replay.run` to its end on a fresh event loop (the caller asked the server its
    model first: :func:`preflight`); returns the replay with what it saw.

    Raises:
        MissingExtra: without httpx / httpx-sse.
    """
    rep = Replay(workload, opts, on_end=on_end, stop=stop)
    asyncio.run(rep.run())
    return rep


@contextmanager
def signals_stop() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM only ask the replay to stop: the handler in
    force runs (the command line's records the signal and sets
    :data:`~tenantry.adversaries.outdir.STOP_REQUESTED`) but its KeyboardInterrupt is held
    back, so the event loop is not cut mid-way; :meth:`Replay.run` sees the request within
    :data:`POLL_S` and ends, keeping what it recorded.  Main thread only (elsewhere a no-op)."""
    import signal
    import threading

    from tenantry.adversaries.outdir import STOP_REQUESTED

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum, frame):
        h = old[signum]
        try:
            if callable(h):
                h(signum, frame)
        except KeyboardInterrupt:
            pass
        STOP_REQUESTED.set()

    for s in old:
        signal.signal(s, on_signal)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def header_of(rep: Replay, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A live recording's header (SPEC.md 12.2): ``live`` (the URL, the time scale, the identity
    fields sent, priority and cache salt, the wire mapping's block size, vocabulary and prompt
    seed, the client's limits, its largest lag, ``stopped``), ``end_s`` and ``requests``."""
    o, w = rep.opts, rep.opts.wire
    sent = ["user"] + ([FAIRNESS_HEADER] if w.fairness_header else []) + (
        [w.tenant_header.lower()] if w.tenant_header else [])
    live = {"url": o.url, "model": w.model, "time_scale": o.time_scale, "identity": sent,
            "priority": "tier" if w.tiers is not None else None,
            "cache_salt": "tenant" if w.salts is not None else None,
            "block_size_tokens": w.block_size_tokens, "vocab": [w.vocab_lo, w.vocab_hi], "prompt_seed": w.prompt_seed,
            "max_in_flight": o.max_in_flight, "timeout_s": o.timeout_s, "horizon_s": o.horizon_s,
            "max_send_lag_s": round(rep.max_lag_s, 6), "stopped": rep.stopped}
    return {**(extra or {}), "live": live, "end_s": round(rep.end_s or 0.0, 6), "requests": len(rep.requests)}


__all__ = ["LiveError", "MissingExtra", "Replay", "ReplayOptions", "check_options", "endpoints", "header_of",
           "preflight", "run_replay", "signals_stop"]
