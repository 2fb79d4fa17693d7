"""The ``tenantry`` command line.

Each subcommand is a module of :mod:`tenantry.commands` that defines ``HELP``
(one line), ``add_arguments(parser)`` and ``run(args) -> int`` (the exit code):
argument parsing and printing only; what it runs lives in the package below it
(SPEC.md 10).  This file only dispatches, so adding a command never touches
the others.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from tenantry.model.config import ConfigError

#: subcommand -> module that implements it.
COMMANDS = {
    "simulate": "tenantry.commands.simulate",
    "check": "tenantry.commands.check",
    "prove": "tenantry.commands.prove",
    "verify": "tenantry.commands.verify",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="tenantry",
        description="Reference model, invariants, proofs and adversaries for multi-tenant LLM inference schedulers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(modname)  # every command is part of tenantry: a missing one is a broken install
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tenantry`` console script; returns the exit code.

    Bad input (a configuration, a workload, a flag value, an unreadable input
    or unwritable output path) prints one line ``tenantry: error: ...``
    naming the file, line or field and exits with 2; Ctrl-C exits with 130.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except ConfigError as e:
        print(f"tenantry: error: {e}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as e:
        print(f"tenantry: error: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})", file=sys.stderr)
        return 2
    except OSError as e:  # unreadable input or unwritable output: name the path
        where = e.filename if e.filename is not None else ""
        print(f"tenantry: error: {where}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tenantry: interrupted; every file and report folder is replaced whole or left as it was", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
