"""``tenantry replay URL``: send a workload to a running OpenAI-compatible server as it
arrives, record what came back as a tenantry history, and print per-tenant TTFT, TPOT and
goodput (SPEC.md 12.2).

The workload: a file or trace (the options of ``tenantry simulate``; a matrix cell's file
brings its pattern, adversaries and victims from the cell.json beside it), or
``--pattern NAME``, the pattern's default scenario (its adversary and the default victims).
With a pattern or a cell, the victims are also replayed alone (the baseline) and the
pattern's objective and every metric a client can measure are printed.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from tenantry.model.config import ConfigError

from .args import Names, budget, non_negative_int, positive_float, positive_int

HELP = "Replay a workload against an OpenAI-compatible server and record what it did as a history."
#: --matrix's default report folder, and its model evaluations per pattern with --searched-on.
MATRIX_OUT, MATRIX_BUDGET = "replay-matrix", 16


def vocab(text: str) -> tuple[int, int]:
    """``--vocab LO:HI``: token ids drawn from [LO, HI)."""
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write LO:HI, e.g. 100:1000") from None
    if not sep or a < 0 or b - a < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: write LO:HI with 0 <= LO and HI >= LO + 2")
    return a, b


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:8000 (the only address contacted)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", type=Path, help="workload in the project's JSON Lines format (a matrix cell's "
                     "file brings its pattern and roles from the cell.json beside it)")
    src.add_argument("--azure", nargs="+", metavar="FILE[:TENANT]", help="Azure LLM 2023 CSV files, one tenant each")
    src.add_argument("--mooncake", nargs="+", metavar="FILE[:TENANT]", help="Mooncake JSON Lines files, one tenant each")
    src.add_argument("--azure-pair", action="store_true", help="the Azure code and conv traces as two tenants")
    src.add_argument("--burstgpt", type=Path, metavar="FILE", help="a BurstGPT CSV trace")
    src.add_argument("--pattern", default=None, help="an adversary pattern's default scenario (its adversary and the "
                     "default victims; tenantry check --list names them)")
    p.add_argument("--burstgpt-tenant", choices=("model", "log_type", "session"), default="model",
                   help="the BurstGPT column that names the tenant (default model)")
    p.add_argument("--burstgpt-failed", choices=("drop", "keep"), default="drop",
                   help="BurstGPT requests with 0 response tokens: drop (default) or keep with one output token")
    p.add_argument("--speedup", type=positive_float, default=None, help="divide trace arrival times by this (traces only)")
    p.add_argument("--max-rows", type=positive_int, default=None, help="read at most this many rows per trace")
    p.add_argument("--seed", type=non_negative_int, default=None, help="the victims' seed of --pattern (default 0)")
    p.add_argument("--config", type=Path, help="the server's configuration as far as the client needs it (TOML): "
                   "tiers (--priority), a salted prefix cache (cache_salt), block size, costs and SLOs")
    p.add_argument("--policy", default=None, help="a built-in setup standing for the server's configuration instead")
    p.add_argument("--time-scale", type=positive_float, default=1.0,
                   help="workload seconds per wall second (default 1; 4 sends four times as fast)")
    p.add_argument("--max-in-flight", type=positive_int, default=256, help="most requests open at once (default 256)")
    p.add_argument("--timeout-s", type=positive_float, default=60.0,
                   help="wall seconds to wait for the answer, the first or the next token of a request before "
                        "giving it up as timed out (default 60)")
    p.add_argument("--horizon", type=positive_float, default=None,
                   help="workload seconds: disconnect what is still open then (default: a pattern's horizon, else "
                        "until every request ended)")
    p.add_argument("--window", type=positive_float, default=None,
                   help="the table's 'finished in time' and throughput window (default: the last arrival)")
    p.add_argument("--model", default=None, help="the model field (default: the first model /v1/models lists)")
    p.add_argument("--tenant-header", default=None, metavar="NAME", help="also send the tenant in this header")
    p.add_argument("--no-fairness-header", action="store_true",
                   help="do not send the x-gateway-inference-fairness-id header")
    p.add_argument("--priority", action="store_true",
                   help="send priority = the tenant's tier (from --config / --policy; vLLM: --scheduling-policy priority)")
    p.add_argument("--cache-salt", choices=("config", "tenant", "off"), default="config",
                   help="send cache_salt per tenant: when the configuration's prefix cache is salted (config, "
                        "the default), always (tenant), never (off)")
    p.add_argument("--block-size", type=positive_int, default=None,
                   help="the server's KV block size in tokens (default: the configuration's, 16)")
    p.add_argument("--vocab", type=vocab, default=None, metavar="LO:HI", help="token-id range (default 100:1000)")
    p.add_argument("--prompt-seed", type=non_negative_int, default=0,
                   help="seed of the prompts' unique tokens (a fresh one finds nothing of an earlier replay cached)")
    p.add_argument("--no-token-times", action="store_true", help="do not keep each token's time in the history")
    p.add_argument("--no-baseline", action="store_true",
                   help="with a pattern or a cell: skip the victims-alone run (no objective is printed)")
    p.add_argument("--history", type=Path, default=None, help="write the recorded history to exactly PATH "
                   "(an existing file is replaced only when it is a tenantry history)")
    p.add_argument("--plots", type=Path, default=None, metavar="DIR",
                   help="with a pattern or a cell: the victims' TTFT CDF plot (as tenantry check draws) in DIR")
    m = p.add_argument_group("the abuse matrix of the server (--matrix)")
    m.add_argument("--matrix", action="store_true",
                   help="run the adversary patterns one after the other against the URL (each with the victims "
                        "alone for the baseline) and print the victims' hurt per pattern, with a report folder")
    m.add_argument("--patterns", nargs="+", action=Names, default=None, metavar="NAME",
                   help="--matrix: these patterns (default: every pattern whose objective a client measures)")
    m.add_argument("--searched-on", default=None, metavar="SETUP",
                   help="--matrix: search each pattern's workload on this model setup first (tenantry check's "
                        "searches, --budget), then replay the worst one found (default: each pattern's default)")
    m.add_argument("--budget", type=budget, default=None,
                   help=f"--matrix --searched-on: evaluations on the model per pattern (default {MATRIX_BUDGET})")
    m.add_argument("--workers", type=positive_int, default=None,
                   help="--matrix --searched-on: processes for the searches on the model (default: CPU count)")
    m.add_argument("--out", default=None, metavar="DIR",
                   help=f"--matrix: report folder (default {MATRIX_OUT}; replaced only when it is such a report)")
    m.add_argument("--resume", action="store_true", help="--matrix: finish the interrupted run of --out")


def _source(args: argparse.Namespace):
    """(workload, scenario or None, base config or None, label) of the flags."""
    from tenantry.adversaries.patterns import ADVERSARY, get_pattern, limits_of, make_scenario
    from tenantry.adversaries.victims import DEFAULT_VICTIMS
    from tenantry.live.scoring import cell_beside, cell_scenario
    from tenantry.runner.setups import apply_setup, build_config, get_setup, load_config_toml
    from .simulate import TRACE_OPTIONS, load_workload

    base = load_config_toml(args.config) if args.config else None
    if args.policy:
        get_setup(args.policy)
    if args.pattern:
        for flag, v in (("--speedup", args.speedup), ("--max-rows", args.max_rows)):
            if v is not None:
                raise ConfigError(flag, v, "applies to trace files, not --pattern")
        pat = get_pattern(args.pattern)
        roles = ((ADVERSARY, "adversary"),) + tuple((v.name, "victim") for v in DEFAULT_VICTIMS)
        limits = None
        if pat.uses_limits:
            cfg = apply_setup(base, args.policy) if base and args.policy else base or build_config(
                args.policy or "fcfs", roles)
            limits = limits_of(cfg, ADVERSARY)
        sc = make_scenario(args.pattern, None, args.seed or 0, limits=limits)
        return sc.workload, sc, base, f"pattern {args.pattern}"
    if not (args.workload or any(getattr(args, o) for o in TRACE_OPTIONS)):
        raise ConfigError("workload", None, "give one: --workload FILE, a trace (--azure, --mooncake, --azure-pair, "
                          "--burstgpt) or --pattern NAME")
    if args.seed is not None:
        raise ConfigError("--seed", args.seed, "seeds the victims of --pattern; a file is replayed as written")
    args.seed = None
    wl = load_workload(args, (base.block_size_tokens if base else 16))
    if not len(wl):
        raise ConfigError("workload", 0, "no requests to replay")
    cell = cell_beside(args.workload) if args.workload else None
    sc = cell_scenario(wl, cell, args.workload) if cell else None
    return wl, sc, base, str(args.workload or "the trace") + (f" (cell {cell['setup']} / {cell['pattern']})"
                                                              if cell else "")


def _config(args: argparse.Namespace, base, names):
    """The configuration the client reads (tiers, salts, block size, costs, SLOs)."""
    from tenantry.adversaries.patterns import ADVERSARY
    from tenantry.live.scoring import config_for
    from tenantry.runner.setups import apply_setup, build_config

    if args.policy and base is None:
        return build_config(args.policy, [(n, "adversary" if n == ADVERSARY else "victim") for n in names])
    if args.policy:
        base = apply_setup(base, args.policy)
    return config_for(base, [(n, "victim") for n in names])


def _wire(args: argparse.Namespace, config, model: str):
    from tenantry.live.wire import DEFAULT_VOCAB, WireOptions

    lo, hi = args.vocab or DEFAULT_VOCAB
    salted = args.cache_salt == "tenant" or (args.cache_salt == "config" and config.prefix_cache == "salted")
    return WireOptions(
        model=model, block_size_tokens=args.block_size or config.block_size_tokens, vocab_lo=lo, vocab_hi=hi,
        tenant_header=args.tenant_header, fairness_header=not args.no_fairness_header,
        tiers={t.name: t.tier for t in config.tenants} if args.priority else None,
        salts={t.name: t.salt for t in config.tenants} if salted else None, prompt_seed=args.prompt_seed)


def _fmt(x: float) -> str:
    return "never" if math.isinf(x) else ("-" if math.isnan(x) else f"{x:.3f}s")


def service_table(history, config, end_s: float) -> str:
    """Per tenant: TPOT p50 / p99 of its finished requests and its goodput (requests finished
    with TTFT within its SLO, per second of the run; adversaries.objectives)."""
    from tenantry.adversaries.objectives import TTFT_SLO_S, goodput, percentile, tpot_s

    heads = ["tenant", "finished", "TPOT p50", "p99", "TTFT SLO", "goodput/s"]
    rows = []
    for t, recs in history.by_tenant().items():
        tc = next((c for c in config.tenants if c.name == t), None)
        slo = tc.slo_ttft_s if tc is not None and tc.slo_ttft_s is not None else TTFT_SLO_S
        tp = [x for x in (tpot_s(r) for r in recs) if x is not None]
        rows.append([t, str(sum(r.outcome == "finished" for r in recs)),
                     _fmt(percentile(tp, 50)) if tp else "-", _fmt(percentile(tp, 99)) if tp else "-",
                     f"{slo:g}s", f"{goodput(history, [t], end_s, slo):.3f}" if end_s > 0 else "-"])
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]
    line = lambda r: "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))
    return "\n".join([line(heads), "-" * len(line(heads))] + [line(r) for r in rows])


def _summary(hist, rep) -> str:
    """One line: what the replay saw."""
    from collections import Counter

    outcomes = Counter(r.outcome for r in hist.requests)
    failures = Counter(r.failure for r in hist.requests if r.failure)
    parts = [f"{outcomes.get(k, 0)} {k}" for k in ("finished", "rejected", "cancelled", "unfinished")]
    fail = f" ({', '.join(f'{k} {v}' for k, v in sorted(failures.items()))})" if failures else ""
    lag = f"; sent up to {rep.max_lag_s:.3g} s late (workload time)" if rep.max_lag_s > 0.05 else ""
    return f"replayed {len(hist.requests)} requests: {', '.join(parts)}{fail}{lag}"


def run(args: argparse.Namespace) -> int:
    from tenantry.live import INSTALL_HINT, MissingExtra, require_extra

    try:
        require_extra()
    except MissingExtra:
        print(f"tenantry replay: {INSTALL_HINT}", file=sys.stderr)
        return 2
    import asyncio

    import attrs
    from tqdm import tqdm

    from tenantry.adversaries.outdir import STOP_REQUESTED, Interrupted, check_output_file
    from tenantry.live.client import LiveError, ReplayOptions, Replay, check_options, endpoints, header_of, \
        preflight, signals_stop
    from tenantry.live.record import live_history
    from tenantry.runner.history import write_history
    from tenantry.model.config import config_to_dict
    from tenantry.runner.simulate import tenant_table
    from .simulate import format_table

    if args.matrix:
        return run_matrix(args)
    for flag in ("patterns", "searched_on", "budget", "workers", "out", "resume"):
        if getattr(args, flag) not in (None, False):
            raise ConfigError("--" + flag.replace("_", "-"), getattr(args, flag), "applies to --matrix only")
    if args.no_baseline and args.plots:
        raise ConfigError("--plots", str(args.plots), "draws the victims with and without the adversary: drop "
                          "--no-baseline")
    inputs = [args.config, args.workload, args.burstgpt] + [a.partition(":")[0] for a in (args.azure or [])
                                                             + (args.mooncake or [])]
    if args.history is not None:
        check_output_file(args.history, "--history", inputs=inputs)
    workload, scenario, base, label = _source(args)
    if args.plots is not None and scenario is None:
        raise ConfigError("--plots", str(args.plots), "needs --pattern or a matrix cell's workload (the plots "
                          "compare the victims with and without the adversary)")
    config = _config(args, base, workload.tenants)
    horizon = args.horizon or (scenario.horizon_s if scenario is not None and args.pattern else None)
    opts = ReplayOptions(url=args.url, wire=_wire(args, config, args.model or "tenantry"),
                         time_scale=args.time_scale, max_in_flight=args.max_in_flight, timeout_s=args.timeout_s,
                         horizon_s=horizon, token_times=not args.no_token_times)
    check_options(opts)
    try:
        endpoints(args.url)
        model, max_len = asyncio.run(preflight(opts))
    except LiveError as e:
        print(f"tenantry: error: {e}", file=sys.stderr)
        return 2
    model = args.model or model
    opts = attrs.evolve(opts, wire=attrs.evolve(opts.wire, model=model))
    long = sum(1 for r in workload if max_len is not None and r.prompt_tokens + r.output_tokens > max_len)
    if long:
        print(f"note: {long} of {len(workload)} requests are longer (prompt + output) than the server's "
              f"max_model_len {max_len}: it refuses them (a longer prompt) or cuts their output", file=sys.stderr)
    print(f"replay: {label}: {len(workload)} requests from {len(workload.tenants)} tenants over "
          f"{workload.duration_s:.1f} s to {endpoints(args.url)[0]} (model {model}), time scale "
          f"{args.time_scale:g}" + (f", horizon {horizon:g} s" if horizon else ""), file=sys.stderr)
    bar = tqdm(total=len(workload), desc="replay", unit="req", leave=False, disable=None)
    rep = Replay(workload, opts, on_end=lambda r, s: bar.update(1), stop=STOP_REQUESTED.is_set)
    with signals_stop():
        asyncio.run(rep.run())
    bar.close()
    extra = {"workload": label, "config": config_to_dict(config)}
    if scenario is not None:
        extra["pattern"] = scenario.pattern
    hist = live_history(workload.requests, rep.seen, header_of(rep, extra))
    kept = "no history written (give --history PATH)"
    if args.history is not None:
        write_history(hist, args.history)
        kept = f"kept: history {args.history}"
        print(f"history: {args.history}", file=sys.stderr)
    print(_summary(hist, rep), file=sys.stderr)
    if rep.stopped:
        ended = sum(1 for s in rep.seen.values() if s.ended)
        raise Interrupted(f"after {ended} of {len(workload)} requests ended", kept
                          + ("; the requests not ended are recorded unfinished" if args.history else ""))
    end = hist.end_s
    window = args.window or (workload.duration_s if workload.duration_s > 0 else end) or 1.0
    print(format_table([("live", tenant_table(hist, window_s=window, w_in=config.order.w_in,
                                              w_out=config.order.w_out))], window))
    print()
    print(service_table(hist, config, end))
    if scenario is not None and not args.no_baseline:
        _objective(args, scenario, hist, opts, config)
    return 0


def _objective(args: argparse.Namespace, scenario, hist, opts, config) -> None:
    """The pattern's objective and every metric a client measures (the victims replayed alone
    for the baseline; the prefix probe's twin replayed too), and the plots with --plots."""
    from tenantry.adversaries.evaluate import scored
    from tenantry.adversaries.outdir import Interrupted, report_folder
    from tenantry.adversaries.patterns import PATTERNS
    from tenantry.adversaries.report import cell_plots, write_plots
    from tenantry.live.client import signals_stop
    from tenantry.live.scoring import LiveSystem, observable
    from tenantry.spec.invariants_run import CheckedRun

    system = LiveSystem(args.url, opts, base=config)
    print("baseline: the victims alone" + (" and the probe's control twin" if scenario.twin is not None else "")
          + " ...", file=sys.stderr)
    try:
        with signals_stop():
            _, base, _, ev = scored(system, scenario, CheckedRun(hist, ()))
    except KeyboardInterrupt:
        raise Interrupted("during the baseline run", f"kept: history {args.history}" if args.history
                          else "no history written") from None
    objective = PATTERNS[scenario.pattern].objective if scenario.pattern in PATTERNS else "ttft_p99_inflation"
    print()
    if observable(objective):
        print(f"{scenario.pattern}: {objective} = {ev.metrics[objective]:.6g} (hurt at "
              f"{PATTERNS[scenario.pattern].finding:g})" if scenario.pattern in PATTERNS else
              f"{scenario.pattern}: {objective} = {ev.metrics[objective]:.6g}")
    else:
        print(f"{scenario.pattern}: {objective} is not measured by a client (it reads the server's step records); "
              "what a client measures:")
    for k in sorted(ev.metrics):
        print(f"  {k:<32} " + (f"{ev.metrics[k]:.6g}" if observable(k) else "n/a (needs the server's steps)"))
    if args.plots is not None:
        pngs = {k: v for k, v in cell_plots(args.url, scenario, hist, base).items() if k == "ttft_cdf.png"}
        with report_folder(args.plots, "plots", flag="--plots", inputs=[args.history]) as tmp:
            write_plots(pngs, tmp)
        print(f"plots: {args.plots}/ttft_cdf.png (service and KV plots need the server's steps)", file=sys.stderr)


