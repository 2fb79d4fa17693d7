"""The studies that load a replica: thrash, accounting-cost and batch-size (``tenantry study``;
the registry: :mod:`tenantry.studies`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs

from tenantry.model.config import Config, ConfigError
from tenantry.model.workload import Workload
from tenantry.runner.setups import apply_setup
from tenantry.runner.simulate import simulate
from tenantry.runner.traces import seed001_workload

from .report import StudyResult, Table, pyplot, save_png

THRASH_QUESTION = ("Does eviction thrash show up without an adversary? Evictions per sequence, wasted prefill and "
                   "goodput under realistic load, with and without hysteresis, against the eviction_thrash pattern.")
COST_QUESTION = ("Is block-seconds accounting cheap enough at step rate? The host cost per decision and per step of "
                 "FCFS, VTC, DRR over tokens and DRR over block-seconds at 10 to 10,000 tenants and 16 to 512 "
                 "running sequences, beside a decode step.")
BATCH_QUESTION = ("Which max_num_seqs and token budget serve the most tenants within their SLO, and is that the "
                  "batch of the most throughput?")




# --- thrash: evictions under realistic load, against the eviction_thrash pattern ----------------------

#: Load factors (arrival-time speedups) of the thrash study; quick: fewer, and shorter traces.
THRASH_LOADS, THRASH_LOADS_QUICK = (1.0, 2.0, 4.0), (1.0, 4.0)
#: Rows read per trace file (a full Azure hour is 28,000 requests; the first 3,000 of each file keep
#: the study to a few minutes on 2 cores).
THRASH_ROWS = 3000


def _thrash_replicas(tenants: Sequence[str]) -> dict[str, Config]:
    """The two replicas of the thrash study: the default one (70B on 8 H100s, SPEC 4.7) and the
    check matrix's small one (its pool, batch and context limits)."""
    from tenantry.runner.setups import build_config, default_config

    small = build_config("no_hysteresis", [("adv", "adversary"), ("victim", "victim")])
    base = default_config(tenants)
    return {"default": base, "small": attrs.evolve(base, num_blocks=small.num_blocks, max_num_seqs=small.max_num_seqs,
                                                    token_budget=small.token_budget,
                                                    max_context_tokens=small.max_context_tokens)}


