"""``tenantry simulate``: run the reference model on a workload and print a
per-policy, per-tenant table (sent, 429, finished in time, TTFT p50/p95/p99,
weighted tokens/s).

With no arguments it runs the embedded default: the three-tenant overload
experiment of seed 001 (bulk 6 req/s with 8,000-token prompts and 500 output
tokens, app 3 req/s 1,500/300, chat 0.5 req/s 500/150, 300 s) under FCFS, a
request-rate limit and VTC.
"""

from __future__ import annotations

import argparse
import math

import attrs
import sys
from pathlib import Path
from typing import Any

from tenantry.model.config import ConfigError, readable_number
from tenantry.runner.history import write_history
from tenantry.runner.setups import SETUPS, apply_setup, default_config, get_setup, load_config_toml, seed001_config
from tenantry.runner.simulate import simulate, tenant_table
from tenantry.runner.traces import (
    azure_two_tenant_workload, read_azure_csv, read_burstgpt_csv, read_mooncake_jsonl, read_workload_jsonl, seed001_workload, compose, TracePart,
)
from tenantry.adversaries.objectives import service_gap
from tenantry.model.routers import ACCOUNTING, ROUTERS, FleetConfig
from tenantry.model.workload import Workload
from tenantry.runner.fleet import load_fleet_toml, prefix_hit_rate, simulate_fleet

from .args import non_negative_int, positive_float, positive_int

HELP = "Run the reference model on a workload and print a per-policy, per-tenant table."

DEFAULT_SETUPS = ("fcfs", "rate_limit", "vtc")


def _fmt_s(x: float) -> str:
    return "never" if math.isinf(x) else ("-" if math.isnan(x) else f"{readable_number(x, '.2f')}s")


#: Tenants shown per policy when there are more (``--all-tenants`` shows every one).
MAX_TENANT_ROWS = 20


