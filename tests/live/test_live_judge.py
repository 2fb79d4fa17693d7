"""``tenantry verify --history`` on a live recording (SPEC.md 7.10): the live forms on
hand-made recordings for the edge cases, the coverage that says why the rest is not
observable from outside, and recordings of ``tenantry serve`` (a fair server: clean; FCFS
under a flood with a claimed VTC bound: a finding)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tenantry.model.config import config_to_dict
from tenantry.runner.history import History, RequestRecord, write_history
from tenantry.runner.setups import build_config
from tenantry.spec.invariants import INVARIANTS, check_history, coverage
from tenantry.spec.invariants_live import (BLIND, LIVE_FORMS, MIN_PROBES, is_live, measures, probe_auc,
                                           waiting_intervals)
from tenantry.verify.offline import verify_history
from tenantry.verify.protocol import Claims

ROLES = [("a", "victim"), ("b", "victim")]


def _cfg(policy: str = "vtc", **tenant_kw):
    import attrs

    cfg = build_config(policy, ROLES)
    if tenant_kw:
        cfg = attrs.evolve(cfg, tenants=tuple(attrs.evolve(t, **tenant_kw) for t in cfg.tenants))
    return cfg


def _rec(rid, tenant, sent, *, out=3, prompt=10, outcome="finished", times=None, **kw) -> RequestRecord:
    """A live record: sent at ``sent``, answered then, its tokens at ``times`` (default: one every
    0.1 s from sent + 0.1)."""
    if times is None and outcome == "finished":
        times = [round(sent + 0.1 * (i + 1), 6) for i in range(out)]
    times = list(times or [])
    fields = dict(first_token_s=times[0] if times else None,
                  finish_s=times[-1] if times and outcome == "finished" else None, tokens_generated=len(times),
                  token_times=tuple(times), http_status=200, answered_s=sent)
    fields.update(kw)
    return RequestRecord(rid, tenant, sent, prompt, out, outcome, sent_s=sent, **fields)


def _live(recs, config=None, *, end_s=10.0, horizon_s=None, block=16) -> History:
    live = {"url": "http://127.0.0.1:1", "horizon_s": horizon_s, "stopped": None, "block_size_tokens": block}
    return History({"config": config_to_dict(config or _cfg()), "live": live, "end_s": end_s,
                    "requests": len(recs)}, (), tuple(sorted(recs, key=lambda r: r.request_id)))


def _found(history, config=None, claimed=()):
    return [(f.invariant, f.requests, f.tenants) for f in verify_history(history, config, claimed)]


def test_a_clean_recording_has_no_finding():
    """Before the live forms, every finished request of a recording was 'never admitted yet
    recorded as served' (the record form reads admitted_step, which a client never knows)."""
    h = _live([_rec(0, "a", 0.0), _rec(1, "b", 0.05), _rec(2, "a", 1.0, outcome="rejected", reason="refused",
                                                                    http_status=429, finish_s=1.01),
               _rec(3, "b", 1.5, outcome="cancelled", times=[1.6], finish_s=1.65)])
    assert is_live(h)
    assert _found(h) == []


@pytest.mark.parametrize("rec, horizon, why", [
    (_rec(1, "b", 1.0, outcome="unfinished", times=[1.1], failure="timeout", detail="no token for 60 s"),
     None, "was lost: its stream failed (timeout) after 1 of 3 tokens"),
    (_rec(1, "b", 1.0, outcome="unfinished", times=[], failure="connection", http_status=None, answered_s=None),
     None, "was lost: its stream failed (connection)"),
    (_rec(1, "b", 1.0, times=[1.1, 1.2]), None, "finished with 2 of its 3 output tokens"),
    (_rec(1, "b", 1.0, outcome="unfinished", times=[1.1]), None, "left unfinished without a recorded failure"),
    (_rec(1, "b", 1.0, outcome="rejected"), None, "rejected without a reason"),
    (_rec(1, "b", 1.0, token_times=(1.1, 1.2)), None, "2 token times for 3 tokens"),
    (_rec(1, "b", 1.0, times=[0.5, 1.1, 1.2]), None, "before the request was sent"),
])
def test_no_loss_from_outside_names_each_lost_or_incoherent_request(rec, horizon, why):
    found = verify_history(_live([_rec(0, "a", 0.0), rec], horizon_s=horizon))
    assert [(f.invariant, f.requests) for f in found] == [("NO-LOSS", (1,))]
    assert why in found[0].message


