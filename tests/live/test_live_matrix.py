"""``tenantry replay URL --matrix``: the abuse matrix of a live endpoint (tenantry check's matrix
code with a live server as the system), against ``tenantry serve`` on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from live_helpers import serving

pytest.importorskip("httpx")
pytest.importorskip("httpx_sse")
pytest.importorskip("uvicorn")


def _tenantry(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tenantry.cli", *args], capture_output=True, text=True, timeout=300)


def test_the_matrix_of_a_fcfs_server_shows_the_queue_stuffing_hurt(tmp_path):
    """queue_stuffing's default workload and the worst one searched on the model's fcfs setup, one
    after the other against serve running FCFS: the victims are hurt; the report folder has the
    cell with its workload and the command that replays it against the URL."""
    with serving("--policy", "fcfs", "--time-scale", "2") as (url, _):
        r = _tenantry("replay", url, "--matrix", "--patterns", "queue_stuffing", "--policy", "fcfs", "--time-scale",
                      "2", "--out", str(tmp_path / "m"))
        assert r.returncode == 0, r.stderr[-2000:]
        s = _tenantry("replay", url, "--matrix", "--patterns", "queue_stuffing", "--policy", "fcfs", "--time-scale",
                      "2", "--searched-on", "fcfs", "--budget", "4", "--workers", "1", "--out", str(tmp_path / "s"))
        assert s.returncode == 0, s.stderr[-2000:]
    row = next(line for line in r.stdout.splitlines() if line.startswith("queue_stuffing"))
    cell = json.loads((tmp_path / "m" / "matrix.json").read_text())["cells"][0]
    # FCFS serves the 100-request batches first: measured 54-90x; 5x is clearly hurt on a loaded machine too
    assert cell["score"] > 5 and cell["finding"] == (cell["score"] >= 20) and cell["search"] is None, cell["score"]
    assert "ttft_p99_inflation" in row and (" hurt " in row) == cell["finding"]
    assert cell["replay"].startswith(f"tenantry replay {url} --workload cells/")
    assert (tmp_path / "m" / cell["workload"]).is_file() and (tmp_path / "m" / "report.md").is_file()
    searched = json.loads((tmp_path / "s" / "matrix.json").read_text())["cells"][0]
    assert searched["searched_on"] == "fcfs" and searched["search"] in ("random", "evolution", "hypothesis")
    assert searched["evaluations"] >= 1 and searched["score"] > 5


@pytest.mark.parametrize("args, why", [
    (["--patterns", "sybil"], "--patterns='sybil': its objective contended_share reads the server's step records"),
    (["--budget", "4"], "--budget='4': applies to --searched-on"),
    (["--pattern", "flood"], "--pattern='flood': does not apply to --matrix"),
])
def test_matrix_options_that_cannot_run_are_one_line(args, why):
    r = _tenantry("replay", "http://127.0.0.1:9", "--matrix", *args)
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_matrix_flags_without_matrix_are_one_line():
    r = _tenantry("replay", "http://127.0.0.1:9", "--pattern", "flood", "--out", "x")
    assert r.returncode == 2 and "--out='x': applies to --matrix only" in r.stderr, r.stderr
