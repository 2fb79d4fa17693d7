"""Hostile uses of the CLI, as a new user might try them: bad paths, values and files, signals,
two runs on one folder.  For each: the exit status, one line on stderr naming what is wrong,
and nothing outside what the run itself created changed (every file's bytes and mtime, every
folder, compared before and after).

The in-process cases are all refused before any work (fast); the signal and concurrency
cases run the console script in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, children as _children, fake_report, gone as _gone, snapshot, tenantry_process, wait_for
from tenantry.cli import main

HEADER = {"kind": "header", "format": 1, "config": {"tenants": [{"name": "a"}, {"name": "b"}]}}
REQUEST = {"kind": "request", "request_id": 0, "tenant": "a", "arrival_s": 0.0, "prompt_tokens": 10,
           "output_tokens": 2, "outcome": "rejected", "reason": "rate_limit"}
WORKLOAD_LINE = '{"request_id":0,"tenant":"a","arrival_s":0,"prompt_tokens":10,"output_tokens":1}\n'


def _lines(path: Path, *objs) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


_report = fake_report


def _user_folder(t: Path, name: str = "mine") -> Path:
    (t / name).mkdir()
    (t / name / "notes.txt").write_text("my own notes\n")
    return t / name


def _history(t: Path, name: str = "h.jsonl", *, tenant: str = "a", extra=()) -> Path:
    return _lines(t / name, HEADER, {**REQUEST, "tenant": tenant}, *extra)


# (id, setup(tmp) -> argv, exit status, words the one stderr line must hold)
CASES = [
    # --- output folders ------------------------------------------------------------------
    ("check-out-user-folder", lambda t: ["check", "--out", str(_user_folder(t))], 2, ["not a tenantry check report"]),
    ("check-out-dot", lambda t: ["check", "--out", "."], 2, ["current folder"]),
    ("check-out-parent", lambda t: ["check", "--out", ".."], 2, ["current folder or one of its parents"]),
    ("check-out-file", lambda t: (t / "f.txt").write_text("x") and ["check", "--out", "f.txt"], 2, ["is a file"]),
    ("check-out-symlink", lambda t: _user_folder(t) and os.symlink("mine", t / "ln") or ["check", "--out", "ln"], 2,
     ["symbolic link"]),
    ("check-out-report-with-user-file",
     lambda t: (_report(t / "rep", "check", 2) / "mine.md").write_text("x") and ["check", "--out", "rep"], 2,
     ["holds mine.md", "did not write"]),
    ("check-out-verify-report", lambda t: _report(t / "rep", "verify", 1) and ["check", "--out", "rep"], 2,
     ["verify report, not a check report"]),
    ("check-default-out-larger", lambda t: _report(t / "tenantry-check", "check", 204) and [
        "check", "--policy", "fcfs", "--pattern", "flood"], 2, ["204-cell report", "smaller run"]),
    ("check-out-under-a-file", lambda t: (t / "f").write_text("x") and ["check", "--out", "f/rep"], 2, ["f"]),
    ("check-replay-missing", lambda t: ["check", "--replay", "nowhere"], 2, ["nowhere", "no cell.json"]),
    ("check-replay-user-folder", lambda t: ["check", "--replay", str(_user_folder(t))], 2, ["no cell.json"]),
    # --- values ----------------------------------------------------------------------------
    ("check-policy-unknown", lambda t: ["check", "--policy", "nope"], 2, ["nope"]),
    ("check-pattern-unknown", lambda t: ["check", "--pattern", "nope"], 2, ["nope"]),
    ("check-budget-zero", lambda t: ["check", "--budget", "0"], 2, ["--budget", "'0'"]),
    ("check-budget-negative", lambda t: ["check", "--budget", "-3"], 2, ["--budget", "positive"]),
    ("check-total-budget-words", lambda t: ["check", "--total-budget", "ten"], 2, ["--total-budget", "'ten'"]),
    ("check-workers-zero", lambda t: ["check", "--workers", "0"], 2, ["--workers", ">= 1"]),
    ("prove-timeout-nan", lambda t: ["prove", "--timeout-s", "nan"], 2, ["--timeout-s", "'nan'"]),
    ("prove-timeout-inf", lambda t: ["prove", "--timeout-s", "inf"], 2, ["--timeout-s", "'inf'"]),
    ("prove-unknown-id", lambda t: ["prove", "NOPE"], 2, ["NOPE"]),
    ("simulate-horizon-nan", lambda t: ["simulate", "--horizon", "nan"], 2, ["--horizon"]),
    ("unknown-command", lambda t: ["chek"], 2, ["chek"]),
    # --- input files ----------------------------------------------------------------------
    ("simulate-workload-dev-zero", lambda t: ["simulate", "--workload", "/dev/zero"], 2, ["/dev/zero", "device"]),
    ("simulate-workload-nul-bytes", lambda t: (t / "z.jsonl").write_bytes(b"\0" * 5000) and [
        "simulate", "--workload", "z.jsonl"], 2, ["z.jsonl:1", "NUL"]),
    ("simulate-workload-endless-line", lambda t: (t / "l.jsonl").write_bytes(b"7" * (1 << 20) + b"8") and [
        "simulate", "--workload", "l.jsonl"], 2, ["l.jsonl:1", "longer than 1 MiB"]),
    ("simulate-workload-not-utf8", lambda t: (t / "u.jsonl").write_bytes(b'{"a": "\xff"}\n') and [
        "simulate", "--workload", "u.jsonl"], 2, ["u.jsonl:1", "not UTF-8"]),
    ("simulate-workload-folder", lambda t: ["simulate", "--workload", str(_user_folder(t))], 2, ["mine"]),
    ("simulate-workload-missing", lambda t: ["simulate", "--workload", "none.jsonl"], 2, ["none.jsonl"]),
    ("simulate-workload-bad-json", lambda t: (t / "b.jsonl").write_text(WORKLOAD_LINE + "{oops\n") and [
        "simulate", "--workload", "b.jsonl"], 2, ["b.jsonl:2", "bad JSON"]),
    ("simulate-config-folder", lambda t: ["simulate", "--config", str(_user_folder(t))], 2, ["mine"]),
    ("simulate-history-is-the-workload", lambda t: (t / "w.jsonl").write_text(WORKLOAD_LINE) and [
        "simulate", "--workload", "w.jsonl", "--policy", "vtc", "--history", "w.jsonl"], 2, ["one of this run's inputs"]),
    ("simulate-history-over-user-file", lambda t: (t / "w.jsonl").write_text(WORKLOAD_LINE) and (
        t / "notes.jsonl").write_text("mine\n") and [
        "simulate", "--workload", "w.jsonl", "--policy", "vtc", "--history", "notes.jsonl"], 2, ["not a tenantry history"]),
    ("simulate-history-two-policies-one-file", lambda t: (t / "w.jsonl").write_text(WORKLOAD_LINE) and [
        "simulate", "--workload", "w.jsonl", "--policy", "fcfs", "vtc", "--history", "h.jsonl"], 2, ["{policy}"]),
    ("simulate-bad-workload-history-in-new-folders", lambda t: (t / "b.jsonl").write_text("{oops\n") and [
        "simulate", "--workload", "b.jsonl", "--policy", "vtc", "--history", "new/deeper/h.jsonl"], 2, ["b.jsonl:1"]),
    ("simulate-history-under-a-file", lambda t: (t / "w.jsonl").write_text(WORKLOAD_LINE) and (t / "f").write_text(
        "x") and ["simulate", "--workload", "w.jsonl", "--policy", "vtc", "--history", "f/h.jsonl"], 2,
     ["is a file, not a folder"]),
    ("simulate-history-folder", lambda t: (t / "w.jsonl").write_text(WORKLOAD_LINE) and [
        "simulate", "--workload", "w.jsonl", "--policy", "vtc", "--history", str(_user_folder(t))], 2, ["is a folder"]),
    ("verify-history-missing", lambda t: ["verify", "--history", "none.jsonl"], 2, ["none.jsonl"]),
    ("verify-history-dev-zero", lambda t: ["verify", "--history", "/dev/zero"], 2, ["device"]),
    ("verify-history-header-only", lambda t: _lines(t / "h.jsonl", HEADER) and ["verify", "--history", "h.jsonl"], 2,
     ["h.jsonl", "none in this file"]),
    ("verify-history-empty-file", lambda t: (t / "h.jsonl").touch() or ["verify", "--history", "h.jsonl"], 2,
     ["h.jsonl", "empty file"]),
    ("verify-history-unknown-tenant", lambda t: _history(t, tenant="zed") and ["verify", "--history", "h.jsonl"], 2,
     ["h.jsonl:2", "tenant='zed'"]),
    ("verify-history-config-other-tenants", lambda t: _history(t) and (t / "c.toml").write_text(
        '[[tenants]]\nname = "x"\n') and ["verify", "--history", "h.jsonl", "--config", "c.toml"], 2,
     ["--config", "x", "a, b"]),
    ("verify-history-inside-out", lambda t: (t / "out").mkdir() or _history(t / "out") and [
        "verify", "--history", "out/h.jsonl", "--out", "out"], 2, ["holds the input out/h.jsonl"]),
    ("verify-history-out-user-folder", lambda t: _history(t) and [
        "verify", "--history", "h.jsonl", "--out", str(_user_folder(t))], 2, ["not a tenantry verify report"]),
    ("verify-default-out-larger", lambda t: _history(t) and _report(t / "verify-report", "verify", 12) and [
        "verify", "--history", "h.jsonl"], 2, ["12-cell report", "smaller run"]),
    ("verify-history-bad-into-new-folders", lambda t: _lines(t / "h.jsonl", HEADER) and [
        "verify", "--history", "h.jsonl", "--out", "new/deeper/rep"], 2, ["none in this file"]),
    ("verify-history-bad-line", lambda t: _history(t, extra=[{"kind": "step", "step_index": 0}]) and [
        "verify", "--history", "h.jsonl"], 2, ["h.jsonl:3"]),
    ("verify-target-no-colon", lambda t: ["verify", "--target", "nocolon"], 2, ["must be module:factory"]),
    ("verify-target-no-module", lambda t: ["verify", "--target", "no_such_module_xyz:f"], 2, ["cannot import"]),
    ("verify-target-no-attribute", lambda t: (t / "tgt_mod_a.py").write_text("x = 1\n") and [
        "verify", "--target", "tgt_mod_a:make"], 2, ["no attribute make"]),
    ("verify-target-path-not-folder", lambda t: ["verify", "--target", "m:f", "--target-path", "nowhere"], 2,
     ["--target-path"]),
    ("verify-target-pattern-unknown", lambda t: ["verify", "--target", "m:f", "--patterns", "nope"], 2, ["nope"]),
    ("verify-target-workload-empty", lambda t: (t / "w.jsonl").touch() or [
        "verify", "--target", "m:f", "--workload", "w.jsonl"], 2, ["w.jsonl", "no requests"]),
    ("verify-target-workload-inside-out", lambda t: (t / "rep").mkdir() or (t / "rep" / "w.jsonl").write_text(
        WORKLOAD_LINE) and ["verify", "--target", "m:f", "--workload", "rep/w.jsonl", "--out", "rep"], 2,
     ["holds the input rep/w.jsonl"]),
]


@pytest.mark.parametrize("name, setup, status, words", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_and_touches_nothing(name, setup, status, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # sys.path as it was after the test (verify --target adds the cwd)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # an imported target would leave __pycache__
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


def test_there_are_at_least_40_hostile_cases():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def test_the_large_input_limit_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.jsonl").write_text(WORKLOAD_LINE * 50)
    monkeypatch.setenv("TENANTRY_MAX_INPUT_MB", "0.001")  # 1,048 bytes
    before = snapshot(tmp_path)
    assert main(["simulate", "--workload", "w.jsonl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "w.jsonl" in err[0] and "input limit" in err[0] and "TENANTRY_MAX_INPUT_MB" in err[0]
    assert snapshot(tmp_path) == before


# --- signals and concurrency: the console script in a subprocess -------------------------------

_tenantry = tenantry_process


_wait_for = wait_for


CHECK_ARGS = ["check", "--policy", "fcfs", "vtc", "--pattern", "flood", "churn", "--budget", "400", "--no-extras",
              "--workers", "2", "--quiet", "--out", "rep"]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig, group, status, word", [
    (signal.SIGINT, True, 130, "interrupted"),    # Ctrl-C in a terminal: the whole process group
    (signal.SIGTERM, False, 143, "terminated (SIGTERM)"),  # kill PID / a job scheduler: the process only
])
def test_a_signal_stops_check_workers_included_and_keeps_the_old_report(sig, group, status, word, tmp_path):
    _report(tmp_path / "rep", "check", 4)  # an older report: must survive the interrupted run untouched
    before = snapshot(tmp_path)
    p = _tenantry(CHECK_ARGS, tmp_path)
    _wait_for(lambda: len(_children(p.pid)) >= 2 and any(tmp_path.glob(".rep.new-*")))
    time.sleep(1.0)  # the workers are busy with evaluations
    kids = _children(p.pid)
    os.killpg(p.pid, sig) if group else p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tenantry: {word} after ") and "rep is as it was" in lines[0], err
    assert all(_gone(k) for k in kids)  # no orphaned worker
    assert snapshot(tmp_path) == before  # no staging folder, no lock file, the old report byte-identical


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig, status, word", [(signal.SIGINT, 130, "interrupted"),
                                               (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_signal_stops_verify_target(sig, status, word, tmp_path):
    shutil.copytree(REPO / "examples" / "minisched", tmp_path / "minisched")  # imported from the current folder
    before = snapshot(tmp_path)
    p = _tenantry(["verify", "--target", "minisched.tenantry_adapter:make_scheduler", "--quiet", "--out", "vr"],
                  tmp_path)
    _wait_for(lambda: (tmp_path / ".vr.lock").exists() or p.poll() is not None)  # the matrix is under way
    time.sleep(2.0)
    assert p.poll() is None
    os.killpg(p.pid, sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tenantry: {word}") and "vr not created" in lines[0], err
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if "__pycache__" not in k} == before


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_ctrl_c_during_checks_proofs_stops_the_run_and_keeps_the_old_report(tmp_path):
    """Z3 catches SIGINT by itself (its ctrl_c parameter) and answers "unknown: interrupted from
    keyboard": a fresh user's Ctrl-C during check's proofs was counted as a failed proof and the
    run replaced the old report, 4 times in 5.  The signal must stop the run instead."""
    import threading

    _report(tmp_path / "rep", "check", 4)
    before = snapshot(tmp_path)
    p = _tenantry(["check", "--policy", "vtc", "--pattern", "flood", "--budget", "1", "--workers", "1",
                   "--out", "rep"], tmp_path)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: p.stderr.read(1), "")), daemon=True)
    reader.start()
    _wait_for(lambda: "proofs (1 of" in "".join(err) or p.poll() is not None, within_s=120)
    time.sleep(0.8)  # inside the proofs' Z3 queries
    assert p.poll() is None, "".join(err)
    os.killpg(p.pid, signal.SIGINT)
    p.wait(timeout=30)
    reader.join(timeout=5)
    text = "".join(err)
    assert p.returncode == 130, text
    last = text.rstrip().splitlines()[-1]
    assert last.startswith("tenantry: interrupted") and "rep is as it was" in last, text
    assert "Traceback" not in text, text
    # the matrix's one cell had finished: it is kept for --resume, and the line says how to finish
    (stage,) = tmp_path.glob(".rep.new-*")
    assert f"1 finished cell kept in {stage.name} for --resume" in last, last
    assert last.endswith("to finish the run: tenantry check --policy vtc --pattern flood --budget 1 --workers 1 "
                         "--out rep --resume"), last
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith(stage.name)} == before


def test_two_runs_on_one_out_the_second_is_refused(tmp_path):
    args = ["check", "--policy", "fcfs", "--pattern", "flood", "--budget", "60", "--no-extras", "--workers", "1",
            "--quiet", "--out", "rep"]
    first = _tenantry(args, tmp_path)
    _wait_for(lambda: (tmp_path / ".rep.lock").exists() or first.poll() is not None)
    second = _tenantry(args, tmp_path)
    out2, err2 = second.communicate(timeout=60)
    out1, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert second.returncode == 2 and err2.count("\n") == 1 and "another tenantry run is writing" in err2, err2
    assert json.loads((tmp_path / "rep" / ".tenantry-report").read_text())["kind"] == "check"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # no lock, no staging folder left


@pytest.mark.parametrize("threads", [1, 2])
def test_a_stop_whose_keyboard_interrupt_was_lost_still_stops_the_matrix(threads):
    """A signal that lands inside a finaliser (a __del__) loses its KeyboardInterrupt; the
    handler's flag still stops the cells' loop at its next poll, before the next cell is begun
    (one thread) or within half a second (threads)."""
    from tenantry.adversaries.check import _cells_in_threads
    from tenantry.adversaries.outdir import STOP_REQUESTED

    ran: list[int] = []

    def cell(k):
        ran.append(k)
        if k == 1:
            STOP_REQUESTED.set()  # what the handler does; its raise is the part that was lost
        time.sleep(0.05)
        return {}

    try:
        with pytest.raises(KeyboardInterrupt):
            _cells_in_threads(list(range(40)), cell, threads, lambda k, rec: None)
    finally:
        STOP_REQUESTED.clear()
    assert len(ran) < 10


def test_a_file_named_like_the_lock_is_left_as_it_is(tmp_path):
    """A file already named ``.<out>.lock`` (a user's, or a killed run's) is locked for the run
    but neither changed nor removed: only a lock file the run made goes at its end."""
    from tenantry.adversaries.check import run_check
    from tenantry.adversaries.search import Budget

    lock = tmp_path / ".rep.lock"
    lock.write_text("my notes\n")
    run_check(setups=["vtc"], patterns=["flood"], budget=Budget(1), workers=1, shrink_evaluations=0,
              plots="none", extras=False, progress=False, out=tmp_path / "rep", spread_seeds=0)
    assert lock.read_text() == "my notes\n" and (tmp_path / "rep" / "matrix.json").exists()
    run_check(setups=["vtc"], patterns=["flood"], budget=Budget(1), workers=1, shrink_evaluations=0,
              plots="none", extras=False, progress=False, out=tmp_path / "rep2", spread_seeds=0)
    assert not (tmp_path / ".rep2.lock").exists()
