"""What a benchmark measured, kept for the measurements page.

Every benchmark that takes ``--record`` calls :func:`save` with a title, the
command that produced the figures, the column names and the rows; the result
lands in ``benchmarks/results/<name>.json`` together with the date and the
machine (processor, cores, memory, load at the start, Python).  The page
``docs/measurements.md`` is written from those files by
``python benchmarks/measurements.py``: no figure of a particular day or
machine is written by hand in the README or SPEC.md.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict:
    """The machine a figure was measured on: processor, cores, memory (GiB), 1-minute load, Python."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gib": _memory_gib(),
            "load_1min": None if load is None else round(load, 2), "python": sys.version.split()[0]}


def commit() -> str | None:
    """The git commit of the working tree (with ``+dirty`` when it has changes), or None outside git."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("+dirty" if dirty else "")


def save(name: str, *, title: str, command: str, columns: list[str], rows: list[list], notes: str = "",
         started: dict | None = None) -> Path:
    """Write ``benchmarks/results/<name>.json`` (replacing an older one of that name).

    Args:
        name: the file's stem, one per benchmark (and mode).
        title: the section's heading on the measurements page.
        command: the command line that produced the figures.
        columns, rows: the table (rows of plain values, in the columns' order).
        notes: what the figures mean (one paragraph; the page prints it under the table).
        started: :func:`machine` as read when the benchmark started (its load before its own work);
            read now when None.

    Returns:
        The path written.
    """
    RESULTS.mkdir(exist_ok=True)
    doc = {"title": title, "command": command, "date": datetime.date.today().isoformat(), "commit": commit(),
           "machine": started or machine(), "columns": columns, "rows": rows, "notes": notes}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path
