"""Outputs: replayable workload files, per-cell records, plots and the markdown report.

A cell folder ``cells/<setup>/<pattern>/`` holds:

* ``workload.jsonl``: the worst workload found, in the project's JSON Lines
  (:func:`tenantry.runner.traces.write_workload_jsonl`); ``shrunk.jsonl`` the
  reduced one when shrinking ran; ``twin.jsonl`` the prefix probe's control run
  (``shrunk-twin.jsonl``, ``finding-<ID>-twin.jsonl``: that of the shrunk workload, of a
  witness: :func:`twin_file`);
* ``azure/<tenant>.csv`` and ``mooncake/<tenant>.jsonl``: the same requests
  per tenant as Azure-2023-style CSV and Mooncake-style JSON Lines, to replay
  against a real server (one client per tenant);
* ``cell.json``: setup, pattern, parameters, every metric, the searches'
  scores, broken and unchecked invariants, and the command that replays it.

Everything but the plots is written deterministically (same seed, same
bytes) and atomically.  Plots use matplotlib's Agg backend.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tenantry.model.workload import Workload
from tenantry.runner.files import atomic_write_text
from tenantry.runner.fleet import moments, summed
from tenantry.runner.history import History
from tenantry.runner.traces import write_azure_csv, write_mooncake_jsonl, write_workload_jsonl
from tenantry.spec.invariants_core import Finding

from .objectives import OBJECTIVES, censored_ttfts
from .patterns import Scenario


def dump_json(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` as sorted, indented JSON (non-finite floats as strings), atomically."""
    atomic_write_text(path, [json.dumps(as_json(obj), sort_keys=True, indent=1)])


def as_json(obj: Any) -> Any:
    """``obj`` as :func:`dump_json` writes it: a non-finite float as its repr (``'inf'``), mapping
    keys as strings, tuples as lists (what a value read back from a cell.json compares equal to)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)
    if isinstance(obj, Mapping):
        return {str(k): as_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_json(v) for v in obj]
    return obj


def twin_file(name: str) -> str:
    """The file name of the prefix probe's control twin written beside workload file
    ``<name>.jsonl``: ``twin.jsonl`` for the cell's ``workload``, else ``<name>-twin.jsonl``
    (``shrunk-twin.jsonl``); what ``tenantry check --replay`` reads back with that file."""
    return "twin.jsonl" if name == "workload" else f"{name}-twin.jsonl"


def write_workload_files(scenario: Scenario, folder: str | os.PathLike, name: str = "workload") -> dict[str, Any]:
    """Write a scenario's workload (``<name>.jsonl``; the cell's ``workload`` also per tenant as
    Azure CSV and Mooncake JSON Lines) and its control twin if it has one (:func:`twin_file`);
    returns {format: relative path(s)}."""
    folder = Path(folder)
    wl: Workload = scenario.workload
    write_workload_jsonl(wl, folder / f"{name}.jsonl")
    files: dict[str, Any] = {"jsonl": f"{name}.jsonl", "azure": {}, "mooncake": {}}
    if name == "workload":
        for tenant in wl.tenants:
            write_azure_csv(wl, folder / "azure" / f"{tenant}.csv", tenant=tenant)
            write_mooncake_jsonl(wl, folder / "mooncake" / f"{tenant}.jsonl", tenant=tenant)
            files["azure"][tenant] = f"azure/{tenant}.csv"
            files["mooncake"][tenant] = f"mooncake/{tenant}.jsonl"
    if scenario.twin is not None:
        write_workload_jsonl(scenario.twin.workload, folder / twin_file(name))
        files["twin"] = twin_file(name)
    return files


#: pyplot keeps global state: one figure at a time per process (cells may run in threads).
_PLOT_LOCK = threading.Lock()


def plot_cell(setup: str, scenario: Scenario, hist: History, base: History, folder: str | os.PathLike) -> list[str]:
    """Write the three PNGs of one cell (:func:`cell_plots`) into ``folder``; returns their names;
    thread-safe."""
    return write_plots(cell_plots(setup, scenario, hist, base), folder)


def write_plots(pngs: Mapping[str, bytes], folder: str | os.PathLike) -> list[str]:
    """Write ``{file name: PNG bytes}`` into ``folder`` (made if missing); returns the names."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in pngs.items():
        (folder / name).write_bytes(data)
    return list(pngs)


