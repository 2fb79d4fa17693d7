"""Helpers of the live tests: ``tenantry serve`` as a subprocess, and tiny throwaway HTTP
servers for what serve cannot play (a stall, bad bytes, a 500).  Everything binds
127.0.0.1 only, on a port the kernel picks."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator
from conftest import REPO

REPO = str(REPO)


def tenantry(*args: str, **kw) -> subprocess.Popen:
    """``python -m tenantry.cli ARGS`` as a subprocess (stderr piped, text)."""
    return subprocess.Popen([sys.executable, "-m", "tenantry.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


@contextmanager
def serving(*args: str, timeout_s: float = 30.0) -> Iterator[tuple[str, dict]]:
    """Run ``tenantry serve --port 0 ARGS``; yield (its URL, a dict that gets ``stderr`` and
    ``returncode`` once it stopped).  Stopped with SIGINT at the end (killed if it does not stop
    within 5 s: a test then fails on ``returncode``)."""
    p = tenantry("serve", "--host", "127.0.0.1", "--port", "0", *args)
    out: dict = {}
    try:
        deadline = time.monotonic() + timeout_s
        line = ""
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line or "http://" in line:
                break
        m = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not m:
            p.kill()
            raise AssertionError(f"tenantry serve did not start: {line!r} {p.stderr.read()!r}")
        out["banner"] = line
        yield m.group(0), out
    finally:
        if p.poll() is None:
            t = time.monotonic()
            p.send_signal(signal.SIGINT)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            out["stop_s"] = time.monotonic() - t
        out["stderr"] = p.stderr.read()
        out["returncode"] = p.returncode


MODELS = json.dumps({"object": "list", "data": [{"id": "canned", "object": "model"}]}).encode()


class Canned:
    """A throwaway HTTP/1.1 server on 127.0.0.1: ``GET /v1/models`` lists one model; every
    ``POST`` is answered by ``respond(conn, body)``, which writes raw bytes to the socket (and
    may wait on :attr:`release`, set when the server closes).  Connections are closed after
    each answer."""

    def __init__(self, respond: Callable[[socket.socket, bytes], None]) -> None:
        self.respond = respond
        self.release = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.posts = 0
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.release.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                part = conn.recv(65536)
                if not part:
                    return
                data += part
            head, _, body = data.partition(b"\r\n\r\n")
            n = int(next((l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")),
                         b"0"))
            while len(body) < n:
                body += conn.recv(65536)
            if head.startswith(b"GET /v1/models"):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(MODELS)).encode() + b"\r\nconnection: close\r\n\r\n" + MODELS)
            else:
                self.posts += 1
                self.respond(conn, body)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.release.set()
        self.sock.close()
        for t in self.threads:
            t.join(5)


def sse_head(extra: bytes = b"") -> bytes:
    """The head of a close-delimited event stream answer."""
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n" + extra + b"\r\n"


def event(tokens: int, finish: str | None = None) -> bytes:
    """One completion chunk with ``tokens`` token ids."""
    obj = {"choices": [{"index": 0, "text": "", "finish_reason": finish, "token_ids": list(range(1000, 1000 + tokens))}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def answer(status: str, body: bytes, headers: bytes = b"") -> bytes:
    """A whole answer with a JSON body."""
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n").encode() + headers + b"\r\n" + body
