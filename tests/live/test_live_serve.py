"""``tenantry serve`` and ``tenantry replay`` together (both bind and contact 127.0.0.1 only):
the model behind HTTP is the model, and a replay against it agrees with ``tenantry simulate``."""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict

import attrs
import pytest

from tenantry.live.engine import tokens_done
from tenantry.model.workload import Request, Workload, renumber
from tenantry.runner.history import read_history
from tenantry.runner.setups import build_config
from tenantry.runner.simulate import run_steps, simulate

from live_helpers import serving

pytest.importorskip("httpx")
pytest.importorskip("httpx_sse")
pytest.importorskip("uvicorn")

ROLES = [("heavy", "victim"), ("light", "victim")]


def _two_tenants() -> Workload:
    """A burst of 16 heavy requests (96-token prompts) in 0.15 s and 8 light ones, one every
    0.1 s from 0.05 s, all of 24 output tokens: FCFS serves the burst first, VTC interleaves."""
    reqs = [Request(0, "heavy", round(0.01 * i, 6), 96, 24) for i in range(16)]
    reqs += [Request(0, "light", round(0.05 + 0.1 * i, 6), 32, 24) for i in range(8)]
    return Workload(renumber(reqs))


def _replay(url, workload, scale, **kw):
    from tenantry.live.client import ReplayOptions, run_replay
    from tenantry.live.record import live_history

    rep = run_replay(workload, ReplayOptions(url=url, time_scale=scale, **kw))
    return live_history(workload.requests, rep.seen, {"end_s": rep.end_s}), rep


def _model_token_times(config, workload) -> dict[int, list[float]]:
    """When each output token is produced in the model's run (the end of its step)."""
    times, done = defaultdict(list), defaultdict(int)
    for tr in run_steps(config, workload):
        end = tr.output.start_s + tr.output.duration_s
        for rid, n in tokens_done(tr).items():
            if n > done[rid]:
                times[rid] += [end] * (n - done[rid])
                done[rid] = n
    return times


