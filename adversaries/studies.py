"""Studies: the seed documents' open questions answered with the model (``tenantry study NAME``).

A study runs the model (or reads a ``tenantry check`` matrix), and returns a
:class:`StudyResult`: its question, a one- or two-sentence answer with the
numbers, a headline table, further tables and plots.  The command writes them
as ``report.md``, one CSV per table and one PNG per plot, and prints the
headline table.  Every study is deterministic for its seed (the model is); a
``quick`` run is a smaller version of the same study, for the tests.

Studies (:data:`STUDIES`; thrash, accounting-cost and batch-size live in
:mod:`tenantry.adversaries.studies_load`):

* ``seed-001``: the lesson's "Try it" experiments on its own workload (seed
  001's three tenants, 300 s; quick: 100 s), each against VTC as the lesson
  runs it: the chat tenant at weight 2, a queue bound of 50, ``w_out = 1``, a
  token-rate limit of 20,000 weighted tokens per second instead of the request
  rate limit, and the chat tenant idle for the first half then active, with
  and without the counter lift.
* ``abuse``: for each policy setup, what each abusive pattern does to the
  other tenants' TTFT p99 (the victims' p99 with the adversary over without
  it), as a heat map, from a ``tenantry check`` matrix (its ``matrix.json``) or
  from a small matrix run here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import attrs

from tenantry.model.config import Config, ConfigError
from tenantry.model.setups import apply_setup, seed001_config
from tenantry.model.simulate import simulate, tenant_table
from tenantry.model.traces import seed001_workload
from tenantry.model.workload import Workload


@attrs.frozen
class Table:
    """A table of a study: ``columns`` (names, units in brackets) and ``rows`` (tuples, one value per column)."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def markdown(self) -> list[str]:
        """The table as Markdown lines (floats to 3 significant digits)."""
        return ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)] + [
            "| " + " | ".join(_cell(v) for v in r) + " |" for r in self.rows]

    def text(self) -> str:
        """The table as aligned plain text (the terminal's headline)."""
        cells = [list(self.columns)] + [[_cell(v) for v in r] for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(self.columns))]
        return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(c))).rstrip() for c in cells)


def _cell(v: Any) -> str:
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


# --- seed-001: the lesson's "Try it" experiments ------------------------------------------------


def _run(config: Config, workload: Workload, duration_s: float, w_out: float | None = None) -> dict[str, dict]:
    """Per-tenant rows of one run (window = the workload's duration; horizon 3x it), with the
    weighted throughput in the config's own weights and the raw tokens per second (``tokens_per_s``)."""
    h = simulate(config, workload, horizon_s=3 * duration_s, record_steps=False)
    rows = {r["tenant"]: r for r in tenant_table(h, window_s=duration_s, w_in=config.order.w_in,
                                                  w_out=config.order.w_out)}
    for r in tenant_table(h, window_s=duration_s, w_in=1.0, w_out=1.0):
        rows[r["tenant"]]["tokens_per_s"] = r["weighted_tokens_per_s"]
    return rows


def _tenants(config: Config, **changes: Any) -> Config:
    """``config`` with every tenant changed by ``changes`` (or, for a dict value keyed by
    tenant name, only the tenants it names)."""
    def one(t):
        kw = {k: (v[t.name] if isinstance(v, dict) else v) for k, v in changes.items()
              if not isinstance(v, dict) or t.name in v}
        return attrs.evolve(t, **kw) if kw else t
    return attrs.evolve(config, tenants=tuple(one(t) for t in config.tenants))


