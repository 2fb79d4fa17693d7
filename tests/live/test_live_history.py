"""A live recording as a history (SPEC.md 6 and 12.2), and the driver loop over a live feed
(SPEC.md 5.1): what the HTTP room adds to the model package, without any HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tenantry.adversaries.objectives import censored_ttfts
from tenantry.live.engine import LiveFeed
from tenantry.live.record import Seen, live_history
from tenantry.model.config import ConfigError
from tenantry.model.workload import Request, Workload
from tenantry.runner.history import History, RequestRecord, read_history, write_history
from tenantry.runner.setups import build_config
from tenantry.runner.simulate import ModelReplica, Recorder, drive, simulate
from conftest import REPO

SCHEMA = json.loads((REPO / "spec" / "history_schema.json").read_text())


def _recording() -> History:
    reqs = [Request(0, "a", 0.0, 10, 3), Request(1, "b", 0.5, 10, 2), Request(2, "a", 1.0, 10, 2),
            Request(3, "b", 1.5, 10, 2), Request(4, "a", 9.0, 10, 2)]
    seen = {i: Seen() for i in range(4)}
    seen[0].sent_s = 0.001
    seen[0].http_status = 200
    for t in (0.2, 0.25, 0.3):
        seen[0].got(1, t)
    seen[0].outcome = "finished"
    seen[1].sent_s, seen[1].http_status = 0.5, 429
    seen[1].outcome, seen[1].reason, seen[1].retry_after_s, seen[1].finish_s = "rejected", "refused", 2.0, 0.51
    seen[1].detail = '{"error": "slow down"}'
    seen[2].sent_s, seen[2].http_status = 1.0, 200
    seen[2].got(1, 1.2)
    seen[2].fail("timeout", "no answer or token for 1 s")
    seen[3].sent_s = 1.5
    seen[3].fail("connection", "ConnectError: refused")
    return live_history(reqs, seen, {"live": {"url": "http://127.0.0.1:1"}, "end_s": 4.0, "requests": 5})


def test_a_live_recording_is_written_read_back_and_follows_the_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    h = _recording()
    p = tmp_path / "live.jsonl"
    write_history(h, p)
    back = read_history(p)
    assert back.requests == h.requests and back.header == {"format": 2, **h.header}
    lines = [json.loads(x) for x in p.read_text().splitlines()]
    for line in lines:
        jsonschema.validate(line, SCHEMA)
    r0, r1, r2, r3, r4 = lines[1:]
    assert r0["token_times"] == [0.2, 0.25, 0.3] and r0["first_token_s"] == 0.2 and r0["finish_s"] == 0.3
    assert (r1["outcome"], r1["reason"], r1["http_status"], r1["retry_after_s"]) == ("rejected", "refused", 429, 2.0)
    assert (r2["outcome"], r2["failure"], r2["tokens_generated"], r2["finish_s"]) == ("unfinished", "timeout", 1, None)
    assert (r3["failure"], "http_status" in r3) == ("connection", False)
    live_fields = {"sent_s", "token_times", "http_status", "failure", "detail"}
    assert not live_fields & set(r4) and r4["outcome"] == "unfinished"  # never sent: no live field


@pytest.mark.parametrize("field, value, why", [
    ("failure", "gremlins", "must be one of timeout, connection, bad_stream, server_error"),
    ("http_status", 42, "must be an HTTP status"),
    ("token_times", [0.1, -1], "must be a list of finite numbers of seconds"),
    ("sent_s", "soon", "must be a finite number of seconds"),
    ("detail", 7, "must be a string"),
    ("reason", 999, "must be a string"),
])
def test_a_bad_live_field_is_one_line_naming_it(tmp_path, field, value, why):
    p = tmp_path / "h.jsonl"
    write_history(_recording(), p)
    lines = p.read_text().splitlines()
    rec = json.loads(lines[1])
    rec[field] = value
    lines[1] = json.dumps(rec)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=why) as e:
        read_history(p)
    assert f"h.jsonl:2: {field}=" in str(e.value) and "\n" not in str(e.value)


def test_the_end_of_a_recording_without_steps_censors_ttfts():
    """A request that never got a token waits until the recording's end (header ``end_s``), not
    until 0: before, a live history's end was 0 and a starved request's censored TTFT 0 s."""
    h = _recording()
    assert h.end_s == 4.0
    ttfts = censored_ttfts(h, ["a", "b"])
    # a: request 0 (0.2 s), request 2 (timed out after its first token: 0.2 s); request 4 never sent
    # b: request 1 refused, request 3's connection failed before any answer: neither was admitted
    assert ttfts == {"a": [pytest.approx(0.2), pytest.approx(0.2)], "b": []}
    starved = History(h.header, (), (RequestRecord(7, "a", 1.0, 10, 2, "unfinished", sent_s=1.0, http_status=200),))
    assert censored_ttfts(starved, ["a"]) == {"a": [3.0]}


def _drive_live(config, requests, cancels=()):
    """The driver loop over a live feed, requests added as the loop asks for them."""
    rep, feed, rec = ModelReplica(config), LiveFeed(), Recorder(config)
    pending = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    cancels = sorted(cancels)
    waits = 0
    steps = drive(rep, feed)
    while True:
        while pending and pending[0].arrival_s <= rep.t_s:  # what arrived while the last step ran
            rec.offered(pending[0])
            feed.add(pending.pop(0))
        while cancels and cancels[0][0] <= rep.t_s:
            feed.cancel(*cancels.pop(0))
        inputs = next(steps, StopIteration)
        if inputs is StopIteration:
            break
        if inputs is None:
            waits += 1
            if pending:
                rec.offered(pending[0])
                feed.add(pending.pop(0))
            else:
                feed.close()
            continue
        rec.observe(rep.last.state, rep.last.output)
    return rec.history(rep.state, {}), waits


def test_the_driver_over_a_live_feed_is_the_driver_over_the_workload():
    """Requests handed to an open feed as the model's clock reaches their arrival (a live server's
    case) give the run simulate gives: the same request records, step for step; the loop waits
    (yields None) when the replica is empty and the feed has nothing yet, and ends once closed."""
    cfg = build_config("vtc", [("a", "victim"), ("b", "victim")])
    reqs = [Request(i, "ab"[i % 3 == 0], 0.01 * i if i < 12 else 3.0 + 0.05 * i, 40 + i, 6 + i % 5)
            for i in range(20)]
    cancels = [(0.08, 5), (3.9, 17)]
    live, waits = _drive_live(cfg, reqs, cancels)
    sim = simulate(cfg, Workload(reqs).with_cancellations(cancels))
    assert live.requests == sim.requests
    assert [r.outcome for r in live.requests].count("cancelled") == 2
    assert [s.start_s for s in live.steps] == [s.start_s for s in sim.steps]
    assert waits == 2  # in the idle gap before 3.6 s, and at the end (then the feed is closed)
