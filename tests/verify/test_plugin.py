"""The pytest plugin (entry point pytest11) on the example schedulers in examples/.

Each run is a separate pytest process in a temporary folder, as a user would
run it: the clean example passes; the planted-bug copy fails with KV-CONSERVE
and a shrunk workload whose replay command reproduces the finding.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

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


# --- collection: the checks are collected items -----------------------------------------------

def test_checks_are_collected_counted_listed_and_selectable(tmp_path):
    """The header counts the checks as collected (it said "collected 0 items" and then ran 17),
    ``--collect-only`` lists them, and ``-k`` / ``-m`` select among them, with and without xdist."""
    args = (f"--tenantry-target={CLEAN}", "--tenantry-patterns=flood,churn")
    code, out = _pytest(tmp_path, *args, "--collect-only", "-v", timeout=120)  # -v: _pytest's -q undone
    assert code == 0, out
    assert "collected 3 items" in out and "3 tests collected" in out
    assert f"<TenantryTarget tenantry[{CLEAN}]>" in out
    assert all(f"<TenantryItem {n}>" in out for n in ("stateful", "pattern[flood]", "pattern[churn]")), out
    code, out = _pytest(tmp_path, *args, "--collect-only", "-k", "flood or stateful", timeout=120)
    assert code == 0 and "2/3 tests collected (1 deselected)" in out, out
    code, out = _pytest(tmp_path, *args, "--collect-only", "-m", "not tenantry", timeout=120)
    assert code == 5 and "no tests collected (3 deselected)" in out, out
    pytest.importorskip("xdist")
    code, out = _pytest(tmp_path, *args, "-n", "2", "-k", "flood", "-rA", "-v", timeout=120)
    assert code == 0, out
    assert "2 workers [1 item]" in out and "1 passed" in out
    assert f"PASSED ::tenantry[{CLEAN}]::pattern[flood]" in out


# --- stopping: Ctrl-C and SIGTERM ---------------------------------------------------------------

#: A minisched that takes a millisecond a step (so a check lasts long enough to be interrupted).
SLOW_TARGET = textwrap.dedent("""
    import time
    from minisched.tenantry_adapter import MiniSchedAdapter

    class Slow(MiniSchedAdapter):
        def plan_step(self, t_s):
            time.sleep(0.001)
            return super().plan_step(t_s)

    def make(tenants=()):
        return Slow(tenants)
""")
#: conftest: each process marks that it is running a check (a file running-PID) as the check starts.
MARK_RUNNING = textwrap.dedent("""
    import os, pathlib, pytest

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(item):
        pathlib.Path(f"running-{os.getpid()}").touch()
        return (yield)
""")
#: conftest addition: the plugin's handler's KeyboardInterrupt is lost, as when the signal lands in a
#: finaliser or a garbage-collector callback (Python drops an exception raised there; Hypothesis's
#: gc callback and a WeakSet's were seen swallowing a Ctrl-C, and the run went on to its end).
LOSE_THE_INTERRUPT = textwrap.dedent("""
    import signal

    def pytest_sessionstart(session):
        handler = signal.getsignal(signal.SIGINT)

        def lossy(signum, frame):
            try:
                handler(signum, frame)
            except KeyboardInterrupt:
                pass

        signal.signal(signal.SIGINT, lossy)
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
@pytest.mark.parametrize("sig, group, workers, lost", [
    (signal.SIGINT, True, 0, False),   # Ctrl-C in a terminal: the whole process group
    (signal.SIGINT, True, 0, True),    # ... whose KeyboardInterrupt a finaliser swallowed
    (signal.SIGTERM, False, 0, False),  # kill PID / a job scheduler: the process only
    (signal.SIGINT, True, 2, False),   # pytest -n 2: the controller and its workers all get it
    (signal.SIGTERM, False, 2, False),  # pytest -n 2, the controller alone: it stops its workers
], ids=["sigint", "sigint-lost", "sigterm", "sigint-xdist", "sigterm-xdist-controller"])
def test_a_signal_stops_a_running_check_within_2_s(sig, group, workers, lost, tmp_path):
    from conftest import children as _children, gone as _gone, wait_for as _wait_for

    if workers:
        pytest.importorskip("xdist")
    (tmp_path / "slow_target.py").write_text(SLOW_TARGET)
    (tmp_path / "conftest.py").write_text(MARK_RUNNING + (LOSE_THE_INTERRUPT if lost else ""))
    env = {**os.environ, "PYTHONPATH": f"{EXAMPLES}{os.pathsep}{tmp_path}", "HYPOTHESIS_PROFILE": "default"}
    args = ["--tenantry-target=slow_target:make", "--tenantry-examples=100000", "--tenantry-patterns=flood"]
    p = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args,
                          *(["-n", str(workers)] if workers else [])],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        _wait_for(lambda: len(list(tmp_path.glob("running-*"))) >= max(1, workers) or p.poll() is not None,
                  within_s=120)
        assert p.poll() is None, p.communicate()[0]
        kids = _children(p.pid)
        assert len(kids) >= workers
        t0 = time.monotonic()
        os.killpg(p.pid, sig) if group else p.send_signal(sig)
        while p.poll() is None and time.monotonic() - t0 < 30:
            time.sleep(0.02)
        took = time.monotonic() - t0
        out = p.communicate(timeout=30)[0]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    print(out)  # shown when the test fails
    assert p.returncode == 2  # pytest's "interrupted"
    assert took < 2.0
    assert "KeyboardInterrupt" in out and "Traceback" not in out, out
    assert all(_gone(k, within_s=max(0.1, 2.0 - took)) for k in kids), out  # no worker left behind


