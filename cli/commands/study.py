"""``tenantry study NAME``: answer one of the seed documents' open questions with the model.

Runs the study (:mod:`tenantry.studies`), writes a report folder
(``--out``, default ``study-<name>/``; replaced only when it is a tenantry
study report, never by a quick run over a full one: see
:mod:`tenantry.adversaries.outdir`) with ``report.md``, one CSV per table and
one PNG per plot, and prints the headline table and the answer.  ``--quick``
runs a smaller version of the same study (for tests and a first look).
Deterministic for ``--seed``.  Exit status 0, or 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tenantry.studies import STUDIES, get_study, write_study

from .args import non_negative_int

HELP = ("Run a study (seed-001, accounting-cost, thrash, batch-size, abuse): a report folder with tables (CSV), "
        "plots (PNG) and the answer.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``study`` subcommand's flags."""
    parser.add_argument("name", metavar="NAME", help="the study: " + "; ".join(
        f"{s.name}: {s.question}" for s in STUDIES.values()))
    parser.add_argument("--quick", action="store_true", help="a smaller version of the study (seconds)")
    parser.add_argument("--seed", type=non_negative_int, default=None,
                        help="the study's seed (default: the study's own, 9 for seed-001, 0 for abuse)")
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="abuse: a tenantry check report folder (or its matrix.json) instead of running a "
                             "matrix; thrash: a BurstGPT CSV as a third workload; batch-size: a replica TOML")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default study-NAME)")


def run(args: argparse.Namespace) -> int:
    """Run the study named on the command line and write its report."""
    from tenantry.adversaries.outdir import report_folder

    study = get_study(args.name)  # an unknown name is one line before any work
    out = args.out or Path(f"study-{study.name}")
    kw = {} if args.seed is None else {"seed": args.seed}
    with report_folder(out, "study", default=args.out is None, size=0 if args.quick else 1, unit="study",
                       inputs=[args.source]) as tmp:
        result = study.run(quick=args.quick, source=args.source, log=lambda s: print(f"study: {s}", file=sys.stderr),
                           **kw)
        command = " ".join(["tenantry study", study.name] + (["--quick"] if args.quick else [])
                           + ([f"--seed {args.seed}"] if args.seed is not None else [])
                           + ([f"--from {shlex.quote(str(args.source))}"] if args.source else [])
                           + ([f"--out {shlex.quote(str(args.out))}"] if args.out else []))
        write_study(result, tmp, command=command)
    print(result.headline.text())
    print()
    print(result.answer)
    print(f"report: {out / 'report.md'}")
    return 0
