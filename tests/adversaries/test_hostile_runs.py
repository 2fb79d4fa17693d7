"""Hostile and careless uses of runs that are killed, resumed, locked, or write to a full disk
(issue 34), as a user might try them: ``--resume`` with other options, on a finished report,
on nothing; staging folders with a garbage marker, from an older tenantry, from a live
process, as ``--out``; stale lock files; read-only and full file systems.

Each refusal: exit status 2, one line on stderr naming what is wrong, and nothing changed
(every file's bytes and mtime, every folder: :func:`conftest.snapshot`).  Each run that must
go through: its exit status, and nothing outside ``--out`` changed but what the case says.
The partial runs are real: a run stopped after its first cell, made once per module.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, fake_report, snapshot
from tenantry.cli import main

#: A 2-cell check (about a second); its partial holds the first cell.
P = ["check", "--policy", "fcfs", "--pattern", "flood", "churn", "--budget", "1", "--shrink", "0", "--no-extras",
     "--workers", "1", "--quiet", "--plots", "none"]
TARGET = "minisched.tenantry_adapter:make_scheduler"
#: A 2-pattern verify --target on the example scheduler; its partial holds the first pattern.
V = ["verify", "--target", TARGET, "--patterns", "flood,churn", "--quick", "--budget", "1", "--shrink", "0",
     "--workers", "1", "--quiet"]
WORKLOAD_LINE = '{"request_id":0,"tenant":"a","arrival_s":0,"prompt_tokens":10,"output_tokens":1}\n'


def _code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


def _stopped_after_first_cell(folder: Path, argv: list[str], out: str) -> Path:
    """Run ``argv --out OUT`` in ``folder``, stopped (a KeyboardInterrupt) as its second cell is
    recorded: the staging folder then holds the first cell, as after a Ctrl-C."""
    import tenantry.adversaries.check as check

    real, calls = check.save_cell, []

    def second_stops(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    old = os.getcwd()
    os.chdir(folder)
    check.save_cell = second_stops
    try:
        assert _code([*argv, "--out", out]) == 130
    finally:
        check.save_cell = real
        os.chdir(old)
    (stage,) = folder.glob(f".{out}.new-*")
    assert len(list(stage.glob(".tenantry-done/*.json"))) == 1
    return stage


def _importable(folder: Path) -> None:
    shutil.copytree(REPO / "examples" / "minisched", folder / "minisched", dirs_exist_ok=True)


@pytest.fixture(scope="module")
def partials(tmp_path_factory):
    """A check partial (of ``rep``) and a verify --target partial (of ``vr``), made once."""
    home = tmp_path_factory.mktemp("partials")
    _importable(home)
    sys.path.insert(0, str(home))
    dont = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        check = _stopped_after_first_cell(home, P, "rep")
        verify = _stopped_after_first_cell(home, V, "vr")
    finally:
        sys.path.remove(str(home))
        sys.dont_write_bytecode = dont
        for m in [m for m in sys.modules if m.startswith("minisched")]:
            del sys.modules[m]
    return {"rep": check, "vr": verify}


@pytest.fixture(scope="module")
def live():
    """The identity of a process that runs (``sleep``), as a staging marker records a writer."""
    from tenantry.adversaries.resume import _boot_id, _start_ticks

    p = subprocess.Popen(["sleep", "300"])
    try:
        yield {"pid": p.pid, "start": _start_ticks(p.pid), "boot": _boot_id()}
    finally:
        p.kill()
        p.wait()


def _copy(ctx, out: str = "rep", name: str | None = None, edit=None) -> Path:
    """A copy of the module's partial of ``out`` in the case's folder (as ``name``), its marker
    passed through ``edit(marker) -> marker`` (a dict, or text to write as is)."""
    src = ctx.partials[out]
    dst = ctx.t / (name or src.name)
    shutil.copytree(src, dst, symlinks=True)
    if edit is not None:
        m = edit(json.loads((dst / ".tenantry-staging").read_text()))
        (dst / ".tenantry-staging").write_text(m if isinstance(m, str) else json.dumps(m))
    return dst


def _fp(**changes):
    def edit(m):
        m["fingerprint"].update(changes)
        return m
    return edit


def _set(**changes):
    def edit(m):
        m.update(changes)
        return m
    return edit


def _user_folder(t: Path) -> Path:
    (t / "mine").mkdir()
    (t / "mine" / "notes.txt").write_text("my own notes\n")
    return t / "mine"


def _ro_lock(ctx) -> None:
    """The folder of --out is read-only: creating the lock file fails with EROFS."""
    real = os.open

    def ro(path, flags, *a, **kw):
        if str(path).endswith(".rep.lock") and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, flags, *a, **kw)

    ctx.monkeypatch.setattr(os, "open", ro)


# (id, setup(ctx) -> argv, words the one stderr line must hold); every case exits with 2
CASES = [
    # --- --resume with nothing, or the wrong thing, to resume ---------------------------------
    ("resume-nothing-there", lambda c: [*P, "--out", "rep", "--resume"],
     ["--resume='rep'", "nothing to resume", "rep has no interrupted run"]),
    ("resume-a-finished-report", lambda c: fake_report(c.t / "rep", "check", 2) and [*P, "--out", "rep", "--resume"],
     ["nothing to resume", "rep is a finished report"]),
    ("resume-a-user-folder", lambda c: _user_folder(c.t) and [*P, "--out", "mine", "--resume"],
     ["mine", "not a tenantry check report"]),
    ("resume-another-outs-partial", lambda c: _copy(c) and [*P, "--out", "other", "--resume"],
     ["other has no interrupted run"]),
    ("resume-a-staging-symlink", lambda c: (c.t / "elsewhere").mkdir() or os.symlink(
        _copy(c, name="elsewhere/.rep.new-x"), c.t / ".rep.new-link") or [*P, "--out", "rep", "--resume"],
     ["nothing to resume"]),
    ("resume-history-mode", lambda c: (c.t / "h.jsonl").write_text("{}\n") and [
        "verify", "--history", "h.jsonl", "--resume"], ["--resume", "only with --target"]),
    ("resume-workload-mode", lambda c: (c.t / "w.jsonl").write_text(WORKLOAD_LINE) and [
        "verify", "--target", TARGET, "--workload", "w.jsonl", "--resume"], ["--resume", "only with --target"]),
    ("resume-verify-nothing-there", lambda c: [*V, "--out", "vr", "--resume"], ["nothing to resume", "vr"]),
    # --- --resume with other options: one line naming the option -----------------------------
    ("resume-another-seed", lambda c: _copy(c) and [*P, "--seed", "3", "--out", "rep", "--resume"],
     ["--seed 0 there, 3 here", "give its options"]),
    ("resume-another-budget", lambda c: _copy(c) and [*P[:6], "--budget", "2", *P[8:], "--out", "rep", "--resume"],
     ["--budget 1 evaluations there, 2 evaluations here"]),
    ("resume-other-patterns", lambda c: _copy(c) and ["check", "--policy", "fcfs", "--pattern", "flood", *P[6:],
                                                      "--out", "rep", "--resume"],
     ["--pattern flood,churn there, flood here"]),
    ("resume-other-policy", lambda c: _copy(c) and ["check", "--policy", "vtc", *P[3:], "--out", "rep", "--resume"],
     ["--policy fcfs there, vtc here"]),
    ("resume-another-shrink", lambda c: _copy(c) and [*P, "--shrink", "1", "--out", "rep", "--resume"],
     ["--shrink 0 there, 1 here"]),
    ("resume-other-plots", lambda c: _copy(c) and [*P, "--plots", "all", "--out", "rep", "--resume"],
     ["--plots none there, all here"]),
    ("resume-with-extras", lambda c: _copy(c) and [a for a in P if a != "--no-extras"] + ["--out", "rep", "--resume"],
     ["extras (--no-extras, --quick) off there, on here"]),
    ("resume-other-searches", lambda c: _copy(c) and [*P, "--search", "random", "--out", "rep", "--resume"],
     ["--search random,evolution,hypothesis,z3 there, random here"]),
    ("resume-with-a-total-budget", lambda c: _copy(c) and [*P, "--total-budget", "10", "--out", "rep", "--resume"],
     ["--total-budget not given there, 10 evaluations here"]),
    ("resume-another-tenantry-version", lambda c: _copy(c, edit=_fp(**{"tenantry version": "0.0.1"})) and [
        *P, "--out", "rep", "--resume"], ["tenantry version 0.0.1 there"]),
    ("resume-verify-another-timeout", lambda c: _copy(c, "vr") and [*V, "--timeout-s", "5", "--out", "vr", "--resume"],
     ["--timeout-s 10.0 there, 5.0 here"]),
    ("resume-verify-without-determinism", lambda c: _copy(c, "vr") and [
        *V, "--no-determinism", "--out", "vr", "--resume"], ["replay depth (--no-determinism) full there, state here"]),
    # --- staging folders that cannot be resumed ------------------------------------------------
    ("resume-garbage-marker", lambda c: _copy(c, edit=lambda m: "garbage {{{\n") and [*P, "--out", "rep", "--resume"],
     ["cannot be resumed", "not a tenantry staging marker"]),
    ("resume-an-older-tenantrys-marker", lambda c: _copy(c, edit=lambda m: "4242\n") and [
        *P, "--out", "rep", "--resume"], ["cannot be resumed", "older tenantry"]),
    ("resume-a-marker-without-options", lambda c: _copy(c, edit=lambda m: {"tool": "tenantry"}) and [
        *P, "--out", "rep", "--resume"], ["cannot be resumed", "records no options"]),
    ("resume-a-verify-partial-as-check", lambda c: _copy(c, edit=_set(kind="verify")) and [
        *P, "--out", "rep", "--resume"], ["cannot be resumed", "a verify run, not a check run"]),
    ("resume-a-live-writers-folder", lambda c: _copy(c, edit=_set(process=c.live)) and [
        *P, "--out", "rep", "--resume"], ["being written by process", "still runs"]),
    # --- staging folders given as --out ---------------------------------------------------------
    ("out-is-a-staging-folder", lambda c: [*P, "--out", _copy(c).name],
     ["staging folder of an unfinished tenantry run", "give --out rep --resume"]),
    ("out-inside-a-staging-folder", lambda c: [*P, "--out", f"{_copy(c).name}/sub"],
     ["is inside", "staging folder of an unfinished tenantry run"]),
    # --- file systems -----------------------------------------------------------------------------
    ("out-on-a-read-only-folder", lambda c: _ro_lock(c) or [*P, "--out", "rep"],
     ["cannot write .rep.lock: Read-only file system", "nothing written (rep not created)"]),
]


class _Case:
    """What a case's setup gets: its folder ``t``, ``monkeypatch``, and, made when first asked
    for, the module's ``partials`` and a ``live`` process."""

    def __init__(self, t: Path, monkeypatch, request) -> None:
        self.t, self.monkeypatch, self._request = t, monkeypatch, request

    def __getattr__(self, name: str):
        return self._request.getfixturevalue(name)


