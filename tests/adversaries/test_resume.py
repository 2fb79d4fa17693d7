"""Nothing a user runs is lost (issue 34): a matrix run killed at any cell keeps its finished
cells, ``--resume`` finishes the others and gives the bytes of an uninterrupted run; the
report's bytes do not depend on the ``--out`` folder's name; a full disk is one line naming
the file and what was kept.

The kills run the console script in a subprocess (SIGKILL: no cleanup at all; SIGINT: the
process group, as Ctrl-C in a terminal); the resumed and reference runs run in this process.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shlex
import shutil
import signal
import sys
from pathlib import Path

import pytest

from conftest import REPO, snapshot, tenantry_process, wait_for
from tenantry.cli import main

LINUX = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

#: A small matrix (2 policies x 3 patterns, 6 cells of about a second each on one worker).
CHECK = ["check", "--policy", "fcfs", "vtc", "--pattern", "flood", "churn", "few_huge", "--budget", "2",
         "--shrink", "2", "--no-extras", "--workers", "1", "--quiet", "--seed", "5"]
TARGET = "minisched.tenantry_adapter:make_scheduler"
#: verify --target on the example scheduler: 3 patterns, --quick (no extras).
VERIFY = ["verify", "--target", TARGET, "--patterns", "flood,churn,sybil", "--quick", "--budget", "2",
          "--workers", "1", "--quiet"]


def _files(root: Path) -> dict[str, bytes]:
    """The report's files whose bytes a seed fixes (all but timing.json and the plots)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "timing.json" and p.suffix != ".png"}


def _done(tmp: Path, out: str) -> int:
    return sum(len(list(s.glob(".tenantry-done/*.json"))) for s in tmp.glob(f".{out}.new-*"))