# --- failures: the cause first --------------------------------------------------------------------

def test_a_failure_names_the_invariant_that_breaks_first_on_its_witness(tmp_path):
    """``faults.plan_overrun`` (a plan past the step's token budget) makes the stateful run stop on
    STALLED; on the shrunk witness KV-CONSERVE, BATCH-LIMITS and NO-LOSS break a step earlier.  The
    failure used to name STALLED alone (the cause showed only when the replay was run); it now
    leads with the invariant that breaks at the witness's earliest step, as report.md's "look at X
    first" does (the one rule, adversaries.check._breaks_first)."""
    import re

    from tenantry.runner.traces import read_workload_jsonl
    from tenantry.verify.run import bind, scenario_tenants, verify_workload
    from tenantry.verify.suite import STATEFUL_TENANTS

    code, out = _pytest(tmp_path, "--tenantry-target=faults.plan_overrun:make_scheduler", "--tenantry-patterns=none",
                        timeout=120)
    assert code == 1, out
    m = re.search(r"a stateful run breaks (\S+) at step (\d+), before (\S+) at step (\d+) \(shrunk from \d+ to \d+ "
                  r"requests\): (\S+) may follow from it; look at (\S+) first\n  (\S+) step (\d+)", out)
    assert m, out
    lead, lead_step, symptom, symptom_step = m[1], int(m[2]), m[3], int(m[4])
    assert lead_step < symptom_step and m[5] == symptom and m[6] == m[7] == lead and int(m[8]) == lead_step
    assert f"FAILED ::tenantry[faults.plan_overrun:make_scheduler]::stateful - faults.plan" in out
    # the witness as the replay runs it: its earliest finding is the one the failure leads with
    sys.path.insert(0, str(EXAMPLES))
    try:
        from faults.plan_overrun import make_scheduler
    finally:
        sys.path.remove(str(EXAMPLES))
    wl = read_workload_jsonl(tmp_path / ".tenantry" / "faults.plan_overrun_make_scheduler" / f"stateful-{symptom}.jsonl")
    fac = bind(make_scheduler, scenario_tenants([(t, "victim") for t in STATEFUL_TENANTS], False, True))
    found = verify_workload(fac, wl, determinism=False).findings
    assert found[0].step == lead_step and lead in {f.invariant for f in found if f.step == lead_step}
    assert min(f.step for f in found if f.invariant == symptom) == symptom_step


def test_a_stop_inside_a_command_run_in_a_plugin_session_stops_the_session(tmp_path, monkeypatch):
    """tenantry's own tests run ``tenantry.cli.main`` in-process; from the repository root,
    ``pytest --tenantry-target=...`` runs them too.  A Ctrl-C landing in such a command ended that
    command (exit 130), its test failed and the session went on: Ctrl-Cs were "ignored" for
    minutes.  Inside the session's handler (the plugin's, the same ``catch_stop_signals``) the
    command still stops, and the stop then goes on in the session as KeyboardInterrupt."""
    import _thread
    import threading

    from tenantry.adversaries.outdir import STOP_REQUESTED, catch_stop_signals, restore_signals
    from tenantry.cli import main

    monkeypatch.chdir(tmp_path)
    old, got = catch_stop_signals()  # what a --tenantry-target session installs
    timer = threading.Timer(0.5, _thread.interrupt_main)  # Ctrl-C while the command runs (several seconds)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            main(["simulate", "--policy", "fcfs", "vtc", "rate_limit", "drr_tokens"])
        assert got == [signal.SIGINT] and STOP_REQUESTED.is_set()
    finally:
        timer.cancel()
        restore_signals(old)
    assert not STOP_REQUESTED.is_set()
