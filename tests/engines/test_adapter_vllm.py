"""vLLM's real scheduler in step mode (spec/adapter_vllm.py over spec/vllm_adapter.py).

Skipped, with the reason, where vLLM 0.33 is not installed (scripts/install_vllm.sh).
"""

import json

import pytest

try:
    from tenantry.engines.vllm import vllm_available
except ImportError as e:  # the vLLM driver module itself is absent
    _OK, _WHY = False, f"tenantry.engines.vllm does not import ({e})"
else:
    _OK, _WHY = vllm_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"vLLM scheduler unavailable: {_WHY}")


def test_verify_target_on_vllm_runs_end_to_end(tmp_path):
    from tenantry.cli import main

    out = tmp_path / "rep"
    code = main(["verify", "--target", "tenantry.engines.vllm:make_fcfs", "--patterns", "flood", "--quick",
                 "--budget", "2", "--workers", "1", "--out", str(out)])
    rep = json.loads((out / "matrix.json").read_text())
    (cell,) = rep["cells"]
    assert code == 0 and cell["findings"] == []
    assert rep["summary"]["describe"]["tenantry.engines.vllm:make_fcfs"].startswith("vllm 0.33")
    # vLLM promises no tenant fairness: under a flood, FCFS order makes the light tenant wait.
    assert cell["metrics"]["ttft_p99_inflation[chat]"] > 20
    assert cell["steps"] > 100 and cell["coverage"]["KV-CONSERVE"].startswith("checked")


def test_cache_salt_isolation_seen_from_outside():
    from tenantry.model.workload import Request, Workload
    from tenantry.engines import vllm as av
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
    from tenantry.adversaries.evaluate import run_scenario
    from tenantry.adversaries.patterns import make_scenario
    from tenantry.verify.system import TargetSystem

    system = TargetSystem("tenantry.engines.vllm:make_fcfs_small", timeout_s=None)
    hist, _, _, ev = run_scenario(system, make_scenario("eviction_thrash", None, 0), depth="full")
    assert not ev.findings, [f.render() for f in ev.findings]
    assert sum(len(s.preempted) for s in hist.steps) > 0
    assert ev.metrics["wasted_prefill_tokens"] > 0
