"""Write docs/measurements.md from the benchmarks' recorded results (benchmarks/results/*.json).

    python benchmarks/measurements.py            # rewrite docs/measurements.md
    python benchmarks/measurements.py --check    # exit 1 if the page is not what the results give

Each section is one results file (see benchmarks/record.py): its title, the
date, commit and machine it was measured on, the command, the table and its
notes.  Sections are ordered by file name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "docs" / "measurements.md"

HEAD = """# Measurements

What the benchmarks measured, on which machine and when.  This page is
written by `python benchmarks/measurements.py` from `benchmarks/results/*.json`,
which the benchmarks write when run with `--record`; nothing here is typed by
hand.  Figures from a shared or loaded machine say so (the load at the start
of the run is given); ratios measured within one run are the figures to trust.

"""


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def section(doc: dict) -> str:
    m = doc.get("machine") or {}
    where = ", ".join(x for x in (
        m.get("cpu"), f"{m['cores']} cores" if m.get("cores") else None,
        f"{m['memory_gib']} GiB" if m.get("memory_gib") else None,
        f"load {m['load_1min']} at the start" if m.get("load_1min") is not None else None,
        f"Python {m['python']}" if m.get("python") else None) if x)
    lines = [f"## {doc['title']}", "",
             f"{doc.get('date', '?')}, commit `{doc.get('commit') or '?'}`; {where}.", "",
             "```sh", doc["command"], "```", ""]
    cols = doc["columns"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for row in doc["rows"]:
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if doc.get("notes"):
        lines += ["", doc["notes"]]
    return "\n".join(lines) + "\n"


def render(results: Path = HERE / "results") -> str:
    docs = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(results.glob("*.json"))]
    if not docs:
        return HEAD + "No results recorded yet: run a benchmark with `--record`.\n"
    return HEAD + "\n".join(section(d) for d in docs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/measurements.md is out of date")
    a = ap.parse_args(argv)
    text = render()
    if a.check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is out of date: run python benchmarks/measurements.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