def seed001_study(quick: bool = False, seed: int = 9, source: Any = None,
                  log: Callable[[str], None] = lambda s: None) -> StudyResult:
    """The five "Try it" experiments of seed 001 on its workload (``seed``; 300 s, quick 100 s).

    Each experiment is two runs of the model, the lesson's VTC (``vtc`` setup over
    :func:`~tenantry.model.setups.seed001_config`) and the changed one; the rows are
    per-tenant TTFT p99 (seconds), 429s and tokens per second finished within the
    workload's duration.  The lesson's predicted direction is stated per row and
    whether the model agrees.
    """
    if source is not None:
        raise ConfigError("--from", str(source), "the seed-001 study reads no file")
    duration = 100.0 if quick else 300.0
    wl = seed001_workload(seed=seed, duration_s=duration)
    base = seed001_config(wl.tenants)
    vtc = apply_setup(base, "vtc")
    log("baseline: vtc")
    ref = _run(vtc, wl, duration)
    late = Workload(tuple(r for r in wl if r.tenant != "chat" or r.arrival_s >= duration / 2))
    experiments: list[tuple[str, Callable[[], dict]]] = [
        ("chat weight 2", lambda: _run(_tenants(vtc, weight={"chat": 2.0}), wl, duration)),
        ("queue bound 50", lambda: _run(attrs.evolve(_tenants(vtc, queue_bound=50), admission=attrs.evolve(
            vtc.admission, queue_bound=True)), wl, duration)),
        ("w_out = 1", lambda: _run(attrs.evolve(vtc, order=attrs.evolve(vtc.order, w_out=1.0)), wl, duration)),
        ("request-rate limit", lambda: _run(apply_setup(base, "rate_limit"), wl, duration)),
        ("token-rate limit 20k/s", lambda: _run(attrs.evolve(
            _tenants(vtc, token_rate_per_s=20_000.0, token_burst_tokens=40_000.0),
            admission=attrs.evolve(vtc.admission, token_bucket=True)), wl, duration)),
        ("chat late, lift", lambda: _run(vtc, late, duration)),
        ("chat late, no lift", lambda: _run(apply_setup(base, "vtc_nolift"), late, duration)),
    ]
    # The contended variant: app at 4x and chat at 100x the lesson's rates, so that every
    # tenant asks more than an equal share and stays backlogged under VTC (the weights,
    # w_out and the lift decide only between backlogged tenants).
    c_dur = 30.0 if quick else 100.0
    cwl = seed001_workload(seed=seed, duration_s=c_dur, rate_scale=CONTENDED)
    clate = Workload(tuple(r for r in cwl if r.tenant != "chat" or r.arrival_s >= c_dur / 2))
    cvtc = apply_setup(seed001_config(cwl.tenants), "vtc")
    experiments += [
        ("contended: vtc", lambda: _run(cvtc, cwl, c_dur)),
        ("contended: chat weight 2", lambda: _run(_tenants(cvtc, weight={"chat": 2.0}), cwl, c_dur)),
        ("contended: w_out = 1", lambda: _run(attrs.evolve(cvtc, order=attrs.evolve(cvtc.order, w_out=1.0)), cwl,
                                              c_dur)),
        ("contended: chat late, lift", lambda: _run(cvtc, clate, c_dur)),
        ("contended: chat late, no lift", lambda: _run(apply_setup(seed001_config(cwl.tenants), "vtc_nolift"),
                                                       clate, c_dur)),
    ]
    runs = {"vtc": ref}
    for name, fn in experiments:
        log(name)
        runs[name] = fn()
    names = ("bulk", "app", "chat")
    detail = Table("runs", ("run", "tenant", "TTFT p99 [s]", "429", "tokens/s", "finished in time"), tuple(
        (run, t, r[t]["ttft_p99_s"], r[t]["rejected"], r[t]["tokens_per_s"], r[t]["finished_in_time"])
        for run, r in runs.items() for t in names if t in r))
    share = lambda r: r["bulk"]["tokens_per_s"] / r["app"]["tokens_per_s"]
    late_others = lambda r: max(r["bulk"]["ttft_p99_s"], r["app"]["ttft_p99_s"])
    w2, qb, wo, rl, tb = (runs[k] for k in ("chat weight 2", "queue bound 50", "w_out = 1", "request-rate limit",
                                            "token-rate limit 20k/s"))
    lift, nolift = runs["chat late, lift"], runs["chat late, no lift"]
    cref, cw2, cwo, clift, cnolift = (runs["contended: " + k] for k in (
        "vtc", "chat weight 2", "w_out = 1", "chat late, lift", "chat late, no lift"))
    others = lambda r: r["bulk"]["tokens_per_s"] + r["app"]["tokens_per_s"]
    rows = [
        ("1 chat weight 2", "chat TTFT p99 [s]", ref["chat"]["ttft_p99_s"], w2["chat"]["ttft_p99_s"], "lower",
         _agrees(w2["chat"]["ttft_p99_s"], ref["chat"]["ttft_p99_s"], "lower")),
        ("1 chat weight 2", "app tokens/s", ref["app"]["tokens_per_s"], w2["app"]["tokens_per_s"], "lower",
         _agrees(w2["app"]["tokens_per_s"], ref["app"]["tokens_per_s"], "lower")),
        ("2 queue bound 50", "bulk 429s", ref["bulk"]["rejected"], qb["bulk"]["rejected"], "higher",
         _agrees(qb["bulk"]["rejected"], ref["bulk"]["rejected"], "higher")),
        ("2 queue bound 50", "bulk TTFT p99 [s]", ref["bulk"]["ttft_p99_s"], qb["bulk"]["ttft_p99_s"], "lower",
         _agrees(qb["bulk"]["ttft_p99_s"], ref["bulk"]["ttft_p99_s"], "lower")),
        ("3 w_out = 1", "bulk / app tokens", share(ref), share(wo), "changes",
         _agrees(share(wo), share(ref), "changes")),
        ("4 token rate vs request rate", "app 429s", rl["app"]["rejected"], tb["app"]["rejected"], "lower",
         _agrees(tb["app"]["rejected"], rl["app"]["rejected"], "lower")),
        ("4 token rate vs request rate", "total tokens/s", sum(r["tokens_per_s"] for r in rl.values()),
         sum(r["tokens_per_s"] for r in tb.values()), "higher",
         _agrees(sum(r["tokens_per_s"] for r in tb.values()), sum(r["tokens_per_s"] for r in rl.values()), "higher")),
        ("5 chat late: no lift vs lift", "bulk/app worst TTFT p99 [s]", late_others(lift), late_others(nolift),
         "higher", _agrees(late_others(nolift), late_others(lift), "higher")),
        ("1c chat weight 2 (contended)", "chat TTFT p99 [s]", cref["chat"]["ttft_p99_s"], cw2["chat"]["ttft_p99_s"],
         "lower", _agrees(cw2["chat"]["ttft_p99_s"], cref["chat"]["ttft_p99_s"], "lower")),
        ("1c chat weight 2 (contended)", "app tokens/s", cref["app"]["tokens_per_s"], cw2["app"]["tokens_per_s"],
         "lower", _agrees(cw2["app"]["tokens_per_s"], cref["app"]["tokens_per_s"], "lower")),
        ("3c w_out = 1 (contended)", "bulk / app tokens", share(cref), share(cwo), "changes",
         _agrees(share(cwo), share(cref), "changes")),
        ("5c chat late: no lift vs lift (contended)", "app TTFT p99 [s]", clift["app"]["ttft_p99_s"],
         cnolift["app"]["ttft_p99_s"], "higher",
         _agrees(cnolift["app"]["ttft_p99_s"], clift["app"]["ttft_p99_s"], "higher")),
        ("5c chat late: no lift vs lift (contended)", "bulk + app tokens/s", others(clift), others(cnolift),
         "lower", _agrees(others(cnolift), others(clift), "lower")),
    ]
    headline = Table("experiments", ("experiment", "measure", "before", "after", "lesson predicts", "model agrees"),
                     tuple(rows))
    agree = sum(1 for r in rows if r[-1] == "yes")
    answer = (f"The model agrees with the lesson on {agree} of {len(rows)} predicted directions"
              + ("" if agree == len(rows) else ": not on " + "; ".join(
                  f"{r[0]} ({r[1]} {_cell(r[2])} -> {_cell(r[3])})" for r in rows if r[-1] != "yes"))
              + ". " + _why(ref)
              + (" In the contended variant, where every tenant stays backlogged, weight 2, w_out = 1 and the "
                 "missing lift go the way the lesson predicts (rows 1c, 3c, 5c)."
                 if all(r[-1] == "yes" for r in rows if "(contended)" in r[0]) else ""))

    def plot(path: Path) -> None:
        _bar_plot(path, [f"{r[0]}\n{r[1]}" for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                  "before / after, each measure scaled to its 'before'", normalise=True)

    return StudyResult(
        "seed-001", SEED001_QUESTION, answer, headline, (detail,), (("experiments", plot),),
        (f"workload: seed001_workload(seed={seed}, duration_s={duration:g}): {len(wl)} requests of bulk, app "
         "and chat; each run's window is the workload's duration, its horizon three times that",
         "before: the lesson's VTC (setup vtc) unless the row says otherwise (experiment 4 compares the request-"
         "rate limit, setup rate_limit, with a token bucket of 20,000 tokens/s, burst 40,000, under VTC; "
         "experiment 5 drops chat's requests of the first half and compares vtc_nolift with vtc)",
         f"rows 1c, 3c, 5c: the contended variant, seed001_workload(seed={seed}, duration_s={c_dur:g}, "
         f"rate_scale={CONTENDED}): {len(cwl)} requests, app at 4x and chat at 100x the lesson's rates, so that "
         "every tenant stays backlogged under VTC, the condition under which a weight, w_out or the lift act"))


#: Rate factors of the seed-001 study's contended variant (every tenant backlogged under VTC).
CONTENDED = {"app": 4.0, "chat": 100.0}

SEED001_QUESTION = ("Seed 001's 'Try it': what do a weight of 2 for chat, a queue bound of 50, w_out = 1, a "
                    "token-rate instead of a request-rate limit, and a late tenant without the counter lift do "
                    "to the three tenants?")


def _agrees(after: float, before: float, direction: str) -> str:
    if direction == "lower":
        return "yes" if after < before else "no"
    if direction == "higher":
        return "yes" if after > before else "no"
    return "yes" if not math.isclose(after, before, rel_tol=1e-3) else "no"


def _why(ref: dict) -> str:
    """Which tenants stay backlogged under VTC (a weight, w_out or the lift acts only between them)."""
    behind = [t for t, r in ref.items() if r["finished_in_time"] < 0.9]
    served = [t for t in ref if t not in behind]
    share = ", ".join(f"{t} {ref[t]['finished_in_time']:.0%}" for t in ref)
    if len(behind) > 1 or not served:
        return f"Requests finished within the window: {share}."
    return (f"Under this load only {', '.join(behind) or 'no tenant'} stays backlogged (requests finished within "
            f"the window: {share}): VTC gives {' and '.join(served)} all they ask, so a weight, w_out or the lift, "
            "which only decide between backlogged tenants, change nothing for them.")


def _bar_plot(path: Path, labels: Sequence[str], before: Sequence[float], after: Sequence[float], title: str,
              normalise: bool = False) -> None:
    plt = pyplot()
    import numpy as np

    b = np.array(before, dtype=float)
    a = np.array(after, dtype=float)
    if normalise:
        scale = np.where(b != 0, b, 1.0)
        b, a = b / scale, a / scale
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(labels)), 4))
    ax.bar(x - 0.2, b, 0.4, label="before")
    ax.bar(x + 0.2, a, 0.4, label="after")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.legend()
    save_png(fig, path)


