"""``tenantry verify --history``: a clean history passes; broken ones are flagged
with the invariant, the step and the request."""

import json

import attrs
import pytest

from tenantry.cli import main
from tenantry.model.config import AdmissionConfig, Config, OrderConfig, TenantConfig
from tenantry.model.workload import Request, Workload, as_workload
from tenantry.runner.history import read_history, write_history
from tenantry.runner.simulate import simulate
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


def test_a_claim_that_does_not_apply_is_listed_as_not_judged(tmp_path, clean, capsys):
    """--claims VTC-GAP on an fcfs history: the claim does not apply, so it is not judged; it is said
    beside what was checked (stdout, the report, a warning), not only as 'not applicable' in report.md."""
    path = tmp_path / "h.jsonl"
    write_history(clean, path)
    code = main(["verify", "--history", str(path), "--claims", "VTC-GAP", "--out", str(tmp_path / "r")])
    out = capsys.readouterr()
    assert code == 0
    assert "not checked: VTC-GAP: skipped: claimed, but it does not apply to this configuration" in out.out
    assert "VTC-GAP is claimed but does not apply" in out.err
    cov = json.loads((tmp_path / "r" / "report.json").read_text())["coverage"]
    assert cov["VTC-GAP"].startswith("skipped: claimed") and cov["FCFS-TENANT"] == "not claimed"


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


