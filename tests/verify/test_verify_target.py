"""``tenantry verify --target``: the adversary matrix in step mode, written in
``tenantry check``'s report layout; a hostile target still gets its report."""

import json
from pathlib import Path
import shlex
import sys
import textwrap

import pytest

from conftest import REPO
from tenantry.cli import main


@pytest.fixture
def on_path(tmp_path):
    sys.path[:0] = [str(REPO / "examples"), str(tmp_path)]
    yield
    sys.path.remove(str(REPO / "examples"))
    sys.path.remove(str(tmp_path))
    for m in [m for m in sys.modules if m.startswith("hostile_targets")]:
        del sys.modules[m]


QUICK = ("--quick", "--budget", "2", "--workers", "1")


def _run(tmp_path, target, *extra):
    out = tmp_path / "out"
    code = main(["verify", "--target", target, "--out", str(out), *QUICK, *extra])
    return code, json.loads((out / "matrix.json").read_text()), out


def test_clean_target_matrix(tmp_path, on_path, capsys, monkeypatch):
    (tmp_path / "out" / "cells" / "old").mkdir(parents=True)  # not a tenantry report: refused, left as it is
    (tmp_path / "out" / "stale.png").write_bytes(b"old")
    assert main(["verify", "--target", "minisched.tenantry_adapter:make_scheduler", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a tenantry verify report" in err
    assert (tmp_path / "out" / "stale.png").read_bytes() == b"old" and (tmp_path / "out" / "cells" / "old").is_dir()
    (tmp_path / "out" / "stale.png").unlink()
    (tmp_path / "out" / "cells" / "old").rmdir()
    (tmp_path / "out" / "cells").rmdir()  # an empty folder is taken
    code, rep, out = _run(tmp_path, "minisched.tenantry_adapter:make_scheduler", "--patterns", "flood")
    assert code == 0 and (out / "cells" / "minisched.tenantry_adapter_make_scheduler" / "flood").is_dir()
    code, rep, out = _run(tmp_path, "minisched.tenantry_adapter:make_scheduler", "--patterns", "eviction_thrash,sybil")
    assert code == 0 and not rep["claimed_broken"]
    assert [c["pattern"] for c in rep["cells"]] == ["eviction_thrash", "sybil"]
    assert rep["cells"][0]["coverage"]["WORK-CONSERVING"].startswith("checked")
    assert rep["cells"][0]["coverage"]["FCFS-TENANT"] == "not claimed"
    assert rep["cells"][0]["coverage"]["VTC-GAP"] == "not applicable to this configuration"
    sybil = rep["cells"][1]
    assert sybil["objective"] == "contended_share" and 0.0 < sybil["score"] < 1.0
    cell = json.loads((out / "cells" / "minisched.tenantry_adapter_make_scheduler" / "sybil" / "cell.json").read_text())
    assert cell["findings"] == [] and cell["replay"].startswith("tenantry verify --target minisched.tenantry_adapter")
    assert "| minisched.tenantry_adapter:make_scheduler |" in (out / "report.md").read_text()
    assert "## What was checked" in (out / "report.md").read_text()
    assert not (out / "cells" / "minisched.tenantry_adapter_make_scheduler" / "flood").exists()  # replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder or lock left behind
    text = capsys.readouterr().out
    assert "2 cells" in text and f"report: {out / 'report.md'}" in text
    # the cell's replay prints its objective and metrics against the record (a fresh user saw only
    # '488 steps, 0 findings' replaying a hurt cell)
    argv = shlex.split(cell["replay"])  # run from the report folder, as the report's commands are written
    monkeypatch.chdir(out)
    assert argv[:2] == ["tenantry", "verify"] and main(argv[1:]) == 0
    monkeypatch.chdir(tmp_path)
    text = capsys.readouterr().out
    assert f"sybil: contended_share = {sybil['score']:.6g} (recorded {sybil['score']:.6g}: same)" in text, text
    assert "  starvation_s" in text and "(recorded" not in text.split("same)", 1)[1]


def test_buggy_target_matrix_and_replay(tmp_path, on_path, monkeypatch):
    target = "minisched_buggy.tenantry_adapter:make_scheduler"
    code, rep, out = _run(tmp_path, target, "--patterns", "eviction_thrash")
    assert code == 1
    (cell,) = rep["cells"]
    assert "KV-CONSERVE" in [f["invariant"] for f in cell["findings"]]
    first = next(f for f in cell["findings"] if f["invariant"] == "KV-CONSERVE" and "search" not in f)
    wl = out / "cells" / target.replace(":", "_") / "eviction_thrash" / "workload.jsonl"
    code2 = main(["verify", "--target", target, "--workload", str(wl), "--horizon-s", "16", "--out", str(tmp_path / "r2")])
    again = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert code2 == 1
    assert next(f for f in again["findings"] if f["invariant"] == "KV-CONSERVE")["step"] == first["step"]
    # the finding's witness: shrunk on the invariant (not on the hurt score), replayed by its own command
    assert first["reproduced"] is True and first["witness"].endswith("eviction_thrash/finding-KV-CONSERVE.jsonl")
    assert first["witness_requests"] < first_requests(wl) and first["witness_finding"]["invariant"] == "KV-CONSERVE"
    argv = shlex.split(first["replay"])
    assert argv[:2] == ["tenantry", "verify"] and "--adversaries" in argv and "--out" not in argv
    assert argv[argv.index("--workload") + 1] == first["witness"]  # relative to the report folder
    monkeypatch.chdir(out)  # where the report's commands run from
    assert main(argv[1:]) == 1
    monkeypatch.chdir(tmp_path)
    # written beside the report, not in it, without being told (the workload lies in a report)
    replay_out = Path(f"{out}-replay") / "cells" / target.replace(":", "_") / "eviction_thrash-finding-KV-CONSERVE-replay"
    assert not [p for p in out.rglob("*") if p.name.endswith("-replay")]  # the report stays replaceable
    again = json.loads((replay_out / "report.json").read_text())
    assert next(f for f in again["findings"] if f["invariant"] == "KV-CONSERVE")["step"] == first["witness_finding"]["step"]


def first_requests(path):
    return sum(1 for line in path.read_text().splitlines() if line.strip())


HOSTILE = '''
from tenantry.model.config import Config, TenantConfig
from tenantry.verify.protocol import Claims, Plan

CFG = Config(tenants=(TenantConfig("default"),), num_blocks=64, max_num_seqs=4, token_budget=64)

class Base:
    claims = Claims(CFG)
    def __init__(self):
        self.ids = []
    def add_request(self, r):
        self.ids.append(r.request_id)
    def abort_request(self, rid):
        pass
    def take_results(self, res):
        pass

class Raises(Base):
    def plan_step(self, t_s):
        raise ZeroDivisionError("scheduler bug")

class Twice(Base):
    def plan_step(self, t_s):
        rid = self.ids[0]
        return Plan(batch=((rid, 1), (rid, 1)))

def factory_raises():
    raise RuntimeError("cannot build")
'''


@pytest.mark.parametrize("factory,invariant,call", [
    ("Raises", "ADAPTER-RAISED", "plan_step"),
    ("Twice", "BATCH-LIMITS", "plan_step"),
    ("factory_raises", "ADAPTER-RAISED", "factory"),
])
def test_hostile_target_still_writes_its_report(tmp_path, on_path, factory, invariant, call):
    (tmp_path / "hostile_targets.py").write_text(textwrap.dedent(HOSTILE))
    code, rep, out = _run(tmp_path, f"hostile_targets:{factory}", "--patterns", "flood", "--timeout-s", "2")
    assert code == 1
    (cell,) = rep["cells"]
    assert (cell["findings"][0]["invariant"], cell["findings"][0]["call"]) == (invariant, call)
    assert (out / "report.md").exists()
    if invariant.startswith("ADAPTER-"):  # not run twice, and the coverage says why (not "no history form")
        assert cell["coverage"]["DETERMINISM"] == f"skipped: the run broke {invariant}, so it was not run again"
    report = (out / "report.md").read_text()
    assert f"{cell['findings'][0]['invariant']} broke on the cell's worst workload" in report or "Witness of" in report


CLAIMS = """
import attrs
from minisched.tenantry_adapter import MiniSchedAdapter
from tenantry.verify.protocol import Claims

class NoCounters(MiniSchedAdapter):
    def __init__(self, tenants=()):
        super().__init__(tenants)
        self.claims = attrs.evolve(self.claims, invariants=("NO-BANKED-CREDIT",))
    def plan_step(self, t_s):
        return attrs.evolve(super().plan_step(t_s), counters=None)

class Inapplicable(MiniSchedAdapter):
    def __init__(self, tenants=()):
        super().__init__(tenants)
        self.claims = attrs.evolve(self.claims, invariants=("FCFS-TIER", "WORK-CONSERVING"))

def no_counters(tenants=()):
    return NoCounters(tenants)

def inapplicable(tenants=()):
    return Inapplicable(tenants)

def untiered():
    return MiniSchedAdapter()
"""


def test_a_claim_that_cannot_be_checked_is_one_line_before_any_work(tmp_path, on_path, capsys):
    (tmp_path / "hostile_targets_claims.py").write_text(CLAIMS)
    out = tmp_path / "out"
    assert main(["verify", "--target", "hostile_targets_claims:no_counters", "--out", str(out), *QUICK]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "NO-BANKED-CREDIT" in err and "reports no counters" in err, err
    assert not out.exists()
    wl = tmp_path / "wl.jsonl"
    wl.write_text('{"request_id": 0, "tenant": "a", "arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 3}\n')
    assert main(["verify", "--target", "hostile_targets_claims:no_counters", "--workload", str(wl), "--out",
                 str(out)]) == 2
    assert "NO-BANKED-CREDIT" in capsys.readouterr().err and not out.exists()
    for flag, what in (("--tiered", "tiers"), ("--weighted", "weights")):
        assert main(["verify", "--target", "hostile_targets_claims:untiered", flag, "--out", str(out), *QUICK]) == 2
        err = capsys.readouterr().err
        assert f"takes no 'tenants' argument, so it cannot learn the {what}" in err and flag in err, err
        assert not out.exists()
    # a claim that does not apply to the claimed configuration: a warning, and the report says so
    code = main(["verify", "--target", "hostile_targets_claims:inapplicable", "--workload", str(wl), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0 and "claims FCFS-TIER, which does not apply" in err


def test_bad_target_spec_is_one_line_error(tmp_path, capsys):
    assert main(["verify", "--target", "no_colon_here", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tenantry: error: target='no_colon_here': must be module:factory")


def test_the_stateful_replay_names_the_report_folder_and_the_target_path(tmp_path):
    """The stateful extra's replay command, as printed, runs: it names the workload where the
    report will be (not the staging folder, gone when the run ends) and repeats --target-path
    (without it the command could not import a target found through that path)."""
    from tenantry.verify.system import TargetSystem

    examples = str(REPO / "examples")
    system = TargetSystem("minisched_buggy.tenantry_adapter:make_scheduler", path=examples)
    staging, shown = tmp_path / ".rep.new-x", tmp_path / "rep"
    (name, run), = system.extras(staging, shown)
    text, ok = run()
    assert name == "stateful" and not ok, text
    argv = shlex.split(text.split("replay: ", 1)[1])
    workload = Path(argv[argv.index("--workload") + 1])
    assert workload.parent == shown / "stateful" and (staging / "stateful" / workload.name).exists()
    assert argv[argv.index("--target-path") + 1] == examples
    assert Path(argv[argv.index("--out") + 1]).is_relative_to(Path(f"{shown}-replay"))


LEAKY = '"""minisched that admits a request whose prompt starts with an original content id at once\nand one with a relabelled id a step later: another tenant\'s contents change the adversary\'s service."""\nimport attrs\nfrom minisched.tenantry_adapter import MiniSchedAdapter\n\n\nclass Leaky(MiniSchedAdapter):\n    def __init__(self, tenants=()):\n        super().__init__(tenants)\n        self.claims = attrs.evolve(self.claims, invariants=("WORK-CONSERVING", "NONINTERFERENCE"))\n        self.held = []\n        self.steps = 0\n\n    def add_request(self, request):\n        if request.prefix_ids and request.prefix_ids[0] >= 10**9:\n            self.held.append(request)\n            return None\n        return super().add_request(request)\n\n    def plan_step(self, t_s):\n        self.steps += 1\n        if self.steps % 100 == 0:  # a relabelled prompt waits up to 100 steps\n            held, self.held = self.held, []\n            for r in held:\n                super().add_request(r)\n        return super().plan_step(t_s)\n\n\ndef make(tenants=()):\n    return Leaky(tenants)\n'


FAIR = """

def make_fair(tenants=()):
    fair = MiniSchedAdapter(tenants)
    fair.claims = attrs.evolve(fair.claims, invariants=("WORK-CONSERVING", "NONINTERFERENCE"))
    return fair
"""


def test_a_claimed_noninterference_is_checked_on_a_target_as_on_the_model(tmp_path, on_path):
    """Found by a blind fault test: verify --target accepted a NONINTERFERENCE claim and never
    checked it (coverage: "no history form").  At depth full the worst workload runs again with
    every other tenant's prompt contents relabelled, as the model's is: a scheduler that delays
    a prompt by its contents changes the adversary's records, and that is a finding."""
    from tenantry.adversaries.evaluate import Task, scenario_of
    from tenantry.verify.system import TargetSystem

    (tmp_path / "leaky_sched.py").write_text(LEAKY + FAIR)
    system = TargetSystem("leaky_sched:make", path=str(tmp_path))
    sc = scenario_of(Task(system, "flood"))
    run = system.checked(sc.workload, sc.horizon_s, "full", sc.roles)
    assert run.coverage["NONINTERFERENCE"] == "checked (two-run)"
    (f,) = [f for f in run.findings if f.invariant == "NONINTERFERENCE"]
    assert f.tenants == ("adv",) and "another tenant's prompt contents" in f.message
    fair = TargetSystem("leaky_sched:make_fair", path=str(tmp_path))  # minisched claiming it: holds
    run = fair.checked(sc.workload, sc.horizon_s, "full", sc.roles)
    assert run.coverage["NONINTERFERENCE"] == "checked (two-run)"
    assert not [f for f in run.findings if f.invariant == "NONINTERFERENCE"]
    # and its replay command judges it again (a blind fault test: the printed replay of a
    # NONINTERFERENCE witness ran clean, exit 0, the twin run being only in the matrix)
    from tenantry.runner.traces import write_workload_jsonl

    wl = tmp_path / "w.jsonl"
    write_workload_jsonl(sc.workload, wl)
    victims = ",".join(n for n, r in sc.roles if r == "victim")
    for factory, code in (("make", 1), ("make_fair", 0)):
        argv = ["verify", "--target", f"leaky_sched:{factory}", "--target-path", str(tmp_path), "--workload", str(wl),
                "--horizon-s", str(sc.horizon_s), "--adversaries", "adv", "--victims", victims,
                "--out", str(tmp_path / f"replay-{factory}")]
        assert main(argv) == code
        report = json.loads((tmp_path / f"replay-{factory}" / "report.json").read_text())
        assert [f["invariant"] for f in report["findings"]] == (["NONINTERFERENCE"] if code else []), factory


def test_a_knock_on_finding_names_the_invariant_that_broke_first_on_its_witness(tmp_path, on_path):
    """A prefill abort that leaks blocks starves the queue (STALLED) after it breaks KV-CONSERVE:
    STALLED's witness says KV-CONSERVE broke first there, and KV-CONSERVE's names nothing earlier."""
    code, rep, out = _run(tmp_path, "faults.cancel_prefill_leak:make_scheduler", "--patterns", "cancellations")
    assert code == 1
    (cell,) = rep["cells"]
    by_inv = {f["invariant"]: f for f in reversed(cell["findings"])}
    assert "witness_first" not in by_inv["KV-CONSERVE"]
    first = by_inv["STALLED"]["witness_first"]
    assert first["invariant"] == "KV-CONSERVE" and first["step"] < by_inv["STALLED"]["witness_finding"]["step"]
    assert (f"On this witness KV-CONSERVE breaks at step {first['step']}, before STALLED: STALLED may follow from "
            "it; look at KV-CONSERVE first.") in (out / "report.md").read_text()


def test_weighted_matrix_catches_a_scheduler_that_ignores_weights_and_its_replay_is_weighted(tmp_path, on_path):
    """--weighted gives the matrix's tenants the weights 1, 2, 0.5: a VTC that ignores weights
    (exact VTC when every weight is 1, so the plain matrix passes it) breaks VTC-GAP, and the
    cell's replay command repeats --weighted."""
    target = "faults.vtc_weight_ignored:make_scheduler"
    code, rep, _ = _run(tmp_path / "plain", target, "--patterns", "flood")
    assert code == 0 and not rep["cells"][0]["findings"]
    code, rep, _ = _run(tmp_path / "weighted", target, "--patterns", "flood", "--weighted")
    (cell,) = rep["cells"]
    assert code == 1 and "VTC-GAP" in {f["invariant"] for f in cell["findings"]}
    assert " --weighted" in cell["replay"]
