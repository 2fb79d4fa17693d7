"""The abuse study: what each abusive pattern does to the other tenants' TTFT p99, per policy, as a
heat map (``tenantry study abuse``), from a ``tenantry check`` matrix (its ``matrix.json``) or from
a small matrix run here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from tenantry.model.config import ConfigError

from .report import StudyResult, Table, pyplot, save_png


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
        from tenantry.adversaries.check import run_check
        from tenantry.adversaries.search import Budget

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
