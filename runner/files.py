"""Reading and writing the project's files: every input read as a bounded stream of UTF-8
lines with errors that name the file and line (:func:`text_lines`, :func:`json_lines`), every
output written atomically (:func:`atomic_write_text`): a reader, or a run killed midway,
sees the old file or the new one, never half of one.  Workloads, traces, histories, reports
and study tables all go through here."""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Iterator

from tenantry.model.config import ConfigError


class WriteError(OSError):
    """A file could not be written (a full disk, a quota, a read-only file system, no
    permission): ``filename`` is the path being written (never a temporary file's),
    ``kept`` says in words what is as it was (``out/h.jsonl is as it was``), and the
    command line prints both on one line.

    Attributes:
        errno, strerror, filename: as :class:`OSError`'s.
        kept: what was kept, in words ("" when nothing is known).
        resumable: True when the run kept finished work that ``--resume`` finishes.
    """

    def __init__(self, errno: int | None, strerror: str, filename: str, kept: str = "",
                 resumable: bool = False) -> None:
        super().__init__(errno, strerror, filename)
        self.kept, self.resumable = kept, resumable


def write_failed(e: OSError, path: str | os.PathLike, kept: str = "", resumable: bool = False) -> WriteError:
    """``e`` (an OSError raised while writing ``path``) as a :class:`WriteError` naming
    ``path`` (a write, flush or fsync error names no file) and saying what was ``kept``."""
    return WriteError(e.errno, e.strerror or str(e), str(path), kept, resumable)


