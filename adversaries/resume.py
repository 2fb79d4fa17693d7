"""Runs that survive being killed: the staging folder of ``tenantry check`` and
``tenantry verify --target`` keeps every finished cell, and ``--resume`` finishes the others.

A report is written into a staging folder ``.<name>.new-*`` beside ``--out`` and published
whole at the end (:mod:`tenantry.adversaries.outdir`).  Here is what that folder holds so that
a run killed midway (SIGKILL, a full disk, a reboot, Ctrl-C) loses only the cells under way:

* ``.tenantry-staging`` (:data:`STAGING_MARKER`): JSON naming the ``--out`` folder, the
  report's kind, the process writing it (pid, its start time in clock ticks since boot from
  ``/proc/<pid>/stat``, the boot id: a pid reused by another process, or one from before a
  reboot, does not pass for the writer; :func:`running`), a random run id, and the run's
  *fingerprint*: every option that changes a byte of the report (:func:`difference` names the
  first one that differs between two runs);
* ``.tenantry-done/NNNN.json`` (:data:`DONE`): one file per finished cell (``NNNN`` its index
  in the matrix), written atomically after every other file of the cell: **a cell is finished
  iff its record exists** (:func:`save_cell`, :func:`load_cells`);
* the report's files of the cells so far (``cells/<setup>/<pattern>/``).

A staging folder whose writer is gone is a *partial* run (:func:`partials`).  It is never
taken for a report (it has no report marker and is not ``--out``) and never blocks a run; a
run with ``--resume`` and the same fingerprint continues in it (:func:`plan`): the files of
unfinished cells and anything written after the cells are removed first (:func:`prune`), and
only the missing cells run.  A run without ``--resume`` says that the partial exists and
starts afresh; the partial is removed once that run's report is published, never before.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import attrs

from tenantry.model.config import ConfigError
from tenantry.runner.files import atomic_write_text

#: Marker file of a staging folder (JSON, see the module docstring).
STAGING_MARKER = ".tenantry-staging"
#: Folder of a staging folder holding one record per finished cell.
DONE = ".tenantry-done"
_RECORD = re.compile(r"^(\d{4,})\.json$")


# --- processes ---------------------------------------------------------------------------

def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field
    22), or None when there is no such process (a zombie, killed and not yet waited for, is
    none) or no ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace").rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def identity() -> dict[str, Any]:
    """This process as a staging marker records it: {pid, start (ticks since boot), boot (id)}."""
    return {"pid": os.getpid(), "start": _start_ticks(os.getpid()), "boot": _boot_id()}


def running(ident: Any) -> bool:
    """True when the process a marker records (:func:`identity`) still runs.

    A pid alone is not trusted: a process of that pid that started at another time, or a
    marker from before a reboot (another boot id), is another process.  This process itself
    counts as gone: a run of this process that ended kept the folder (a run under way holds
    the folder's lock, so a second one never gets this far).
    """
    if not isinstance(ident, dict) or not isinstance(ident.get("pid"), int) or ident["pid"] <= 0:
        return False
    pid = ident["pid"]
    if pid == os.getpid():
        return False
    boot = _boot_id()
    if ident.get("boot") and boot and ident["boot"] != boot:
        return False
    start = _start_ticks(pid)
    if start is not None:
        return ident.get("start") in (None, start)
    if Path("/proc/self/stat").exists():  # Linux, and no such process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the run's fingerprint -----------------------------------------------------------------

def _words(v: Any) -> str:
    if v is None:
        return "not given"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, list):
        return ",".join(_words(x) if not isinstance(x, list) else "/".join(map(str, x)) for x in v) or "none"
    return str(v)


def difference(old: Any, new: dict[str, Any]) -> str | None:
    """The first option in which fingerprint ``old`` (read from a marker) differs from ``new``,
    in words (``--seed 1 there, 0 here``); None when they are the same."""
    new = json.loads(json.dumps(new))  # tuples as lists, as the marker holds them
    if not isinstance(old, dict):
        return "its options (not recorded)"
    for k in list(new) + [k for k in old if k not in new]:
        if k not in old or k not in new or old[k] != new[k]:
            return f"{k} {_words(old.get(k))} there, {_words(new.get(k))} here"
    return None


def fingerprint(kind: str, systems: Sequence, patterns: list[str] | bool, keys: list[tuple[str, str]], *, seed: int,
                 budget: Any, total_budget: Any, searches: Sequence[str], shrink: int, plots: str,
                 extras: bool, victims: str, spread_seeds: int, depth: str) -> dict[str, Any]:
    """Every option of a matrix run that changes a byte of its report, named as the command line
    names it (a system's own options: its ``options()``), with tenantry's version and the cells:
    what a resumed run must match (:func:`difference`); ``budget``, ``total_budget``:
    :class:`~tenantry.adversaries.search.Budget` values (or None).  The workers
    and the executor are not in it: they change no result."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("tenantry")
    except PackageNotFoundError:
        ver = "unknown"
    words = lambda b: None if b is None else (f"{b.evaluations or '-'} evaluations"  # noqa: E731
                                             + (f", {b.seconds:g} s" if b.seconds else ""))
    fp: dict[str, Any] = {"kind": kind, "tenantry version": ver}
    names = [s for s in systems if isinstance(s, str)]
    if names or not systems:
        fp["--policy"] = names
    for s in systems:
        if not isinstance(s, str):
            fp.update(s.options() if hasattr(s, "options") else {"system": repr(s)})
    fp.update({"--pattern": patterns or "all", "--seed": seed, "--budget": words(budget),
               "--total-budget": words(total_budget), "--search": list(searches), "--shrink": shrink,
               "--plots": plots, "extras (--no-extras, --quick)": extras, "--victims": victims,
               "spread seeds": spread_seeds, "replay depth (--no-determinism)": depth,
               "cells": [list(k) for k in keys]})
    return fp



# --- partial runs ------------------------------------------------------------------------

@attrs.frozen
class Partial:
    """A staging folder of one ``--out`` folder, found beside it.

    Attributes:
        path: the folder (``.<name>.new-*``).
        marker: its staging marker (a dict), or None when unreadable.
        problem: why it cannot be resumed, in words ("" when it can).
        live: its writer still runs (:func:`running`).
        cells: finished cells it holds.
    """

    path: Path
    marker: dict | None
    problem: str
    live: bool
    cells: int

    @property
    def fingerprint(self) -> Any:
        return (self.marker or {}).get("fingerprint")

    @property
    def total(self) -> Any:
        return (self.marker or {}).get("cells")


def finished(stage: Path) -> int:
    """How many finished cells the staging folder ``stage`` holds (records in :data:`DONE`)."""
    try:
        return sum(1 for n in os.listdir(stage / DONE) if _RECORD.match(n))
    except OSError:
        return 0


def staging_folders(target: Path) -> Iterator[Path]:
    """The staging folders of ``target`` tenantry made (``.<name>.new-*`` holding the marker)."""
    for p in sorted(target.parent.glob(f".{glob.escape(target.name)}.new-*")):
        if p.is_dir() and not p.is_symlink() and (p / STAGING_MARKER).is_file():
            yield p


def partials(target: Path) -> list[Partial]:
    """Every staging folder of ``target`` (:func:`staging_folders`), read."""
    out = []
    for p in staging_folders(target):
        try:
            text = (p / STAGING_MARKER).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        marker, problem = None, ""
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and doc.get("tool") == "tenantry":
            marker = doc
            if not isinstance(doc.get("fingerprint"), dict):
                problem = "it records no options (not a run that can be resumed)"
        elif text.strip().isdigit():  # an older tenantry's marker: the pid alone
            marker = {"pid": int(text.strip())}
            problem = "an older tenantry wrote it, without its options"
        else:
            problem = f"its {STAGING_MARKER} is not a tenantry staging marker"
        out.append(Partial(p, marker, problem, running((marker or {}).get("process", marker)), finished(p)))
    return out


def write_marker(stage: Path, target: Path, kind: str, fingerprint: dict | None, cells: int | None) -> None:
    """Write (atomically) the staging marker of ``stage``: this process as its writer."""
    doc = {"tool": "tenantry", "staging": 1, "out": target.name, "kind": kind, "process": identity(),
           "run": uuid.uuid4().hex, "cells": cells, "fingerprint": fingerprint}
    atomic_write_text(stage / STAGING_MARKER, [json.dumps(doc, indent=1)])


@attrs.define
class Plan:
    """What a run does with the partial runs of its ``--out`` (:func:`plan`).

    Attributes:
        resume: the partial to continue in (None: a fresh staging folder).
        stale: partial runs whose writer is gone, removed once this run's report is published.
        note: one line for the user (a partial kept until then), or "".
    """

    resume: Partial | None = None
    stale: list[Partial] = attrs.Factory(list)
    note: str = ""


def plan(target: Path, kind: str, fingerprint: dict | None, *, resume: bool, flag: str = "--out") -> Plan:
    """Choose among the partial runs of ``target`` (:func:`partials`).

    With ``resume``: the gone writer's partial of the same kind and fingerprint holding the
    most cells is continued.  Without: a fresh folder; the note names a partial holding
    finished cells (and whether ``--resume`` would finish it).  A partial whose writer still
    runs is never touched.

    Raises:
        ConfigError: with ``resume``, one line saying why nothing can be resumed: no partial
            (``--out`` a finished report, or nothing there), one with other options (naming
            the first that differs), one that is not resumable, or one still being written.
    """
    found = partials(target)
    dead = [p for p in found if not p.live]
    best = lambda ps: max(ps, key=lambda p: (p.cells, p.path.stat().st_mtime_ns))  # noqa: E731
    valid = [p for p in dead if not p.problem and (p.marker or {}).get("kind") == kind]
    same = [p for p in valid if difference(p.fingerprint, fingerprint or {}) is None]
    if resume:
        if same:
            chosen = best(same)
            return Plan(chosen, [p for p in dead if p is not chosen])
        if valid:
            p = best(valid)
            raise ConfigError("--resume", str(target), f"the interrupted run in {p.path} ({p.cells} finished cells) "
                              f"was made with other options: {difference(p.fingerprint, fingerprint or {})}; give "
                              "its options to finish it, or leave out --resume to start afresh")
        odd = [p for p in dead if p.problem or (p.marker or {}).get("kind") != kind]
        if odd:
            p = odd[0]
            why = p.problem or f"it is a {(p.marker or {}).get('kind')} run, not a {kind} run"
            raise ConfigError("--resume", str(target), f"{p.path} cannot be resumed: {why}; leave out --resume "
                              "(this run's report then replaces it)")
        if found:
            p = found[0]
            raise ConfigError("--resume", str(target), f"{p.path} is being written by process "
                              f"{(p.marker or {}).get('process', {}).get('pid')}, which still runs; wait for it to end")
        what = (f"{target} is a finished report" if (target / ".tenantry-report").is_file()
                else f"{target} has no interrupted run")
        raise ConfigError("--resume", str(target), f"nothing to resume: {what} (no staging folder "
                          f".{target.name}.new-* beside it); leave out --resume to run afresh")
    note = ""
    held = [p for p in dead if p.cells > 0]
    if held:
        p = best(held)
        d = (p.problem or (None if fingerprint is None else difference(p.fingerprint, fingerprint)))
        of = f" of {p.total}" if isinstance(p.total, int) else ""
        how = (": --resume would finish it instead" if d is None and fingerprint is not None
               else f" ({d})" if d else " (its own command with --resume would finish it)")
        note = (f"{p.path} holds {p.cells}{of} finished cell{'s' if of or p.cells != 1 else ''} of an interrupted "
                f"run of {target}{how}; it is kept until this run's report replaces it")
    return Plan(None, dead, note)


# --- finished cells ------------------------------------------------------------------------

def save_cell(stage: Path, index: int, key: tuple[str, str], record: dict[str, Any], *,
              done_s: float, cell_s: float) -> dict[str, Any]:
    """Record cell ``key`` (``index`` in the matrix) as finished; call it after every other
    file of the cell is written.  Returns the record as a resumed run reads it back (through
    JSON: lists for tuples, string keys; non-finite floats survive), which the caller keeps
    in place of ``record``, so that a resumed run and an uninterrupted one hold the same
    records.  ``done_s``: seconds from the run's start when it ended; ``cell_s``: its own
    seconds (a resumed run paces ``--total-budget`` on both).

    Raises:
        WriteError: when the record cannot be written (the cell then counts as unfinished).
    """
    text = json.dumps({"setup": key[0], "pattern": key[1], "done_s": done_s, "cell_s": cell_s,
                       "record": record})
    atomic_write_text(stage / DONE / f"{index:04d}.json", [text])
    return json.loads(text)["record"]


def load_cells(stage: Path, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The finished cells of a staging folder: {key: {"record", "done_s", "cell_s"}}; a record
    that does not read back, or names another cell than its index's, counts as unfinished."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        names = sorted(os.listdir(stage / DONE))
    except OSError:
        return out
    for name in names:
        m = _RECORD.match(name)
        if not m or int(m.group(1)) >= len(keys):
            continue
        key = keys[int(m.group(1))]
        try:
            doc = json.loads((stage / DONE / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (isinstance(doc, dict) and [doc.get("setup"), doc.get("pattern")] == list(key)
                and isinstance(doc.get("record"), dict)):
            out[key] = doc
    return out


def prune(stage: Path, keep: dict[int, Path]) -> None:
    """Remove from ``stage`` everything but its marker, the records of the cells ``keep``
    ({index: cell folder relative to the stage}) and those cells' folders: the files of
    unfinished cells and whatever was written after the cells (matrix, report, extras)."""
    folders = {stage / rel for rel in keep.values()}
    names = {f"{i:04d}.json" for i in keep}
    for entry in list(stage.iterdir()):
        if entry.name == STAGING_MARKER:
            continue
        if entry.name == DONE and entry.is_dir() and not entry.is_symlink():
            for f in entry.iterdir():
                if f.name not in names:
                    _drop(f)
            continue
        _prune_tree(entry, folders)


def _prune_tree(path: Path, keep: set[Path]) -> None:
    if path in keep:
        return
    if path.is_dir() and not path.is_symlink() and any(k.is_relative_to(path) for k in keep):
        for child in list(path.iterdir()):
            _prune_tree(child, keep)
        return
    _drop(path)


def _drop(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def remove_partials(stale: Sequence[Partial]) -> None:
    """Remove the partial runs ``stale`` (after a report replaced them), each only when it
    still is a staging folder whose writer is gone (read again: nothing else is removed)."""
    for p in stale:
        if p.path.is_symlink() or not (p.path / STAGING_MARKER).is_file():
            continue
        try:
            doc = json.loads((p.path / STAGING_MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = None
        ident = doc.get("process") if isinstance(doc, dict) else None
        if not running(ident):
            shutil.rmtree(p.path, ignore_errors=True)
