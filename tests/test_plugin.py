"""The pytest plugin (entry point pytest11) on the example schedulers in examples/.

Each run is a separate pytest process in a temporary folder, as a user would
run it: the clean example passes; the planted-bug copy fails with KV-CONSERVE
and a shrunk workload whose replay command reproduces the finding.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

EXAMPLES = REPO / "examples"
BUGGY = "minisched_buggy.tenantry_adapter:make_scheduler"
CLEAN = "minisched.tenantry_adapter:make_scheduler"


def _pytest(tmp_path, *args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES), "HYPOTHESIS_PROFILE": "default"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_planted_bug_fails_with_kv_conserve_and_a_shrunk_replayable_workload(tmp_path):
    code, out = _pytest(tmp_path, f"--tenantry-target={BUGGY}", "--tenantry-patterns=eviction_thrash",
                        "--tenantry-examples=20")
    assert code == 1, out
    assert "2 failed" in out
    assert f"FAILED ::tenantry[{BUGGY}]::stateful" in out
    assert f"FAILED ::tenantry[{BUGGY}]::pattern[eviction_thrash]" in out
    assert "breaks KV-CONSERVE" in out and "differ from the pool (observed 383, allowed 384)" in out
    wl_path = tmp_path / ".tenantry" / BUGGY.replace(":", "_") / "stateful-KV-CONSERVE.jsonl"
    requests = [json.loads(line) for line in wl_path.read_text().splitlines()]
    # shrunk: a handful of requests (it takes a preemption, so at least two)
    assert 2 <= len(requests) <= 5, requests
    assert f"replay: tenantry verify --target {BUGGY} --workload .tenantry/" in out
    # the run's tenant order and weights, its own folder
    assert "stateful-KV-CONSERVE.jsonl --victims t0,t1,t2 --weighted --out " in out

    from tenantry.cli import main

    sys.path.insert(0, str(EXAMPLES))
    try:
        code = main(["verify", "--target", BUGGY, "--workload", str(wl_path), "--victims", "t0,t1,t2",
                     "--weighted", "--out", str(tmp_path / "replay")])
    finally:
        sys.path.remove(str(EXAMPLES))
    report = json.loads((tmp_path / "replay" / "report.json").read_text())
    assert code == 1 and report["findings"][0]["invariant"] == "KV-CONSERVE"


def test_a_claim_without_its_data_is_a_usage_error(tmp_path):
    (tmp_path / "nocounters.py").write_text(textwrap.dedent("""
        import attrs
        from minisched.tenantry_adapter import MiniSchedAdapter

        class NoCounters(MiniSchedAdapter):
            def __init__(self, tenants=()):
                super().__init__(tenants)
                self.claims = attrs.evolve(self.claims, invariants=("NO-BANKED-CREDIT",))
            def plan_step(self, t_s):
                return attrs.evolve(super().plan_step(t_s), counters={})

        def make(tenants=()):
            return NoCounters(tenants)
    """))
    env_path = f"{EXAMPLES}{os.pathsep}{tmp_path}"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tenantry-target=nocounters:make"],
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": env_path}, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 4, p.stdout + p.stderr  # pytest's usage error
    assert "NO-BANKED-CREDIT" in p.stderr and "reports no counters" in p.stderr and "Traceback" not in p.stderr


def test_clean_example_passes(tmp_path):
    code, out = _pytest(tmp_path, f"--tenantry-target={CLEAN}", "--tenantry-patterns=eviction_thrash",
                        "--tenantry-examples=15")
    assert code == 0, out
    assert "2 passed" in out


def test_fixture_runs_the_suite_inside_a_users_test(tmp_path):
    (tmp_path / "test_mine.py").write_text(textwrap.dedent(f"""
        import minisched.tenantry_adapter as clean
        import minisched_buggy.tenantry_adapter as buggy

        def test_clean(tenantry_verify):
            tenantry_verify(clean.make_scheduler, patterns=["eviction_thrash"], stateful=False)

        def test_buggy(tenantry_verify):
            tenantry_verify(buggy.make_scheduler, patterns=[])
    """))
    code, out = _pytest(tmp_path, "--tenantry-examples=10", "test_mine.py")
    assert code == 1, out
    assert "1 failed, 1 passed" in out
    assert "test_buggy" in out and "1 of 1 tenantry checks failed" in out and "KV-CONSERVE" in out


def test_plugin_is_inert_without_a_target(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    code, out = _pytest(tmp_path, "test_plain.py")
    assert code == 0 and "1 passed" in out and "tenantry[" not in out
    probe = subprocess.run([sys.executable, "-c", "import sys, tenantry.verify.plugin; "
                            "print(sorted(m for m in sys.modules if m.startswith(('tenantry.spec.', 'tenantry.verify.', 'hypothesis'))))"],
                           capture_output=True, text=True)
    assert probe.stdout.strip() == "['tenantry.verify.plugin']"


def test_bad_target_is_a_usage_error(tmp_path):
    code, out = _pytest(tmp_path, "--tenantry-target=nosuchpkg.mod:make")
    assert code == 4
    assert "--tenantry-target: target='nosuchpkg.mod:make': cannot import nosuchpkg.mod" in out


def test_items_give_the_same_outcomes_under_pytest_xdist(tmp_path):
    """``pytest -n 2`` (pytest-xdist) runs the plugin's items in two workers with the outcomes of one process."""
    pytest.importorskip("xdist")
    args = (f"--tenantry-target={BUGGY}", "--tenantry-patterns=eviction_thrash,flood", "--tenantry-examples=20", "-rA")
    def item(line: str) -> str:  # xdist's summary shows "...::stateful]": drop an unbalanced bracket
        word, node = line.split()[:2]
        name = node.split("]::", 1)[-1]
        return f"{word} {name[:-1] if name.count(']') > name.count('[') else name}"

    outcomes = []
    for extra in ((), ("-n", "2")):
        code, out = _pytest(tmp_path, *args, *extra)
        assert code == 1, out
        outcomes.append(sorted(item(line) for line in out.splitlines() if line.startswith(("PASSED ", "FAILED "))))
    assert outcomes[0] == outcomes[1] == ["FAILED pattern[eviction_thrash]", "FAILED stateful", "PASSED pattern[flood]"]
