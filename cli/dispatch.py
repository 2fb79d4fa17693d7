"""The ``tenantry`` command line.

Each subcommand is a module of :mod:`tenantry.cli.commands` that defines ``HELP``
(one line), ``add_arguments(parser)`` and ``run(args) -> int`` (the exit code):
argument parsing and printing only; what it runs lives in the package below it
(SPEC.md 10).  This file only dispatches, so adding a command never touches
the others.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys

from tenantry.model.config import ConfigError

#: subcommand -> module that implements it.
COMMANDS = {
    "simulate": "tenantry.cli.commands.simulate",
    "check": "tenantry.cli.commands.check",
    "prove": "tenantry.cli.commands.prove",
    "verify": "tenantry.cli.commands.verify",
    "study": "tenantry.cli.commands.study",
    "replay": "tenantry.cli.commands.replay",
    "serve": "tenantry.cli.commands.serve",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error printed as one line (``tenantry check: error: ... (see --help)``), exit 2."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = OneLineParser(
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


#: Exit status on a signal: 128 + its number (SIGINT 130, SIGTERM 143), as a shell reports it.
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tenantry`` console script; returns the exit code.

    Bad input (a configuration, a workload, a flag value, an unreadable input
    or unwritable output path, an output folder it may not replace) prints one
    line ``tenantry: error: ...`` naming the file, line or field and exits with
    2.  Ctrl-C (SIGINT) and SIGTERM stop the command, its worker processes
    included, print one line saying what was kept, and exit with 130 and 143.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    from tenantry.adversaries.outdir import catch_stop_signals

    old, got = catch_stop_signals()  # SIGINT, SIGTERM: KeyboardInterrupt in the main thread
    try:
        return int(args._run(args) or 0)
    except ConfigError as e:
        print(f"tenantry: error: {e}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as e:
        print(f"tenantry: error: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout closed by its reader (`tenantry simulate | head`): stop quietly, as cat does
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        except (OSError, ValueError):
            pass
        return 141  # 128 + SIGPIPE, what a shell reports for a program stopped by a closed pipe
    except OSError as e:  # unreadable input or unwritable output: name the path, and what was kept
        print(f"tenantry: error: {_os_error(e, argv)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        return _interrupted(e, old, got, argv)
    except Exception as e:
        if got:  # a signal surfacing as another exception (ctypes wraps one raised in a call into Z3)
            return _interrupted(e, old, got, argv)
        raise
    finally:
        from tenantry.adversaries.outdir import restore_signals

        restore_signals(old, got)  # and clears STOP_REQUESTED; hands a stop on to an outer handler


def _os_error(e: OSError, argv: list[str] | None) -> str:
    """The one line of an OSError: ``cannot write PATH: No space left on device; <what was kept>``
    for a write (:class:`~tenantry.runner.files.WriteError`), ``PATH: <reason>`` otherwise, and
    the command that finishes the run when its finished cells were kept."""
    from tenantry.runner.files import WriteError

    where = e.filename if e.filename is not None else ""
    head = f"cannot write {where}" if isinstance(e, WriteError) else where
    kept = getattr(e, "kept", "")
    return (f"{head}: {e.strerror or e}" + (f"; {kept}" if kept else "")
            + (f"; to finish the run: {resume_command(argv)}" if getattr(e, "resumable", False) else ""))


def resume_command(argv: list[str] | None) -> str:
    """The command line that finishes an interrupted run: this one with ``--resume``."""
    import shlex

    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["tenantry", *args, *([] if "--resume" in args else ["--resume"])])


def _interrupted(e: BaseException, old: dict, got: list[int], argv: list[str] | None = None) -> int:
    """Print the one line of a stop by SIGINT / SIGTERM (what was kept) and return its exit status."""
    for s in old:  # a second signal while the line is printed changes nothing
        signal.signal(s, signal.SIG_IGN)
    signum = got[0] if got else signal.SIGINT
    word = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    detail, kept = getattr(e, "detail", ""), getattr(e, "kept", "")
    print(f"tenantry: {word}{' ' + detail if detail else ''}; "
          f"{kept or 'nothing was being written'}"
          + (f"; to finish the run: {resume_command(argv)}" if getattr(e, "resumable", False) else ""),
          file=sys.stderr)
    return SIGNAL_EXIT.get(signum, 130)


if __name__ == "__main__":
    sys.exit(main())
