"""Output folders and files that never cost the user a file, and stop cleanly when asked.

Every command that writes a report folder (``tenantry check``, ``tenantry verify``)
goes through :func:`report_folder`:

* **Before any work** it refuses, in one line (a :class:`ConfigError`), an
  ``--out`` it may not replace: an existing file or symbolic link, a folder
  that is not a tenantry report of the same kind (no :data:`MARKER` file
  naming that kind), a report folder holding files tenantry did not write (the
  marker lists every file of the report), the current folder or one of its
  parents, a folder holding one of the run's inputs, and, when ``--out`` was
  not given, a default folder holding a larger report than this run would
  write (the default folders are never silently replaced by a smaller run).
  An empty folder is taken.  A second run on the same folder while one is
  writing it is refused (a lock file ``.<name>.lock`` beside it, held with
  ``flock`` for the run).
* The report is written to a fresh staging folder beside the target
  (``.<name>.new-*``, same file system) and published whole at the end
  (:func:`publish`): the old folder is renamed away, the new one in, the old
  one deleted.  Readers see the old report or the new one, never a mix.
* On Ctrl-C, SIGTERM or any error the target is left as it was.  The staging
  folder of a matrix run that finished cells is kept for ``--resume``
  (:mod:`tenantry.adversaries.resume`); any other is deleted.  A
  :class:`KeyboardInterrupt` leaves as :class:`Interrupted`, whose ``kept`` says
  what was kept in words; a failed write (a full disk) as a
  :class:`~tenantry.runner.files.WriteError` naming the file and what was kept.
* A staging folder or lock file left by a killed run never blocks a run; the
  staging folders of runs whose writer is gone are removed once a report
  replaces them, never before.

:func:`check_output_file` is the same rule for single files (``simulate
--history``): an existing file is replaced only when it is one tenantry wrote.
:func:`shielded` defers SIGINT and SIGTERM over the few steps that must not be
cut in half (publishing, cleaning up).

:func:`staged_folder` is the bare staging-and-publish step, without the checks.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from tenantry.model.config import ConfigError

try:
    import fcntl
except ImportError:  # not POSIX: no lock (two runs on one folder are not refused)
    fcntl = None  # type: ignore[assignment]

#: The marker file in every report folder tenantry writes: JSON with the kind
#: (``check`` or ``verify``), the size (cells or patterns) and every file written.
MARKER = ".tenantry-report"
from .resume import STAGING_MARKER  # noqa: E402  (the marker of a staging folder; see resume)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a command.

    Attributes:
        detail: how far the run got (``after 37 of 204 cells``), or "".
        kept: what was kept, in words (``nothing written; out/ is as it was``), or "".
        resumable: finished cells were kept that ``--resume`` finishes (the command line
            then prints the command).
    """

    def __init__(self, detail: str = "", kept: str = "", resumable: bool = False) -> None:
        super().__init__(detail)
        self.detail, self.kept, self.resumable = detail, kept, resumable


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ordinary_modes(root: str | os.PathLike) -> None:
    """chmod every file under ``root`` to 0666 & ~umask and every folder (root too) to 0777 & ~umask."""
    mask = _umask()
    os.chmod(root, 0o777 & ~mask)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o777 & ~mask)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o666 & ~mask)


# --- signals ------------------------------------------------------------------------

#: Set by the SIGINT / SIGTERM handler of :func:`catch_stop_signals` (the command line's and the
#: pytest plugin's; cleared when a command starts).  The handler raises KeyboardInterrupt too, but Python drops an exception raised while a finaliser
#: runs (a ``__del__``, such as Z3's, that the signal happens to land in): long loops call
#: :func:`stop_if_requested` as well, so such a stop is not lost.
STOP_REQUESTED = threading.Event()


def stop_if_requested() -> None:
    """Raise KeyboardInterrupt if a stop was asked for (:data:`STOP_REQUESTED`)."""
    if STOP_REQUESTED.is_set():
        raise KeyboardInterrupt