@pytest.mark.parametrize("name, setup, words", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_run_is_one_line_and_changes_nothing(name, setup, words, tmp_path, monkeypatch, capsys, request):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    _importable(tmp_path)
    argv = setup(_Case(tmp_path, monkeypatch, request))
    capsys.readouterr()
    before = snapshot(tmp_path)
    code = _code(argv)
    err = capsys.readouterr().err
    monkeypatch.undo()  # os.open back before the snapshot
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("tenantry: error: ") and all(w in lines[0] for w in words), lines[0]
    assert snapshot(tmp_path) == before  # nothing created, changed or removed (the partials neither)
    for m in [m for m in sys.modules if m.startswith("minisched")]:
        del sys.modules[m]


def test_there_are_at_least_25_hostile_run_cases():
    assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)


# --- runs that go through: what they leave beside --out ------------------------------------


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _outside(snap: dict, out: str = "rep") -> dict:
    return {k: v for k, v in snap.items() if k != out and not k.startswith(f"{out}/")}


def test_a_stale_lock_of_a_dead_run_never_blocks_and_is_removed(here, capsys):
    """A lock file a killed run left (tenantry's, naming a process that is gone) is taken
    over: the run goes through and removes it; nothing else beside --out changes."""
    (here / ".rep.lock").write_text(json.dumps({"tool": "tenantry", "lock": 1, "out": "rep",
                                                "process": {"pid": 999999999, "start": 1, "boot": "x"}}))
    (here / "keep.txt").write_text("mine\n")
    before = snapshot(here)
    assert _code([*P, "--out", "rep"]) == 0
    assert capsys.readouterr().err == ""
    assert _outside(snapshot(here)) == {k: v for k, v in before.items() if k != ".rep.lock"}
    assert (here / "rep" / "matrix.json").exists()


