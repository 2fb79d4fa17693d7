"""``tenantry verify --history``: a clean history passes; broken ones are flagged
with the invariant, the step and the request."""

import json

import attrs
import pytest

from tenantry.cli import main
from tenantry.model.config import AdmissionConfig, Config, OrderConfig, TenantConfig
from tenantry.model.history import read_history, write_history
from tenantry.model.simulate import simulate
from tenantry.model.workload import Request, Workload, as_workload
from tenantry.verify.offline import verify_history

CFG = Config(
    tenants=(TenantConfig("a", queue_bound=2, kv_block_cap=24), TenantConfig("b")),
    num_blocks=64, max_num_seqs=3, token_budget=96, order=OrderConfig(policy="fcfs"),
    admission=AdmissionConfig(queue_bound=True, kv_cap=True),
)
# Tenant a sends a burst of 6 (its queue bound is 2: some are refused queue_full);
# b sends a steady stream.
WL = Workload(tuple(Request(i, "a", 0.0, 100, 12) for i in range(6))
              + tuple(Request(6 + i, "b", 0.02 * i, 60, 8) for i in range(6)))


@pytest.fixture(scope="module")
def clean():
    return simulate(CFG, as_workload(WL).with_cancellations([(0.05, 7)]))


def _verify(tmp_path, history, name):
    path = tmp_path / f"{name}.jsonl"
    write_history(history, path)
    out = tmp_path / f"{name}-report"
    code = main(["verify", "--history", str(path), "--out", str(out)])
    return code, json.loads((out / "report.json").read_text())["findings"]


def test_clean_history_passes(tmp_path, clean, capsys):
    assert any(r.reason == "queue_full" for r in clean.requests)
    assert any(r.outcome == "cancelled" for r in clean.requests)
    code, found = _verify(tmp_path, clean, "clean")
    assert (code, found) == (0, [])
    assert "0 findings" in capsys.readouterr().out


def test_vanished_request_breaks_no_loss(tmp_path, clean):
    victim = next(r for r in clean.requests if r.tenant == "b" and r.outcome == "finished")
    k = next(s.step_index for s in clean.steps if victim.request_id in s.running)
    steps = tuple(attrs.evolve(s, running=tuple(x for x in s.running if x != victim.request_id))
                  if s.step_index >= k + 1 else s for s in clean.steps)
    reqs = tuple(attrs.evolve(r, outcome="unfinished", finish_s=None) if r is victim else r for r in clean.requests)
    code, found = _verify(tmp_path, attrs.evolve(clean, steps=steps, requests=reqs), "lost")
    assert code == 1
    f = found[0]
    assert (f["invariant"], f["step"], f["requests"][-1], f["tenants"]) == ("NO-LOSS", k + 1, victim.request_id, ["b"])


def test_tenant_over_its_cap_breaks_kv_cap(tmp_path, clean):
    k = next(s.step_index for s in clean.steps if s.blocks_in_use["a"] > 0 and s.step_index > 2)
    s = clean.steps[k]
    bumped = attrs.evolve(s, blocks_in_use={**s.blocks_in_use, "a": 30}, free_blocks=s.free_blocks - (30 - s.blocks_in_use["a"]))
    steps = clean.steps[:k] + (bumped,) + clean.steps[k + 1:]
    code, found = _verify(tmp_path, attrs.evolve(clean, steps=steps), "cap")
    assert code == 1
    f = next(f for f in found if f["invariant"] == "KV-CAP")
    a_running = [x for x in s.running if clean.requests[x].tenant == "a"]
    assert (f["step"], f["tenants"], f["observed"], f["allowed"]) == (k, ["a"], 30, 24)
    assert max(a_running) in f["requests"]


def test_overfull_queue_breaks_queue_bound(tmp_path, clean):
    # Two of the refused requests recorded as admitted in step 0 (and cancelled
    # later): after step 0, three never-scheduled requests of a wait, bound 2.
    refused = [r for r in clean.requests if r.reason == "queue_full"][:2]
    k = 0  # the burst arrives at t=0: step 0
    reqs = tuple(attrs.evolve(r, outcome="cancelled", reason=None, retry_after_s=None, admitted_step=k,
                              finish_s=clean.steps[3].start_s) if r in refused else r for r in clean.requests)
    # a scheduler's log with request records and step snapshots, no events: they are derived from the records
    steps = tuple(attrs.evolve(s, events=()) for s in clean.steps)
    code, found = _verify(tmp_path, attrs.evolve(clean, steps=steps, requests=reqs), "queue")
    assert code == 1
    f = next(f for f in found if f["invariant"] == "QUEUE-BOUND")
    assert (f["step"], f["tenants"], f["allowed"]) == (k, ["a"], 2)
    assert f["observed"] == 3 and f["requests"][-1] == refused[-1].request_id


def test_placement_holds_on_model_histories_with_cancels_and_evictions():
    cfg = attrs.evolve(CFG, num_blocks=14, tenants=(TenantConfig("a", queue_bound=2), TenantConfig("b")))
    h = simulate(cfg, as_workload(WL).with_cancellations([(0.03, 1), (0.05, 7)]))
    assert sum(len(s.preempted) for s in h.steps) > 0
    assert verify_history(h) == []


def test_bad_history_file_is_one_line_error(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"kind": "header", "format": 1}\n{"kind": "step", "step_index": 0}\n')
    assert main(["verify", "--history", str(p), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tenantry: error: ") and "bad.jsonl:2" in err and len(err.splitlines()) == 1


def test_a_flood_of_findings_is_capped_when_printed_and_in_report_json(tmp_path, clean, capsys, monkeypatch):
    from tenantry.commands import verify as verify_cmd
    from tenantry.spec.invariants_core import Finding
    from tenantry.verify import offline

    flood = [Finding("KV-CONSERVE", k, message=f"step {k}") for k in range(250)] + [Finding("NO-LOSS", 3)]
    monkeypatch.setattr(offline, "verify_history", lambda *a, **k: flood)
    path = tmp_path / "h.jsonl"
    write_history(clean, path)
    assert main(["verify", "--history", str(path), "--out", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("KV-CONSERVE") for line in out) == verify_cmd.PRINT_PER_INVARIANT == 10
    assert f"... and 240 more KV-CONSERVE findings (report.json keeps the first 100 of each, and the counts)" in out
    assert sum(line.startswith("NO-LOSS") for line in out) == 1 and f"{path}: {len(clean.steps)} steps, " \
        f"{len(clean.requests)} requests, 251 findings" in out
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert (rep["findings_total"], rep["findings_by_invariant"]) == (251, {"KV-CONSERVE": 250, "NO-LOSS": 1})
    assert [f["step"] for f in rep["findings"]] == list(range(100)) + [3]