#: Seconds after a first SIGINT / SIGTERM during which further ones are ignored: the stop is cleaning up.
SIGNAL_GRACE_S = 5.0
#: The signals that stop a run.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def catch_stop_signals(on_stop: Callable[[int], None] | None = None) -> tuple[dict, list[int]]:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread and set :data:`STOP_REQUESTED`
    (which was cleared); a repeat within :data:`SIGNAL_GRACE_S` is ignored while the first one's
    cleanup runs (``timeout`` and a terminal may send the signal twice).  Used by the command
    line and by the pytest plugin (one handler for both).

    Args:
        on_stop: called with the first signal's number before the KeyboardInterrupt is raised
            (the pytest plugin passes it on to its pytest-xdist workers); it must not raise.

    Returns the previous handlers (``{signal: handler}``, empty outside the main thread, where
    nothing is installed; give them to :func:`restore_signals`) and the list the signals
    received are appended to (their numbers, in order).
    """
    got: list[int] = []
    STOP_REQUESTED.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}, got

    first: list[float] = []

    def on_signal(signum, frame):
        got.append(signum)
        STOP_REQUESTED.set()
        now = time.monotonic()
        if first and now - first[0] < SIGNAL_GRACE_S:
            return  # the stop under way is cleaning up
        first[:] = [now]
        if on_stop is not None:
            on_stop(signum)
        raise KeyboardInterrupt

    on_signal.tenantry_stop = True  # type: ignore[attr-defined]  (restore_signals knows an outer one by it)
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s in STOP_SIGNALS:
        signal.signal(s, on_signal)
    return old, got


def restore_signals(old: dict, got: Iterable[int] = ()) -> None:
    """Put back the handlers :func:`catch_stop_signals` replaced, and clear :data:`STOP_REQUESTED`.

    ``got``: the signals received meanwhile.  When the handler put back is itself one of
    :func:`catch_stop_signals` (a command run inside a pytest session of the plugin's, as
    tenantry's own tests run ``tenantry.cli.main``), the first of them is handed on to it: the
    stop goes on in the session (KeyboardInterrupt) instead of ending with this command.
    """
    for s, h in old.items():
        signal.signal(s, h)
    STOP_REQUESTED.clear()
    got = list(got)
    outer = old.get(got[0]) if got else None
    if getattr(outer, "tenantry_stop", False):
        outer(got[0], None)


@contextmanager
def shielded() -> Iterator[None]:
    """Defer SIGINT and SIGTERM for the block (main thread only; elsewhere a no-op).

    A signal that arrives inside is remembered and raised as KeyboardInterrupt
    when the block ends, unless the block is already leaving with an exception.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        raise KeyboardInterrupt


# --- publishing ----------------------------------------------------------------------

def publish(new: Path, target: Path) -> None:
    """Replace ``target`` (if any) by the folder ``new`` (a sibling): rename away, rename in, delete old.

    Signals are deferred until it is done: it never stops between the two renames.
    """
    with shielded():
        ordinary_modes(new)
        if not (target.exists() or target.is_symlink()):
            os.rename(new, target)
            return
        hold = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, hold / "old")
        try:
            os.rename(new, target)
        except BaseException:
            os.rename(hold / "old", target)
            raise
        shutil.rmtree(hold, ignore_errors=True)