def worst_served(trows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The ``n`` worst-served tenants of one policy's :func:`~tenantry.runner.simulate.tenant_table`
    rows, worst first: the lowest share finished in time, then the highest TTFT p99 (never, or no
    admitted request, counts as the highest), then the most refused; ties in table order."""
    def key(ir: tuple[int, dict[str, Any]]) -> tuple:
        i, r = ir
        p99 = r["ttft_p99_s"]
        return (r["finished_in_time"], -(math.inf if math.isnan(p99) else p99), -r["rejected"], i)

    return [r for _, r in sorted(enumerate(trows), key=key)[:n]]


def format_table(results: list[tuple[str, list[dict[str, Any]]]], window_s: float,
                 max_tenants: int | None = None) -> str:
    """The printed table: one block of rows per policy; columns at least two spaces apart.

    ``max_tenants``: a policy with more tenants shows only its :func:`worst_served` ones and a line
    saying how many more there are (its total still counts all of them); None: every tenant."""
    heads = ["policy", "tenant", "sent", "429", f"done<={window_s:g}s", "TTFT p50", "p95", "p99", "wtok/s"]
    rows: list[list[str] | str | None] = []
    for policy, trows in results:
        shown = trows if max_tenants is None or len(trows) <= max_tenants else worst_served(trows, max_tenants)
        for r in shown:
            rows.append([policy, r["tenant"], str(r["sent"]), str(r["rejected"]), f"{r['finished_in_time']:.0%}",
                         _fmt_s(r["ttft_p50_s"]), _fmt_s(r["ttft_p95_s"]), _fmt_s(r["ttft_p99_s"]),
                         readable_number(r["weighted_tokens_per_s"], ",.0f")])
        if len(shown) < len(trows):
            rows.append(f"... and {len(trows) - len(shown):,} more tenants (shown: the {len(shown)} worst served, "
                        f"by done<={window_s:g}s, then TTFT p99; --all-tenants prints all)")
        total = sum(r["weighted_tokens_per_s"] for r in trows)
        rows.append([policy, "(total)", "", "", "", "", "", "", readable_number(total, ",.0f")])
        rows.append(None)
    widths = [max([len(h)] + [len(r[i]) for r in rows if isinstance(r, list)]) for i, h in enumerate(heads)]

    def line(r: list[str] | str | None) -> str:
        if r is None:
            return ""
        if isinstance(r, str):  # the one line of the tenants not shown, under the policy's rows
            return f"{' ' * widths[0]}  {r}"
        return "  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths))).rstrip()

    head = line(heads)
    return "\n".join([head, "-" * len(head)] + [line(r) for r in rows])


def table_legend(window_s: float) -> str:
    """What the columns of :func:`format_table` measure (printed to stderr, under the table)."""
    return (f"429: refused; done<={window_s:g}s: share of the requests sent that finished by {window_s:g} s, the "
            "end of the arrivals (--window S sets it); TTFT of the admitted requests (never: no first token "
            f"by the horizon); wtok/s: w_in x prompt + w_out x output tokens of the requests finished by "
            f"{window_s:g} s, per second")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="replica configuration (TOML); default: 70B on 8 H100s, equal tenants")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", type=Path, help="workload in the project's JSON Lines format")
    src.add_argument("--azure", nargs="+", metavar="FILE[:TENANT]", help="Azure LLM 2023 CSV files, one tenant each")
    src.add_argument("--mooncake", nargs="+", metavar="FILE[:TENANT]", help="Mooncake FAST'25 JSON Lines files, one tenant each")
    src.add_argument("--azure-pair", action="store_true", help="the Azure code and conv traces as two tenants (shared/ or the packaged excerpt)")
    src.add_argument("--burstgpt", type=Path, metavar="FILE",
                     help="a BurstGPT CSV trace (6- or 8-column release format); tenants by --burstgpt-tenant")
    p.add_argument("--burstgpt-tenant", choices=("model", "log_type", "session"), default="model",
                   help="the BurstGPT column that names the tenant (default model; session: the 8-column files)")
    p.add_argument("--burstgpt-failed", choices=("drop", "keep"), default="drop",
                   help="BurstGPT requests with 0 response tokens (failures): drop them (default) or keep them "
                        "with one output token")
    p.add_argument("--speedup", type=positive_float, default=None,
                   help="divide trace arrival times by this factor (default 1; trace files only)")
    p.add_argument("--max-rows", type=positive_int, default=None, help="read at most this many rows per trace (trace files only)")
    p.add_argument("--policy", nargs="+", default=None,
                   help=f"policy setups to compare: {', '.join(SETUPS)}, or all (the one-replica ones; default: "
                        f"the --config file's own policy, else {' '.join(DEFAULT_SETUPS)}); a fleet setup (fleet_*) "
                        "runs its fleet (its replicas, router and accounting) unless --replicas / --router / "
                        "--accounting say otherwise; with --config, a named setup replaces the file's order policy, "
                        "admission switches, eviction and prefix cache (its tenants, tiers, weights, pool and batch "
                        "limits stay), so give no --policy to run the file as written")
    p.add_argument("--horizon", type=positive_float, default=None, help="stop the run at this time (seconds); default 3x the last arrival, at least 600 s after it")
    p.add_argument("--window", type=positive_float, default=None, help="'finished in time' and throughput window (seconds); default: the last arrival, or the horizon when that is earlier")
    p.add_argument("--seed", type=non_negative_int, default=None,
                   help="seed of the synthetic default workload (default 9; without a workload or trace option only)")
    p.add_argument("--replicas", type=replica_count, default=None,
                   help="run a fleet of N replicas of the configuration behind a router (default: the --config "
                        "file's [fleet] table, else one replica)")
    p.add_argument("--router", nargs="+", default=None,
                   help=f"fleet router policies to compare: {', '.join(ROUTERS)}, or all (default round_robin)")
    p.add_argument("--accounting", choices=ACCOUNTING, default=None,
                   help="fleet accounting: each replica its own VTC counters (replica, default) or one set shared "
                        "by the fleet (fleet; needs policy vtc)")
    p.add_argument("--history", type=Path, default=None,
                   help="write the run's history to exactly PATH; with several policies, put {policy} in PATH "
                        "(e.g. out/h.{policy}.jsonl) for one file per policy.  An existing file is replaced only "
                        "when it is a tenantry history")
    p.add_argument("--all-tenants", action="store_true",
                   help=f"print every tenant's row (default: with more than {MAX_TENANT_ROWS} tenants, each policy's "
                        f"{MAX_TENANT_ROWS} worst served and how many more)")
    p.add_argument("--detail", action="store_true",
                   help="with --history: also record each running request's KV blocks and block ids per step, "
                        "what verify --history needs to judge KV-CAP with a shared cache, SALT-ISOLATION and "
                        "WORK-CONSERVING (larger files)")


def _split(arg: str, default: str) -> tuple[str, str]:
    path, _, tenant = arg.partition(":")
    return path, tenant or default


#: The trace options (``--speedup`` and ``--max-rows`` apply to these only).
TRACE_OPTIONS = ("azure", "mooncake", "azure_pair", "burstgpt")


def load_workload(args: argparse.Namespace, block_size_tokens: int) -> Workload:
    """The workload named on the command line (the seed-001 default when none).

    Raises:
        ConfigError: an option given that the workload source ignores (``--speedup`` or
            ``--max-rows`` without a trace file, ``--seed`` with a file), instead of a run
            that silently did not do what was asked.
    """
    trace = next((o for o in TRACE_OPTIONS if getattr(args, o)), None)
    source = f"--{trace.replace('_', '-')}" if trace else "--workload" if args.workload else "the default workload"
    for flag, value in (("--speedup", args.speedup), ("--max-rows", args.max_rows)):
        if value is not None and trace is None:
            raise ConfigError(flag, value, f"applies to trace files (--azure, --mooncake, --azure-pair, --burstgpt), "
                              f"not {source}" + ("; edit the file's arrival_s or cut its lines instead"
                                                  if args.workload else ""))
    if args.seed is not None and source != "the default workload":
        raise ConfigError("--seed", args.seed, f"seeds the synthetic default workload; {source} is read as written")
    speedup = 1.0 if args.speedup is None else args.speedup
    if args.workload:
        return read_workload_jsonl(args.workload)
    if args.azure_pair:
        return azure_two_tenant_workload(speedup=speedup, max_rows=args.max_rows)
    if args.burstgpt:
        reqs = read_burstgpt_csv(args.burstgpt, tenant_by=args.burstgpt_tenant, failed=args.burstgpt_failed,
                                 max_rows=args.max_rows)
        if not reqs:
            raise ConfigError("--burstgpt", str(args.burstgpt), "no requests in this file", str(args.burstgpt))
        return compose([TracePart(reqs, speedup=speedup)])
    if args.azure or args.mooncake:
        parts = []
        for arg in args.azure or []:
            path, tenant = _split(arg, Path(arg).stem)
            parts.append(TracePart(read_azure_csv(path, tenant, max_rows=args.max_rows), speedup=speedup))
        for arg in args.mooncake or []:
            path, tenant = _split(arg, Path(arg).stem)
            parts.append(TracePart(read_mooncake_jsonl(path, tenant, block_size_tokens=block_size_tokens, max_rows=args.max_rows), speedup=speedup))
        return compose(parts)
    return seed001_workload(seed=9 if args.seed is None else args.seed)


def history_paths(template: Path, names: list[str]) -> dict[str, Path]:
    """{policy name: history file}: ``template`` itself for one policy; with several, ``{policy}`` in it is
    replaced by each policy's name.

    Raises:
        ConfigError: several policies and no ``{policy}`` in the path, or a bad ``{...}`` field.
    """
    text = str(template)
    if "{policy}" not in text:
        if len(names) > 1:
            raise ConfigError("--history", text, f"{len(names)} policies ({', '.join(names)}) would each write a "
                              "history: put {policy} in the path, e.g. out/h.{policy}.jsonl, or run one --policy "
                              "(and, for a fleet, one --router)")
        return {names[0]: template}
    try:
        return {n: Path(text.format(policy=n.split(" ")[0])) for n in names}
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError("--history", text, f"only {{policy}} may be in braces ({e})") from None


def format_fleet_table(rows: list[dict[str, Any]]) -> str:
    """The fleet lines under the tenant table: per run (policy + router), the fleet
    service gap (weighted tokens), the prefix-cache hit rate and the requests per replica."""
    heads = ["policy+router", "accounting", "fleet service gap", "prefix hit rate", "requests per replica"]
    body = [[r["name"], r["accounting"], readable_number(r["gap"], ",.0f"),
             "-" if math.isnan(r["hit_rate"]) else f"{r['hit_rate']:.1%}", " ".join(map(str, r["per_replica"]))]
            for r in rows]
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(heads)]
    line = lambda r: "  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths))).rstrip()
    head = line(heads)
    return "\n".join([head, "-" * len(head)] + [line(b) for b in body])


def replica_count(text: str) -> int:
    """``--replicas``: a whole number from 1 to :data:`~tenantry.model.routers.MAX_REPLICAS`."""
    from tenantry.model.routers import MAX_REPLICAS

    n = positive_int(text)
    if n > MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"{text}: at most {MAX_REPLICAS} replicas")
    return n


def fleet_plan(args: argparse.Namespace, names: list[str], table: FleetConfig | None) -> dict[str, list[str]] | None:
    """The router policies to run per ``--policy`` name, or None for one replica each (no
    fleet flag, no ``[fleet]`` table, no fleet setup).  A fleet setup (``fleet_*``) brings its
    own fleet: ``--replicas`` / ``--router`` / ``--accounting`` override only their part of
    it; other names take ``--router``, else the ``[fleet]`` table's router, else round robin.

    Raises:
        ConfigError: naming ``--router`` and the value; naming ``--policy`` when fleet and
            one-replica setups are mixed without a fleet flag, or ``--config`` when its
            ``[fleet]`` table would replace the fleet setups' own fleets.
    """
    parts = {n: SETUPS[n].fleet for n in names if n in SETUPS and SETUPS[n].fleet is not None}
    flags = args.replicas is not None or args.router is not None or args.accounting is not None
    if parts and table is not None:
        raise ConfigError("--config", str(args.config), f"has a [fleet] table, and --policy names fleet setups "
                          f"({', '.join(parts)}) that bring their own fleet; drop one of them")
    if parts and len(parts) != len(names) and not flags:
        one = [n for n in names if n not in parts]
        raise ConfigError("--policy", " ".join(names), f"mixes fleet setups ({', '.join(parts)}) and one-replica "
                          f"setups ({', '.join(one)}); run them apart, or give --replicas / --router for all")
    if not parts and not flags and table is None:
        return None
    if args.router and "all" in args.router and len(args.router) > 1:
        raise ConfigError("--router", " ".join(args.router), "give 'all' alone, or a list of router names")
    explicit = list(ROUTERS) if args.router == ["all"] else args.router
    for r in explicit or ():
        if r not in ROUTERS:
            raise ConfigError("--router", r, f"unknown router; choose from {', '.join(ROUTERS)}, or all")
    default = table.router if table else "round_robin"
    return {n: list(dict.fromkeys(explicit or [parts[n].router if n in parts else default])) for n in names}


def fleet_label(args: argparse.Namespace, name: str, router: str) -> str:
    """A fleet run's name: a fleet setup run as it is keeps its name; otherwise ``policy+router``."""
    if args.router is None and name in SETUPS and SETUPS[name].fleet is not None:
        return name
    return f"{name.split(' ')[0]}+{router}"


def fleet_configs(args: argparse.Namespace, configs: list[tuple[str, Any]], table: FleetConfig | None,
                  plan: dict[str, list[str]]) -> list[tuple[str, FleetConfig]]:
    """The fleets to run, one per (policy, router): a fleet setup's own fleet (its
    replicas, accounting, load factor and affinity subsets; model.setups ``Setup.fleet``),
    else ``--replicas`` copies of the policy's replica (with the ``[fleet]`` table's pools
    when it has one for that many replicas, else the replica's pool for all); the flags
    override their part.

    Raises:
        ConfigError: naming the flag and the value.
    """
    out = []
    for name, cfg in configs:
        part = SETUPS[name].fleet if name in SETUPS else None
        n = args.replicas or (part.replicas if part else len(table.replicas) if table else 1)
        pools = [c.num_blocks for c in table.replicas] if table and len(table.replicas) == n else None
        accounting = args.accounting or (part.accounting if part else table.accounting if table else "replica")
        kw = (dict(load_factor=part.load_factor, affinity_replicas=part.affinity_replicas) if part else
              dict(load_factor=table.load_factor, affinity_replicas=table.affinity_replicas,
                   tenant_replicas=table.tenant_replicas) if table else {})
        for router in plan[name]:
            reps = tuple(attrs.evolve(cfg, num_blocks=b) for b in (pools or [cfg.num_blocks] * n))
            try:
                fc = FleetConfig(reps, router=router, accounting=accounting, **kw)
            except ConfigError as e:
                flag = {"accounting": "--accounting", "affinity_replicas": "--replicas",
                        "tenant_replicas": "--replicas"}.get(e.field)
                if flag is None:
                    raise
                raise ConfigError(flag, getattr(args, flag[2:]) or e.value, f"{e.why} (policy {name})") from None
            out.append((fleet_label(args, name, router), fc))
    return out


def _check_writable(path: Path) -> None:
    """Refuse (ConfigError) a file whose folder cannot be made or written, without making anything."""
    import os

    up = next(a for a in path.absolute().parents if a.exists())
    if not up.is_dir():
        raise ConfigError("--history", str(path), f"cannot be written: {up} is a file, not a folder")
    if not os.access(up, os.W_OK | os.X_OK):
        raise ConfigError("--history", str(path), f"cannot be written: no permission to write in {up}")


def run(args: argparse.Namespace) -> int:
    from tenantry.adversaries.outdir import Interrupted, check_output_file
    from tqdm import tqdm

    if args.policy and "all" in args.policy and len(args.policy) > 1:
        raise ConfigError("--policy", " ".join(args.policy), "give 'all' alone, or a list of policy names")
    if args.history is not None and not args.history.name:
        raise ConfigError("--history", str(args.history), "give a file path, e.g. out/h.jsonl")
    base = load_config_toml(args.config) if args.config else None
    if args.policy == ["all"]:  # the one-replica setups (fleet setups are named one by one)
        names = [n for n, x in SETUPS.items() if x.fleet is None]
    elif args.policy:
        names = list(args.policy)
        for name in names:
            get_setup(name)  # every name checked before any work
    elif args.config:
        names = [f"{base.order.policy} ({args.config.name})"]
    else:
        names = list(DEFAULT_SETUPS)
    table = load_fleet_toml(args.config, base) if args.config else None
    plan = fleet_plan(args, names, table)
    fleet_names = None if plan is None else [fleet_label(args, n, r) for n in names for r in plan[n]]
    inputs = [args.config, args.workload, args.burstgpt] + [_split(a, "")[0] for a in (args.azure or []) + (args.mooncake or [])]
    paths: dict[str, Path] = {}
    if args.detail and args.history is None:
        raise ConfigError("--detail", True, "only with --history (it adds to the step records a history file keeps)")
    if args.history is not None:
        paths = history_paths(args.history, fleet_names or names)
        if len(set(paths.values())) < len(paths):
            raise ConfigError("--history", str(args.history), "two policies would write the same file")
        for out in paths.values():
            check_output_file(out, "--history", inputs=inputs)
            _check_writable(out)  # fail before the run, not after it (folders are made when writing)
    workload = load_workload(args, base.block_size_tokens if base else 16)
    if not len(workload):
        source = args.workload or args.burstgpt or ", ".join(_split(a, "")[0] for a in (args.azure or []) + (args.mooncake or []))
        raise ConfigError("workload", 0, "no requests to run (empty file, or --max-rows too small?)", str(source or ""))
    seed001 = not (args.workload or args.azure or args.mooncake or args.azure_pair or args.burstgpt)
    if base is None:
        base = seed001_config(workload.tenants) if seed001 else default_config(workload.tenants)
    elif seed001 and not set(workload.tenants) <= {t.name for t in base.tenants}:
        raise ConfigError("--config", str(args.config), f"has tenants {', '.join(t.name for t in base.tenants)}, "
                          f"and without --workload the run is seed-001's synthetic workload, whose tenants are "
                          f"{', '.join(workload.tenants)}: give --workload FILE with requests of your tenants")
    if args.config and not args.policy:
        configs = [(names[0], base)]
    else:
        configs = [(name, apply_setup(base, name)) for name in names]
    fleets = None if plan is None else fleet_configs(args, configs, table, plan)
    if fleets is not None and args.replicas is None and table is None and any(
            len(fc.replicas) == 1 for _, fc in fleets):
        print("note: a fleet of 1 replica (--router / --accounting without --replicas N)", file=sys.stderr)
    horizon = args.horizon or max(3 * workload.duration_s, workload.duration_s + 600.0)
    window = args.window or (min(workload.duration_s, horizon) if workload.duration_s > 0 else horizon)  # never past the run
    print(f"workload: {len(workload)} requests from {len(workload.tenants)} tenants over "
          f"{readable_number(workload.duration_s, '.1f')}s; horizon {horizon:g}s", file=sys.stderr)
    if fleets is None:
        runs = [(name, cfg, lambda cfg=cfg, name=name: simulate(cfg, workload, horizon_s=horizon,
                                                                 record_steps=args.history is not None,
                                                                 detail=args.detail, header={"policy": name}))
                for name, cfg in configs]
    else:
        runs = [(name, fc.replicas[0], lambda fc=fc, name=name: simulate_fleet(fc, workload, horizon_s=horizon,
                                                                             header={"policy": name},
                                                                             detail=args.detail))
                for name, fc in fleets]
    results, rows, written, doing = [], [], [], ""
    unit = "policy" if fleets is None else "fleet"
    bar = tqdm(runs, desc="simulate", unit=unit, leave=False, disable=None if len(runs) > 1 else True)
    try:
        for i, (name, cfg, run) in enumerate(bar):
            bar.set_postfix_str(name)
            doing = f"during {unit} {i + 1} of {len(runs)} ({name})"
            hist = run()
            results.append((name, tenant_table(hist, window_s=window, w_in=cfg.order.w_in, w_out=cfg.order.w_out)))
            if fleets is not None:
                fc = fleets[i][1]
                rows.append({"name": name, "accounting": fc.accounting, "gap": service_gap(hist),
                             "hit_rate": prefix_hit_rate(hist),
                             "per_replica": [sum(1 for r in hist.requests if r.replica == k)
                                             for k in range(len(fc.replicas))]})
            if args.history is not None:
                out = paths[name]
                doing = f"while writing {out} (left as it was)"
                out.parent.mkdir(parents=True, exist_ok=True)
                write_history(hist, out)
                written.append(str(out))
                print(f"history: {out}", file=sys.stderr)
    except KeyboardInterrupt:
        bar.close()
        raise Interrupted(doing, "kept: " + (", ".join(written) if written else "no history written")) from None
    bar.close()
    if fleets is not None:
        alike = len({(len(fc.replicas), tuple(c.num_blocks for c in fc.replicas)) for _, fc in fleets}) == 1
        for name, fc in fleets[:1] if alike else fleets:
            n = len(fc.replicas)
            label = "" if len(fleets) == 1 else f" (each of the {len(fleets)})" if alike else " " + name
            print(f"fleet{label}: {n} replica{'s' if n != 1 else ''}, pools "
                  f"{' '.join(str(c.num_blocks) for c in fc.replicas)} blocks", file=sys.stderr)
    print(format_table(results, window, None if args.all_tenants else MAX_TENANT_ROWS))
    print(table_legend(window), file=sys.stderr)
    if fleets is not None:
        print()
        print(format_fleet_table(rows))
    return 0