def _shares_at_half(times: dict[int, list[float]], workload: Workload) -> dict[str, float]:
    """Each tenant's share of the output tokens delivered by the time half of all were (the
    time of each run's own halfway token: a client's clock and the model's need not agree)."""
    every = sorted(t for ts in times.values() for t in ts)
    half = every[len(every) // 2]
    got: dict[str, int] = defaultdict(int)
    for rid, ts in times.items():
        got[workload.requests[rid].tenant] += sum(t <= half for t in ts)
    total = sum(got.values())
    return {k: v / total for k, v in sorted(got.items())}


def _discordant(ref, other, workload, step_s: float, jitter_s: float) -> tuple[int, int]:
    """(pairs served in the other order, pairs compared): pairs whose first tokens are more than
    two steps apart in ``ref`` and whose arrivals are more than a step plus ``jitter_s`` apart
    (closer ones are ties: the client's lag may have swapped their arrivals)."""
    fa = {r.request_id: r.first_token_s for r in ref.requests}
    fb = {r.request_id: r.first_token_s for r in other.requests}
    arr = {r.request_id: r.arrival_s for r in workload.requests}
    pairs = [(x, y) for x, y in itertools.permutations(fa, 2)
             if fa[x] + 2 * step_s < fa[y] and abs(arr[x] - arr[y]) > step_s + jitter_s]
    return sum(fb[x] > fb[y] for x, y in pairs), len(pairs)


def test_serve_runs_the_model_on_the_arrivals_it_saw(tmp_path, policy="vtc"):
    """What serve did is exactly simulate's run of the same requests at the instants serve received
    them: the same request records and the same steps (its history, written when it stops); and
    the client saw first tokens in serve's order, up to ties within one step plus 0.1 s of wall
    time (0.2 s of the model's clock at time scale 2): a first token reaches the client that much
    later than its step's end at most, when serve's loop and the client's are busy with a burst
    (measured: up to 58 ms, 4 ms at the median)."""
    wl, hist = _two_tenants(), tmp_path / "serve.jsonl"
    with serving("--policy", policy, "--tenants", "heavy", "light", "--time-scale", "2", "--history", str(hist)) \
            as (url, out):
        live, _ = _replay(url, wl, 2.0)
    assert out["returncode"] == 130 and out["stop_s"] < 2.0
    served = read_history(hist)
    arrived = {r.request_id: r.arrival_s for r in served.requests}
    again = simulate(build_config(policy, ROLES), Workload(tuple(attrs.evolve(r, arrival_s=arrived[r.request_id])
                                                                    for r in wl)))
    assert served.requests == again.requests and served.steps == again.steps
    assert [r.outcome for r in served.requests] == ["finished"] * len(wl)
    tie = max(s.duration_s for s in served.steps) + 0.1 * 2.0
    ft = {r.request_id: r.first_token_s for r in served.requests}
    seen = {r.request_id: r.first_token_s for r in live.requests}
    later = [(a, b) for a, b in itertools.permutations(ft, 2) if ft[a] + tie < ft[b] and seen[a] > seen[b]]
    assert later == []
    assert [r.tokens_generated for r in live.requests] == [r.output_tokens for r in wl]


@pytest.mark.parametrize("policy", ["fcfs", "vtc"])
def test_a_replay_against_serve_agrees_with_simulate(policy):
    """The client's recording of a replay against serve (time scale 0.5) agrees with simulate on
    the same workload and setup: the order of service (pairs whose first tokens are more than two
    steps apart and whose arrivals are more than a step and the client's measured lag apart: at
    most 8% of them served the other way) and the light tenant's share of the tokens delivered by
    the halfway token (within 0.1).  Why not exact: arrival instants move with the client's and
    the network's lag, and under VTC a request landing one step later can change which tenant's
    counter is lowest for the rest of the run.  Measured over 9 runs per policy (4 beside a busy
    process): VTC at most 4.4% of the pairs and 0.037 of the share, FCFS 0 and 0.002; at time
    scale 1 and 2, VTC reached 5% and 0.10.  The share differs by 0.30 between the two policies,
    so 0.1 still tells them apart; what serve did is exactly simulate's run of the arrivals it
    saw (the test above)."""
    wl = _two_tenants()
    cfg = build_config(policy, ROLES)
    sim = simulate(cfg, wl)
    step = max(s.duration_s for s in sim.steps)
    with serving("--policy", policy, "--tenants", "heavy", "light", "--time-scale", "0.5") as (url, _):
        live, rep = _replay(url, wl, 0.5)
    assert [r.outcome for r in live.requests] == ["finished"] * len(wl)
    bad, pairs = _discordant(sim, live, wl, step, rep.max_lag_s)
    # under load the client lags more and fewer pairs stay separated (35 seen at a load of 7): 20 still say it
    assert pairs >= 20 and bad <= 0.08 * pairs, (bad, pairs, rep.max_lag_s)
    want = _shares_at_half(_model_token_times(cfg, wl), wl)
    got = _shares_at_half({r.request_id: list(r.token_times) for r in live.requests}, wl)
    assert abs(got["light"] - want["light"]) <= 0.1, (got, want, rep.max_lag_s)
    assert want["light"] == pytest.approx({"fcfs": 0.081, "vtc": 0.383}[policy], abs=0.001)


def _overtaken(history, adversaries, victims) -> float:
    """Mean, over the victims' requests, of the adversary requests that arrived before it and got
    their first token after it (0 under FCFS, up to ties).  Arrivals: when the client sent them
    (``sent_s``, what the server saw) in a live recording, else ``arrival_s``."""
    at = {r.request_id: r.sent_s if r.sent_s is not None else r.arrival_s for r in history.requests}
    adv = [(at[r.request_id], r.first_token_s) for r in history.requests if r.tenant in adversaries]
    vic = [r for r in history.requests if r.tenant in victims]
    assert all(r.first_token_s is not None for r in history.requests)
    return sum(sum(a < at[v.request_id] and f > v.first_token_s for a, f in adv) for v in vic) / len(vic)


def test_a_flood_passes_the_victims_under_vtc_and_not_under_fcfs_live_as_in_the_model():
    """The flood pattern (shorter than its default: 15 requests/s of 512-token prompts for 4 s)
    with the default victims of their first 6 s, replayed against serve under FCFS and under VTC
    (time scale 3): under FCFS a victim's request waits for every flood request that came before
    it, under VTC it passes some (15 in the model's run), live as in the model.  (An order, which the
    server's and the client's lag do not change, unlike the TTFTs: beside busy processes the
    server fell seconds behind and every TTFT the client measured grew.)"""
    from tenantry.adversaries.patterns import make_scenario

    sc = make_scenario("flood", {"rate_per_s": 15, "duration_s": 4, "prompt_tokens": 512, "output_tokens": 32}, 0)
    wl = Workload(tuple(r for r in sc.workload if r.arrival_s < 6.0))
    passed = {}
    for policy in ("fcfs", "vtc"):
        model = simulate(build_config(policy, sc.roles), wl)
        with serving("--policy", policy, "--time-scale", "3") as (url, _):
            live, _ = _replay(url, wl, 3.0)
        for name, h in (("model", model), ("live", live)):
            passed[name, policy] = _overtaken(h, sc.adversaries, sc.victims)
    assert passed["model", "fcfs"] < 0.5 and passed["model", "vtc"] > 10, passed
    # live (measured): FCFS 0 to 0.07, VTC 14 unloaded; at a load average of 12 on the 2 cores the
    # server took requests in late and VTC's fell to 3 to 5: still more than 2 passed on average
    assert passed["live", "fcfs"] < 1.0 and passed["live", "vtc"] > 2.0, passed


def test_a_disconnect_is_a_cancellation_on_both_sides(tmp_path):
    """Requests with a cancel_s mid-stream: the client disconnects then and records them cancelled
    (their tokens so far kept), and serve's model cancels the same requests; the others finish."""
    reqs = [Request(i, "ab"[i % 2], 0.05 * i, 32, 200, cancel_s=0.05 * i + 0.5 if i % 3 == 0 else None)
            for i in range(9)]  # 200 tokens take some 5 s: far from over when the client goes away
    wl, hist = Workload(tuple(reqs)), tmp_path / "serve.jsonl"
    with serving("--policy", "fcfs", "--tenants", "a", "b", "--time-scale", "2", "--history", str(hist)) as (url, _):
        live, _ = _replay(url, wl, 2.0)
    served = read_history(hist)
    cancelled = [r.request_id for r in wl if r.cancel_s is not None]
    assert [r.request_id for r in live.requests if r.outcome == "cancelled"] == cancelled
    assert [r.request_id for r in served.requests if r.outcome == "cancelled"] == cancelled
    for r in live.requests:
        if r.outcome == "cancelled":
            cancel = wl.requests[r.request_id].cancel_s  # the client's lag may make it late, never early
            assert 0 < r.tokens_generated < 100 and cancel <= r.finish_s < cancel + 0.5
            assert served.requests[r.request_id].tokens_generated >= r.tokens_generated
        else:
            assert (r.outcome, r.tokens_generated) == ("finished", 200)


def test_the_models_refusal_is_a_429_with_its_reason_and_retry_after(tmp_path):
    """Under the rate-limit setup a burst is refused by the model: the client records the model's
    reason and retry-after (read from serve's 429 body), the status and the body."""
    reqs = [Request(i, "adv", 0.001 * i, 16, 2) for i in range(12)]
    wl = Workload(tuple(reqs))
    with serving("--policy", "rate_limit", "--tenants", "adv") as (url, _):
        live, _ = _replay(url, wl, 1.0)
    refused = [r for r in live.requests if r.outcome == "rejected"]
    assert refused and all(r.outcome == "finished" for r in live.requests if r not in refused)
    r = refused[0]
    assert (r.reason, r.http_status) == ("rate_limit", 429) and r.retry_after_s > 0
    assert json.loads(r.detail)["error"]["reason"] == "rate_limit"


def test_serve_answers_what_it_cannot_serve_in_one_line():
    import httpx

    with serving("--policy", "fcfs", "--tenants", "a") as (url, _):
        with httpx.Client(base_url=url, trust_env=False, timeout=10) as c:
            assert c.get("/health").status_code == 200
            assert c.get("/v1/models").json()["data"][0]["id"] == "tenantry"
            bad = c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "user": "zed"})
            assert bad.status_code == 400
            assert bad.json()["error"]["message"] == ("tenant='zed': unknown tenant; configured: a")
            text = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "user": "a"})
            assert text.status_code == 400 and "token ids" in text.json()["error"]["message"]
            whole = c.post("/v1/completions", json={"prompt": [5] * 20, "max_tokens": 3, "user": "a"})
            assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] == 3
            assert c.get("/nowhere").status_code == 404


