"""Report folders replaced whole: no mix of old and new results.

:func:`staged_folder` yields a fresh temporary folder beside the target (same
parent, so renames stay on one file system); the caller writes the whole
report there.  On success the target is replaced (old one renamed away, new
one renamed in, old one deleted); on any exception, Ctrl-C included, the
temporary folder is deleted and the old target is left untouched.  Files made
by ``tempfile.mkstemp`` (mode 0600) are given ordinary modes (0666 and 0777
for folders, minus the umask) before publishing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


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


def publish(new: Path, target: Path) -> None:
    """Replace ``target`` (if any) by the folder ``new`` (a sibling): rename away, rename in, delete old."""
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


@contextmanager
def staged_folder(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh empty folder beside ``target``; publish it as ``target`` when the block succeeds.

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
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
