"""The seed-001 study: the lesson's "Try it" experiments on its own workload (``tenantry study seed-001``).

Seed 001's three tenants, 300 s (quick: 100 s), each experiment against VTC as
the lesson runs it: the chat tenant at weight 2, a queue bound of 50,
``w_out = 1``, a token-rate limit of 20,000 weighted tokens per second instead
of the request rate limit, and the chat tenant idle for the first half then
active, with and without the counter lift; the three that need contention again
on a contended variant.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs

from tenantry.model.config import Config, ConfigError
from tenantry.model.workload import Workload
from tenantry.runner.setups import apply_setup, seed001_config
from tenantry.runner.simulate import simulate, tenant_table
from tenantry.runner.traces import seed001_workload

from .report import StudyResult, Table, cell_text, pyplot, save_png


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
    :func:`~tenantry.runner.setups.seed001_config`) and the changed one; the rows are
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
                  f"{r[0]} ({r[1]} {cell_text(r[2])} -> {cell_text(r[3])})" for r in rows if r[-1] != "yes"))
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
