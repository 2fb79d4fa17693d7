"""Hypothesis profiles: ``default`` (fast, for CI) and ``deep`` (long runs).

Select with ``pytest --hypothesis-profile=deep`` or ``HYPOTHESIS_PROFILE=deep``.
The example database lives in ``.hypothesis/`` at the repository root (or in
``$TENANTRY_HYPOTHESIS_DB``), a plain directory that can be copied between machines.
"""

import os
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

# A real vLLM server for live tests (tests/vllm_server.py): the session fixture
# `vllm_server`; every test using it is marked `vllm_server`, and .ci/run runs
# those in a pytest run of their own without xdist (one server at a time).
import pytest  # noqa: E402
from vllm_server import mark_live_items, vllm_server  # noqa: E402,F401


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm_server: uses the real vLLM server (tests/vllm_server.py)")


@pytest.hookimpl(tryfirst=True)  # before -m selects and pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark the tests that use the ``vllm_server`` fixture (see tests/vllm_server.py)."""
    mark_live_items(items)