def test_replay_of_a_pattern_prints_its_objective_and_draws_the_ttft_plot(tmp_path, capsys):
    """``replay --pattern``: the pattern's objective (the victims replayed alone for the baseline),
    each metric a client measures, n/a for those that need the server's steps, and --plots
    writes the victims' TTFT CDF into a marked report folder."""
    from tenantry.cli import main

    plots, hist = tmp_path / "plots", tmp_path / "h.jsonl"
    with serving("--policy", "vtc", "--time-scale", "8") as (url, _):
        code = main(["replay", url, "--pattern", "slow_decoders", "--time-scale", "8", "--history", str(hist),
                     "--plots", str(plots)])
    out = capsys.readouterr().out
    assert code == 0
    line = next(l for l in out.splitlines() if l.startswith("slow_decoders: "))
    assert line.startswith("slow_decoders: ttft_p99_inflation = ") and line.endswith("(hurt at 10)")
    assert "  goodput_loss " in out and "  service_gap                      n/a (needs the server's steps)" in out
    assert sorted(p.name for p in plots.iterdir()) == [".tenantry-report", "ttft_cdf.png"]
    h = read_history(hist)
    assert h.header["pattern"] == "slow_decoders" and h.header["live"]["time_scale"] == 8.0


def test_replay_of_a_cell_file_takes_its_roles_from_the_cell(tmp_path, capsys):
    """A workload file with a cell.json beside it (a matrix cell's) is replayed as that cell's
    scenario: its pattern's objective is printed."""
    from tenantry.cli import main
    from tenantry.runner.traces import write_workload_jsonl

    cell = tmp_path / "cells" / "vtc" / "flood"
    cell.mkdir(parents=True)
    reqs = [Request(i, "adv" if i % 2 else "chat", 0.05 * i, 64, 8) for i in range(12)]
    write_workload_jsonl(Workload(tuple(reqs)), cell / "workload.jsonl")
    (cell / "cell.json").write_text(json.dumps({"setup": "vtc", "pattern": "flood", "objective": "ttft_p99_inflation",
                                                "score": 1.0, "adversaries": ["adv"], "victims": ["chat"]}))
    with serving("--policy", "vtc", "--tenants", "adv", "chat", "--time-scale", "4") as (url, _):
        code = main(["replay", url, "--workload", str(cell / "workload.jsonl"), "--time-scale", "4"])
    captured = capsys.readouterr()
    assert code == 0 and "(cell vtc / flood)" in captured.err
    assert any(l.startswith("flood: ttft_p99_inflation = ") for l in captured.out.splitlines())


