"""The searches on Ray and on Dask give the same matrix as on the process pool (issue 13).

A local Ray instance of 2 CPUs, and a local Dask cluster of 2 worker
processes, each run a tiny matrix; ``matrix.json`` must be the same bytes as
the process pool's with the same seed, and terminating the executor (what
Ctrl-C does) stops a running task and the local cluster within seconds.
Each is skipped when its library is not installed (``pip install -e
'.[ray,dask]'``; CI installs both).
"""

from __future__ import annotations

import argparse
import shutil
import time

import pytest

from tenantry.adversaries.check import run_check
from tenantry.adversaries.evaluate import DaskExecutor, RayExecutor, make_executor, terminate_executor
from tenantry.adversaries.search import Budget
from tenantry.model.config import ConfigError

TINY = dict(setups=["fcfs", "vtc"], patterns=["flood"], seed=3, budget=Budget(4), searches=("random", "evolution"),
            shrink_evaluations=2, plots="none", extras=False, progress=False)


def _matrix(out, **kw) -> bytes:
    run_check(out=out, **TINY, **kw)
    data = (out / "matrix.json").read_bytes()
    shutil.rmtree(out)
    return data


def test_ray_gives_the_process_pools_matrix_bytes_and_stops_within_seconds(tmp_path):
    """One local Ray instance (2 CPUs): the same matrix.json bytes as the process pool;
    then Ctrl-C's path: terminating cancels a running task and stops the instance it started."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray instance is already running in this process")
    out = tmp_path / "rep"
    on_pool = _matrix(out, workers=2)
    ex = make_executor(2, "ray")
    try:
        assert isinstance(ex, RayExecutor) and ray.is_initialized() and ex.slots == 2
        on_ray = _matrix(out, executor=ex)
        assert on_ray == on_pool
        slow = ex.submit(time.sleep, 60)
        t0 = time.monotonic()
    finally:
        terminate_executor(ex)
    assert time.monotonic() - t0 < 15
    assert not ray.is_initialized()
    with pytest.raises(BaseException):
        slow.result(timeout=5)


def test_dask_gives_the_process_pools_matrix_bytes_and_stops_within_seconds(tmp_path):
    """One local Dask cluster (2 worker processes): the same matrix.json bytes as the
    process pool; terminating cancels a running task and closes the cluster."""
    pytest.importorskip("distributed")
    out = tmp_path / "rep"
    on_pool = _matrix(out, workers=2)
    ex = make_executor(2, "dask")
    try:
        assert isinstance(ex, DaskExecutor) and ex.slots == 2
        on_dask = _matrix(out, executor=ex)
        assert on_dask == on_pool
        slow = ex.submit(time.sleep, 60)
        time.sleep(0.5)
        t0 = time.monotonic()
    finally:
        terminate_executor(ex)
    assert time.monotonic() - t0 < 15
    assert ex._cluster is None and ex._client.status == "closed"
    with pytest.raises(BaseException):
        slow.result(timeout=5)


def test_an_unreachable_dask_scheduler_is_a_one_line_error():
    pytest.importorskip("distributed")
    with pytest.raises(ConfigError, match="dask:tcp://127.0.0.1:9"):
        make_executor(1, "dask:tcp://127.0.0.1:9")


def test_the_executor_flag_is_checked_before_any_work():
    from tenantry.cli.commands.args import executor

    assert executor("process") == "process"
    for bad in ("dask:", "ray:", "threads", "daskx"):
        with pytest.raises(argparse.ArgumentTypeError):
            executor(bad)
    with pytest.raises(ConfigError):
        make_executor(1, "spark:1.2.3.4")


def test_no_progress_bar_starts_before_the_executor_is_up(tmp_path, monkeypatch, capsys):
    """An executor that cannot start (an unreachable cluster) is the one line of its error: no
    '0%' bar drawn before it and closed after it, and no report folder left behind."""
    from tenantry.adversaries import evaluate

    def unreachable(workers, kind):
        raise ConfigError("--executor", kind, "cannot reach the Dask scheduler")

    monkeypatch.setattr(evaluate, "make_executor", unreachable)
    with pytest.raises(ConfigError, match="cannot reach"):
        run_check(out=tmp_path / "r", **{**TINY, "progress": True}, executor_kind="dask:tcp://127.0.0.1:9")
    err = capsys.readouterr().err
    assert "0%" not in err and "cell/s" not in err, err
    assert not (tmp_path / "r").exists()