def thrash_study(quick: bool = False, seed: int = 0, source: Any = None,
                 log: Callable[[str], None] = lambda s: None) -> StudyResult:
    """Evictions per sequence, wasted prefill and goodput with and without eviction
    hysteresis (setups ``no_hysteresis`` and ``hysteresis``) under realistic load:
    the Azure 2023 pair (../shared/traces when present, else the packaged excerpts),
    Mooncake's conversation trace (when ../shared/traces has it) and a BurstGPT file
    (``source``, tenants by model), the first :data:`THRASH_ROWS` rows of each file, at rising load factors (arrival times divided
    by the factor) on the default replica and on the check matrix's small one; and
    the ``eviction_thrash`` pattern's worst workload from a small matrix run
    (``seed``).  Goodput: prompt + output tokens of the requests finished within the
    trace's window, per second of it.

    Raises:
        ConfigError: a ``source`` that is not a BurstGPT CSV.
    """
    from tenantry.runner.traces import _SHARED, azure_two_tenant_workload, read_burstgpt_csv, read_mooncake_jsonl

    from tenantry.adversaries.objectives import eviction_stats

    loads = THRASH_LOADS_QUICK if quick else THRASH_LOADS
    rows_cap = 400 if quick else THRASH_ROWS
    traces: list[tuple[str, Workload]] = [("azure", azure_two_tenant_workload(max_rows=rows_cap))]
    mc = _SHARED / "mooncake_fast25_conversation.jsonl"
    if mc.exists() and not quick:
        traces.append(("mooncake", Workload(read_mooncake_jsonl(mc, "mooncake", max_rows=rows_cap))))
    if source is not None:
        traces.append(("burstgpt", Workload(read_burstgpt_csv(source, max_rows=rows_cap))))
    rows = []
    for trace, wl0 in traces:
        for load in loads:
            from tenantry.runner.traces import TracePart, compose

            wl = compose([TracePart(wl0.requests, speedup=load)]) if load != 1.0 else wl0
            window = max(wl.duration_s, 1.0)
            for replica, base in _thrash_replicas(wl.tenants).items():
                for setup in ("no_hysteresis", "hysteresis"):
                    log(f"{trace} x{load:g} on the {replica} replica, {setup}")
                    h = simulate(apply_setup(base, setup), wl, horizon_s=3 * window, record_steps=False)
                    most, mean, wasted = eviction_stats(h)
                    done = [r for r in h.requests if r.outcome == "finished" and r.finish_s is not None
                            and r.finish_s <= window]
                    rows.append((trace, load, replica, setup, len(wl), mean, most, wasted,
                                 sum(1 for r in h.requests if r.outcome == "rejected"),
                                 len(done) / len(wl), sum(r.prompt_tokens + r.output_tokens for r in done) / window))
    from tenantry.adversaries.check import run_check
    from tenantry.adversaries.search import Budget

    log("eviction_thrash pattern (a small matrix run)")
    res = run_check(setups=("no_hysteresis", "hysteresis"), patterns=("eviction_thrash",), seed=seed,
                    budget=Budget(2 if quick else 6), searches=("random",), out=None, extras=False, progress=False,
                    plots="none", spread_seeds=0, shrink_evaluations=0)
    adv = []
    for (setup, _), c in sorted(res["cells"].items()):
        m = c["metrics"]
        adv.append(("eviction_thrash", setup, m["evictions_per_seq"], m["max_evictions"], m["wasted_prefill_tokens"],
                    m["goodput"], m["goodput_loss"]))
    table = Table("realistic load", ("trace", "load x", "replica", "setup", "requests", "evictions/seq",
                                     "most evictions", "wasted prefill [tokens]", "429s", "finished in window",
                                     "goodput [tokens/s]"), tuple(rows))
    pattern = Table("against the eviction_thrash pattern", ("pattern", "setup", "evictions/seq", "most evictions",
                                                            "wasted prefill [tokens]", "victims' goodput [req/s]",
                                                            "goodput loss"), tuple(adv))
    worst = max((r for r in rows if r[3] == "no_hysteresis"), key=lambda r: r[5])
    calm = [r for r in rows if r[2] == "default" and r[3] == "no_hysteresis"]
    hyst = next(r for r in rows if r[:3] == worst[:3] and r[3] == "hysteresis")
    adv_no = next((a for a in adv if a[1] == "no_hysteresis"), None)
    answer = (f"Yes, without any adversary once the pool is small for the load: {worst[0]} at x{worst[1]:g} on the "
              f"{worst[2]} replica evicts each sequence {worst[5]:.2f} times on average (at most {worst[6]}) and "
              f"wastes {worst[7]:,} prefill tokens without hysteresis"
              + (f", more than the eviction_thrash pattern's {adv_no[2]:.2f} per sequence" if adv_no and
                 adv_no[2] < worst[5] else (f" (the eviction_thrash pattern: {adv_no[2]:.2f})" if adv_no else ""))
              + f"; hysteresis bounds it to {hyst[6]} evictions at the price of {hyst[8]:,} refusals "
              f"(finished in the window {worst[9]:.0%} -> {hyst[9]:.0%}). On the default replica the most "
              f"evictions per sequence at any load is {max((r[5] for r in calm), default=0):.2f}.")

    def plot(path: Path) -> None:
        plt = pyplot()

        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        for ax, replica in zip(axes, ("small", "default")):
            for trace in dict.fromkeys(r[0] for r in rows):
                for setup, style in (("no_hysteresis", "-o"), ("hysteresis", "--s")):
                    pts = [(r[1], r[5]) for r in rows if r[0] == trace and r[2] == replica and r[3] == setup]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{trace}, {setup}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("load factor (arrival speedup)")
            ax.set_ylabel("evictions per sequence")
            ax.set_title(f"{replica} replica", fontsize=9)
        for a in adv:
            axes[0].axhline(a[2], color="grey", lw=0.8, ls=":")
        axes[0].legend(fontsize=6)
        save_png(fig, path)

    return StudyResult("thrash", THRASH_QUESTION, answer, table, (pattern,), (("evictions", plot),), (
        "replicas: default = 70B on 8 H100s (SPEC 4.7); small = the check matrix's (its pool, batch and context); "
        "setups no_hysteresis (evict the newest, no hysteresis) and hysteresis (min 4 blocks freed, 4-step "
        "cooldown, reject after 3)",
        "traces: " + ", ".join(f"{t} ({len(w)} requests)" for t, w in traces) + f"; load factors {loads}"
        + ("; Mooncake is used when ../shared/traces holds it (not in a quick run)" if quick or not mc.exists()
           else ""),
        "the grey lines in the left plot: the eviction_thrash pattern's evictions per sequence (matrix run, "
        f"seed {seed})"))




