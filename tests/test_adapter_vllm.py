"""vLLM's real scheduler in step mode (spec/adapter_vllm.py over spec/vllm_adapter.py).

Skipped, with the reason, where vLLM 0.33 is not installed (scripts/install_vllm.sh).
"""

import json

import pytest

try:
    from tenantry.verify.vllm import vllm_available
except ImportError as e:  # the vLLM driver module itself is absent
    _OK, _WHY = False, f"tenantry.verify.vllm does not import ({e})"
else:
    _OK, _WHY = vllm_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"vLLM scheduler unavailable: {_WHY}")


def test_verify_target_on_vllm_runs_end_to_end(tmp_path):
    from tenantry.cli import main

    code = main(["verify", "--target", "tenantry.verify.vllm:make_fcfs", "--patterns", "flood",
                 "--out", str(tmp_path)])
    rep = json.loads((tmp_path / "report.json").read_text())
    (cell,) = rep["cells"]
    assert code == 0 and cell["findings"] == []
    assert rep["describe"].startswith("vllm 0.33")
    # vLLM promises no tenant fairness: under a flood, FCFS order makes the light tenant wait.
    assert cell["metrics"]["ttft_p99_inflation[chat]"] > 20
    assert cell["stats"]["steps"] > 100


def test_cache_salt_isolation_seen_from_outside():
    from tenantry.model.workload import Request, Workload
    from tenantry.verify import vllm as av
    from tenantry.verify.run import verify_workload

    prefix = tuple(range(1000, 1016))
    wl = Workload(tuple(Request(i, "a", 0.1 * i, 400, 4, prefix) for i in range(3))
                  + tuple(Request(3 + i, "b", 1.0 + 0.1 * i, 400, 4, prefix) for i in range(3)))
    shared = verify_workload(av.make_shared_cache, wl, timeout_s=None)
    salted = verify_workload(av.make_salted_cache, wl, timeout_s=None)
    assert shared.ok and salted.ok, (shared.render(), salted.render())
    assert "SALT-ISOLATION" in salted.claimed
    assert shared.stats["cross_tenant_hit_blocks"] >= 3 * 16  # b reuses a's 16 prefix blocks
    assert salted.stats["cross_tenant_hit_blocks"] == 0
    assert salted.stats["cache_hit_blocks"] > 0  # each tenant still hits its own prefix


def test_thrash_on_small_pool_preempts_and_keeps_kv_invariants():
    from tenantry.verify import vllm as av
    from tenantry.verify.matrix import run_cell

    c = run_cell(av.make_fcfs_small, "eviction_thrash", timeout_s=None)
    assert c.verdict.ok, c.verdict.render()
    assert c.verdict.stats["preemptions"] > 0
    assert c.metrics["wasted_prefill_tokens"] > 0