def test_a_live_writers_staging_folder_is_left_alone(here, capsys, partials, live):
    """A staging folder whose writer still runs is neither offered, nor noted, nor removed by a
    run that goes through."""
    stage = _copy(SimpleNamespace(t=here, partials=partials), edit=_set(process=live))
    before = snapshot(here)
    assert _code([*P, "--out", "rep"]) == 0
    assert capsys.readouterr().err == ""
    assert _outside(snapshot(here)) == before and stage.is_dir()


def test_a_garbage_partial_is_noted_and_removed_only_once_the_report_replaces_it(here, capsys, partials,
                                                                                  monkeypatch):
    """A partial with a garbage marker: the run says it is there (one line), keeps it while it
    runs (it is still there when the last cell starts) and removes it once its report is
    published; a user's folder named like a staging folder (no marker) is never touched."""
    import tenantry.adversaries.check as check

    stage = _copy(SimpleNamespace(t=here, partials=partials), edit=lambda m: "garbage\n")
    (here / ".rep.new-mine").mkdir()
    (here / ".rep.new-mine" / "notes.txt").write_text("mine\n")
    before = snapshot(here)
    seen, real = [], check.run_cell

    def spy(*a, **kw):
        seen.append(stage.is_dir())
        return real(*a, **kw)

    monkeypatch.setattr(check, "run_cell", spy)
    assert _code([*P, "--out", "rep"]) == 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"tenantry: {stage.name} holds 1 finished cell of an interrupted run of rep") and "not a tenantry staging marker" \
        in line and "kept until this run's report replaces it" in line, line
    assert seen == [True, True] and not stage.exists()
    assert _outside(snapshot(here)) == {k: v for k, v in before.items() if not k.startswith(stage.name)}