# --- abuse: the check matrix as a heat map --------------------------------------------------------

#: The small matrix the abuse study runs when given no check report (quick: fewer setups and patterns).
ABUSE_QUICK = (("fcfs", "round_robin", "vtc", "drr_block_seconds"), ("flood", "few_huge", "slow_decoders", "sybil"))


def abuse_study(quick: bool = False, seed: int = 0, source: Any = None,
                log: Callable[[str], None] = lambda s: None) -> StudyResult:
    """For each policy setup and abusive pattern, the victims' TTFT p99 inflation (their p99
    with the adversary over without it, the worst victim tenant) of the matrix's worst
    workload: read from ``source`` (a ``tenantry check`` report folder or its
    ``matrix.json``), else from a matrix run here (every setup and pattern at 4
    evaluations per cell; quick: :data:`ABUSE_QUICK` at 2).

    Raises:
        ConfigError: ``source`` is not a check report (no readable ``matrix.json``).
    """
    import json

    if source is not None:
        path = Path(source)
        path = path / "matrix.json" if path.is_dir() else path
        try:
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError("--from", str(source), f"not a tenantry check report ({type(e).__name__})") from None
        origin = f"the matrix in {path}"
    else:
        from .check import run_check
        from .search import Budget

        setups, patterns = ABUSE_QUICK if quick else (None, None)
        log("running the matrix (tenantry check, no report)")
        res = run_check(setups=setups, patterns=patterns, seed=seed, budget=Budget(2 if quick else 4),
                        searches=("random",), out=None, extras=False, progress=False, plots="none",
                        spread_seeds=0, shrink_evaluations=0)
        cells = list(res["cells"].values())
        origin = (f"a matrix run here (seed {seed}, random search, {2 if quick else 4} evaluations per cell)")
    grid: dict[tuple[str, str], float] = {}
    for c in cells:
        v = (c.get("metrics") or {}).get("ttft_p99_inflation")
        if v is not None and c.get("pattern") and c.get("setup"):
            grid[(c["setup"], c["pattern"])] = float(v)
    if not grid:
        raise ConfigError("--from", str(source), "the matrix has no cell with a victims' TTFT p99 inflation")
    setups = list(dict.fromkeys(s for s, _ in grid))
    patterns = list(dict.fromkeys(p for _, p in grid))
    table = Table("ttft_p99_inflation", ("setup",) + tuple(patterns), tuple(
        (s,) + tuple(grid.get((s, p), math.nan) for p in patterns) for s in setups))
    worst = Table("worst pattern per setup", ("setup", "worst pattern", "victims' TTFT p99 x", "patterns at >= 10x"),
                  tuple((s, max(patterns, key=lambda p: _num(grid.get((s, p)))),
                         max(_num(grid.get((s, p))) for p in patterns),
                         sum(1 for p in patterns if _num(grid.get((s, p))) >= 10)) for s in setups))
    best = min(setups, key=lambda s: max(_num(grid.get((s, p))) for p in patterns))
    worst_setup = max(setups, key=lambda s: max(_num(grid.get((s, p))) for p in patterns))
    answer = (f"Over {len(setups)} setups and {len(patterns)} patterns, {best} holds the victims' worst TTFT p99 "
              f"to x{max(_num(grid.get((best, p))) for p in patterns):.3g}, {worst_setup} lets it reach "
              f"x{max(_num(grid.get((worst_setup, p))) for p in patterns):.3g}; "
              f"{sum(1 for v in grid.values() if v >= 10)} of {len(grid)} cells inflate it 10x or more.")

    def plot(path: Path) -> None:
        plt = pyplot()
        import numpy as np

        # a cell not run (a fleet setup's pattern outside the fleet patterns) is grey, not the scale's low end
        m = np.array([[math.log10(max(grid[(s, p)], 1e-3)) if grid.get((s, p)) is not None else math.nan
                       for p in patterns] for s in setups])
        fig, ax = plt.subplots(figsize=(3.0 + 0.8 * len(patterns), 2.0 + 0.4 * len(setups)))
        cmap = plt.get_cmap("magma_r").with_extremes(bad="lightgrey")
        im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, aspect="auto", vmin=min(0.0, float(np.nanmin(m))))
        ax.set_xticks(range(len(patterns)), patterns, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(setups)), setups, fontsize=7)
        for i, s in enumerate(setups):
            for j, p in enumerate(patterns):
                v = grid.get((s, p))
                ax.text(j, i, "-" if v is None else (f"{v:.0f}" if v >= 10 else f"{v:.2g}"), ha="center",
                        va="center", fontsize=6,
                        color="white" if v is not None and m[i, j] > 1 else "black")
        fig.colorbar(im, ax=ax).set_label("log10 of the victims' TTFT p99 inflation", fontsize=7)
        ax.set_title("what each pattern does to the other tenants' TTFT p99", fontsize=9)
        save_png(fig, path)

    return StudyResult("abuse", ABUSE_QUESTION, answer, worst, (table,), (("heatmap", plot),),
                       (f"source: {origin}; a cell's value is its worst workload's victims' TTFT p99 with the "
                        "adversary over the same victims without it (the worst victim tenant)",))


