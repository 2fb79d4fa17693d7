"""Hypothesis profiles: ``default`` (fast, for CI) and ``deep`` (long runs).

Select with ``pytest --hypothesis-profile=deep`` or ``HYPOTHESIS_PROFILE=deep``.
The example database lives in ``.hypothesis/`` at the repository root (or in
``$TENANTRY_HYPOTHESIS_DB``), a plain directory that can be copied between machines.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_db = DirectoryBasedExampleDatabase(
    os.environ.get("TENANTRY_HYPOTHESIS_DB", str(Path(__file__).resolve().parents[1] / ".hypothesis" / "examples"))
)
settings.register_profile(
    "default", max_examples=40, deadline=None, database=_db,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep", max_examples=2000, deadline=None, database=_db,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parents[1]
#: ../shared beside the repository (read-only inputs; tests that need them skip without them).
SHARED = REPO.parent / "shared"
SHARED_TRACES = SHARED / "traces"
#: The documents the project started from (seed programs are extracted from them at test time).
SHARED_SEEDS = SHARED / "seeds"


# --- helpers of the hostile-use tests (tests/test_hostile*.py, tests/test_resume.py) -----------

def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root: (kind, bytes, mtime_ns) for files, (kind, target) for links, kind for folders."""
    out: dict[str, tuple] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_dir():
            out[rel] = ("dir",)
        else:
            out[rel] = ("file", p.read_bytes(), p.stat().st_mtime_ns)
    return out


def fake_report(folder: Path, kind: str, size: int, files=("report.md",)) -> Path:
    """A folder that looks like a tenantry report of ``kind`` and ``size`` (marker and files)."""
    folder.mkdir(parents=True)
    for f in files:
        (folder / f).write_text("old report\n")
    (folder / ".tenantry-report").write_text(json.dumps(
        {"tool": "tenantry", "kind": kind, "size": size, "unit": "cell", "files": sorted(files)}))
    return folder


def tenantry_process(args, cwd, **kw) -> subprocess.Popen:
    """The console script (``python -m tenantry.cli ARGS``) in a subprocess of its own session."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.Popen([sys.executable, "-m", "tenantry.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kw)


def wait_for(cond, within_s: float = 60.0, poll_s: float = 0.05) -> None:
    """Poll ``cond()`` until it is true; fail after ``within_s``."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < within_s, "the run never got going"
        time.sleep(poll_s)


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (from /proc; [] when it has none or is gone)."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether process ``pid`` ends (or is a zombie) within ``within_s`` seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True  # a zombie waiting for its (new) parent: it has stopped
        time.sleep(0.05)
    return False


# A real vLLM server for live tests (tests/vllm_server.py): the session fixture
# `vllm_server`; every test using it is marked `vllm_server`, and the files
# named *vllm_server* run on one pytest-xdist worker (below): one server per run.
import pytest  # noqa: E402
from vllm_server import mark_live_items, vllm_server  # noqa: E402,F401


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm_server: uses the real vLLM server (tests/vllm_server.py)")


@pytest.hookimpl(tryfirst=True)  # before -m selects and pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark the tests that use the ``vllm_server`` fixture (see tests/vllm_server.py)."""
    mark_live_items(items)


try:  # pytest-xdist (the test extra): keep the real server's tests on one worker, the rest spread as usual
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pragma: no cover - running without xdist
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:
    class _OneServerWorker(LoadScopeScheduling):
        """Every test of a ``*vllm_server*`` file is one scope (one worker, so one server start per
        run); every other test is a scope of its own, spread over the workers as ``--dist load`` does.
        (``--dist loadgroup`` would do this by mark, but does not group under pytest 9.2.)"""

        def _split_scope(self, nodeid: str) -> str:
            return "vllm_server" if "vllm_server" in nodeid.split("::", 1)[0] else nodeid

    def pytest_xdist_make_scheduler(config, log):
        return _OneServerWorker(config, log)