def test_open_at_the_horizon_or_never_sent_is_not_lost():
    open_ = _rec(1, "b", 1.0, outcome="unfinished", times=[1.1])
    never = RequestRecord(2, "a", 9.5, 10, 3, "unfinished")
    assert _found(_live([_rec(0, "a", 0.0), open_, never], horizon_s=8.0)) == []
    # the client waited for every request (no horizon): an open record is a finding, the unsent one is not
    assert _found(_live([_rec(0, "a", 0.0), open_, never])) == [("NO-LOSS", (1,), ("b",))]


def test_bounded_wait_from_send_to_first_token():
    cfg = _cfg(max_wait_s=1.0)
    recs = [_rec(0, "a", 0.0, times=[1.5, 1.6, 1.7]),  # 1.5 s: over
            _rec(1, "a", 2.0, times=[2.9, 3.0, 3.1]),  # 0.9 s: within
            _rec(2, "b", 3.0, outcome="cancelled", times=[], finish_s=3.8),  # gone before its deadline
            _rec(3, "b", 4.0, outcome="cancelled", times=[], finish_s=5.5),  # waited 1.5 s, then went away
            _rec(4, "b", 8.5, outcome="unfinished", times=[]),  # still waiting at the end (10 s)
            _rec(5, "a", 5.0, outcome="rejected", reason="refused", times=[], finish_s=5.0)]
    h = _live(recs, cfg, horizon_s=10.0)
    found = [f for f in verify_history(h, cfg, ["BOUNDED-WAIT"]) if f.invariant == "BOUNDED-WAIT"]
    assert [f.requests for f in found] == [(0,), (3,), (4,)]
    assert found[0].observed == pytest.approx(1.5) and found[0].allowed == 1.0
    assert "still waits" in found[2].message


def _flood(victim_first_token: float, answered: float = 0.0) -> History:
    """b is sent a request at 0 (answered at ``answered``) whose first token comes at
    ``victim_first_token``; meanwhile a (40 requests sent at 0, each streaming 40 tokens in a second,
    one starting every 0.3 s) gets 133 tokens a second."""
    recs = [_rec(0, "b", 0.0, out=3, times=[victim_first_token + 0.01 * i for i in range(3)], answered_s=answered)]
    for k in range(40):
        recs.append(_rec(1 + k, "a", 0.0, out=40, times=[round(0.1 + k * 0.3 + 0.025 * i, 6) for i in range(40)]))
    return _live(recs, end_s=12.0)


def test_the_service_gap_counts_only_while_both_wait_from_outside():
    cfg = _cfg()
    # D from the records: w_out * M, M = max_num_seqs * (10 + 40): 2 * 8 * 50 = 800; bound 1600
    slow = _flood(9.0)
    found = [f for f in verify_history(slow, cfg, ["VTC-GAP"]) if f.invariant == "VTC-GAP"]
    assert [(f.tenants, f.allowed) for f in found] == [(("a", "b"), 1600.0)]
    assert found[0].observed > 1600
    # the victim got its first token at 0.5 s: it no longer waits, a's later service is fair
    assert [f for f in verify_history(_flood(0.5), cfg, ["VTC-GAP"]) if f.invariant == "VTC-GAP"] == []
    # from the server's answer on: answered at 8.5 s, b waited 0.5 s, not 9 (its trip to the server is no wait)
    assert waiting_intervals(_flood(9.0, answered=8.5))["b"] == [(8.5, 9.0)]
    assert [f for f in verify_history(_flood(9.0, answered=8.5), cfg, ["VTC-GAP"]) if f.invariant == "VTC-GAP"] == []