def cell_plots(setup: str, scenario: Scenario, hist: History, base: History) -> dict[str, bytes]:
    """Three PNGs for one cell, in memory: {file name: bytes}; thread-safe.

    ``service.png``: cumulative weighted service per tenant over time;
    ``kv_blocks.png``: KV blocks held per tenant over time (a fleet's: summed over its
    replicas, one point per fleet step, :func:`tenantry.runner.fleet.moments`);
    ``ttft_cdf.png``: the victims' TTFT CDF with and without the adversary
    (censored TTFTs: a request never served counts as waiting to the end).
    """
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def png(fig) -> bytes:
        fig.subplots_adjust(left=0.14, right=0.97, bottom=0.14, top=0.91)  # fixed: tight_layout took 2/5 of the time
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
        plt.close(fig)
        return buf.getvalue()

    with _PLOT_LOCK:
        ms = list(moments(hist))  # a fleet's: one per fleet step, summed over the replicas
        t = [end for end, _ in ms]
        tenants = [n for n, _ in scenario.roles]
        out = {}
        for fname, field, ylabel in (("service.png", "service", "cumulative weighted service (tokens)"),
                                     ("kv_blocks.png", "blocks_in_use", "KV blocks held")):
            fig, ax = plt.subplots(figsize=(7, 3.6))
            rows = [summed(recs, field) for _, recs in ms]
            for n in tenants:
                ys = [r.get(n, 0) for r in rows]
                ax.plot(t, ys, label=n + (" (adversary)" if n in scenario.adversaries else ""),
                        lw=2.0 if n in scenario.adversaries else 1.2,
                        drawstyle="steps-post" if field != "service" else "default")
            ax.set_xlabel("time (s)")
            ax.set_ylabel(ylabel)
            _title(ax, setup, f" / {scenario.pattern}")
            ax.legend(fontsize=7, ncol=2)
            out[fname] = png(fig)
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for label, h, style in (("with adversary", hist, "-"), ("without", base, "--")):
            xs = sorted(x for v in censored_ttfts(h, scenario.victims).values() for x in v)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], style, where="post", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("victim TTFT (s, log)")
        ax.set_ylabel("fraction of victim requests")
        _title(ax, setup, f" / {scenario.pattern}: victims' TTFT CDF")
        ax.legend(fontsize=8)
        out["ttft_cdf.png"] = png(fig)
        return out


#: A plot title's characters at matplotlib's default title size (12 pt) across a 7-inch figure,
#: and at the smallest size used (8 pt); a longer setup name is shortened in its middle.
TITLE_CHARS, TITLE_CHARS_SMALL = 60, 90


