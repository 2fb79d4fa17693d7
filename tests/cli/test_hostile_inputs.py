"""More hostile and careless inputs (tests/test_hostile.py has the first CASES): absurd numbers in
workload fields and flags, odd characters and encodings, files that are not workloads, empty or
unknown option values, and the pytest plugin's options.  For each: the exit status, ONE line on
stderr naming what is wrong (file, line, field, value), and nothing outside the run's own output
changed (every file's bytes and mtime, every folder: ``snapshot``)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from conftest import snapshot
from tenantry.cli import main

LINE = {"request_id": 0, "tenant": "a", "arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2}


def _wl(t, *objs, name: str = "w.jsonl", raw: str | None = None) -> list[str]:
    """Write a workload (objects, or raw text) and return its name (the runs' cwd is ``t``)."""
    (t / name).write_text(raw if raw is not None else "".join(json.dumps(o) + "\n" for o in objs))
    return [name]


def _line(**kw) -> dict:
    return {**LINE, **kw}


def _history(t) -> str:
    assert main(["simulate", "--workload", _wl(t, LINE)[0], "--policy", "vtc", "--history", "h.jsonl"]) == 0
    (t / "w.jsonl").unlink()
    return "h.jsonl"


def sim(t, *objs, raw=None, args=()):
    return ["simulate", "--workload", *_wl(t, *objs, raw=raw), "--policy", "fcfs", *args]


# (id, setup(tmp) -> argv, exit status, words the one stderr line must hold)
CASES = [
    # --- numbers in workload fields -----------------------------------------------------------
    ("arrival-nan", lambda t: sim(t, raw='{"request_id":0,"tenant":"a","arrival_s":NaN,"prompt_tokens":1,"output_tokens":1}\n'),
     2, ["w.jsonl:1", "arrival_s"]),
    ("arrival-infinity", lambda t: sim(t, raw='{"request_id":0,"tenant":"a","arrival_s":Infinity,"prompt_tokens":1,"output_tokens":1}\n'),
     2, ["w.jsonl:1", "arrival_s=inf"]),
    ("arrival-huge-negative", lambda t: sim(t, _line(arrival_s=-1e300)), 2, ["w.jsonl:1", "arrival_s=-1e+300", ">= 0"]),
    ("arrival-string", lambda t: sim(t, _line(arrival_s="5")), 2, ["w.jsonl:1", "arrival_s='5'"]),
    ("prompt-zero", lambda t: sim(t, _line(prompt_tokens=0)), 2, ["w.jsonl:1", "prompt_tokens=0"]),
    ("prompt-fraction", lambda t: sim(t, _line(prompt_tokens=1.5)), 2, ["w.jsonl:1", "prompt_tokens=1.5"]),
    ("prompt-bool", lambda t: sim(t, _line(prompt_tokens=True)), 2, ["w.jsonl:1", "prompt_tokens=True"]),
    ("prompt-huge-negative-int", lambda t: sim(t, raw=json.dumps(_line(prompt_tokens=-10 ** 300)) + "\n"), 2,
     ["w.jsonl:1", "prompt_tokens=-1e+300 (an integer of 301 digits)"]),
    ("output-negative", lambda t: sim(t, _line(output_tokens=-1)), 2, ["w.jsonl:1", "output_tokens=-1"]),
    ("request-id-float", lambda t: sim(t, _line(request_id=1e3)), 2, ["w.jsonl:1", "request_id=1000.0"]),
    ("request-id-negative", lambda t: sim(t, _line(request_id=-1)), 2, ["w.jsonl:1", "request_id=-1"]),
    ("request-id-duplicate", lambda t: sim(t, LINE, _line(arrival_s=1)), 2, ["w.jsonl:2", "request_id=0", "duplicate", "w.jsonl:1"]),
    ("cancel-nan", lambda t: sim(t, raw='{"request_id":0,"tenant":"a","arrival_s":0,"prompt_tokens":1,"output_tokens":1,"cancel_s":NaN}\n'),
     2, ["w.jsonl:1", "cancel_s"]),
    ("prefix-ids-string", lambda t: sim(t, _line(prefix_ids="abc")), 2, ["w.jsonl:1", "prefix_ids='abc'"]),
    ("predicted-output-negative", lambda t: sim(t, _line(predicted_output_tokens=-3)), 2,
     ["w.jsonl:1", "predicted_output_tokens=-3"]),
    # --- tenant names -------------------------------------------------------------------------
    ("tenant-empty", lambda t: sim(t, _line(tenant="")), 2, ["w.jsonl:1", "tenant=''"]),
    ("tenant-number", lambda t: sim(t, _line(tenant=5)), 2, ["w.jsonl:1", "tenant=5"]),
    ("tenant-newline", lambda t: sim(t, _line(tenant="a\nb")), 2, ["w.jsonl:1", "tenant='a\\nb'", "must be printable"]),
    ("tenant-escape-sequence", lambda t: sim(t, _line(tenant="\x1b[2Jx")), 2,
     ["w.jsonl:1", "tenant='\\x1b[2Jx'", "must be printable"]),
    ("tenant-bidi-override", lambda t: sim(t, _line(tenant="a\u202eb")), 2, ["w.jsonl:1", "must be printable"]),
    ("tenant-tab", lambda t: sim(t, _line(tenant="a\tb")), 2, ["w.jsonl:1", "tenant='a\\tb'", "must be printable"]),
    # --- files that are not workloads -----------------------------------------------------------
    ("workload-json-array-line", lambda t: sim(t, raw="[1, 2]\n"), 2, ["w.jsonl:1"]),
    ("workload-json-string-line", lambda t: sim(t, raw='"hello"\n'), 2, ["w.jsonl:1"]),
    ("workload-blank-lines-only", lambda t: sim(t, raw="\n\n  \n"), 2, ["w.jsonl", "no requests"]),
    ("workload-gzip", lambda t: (t / "w.jsonl.gz").write_bytes(gzip.compress((json.dumps(LINE) + "\n").encode())) and [
        "simulate", "--workload", "w.jsonl.gz"], 2, ["w.jsonl.gz:1", "a gzip-compressed file", "unpack it first"]),
    ("verify-workload-zip", lambda t: (t / "w.zip").write_bytes(b"PK\x03\x04" + b"\0" * 40) and [
        "verify", "--target", "m:f", "--workload", "w.zip"], 2, ["w.zip:1", "a zip file"]),
    ("workload-is-a-history", lambda t: ["simulate", "--workload", _history(t)], 2,
     ["h.jsonl:1", "kind='header'", "history", "tenantry verify --history h.jsonl"]),
    ("verify-workload-is-a-history", lambda t: ["verify", "--target", "m:f", "--workload", _history(t)], 2,
     ["h.jsonl:1", "kind='header'", "tenantry verify --history h.jsonl"]),
    ("verify-workload-folder", lambda t: (t / "d").mkdir() or ["verify", "--target", "m:f", "--workload", "d"], 2, ["d"]),
    # --- flags --------------------------------------------------------------------------------
    ("simulate-horizon-negative", lambda t: ["simulate", "--horizon", "-5"], 2, ["--horizon", "'-5'"]),
    ("simulate-window-inf", lambda t: ["simulate", "--window", "inf"], 2, ["--window", "'inf'"]),
    ("simulate-replicas-zero", lambda t: ["simulate", "--replicas", "0"], 2, ["--replicas", "'0'"]),
    ("simulate-replicas-huge", lambda t: ["simulate", "--replicas", "1000000"], 2, ["--replicas", "1000000"]),
    ("simulate-seed-negative", lambda t: ["simulate", "--seed", "-1"], 2, ["--seed", "'-1'"]),
    ("simulate-speedup-zero", lambda t: ["simulate", "--azure-pair", "--speedup", "0"], 2, ["--speedup", "'0'"]),
    ("check-pattern-empty", lambda t: ["check", "--pattern"], 2, ["--pattern"]),
    ("check-executor-unknown", lambda t: ["check", "--executor", "nope"], 2, ["--executor", "nope"]),
    ("check-workers-negative", lambda t: ["check", "--workers", "-1"], 2, ["--workers", "'-1'"]),
    ("check-budget-zero-seconds", lambda t: ["check", "--budget", "0s"], 2, ["--budget", "0s"]),
    ("check-total-budget-zero", lambda t: ["check", "--total-budget", "0"], 2, ["--total-budget", "'0'"]),
    ("verify-timeout-zero", lambda t: ["verify", "--target", "m:f", "--timeout-s", "0"], 2, ["--timeout-s", "'0'"]),
    ("verify-timeout-nan", lambda t: ["verify", "--target", "m:f", "--timeout-s", "nan"], 2, ["--timeout-s", "'nan'"]),
    ("verify-workers-zero", lambda t: ["verify", "--target", "m:f", "--workers", "0"], 2, ["--workers", "'0'"]),
]


@pytest.mark.parametrize("name, setup, status, words", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_and_touches_nothing(name, setup, status, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    argv = setup(tmp_path)
    capsys.readouterr()
    before = snapshot(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    err = capsys.readouterr().err
    assert code == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines[0]
    assert snapshot(tmp_path) == before  # nothing created, changed or removed


def test_there_are_at_least_25_new_hostile_cases():
    from test_hostile import CASES as FIRST

    assert len(CASES) + len(PLUGIN_CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)
    assert not {c[0] for c in CASES} & {c[0] for c in FIRST}


def test_a_bom_crlf_line_ends_and_a_unicode_tenant_read_as_the_plain_file(tmp_path, monkeypatch, capsys):
    """What a Windows editor writes (a UTF-8 BOM, CRLF line ends) is the same workload; a tenant
    named in any script is a tenant (only unprintable characters are refused)."""
    monkeypatch.chdir(tmp_path)
    lines = [json.dumps(_line(request_id=i, tenant=t, arrival_s=i * 0.1), ensure_ascii=False)
             for i, t in enumerate(["租户", "équipe", "租户"])]
    (tmp_path / "plain.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "win.jsonl").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    outs = []
    for name in ("plain.jsonl", "win.jsonl"):
        assert main(["simulate", "--workload", name, "--policy", "fcfs"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "租户" in outs[0] and "équipe" in outs[0]


# --- the pytest plugin's options: a usage error (exit 4), one line, nothing written -------------------

PLUGIN_CASES = [
    ("plugin-patterns-unknown", ["--tenantry-patterns=nosuch"], ["--tenantry-patterns", "pattern='nosuch'", "unknown pattern"]),
    ("plugin-patterns-empty-list", ["--tenantry-patterns=,"], ["--tenantry-patterns=,", "names no pattern"]),
    ("plugin-examples-negative", ["--tenantry-examples=-1"], ["--tenantry-examples=-1", "whole number >= 1"]),
    ("plugin-examples-words", ["--tenantry-examples=ten"], ["--tenantry-examples=ten", "whole number >= 1"]),
    ("plugin-timeout-zero", ["--tenantry-timeout-s=0"], ["--tenantry-timeout-s=0", "positive finite number"]),
    ("plugin-timeout-nan", ["--tenantry-timeout-s=nan"], ["--tenantry-timeout-s=nan", "positive finite number"]),
    ("plugin-out-is-a-file", ["--tenantry-out=notes.txt"], ["--tenantry-out=notes.txt", "is a file, not a folder"]),
]


@pytest.mark.parametrize("name, args, words", PLUGIN_CASES, ids=[c[0] for c in PLUGIN_CASES])
def test_a_bad_plugin_option_is_one_usage_error_line(name, args, words, tmp_path):
    (tmp_path / "notes.txt").write_text("my notes\n")
    before = snapshot(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO / "examples"), "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark",
                        "--tenantry-target=minisched.tenantry_adapter:make_scheduler", *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 4, p.stdout + p.stderr  # pytest's usage error
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR: ") and "Traceback" not in p.stderr, p.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert snapshot(tmp_path) == before