def test_ctrl_c_stops_serve_with_streams_open_and_the_client_records_the_cut():
    """SIGINT while six streams run: serve ends them and exits within 2 s with one line (no
    traceback from its open connections), and the client records each as cut after its tokens."""
    import threading

    from tenantry.live.client import ReplayOptions, run_replay

    wl = Workload(tuple(Request(i, "a", 0.01 * i, 32, 2000) for i in range(6)))
    got = {}
    with serving("--policy", "fcfs", "--tenants", "a") as (url, out):
        t = threading.Thread(target=lambda: got.setdefault("rep", run_replay(wl, ReplayOptions(url=url, timeout_s=5))))
        t.start()
        time.sleep(2.0)  # every stream is under way (2,000 tokens take some 50 s)
    t.join(10)
    assert out["returncode"] == 130 and out["stop_s"] < 2.0
    assert out["stderr"].strip().splitlines() == [l for l in out["stderr"].strip().splitlines()
                                                  if l.startswith("tenantry: interrupted after serving 6 requests")]
    seen = got["rep"].seen.values()
    assert len(seen) == 6 and all(s.outcome == "unfinished" and s.failure == "connection" and 0 < s.tokens < 2000
                                  for s in seen)


def test_a_fleet_served_is_the_fleet_simulated_on_the_arrivals_it_saw(tmp_path):
    """``serve --policy fleet_prefix_affinity``: four replicas behind the router; its fleet history
    is exactly simulate_fleet's run of the requests at the instants serve received them, and every
    replica served some of them."""
    from tenantry.runner.fleet import simulate_fleet
    from tenantry.runner.setups import build_fleet

    wl = Workload(tuple(Request(i, ["adv", "chat"][i % 2], 0.02 * i, 64, 16, prefix_ids=(5, 6) if i % 2 else ())
                        for i in range(16)))
    hist = tmp_path / "fleet.jsonl"
    with serving("--policy", "fleet_prefix_affinity", "--tenants", "adv", "chat", "--time-scale", "2",
                 "--history", str(hist)) as (url, out):
        live, _ = _replay(url, wl, 2.0)
    assert "4 replicas" in out["banner"] and [r.outcome for r in live.requests] == ["finished"] * 16
    served = read_history(hist)
    arrived = {r.request_id: r.arrival_s for r in served.requests}
    fleet = build_fleet("fleet_prefix_affinity", [("adv", "adversary"), ("chat", "victim")])
    again = simulate_fleet(fleet, Workload(tuple(attrs.evolve(r, arrival_s=arrived[r.request_id]) for r in wl)))
    assert served.requests == again.requests and served.fleet_steps == again.fleet_steps
    assert {r.replica for r in served.requests} == {0, 1, 2, 3}