def _main(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


@pytest.fixture
def at(tmp_path, monkeypatch):
    """Run in tmp_path, with the example scheduler importable from it."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "examples" / "minisched", tmp_path / "minisched")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    yield tmp_path
    for m in [m for m in sys.modules if m.startswith("minisched")]:
        del sys.modules[m]


def _kill_at_a_random_cell(args: list[str], tmp: Path, out: str, n_cells: int, sig: int) -> tuple[int, str, int]:
    """Start ``tenantry ARGS --out OUT`` and send ``sig`` once a random number of its cells
    (1 .. n_cells - 1) are finished; returns (exit status, stderr, the cells finished at the kill)."""
    k = random.SystemRandom().randint(1, n_cells - 1)
    p = tenantry_process([*args, "--out", out], tmp)
    wait_for(lambda: _done(tmp, out) >= k or p.poll() is not None, within_s=120, poll_s=0.01)
    done = _done(tmp, out)
    if sig == signal.SIGKILL:
        p.kill()
    else:
        os.killpg(p.pid, sig)
    _, err = p.communicate(timeout=60)
    assert done < n_cells, f"the run ended before the kill at cell {k}: {err}"
    return p.returncode, err, done


@LINUX
def test_check_killed_with_sigkill_at_a_random_cell_resumes_to_the_same_bytes(at, capsys):
    """SIGKILL (no cleanup) after k of 6 cells: the finished cells are on disk, nothing is taken
    for a report, and ``--resume`` runs only the missing cells and gives the bytes of an
    uninterrupted run with the same seed (in another folder: the name is in no byte)."""
    code, err, k = _kill_at_a_random_cell(CHECK, at, "rep", 6, signal.SIGKILL)
    assert code == -signal.SIGKILL, err
    assert not (at / "rep").exists()  # never published, never mistaken for a report
    (stage,) = at.glob(".rep.new-*")
    assert len(list(stage.glob(".tenantry-done/*.json"))) >= k
    assert _main([*CHECK, "--out", "ref"]) == 0  # the uninterrupted run
    capsys.readouterr()
    assert _main([*CHECK, "--out", "rep", "--resume"]) == 0, capsys.readouterr().err
    assert (at / "rep" / "matrix.json").read_bytes() == (at / "ref" / "matrix.json").read_bytes(), f"killed after {k}"
    assert _files(at / "rep") == _files(at / "ref")  # cell.json, workloads, report.md, matrix.md too
    timing = json.loads((at / "rep" / "timing.json").read_text())
    assert len(timing["cells_done_s"]) == 6
    assert sorted(p.name for p in at.iterdir()) == ["minisched", "ref", "rep"]  # no staging folder, no lock


@LINUX
def test_check_interrupted_by_ctrl_c_says_how_many_cells_are_kept_and_the_command_that_finishes(at, capsys):
    """Ctrl-C (SIGINT to the process group) after k cells: one line saying how many cells are
    kept where and the exact command that finishes the run; that command gives the bytes."""
    code, err, k = _kill_at_a_random_cell(CHECK, at, "rep", 6, signal.SIGINT)
    assert code == 130, err
    (line,) = err.strip().splitlines()
    (stage,) = at.glob(".rep.new-*")
    kept = len(list(stage.glob(".tenantry-done/*.json")))
    assert kept >= k and line.startswith("tenantry: interrupted after ")
    assert f"{kept} finished cell{'s' if kept != 1 else ''} kept in {stage.name} for --resume (rep not created)" in line
    cmd = line.split("; to finish the run: ", 1)[1]
    assert cmd == shlex.join(["tenantry", *CHECK, "--out", "rep", "--resume"])
    assert _main(shlex.split(cmd)[1:]) == 0
    assert _main([*CHECK, "--out", "ref"]) == 0
    assert _files(at / "rep") == _files(at / "ref"), f"interrupted after {k}"


@LINUX
def test_verify_target_killed_at_a_random_cell_resumes_to_the_same_bytes(at, capsys):
    """The same for ``verify --target`` on the example scheduler (--quick): SIGKILL after k
    of 3 patterns, ``--resume``, the bytes of an uninterrupted run."""
    code, err, k = _kill_at_a_random_cell(VERIFY, at, "vr", 3, signal.SIGKILL)
    assert code == -signal.SIGKILL, err
    assert not (at / "vr").exists()
    assert _main([*VERIFY, "--out", "ref"]) == 0
    assert _main([*VERIFY, "--out", "vr", "--resume"]) == 0, capsys.readouterr().err
    assert (at / "vr" / "matrix.json").read_bytes() == (at / "ref" / "matrix.json").read_bytes(), f"killed after {k}"
    assert _files(at / "vr") == _files(at / "ref")
    assert not list(at.glob(".vr*"))


def test_resume_refuses_other_options_naming_the_one_that_differs_then_finishes(at, capsys, monkeypatch):
    """A run stopped after its first cell (a KeyboardInterrupt where the second cell is
    recorded); ``--resume`` with another --seed is one line naming it; a run without
    --resume says the partial is there and keeps it until its own report is published."""
    import tenantry.adversaries.check as check

    args = ["check", "--policy", "fcfs", "--pattern", "flood", "churn", "--budget", "1", "--shrink", "0",
            "--no-extras", "--workers", "1", "--quiet", "--plots", "none"]
    real, calls = check.save_cell, []

    def second_stops(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(check, "save_cell", second_stops)
    assert _main([*args, "--out", "rep"]) == 130
    monkeypatch.setattr(check, "save_cell", real)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 finished cell kept in" in err[0], err
    (stage,) = at.glob(".rep.new-*")
    before = snapshot(at)
    assert _main([*args, "--out", "rep", "--resume", "--seed", "1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--seed 0 there, 1 here" in line and stage.name in line, line
    assert snapshot(at) == before
    # without --resume: one line saying it is there, and the partial is kept until the report is written
    assert _main([*args, "--out", "rep", "--seed", "1"]) == 0
    (note,) = capsys.readouterr().err.strip().splitlines()
    assert f"{stage.name} holds 1 of 2 finished cells" in note and "--seed 0 there, 1 here" in note, note
    assert not stage.exists() and (at / "rep" / "matrix.json").exists()


def test_the_report_does_not_depend_on_the_out_folders_name(at, capsys):
    """Same seed, two --out names (one with a space, one deeper): the same matrix.json,
    report.md, matrix.md and cell.json bytes (the replay commands are written as run from the
    report folder); the terminal prints them runnable from here, and they run from the report."""
    args = ["check", "--policy", "fcfs", "--pattern", "flood", "--budget", "2", "--shrink", "2", "--no-extras",
            "--workers", "1", "--quiet", "--plots", "none"]
    assert _main([*args, "--out", "one"]) == 0
    shown = capsys.readouterr().out
    assert _main([*args, "--out", "sub/an other"]) == 0
    assert _files(at / "one") == _files(at / "sub" / "an other")
    cell = json.loads((at / "one" / "matrix.json").read_text())["cells"][0]
    assert cell["finding"] and cell["replay"] == "tenantry check --replay cells/fcfs/flood"
    assert "replay fcfs/flood (hurt): tenantry check --replay one/cells/fcfs/flood" in shown
    os.chdir(at / "one")
    assert _main(shlex.split(cell["replay"])[1:]) == 0
    assert f"(recorded {cell['score']:.6g}: same)" in capsys.readouterr().out


def test_verify_targets_report_does_not_depend_on_the_out_folders_name(at, capsys):
    """verify --target: the same bytes in two folders of one parent; the replay command has no
    --out (verify --workload on a report's file writes beside the report by itself) and
    imports the target from where the run did (--target-path, from the report folder)."""
    args = [*VERIFY[:4], "sybil", *VERIFY[5:]]
    assert _main([*args, "--out", "va"]) == 0
    assert _main([*args, "--out", "vb"]) == 0
    assert _files(at / "va") == _files(at / "vb")
    cell = json.loads((at / "va" / "matrix.json").read_text())["cells"][0]
    argv = shlex.split(cell["replay"])
    assert "--out" not in argv and argv[argv.index("--target-path") + 1] == ".."
    assert argv[argv.index("--workload") + 1] == "cells/minisched.tenantry_adapter_make_scheduler/sybil/workload.jsonl"
    os.chdir(at / "va")
    sys.modules.pop("minisched.tenantry_adapter", None)
    assert _main(argv[1:]) == 0
    assert (at / "va-replay" / "cells" / "minisched.tenantry_adapter_make_scheduler" / "sybil-replay"
            / "report.json").exists()
    assert sorted(p.name for p in (at / "va").iterdir()) == sorted(p.name for p in (at / "vb").iterdir())


def test_a_full_disk_during_check_is_one_line_naming_the_file_and_the_kept_cells(at, capsys, monkeypatch):
    """ENOSPC at a write after the first cells (os.fsync fails from its 30th call on, as a full
    disk does at the flush): one line naming the file being written, how many cells were kept
    where, and the command that finishes the run; that command finishes it to the bytes of an
    uninterrupted run.  (Before: ``tenantry: error: : No space left on device``.)"""
    args = ["check", "--policy", "fcfs", "vtc", "--pattern", "flood", "churn", "--budget", "1", "--shrink", "1",
            "--no-extras", "--workers", "1", "--quiet", "--plots", "none"]
    real, calls = os.fsync, []

    def full(fd):
        calls.append(fd)
        if len(calls) >= 30:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", full)
    assert _main([*args, "--out", "rep"]) == 2
    monkeypatch.setattr(os, "fsync", real)
    (line,) = capsys.readouterr().err.strip().splitlines()
    (stage,) = at.glob(".rep.new-*")
    kept = len(list(stage.glob(".tenantry-done/*.json")))
    assert 0 < kept < 4, line
    assert line.startswith(f"tenantry: error: cannot write {stage.name}/"), line
    assert f": No space left on device; {kept} finished cell" in line and "(rep not created)" in line, line
    cmd = line.split("; to finish the run: ", 1)[1]
    assert _main(shlex.split(cmd)[1:]) == 0
    assert _main([*args, "--out", "ref"]) == 0
    assert _files(at / "rep") == _files(at / "ref")


def test_a_full_disk_writing_a_history_names_the_file_and_keeps_the_old_one(tmp_path, capsys, monkeypatch):
    """simulate --history on a full disk: one line naming the history file and saying the old
    one is as it was (before: ``tenantry: error: : No space left on device``)."""
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--policy", "vtc", "--history", "h.jsonl", "--horizon", "2"]) == 0
    old = (tmp_path / "h.jsonl").read_bytes()
    capsys.readouterr()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    before = snapshot(tmp_path)
    assert main(["simulate", "--policy", "vtc", "--history", "h.jsonl", "--horizon", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "tenantry: error: cannot write h.jsonl: No space left on device; h.jsonl is as it was", err
    assert (tmp_path / "h.jsonl").read_bytes() == old and snapshot(tmp_path) == before


def test_resume_continues_the_total_budgets_clock_from_the_last_kept_cell(at, capsys, monkeypatch):
    """--total-budget's seconds are the interrupted run's: a resumed run starts its clock where
    the last kept cell ended.  The first cell is recorded as ending at 1000 s of a 100 s
    budget, so the resumed run is past its deadline: its cell runs one evaluation per search
    without shrinking, and the extras are skipped (a fresh clock would have run them)."""
    import tenantry.adversaries.check as check

    args = ["check", "--policy", "fcfs", "--pattern", "flood", "churn", "--budget", "3", "--total-budget", "100s",
            "--workers", "1", "--quiet", "--plots", "none", "--search", "random", "evolution"]
    real, calls = check.save_cell, []

    def second_stops(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(check, "save_cell", second_stops)
    assert _main([*args, "--out", "rep"]) == 130
    monkeypatch.setattr(check, "save_cell", real)
    (record,) = at.glob(".rep.new-*/.tenantry-done/0000.json")
    doc = json.loads(record.read_text())
    assert doc["done_s"] < 100
    record.write_text(json.dumps({**doc, "done_s": 1000.0}))
    capsys.readouterr()
    assert _main([*args, "--out", "rep", "--resume"]) == 0, capsys.readouterr().err
    m = json.loads((at / "rep" / "matrix.json").read_text())
    assert m["summary"]["extras"] == {"proofs": "skipped: the total budget was spent",
                                      "stateful": "skipped: the total budget was spent"}
    first, second = m["cells"]
    assert first == doc["record"]  # the kept cell, as it was recorded
    assert {s: v["evaluations"] for s, v in second["searches"].items()} == {"random": 1, "evolution": 1}