ABUSE_QUESTION = "For each policy, what does each abusive pattern do to the other tenants' TTFT p99?"


def _num(v: float | None) -> float:
    return -math.inf if v is None or math.isnan(v) else v


THRASH_QUESTION = ("Does eviction thrash show up without an adversary? Evictions per sequence, wasted prefill and "
                   "goodput under realistic load, with and without hysteresis, against the eviction_thrash pattern.")
COST_QUESTION = ("Is block-seconds accounting cheap enough at step rate? The host cost per decision and per step of "
                 "FCFS, VTC, DRR over tokens and DRR over block-seconds at 10 to 10,000 tenants and 16 to 512 "
                 "running sequences, beside a decode step.")
BATCH_QUESTION = ("Which max_num_seqs and token budget serve the most tenants within their SLO, and is that the "
                  "batch of the most throughput?")


def _load(name: str) -> Callable[..., StudyResult]:
    """A study of :mod:`tenantry.adversaries.studies_load`, imported when it runs."""
    def run(**kw: Any) -> StudyResult:
        from . import studies_load

        return getattr(studies_load, name)(**kw)
    return run


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("seed-001", SEED001_QUESTION, seed001_study),
    Study("abuse", ABUSE_QUESTION, abuse_study),
    Study("thrash", THRASH_QUESTION, _load("thrash_study")),
    Study("accounting-cost", COST_QUESTION, _load("accounting_cost_study")),
    Study("batch-size", BATCH_QUESTION, _load("batch_size_study")),
)}


def get_study(name: str) -> Study:
    """The study called ``name``.

    Raises:
        ConfigError: an unknown name, listing the known ones.
    """
    try:
        return STUDIES[name]
    except KeyError:
        raise ConfigError("study", name, f"unknown study; choose from {', '.join(STUDIES)}") from None


def write_study(result: StudyResult, folder: Path, *, command: str) -> list[str]:
    """Write ``report.md``, one CSV per table (``<name>.csv``) and one PNG per plot into
    ``folder``; returns the file names written.  CSV and Markdown are deterministic."""
    import csv
    import io

    from tenantry.model.files import atomic_write_text

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


__all__: Iterable[str] = ("Table", "StudyResult", "Study", "STUDIES", "get_study", "write_study",
                          "seed001_study", "abuse_study")