def _title(ax, setup: str, rest: str) -> None:
    """Title ``setup + rest`` without clipping: in smaller type past :data:`TITLE_CHARS`
    characters (down to 8 pt), and past :data:`TITLE_CHARS_SMALL` with the middle of ``setup``
    (a long ``--target``) replaced by an ellipsis."""
    text = setup + rest
    if len(text) > TITLE_CHARS_SMALL:
        keep = max(8, TITLE_CHARS_SMALL - len(rest) - 1)
        text = setup[: keep - keep // 2] + "\u2026" + setup[len(setup) - keep // 2:] + rest
    ax.set_title(text, fontsize=12 if len(text) <= TITLE_CHARS else max(8.0, 12 * TITLE_CHARS / len(text)))


def fmt(x: float) -> str:
    """A compact number: 3 significant digits, k/M suffixes for large values, an exponent from 1e9."""
    if not math.isfinite(x):
        return "inf"
    a = abs(x)
    if a >= 1e9:  # 1e300 was "1e+294M"
        return f"{x:.3g}"
    if a >= 1e6:
        return f"{x / 1e6:.3g}M"
    if a >= 1e4:
        return f"{x / 1e3:.3g}k"
    return f"{x:.3g}"


#: Column headings of the printed matrix (the markdown one uses the full names).
ABBREV = {"flood": "flood", "few_huge": "fewhuge", "slow_decoders": "slowdec", "churn": "churn",
          "idle_burst": "idleburst", "on_off_aging": "onoff", "eviction_thrash": "thrash", "prefix_probe": "probe",
          "sybil": "sybil", "queue_stuffing": "stuffing", "estimate_gaming": "estgame", "timed_arrivals": "timed",
          "prefix_herding": "herding", "replica_spreading": "spreading"}


#: What a matrix cell shows (report.md and matrix.md).
MATRIX_LEGEND = ("Each cell: the pattern's objective on the worst workload found (larger is worse for the victims); "
                 "`*` hurt: at or above the pattern's hurt level; `?` the verdict changes with the victims' seed; "
                 "`~` the pattern is expected to hurt this setup and did not; `!` a claimed invariant broke (a finding).")


def matrix_md(setups: Sequence[str], patterns: Sequence[str], cells: Mapping) -> list[str]:
    """``matrix.md``: the policy x adversary table in Markdown, with the legend and each
    pattern's objective and hurt level (the columns' units differ), readable on its own."""
    from .patterns import PATTERNS

    return [MATRIX_LEGEND, "", matrix_text(setups, patterns, cells, markdown=True), "",
            "Objectives (hurt at >=): " + "; ".join(
                f"{p}: {PATTERNS[p].objective} ({PATTERNS[p].finding:g})" for p in patterns if p in PATTERNS)
            + ".  Their definitions, the findings and the replay commands: report.md."]


def cell_marks(c: Mapping[str, Any]) -> str:
    """A cell's marks: ``*`` hurt, ``?`` the verdict changes with the victims' seed, ``~`` expected
    to hurt and did not, ``!`` a claimed invariant broke."""
    return (("*" if c.get("finding") else "") + ("?" if c.get("verdict") == "seed-dependent" else "")
            + ("~" if c.get("expected_hurt") and not c.get("finding") else "") + ("!" if c.get("findings") else ""))


#: The legend of :func:`cell_marks`, one line.
LEGEND = ("* hurt (objective at or above the pattern's hurt level)   ? the verdict changes with the victims' seed   "
          "~ expected to hurt, did not   ! a claimed invariant broke (a finding)")


def matrix_text(setups: Sequence[str], patterns: Sequence[str], cells: Mapping[tuple[str, str], Mapping[str, Any]],
                markdown: bool = False) -> str:
    """The setup x pattern matrix: each cell's objective and its marks (:func:`cell_marks`).
    The plain-text form heads its columns with :data:`ABBREV` and separates them by two spaces."""
    def cell(s: str, p: str) -> str:
        c = cells.get((s, p))
        if c is None:
            return "-"
        return fmt(c["score"]) + cell_marks(c)

    head = ["setup \\ pattern"] + [p if markdown else ABBREV.get(p, p) for p in patterns]
    rows = [[s] + [cell(s, p) for p in patterns] for s in setups]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt_row = lambda r: "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt_row(head)] + [fmt_row(r) for r in rows])


def fleet_text(setups: Sequence[str], patterns: Sequence[str], cells: Mapping[tuple[str, str], Mapping[str, Any]],
               markdown: bool = False) -> str:
    """The fleet cells (records with ``fleet``) as a setup x pattern table, each cell the
    victims' worst TTFT p99 inflation and the fleet service gap (``service_gap`` on the fleet
    history: actor against each victim, summed over the replicas, in units of the largest
    request's cost), e.g. ``x29.8 / 2.27``; "" when the matrix has no fleet cell."""
    rows = [s for s in setups if any((cells.get((s, p)) or {}).get("fleet") for p in patterns)]
    if not rows:
        return ""
    cols = [p for p in patterns if any((s, p) in cells for s in rows)]

    def cell(s: str, p: str) -> str:
        c = cells.get((s, p))
        if c is None:
            return "-"
        m = c["metrics"]
        return f"x{fmt(m['ttft_p99_inflation'])} / {fmt(m['service_gap'])}"

    title = "fleet cells: victims' TTFT p99 inflation / fleet service gap (largest requests)"
    head = ["fleet setup \\ pattern"] + [
        p if markdown else ABBREV.get(p, p) for p in cols]
    body = [[s] + [cell(s, p) for p in cols] for s in rows]
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                         + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    fmt_row = lambda r: "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths)))
    return "\n".join([title] + [fmt_row(head)] + [fmt_row(r) for r in body])


def spread_text(c: Mapping[str, Any]) -> str:
    """``17.4 / 58.4 / 12.1 on seeds 0 / 1 / 2``, or "" when the cell was not re-scored."""
    sp = c.get("spread") or {}
    if len(sp) < 2:
        return ""
    seeds = sorted(sp, key=int)
    return f"{' / '.join(fmt(float(sp[k])) for k in seeds)} on seeds {' / '.join(seeds)}"


def cell_lines(setups: Sequence[str], patterns: Sequence[str], cells: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[str]:
    """One line per cell: objective, score and marks, found by, workload file, invariants; columns two spaces apart."""
    rows = []
    for s in setups:
        for p in patterns:
            c = cells.get((s, p))
            if c is None:
                continue
            inv = "; ".join(f"{k} BROKEN" for k in sorted({f["invariant"] for f in c["findings"]})) or "ok"
            rows.append([s, p, c["objective"], fmt(c["score"]) + cell_marks(c), c["search"] or "-", c["workload"],
                         f"[{inv}]"])
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(x.rjust(w) if i == 3 else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def folder_name(label: str) -> str:
    """A setup's or target's label as a folder name under ``cells/`` (a target's ``module:factory`` has a colon)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label)


def coverage_lines(setups: Sequence[str], patterns: Sequence[str],
                   cells: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[str]:
    """The report's "What was checked" section: per setup, each invariant either checked
    (in which forms, in how many cells) or the reason it was not (nothing is skipped silently),
    one line per outcome naming its invariants (the checked ones first)."""
    out = ["## What was checked", ""]
    for s in setups:
        seen: dict[str, dict[str, int]] = {}
        for p in patterns:
            for inv, why in (cells.get((s, p)) or {}).get("coverage", {}).items():
                seen.setdefault(inv, {})
                seen[inv][why] = seen[inv].get(why, 0) + 1
        if not seen:
            continue
        out.append(f"- `{s}`:")
        groups: dict[str, list[str]] = {}  # one line per outcome, naming every invariant that had it
        for inv in sorted(seen):
            whys = seen[inv]
            checked = {w: n for w, n in whys.items() if w.startswith("checked")}
            text = "; ".join([f"{w} in {n} cells" for w, n in sorted(checked.items())]  # and why not in the rest
                             + [f"{w} in {n} cells" if checked else w for w, n in sorted(whys.items()) if w not in checked])
            groups.setdefault(text, []).append(inv)
        for text in sorted(groups, key=lambda t: (not t.startswith("checked"), t)):
            out.append(f"  - {text}: {', '.join(groups[text])}")
    return out + [""]


#: Findings of one invariant listed per cell in report.md (the rest are counted; cell.json has them all).
FINDINGS_SHOWN = 3


def write_report(folder: str | os.PathLike, summary: Mapping[str, Any], cells: Mapping[tuple[str, str], Mapping[str, Any]],
                 plots: Mapping[tuple[str, str], Iterable[str]], title: str = "tenantry check") -> Path:
    """``report.md``: how the run went, the matrix, the expectations, the findings and their plots, the legend."""
    folder = Path(folder)
    setups, patterns = summary["setups"], summary["patterns"]
    total = summary.get("total_budget")
    seeds = summary.get("spread_seeds") or []
    lines = [
        f"# {title}",
        "",
        f"Seed {summary['seed']}, budget {summary['budget']} per cell"
        + (f" within a total of {total} for the run" if total else "")
        + f", searches: {', '.join(summary['searches'])}; "
        f"invariants checked with the catalog of tenantry.spec (history forms during search; state, "
        f"history and two-run forms on each cell's worst workload).",
        "",
        MATRIX_LEGEND
        + (f" A verdict within a factor {summary.get('spread_band', 2):g} of the hurt level is re-scored on the "
           f"victims' seeds {', '.join(map(str, seeds[1:]))} (same adversary workload)." if len(seeds) > 1 else ""),
        "",
        matrix_text(setups, patterns, cells, markdown=True),
        "",
    ]
    fleet = fleet_text(setups, patterns, cells, markdown=True)
    if fleet:
        fp = summary.get("fleet_patterns")
        lines += ["## Fleet setups", "",
                  "Each fleet cell: the victims' worst TTFT p99 inflation (with the adversary / without it) and the "
                  "fleet service gap: the largest swing of the actor's weighted service minus a victim's, summed "
                  "over the replicas, while both had requests queued somewhere in the fleet, in units of the "
                  "largest request's cost (`service_gap`, SPEC.md 7.9)."
                  + (f" Fleet setups run against {', '.join(fp)} (`-`: not run; `--pattern` runs any)." if fp else ""),
                  "", fleet, ""]
    unmet = [(s, p) for s in setups for p in patterns if (c := cells.get((s, p))) is not None
             and c.get("expected_hurt") and not c.get("finding")]
    unstable = [(s, p) for s in setups for p in patterns if (c := cells.get((s, p))) is not None
                and c.get("verdict") == "seed-dependent"]
    if "expected" in summary or unmet or unstable:
        lines += ["## Expectations and seed-dependent verdicts", ""]
        n_exp = summary.get("expected", sum(1 for c in cells.values() if c.get("expected_hurt")))
        lines.append(f"{n_exp - len(unmet)} of {n_exp} \"should hurt\" expectations met; "
                     f"{len(unstable)} verdicts change with the victims' seed.")
        lines.append("")
        for s, p in unmet:
            c = cells[(s, p)]
            sp = spread_text(c)
            lines.append(f"- expected to hurt, did not: `{s}` / `{p}`: {c['objective']} = {fmt(c['score'])} "
                         f"(hurt at >= {fmt(c.get('threshold', float('nan')))})" + (f"; {sp}" if sp else ""))
        for s, p in unstable:
            c = cells[(s, p)]
            lines.append(f"- seed-dependent: `{s}` / `{p}`: {c['objective']} {spread_text(c)} "
                         f"(hurt at >= {fmt(c.get('threshold', float('nan')))})")
        lines.append("")
    lines += ["## Objectives", ""]
    from .patterns import PATTERNS
    for p in patterns:
        pat = PATTERNS[p]
        lines.append(f"- **{p}** ({pat.objective}, hurt at >= {pat.finding:g}): {pat.exploits}. "
                     f"Should hurt: {', '.join(pat.hurts) or 'no setup is expected to be hurt'}. "
                     f"Objective: {OBJECTIVES[pat.objective]}.")
    broken = [(k, c) for k, c in sorted(cells.items()) if c["findings"]]
    lines += ["", "## Broken invariants", ""]
    if not broken:
        lines.append("None in the matrix's cells" + (" (the extras below, the stateful run and the determinism "
                     "re-run, say whether they found one)." if summary.get("extras") else "."))
    for (s, p), c in broken:
        by_inv: dict[str, list] = {}
        for f in c["findings"]:
            by_inv.setdefault(f["invariant"], []).append(f)
        for inv, fs in by_inv.items():  # the first findings of each invariant, its witness once
            for f in fs[:FINDINGS_SHOWN]:
                during = f" (during the {f['search']} search, candidate {f['candidate']})" if "search" in f else ""
                lines.append(f"- `{s}` / `{p}`{during}: {Finding.from_json(f).render()}")
            if len(fs) > FINDINGS_SHOWN:
                lines.append(f"- `{s}` / `{p}`: {len(fs) - FINDINGS_SHOWN} more {inv} findings (other requests or "
                             f"tenants) in cells/{folder_name(s)}/{p}/cell.json")
            f = fs[0]
            if "witness" in f:
                d = f"cells/{folder_name(s)}/{p}"
                w = Path(f["witness"]).name
                lines.append(f"  Witness of {inv}: [{d}/{w}]({d}/{w}), {f['witness_requests']} requests"
                             + ("" if f["reproduced"] else "; the invariant did NOT break again when this workload "
                                "was replayed: the finding depends on more than the workload (timing, hash seed, "
                                "a race, state left by earlier runs)")
                             + (f"; {f['witness_note']}" if f.get("witness_note") else "") + f". Replay: `{f['replay']}`")
                if "witness_first" in f:
                    g = f["witness_first"]
                    lines.append(f"  On this witness {g['invariant']} breaks at step {g['step']}, before {inv}: "
                                 f"{inv} may follow from it; look at {g['invariant']} first.")
            elif "search" not in f and c.get("replay"):  # broken on the cell's own worst workload
                lines.append(f"  {inv} broke on the cell's worst workload "
                             f"([cells/{folder_name(s)}/{p}/workload.jsonl](cells/{folder_name(s)}/{p}/workload.jsonl)). "
                             f"Replay: `{c['replay']}`")
    lines += ["", "## Cells where the victims were hurt", ""]
    for s in setups:
        for p in patterns:
            c = cells.get((s, p))
            if c is None or not c["finding"]:
                continue
            d = f"cells/{folder_name(s)}/{p}"
            m = c["metrics"]
            lines.append(f"### {s} / {p}: {c['objective']} = {fmt(c['score'])}")
            lines.append("")
            lines.append(f"Found by {c['search']}; victim TTFT p99 x{fmt(m['ttft_p99_inflation'])}, starvation "
                         f"{fmt(m['starvation_s'])} s, actor's contended share {fmt(m['contended_share'])}, Jain "
                         f"{fmt(m['jain'])}, most evictions of one sequence {fmt(m['max_evictions'])}, probe AUC "
                         f"{fmt(m['probe_auc'])}.  Workload: [{d}/{c['workload_name']}]({d}/{c['workload_name']})"
                         + (f"; shrunk to {c['shrunk_requests']} of {c['adversary_requests']} adversary requests: "
                            f"[{d}/shrunk.jsonl]({d}/shrunk.jsonl)" if c.get("shrunk") else "")
                         + (f"; {c['shrunk_note']}" if c.get("shrunk_note") else "") + ".")
            lines.append(f"Replay: `{c['replay']}`")
            for png in plots.get((s, p), ()):
                lines.append(f"![{png}]({d}/{png})")
            lines.append("")
    lines += coverage_lines(setups, patterns, cells)
    extras = summary.get("extras") or {}
    if extras:
        lines += ["## Proofs and stateful suite", ""]
        for k, v in sorted(extras.items()):
            lines.append(f"- {k}: {v}")
        lines.append("")
    path = folder / "report.md"
    atomic_write_text(path, lines)
    return path
