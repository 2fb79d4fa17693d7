"""``tenantry serve``: the reference model behind an OpenAI-compatible streaming API
(``/v1/completions``, ``/v1/models``, ``/health``) in scaled real time (SPEC.md 12.3).

One replica from ``--config`` or a built-in ``--policy``, or a fleet (a ``[fleet]`` table,
a ``fleet_*`` setup).  Tenants: the configuration's, or ``--tenants`` (default: the
adversary and the default victims of the patterns' scenarios, so ``tenantry replay URL
--pattern NAME`` runs against it as it is).  Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tenantry.model.config import ConfigError

from .args import Names, positive_float
from .replay import vocab

HELP = "Serve the reference model as an OpenAI-compatible streaming API in scaled real time."


def port(text: str) -> int:
    """``--port``: 0 (any free port) to 65535."""
    try:
        p = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is 0 (any free one) to 65535")
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="replica configuration (TOML; a [fleet] table serves a fleet)")
    p.add_argument("--policy", default=None, help="a built-in setup (as simulate --policy; fleet_* serves its fleet); "
                   "with --config, it replaces the file's policies and keeps its tenants")
    p.add_argument("--tenants", nargs="+", action=Names, default=None,
                   help="tenant names for --policy (default: adv chat conv code, the patterns' scenario tenants)")
    p.add_argument("--adversaries", nargs="+", action=Names, default=None,
                   help="tenants in the adversary role (tier 0 under a tiered setup; default: adv)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="port (default 8000; 0: any free port, printed)")
    p.add_argument("--time-scale", type=positive_float, default=1.0,
                   help="model seconds per wall second (default 1; 4: the model runs four times as fast)")
    p.add_argument("--model", default="tenantry", help="the model name /v1/models lists (default tenantry)")
    p.add_argument("--vocab", type=vocab, default=None, metavar="LO:HI",
                   help="token-id range of the wire mapping (default 100:1000; the client's must be the same)")
    p.add_argument("--tenant-header", default=None, metavar="NAME",
                   help="also read the tenant from this header (after the body's user)")
    p.add_argument("--history", type=Path, default=None,
                   help="write the model's history of what it served (step records included) to PATH when it stops")


def _system(args: argparse.Namespace):
    """(label, Config or FleetConfig) of the flags."""
    from tenantry.adversaries.victims import DEFAULT_VICTIMS
    from tenantry.runner.fleet import load_fleet_toml
    from tenantry.runner.setups import SETUPS, apply_setup, build_config, build_fleet, get_setup, load_config_toml

    if args.config and (args.tenants or args.adversaries):
        raise ConfigError("--tenants", " ".join(args.tenants or args.adversaries), "the --config file names its "
                          "tenants; give --tenants with --policy alone")
    if args.config:
        base = load_config_toml(args.config)
        if args.policy:
            get_setup(args.policy)
            if SETUPS[args.policy].fleet is not None:
                raise ConfigError("--policy", args.policy, "is a fleet setup; with --config give a one-replica "
                                  "setup (the file's [fleet] table makes the fleet)")
            base = apply_setup(base, args.policy)
        table = load_fleet_toml(args.config, base)
        label = f"{args.policy or base.order.policy} ({args.config.name})"
        return label, table if table is not None else base
    name = args.policy or "fcfs"
    setup = get_setup(name)
    names = args.tenants or ["adv"] + [v.name for v in DEFAULT_VICTIMS]
    adv = set(args.adversaries or (["adv"] if "adv" in names else []))
    unknown = sorted(adv - set(names))
    if unknown:
        raise ConfigError("--adversaries", unknown[0], f"is not one of the tenants ({', '.join(names)})")
    roles = [(n, "adversary" if n in adv else "victim") for n in names]
    return name, build_fleet(name, roles) if setup.fleet is not None else build_config(name, roles)


def run(args: argparse.Namespace) -> int:
    from tenantry.adversaries.outdir import Interrupted, check_output_file
    from tenantry.live import INSTALL_HINT, MissingExtra, require_extra
    from tenantry.model.routers import FleetConfig

    try:
        require_extra()
    except MissingExtra:
        print(f"tenantry serve: {INSTALL_HINT}", file=sys.stderr)
        return 2
    import asyncio

    from tenantry.live.engine import Engine
    from tenantry.live.server import App, bind, serve
    from tenantry.live.wire import DEFAULT_VOCAB, WireOptions
    from tenantry.runner.history import write_history

    if args.history is not None:
        check_output_file(args.history, "--history", inputs=[args.config])
    label, system = _system(args)
    fleet = isinstance(system, FleetConfig)
    config = system.replicas[0] if fleet else system
    lo, hi = args.vocab or DEFAULT_VOCAB
    opts = WireOptions(model=args.model, block_size_tokens=config.block_size_tokens, vocab_lo=lo, vocab_hi=hi,
                       tenant_header=args.tenant_header)
    engine = Engine(system, time_scale=args.time_scale, record=args.history is not None)
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise ConfigError("--port", args.port, f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    host, bound = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    what = f"{len(system.replicas)} replicas" if fleet else "1 replica"
    tenants = ", ".join(t.name for t in config.tenants)

    def ready() -> None:
        print(f"tenantry serve: {label}, {what}, tenants {tenants}; time scale {args.time_scale:g}; "
              f"http://{shown}:{bound}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)

    try:
        asyncio.run(serve(App(engine, opts, args.model), sock, on_ready=ready))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    lag = f"; the model's clock fell behind the wall clock by up to {engine.max_lag_s:.3g} s" \
        if engine.max_lag_s > 0.05 * args.time_scale else ""
    kept = "nothing was being written"
    if args.history is not None:
        write_history(engine.history({"policy": label}), args.history)
        kept = f"kept: history {args.history}"
    raise Interrupted(f"after serving {engine.served} requests{lag}", kept)