def test_refusal_reasons_agree_with_what_the_client_knows():
    import attrs

    cfg = _cfg("fcfs")
    cfg = attrs.evolve(cfg, max_context_tokens=100, admission=attrs.evolve(cfg.admission, queue_bound=True),
                       tenants=(attrs.evolve(cfg.tenants[0], queue_bound=2), cfg.tenants[1]))
    no = dict(times=[], http_status=429)
    recs = [_rec(0, "a", 0.0, outcome="rejected", reason="too_long", finish_s=0.0, **no),  # 13 tokens fit 100
            _rec(1, "a", 0.1, out=95, outcome="rejected", reason="too_long", finish_s=0.1, **no),  # 105: true
            _rec(2, "b", 0.2, outcome="rejected", reason="queue_full", finish_s=0.2, **no),  # b has no bound
            _rec(3, "a", 1.0, outcome="unfinished", times=[], failure="timeout"),  # open, no token: may be queued
            _rec(4, "a", 1.1, outcome="rejected", reason="queue_full", finish_s=1.1, **no),  # 1 open < bound 2
            _rec(5, "a", 1.2, times=[5.0, 5.1, 5.2]),  # queued until 5 s
            _rec(6, "a", 1.3, outcome="rejected", reason="queue_full", finish_s=1.3, **no),  # 2 open: true
            _rec(7, "b", 1.4, outcome="rejected", reason="refused", finish_s=1.4, **no),  # no reason: not judged
            _rec(8, "b", 1.5, outcome="rejected", reason="gremlins", finish_s=1.5, **no)]
    found = [f for f in verify_history(_live(recs, cfg), cfg) if f.invariant == "REFUSAL-TRUTH"]
    assert [f.requests for f in found] == [(0,), (2,), (4,), (8,)]
    assert "its 13 tokens fit the context limit" in found[0].message
    assert "1 never-scheduled requests queued (bound 2)" in found[2].message