def run_matrix(args: argparse.Namespace) -> int:
    """``--matrix``: the abuse matrix of the server at the URL (tenantry check's matrix code with
    :class:`~tenantry.live.scoring.LiveSystem`): every pattern one after the other, its default
    workload (or the worst found on ``--searched-on`` SETUP), the victims alone for the baseline,
    a report folder; prints the victims' hurt per pattern."""
    import asyncio
    import os

    import attrs

    from tenantry.adversaries.check import run_check
    from tenantry.adversaries.patterns import ADVERSARY, PATTERNS
    from tenantry.adversaries.check import DEFAULT_SEARCHES
    from tenantry.adversaries.search import Budget
    from tenantry.adversaries.victims import DEFAULT_VICTIMS
    from tenantry.live.client import LiveError, ReplayOptions, check_options, preflight
    from tenantry.live.scoring import LiveSystem, config_for, live_patterns
    from tenantry.runner.setups import get_setup, load_config_toml

    for flag, v in (("--workload", args.workload), ("--pattern", args.pattern), ("--azure", args.azure),
                    ("--mooncake", args.mooncake), ("--azure-pair", args.azure_pair or None),
                    ("--burstgpt", args.burstgpt), ("--history", args.history), ("--plots", args.plots),
                    ("--horizon", args.horizon), ("--no-baseline", args.no_baseline or None)):
        if v is not None:
            raise ConfigError(flag, str(v), "does not apply to --matrix (each pattern brings its workload, horizon "
                              "and baseline; the report folder is --out)")
    if args.budget is not None and args.searched_on is None:
        b = args.budget
        raise ConfigError("--budget", ",".join(x for x in (str(b.evaluations or ""), f"{b.seconds:g}s" if b.seconds
                                                           else "") if x),
                          "applies to --searched-on (the default workloads need no search)")
    if args.searched_on is not None:
        if get_setup(args.searched_on).fleet is not None:
            raise ConfigError("--searched-on", args.searched_on, "a fleet setup: search on a one-replica setup")
    patterns = live_patterns(args.patterns)
    base = load_config_toml(args.config) if args.config else None
    roles = [(ADVERSARY, "adversary")] + [(v.name, "victim") for v in DEFAULT_VICTIMS]
    config = _config(args, base, [n for n, _ in roles])
    opts = ReplayOptions(url=args.url, wire=_wire(args, config, args.model or "tenantry"), time_scale=args.time_scale,
                         max_in_flight=args.max_in_flight, timeout_s=args.timeout_s, token_times=False)
    check_options(opts)
    try:
        model, _ = asyncio.run(preflight(opts))
    except LiveError as e:
        print(f"tenantry: error: {e}", file=sys.stderr)
        return 2
    opts = attrs.evolve(opts, wire=attrs.evolve(opts.wire, model=args.model or model))
    system = LiveSystem(args.url, opts, base=config_for(config, roles))
    out = Path(args.out or MATRIX_OUT)
    searches = DEFAULT_SEARCHES if args.searched_on else ()
    print(f"replay --matrix: {len(patterns)} patterns one after the other against {args.url} (model "
          f"{opts.wire.model}, time scale {args.time_scale:g})" + (
              f", workloads searched on {args.searched_on}" if args.searched_on else ", default workloads"),
          file=sys.stderr)
    res = run_check(setups=[system], patterns=patterns, seed=args.seed or 0,
                    budget=args.budget or Budget.parse(str(MATRIX_BUDGET)), searches=searches, out=out,
                    workers=(args.workers or os.cpu_count()) if args.searched_on else 1, cell_threads=1,
                    shrink_evaluations=0, plots="none", extras=False, spread_seeds=0, kind="replay",
                    replay_depth="history", resume=args.resume, out_is_default=args.out is None,
                    search_on=args.searched_on)
    print(matrix_table(res["cells"].values()))
    hurt = [c["pattern"] for c in res["cells"].values() if c["finding"]]
    print(f"\n{len(res['cells'])} patterns in {res['wall_s']:.0f} s; victims hurt by: {', '.join(hurt) or 'none'}; "
          f"report: {out / 'report.md'}")
    return 0


def matrix_table(cells) -> str:
    """Per pattern: its objective and value against its hurt level, and the victims' p99 TTFT
    (seconds, and inflation over the victims alone)."""
    heads = ["pattern", "objective", "value", "hurt at", "victims", "victim TTFT p99", "inflation"]
    rows = []
    for c in cells:
        m = c["metrics"]
        rows.append([c["pattern"], c["objective"], f"{c['score']:.3g}", f"{c['threshold']:g}",
                     "hurt" if c["finding"] else "not hurt", f"{m['victim_ttft_p99_s']:.3f}s",
                     f"{m['ttft_p99_inflation']:.3g}x"])
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]
    line = lambda r: "  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))
    return "\n".join([line(heads), "-" * len(line(heads))] + [line(r) for r in rows])