# --- accounting-cost: the host cost of each policy's bookkeeping at step rate ---------------------

#: Policies, tenant counts and running sequences of the accounting-cost study (quick: a corner of it).
COST_POLICIES = ("fcfs", "vtc", "drr_tokens", "drr_block_seconds")
COST_TENANTS, COST_TENANTS_QUICK = (10, 100, 1000, 10_000), (10, 1000)
COST_RUNNING, COST_RUNNING_QUICK = (16, 128, 512), (16, 128)
#: Context tokens per running sequence when the decode step's duration is taken from the roofline.
COST_CONTEXT_TOKENS = 2048


def saturated_state(n_tenants: int, policy: str, max_num_seqs: int = 256, warm_steps: int = 30):
    """A replica (config, state) with every tenant backlogged and ``max_num_seqs`` sequences
    decoding, after ``warm_steps`` steps: tenants of weights 1-3 in two tiers, a 200,000-block
    pool, a 2,048-token budget, unit step cost (the benchmarks' replica too)."""
    from tenantry.model.config import CostConfig, OrderConfig, TenantConfig
    from tenantry.model.state import initial_state
    from tenantry.model.step import step
    from tenantry.model.workload import Request, StepInput

    tenants = [TenantConfig(f"t{i}", weight=1.0 + (i % 3), tier=i % 2) for i in range(n_tenants)]
    order = OrderConfig(policy=policy, drr_quantum=2.0 if policy == "drr_block_seconds" else 512.0)
    cfg = Config(tenants=tenants, num_blocks=200_000, max_num_seqs=max_num_seqs, token_budget=2048,
                 order=order, cost=CostConfig(mode="unit"))
    per = max(2, (2 * max_num_seqs) // n_tenants + 1)
    reqs = [Request(i * per + j, f"t{i}", 0.0, 64 + (i * 7 + j) % 64, 4000) for i in range(n_tenants) for j in range(per)]
    st = initial_state(cfg)
    st, _ = step(cfg, st, StepInput(arrivals=reqs))
    for _ in range(warm_steps):
        st, _ = step(cfg, st)
    return cfg, st


def in_step_decision_us(cfg: Config, st: Any, repeats: int = 5, warm: bool = False) -> tuple[float, int]:
    """Microseconds per admitted request of the waiting phase of one step whose batch starts
    empty (the order policy's decisions inside a step), best of ``repeats``, and the requests
    admitted per step.  ``warm``: the step after one that filled the emptied batch, as every
    step of a steady run but the first."""
    import time

    from tenantry.model.step import Step, step

    st = attrs.evolve(st, running=(), kv=attrs.evolve(st.kv, used_blocks=0),
                      tenants=tuple(t._replace(running=0, blocks=0) for t in st.tenants))
    best, admitted = math.inf, 0
    for _ in range(repeats):
        s = Step(cfg, step(cfg, st)[0] if warm else st)
        t0 = time.perf_counter()
        s.schedule_waiting()
        best = min(best, time.perf_counter() - t0)
        admitted = len(s.planned)
    return best / max(admitted, 1) * 1e6, admitted


def warm_decision_us(cfg: Config, st: Any, repeats: int = 5) -> tuple[float, int]:
    """:func:`in_step_decision_us` with ``warm=True``."""
    return in_step_decision_us(cfg, st, repeats, warm=True)


def step_us(cfg: Config, st: Any, steps: int, repeats: int = 3) -> float:
    """Microseconds per :func:`~tenantry.model.step.step` on a saturated replica, best of ``repeats``."""
    import time

    from tenantry.model.step import step

    best = math.inf
    for _ in range(repeats):
        s = st
        t0 = time.perf_counter()
        for _ in range(steps):
            s, _ = step(cfg, s)
        best = min(best, (time.perf_counter() - t0) / steps)
    return best * 1e6


def accounting_cost_study(quick: bool = False, seed: int = 0, source: Any = None,
                          log: Callable[[str], None] = lambda s: None) -> StudyResult:
    """Host cost per scheduling decision and per step of FCFS, VTC, DRR over tokens and DRR
    over block-seconds at 10 to 10,000 tenants and 16 to 512 running sequences
    (:func:`saturated_state`, :func:`in_step_decision_us`, :func:`step_us`: wall-clock
    microseconds, best of 3; the counts are deterministic, the times are measurements of
    this machine), beside the decode step they would run with: the model's roofline
    duration (SPEC.md 4.7, 70B on 8 H100s) of a decode step of that many sequences of
    :data:`COST_CONTEXT_TOKENS` context tokens each.

    Raises:
        ConfigError: a ``source`` (the study reads no file).
    """
    from tenantry.model.policies import step_duration_s
    from tenantry.runner.setups import default_config

    if source is not None:
        raise ConfigError("--from", str(source), "the accounting-cost study reads no file")
    tenants_grid = COST_TENANTS_QUICK if quick else COST_TENANTS
    running_grid = COST_RUNNING_QUICK if quick else COST_RUNNING
    roof = default_config(("t",))
    rows = []
    for running in running_grid:
        decode_ms = step_duration_s(roof, running, running * COST_CONTEXT_TOKENS) * 1e3
        for n in tenants_grid:
            for policy in COST_POLICIES:
                log(f"{policy}, {n} tenants, {running} running")
                cfg, st = saturated_state(n, policy, max_num_seqs=running, warm_steps=10 if quick else 30)
                dec, picks = in_step_decision_us(cfg, st)
                stp = step_us(cfg, st, 10 if quick else 30)
                rows.append((policy, n, running, dec, picks, stp, decode_ms, stp / 1e3 / decode_ms))
    table = Table("cost", ("policy", "tenants", "running", "decision [us]", "picks per step", "step [us]",
                           "decode step [ms]", "step / decode step"), tuple(rows))
    top_n, top_r = max(tenants_grid), max(running_grid)
    head = Table("at the largest size", table.columns,
                 tuple(r for r in rows if r[1] == top_n and r[2] == top_r))
    bs = next(r for r in head.rows if r[0] == "drr_block_seconds")
    fc = next(r for r in head.rows if r[0] == "fcfs")
    worst = max(rows, key=lambda r: r[7])
    answer = (("Yes" if worst[7] < 0.1 else "Not everywhere") + f": at {top_n:,} tenants and {top_r} running sequences a step with DRR over block-seconds costs "
              f"{bs[5]:,.0f} us on this host ({bs[7]:.1%} of the {bs[6]:.1f} ms decode step the roofline gives; "
              f"FCFS {fc[5]:,.0f} us) and a decision inside it {bs[3]:.0f} us; the worst case measured is "
              f"{worst[0]} at {worst[1]:,} tenants and {worst[2]} running, {worst[7]:.1%} of its decode step.")

    def plot(path: Path) -> None:
        plt = pyplot()

        fig, axes = plt.subplots(1, len(running_grid), figsize=(3.2 * len(running_grid), 3.2), sharey=True)
        for ax, running in zip(axes, running_grid):
            for policy in COST_POLICIES:
                pts = [(r[1], r[5]) for r in rows if r[0] == policy and r[2] == running]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", label=policy, ms=3)
            ax.axhline(next(r[6] for r in rows if r[2] == running) * 1e3, color="grey", ls=":", label="decode step")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("tenants")
            ax.set_title(f"{running} running", fontsize=9)
        axes[0].set_ylabel("host us per step")
        axes[0].legend(fontsize=6)
        save_png(fig, path)

    return StudyResult("accounting-cost", COST_QUESTION, answer, head, (table,), (("cost", plot),), (
        "host: wall-clock microseconds on this machine, best of 3 (not deterministic: the counts are); the "
        "replica: every tenant backlogged, the batch full of decoding sequences, unit step cost",
        f"decode step: the model's roofline (SPEC.md 4.7: max(weight read + KV read, compute) + overhead, "
        f"Williams et al., CACM 2009) for a 70B model on 8 H100s with that many sequences of "
        f"{COST_CONTEXT_TOKENS} context tokens: the 10-30 ms the question names",))




# --- batch-size: the batch that serves the most tenants within their SLO, against throughput ------------

#: max_num_seqs values, token budgets and policies of the batch-size study (quick: fewer).
BATCH_SEQS, BATCH_SEQS_QUICK = (4, 16, 64, 256), (4, 16, 64)
BATCH_BUDGETS, BATCH_BUDGETS_QUICK = (2048, 8192), (2048,)
BATCH_POLICIES, BATCH_POLICIES_QUICK = ("fcfs", "vtc", "drr_tokens"), ("fcfs", "vtc")
#: Default service-level targets (seconds) of a tenant without its own: TTFT p99, TPOT p99 (an
#: interactive service's 3 s to the first token and 10 tokens per second after it).
BATCH_SLO = (3.0, 0.1)
#: The replica of the batch-size study: the default model on a quarter of its pool, so the
#: batch size decides (with the whole pool and short traces every batch size serves everyone).
BATCH_POOL_BLOCKS = 8_192
#: Rows read per trace file by the batch-size study (its grid runs each workload 24 times).
BATCH_ROWS = 1500


def batch_size_study(quick: bool = False, seed: int = 9, source: Any = None,
                     log: Callable[[str], None] = lambda s: None) -> StudyResult:
    """For each workload and policy, the ``max_num_seqs`` and token budget that serve the most
    tenants within their SLO (:func:`~tenantry.adversaries.objectives.outside_slo`: TTFT p99
    and TPOT p99 within each tenant's ``slo_ttft_s`` / ``slo_tpot_s``, default
    :data:`BATCH_SLO`), against those that maximise throughput (prompt + output tokens of
    requests finished within the trace's window, per second).  Workloads: seed 001's three
    tenants (``seed``, 150 s), the Azure 2023 pair and Mooncake's conversation trace at half
    its rate split into 4 tenants by request id (the first :data:`BATCH_ROWS` rows of each file) (when ../shared/traces has it; not in a quick
    run).  The replica: the default (SPEC.md 4.7) with a :data:`BATCH_POOL_BLOCKS`-block pool.
    Ties go to the more throughput, then the smaller batch.  A ``source`` TOML replaces the replica (its tenants'
    SLO targets are used for tenants of the same name).

    Raises:
        ConfigError: a bad ``source`` configuration (naming the field).
    """
    from tenantry.runner.setups import default_config, load_config_toml
    from tenantry.runner.traces import _SHARED, TracePart, azure_two_tenant_workload, compose, read_mooncake_jsonl

    from tenantry.adversaries.objectives import outside_slo

    seqs = BATCH_SEQS_QUICK if quick else BATCH_SEQS
    budgets = BATCH_BUDGETS_QUICK if quick else BATCH_BUDGETS
    policies = BATCH_POLICIES_QUICK if quick else BATCH_POLICIES
    given = load_config_toml(source) if source is not None else None
    traces: list[tuple[str, Workload]] = [
        ("seed-001", seed001_workload(seed=seed, duration_s=60.0 if quick else 150.0)),
        ("azure", azure_two_tenant_workload(max_rows=400 if quick else BATCH_ROWS))]
    mc = _SHARED / "mooncake_fast25_conversation.jsonl"
    if mc.exists() and not quick:
        reqs = read_mooncake_jsonl(mc, "mooncake", max_rows=BATCH_ROWS)
        traces.append(("mooncake x0.5", compose([TracePart(tuple(attrs.evolve(r, tenant=f"mc{r.request_id % 4}")
                                                                 for r in reqs), speedup=0.5)])))
    rows, best = [], []
    for trace, wl in traces:
        window = max(wl.duration_s, 1.0)
        if given is not None:
            from tenantry.runner.setups import config_with_tenants

            base = config_with_tenants(given, wl.tenants)
        else:
            base = attrs.evolve(default_config(wl.tenants), num_blocks=BATCH_POOL_BLOCKS)
        targets = {t.name: (t.slo_ttft_s if t.slo_ttft_s is not None else BATCH_SLO[0],
                            t.slo_tpot_s if t.slo_tpot_s is not None else BATCH_SLO[1]) for t in base.tenants}
        for policy in policies:
            cells = []
            for budget in budgets:
                for n in seqs:
                    log(f"{trace}, {policy}, max_num_seqs {n}, token budget {budget}")
                    cfg = attrs.evolve(apply_setup(base, policy), max_num_seqs=n, token_budget=budget)
                    h = simulate(cfg, wl, horizon_s=3 * window, record_steps=False)
                    missed = outside_slo(h, targets)
                    done = [r for r in h.requests if r.outcome == "finished" and r.finish_s is not None
                            and r.finish_s <= window]
                    tput = sum(r.prompt_tokens + r.output_tokens for r in done) / window
                    cell = (trace, policy, n, budget, len(targets) - len(missed), len(targets), tput,
                            " ".join(missed) or "-")
                    rows.append(cell)
                    cells.append(cell)
            by_slo = max(cells, key=lambda c: (c[4], c[6], -c[2], -c[3]))  # ties: the more throughput
            by_tput = max(cells, key=lambda c: (c[6], -c[2], -c[3]))
            best.append((trace, policy, f"{by_slo[2]} / {by_slo[3]}", f"{by_slo[4]} of {by_slo[5]}", by_slo[6],
                         f"{by_tput[2]} / {by_tput[3]}", f"{by_tput[4]} of {by_tput[5]}", by_tput[6]))
    headline = Table("best batch per workload and policy", (
        "workload", "policy", "most within SLO: seqs / budget", "tenants within SLO", "its tokens/s",
        "most throughput: seqs / budget", "tenants within SLO", "its tokens/s"), tuple(best))
    table = Table("grid", ("workload", "policy", "max_num_seqs", "token budget", "tenants within SLO", "tenants",
                           "tokens/s", "outside SLO"), tuple(rows))
    differ = [b for b in best if b[2] != b[5]]
    answer = (f"In {len(differ)} of {len(best)} workload-policy pairs the batch that serves the most tenants within "
              "their SLO is not the one of the most throughput"
              + (": " + "; ".join(f"{b[0]} under {b[1]}: {b[2]} ({b[3]} within SLO, {b[4]:,.0f} tokens/s) against "
                                  f"{b[5]} ({b[6]}, {b[7]:,.0f} tokens/s)" for b in differ[:3]) if differ else "")
              + ".")

    def plot(path: Path) -> None:
        plt = pyplot()

        names = list(dict.fromkeys(r[0] for r in rows))
        fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2))
        axes = axes if len(names) > 1 else [axes]
        budget = budgets[len(budgets) // 2]
        for ax, trace in zip(axes, names):
            for policy in policies:
                pts = [r for r in rows if r[0] == trace and r[1] == policy and r[3] == budget]
                ax.plot([r[2] for r in pts], [r[6] for r in pts], "-o", ms=3, label=f"{policy}: tokens/s")
                for r in pts:
                    ax.annotate(str(r[4]), (r[2], r[6]), fontsize=6, xytext=(2, 2), textcoords="offset points")
            ax.set_xscale("log", base=2)
            ax.set_xlabel(f"max_num_seqs (token budget {budget})")
            ax.set_title(f"{trace} (labels: tenants within SLO)", fontsize=8)
        axes[0].set_ylabel("tokens/s finished in the window")
        axes[0].legend(fontsize=6)
        save_png(fig, path)

    return StudyResult("batch-size", BATCH_QUESTION, answer, headline, (table,), (("batch", plot),), (
        f"replica: {'the configuration in ' + str(source) if source else 'the default (SPEC 4.7) with a pool of '}"
        f"{'' if source else f'{BATCH_POOL_BLOCKS:,} blocks'}; max_num_seqs {seqs}; token budgets {budgets}; "
        f"policies {policies}",
        f"SLO: TTFT p99 <= {BATCH_SLO[0]} s and TPOT p99 <= {BATCH_SLO[1]} s unless the tenant's slo_ttft_s / "
        "slo_tpot_s say otherwise; a tenant with a refused request is outside its SLO",
        "workloads: " + ", ".join(f"{t} ({len(w)} requests, {len(w.tenants)} tenants)" for t, w in traces)))
