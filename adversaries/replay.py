"""Replay commands, as a report's files hold them and as the terminal prints them.

A report's files (``matrix.json``, ``cell.json``, ``report.md``) hold each replay command
**relative to the report folder**, to be run from it: ``tenantry check --replay
cells/vtc/flood``, ``tenantry verify --target T --workload cells/T/flood/workload.jsonl ...
--target-path ..``.  So the same seed gives the same bytes whatever ``--out`` is named
(:func:`in_report`).  ``verify --workload`` on a file inside a report writes its own report
to ``<report>-replay/<cell folder>[-<file>]-replay`` without being told (:func:`replay_out`),
so the commands need no ``--out``; the target is imported from the folder the run imported it
from (``--target-path``, relative to the report folder).  The terminal prints the same
commands runnable from the folder the run was started in (:func:`runnable`).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from .outdir import read_marker, replay_twin

#: The flags whose value is a file or folder of the report.
REPORT_PATHS = ("--replay", "--workload")
_COMMANDS = ("tenantry verify ", "tenantry check ")


def _under(path: str, folder: Path) -> bool:
    p, f = os.path.abspath(path), os.path.abspath(folder)
    return p == f or p.startswith(f.rstrip(os.sep) + os.sep)


def in_report(cmd: str, report: str | os.PathLike, cwd: str | os.PathLike | None = None) -> str:
    """``cmd`` (naming the report's files as the run named them, under ``report``) as the report's
    files hold it: to be run from the report folder (see the module docstring).

    A ``--replay`` or ``--workload`` path under ``report`` is made relative to it; an ``--out``
    under ``<report>-replay`` is left out (:func:`replay_out` gives it back); a ``tenantry
    verify`` command's ``--target-path`` is made relative to ``report``, and one without it gets
    ``cwd`` (default: the current folder), where the run imported the target from."""
    report = Path(report)
    argv = shlex.split(cmd)
    out: list[str] = []
    target_path = False
    i = 0
    while i < len(argv):
        a, v = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if v is not None and a in REPORT_PATHS and _under(v, report):
            out += [a, os.path.relpath(os.path.abspath(v), os.path.abspath(report))]
        elif v is not None and a == "--out" and _under(v, replay_twin(report)):
            pass
        elif v is not None and a == "--target-path":
            out += [a, os.path.relpath(os.path.abspath(v), os.path.abspath(report))]
            target_path = True
        else:
            out.append(a)
            i += 1
            continue
        i += 2
    if argv[:2] == ["tenantry", "verify"] and not target_path:
        out += ["--target-path", os.path.relpath(os.path.abspath(cwd or os.getcwd()), os.path.abspath(report))]
    return shlex.join(out)


def runnable(cmd: str, report: str | os.PathLike) -> str:
    """A command of a report's files (:func:`in_report`) as run from the current folder, the
    report being ``report``: its paths joined to ``report``, a ``--target-path`` naming the
    current folder left out (the default)."""
    report = Path(report)
    argv = shlex.split(cmd)
    out: list[str] = []
    i = 0
    while i < len(argv):
        a, v = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if v is not None and a in REPORT_PATHS and not os.path.isabs(v):
            out += [a, str(report / v)]
        elif v is not None and a == "--target-path":
            p = os.path.normpath(os.path.join(report, v))
            if os.path.abspath(p) != os.getcwd():
                out += [a, p]
        else:
            out.append(a)
            i += 1
            continue
        i += 2
    return shlex.join(out)


def _command_at(text: str) -> int:
    return min((i for i in (text.find(c) for c in _COMMANDS) if i >= 0), default=-1)


def text_in_report(text: str, report: str | os.PathLike) -> str:
    """``text`` ending in a replay command (``...; replay: tenantry verify ...``) with the command
    as :func:`in_report` writes it; other text as it is."""
    i = _command_at(text)
    return text if i < 0 else text[:i] + in_report(text[i:], report)


def text_runnable(text: str, report: str | os.PathLike) -> str:
    """:func:`text_in_report` undone for the terminal (:func:`runnable`)."""
    i = _command_at(text)
    return text if i < 0 else text[:i] + runnable(text[i:], report)


def replay_out(workload: str | os.PathLike) -> Path | None:
    """Where ``tenantry verify --workload FILE`` writes its report when ``--out`` is not given
    and FILE lies in a tenantry report folder: ``<report>-replay/<FILE's folder in the
    report>-replay`` for a cell's ``workload.jsonl``, ``...-<stem>-replay`` for another file
    (``shrunk.jsonl``, ``finding-<ID>.jsonl``), named from the current folder; beside the
    report, never in it.  None when FILE is in no report (the command's default then)."""
    wl = Path(os.path.abspath(workload))
    for folder in wl.parents:
        if read_marker(folder) is None:
            continue
        rel = wl.parent.relative_to(folder).as_posix()
        stem = "" if wl.stem == "workload" else wl.stem
        name = "-".join(x for x in ("" if rel == "." else rel, stem) if x) + "-replay"
        return Path(os.path.relpath(replay_twin(folder) / name))
    return None