def _remove(tmp: Path) -> None:
    with shielded():
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def staged_folder(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh empty folder beside ``target``; publish it as ``target`` when the block succeeds.

    No checks: see :func:`report_folder` for the one commands use.

    Raises:
        OSError: when the parent folder cannot be created or written.
    """
    target = Path(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=parent))
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    try:
        publish(tmp, target)
    except BaseException:
        _remove(tmp)
        raise


# --- the checks ----------------------------------------------------------------------

def read_marker(folder: Path) -> dict | None:
    """The marker of a report folder (a dict), or None when there is none or it is not ours."""
    try:
        doc = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("tool") == "tenantry" else None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _listing(folder: Path) -> Iterator[str]:
    """Relative paths of every file and folder under ``folder`` (folders end with /), marker excluded."""
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = Path(dirpath).relative_to(folder)
        for d in dirnames:
            yield f"{(rel / d).as_posix()}/"
        for f in filenames:
            p = (rel / f).as_posix()
            if p != MARKER:
                yield p


def check_out(target: str | os.PathLike, kind: str, *, flag: str = "--out", default: bool = False,
              size: int | None = None, inputs: Iterable[str | os.PathLike | None] = ()) -> None:
    """Refuse (ConfigError, one line) an output folder this run may not replace; see the module docstring.

    Args:
        kind: the report kind (``check``, ``verify``); only a report of that kind is replaced.
        default: the folder is the command's default (``--out`` not given): a larger report there is kept.
        size: this run's size (cells, patterns), compared with the marker's when ``default``.
        inputs: files the run reads; none may lie inside the target.
    """
    target = Path(target)
    shown = str(target)
    if not target.name or target.name in (".", ".."):
        target = target.resolve()
    real = target.resolve()
    cwd = Path.cwd().resolve()
    if _inside(cwd, real):
        raise ConfigError(flag, shown, "is the current folder or one of its parents; give a new folder, "
                          "e.g. --out report")
    for inp in inputs:
        if inp is None:
            continue
        if _inside(Path(inp).resolve(), real):
            raise ConfigError(flag, shown, f"holds the input {inp}, and the report replaces the whole folder; "
                              "give another --out")
    stage = next((a for a in real.parents if (a / STAGING_MARKER).is_file()), None)
    if stage is not None:
        raise ConfigError(flag, shown, f"is inside {stage}, the staging folder of an unfinished tenantry run; give "
                          "a folder outside it")
    if target.is_symlink():
        raise ConfigError(flag, shown, "is a symbolic link; give the folder itself or a new one")
    if not target.exists():
        up = next((a for a in target.absolute().parents if a.exists()), None)
        if up is not None and not up.is_dir():
            raise ConfigError(flag, shown, f"cannot be made: {up} is a file, not a folder")
        return
    if not target.is_dir():
        raise ConfigError(flag, shown, "is a file; give a folder name (the report is a folder)")
    try:
        entries = list(_listing(target))
    except OSError as e:
        raise ConfigError(flag, shown, f"cannot be read ({e.strerror})") from None
    marker = read_marker(target)
    if marker is None:
        if not entries and not (target / MARKER).exists():
            return  # an empty folder: nothing to lose
        if (target / STAGING_MARKER).is_file():
            m = re.match(r"^\.(.+)\.new-[^/]*$", target.name)
            raise ConfigError(flag, shown, "is the staging folder of an unfinished tenantry run, not a report"
                              + (f"; to finish that run give --out {target.parent / m.group(1)} --resume"
                                 if m else "") + ", or give another --out")
        raise ConfigError(flag, shown, f"exists and is not a tenantry {kind} report (no {MARKER} file); "
                          "give a new folder, or remove this one yourself")
    if marker.get("kind") != kind:
        raise ConfigError(flag, shown, f"holds a tenantry {marker.get('kind')} report, not a {kind} report; "
                          "give another folder")
    known = set(marker.get("files") or ())
    foreign = sorted(e for e in entries if e not in known)
    if foreign:
        raise ConfigError(flag, shown, f"holds {foreign[0]}, which tenantry did not write (the report would "
                          "replace the whole folder); move it out, or give another --out")
    old = marker.get("size")
    if default and size is not None and isinstance(old, int) and old > size:
        raise ConfigError(flag, shown, f"holds a {old}-{marker.get('unit', 'cell')} report and this run has "
                          f"{size}; the default folder is never replaced by a smaller run: give --out DIR "
                          "(or remove the folder)")


def _ours(fd: int) -> bool:
    """True when the open lock file ``fd`` is one tenantry made: empty (an older tenantry's) or
    holding a tenantry lock's JSON (a run killed before it removed it)."""
    data = os.pread(fd, 4096, 0)
    if not data.strip():
        return True
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("tool") == "tenantry" and doc.get("lock") == 1


@contextmanager
def _lock(target: Path, flag: str) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside ``target`` (flock); refuse at once when another run holds it.

    The lock file names its holder (JSON: this process, :func:`~tenantry.adversaries.resume.identity`).
    One left by a killed run is not locked (the kernel drops a dead process's flock), so it
    never blocks a run: this run takes it over and removes it at the end.  A file of that name
    that tenantry did not write (a user's) is locked for the run but neither changed nor removed.
    """
    from .resume import identity

    path = target.parent / f".{target.name}.lock"
    if fcntl is None:
        yield
        return
    while True:
        try:  # made here, or a killed run's: removed at the end; a user's file of that name: left as it is
            fd, made = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666 & ~_umask()), True
        except FileExistsError:
            try:
                fd, made = os.open(path, os.O_RDWR), False
            except FileNotFoundError:  # its holder removed it meanwhile
                continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(flag, str(target), f"another tenantry run is writing this folder now (lock "
                                  f"{path}); wait for it to end, or give another --out") from None
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file as we opened it: take the new one
    try:
        if made or _ours(fd):
            made = True
            text = json.dumps({"tool": "tenantry", "lock": 1, "out": target.name, "process": identity()}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, text + b"\n", 0)
    except OSError:
        pass  # the lock holds without its note
    try:
        yield
    finally:
        with shielded():
            if made:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            os.close(fd)


def _write_marker(folder: Path, kind: str, size: int | None, unit: str, leave: tuple[str, ...] = ()) -> None:
    """Write the report marker of ``folder`` listing its files, but those under the names
    ``leave`` (the staging folder's own, removed before it is published)."""
    from tenantry.runner.files import atomic_write_text

    files = sorted(f for f in _listing(folder) if not any(f == x or f.startswith(x) for x in leave))
    doc = {"tool": "tenantry", "kind": kind, "size": size, "unit": unit, "files": files}
    atomic_write_text(folder / MARKER, [json.dumps(doc, indent=1, sort_keys=True)])


def _note(line: str) -> None:
    print(f"tenantry: {line}", file=sys.stderr, flush=True)


@contextmanager
def report_folder(target: str | os.PathLike, kind: str, *, flag: str = "--out", default: bool = False,
                  size: int | None = None, unit: str = "cell",
                  inputs: Iterable[str | os.PathLike | None] = (), fingerprint: dict | None = None,
                  resume: bool = False, note: Callable[[str], None] | None = _note) -> Iterator[Path]:
    """Check ``target`` (:func:`check_out`), lock it, yield a staging folder, publish it with a marker.

    A run that keeps its finished cells (:mod:`tenantry.adversaries.resume`) gives its
    ``fingerprint`` (every option that changes the report): the staging folder records it,
    and on Ctrl-C, SIGTERM or an error the folder is kept when it holds a finished cell
    (``--resume`` finishes the run).  With ``resume`` the yielded folder is the interrupted
    run's (:func:`~tenantry.adversaries.resume.plan`), as it was left.  Partial runs of
    ``target`` whose writer is gone are removed once the report is published, never before
    (``note`` is told about one holding finished cells when this run starts afresh).

    Otherwise, on any exception the staging folder is removed; ``target`` is always left as
    it was.  A KeyboardInterrupt (Ctrl-C, or SIGTERM as the CLI maps it) leaves as
    :class:`Interrupted` with ``kept`` saying what was kept; an OSError (a full disk, a
    read-only folder) leaves with ``kept`` saying the same (a
    :class:`~tenantry.runner.files.WriteError` names the path being written).

    Raises:
        ConfigError: before any work, for a target this run may not replace, or a ``resume``
            with nothing to resume.
        OSError: when the parent folder cannot be created or written.
    """
    from tenantry.runner.files import WriteError

    from . import resume as rs

    inputs = list(inputs)
    check_out(target, kind, flag=flag, default=default, size=size, inputs=inputs)
    target = Path(target)
    if not target.name or target.name in (".", ".."):
        target = target.resolve()
    existed = target.exists()
    made = [a for a in reversed(target.absolute().parents) if not a.exists()]  # folders this run creates
    as_was = f"{target} is as it was" if existed else f"{target} not created"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _lock(target, flag):
            check_out(target, kind, flag=flag, default=default, size=size, inputs=inputs)  # as it is now, locked
            chosen = rs.plan(target, kind, fingerprint, resume=resume, flag=flag)
            if chosen.note and note is not None:
                note(chosen.note)
            if chosen.resume is not None:
                tmp = chosen.resume.path
            else:
                tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
            try:
                rs.write_marker(tmp, target, kind, fingerprint, size)
                yield tmp
                with shielded():  # the finished cells stay resumable until the report's marker is written
                    check_out(target, kind, flag=flag, default=default, size=size, inputs=inputs)
                    _write_marker(tmp, kind, size, unit, leave=(STAGING_MARKER, f"{rs.DONE}/"))
                    (tmp / STAGING_MARKER).unlink()
                    shutil.rmtree(tmp / rs.DONE, ignore_errors=True)
            except BaseException as e:
                with shielded():
                    n = rs.finished(tmp) if fingerprint is not None and (tmp / STAGING_MARKER).is_file() else 0
                    if not n:
                        _remove(tmp)
                kept = (f"{n} finished cell{'s' if n != 1 else ''} kept in {tmp} for --resume ({as_was})" if n
                        else f"nothing written: {as_was}" if existed else f"nothing written ({as_was})")
                if isinstance(e, KeyboardInterrupt):
                    raise Interrupted(getattr(e, "detail", ""), kept, resumable=bool(n)) from None
                if isinstance(e, WriteError) or (isinstance(e, OSError) and e.errno in WRITE_ERRNOS):
                    raise WriteError(e.errno, e.strerror or str(e), e.filename if e.filename is not None else str(tmp),
                                     kept, resumable=bool(n)) from None
                if isinstance(e, Exception):  # any other error (a worker process that died): say what was kept
                    try:
                        e.kept, e.resumable = kept, bool(n)  # type: ignore[attr-defined]
                    except AttributeError:
                        pass
                raise
            try:
                publish(tmp, target)
            except BaseException:
                _remove(tmp)
                raise
            with shielded():
                rs.remove_partials(chosen.stale)
    except BaseException as e:
        with shielded():
            for a in reversed(made):  # the parent folders this run made, when still empty
                try:
                    a.rmdir()
                except OSError:
                    break
        if isinstance(e, OSError) and not isinstance(e, WriteError) and e.errno in WRITE_ERRNOS:
            # the parent folder or the lock could not be made (a read-only or full file system)
            raise WriteError(e.errno, e.strerror or str(e), e.filename if e.filename is not None else str(target),
                             f"nothing written: {as_was}" if existed else f"nothing written ({as_was})") from None
        raise


#: errno values of a write that failed for want of room or rights (a full disk, a quota, a
#: read-only file system, no permission, a file too large, an I/O error).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
                          errno.EIO})


def is_history_file(path: Path) -> bool:
    """True when ``path`` starts with a tenantry history header line (a file tenantry wrote)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
        doc = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("kind") == "header" and "format" in doc


def check_output_file(path: str | os.PathLike, flag: str, *, inputs: Iterable[str | os.PathLike | None] = ()) -> None:
    """Refuse (ConfigError) to write ``path`` over anything but a history tenantry wrote, or over an input."""
    p = Path(path)
    for inp in inputs:
        if inp is not None and Path(inp).exists() and p.exists() and p.resolve() == Path(inp).resolve():
            raise ConfigError(flag, str(path), "is one of this run's inputs; give another file name")
    if p.is_symlink():
        raise ConfigError(flag, str(path), "is a symbolic link; give a plain file name")
    if p.is_dir():
        raise ConfigError(flag, str(path), "is a folder; give a file name, e.g. out/h.jsonl")
    if p.exists() and not is_history_file(p):
        raise ConfigError(flag, str(path), "exists and is not a tenantry history; give a new file name "
                          "(or remove this file yourself)")


def replay_twin(report: "str | os.PathLike") -> Path:
    """``<report>-replay``: where the replay commands printed in a report write their own
    reports (beside it, not in it: a report holding a folder it did not list could not be
    replaced by the next run)."""
    return Path(f"{Path(report)}-replay")
