"""Python-side checks that a replayed counterexample must fail (SPEC.md 8.1).

Two sources, both run when available:

* the invariant catalog (:mod:`tenantry.spec.invariants`, SPEC.md 7), judged
  against the *reference* configuration, the one with the mechanism on: a twin
  runs the model with the mechanism removed, and the catalog says whether what
  happened is allowed where the mechanism is claimed;
* a local predicate stating exactly the proof's claim (these need no catalog).

Each check returns a list of one-line messages, empty when the run is legal.
"""

from __future__ import annotations

from typing import Callable, Iterable

from tenantry.model.config import Config
from tenantry.model.state import State

from .concrete import Transition

EPS = 1e-6


def catalog_state(inv_id: str, ref: Config, transitions: Iterable[Transition]) -> list[str] | None:
    """Findings of the catalog's state form of ``inv_id`` on each transition,
    judged with configuration ``ref`` (its ``applies`` is not consulted: the
    twin's run is judged as if the mechanism were claimed).  None when the
    catalog or the form is missing."""
    try:
        from tenantry.spec.invariants import INVARIANTS
        from tenantry.spec.invariants_state import StepContext
    except ImportError:
        return None
    inv = INVARIANTS.get(inv_id)
    if inv is None or inv.check_state is None:
        return None
    out: list[str] = []
    for tr in transitions:
        out += [str(f) for f in inv.check_state(StepContext(ref, tr.prev, tr.inputs, tr.state, tr.output))]
    return out


def catalog_history(inv_id: str, ref: Config, history) -> list[str] | None:
    """Findings of the catalog's history form of ``inv_id`` on ``history`` judged
    with configuration ``ref``; None when unavailable."""
    try:
        from tenantry.spec.invariants import INVARIANTS
        from tenantry.spec.invariants_history import HistoryContext
    except ImportError:
        return None
    inv = INVARIANTS.get(inv_id)
    if inv is None or inv.check_history is None:
        return None
    return [str(f) for f in inv.check_history(HistoryContext(history, ref))]


def verdict(local: list[str], catalog: list[str] | None, what: str) -> tuple[bool, str]:
    """Combine a local and a catalog check: the replay counts when the local
    check fails and the catalog (if present) fails too.  Returns (replayed, detail)."""
    if not local:
        return False, f"{what}: the local check found nothing"
    if catalog is not None and not catalog:
        return False, f"{what}: local check fails ({local[0]}) but the catalog finds nothing"
    tail = f"; catalog: {catalog[0]}" if catalog else "; catalog: not claimed here or unavailable"
    return True, f"{what}: {local[0]}{tail}"


# --- local predicates (each the proof's claim, stated on concrete states) ---------------


def vtc_spread(config: Config, state: State, bound: float) -> list[str]:
    """VTC-GAP state form: for backlogged f, g: counter_f - counter_g <= bound / w_f."""
    ts = state.tenants
    b = [i for i, t in enumerate(ts) if t.queue]
    out = []
    for f in b:
        for g in b:
            gap, allowed = ts[f].counter - ts[g].counter, bound / config.tenants[f].weight
            if gap > allowed + EPS:
                out.append(f"backlogged {config.tenants[f].name}'s counter is {gap:g} above "
                           f"{config.tenants[g].name}'s, more than D/w = {allowed:g}")
    return out


def no_banked_credit(config: Config, tr: Transition) -> list[str]:
    """NO-BANKED-CREDIT (VTC): a tenant backlogged after the step but not before
    starts at least at the least counter of those backlogged before (or at the
    last leaver's counter when none was); counters only grow under ``vtc``."""
    prev, st = tr.prev, tr.state
    before = [j for j, t in enumerate(prev.tenants) if t.queue]
    out = []
    for i, t in enumerate(st.tenants):
        if not t.queue or i in before:
            continue
        others = [prev.tenants[j].counter for j in before if j != i]
        lo = min(others) if others else prev.last_left_counter
        if t.counter < lo - EPS:
            out.append(f"{config.tenants[i].name} became backlogged at counter {t.counter:g}, below the least "
                       f"backlogged counter {lo:g}")
    return out


def first_failure(checks: Iterable[Callable[[], list[str]]]) -> list[str]:
    """Run checks in order and return the first non-empty result."""
    for c in checks:
        r = c()
        if r:
            return r
    return []
