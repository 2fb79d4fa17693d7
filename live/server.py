"""``tenantry serve``'s HTTP side: an OpenAI-compatible API over the :class:`~.engine.Engine`.

Routes: ``GET /health`` (200), ``GET /v1/models`` (the one model), ``POST /v1/completions``
(the request read back by :func:`tenantry.live.wire.from_wire`; 400 with one line for a body
that does not follow the mapping or names an unknown tenant; 429 with the model's reason and a
``Retry-After`` header when the model refuses it; else 200 and a server-sent event stream of
one chunk per step that produced a token, ``data: [DONE]`` after the last).  With
``"stream": false`` the answer is one JSON object once the request finished.  A client that
disconnects is a cancellation (:meth:`~.engine.Engine.disconnect`).

A plain ASGI application (no framework): three routes, and the client's disconnect is
watched on the request's own ``receive`` channel from the moment its body was read, whatever
ASGI version the server speaks.  Served by uvicorn on a socket the command binds.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from .engine import Engine
from .wire import WireError, WireOptions, chunk, from_wire, output_token_ids, refusal, request_id_of

#: Largest request body read (bytes): a longer one is refused with 413.
MAX_BODY_BYTES = 64 << 20


async def _send_json(send, status: int, obj: Any, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class App:
    """The ASGI application of ``tenantry serve``.

    Args:
        engine: the model in scaled real time.
        opts: the wire mapping's options (block size and vocabulary must be the client's).
        model: the name ``/v1/models`` lists.
    """

    def __init__(self, engine: Engine, opts: WireOptions, model: str = "tenantry") -> None:
        self.engine, self.opts, self.model = engine, opts, model

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"].rstrip("/") or "/", scope["method"]
        if path == "/health" and method == "GET":
            await _send_json(send, 200, {})
        elif path == "/v1/models" and method == "GET":
            await _send_json(send, 200, {"object": "list", "data": [{
                "id": self.model, "object": "model", "owned_by": "tenantry",
                "max_model_len": self.engine.config.max_context_tokens}]})
        elif path == "/v1/completions" and method == "POST":
            await self.completions(scope, receive, send)
        elif path in ("/health", "/v1/models", "/v1/completions"):
            await _send_json(send, 405, refusal(405, f"{method} is not served on {path}"))
        else:
            await _send_json(send, 404, refusal(404, f"no route {path} (served: /health, /v1/models, "
                                                     "/v1/completions)"))

    async def completions(self, scope, receive, send) -> None:
        raw, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            raw += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(raw) > MAX_BODY_BYTES:
                await _send_json(send, 413, refusal(413, f"body larger than {MAX_BODY_BYTES >> 20} MiB"))
                return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body = json.loads(raw)
        except ValueError:
            await _send_json(send, 400, refusal(400, "the body is not JSON"))
            return
        try:
            stream = self.engine.submit(
                lambda rid, t: from_wire(body, headers, self.opts, request_id=rid, arrival_s=t),
                request_id_of(headers))
        except WireError as e:
            await _send_json(send, 400, refusal(400, str(e)))
            return
        rid = stream.request.request_id
        gone = asyncio.Event()

        async def watch() -> None:  # the client's disconnect, whenever it comes
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            self.engine.disconnect(rid)
            stream.end()

        watcher = asyncio.create_task(watch())
        try:
            await self._answer(stream, body, send, gone)
        finally:
            watcher.cancel()

    async def _answer(self, stream, body: dict, send, gone: asyncio.Event) -> None:
        wait_gone = asyncio.ensure_future(gone.wait())
        try:
            await asyncio.wait({stream.answer, wait_gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wait_gone.cancel()
        if gone.is_set():
            return
        answer = stream.answer.result()
        if answer is not None:
            reason, retry = answer
            if reason == "stopping":
                await _send_json(send, 503, refusal(503, "the server is stopping"))
                return
            hdrs = [(b"retry-after", str(max(1, math.ceil(retry / self.engine.scale))).encode())] \
                if retry is not None else []
            await _send_json(send, 429, refusal(429, f"refused by the model: {reason}", reason, retry), hdrs)
            return
        if body.get("stream") is True:
            await self._stream(stream, send)
        else:
            await self._whole(stream, send)

    async def _items(self, stream):
        """(tokens, finish_reason) items until the end; ("error", reason) or None last."""
        while True:
            item = await stream.items.get()
            yield item
            if item is None or item[0] == "error" or item[1] is not None:
                return

    async def _stream(self, stream, send) -> None:
        r, created, done = stream.request, int(time.time()), 0
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        async for item in self._items(stream):
            if item is None:
                break
            if item[0] == "error":
                err = refusal(429, f"refused by the model: {item[1]}", item[1])
                await send({"type": "http.response.body", "body": f"data: {json.dumps(err)}\n\n".encode(),
                            "more_body": True})
                break
            n, finish = item
            text = chunk(r.request_id, self.model, created, output_token_ids(r.request_id, done, n, self.opts), finish)
            done += n
            tail = "data: [DONE]\n\n" if finish is not None else ""
            await send({"type": "http.response.body", "body": f"data: {text}\n\n{tail}".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _whole(self, stream, send) -> None:
        r, n, finish = stream.request, 0, None
        async for item in self._items(stream):
            if item is None:
                await _send_json(send, 503, refusal(503, "the server is stopping"))
                return
            if item[0] == "error":
                await _send_json(send, 429, refusal(429, f"refused by the model: {item[1]}", item[1]))
                return
            n += item[0]
            finish = item[1] or finish
        await _send_json(send, 200, {
            "id": f"cmpl-{r.request_id}", "object": "text_completion", "created": int(time.time()),
            "model": self.model, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish,
                                              "token_ids": output_token_ids(r.request_id, 0, n, self.opts)}],
            "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": n,
                      "total_tokens": r.prompt_tokens + n}})


def bind(host: str, port: int):
    """A listening TCP socket on ``host:port`` (port 0: any free port).

    Raises:
        OSError: when the address cannot be bound (in use, not this machine's)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


async def serve(app: App, sock, on_ready=None) -> None:
    """Serve ``app`` on ``sock`` until SIGINT / SIGTERM (uvicorn's handlers: it stops accepting,
    the engine ends every stream, open connections get 1 s to finish); the engine runs on the
    same event loop.  ``on_ready()`` is called once the server listens."""
    import uvicorn

    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                            timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    engine = app.engine
    task = asyncio.create_task(engine.run())

    async def watch() -> None:
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.02)
        if server.started and on_ready is not None:
            on_ready()
        while not server.should_exit:
            await asyncio.sleep(0.05)
        engine.stop()

    watcher = asyncio.create_task(watch())
    try:
        await server.serve(sockets=[sock])
    finally:
        engine.stop()
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
