"""Nothing a user runs is lost (issue 34): the report's bytes do not depend on the ``--out``
folder's name; a full disk is one line naming the file and what was kept."""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO, snapshot
from tenantry.cli import main

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