def test_a_full_disk_with_nothing_finished_removes_the_staging_folder_and_says_so(here, capsys, monkeypatch):
    """ENOSPC at the first file: nothing finished, so nothing is kept: one line naming the file,
    "nothing written", no staging folder and no lock left."""
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    before = snapshot(here)
    monkeypatch.setattr(os, "fsync", full)
    assert _code([*P, "--out", "rep"]) == 2
    monkeypatch.undo()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("tenantry: error: cannot write .rep.new-") and \
        line.endswith(": No space left on device; nothing written (rep not created)"), line
    assert snapshot(here) == before


def test_a_history_run_on_the_out_of_an_interrupted_matrix_says_so_and_replaces_it_only_at_the_end(
        here, capsys, partials):
    """verify --history on the --out of an interrupted verify --target: one line saying the
    partial is there and what finishes it (this run cannot), then the history's report is
    published and the partial removed; nothing else beside --out changes."""
    assert main(["simulate", "--policy", "vtc", "--history", "h.jsonl", "--horizon", "0.5"]) == 0
    stage = _copy(SimpleNamespace(t=here, partials=partials), "vr")
    capsys.readouterr()
    before = snapshot(here)
    assert _code(["verify", "--history", "h.jsonl", "--out", "vr"]) == 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"tenantry: {stage.name} holds 1 of 2 finished cells of an interrupted run of vr (its own "
                    "command with --resume would finish it); it is kept until this run's report replaces it"), line
    assert not stage.exists() and (here / "vr" / "report.json").exists()
    assert _outside(snapshot(here), "vr") == {k: v for k, v in before.items() if not k.startswith(stage.name)}
