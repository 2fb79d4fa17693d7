"""ROUTE-LOAD-BOUND (SPEC.md 8.15): prefix affinity with its load bound never sends a
request to a replica that would then hold more than ``B = ceil(c * (m + 1) / R)``
outstanding requests, for any number R of replicas and any loads, because some
replica is always within the bound (the router is total): for c >= 1 the
least-loaded replica is.

Encoding (``model/fleet.py``, :func:`~tenantry.model.fleet.route_prefix_affinity`,
:func:`~tenantry.model.fleet.load_bound`): loads ``L[r] >= 0`` over a symbolic
replica domain, prefix sums ``P[0] = 0``, ``P[k + 1] = P[k] + L[k]``, ``m = P[R]``,
and B the ceiling, ``B * R >= c * (m + 1) > (B - 1) * R``.  The totality is by
induction on k over ``P[k] >= k * B`` when every replica is full (``L[r] >= B``):
base, step, and the conclusion ``m < R * B`` (``R * B >= c * (m + 1) >= m + 1``),
each an obligation.  The routing obligation: the replica chosen among the eligible ones
(``L[r] + 1 <= B``, longest cached prefix first) keeps the bound.

Twin ``no-load-bound``: the router follows the longest cached prefix alone
(mutant ``affinity_unbounded``).  Z3 finds R, c and a load m of the replica that
holds the prefix; the replay sends m + 1 requests of one prefix, one per step,
to a fleet of R replicas with that load factor, and the fleet check
(:func:`tenantry.spec.invariants_fleet.h_load_bound`) must fail on the mutant's
history and hold on the model's.
"""

from __future__ import annotations

from fractions import Fraction

import z3
from z3 import And, Int, Real

from .core import Domain, Proof, Replay, Twin, implies_all, int_array, val

FAMILY = "fleet"


def ceil_bound(b: z3.ArithRef, c: z3.ArithRef, m: z3.ArithRef, r: z3.ArithRef) -> z3.BoolRef:
    """``b = ceil(c * (m + 1) / r)`` for r >= 1 (:func:`tenantry.model.fleet.load_bound`)."""
    return And(b * r >= c * (m + 1), (b - 1) * r < c * (m + 1))


def obligations() -> list[tuple[str, z3.BoolRef]]:
    dom = Domain("R")
    L, P, H = int_array("load"), int_array("prefix"), int_array("cached")
    c, b, m, k, ch = Real("c"), Int("B"), Int("m"), Int("k"), Int("chosen")
    rsize = dom.size
    out = []
    # Totality, by induction on k: when every replica is full (L[r] >= B), P[k] >= k * B.
    out.append(("full-base", implies_all([P[0] == 0], P[0] >= 0 * b)))
    out.append(("full-step", implies_all(
        [k >= 0, b >= 0, P[k] >= k * b, L[k] >= b, P[k + 1] == P[k] + L[k]], P[k + 1] >= (k + 1) * b)))
    # Conclusion: m = P[R] < R * B, so P[R] >= R * B (every replica full) cannot hold.
    out.append(("full-impossible", implies_all([rsize >= 1, c >= 1, m >= 0, ceil_bound(b, c, m, rsize)],
                                               m < rsize * b)))
    # Routing: the chosen replica is eligible and caches the longest prefix among the eligible ones.
    eligible = lambda r: L[r] + 1 <= b
    out.append(("route-within-bound", implies_all(
        [rsize >= 1, dom.has(ch), eligible(ch), dom.forall(lambda r: z3.Implies(eligible(r), H[r] <= H[ch]))],
        L[ch] + 1 <= b)))
    return out


def twin_formula() -> tuple[z3.BoolRef, dict]:
    """The router without the bound follows the replica holding the prefix (the only one
    with a cached prefix and the only one loaded), and that replica ends above B."""
    rsize, c, b, m = Int("R"), Real("c"), Int("B"), Int("m")
    f = And(rsize >= 2, rsize <= 8, c >= 1, c <= 2, m >= 0, m <= 40, ceil_bound(b, c, m, rsize), m + 1 > b)
    return f, {"R": rsize, "c": c, "m": m, "B": b}


def twin_replay(model: z3.ModelRef, sym: dict) -> Replay:
    from tenantry.model.fleet import FleetConfig, simulate_fleet
    from tenantry.model.workload import Request
    from tenantry.spec.invariants_fleet import _read, h_load_bound
    from tenantry.testing.mutants import AffinityUnbounded, _fleet_replica

    n, c, m = val(model, sym["R"]), Fraction(val(model, sym["c"])), val(model, sym["m"])
    fc = FleetConfig((_fleet_replica(prefix_cache="shared"),) * n, router="prefix_affinity", load_factor=float(c))
    wl = [Request(i, "abc"[i % 3], i * 0.01, 160, 200, prefix_ids=tuple(range(8))) for i in range(m + 1)]
    bad = h_load_bound(_read(simulate_fleet(fc, wl, variant=AffinityUnbounded)))
    good = h_load_bound(_read(simulate_fleet(fc, wl)))
    facts = {"replicas": n, "load_factor": c, "load": m, "bound": val(model, sym["B"])}
    ok = bool(bad) and not good
    detail = (f"{n} replicas, load factor {float(c):g}, {m + 1} requests of one prefix: "
              + (bad[0].render() if bad else "no finding on the unbounded router")
              + ("" if not good else f"; but the model breaks it too: {good[0].render()}"))
    return Replay(ok, detail, facts)


def limit_formula() -> tuple[z3.BoolRef, dict]:
    """With c < 1 every replica can be full: R replicas of q outstanding requests each, q + 1 > B."""
    rsize, c, b, q = Int("R"), Real("c"), Int("B"), Int("q")
    f = And(rsize >= 1, rsize <= 8, c > 0, c < 1, q >= 0, q <= 10, ceil_bound(b, c, rsize * q, rsize), q + 1 > b)
    return f, {"R": rsize, "c": c, "q": q}


def limit_replay(model: z3.ModelRef, sym: dict) -> Replay:
    from tenantry.model.fleet import RouteView, load_bound, route_prefix_affinity
    from tenantry.model.workload import Request

    n, c, q = val(model, sym["R"]), Fraction(val(model, sym["c"])), val(model, sym["q"])
    view = RouteView(request=Request(0, "a", 0.0, 16, 1), tenant="a", outstanding=(q,) * n, used_blocks=(0,) * n,
                     num_blocks=(1,) * n, cached_blocks=(0,) * n, rr_next=0, bound=load_bound(float(c), n * q, n),
                     subset=())
    facts = {"replicas": n, "load_factor": c, "load": q, "bound": view.bound}
    try:
        r = route_prefix_affinity(view)
    except ValueError as e:
        return Replay(True, f"{n} replicas of {q} outstanding, load factor {float(c):g}: bound {view.bound}, no replica "
                      f"eligible, the router fails ({e}); FleetConfig refuses load_factor < 1", facts)
    return Replay(False, f"the router chose replica {r}", facts)


PROOFS = (
    Proof("ROUTE-LOAD-BOUND", FAMILY, "prefix affinity keeps every receiving replica within ceil(c (m+1) / R) "
          "outstanding requests, and always has a replica to route to", "any R (replicas), any loads",
          obligations,
          (Twin("no-load-bound", "the load bound (route to the longest cached prefix alone)", twin_formula,
                twin_replay, scope="run of m + 1 routings"),
           Twin("load-factor-below-1", "c >= 1", limit_formula, limit_replay, kind="limit", scope="one routing")),
          ("c >= 1 (FleetConfig.load_factor)", "loads are the replicas' outstanding requests, integers >= 0")),
)