def _probes(fast_when_cached: bool, n: int = 8) -> History:
    """b sends n documents (2 blocks each); then a probes: even k a document b sent (cached),
    odd k a new one; a cached probe answers in 20 ms, a new one in 120 ms (or both in 70 ms
    ± 1 ms, alternating, when nothing leaks)."""
    recs, rid = [], 0
    for d in range(n):
        recs.append(_rec(rid, "b", 0.1 * d, prompt=40, out=1, times=[0.1 * d + 0.05], prefix_ids=(d * 10, d * 10 + 1)))
        rid += 1
    t = 2.0
    for k in range(2 * n):
        cached = k % 2 == 0
        ids = (k // 2 * 10, k // 2 * 10 + 1) if cached else (10_000 + k, 10_001 + k)
        ttft = (0.02 if cached else 0.12) if fast_when_cached else 0.07 + (0.001 if (k // 2) % 2 else -0.001)
        recs.append(_rec(rid, "a", t, prompt=40, out=1, times=[round(t + ttft, 6)], prefix_ids=ids))
        rid, t = rid + 1, t + 0.3
    return _live(recs, _cfg("fcfs"), end_s=t + 1)


def test_the_prefix_probe_from_outside():
    leak, clean = _probes(True), _probes(False)
    auc, pos, neg, z = probe_auc(leak, "a", 16)
    assert (auc, pos, neg) == (1.0, 8, 8) and z > 3
    auc, pos, neg, z = probe_auc(clean, "a", 16)
    assert (pos, neg) == (8, 8) and auc == pytest.approx(0.5, abs=0.1) and abs(z) < 1
    cfg = _cfg("fcfs")  # prefix cache off: NONINTERFERENCE is claimable
    assert [(f.invariant, f.tenants) for f in verify_history(leak, cfg, ["NONINTERFERENCE"])] == [
        ("NONINTERFERENCE", ("a",))]
    assert verify_history(clean, cfg, ["NONINTERFERENCE"]) == []
    # too few probes: no verdict
    assert probe_auc(_probes(True, n=MIN_PROBES - 1), "a", 16)[0] == 0.5
    # a block size under which the prompts hold no full block of prefix: nothing is labelled
    assert probe_auc(leak, "a", 64)[1:3] == (0, 0)


def test_every_invariant_is_judged_from_outside_or_says_why_not():
    assert set(INVARIANTS) == set(LIVE_FORMS) | set(BLIND) and not set(LIVE_FORMS) & set(BLIND)
    h = _probes(True)
    cfg = _cfg("fcfs", max_wait_s=5.0)
    cov = coverage(h, Claims(cfg, invariants=("BOUNDED-WAIT", "NONINTERFERENCE", "FCFS-TENANT")))
    for i in BLIND:
        assert cov[i].startswith("skipped: not observable from outside: it needs") or "state form only" in cov[i] \
            or cov[i].startswith("skipped: not observable from outside: it has"), (i, cov[i])
    assert "block table" in cov["KV-CONSERVE"]
    assert (cov["NO-LOSS"], cov["REFUSAL-TRUTH"], cov["BOUNDED-WAIT"], cov["NONINTERFERENCE"]) == ("checked",) * 4
    assert cov["VTC-GAP"] == "not applicable to this configuration"
    no_times = _live([_rec(0, "a", 0.0, token_times=()), _rec(1, "b", 0.0)])
    assert "no token times" in coverage(no_times, Claims(_cfg(), invariants=("VTC-GAP",)))["VTC-GAP"]


def test_verify_history_prints_what_it_measured_from_outside(tmp_path):
    p = tmp_path / "live.jsonl"
    write_history(_probes(True), p)
    r = subprocess.run([sys.executable, "-m", "tenantry.cli", "verify", "--history", str(p), "--claims",
                        "NONINTERFERENCE", "--out", str(tmp_path / "r")], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "NONINTERFERENCE whole run tenant a: a's first tokens came sooner" in r.stdout
    assert "prefix probe of a: AUC 1.000 (8 prompts whose prefix another tenant had sent, 8 with a new prefix" \
        in r.stdout
    assert "not checked: KV-CONSERVE: skipped: not observable from outside: it needs the server's KV block table" \
        in r.stdout
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["live"]["probe"]["a"]["auc"] == 1.0 and rep["live"]["lost"] == 0
    assert "## Measured from outside" in (tmp_path / "r" / "report.md").read_text()


# --- recordings of tenantry serve ----------------------------------------------------------------

SERVE_TOML = """
[replica]
max_num_seqs = 4
[order]
policy = "{policy}"
[[tenants]]
name = "adv"
[[tenants]]
name = "vic"
"""


def _serve_flood_workload(tmp_path):
    """adv sends 60 requests at once (64-token prompts, 16 tokens out), vic one request every 0.3 s
    from 0.2 s: FCFS serves the whole flood first (about 6 s of the model's time), VTC takes vic's
    requests in at the next free slot."""
    from tenantry.runner.traces import write_workload_jsonl
    from tenantry.model.workload import Request, Workload, renumber

    reqs = [Request(0, "adv", round(0.001 * i, 6), 64, 16) for i in range(60)]
    reqs += [Request(0, "vic", round(0.2 + 0.3 * i, 6), 32, 16) for i in range(4)]
    p = tmp_path / "flood.jsonl"
    write_workload_jsonl(Workload(renumber(reqs)), p)
    return p


@pytest.mark.parametrize("policy, gap_found", [("vtc", False), ("fcfs", True)])
def test_a_recording_of_serve_is_judged_against_a_claimed_vtc_bound(tmp_path, policy, gap_found):
    """The same flood replayed against serve running VTC and FCFS, each recording judged against
    the claim 'VTC with its bound' (the --config of the claim says vtc): the fair server is clean,
    the FCFS one breaks the service gap while the victim waits behind the flood."""
    pytest.importorskip("uvicorn")
    from live_helpers import serving

    served = tmp_path / "served.toml"
    served.write_text(SERVE_TOML.format(policy=policy))
    claim = tmp_path / "claim.toml"
    claim.write_text(SERVE_TOML.format(policy="vtc"))
    wl, rec = _serve_flood_workload(tmp_path), tmp_path / "rec.jsonl"
    with serving("--config", str(served), "--time-scale", "2") as (url, _):
        r = subprocess.run([sys.executable, "-m", "tenantry.cli", "replay", url, "--workload", str(wl), "--config",
                            str(served), "--time-scale", "2", "--history", str(rec)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    from tenantry.runner.history import read_history

    assert all(r.sent_s <= r.answered_s <= r.first_token_s for r in read_history(rec).requests)  # answered_s kept
    v = subprocess.run([sys.executable, "-m", "tenantry.cli", "verify", "--history", str(rec), "--config", str(claim),
                        "--claims", "VTC-GAP", "--out", str(tmp_path / "rep")], capture_output=True, text=True)
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    gap = rep["live"]["service_gap"]["adv/vic"]
    found = [f["invariant"] for f in rep["findings"]]
    assert rep["coverage"]["VTC-GAP"] == "checked" and rep["coverage"]["NO-LOSS"] == "checked"
    if gap_found:
        assert v.returncode == 1 and found == ["VTC-GAP"], v.stdout
        assert gap["ratio"] > 1.5, gap
    else:
        assert v.returncode == 0 and found == [], v.stdout
        assert gap["ratio"] < 0.5, gap