def atomic_write_text(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """Write ``lines`` (each followed by a newline) to ``path`` atomically.

    The text goes to a temporary file in the same folder, is flushed and
    fsync'ed, then renamed over ``path``: a reader sees the old file or the new
    one, never half of one.  On any error the temporary file is removed and the
    old file is left as it was.

    Raises:
        WriteError: when the file cannot be written (ENOSPC, EDQUOT, EROFS, EACCES, ...):
            naming ``path`` and saying that the old file is as it was (or was not made).
    """
    path = Path(path)
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except WriteError:
        raise
    except OSError as e:
        raise write_failed(e, path, _left(path, existed)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(line)
                f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file an ordinary mode
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise write_failed(e, path, _left(path, existed)) from None
        raise


def _left(path: Path, existed: bool) -> str:
    return f"{path} is as it was" if existed else f"{path} was not written"


#: Largest input file read, in MiB (workloads, histories, traces); the environment variable
#: ``TENANTRY_MAX_INPUT_MB`` overrides it.
MAX_INPUT_MB = 1024
#: Longest line read (bytes): a longer one is not a line of any of these formats.
MAX_LINE_BYTES = 1 << 20
#: The first bytes of compressed files (magic numbers), and what they are called.
COMPRESSED = ((b"\x1f\x8b", "gzip-compressed"), (b"BZh", "bzip2-compressed"), (b"\xfd7zXZ\x00", "xz-compressed"),
              (b"\x28\xb5\x2f\xfd", "zstd-compressed"), (b"PK\x03\x04", "zip"))
#: Files at least this large (bytes) show a progress bar while they are read (on a terminal).
PROGRESS_BYTES = 32 << 20


def max_input_bytes() -> int:
    """The input size limit in bytes (:data:`MAX_INPUT_MB`, or ``TENANTRY_MAX_INPUT_MB``).

    Raises:
        ConfigError: when ``TENANTRY_MAX_INPUT_MB`` is not a positive number.
    """
    text = os.environ.get("TENANTRY_MAX_INPUT_MB")
    if text is None:
        return MAX_INPUT_MB << 20
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if not (math.isfinite(mb) and mb > 0):
        raise ConfigError("TENANTRY_MAX_INPUT_MB", text, "must be a positive number of MiB")
    return int(mb * (1 << 20))


def text_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield (line number, line with its line ending) of a UTF-8 text file (optional BOM), as a stream.

    At most :func:`max_input_bytes` are read and no line may exceed
    :data:`MAX_LINE_BYTES`, so an endless or binary input (``/dev/zero``, a
    pipe that never ends) is one clear error instead of a run that reads until
    it is killed; a large file shows a progress bar (tqdm, on stderr).

    Raises:
        ConfigError: naming the file (and line) for an unreadable file, a
            device, a file over the limit, a NUL byte, a line over the limit, or
            bytes that are not UTF-8.
    """
    import stat

    limit = max_input_bytes()
    try:  # opened non-blocking, so that a FIFO no process writes is an empty input, not a hang
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(fd, True)  # then read as usual (a writer's bytes are waited for)
        f = os.fdopen(fd, "rb")
    except OSError as e:
        raise ConfigError("path", str(path), e.strerror or "cannot read file") from None
    with f:
        mode = os.fstat(f.fileno()).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise ConfigError("path", str(path), "is a device, not a text file")
        size = os.fstat(f.fileno()).st_size if stat.S_ISREG(mode) else None
        too_big = (f"larger than the {limit / (1 << 20):.4g} MiB input limit (set TENANTRY_MAX_INPUT_MB to "
                   "raise it)")
        if size is not None and size > limit:
            raise ConfigError("size", f"{size:,} bytes", too_big, str(path))
        from tqdm import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {Path(path).name}", leave=False,
                   disable=None if size is not None and size >= PROGRESS_BYTES else True)
        read = 0
        try:
            n = 0
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                n += 1
                read += len(raw)
                where = f"{path}:{n}"
                if n == 1:
                    packed = next((kind for magic, kind in COMPRESSED if raw.startswith(magic)), None)
                    if packed is not None:
                        raise ConfigError("", None, f"a {packed} file, not text: unpack it first (the formats are "
                                          "plain UTF-8 text)", where)
                if b"\0" in raw:
                    raise ConfigError("bytes", raw[raw.index(b"\0"):][:4], "a NUL byte: not a text file", where)
                if len(raw) > MAX_LINE_BYTES:
                    raise ConfigError("line", f"{raw[:12]!r}...", f"longer than {MAX_LINE_BYTES >> 20} MiB: not a "
                                      "line of a workload, history or trace", where)
                if read > limit:
                    raise ConfigError("size", f"more than {limit:,} bytes", too_big, where)
                if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ConfigError("bytes", raw[e.start:e.start + 4], "not UTF-8 text", where) from None
                bar.update(len(raw))
                yield n, text
        finally:
            bar.close()


def json_lines(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
    """Yield (``file:line``, object) for each non-blank line, as a stream (:func:`text_lines`);
    bad JSON is a ConfigError."""
    for n, text in text_lines(path):
        where = f"{path}:{n}"
        line = text.rstrip("\r\n")
        if not line.strip():
            continue
        array = ("; this is a JSON array: the format is JSON Lines, one object per line (jq -c '.[]' converts "
                 "an array)") if line.lstrip().startswith("[") else ""
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            at = e.msg if e.msg.endswith(" at") else e.msg + " at"  # "Unterminated string starting at"
            cut = ("; its last line has no line ending: the file looks truncated (cut off mid-line)"
                   if not text.endswith("\n") else "")
            raise ConfigError("json", line[:60], f"bad JSON: {at} column {e.colno}{array}{cut}", where) from None
        if not isinstance(obj, dict):
            raise ConfigError("json", line[:60], f"each line must be a JSON object{array}", where)
        yield where, obj


_UMASK: list[int] = []
_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process's umask, read once (``os.umask`` can only be read by setting it, which
    would give a file made by another thread meanwhile the mode 0666: cells run in threads)."""
    with _UMASK_LOCK:
        if not _UMASK:
            mask = os.umask(0o022)
            os.umask(mask)
            _UMASK.append(mask)
        return _UMASK[0]
