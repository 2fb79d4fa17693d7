"""``tenantry prove``: run every Z3 proof and its refuted twins (SPEC.md section 8).

Prints one row per proof and per twin: id, result, seconds, scope, the claim
in one line (for a twin: the mechanism removed).  A twin's result is
``refuted`` only when Z3 found a counterexample *and* it replayed on the
Python model; the row says ``refuted, no replay`` otherwise.  A last row
gives the VTC gap reached by a concrete workload as a fraction of the proven
bound.  Exit status 1 when a proof is not proved, a twin is not refuted or
does not replay, or the VTC workload reaches less than half the bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .args import positive_float
from tenantry.proofs.core import TIMEOUT_MS, Outcome, run_all
from tenantry.proofs.registry import FAMILIES, select

HELP = "Prove the invariants with Z3 for any number of tenants, and refute each twin with its mechanism removed."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``prove`` subcommand's flags."""
    parser.add_argument("ids", nargs="*", metavar="ID",
                        help="proof ids or families to run (default: all), e.g. VTC-GAP drr kv; families: "
                             + ", ".join(FAMILIES))
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--no-twins", action="store_true", help="run the proofs only, not their twins")
    parser.add_argument("--timeout-s", type=positive_float, default=TIMEOUT_MS / 1000,
                        help="per-query solver timeout in seconds (default %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each twin's replay under its row")


def _result(o: Outcome) -> str:
    if o.kind == "proof" or o.verdict != "refuted":
        return o.verdict
    return "refuted" if o.replayed else "refuted, no replay"


def _table(outcomes: list[Outcome], tight, verbose: bool) -> str:
    rows = [("id", "result", "seconds", "scope", "claim")]
    for o in outcomes:
        mark = "" if o.ok else "  <-- FAILED" + (f": {o.reason}" if o.reason else "")
        rows.append((o.id, _result(o), f"{o.seconds:.3f}", o.scope, o.claim + mark))
        if verbose and o.kind != "proof":
            rows.append(("", "", "", "", "  replay: " + (o.replay or o.reason)))
    if tight is not None:
        rows.append(("VTC-GAP@workload", f"{tight.fraction:.3f}", "", f"T={tight.config.max_context_tokens}",
                     f"a concrete workload reaches a service gap of {tight.gap:g} = {tight.fraction:.3f} of the "
                     f"proven 2D = {tight.bound:g} ({tight.gap / tight.u:.2f} D)"))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = ["  ".join(r[c].ljust(widths[c]) for c in range(4)) + "  " + r[4] for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def run(args: argparse.Namespace) -> int:
    """Run the selected proofs; print the table or JSON; return the exit status."""
    try:
        proofs = select(args.ids or None)
    except KeyError as e:
        print(f"tenantry: error: {e.args[0]}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    outcomes = run_all(proofs, twins=not args.no_twins, timeout_ms=int(args.timeout_s * 1000))
    tight = None
    if any(p.id == "VTC-GAP" for p in proofs):
        from tenantry.proofs.tight import measure
        tight = measure()
    total = time.perf_counter() - t0
    ok = all(o.ok for o in outcomes) and (tight is None or tight.fraction >= 0.5)
    if args.json:
        doc = {"ok": ok, "seconds": round(total, 3), "outcomes": [o.as_dict() for o in outcomes]}
        if tight is not None:
            doc["vtc_workload"] = {"gap": tight.gap, "bound": tight.bound, "D": tight.u, "fraction": tight.fraction,
                                   "steps": list(tight.steps), "max_context_tokens": tight.config.max_context_tokens,
                                   "requests": [[r.request_id, r.tenant, r.prompt_tokens, r.output_tokens]
                                                for r in tight.workload]}
        print(json.dumps(doc, indent=2))
    else:
        print(_table(outcomes, tight, args.verbose))
        n_p = sum(o.kind == "proof" for o in outcomes)
        n_ok = sum(o.ok for o in outcomes if o.kind == "proof")
        n_t = sum(o.kind == "twin" for o in outcomes)
        n_r = sum(o.ok for o in outcomes if o.kind == "twin")
        n_l = sum(o.kind == "limit" for o in outcomes)
        n_lr = sum(o.ok for o in outcomes if o.kind == "limit")
        limits = f" and {n_lr}/{n_l} limits" if n_l else ""
        print(f"\n{n_ok}/{n_p} proved, {n_r}/{n_t} twins{limits} refuted and replayed, {total:.1f} s"
              + ("" if ok else "  -- FAILED"))
    return 0 if ok else 1
