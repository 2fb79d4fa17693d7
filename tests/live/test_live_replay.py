"""``tenantry replay`` against servers that misbehave (tiny throwaway servers on 127.0.0.1):
each case ends in one clear line or in the request's recorded outcome, never a hang or a
traceback; Ctrl-C keeps what was recorded."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from tenantry.cli import main
from tenantry.model.workload import Request, Workload
from tenantry.runner.history import read_history
from tenantry.runner.traces import write_workload_jsonl

from live_helpers import Canned, answer, event, sse_head, tenantry

pytest.importorskip("httpx")
pytest.importorskip("httpx_sse")


@pytest.fixture
def canned():
    servers = []

    def make(respond):
        s = Canned(respond)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def _workload(tmp_path, n=1, output=4, gap_s=0.0):
    p = tmp_path / "w.jsonl"
    write_workload_jsonl(Workload(tuple(Request(i, "ab"[i % 2], gap_s * i, 20, output) for i in range(n))), p)
    return p


def _replay(url, wl, tmp_path, *extra):
    h = tmp_path / "h.jsonl"
    code = main(["replay", url, "--workload", str(wl), "--history", str(h), *extra])
    return code, read_history(h)


def test_a_bad_url_is_one_line(tmp_path, capsys):
    code = main(["replay", "ftp://127.0.0.1/x", "--workload", str(_workload(tmp_path))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["tenantry: error: 'ftp://127.0.0.1/x' is not an http:// or https:// URL with a host "
                                 "(e.g. http://127.0.0.1:8000)"]


def test_a_refused_connection_at_the_start_is_one_line(tmp_path, capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    h = tmp_path / "h.jsonl"
    code = main(["replay", f"http://127.0.0.1:{port}", "--workload", str(_workload(tmp_path)), "--history", str(h)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"tenantry: error: cannot reach http://127.0.0.1:{port}/v1/models: ")
    assert "refused" in err[0].lower() and not h.exists()


def test_a_stream_that_stalls_is_recorded_as_timed_out(tmp_path, canned):
    """Two tokens, then nothing: after --timeout-s the request is given up (``timeout``, its two
    tokens kept), the connection closed, and the run goes on."""
    def respond(conn, body):
        conn.sendall(sse_head() + event(1) + event(1))
        srv.release.wait(10)

    srv = canned(respond)
    t = time.monotonic()
    code, h = _replay(srv.url, _workload(tmp_path), tmp_path, "--timeout-s", "0.5")
    assert time.monotonic() - t < 5
    r = h.requests[0]
    assert code == 0
    assert (r.outcome, r.failure, r.tokens_generated, r.http_status) == ("unfinished", "timeout", 2, 200)
    assert len(r.token_times) == 2 and r.finish_s is None
    assert "no answer or token for 0.5 s" in r.detail


@pytest.mark.parametrize("reply, failure, detail", [
    (sse_head() + event(1) + b"data: {nope\n\n", "bad_stream", "bad JSON in a streamed event"),
    (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\nhello", "bad_stream",
     "content-type 'text/plain', not text/event-stream"),
    (sse_head() + event(1), "connection", "the stream ended after 1 tokens without [DONE]"),
    (sse_head() + b'data: {"error": {"message": "engine died", "code": 500}}\n\n', "server_error", "engine died"),
])
def test_a_broken_stream_is_a_recorded_failure(tmp_path, canned, reply, failure, detail):
    srv = canned(lambda conn, body: conn.sendall(reply))
    code, h = _replay(srv.url, _workload(tmp_path), tmp_path)
    r = h.requests[0]
    assert code == 0 and (r.outcome, r.failure) == ("unfinished", failure) and detail in r.detail


def test_refusals_keep_their_status_body_and_retry_after(tmp_path, canned):
    """A 429 with Retry-After (wall seconds: times the time scale in the history) and a 500, each
    recorded as refused with its status and body; the finished one next to them is finished."""
    def respond(conn, body):
        user = json.loads(body)["user"]
        if user == "a":
            conn.sendall(answer("429 Too Many Requests", b'{"error": {"message": "slow down"}}', b"retry-after: 2\r\n"))
        elif json.loads(body)["max_tokens"] == 4:
            conn.sendall(answer("500 Internal Server Error", b"<html>oops</html>"))
        else:
            conn.sendall(sse_head() + event(1) + event(1, "length") + b"data: [DONE]\n\n")

    srv = canned(respond)
    p = tmp_path / "w.jsonl"
    write_workload_jsonl(Workload((Request(0, "a", 0.0, 20, 4), Request(1, "b", 0.0, 20, 4),
                                   Request(2, "b", 0.1, 20, 2))), p)
    code, h = _replay(srv.url, p, tmp_path, "--time-scale", "2")
    a, b, ok = h.requests
    assert code == 0
    assert (a.outcome, a.reason, a.http_status, a.retry_after_s) == ("rejected", "refused", 429, 4.0)
    assert a.detail == '{"error": {"message": "slow down"}}'
    assert (b.outcome, b.reason, b.http_status, b.detail) == ("rejected", "http_error", 500, "<html>oops</html>")
    assert (ok.outcome, ok.tokens_generated, ok.failure) == ("finished", 2, None)
    assert h.header["live"]["time_scale"] == 2.0 and h.header["live"]["identity"] == [
        "user", "x-gateway-inference-fairness-id"]


def test_only_the_url_given_is_contacted(tmp_path, canned, monkeypatch):
    """A proxy in the environment is not used: every request reaches the URL given."""
    proxy = canned(lambda conn, body: conn.sendall(answer("502 Bad Gateway", b"proxy")))
    srv = canned(lambda conn, body: conn.sendall(sse_head() + event(4, "length") + b"data: [DONE]\n\n"))
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    code, h = _replay(srv.url, _workload(tmp_path, n=3), tmp_path)
    assert code == 0 and [r.outcome for r in h.requests] == ["finished"] * 3
    assert proxy.posts == 0 and srv.posts == 3


def test_the_history_never_replaces_a_file_that_is_not_one(tmp_path, canned, capsys):
    srv = canned(lambda conn, body: None)
    mine = tmp_path / "notes.txt"
    mine.write_text("mine\n")
    code = main(["replay", srv.url, "--workload", str(_workload(tmp_path)), "--history", str(mine)])
    assert code == 2 and mine.read_text() == "mine\n" and srv.posts == 0
    assert "exists and is not a tenantry history" in capsys.readouterr().err


def test_without_the_http_libraries_the_commands_say_what_to_install(tmp_path, capsys, monkeypatch):
    import tenantry.live as live

    def missing():
        raise live.MissingExtra("no")

    monkeypatch.setattr(live, "require_extra", missing)
    for argv in (["replay", "http://127.0.0.1:9", "--workload", str(_workload(tmp_path))], ["serve"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"tenantry {argv[0]}: the HTTP libraries are not installed: pip install 'tenantry[live]'"]


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_stop_keeps_what_was_recorded(tmp_path, canned, sig, code, word):
    """Ctrl-C (or SIGTERM) in the middle: the command ends within 2 s, writes the history with
    every request (those not ended unfinished, their tokens so far kept) and says so in one line."""
    def respond(conn, body):
        conn.sendall(sse_head())
        for _ in range(50):
            if srv.release.wait(0.1):
                return
            conn.sendall(event(1))

    srv = canned(respond)
    wl, h = _workload(tmp_path, n=6, output=50, gap_s=0.3), tmp_path / "h.jsonl"
    p = tenantry("replay", srv.url, "--workload", str(wl), "--history", str(h), env={**os.environ, "NO_COLOR": "1"})
    deadline = time.monotonic() + 20
    while srv.posts < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    t = time.time()
    p.send_signal(sig)
    p.wait(10)
    err = p.stderr.read().strip().splitlines()
    # stopped, the history written, within 2 s (its modification time: the kernel's clock, not a
    # busy reader's; measured 0.04 s, 0.1 s beside three busy processes); the interpreter's exit
    # after it is the same for every command (some 0.5 s once every command module is imported)
    assert p.returncode == code and h.stat().st_mtime - t < 2.0, (h.stat().st_mtime - t, err)
    assert err[-1].startswith(f"tenantry: {word} after 0 of 6 requests ended; kept: history {h}")
    assert not any("Traceback" in line for line in err)
    hist = read_history(h)
    assert len(hist.requests) == 6 and hist.header["live"]["stopped"] == "interrupted"
    sent = [r for r in hist.requests if r.sent_s is not None]
    assert len(sent) >= 3 and all(r.outcome == "unfinished" for r in hist.requests)
    assert all(r.tokens_generated > 0 and len(r.token_times) == r.tokens_generated for r in sent[:2])