def test_a_workload_given_as_a_history_says_so(tmp_path, capsys):
    """A fresh user passed a workload to --history and read only 'kind=None: must be header, ...'."""
    p = tmp_path / "w.jsonl"
    p.write_text('{"request_id":0,"tenant":"a","arrival_s":0,"prompt_tokens":10,"output_tokens":1}\n')
    assert main(["verify", "--history", str(p), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "w.jsonl:1" in err and "a request of a workload, not of a history" in err and "--workload" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "r").exists()


def test_a_flood_of_findings_is_capped_when_printed_and_in_report_json(tmp_path, clean, capsys, monkeypatch):
    from tenantry.cli.commands import verify as verify_cmd
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


def _lines_of(history):
    from tenantry.runner.history import history_lines

    return [json.loads(line) for line in history_lines(history)]


def _write_lines(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def _refused(tmp_path, capsys, path):
    """verify --history on ``path``: exit 2, one stderr line (returned), no report folder written."""
    out = tmp_path / f"{path.name}-report"
    code = main(["verify", "--history", str(path), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("tenantry: error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and not out.exists()
    return err


def _fleet_history(tmp_path):
    """A 4-replica tenant-affinity fleet history of 4 requests from 2 tenants: replicas 2 and 3 get nothing."""
    wl = tmp_path / "wl.jsonl"
    wl.write_text("".join(json.dumps({"request_id": i, "tenant": "ab"[i % 2], "arrival_s": 0.1 * i,
                                      "prompt_tokens": 50, "output_tokens": 4}) + "\n" for i in range(4)))
    h = tmp_path / "fleet.jsonl"
    assert main(["simulate", "--replicas", "4", "--router", "tenant_affinity", "--policy", "vtc",
                 "--workload", str(wl), "--history", str(h)]) == 0
    return h


def test_header_only_history_is_not_a_pass(tmp_path, clean, capsys):
    header = _lines_of(clean)[0]
    for name, hdr in (("only-header", {**header, "requests": 0}), ("no-count", {k: v for k, v in header.items()
                                                                                 if k != "requests"})):
        err = _refused(tmp_path, capsys, _write_lines(tmp_path / f"{name}.jsonl", [hdr]))
        assert f"{name}.jsonl: request records=0" in err and "nothing to check" in err
    fleet_header = json.loads(_fleet_history(tmp_path).read_text().splitlines()[0])
    capsys.readouterr()
    err = _refused(tmp_path, capsys, _write_lines(tmp_path / "fleet-header.jsonl", [{**fleet_header, "requests": 0}]))
    assert "fleet-header.jsonl: request records=0" in err and "nothing to check" in err  # passed with 0 findings


def test_truncated_history_names_its_last_line(tmp_path, clean, capsys):
    objs = _lines_of(clean)
    full = "".join(json.dumps(o) + "\n" for o in objs)
    n = len(objs)
    # cut mid-line: the last line is partial JSON
    (tmp_path / "cut.jsonl").write_text(full[:-40])
    err = _refused(tmp_path, capsys, tmp_path / "cut.jsonl")
    assert f"cut.jsonl:{n}: json=" in err and "bad JSON" in err and "looks truncated" in err
    # cut at a line's end among the steps, requests in flight, no request line
    k = next(i for i, o in enumerate(objs) if o["kind"] == "step" and o["running"] and i > 3)
    _write_lines(tmp_path / "steps.jsonl", objs[:k + 1])
    err = _refused(tmp_path, capsys, tmp_path / "steps.jsonl")
    s = objs[k]
    assert f"steps.jsonl:{k + 1}: request records=0: the header says {len(clean.requests)}" in err
    assert f"in flight (step {s['step_index']}: {len(s['running'])} running" in err and "looks truncated" in err
    # the same without the header's request count
    _write_lines(tmp_path / "nocount.jsonl", [{k2: v for k2, v in objs[0].items() if k2 != "requests"}] + objs[1:k + 1])
    err = _refused(tmp_path, capsys, tmp_path / "nocount.jsonl")
    assert f"nocount.jsonl:{k + 1}: request records=0: {k} step lines and no request line" in err
    assert "looks truncated" in err
    # cut among the request lines
    _write_lines(tmp_path / "reqs.jsonl", objs[:n - 3])
    err = _refused(tmp_path, capsys, tmp_path / "reqs.jsonl")
    assert f"reqs.jsonl:{n - 3}: request records={len(clean.requests) - 3}: the header says " \
           f"{len(clean.requests)}, but the file ends after this request line" in err


def test_fleet_replica_without_requests_is_named(tmp_path, capsys):
    h = _fleet_history(tmp_path)
    capsys.readouterr()
    assert main(["verify", "--history", str(h), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out.splitlines()
    for r in (2, 3):
        assert f"not checked: replica {r}: skipped: the router sent it no requests and it ran no step: nothing on " \
               "it to check" in out
    assert not any("no step records" in line for line in out)
    assert f"{h}: fleet of 4 replicas, 16 fleet steps, 4 requests (replicas 2, 3 got none), 0 findings" in out
    cov = json.loads((tmp_path / "r" / "report.json").read_text())["coverage"]
    assert not any(k.startswith("replica 2:") for k in cov) and cov["replica 0: KV-CONSERVE"] == "checked"


def _step_with(objs, **fields):
    i = next(i for i, o in enumerate(objs) if o["kind"] == "step")
    return i, objs[:i] + [{**objs[i], **fields}] + objs[i + 1:]


@pytest.mark.parametrize("case, field", [
    ("batch-int", "batch"), ("batch-short-pair", "batch"), ("running-str", "running"),
    ("queued-str-value", "queued"), ("counters-str", "counters"), ("service-null", "service"),
    ("step-index-null", "step_index"), ("event-tokens-str", "events.tokens"), ("events-int", "events"),
    ("held-str-value", "held"), ("block-ids-int", "block_ids"), ("reserved-str", "reserved"),
    ("missing-free-blocks", "free_blocks"), ("request-tenant-int", "tenant"),
])
def test_malformed_field_is_one_line_naming_file_line_and_field(tmp_path, clean, capsys, case, field):
    objs = _lines_of(clean)
    bad = {"batch-int": {"batch": 5}, "batch-short-pair": {"batch": [[1]]}, "running-str": {"running": "x"},
           "queued-str-value": {"queued": {"a": "x", "b": 0}}, "counters-str": {"counters": "x"},
           "service-null": {"service": None}, "step-index-null": {"step_index": None},
           "event-tokens-str": {"events": [{"kind": "queued", "request_id": 0, "tokens": "x"}]},
           "events-int": {"events": 5}, "held-str-value": {"held": {"0": "x"}}, "block-ids-int": {"block_ids": {"0": 5}},
           "reserved-str": {"reserved": "x"}}
    if case == "missing-free-blocks":
        i = 1
        objs[i] = {k: v for k, v in objs[i].items() if k != "free_blocks"}
    elif case == "request-tenant-int":
        i = next(i for i, o in enumerate(objs) if o["kind"] == "request")
        objs[i] = {**objs[i], "tenant": 5}
    else:
        i, objs = _step_with(objs, **bad[case])
    err = _refused(tmp_path, capsys, _write_lines(tmp_path / f"{case}.jsonl", objs))
    assert f"{case}.jsonl:{i + 1}: {field}=" in err


def test_empty_file_and_json_array_are_one_line(tmp_path, clean, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    assert "empty.jsonl: lines=0: empty file" in _refused(tmp_path, capsys, tmp_path / "empty.jsonl")
    objs = _lines_of(clean)
    (tmp_path / "one-array.jsonl").write_text(json.dumps(objs) + "\n")
    (tmp_path / "pretty-array.jsonl").write_text(json.dumps(objs, indent=1) + "\n")
    for name in ("one-array", "pretty-array"):
        err = _refused(tmp_path, capsys, tmp_path / f"{name}.jsonl")
        assert f"{name}.jsonl:1: json=" in err and "this is a JSON array: the format is JSON Lines" in err


def test_header_of_the_wrong_shape_is_one_line(tmp_path, clean, capsys):
    objs = _lines_of(clean)
    for name, cfg, words in (("cfg-int", 5, "config=5: must be an object"),
                             ("tenants-int", {**objs[0]["config"], "tenants": 5}, "config.tenants=5: must be a "
                                                                                  "non-empty list of tenant objects"),
                             ("no-config", None, "no-config.jsonl:1: config=None: the header has no configuration")):
        hdr = {k: v for k, v in objs[0].items() if k != "config"} if cfg is None else {**objs[0], "config": cfg}
        err = _refused(tmp_path, capsys, _write_lines(tmp_path / f"{name}.jsonl", [hdr] + objs[1:]))
        assert f"{name}.jsonl" in err and words in err


def test_step_naming_an_unknown_tenant_names_its_line(tmp_path, clean, capsys):
    objs = _lines_of(clean)
    i, objs = _step_with(objs, queued={**objs[1]["queued"], "zed": 0})
    err = _refused(tmp_path, capsys, _write_lines(tmp_path / "zed.jsonl", objs))
    assert f"zed.jsonl:{i + 1}: queued='zed': step 0 names a tenant that the header's configuration does not" in err


def test_queue_count_findings_follow_the_tenants_order_not_a_hash_seed():
    """Several tenants' queue counts wrong in one step: NO-LOSS reports them in the step's
    tenant order (they were in a set's order, which follows PYTHONHASHSEED for names)."""
    from tenantry.spec.invariants import check_history

    names = [f"tenant-{c}" for c in "qwertyuiop"]
    cfg = Config(tenants=tuple(TenantConfig(n) for n in names), num_blocks=64, max_num_seqs=1, token_budget=64,
                 order=OrderConfig(policy="fcfs"))
    h = simulate(cfg, Workload(tuple(Request(i, n, 0.0, 40, 4) for i, n in enumerate(names))))
    k = 1  # every tenant but the first still queues one request after step 1
    steps = tuple(attrs.evolve(s, queued={n: c + 1 for n, c in s.queued.items()}) if s.step_index == k else s
                  for s in h.steps)
    found = [f for f in check_history(attrs.evolve(h, steps=steps), cfg, ["NO-LOSS"]) if f.step == k]
    assert [f.tenants[0] for f in found] == names


def test_a_step_without_counters_is_not_judged_for_banked_credit():
    """A scheduler under test whose take_results raised leaves its step with no counters
    (``counters={}``); NO-BANKED-CREDIT read a newly backlogged tenant's counter there and
    the whole verify run died with a KeyError (found by a blind fault test).  It is skipped
    like VTC-GAP skips it, and judged again on the steps that have counters."""
    from tenantry.runner.history import History, StepRecord
    from tenantry.spec.invariants import check_history

    cfg = Config((TenantConfig("a"), TenantConfig("b")), order=OrderConfig(policy="vtc"))
    step = lambda k, queued, counters: StepRecord(k, float(k), 1.0, (), (), (), queued, {"a": 0, "b": 0}, 10,
                                                  counters, {}, {"a": 0.0, "b": 0.0}, {"a": 0.0, "b": 0.0})
    h = History({}, (step(0, {"a": 1, "b": 0}, {"a": 5.0, "b": 0.0}), step(1, {"a": 1, "b": 1}, {})), ())
    assert check_history(h, cfg, ["NO-BANKED-CREDIT"]) == []
    banked = History({}, (step(0, {"a": 1, "b": 0}, {"a": 5.0, "b": 0.0}), step(1, {"a": 1, "b": 1}, {"a": 5.0, "b": 1.0})), ())
    assert [f.invariant for f in check_history(banked, cfg, ["NO-BANKED-CREDIT"])] == ["NO-BANKED-CREDIT"]
