"""What a study returns and how it is written: tables, the result, plots (``tenantry study``).

A study (:mod:`tenantry.studies`) returns a :class:`StudyResult`: its question,
a one- or two-sentence answer with the numbers, a headline :class:`Table`,
further tables and plots; :func:`write_study` writes ``report.md``, one CSV per
table and one PNG per plot.  CSV and Markdown are deterministic.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import attrs


@attrs.frozen
class Table:
    """A table of a study: ``columns`` (names, units in brackets) and ``rows`` (tuples, one value per column)."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def markdown(self) -> list[str]:
        """The table as Markdown lines (floats to 3 significant digits)."""
        return ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)] + [
            "| " + " | ".join(cell_text(v) for v in r) + " |" for r in self.rows]

    def text(self) -> str:
        """The table as aligned plain text (the terminal's headline)."""
        cells = [list(self.columns)] + [[cell_text(v) for v in r] for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(self.columns))]
        return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(c))).rstrip() for c in cells)


def cell_text(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
        return f"{v:,}"
    if isinstance(v, float):
        if math.isinf(v):
            return "never"
        return f"{v:.3g}" if abs(v) < 1e3 else f"{v:,.0f}"
    return str(v)


@attrs.frozen
class StudyResult:
    """What a study found.

    Attributes:
        name, question: the study and the question it answers.
        answer: one or two sentences, with the numbers.
        headline: the table printed and shown first.
        tables: further tables (each written as CSV too).
        plots: (file stem, a function that draws the plot into a PNG path).
        notes: lines on the method (what was run, seeds, sources).
    """

    name: str
    question: str
    answer: str
    headline: Table
    tables: tuple[Table, ...] = ()
    plots: tuple[tuple[str, Callable[[Path], None]], ...] = ()
    notes: tuple[str, ...] = ()


@attrs.frozen
class Study:
    """One study: its name, question and ``run(quick, seed, source, log) -> StudyResult``
    (``source``: a file or folder the study reads, or None; ``log``: progress lines)."""

    name: str
    question: str
    run: Callable[..., StudyResult]


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no screen)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: Path) -> None:
    """Write ``fig`` to ``path`` as a PNG (100 dpi, no software stamp, so the bytes follow the
    figure only) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    pyplot().close(fig)


def write_study(result: StudyResult, folder: Path, *, command: str) -> list[str]:
    """Write ``report.md``, one CSV per table (``<name>.csv``) and one PNG per plot into
    ``folder``; returns the file names written.  CSV and Markdown are deterministic."""
    import csv
    import io

    from tenantry.runner.files import atomic_write_text

    written = []
    tables = (result.headline,) + result.tables
    for t in tables:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(t.columns)
        w.writerows(t.rows)
        name = _file_stem(t.name) + ".csv"
        atomic_write_text(folder / name, buf.getvalue().splitlines())
        written.append(name)
    for stem, draw in result.plots:
        draw(folder / f"{stem}.png")
        written.append(f"{stem}.png")
    lines = [f"# tenantry study {result.name}", "", f"**Question.** {result.question}", "",
             f"**Answer.** {result.answer}", "", f"Command: `{command}`", "", f"## {result.headline.name}", ""]
    lines += result.headline.markdown()
    for stem, _ in result.plots:
        lines += ["", f"![{stem}]({stem}.png)"]
    for t in result.tables:
        lines += ["", f"## {t.name}", "", f"([{_file_stem(t.name)}.csv]({_file_stem(t.name)}.csv))", ""]
        lines += t.markdown()
    if result.notes:
        lines += ["", "## Method", ""] + [f"- {n}" for n in result.notes]
    atomic_write_text(folder / "report.md", lines)
    written.append("report.md")
    return written


def _file_stem(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower() or "table"
