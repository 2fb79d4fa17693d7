"""Tests of tenantry.runner.traces: readers on the real traces, bad input, writers, compose, synthetic load."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from tenantry.model.config import ConfigError
from tenantry.model.workload import Request, Workload
from tenantry.runner import traces as T
from conftest import REPO

SHARED = REPO.parent / "shared" / "traces"
needs_shared = pytest.mark.skipif(
    not (SHARED / "azure_llm_2023_code.csv").exists(),
    reason=f"real traces not found at {SHARED} (../shared/traces beside the repository)",
)
CODE, CONV = SHARED / "azure_llm_2023_code.csv", SHARED / "azure_llm_2023_conv.csv"
MC_CONV, MC_SYN = SHARED / "mooncake_fast25_conversation.jsonl", SHARED / "mooncake_fast25_synthetic.jsonl"


@pytest.fixture(scope="module")
def mooncake_conv():
    return T.read_mooncake_jsonl(MC_CONV, "mc")


# ---------------------------------------------------------------- real files


@needs_shared
def test_azure_code_real():
    rs = T.read_azure_csv(CODE, "code")
    assert len(rs) == 8819  # wc -l says 8819: 8820 lines, the last without a newline
    assert [r.request_id for r in rs] == list(range(8819))
    assert (rs[0].arrival_s, rs[0].prompt_tokens, rs[0].output_tokens) == (0.0, 4808, 10)
    assert (rs[1].arrival_s, rs[1].prompt_tokens) == (pytest.approx(0.052, abs=1e-9), 3180)
    assert rs[-1].arrival_s == pytest.approx(3435.948056, abs=1e-9)
    assert (rs[-1].prompt_tokens, rs[-1].output_tokens) == (549, 173)
    assert all(r.tenant == "code" for r in rs)


@needs_shared
def test_azure_conv_real_and_max_rows():
    rs = T.read_azure_csv(CONV, "conv")
    assert len(rs) == 19366
    assert (rs[0].prompt_tokens, rs[0].output_tokens) == (374, 44)
    assert rs[-1].arrival_s == pytest.approx(3501.721937, abs=1e-9)
    assert T.read_azure_csv(CONV, "conv", max_rows=10) == rs[:10]
    assert T.read_azure_csv(CONV, "conv", max_rows=0) == ()


@needs_shared
def test_mooncake_conversation_real(mooncake_conv):
    rs = mooncake_conv
    assert len(rs) == 12031
    a, b = rs[0], rs[1]
    assert (a.arrival_s, a.prompt_tokens, a.output_tokens) == (0.0, 6758, 500)
    assert len(a.prefix_ids) == 6758 // 16
    # both start with hash_id 0 -> same first 32 model blocks, then hash 1 vs 14
    assert a.prefix_ids[:32] == b.prefix_ids[:32] == tuple(range(32))
    assert a.prefix_ids[32] == 1 * 32 and b.prefix_ids[32] == 14 * 32
    assert rs[-1].arrival_s == pytest.approx(3536.999)
    assert all(len(r.prefix_ids) == r.prompt_tokens // 16 for r in rs[:500])


@needs_shared
def test_mooncake_synthetic_real_and_block_size():
    rs = T.read_mooncake_jsonl(MC_SYN, "syn")
    assert len(rs) == 3993
    assert rs[0].prompt_tokens == 40160 and len(rs[0].prefix_ids) == 40160 // 16
    assert rs[-1].arrival_s == pytest.approx(1022.025)
    big = T.read_mooncake_jsonl(MC_SYN, "syn", block_size_tokens=128, max_rows=2)
    assert len(big) == 2 and big[0].prefix_ids[:5] == (0, 1, 2, 3, 4)  # hash 0 -> 0..3, hash 1 -> 4..
    assert big[1].prefix_ids[0] == 79 * 4


def test_mooncake_partial_block_and_bad_block_size(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 1500, "input_length": 600, "output_length": 0, "hash_ids": [5, 9]}\n')
    (r,) = T.read_mooncake_jsonl(p, "t")
    assert r.arrival_s == 1.5 and r.output_tokens == 1  # 0 clamped to 1
    assert r.prefix_ids == tuple(range(160, 192)) + tuple(range(288, 293))  # 600 // 16 = 37 full blocks
    with pytest.raises(ConfigError, match="block_size_tokens=48"):
        T.read_mooncake_jsonl(p, "t", block_size_tokens=48)


def test_azure_zero_clamped_and_lf_crlf(tmp_path):
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:00:00.0000000,0,5",
            "2023-11-16 18:00:01.5,7,0"]
    for nl in ("\n", "\r\n"):
        p = tmp_path / "z.csv"
        p.write_bytes(nl.join(rows).encode())
        a, b = T.read_azure_csv(p, "t")
        assert (a.prompt_tokens, a.output_tokens, b.prompt_tokens, b.output_tokens) == (1, 5, 7, 1)
        assert b.arrival_s == 1.5


# ---------------------------------------------------------------- packaged excerpt


def test_excerpt_loads_without_shared(monkeypatch, tmp_path):
    monkeypatch.setattr(T, "_SHARED", tmp_path / "absent")
    code = T.read_azure_csv(T.excerpt_path("code"), "code")
    assert len(code) == 1482 and code[-1].arrival_s < 600
    w = T.azure_two_tenant_workload()  # falls back to the excerpts
    assert len(w) == 1482 + 2867 and set(w.tenants) == {"code", "conv"}
    assert [r.request_id for r in w] == list(range(len(w)))
    assert T.azure_two_tenant_workload(use_shared=False) == w
    assert (T.excerpt_path("code").parent / "NOTICE.md").exists()
    with pytest.raises(ConfigError, match="name='bogus'"):
        T.excerpt_path("bogus")


@needs_shared
def test_excerpt_is_unchanged_prefix_and_shared_workload():
    for name, path in (("code", CODE), ("conv", CONV)):
        assert path.read_bytes().startswith(T.excerpt_path(name).read_bytes())
    w = T.azure_two_tenant_workload(speedup=2.0, max_rows=100)
    assert len(w) == 200
    assert w.duration_s == pytest.approx(max(T.read_azure_csv(p, "x", max_rows=100)[-1].arrival_s for p in (CODE, CONV)) / 2)
    assert len(T.azure_two_tenant_workload(use_shared=SHARED, max_rows=5)) == 10


# ---------------------------------------------------------------- bad input


def _fails(tmp_path, text, read, line, *needles):
    p = tmp_path / "bad_input.txt"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        read(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"bad_input.txt:{line}:" in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


HDR = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
OK_ROW = "2023-11-16 18:17:03.9799600,4808,10\n"


def azure(p):
    return T.read_azure_csv(p, "t")


def mooncake(p):
    return T.read_mooncake_jsonl(p, "t")


@pytest.mark.parametrize("text, line, needles", [
    ("TIMESTAMP,Context,GeneratedTokens\n" + OK_ROW, 1, ["'ContextTokens'", "'Context'", "header"]),
    ("", 1, ["'TIMESTAMP'", "header=[]"]),
    (HDR + OK_ROW + "2023-11-16 18:17:04.0,-3,10\n", 3, ["ContextTokens=", "-3"]),
    (HDR + OK_ROW + "2023-11-16 18:17:04.0,3,ten\n", 3, ["GeneratedTokens='ten'"]),
    (HDR + "2023-11-16 25:17:04.0,3,10\n", 2, ["TIMESTAMP='2023-11-16 25:17:04.0'", "unparseable"]),
    (HDR + "16/11/2023 18:17,3,10\n", 2, ["TIMESTAMP=", "unparseable"]),
    (HDR + OK_ROW + "2023-11-16 18:17:02.0000000,3,10\n", 3,
     ["TIMESTAMP='2023-11-16 18:17:02.0000000'", "backwards", "2023-11-16 18:17:03.9799600", "line 2"]),
    (HDR + OK_ROW + "2023-11-16 18:17:05.0000000,3\n", 3, ["GeneratedTokens=None", "missing"]),
])
def test_azure_bad_input(tmp_path, text, line, needles):
    _fails(tmp_path, text, azure, line, *needles)


MC = '{"timestamp": 10, "input_length": 100, "output_length": 5, "hash_ids": [0]}\n'


@pytest.mark.parametrize("text, line, needles", [
    (MC + '{"timestamp": 20, "input_length": 100, "hash_ids": [0]}\n', 2, ["output_length=None", "missing"]),
    (MC + '{"timestamp": 20, "input_length": -1, "output_length": 5, "hash_ids": [0]}\n', 2, ["input_length=-1"]),
    (MC + '{"timestamp": 20, "input_length": "many", "output_length": 5, "hash_ids": [0]}\n', 2, ["input_length='many'"]),
    (MC + '{"timestamp": "noon", "input_length": 1, "output_length": 5, "hash_ids": [0]}\n', 2, ["timestamp='noon'"]),
    (MC + '{"timestamp": 5, "input_length": 1, "output_length": 5, "hash_ids": [0]}\n', 2,
     ["timestamp=5", "backwards", "10", "bad_input.txt:1"]),
    (MC + '{"timestamp": 20, "input_length": 1, "output_length": 5, "hash_ids": [-1]}\n', 2, ["hash_ids=-1"]),
    (MC + MC[:-3] + "\n", 2, ["json=", "bad JSON"]),
    ("\n" + MC + "[1, 2]\n", 3, ["json=", "object"]),
])
def test_mooncake_bad_input(tmp_path, text, line, needles):
    _fails(tmp_path, text, mooncake, line, *needles)


WL = '{"arrival_s":0.5,"output_tokens":3,"prompt_tokens":10,"request_id":0,"tenant":"a"}\n'


@pytest.mark.parametrize("text, line, needles", [
    (WL + WL.replace('"tenant"', '"colour":"red","tenant"').replace(":0,", ":1,"), 2, ["colour='red'", "unknown field"]),
    (WL + '{"arrival_s":1.0,"output_tokens":3,"request_id":1,"tenant":"a"}\n', 2, ["prompt_tokens=None", "missing"]),
    (WL + WL.replace('"prompt_tokens":10', '"prompt_tokens":"10"').replace(":0,", ":1,"), 2, ["prompt_tokens='10'"]),
    (WL + WL.replace('"arrival_s":0.5', '"arrival_s":-2').replace(":0,", ":1,"), 2, ["arrival_s=-2"]),
    (WL + WL.replace('"tenant"', '"prefix_ids":7,"tenant"').replace(":0,", ":1,"), 2, ["prefix_ids=7"]),
    (WL + WL.replace('"tenant"', '"prefix_ids":[1,"x"],"tenant"').replace(":0,", ":1,"), 2, ["prefix_ids="]),
    (WL + WL, 2, ["request_id=0", "duplicate", "bad_input.txt:1"]),
    (WL + WL.replace('"tenant"', '"cancel_s":0.25,"tenant"').replace(":0,", ":1,"), 2,
     ["cancel_s=0.25", "before the arrival_s of request 1 (0.5)"]),  # was accepted: never cancelled
    (WL + "{not json}\n", 2, ["json=", "bad JSON"]),
])
def test_workload_jsonl_bad_input(tmp_path, text, line, needles):
    _fails(tmp_path, text, T.read_workload_jsonl, line, *needles)


def test_missing_file_and_bad_args(tmp_path):
    with pytest.raises(ConfigError, match="nope.csv"):
        T.read_azure_csv(tmp_path / "nope.csv", "t")
    with pytest.raises(ConfigError, match="max_rows=-1"):
        T.read_azure_csv(tmp_path / "nope.csv", "t", max_rows=-1)


# ---------------------------------------------------------------- writers


def _workload():
    rs = [Request(0, "a", 0.0, 100, 5, (1, 2, 3), 7, 400), Request(1, "b", 0.1234567, 33, 2),
          Request(2, "a", 12.5, 1000, 50, tuple(range(62))), Request(3, "b", 12.5, 17, 1)]
    return Workload(rs)


def test_workload_jsonl_round_trip_and_determinism(tmp_path):
    w = _workload()
    p, q = tmp_path / "w1.jsonl", tmp_path / "w2.jsonl"
    T.write_workload_jsonl(w, p)
    T.write_workload_jsonl(T.read_workload_jsonl(p), q)
    assert T.read_workload_jsonl(p) == w
    assert p.read_bytes() == q.read_bytes()
    first = json.loads(p.read_text().splitlines()[0])
    assert list(first) == sorted(first) and first["prefix_ids"] == [1, 2, 3]
    assert '"prompt_bytes"' not in p.read_text().splitlines()[1]  # None fields left out


@needs_shared
def test_azure_round_trip(tmp_path):
    rs = T.read_azure_csv(CONV, "conv", max_rows=3000)
    p = tmp_path / "a.csv"
    T.write_azure_csv(Workload(rs), p)
    back = T.read_azure_csv(p, "conv")
    assert [(r.prompt_tokens, r.output_tokens) for r in back] == [(r.prompt_tokens, r.output_tokens) for r in rs]
    assert max(abs(a.arrival_s - b.arrival_s) for a, b in zip(rs, back)) < 1e-6
    q = tmp_path / "b.csv"
    T.write_azure_csv(Workload(rs), q)
    assert p.read_bytes() == q.read_bytes()


def test_azure_writer_start_and_tenant_filter(tmp_path):
    w, p = _workload(), tmp_path / "a.csv"
    T.write_azure_csv(w, p, start="2024-02-29 23:59:59.9", tenant="b")
    lines = p.read_text().splitlines()
    assert lines == ["TIMESTAMP,ContextTokens,GeneratedTokens", "2024-03-01 00:00:00.0234567,33,2",
                     "2024-03-01 00:00:12.4000000,17,1"]
    back = T.read_azure_csv(p, "b", start="2024-02-29 23:59:59.9")
    assert [r.arrival_s for r in back] == pytest.approx([0.1234567, 12.5], abs=1e-7)
    T.write_azure_csv(w, p)  # all tenants merged
    assert len(T.read_azure_csv(p, "x")) == 4
    with pytest.raises(ConfigError, match="start="):
        T.write_azure_csv(w, p, start="yesterday")


@needs_shared
def test_mooncake_round_trip_real(tmp_path):
    rs = T.read_mooncake_jsonl(MC_CONV, "mc", max_rows=300)
    p, q = tmp_path / "m1.jsonl", tmp_path / "m2.jsonl"
    T.write_mooncake_jsonl(Workload(rs), p)
    T.write_mooncake_jsonl(Workload(rs), q)
    assert p.read_bytes() == q.read_bytes()
    back = T.read_mooncake_jsonl(p, "mc")
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_ids) for r in back] == \
           [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_ids) for r in rs]
    orig = [json.loads(line)["hash_ids"] for line in MC_CONV.read_text().splitlines()[:300]]
    assert [json.loads(line)["hash_ids"][:-1] for line in p.read_text().splitlines()] == [h[:-1] for h in orig]


def test_mooncake_writer_derives_stable_ids(tmp_path):
    shared = tuple(range(1000, 1040))  # not of the h*32+j form: 32 ids = one full hash block + 8 more
    w = Workload([Request(0, "a", 0.0, 1100, 3, shared), Request(1, "b", 1.0, 1100, 3, shared),
                  Request(2, "a", 2.0, 600, 3)])
    p = tmp_path / "m.jsonl"
    T.write_mooncake_jsonl(w, p)
    h = [json.loads(line)["hash_ids"] for line in p.read_text().splitlines()]
    assert [len(x) for x in h] == [3, 3, 2]
    assert h[0][0] == h[1][0]  # the complete shared group maps to one id
    rest = h[0][1:] + h[1][1:] + h[2]
    assert len(set(rest)) == len(rest) and h[0][0] not in rest  # everything else unique
    back = T.read_mooncake_jsonl(p, "x")
    assert back[0].prefix_ids[:32] == back[1].prefix_ids[:32] and back[0].prefix_ids[32] != back[1].prefix_ids[32]
    with pytest.raises(ConfigError, match="block_size_tokens=24"):
        T.write_mooncake_jsonl(w, p, block_size_tokens=24)


def _exploding(w, after):
    for i, r in enumerate(w):
        if i == after:
            raise RuntimeError("disk on fire")
        yield r


@pytest.mark.parametrize("writer", [T.write_workload_jsonl, T.write_azure_csv, T.write_mooncake_jsonl,
                                    T.write_burstgpt_csv])
def test_failed_write_leaves_old_file(tmp_path, writer):
    p = tmp_path / "out.txt"
    writer(_workload(), p)
    before = p.read_bytes()
    with pytest.raises(RuntimeError, match="disk on fire"):
        writer(_exploding(_workload(), 2), p)
    assert p.read_bytes() == before
    assert [x.name for x in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left


# ---------------------------------------------------------------- BurstGPT (format as published; no data here)

BG_HDR = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BG8_HDR = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID,Elapsed time\n"
BG_ROWS = ("5,ChatGPT,472,18,490,Conversation log\n"
           "45,ChatGPT,1087,0,1087,Conversation log\n"     # a failure: 0 response tokens
           "118.5,GPT-4,417,276,693,API log\n"
           "118.5,ChatGPT,0,30,30,API log\n")               # a prompt of 0 tokens, clamped to 1


def test_burstgpt_tenants_times_and_failures(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text(BG_HDR + BG_ROWS)
    got = T.read_burstgpt_csv(p)
    assert [(r.request_id, r.tenant, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in got] == [
        (0, "ChatGPT", 0.0, 472, 18), (1, "GPT-4", 113.5, 417, 276), (2, "ChatGPT", 113.5, 1, 30)]
    kept = T.read_burstgpt_csv(p, tenant_by="log_type", failed="keep", max_rows=3)
    assert [(r.tenant, r.arrival_s, r.output_tokens) for r in kept] == [
        ("Conversation log", 0.0, 18), ("Conversation log", 40.0, 1), ("API log", 113.5, 276)]
    q = tmp_path / "b8.csv"
    q.write_text(BG8_HDR + "0.25,ChatGPT,10,5,15,Conversation log,7,0.0\n1.25,ChatGPT,20,6,26,Conversation log,9,3.5\n")
    assert [(r.tenant, r.arrival_s) for r in T.read_burstgpt_csv(q, tenant_by="session")] == [("s7", 0.0), ("s9", 1.0)]


def test_burstgpt_round_trip(tmp_path):
    w = Workload([Request(0, "a", 0.0, 100, 5), Request(1, "b", 0.1234567, 33, 2), Request(2, "a", 12.5, 1000, 50)])
    p = tmp_path / "w.csv"
    T.write_burstgpt_csv(w, p)
    first = p.read_bytes()
    back = T.read_burstgpt_csv(p)
    assert [(r.tenant, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in back] == [
        (r.tenant, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in w]
    T.write_burstgpt_csv(w, p)
    assert p.read_bytes() == first  # deterministic
    T.write_burstgpt_csv(w, p, tenant_as="log_type")
    assert [r.tenant for r in T.read_burstgpt_csv(p, tenant_by="log_type")] == ["a", "b", "a"]
    with pytest.raises(ConfigError, match="tenant='x,y'"):
        T.write_burstgpt_csv([Request(0, "x,y", 0.0, 1, 1)], tmp_path / "bad.csv")


def burstgpt(p):
    return T.read_burstgpt_csv(p)


@pytest.mark.parametrize("text, line, needles", [
    ("Timestamp,Model,Request tokens,Log Type\n5,ChatGPT,4,API log\n", 1, ["'Response tokens'", "header"]),
    (BG_HDR + "5,ChatGPT,-4,18,14,API log\n", 2, ["Request tokens=-4"]),
    (BG_HDR + "soon,ChatGPT,4,18,22,API log\n", 2, ["Timestamp='soon'"]),
    (BG_HDR + "5,ChatGPT,4,18,22,API log\n3,GPT-4,4,18,22,API log\n", 3, ["Timestamp='3'", "backwards", "line 2"]),
    (BG_HDR + "5,,4,18,22,API log\n", 2, ["Model=''", "empty"]),
    (BG_HDR + "5,ChatGPT,4\n", 2, ["Response tokens=None", "missing"]),
])
def test_burstgpt_bad_input(tmp_path, text, line, needles):
    _fails(tmp_path, text, burstgpt, line, *needles)


def test_burstgpt_bad_arguments(tmp_path):
    with pytest.raises(ConfigError, match="tenant_by='user'"):
        T.read_burstgpt_csv(tmp_path / "x.csv", tenant_by="user")
    with pytest.raises(ConfigError, match="failed='retry'"):
        T.read_burstgpt_csv(tmp_path / "x.csv", failed="retry")


# ---------------------------------------------------------------- compose and synthetic load


def test_compose_arithmetic():
    a = [Request(i, "x", t, 10, 2) for i, t in enumerate([0.0, 10.0, 20.0, 30.0, 40.0])]
    b = [Request(0, "y", 1.0, 20, 2), Request(1, "y", 3.0, 20, 2)]
    w = T.compose([T.TracePart(a, tenant="A", speedup=2.0, offset_s=100.0, start_s=10.0, duration_s=20.0),
                   T.TracePart(b, offset_s=104.0)])
    got = [(r.request_id, r.tenant, r.arrival_s) for r in w]
    # window [10, 30) keeps 10 and 20 -> (t - 10) / 2 + 100; b shifted by 104
    assert got == [(0, "A", 100.0), (1, "A", 105.0), (2, "y", 105.0), (3, "y", 107.0)]
    assert T.compose([T.TracePart(a, speedup=4.0)]).duration_s == 10.0
    with pytest.raises(ConfigError, match="speedup=0"):
        T.TracePart(a, speedup=0)


def test_compose_tie_seed():
    parts = [T.TracePart([Request(i, t, 0.0, 10, 2) for i in range(20)]) for t in "pq"]
    plain = T.compose(parts)
    assert [r.tenant for r in plain] == ["p"] * 20 + ["q"] * 20
    s1, s2 = T.compose(parts, seed=1), T.compose(parts, seed=1)
    assert s1 == s2 and [r.tenant for r in s1] != [r.tenant for r in plain]


def test_poisson_tenant():
    a = T.poisson_tenant("bulk", 6.0, 8000, 500, 300.0, seed=3)
    assert a == T.poisson_tenant("bulk", 6.0, 8000, 500, 300.0, seed=3)
    assert a != T.poisson_tenant("bulk", 6.0, 8000, 500, 300.0, seed=4)
    assert abs(len(a) / 300.0 - 6.0) < 0.6
    assert all(0 <= r.arrival_s < 300 for r in a) and [r.request_id for r in a] == list(range(len(a)))
    mean_p = sum(r.prompt_tokens for r in a) / len(a)
    assert abs(mean_p - 8000) < 200
    tiny = T.poisson_tenant("t", 50.0, 10, 1, 10.0, seed=0, cv=1.0, start_s=5.0)
    assert min(r.prompt_tokens for r in tiny) >= 16 and min(r.output_tokens for r in tiny) >= 2
    assert all(5.0 <= r.arrival_s < 15.0 for r in tiny)
    with pytest.raises(ConfigError, match="rate_per_s=0"):
        T.poisson_tenant("t", 0, 10, 1, 10.0, seed=0)


def test_seed001_workload():
    w = T.seed001_workload()
    assert w == T.seed001_workload(seed=9) and w != T.seed001_workload(seed=10)
    assert set(w.tenants) == {"bulk", "app", "chat"}
    for name, (rate, p, o) in T.SEED001_TENANTS.items():
        rs = [r for r in w if r.tenant == name]
        assert abs(len(rs) / 300.0 - rate) < 0.1 * rate, name
        assert abs(sum(r.output_tokens for r in rs) / len(rs) - o) < 0.05 * o
    gaps = {name: [r.arrival_s for r in w if r.tenant == name][:3] for name in w.tenants}
    assert len({tuple(g) for g in gaps.values()}) == 3  # distinct derived seeds
    assert [r.request_id for r in w] == list(range(len(w)))


def test_compose_retimes_cancellations_with_their_arrivals():
    """A part's cancel_s kept its old time while the arrival moved (offset, speedup): the
    cancellation fell before the arrival (now an error) or at the wrong time."""
    a = [Request(0, "x", 10.0, 10, 2, cancel_s=14.0), Request(1, "x", 20.0, 10, 2)]
    w = T.compose([T.TracePart(a, speedup=2.0, offset_s=100.0, start_s=10.0)])
    assert [(r.arrival_s, r.cancel_s) for r in w] == [(100.0, 102.0), (105.0, None)]
