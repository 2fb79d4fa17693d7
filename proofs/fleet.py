"""The fleet's proofs (SPEC.md 8.15): ROUTE-LOAD-BOUND, for any number of replicas, and
FLEET-VTC-GAP, for any number of tenants and replicas (its encoding is below
:func:`fleet_step`; the invariant :func:`gap_invariant`; twin ``per-replica``;
limit ``pool-refused``, H1 dropped: one replica whose pool refuses a head breaks
the spread, which is why the catalog claims it only with ample KV on every replica).

ROUTE-LOAD-BOUND: prefix affinity with its load bound never sends a
request to a replica that would then hold more than ``B = ceil(c * (m + 1) / R)``
outstanding requests, for any number R of replicas and any loads, because some
replica is always within the bound (the router is total): for c >= 1 the
least-loaded replica is.

Encoding (``runner/fleet.py``, :func:`~tenantry.model.routers.route_prefix_affinity`,
:func:`~tenantry.model.routers.load_bound`): loads ``L[r] >= 0`` over a symbolic
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
from typing import Any

import z3
from z3 import And, Int, Real, ToReal

from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array, real_array, val, zmax

FAMILY = "fleet"


def ceil_bound(b: z3.ArithRef, c: z3.ArithRef, m: z3.ArithRef, r: z3.ArithRef) -> z3.BoolRef:
    """``b = ceil(c * (m + 1) / r)`` for r >= 1 (:func:`tenantry.model.routers.load_bound`)."""
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
    from tenantry.model.routers import FleetConfig
    from tenantry.runner.fleet import simulate_fleet
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
    from tenantry.model.routers import RouteView, load_bound, route_prefix_affinity
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


# --- FLEET-VTC-GAP (SPEC.md 7.9, 8.15) ---------------------------------------------------------------------------
#
# State after fleet step k - 1, over a tenant domain (N) and a replica domain (R), both symbolic:
#   c[f]      the fleet counter (FleetStepRecord.counters),
#   G[f]      what f's running sequences on every replica still owe its counter (a ghost:
#             w_out / w_f per output token to go, summed over the replicas; spec.invariants_core.owed),
#   q[r][g]   g queued on replica r,
#   sn[r][g]  the first fleet step of g's current queued run on r,
#   lp[f]     the fleet step of f's last pick (-1: none); P[f][r]: f was picked on r in that step,
#   ll        the fleet's last-left counter, k the next fleet step's index.
# sn, lp and P are the spread's relation, kept as spec.invariants_fleet.SpreadRelation keeps it.


def arr2(name: str, sort: z3.SortRef) -> z3.ArrayRef:
    """A symbolic two-index array ``a[x][y]`` (replica x tenant, or tenant x replica)."""
    return z3.Array(name, z3.IntSort(), z3.ArraySort(z3.IntSort(), sort))


def fstate(tag: str) -> dict:
    """Fresh symbolic fleet state named after ``tag``."""
    return {"c": real_array(f"c_{tag}"), "G": real_array(f"G_{tag}"), "q": arr2(f"q_{tag}", z3.BoolSort()),
            "sn": arr2(f"sn_{tag}", z3.IntSort()), "lp": int_array(f"lp_{tag}"), "P": arr2(f"P_{tag}", z3.BoolSort()),
            "ll": Real(f"ll_{tag}"), "k": Int(f"k_{tag}")}


def related(s: dict, f: Any, g: Any, r: Any) -> z3.BoolRef:
    """The pairs FLEET-VTC-GAP's spread ranges over: f's last pick (fleet step lp[f]) was on
    replica r, and g has been queued on r at the end of every fleet step since then."""
    return And(f != g, s["lp"][f] >= 0, s["P"][f][r], s["q"][r][g], s["sn"][r][g] <= s["lp"][f])


def gap_invariant(dt: Domain, dr: Domain, s: dict, U: z3.ArrayRef) -> z3.BoolRef:
    """FLEET-VTC-GAP's inductive invariant: for every related (f, g, r),
    ``c[f] + G[f] <= c[g] + U[f]`` (U[f] = D_F / w_f); ``0 <= G[f] <= U[f]``; picks are
    of past steps.  With G >= 0 it gives the checked spread ``c[f] - c[g] <= D_F / w_f``."""
    c, G = s["c"], s["G"]
    spread = dr.forall(lambda r: dt.forall(lambda f, g: z3.Implies(related(s, f, g, r), c[f] + G[f] <= c[g] + U[f]),
                                           arity=2))
    owed = dt.forall(lambda f: And(G[f] >= 0, G[f] <= U[f], s["lp"][f] < s["k"], s["lp"][f] >= -1))
    return And(spread, owed, s["k"] >= 0)


def fleet_step(dt: Domain, dr: Domain, s: dict, U: z3.ArrayRef, tag: str, shared: bool = True,
               plant: str | None = None, ample: bool = True) -> tuple[z3.BoolRef, dict, dict]:
    """One fleet step (``Fleet.step``, SPEC.md 5.3) over the fleet state ``s``.

    Parameters (per tenant i, replica r): ``A[i]`` an arrival of i in this step, ``Q[i]`` / ``Q2[i]``
    i queued on some replica at the step's start / end, ``D[r][i] >= 0`` r's charges to i over
    w_i, ``dt[i]`` their sum over the replicas, ``pk[r][i]`` i picked on r (a ``scheduled``
    event), ``pa[i]`` picked anywhere, ``q2`` the queues at the end, ``G2`` the owed at the end.

    1. Lift (the fleet's, ``Fleet._lift``): ``c0[i] = max(c[i], lo)`` for i with an arrival and
       nothing queued anywhere; lo the least counter of the tenants queued somewhere, or ll.
    2. Replica steps: every replica reads c0.  H1 per replica (ample KV): a tenant f picked on r had
       the least counter r saw, c0 plus r's own charges so far, among the tenants queued on r;
       one queued on r at the step's end was queued throughout r's waiting phase; so
       ``c0[f] <= c0[g] + D[r][g]``.  With ``shared=False`` (the refuted twin, per-replica
       accounting) r reads its own counters ``cr0[r]`` instead, by the same rule, and c is the
       fleet service ``sum_r S^r / w`` (no fleet lift): what the spread is asked of there.
       With ``ample=False`` (the limit ``pool-refused``, H1 dropped) the rule holds only against
       the tenants g whose head fits on r (``fit[r][g]``): one whose head r's pool refuses is
       passed over whatever its counter, as the model does (SPEC.md 4.3).
    3. Charges: ``c'[i] = c0[i] + dt[i]``.  The sum lemmas (:func:`sum_obligations`) turn the
       replicas' facts into the fleet's: ``D[r][i] <= dt[i]``; H2 per replica, ``D[r][i] +
       G2_r[i] <= D_r / w_i`` (the sequences of i charged on r in a step are all in r's batch
       after its waiting phase: at most M_r tokens, charged at most max(w_in, w_out) each), gives
       ``dt[i] + G2[i] <= U[i]``; a tenant picked nowhere is charged only what it owed:
       ``dt[i] + G2[i] <= G[i]``.
    4. The relation (``SpreadRelation.advance``): a run on r starts at k when g is queued on r at
       the end of k and was not at the end of k - 1; a tenant picked in k has ``lp = k`` and ``P``
       the replicas it was picked on.  ll: the largest new counter of the tenants that left the
       fleet's backlog in this step, if any.

    ``plant`` names an encoding error for the encoding tests to catch (tests/test_proofs_encoding_fleet.py):
    ``picks_accumulate`` (P keeps the replicas of earlier picks), ``unweighted`` (charges not over w).

    Returns (guard, post-state, parameters).
    """
    c, G, q, sn, lp, P, ll, k = (s[x] for x in ("c", "G", "q", "sn", "lp", "P", "ll", "k"))
    p = {"A": bool_array(f"A_{tag}"), "Q": bool_array(f"Q_{tag}"), "Q2": bool_array(f"Q2_{tag}"),
         "D": arr2(f"D_{tag}", z3.RealSort()), "dt": real_array(f"dt_{tag}"), "pk": arr2(f"pk_{tag}", z3.BoolSort()),
         "pa": bool_array(f"pa_{tag}"), "q2": arr2(f"q2_{tag}", z3.BoolSort()), "G2": real_array(f"G2_{tag}"),
         "w": Int(f"w_{tag}"), "lo": Real(f"lo_{tag}"), "other": z3.Bool(f"o_{tag}"), "m": Int(f"m_{tag}"),
         "left": z3.Bool(f"left_{tag}"), "ll2": Real(f"ll2_{tag}"), "wt": real_array(f"wt_{tag}"),
         "cr0": arr2(f"cr0_{tag}", z3.RealSort()), "fit": arr2(f"fit_{tag}", z3.BoolSort())}
    A, Q, Q2, D, dsum, pk, pa, q2, G2 = (p[x] for x in ("A", "Q", "Q2", "D", "dt", "pk", "pa", "q2", "G2"))
    i_ = Int(f"i_{tag}")
    guard = []
    # backlogs: queued somewhere, at the start and at the end
    for qq, QQ in ((q, Q), (q2, Q2)):
        guard.append(dr.forall(lambda r: dt.forall(lambda i: z3.Implies(qq[r][i], QQ[i]))))
        guard.append(dt.forall(lambda i: z3.Implies(QQ[i], dr.exists(lambda r: qq[r][i]))))
    # 1. the lift's level: the least counter queued somewhere (witness w), else ll
    least = And(dt.has(p["w"]), Q[p["w"]], p["lo"] == c[p["w"]],
                dt.forall(lambda j: z3.Implies(Q[j], c[p["w"]] <= c[j])))
    alone = And(dt.forall(lambda j: z3.Not(Q[j])), p["lo"] == ll)
    guard.append(z3.If(p["other"], least, alone))
    if shared:
        c0 = z3.Lambda([i_], z3.If(And(A[i_], z3.Not(Q[i_])), zmax(c[i_], p["lo"]), c[i_]))
    else:  # per-replica accounting: no fleet lift; c is the fleet service, sum_r S^r / w
        c0 = c
    # 2. picks: by the counters the replica read (H1 per replica)
    guard.append(dt.forall(lambda i: pa[i] == dr.exists(lambda r: pk[r][i])))
    against = (lambda r, g: q2[r][g]) if ample else (lambda r, g: And(q2[r][g], p["fit"][r][g]))  # noqa: E731
    if shared:
        pick = lambda r, f, g: z3.Implies(And(pk[r][f], against(r, g)), c0[f] <= c0[g] + D[r][g])  # noqa: E731
    else:
        cr0 = p["cr0"]
        pick = lambda r, f, g: z3.Implies(And(pk[r][f], against(r, g)), cr0[r][f] <= cr0[r][g] + D[r][g])  # noqa: E731
    guard.append(dr.forall(lambda r: dt.forall(lambda f, g: pick(r, f, g), arity=2)))
    # 3. charges, and the replicas' facts summed (the sum lemmas)
    guard.append(dr.forall(lambda r: dt.forall(lambda i: And(D[r][i] >= 0, D[r][i] <= dsum[i]))))
    guard.append(dt.forall(lambda i: And(G2[i] >= 0, dsum[i] >= 0, dsum[i] + G2[i] <= U[i],
                                         z3.Implies(z3.Not(pa[i]), dsum[i] + G2[i] <= G[i]))))
    charge = (lambda i: dsum[i] * p["wt"][i]) if plant == "unweighted" else (lambda i: dsum[i])  # noqa: E731
    c2 = z3.Lambda([i_], c0[i_] + charge(i_))
    # ll: the largest new counter among the tenants that left the fleet's backlog (witness m)
    lv = lambda i: And(Q[i], z3.Not(Q2[i]))  # noqa: E731
    guard.append(z3.If(p["left"],
                       And(dt.has(p["m"]), lv(p["m"]), p["ll2"] == c2[p["m"]],
                           dt.forall(lambda i: z3.Implies(lv(i), c2[i] <= c2[p["m"]]))),
                       And(dt.forall(lambda i: z3.Not(lv(i))), p["ll2"] == ll)))
    # 4. the relation
    r_, g_ = Int(f"r_{tag}"), Int(f"g_{tag}")
    sn2 = z3.Lambda([r_], z3.Lambda([g_], z3.If(q2[r_][g_], z3.If(q[r_][g_], sn[r_][g_], k), -1)))
    lp2 = z3.Lambda([i_], z3.If(pa[i_], k, lp[i_]))
    if plant == "picks_accumulate":
        P2 = z3.Lambda([i_], z3.Lambda([r_], z3.If(pa[i_], z3.Or(pk[r_][i_], P[i_][r_]), P[i_][r_])))
    else:
        P2 = z3.Lambda([i_], z3.Lambda([r_], z3.If(pa[i_], pk[r_][i_], P[i_][r_])))
    post = {"c": c2, "G": G2, "q": q2, "sn": sn2, "lp": lp2, "P": P2, "ll": p["ll2"], "k": k + 1}
    return And(*guard), post, {**p, "c0": c0}


def _fsetup(dt: Domain, dr: Domain, U: z3.ArrayRef) -> z3.BoolRef:
    return And(dt.size >= 1, dr.size >= 1, dt.forall(lambda f: U[f] >= 0))


def gap_fleet_obligations() -> list[tuple[str, z3.BoolRef]]:
    """Initiation, consecution of a fleet step (the spread at a free (f, g, r), the owed
    bound at a free f), the checked spread as a corollary, and the sum lemmas."""
    dt, dr, U = Domain("N"), Domain("R"), real_array("U")
    out = []
    s0 = fstate("init")
    init = And(s0["k"] == 0, s0["ll"] == 0,
               dt.forall(lambda f: And(s0["c"][f] == 0, s0["G"][f] == 0, s0["lp"][f] == -1)),
               dr.forall(lambda r: dt.forall(lambda g: z3.Not(s0["q"][r][g]))))
    out.append(("init", implies_all([_fsetup(dt, dr, U), init], gap_invariant(dt, dr, s0, U))))
    s = fstate("st")
    guard, post, _ = fleet_step(dt, dr, s, U, "st")
    hyps = [_fsetup(dt, dr, U), gap_invariant(dt, dr, s, U), guard]
    f, g, r = Int("f_st"), Int("g_st"), Int("r_st")
    pc, pG = post["c"], post["G"]
    out.append(("step-spread", implies_all(hyps + [dt.has(f), dt.has(g), dr.has(r), related(post, f, g, r)],
                                           pc[f] + pG[f] <= pc[g] + U[f])))
    out.append(("step-owed", implies_all(hyps + [dt.has(f)], And(pG[f] >= 0, pG[f] <= U[f], post["lp"][f] < post["k"],
                                                                  post["lp"][f] >= -1, post["k"] >= 0))))
    s1 = fstate("cor")
    out.append(("spread", implies_all([_fsetup(dt, dr, U), gap_invariant(dt, dr, s1, U), dt.has(f), dt.has(g),
                                       dr.has(r), related(s1, f, g, r)], s1["c"][f] - s1["c"][g] <= U[f])))
    return out + sum_obligations()


def sum_obligations() -> list[tuple[str, z3.BoolRef]]:
    """Two lemmas over the replica index, by induction on k, for any R: prefix sums
    ``S[0] = 0``, ``S[k + 1] = S[k] + a[k]``.  ``sum-le``: if ``a[r] <= b[r]`` for every r then
    ``Sa[k] <= Sb[k]`` (H2 and the no-pick rule summed over the replicas: a[r] = D[r][i] +
    G2_r[i], b[r] = D_r / w_i, so that Sb[R] = D_F / w_i, or b[r] = G_r[i]).  ``part``: if every
    ``a[r] >= 0`` then ``S[k] >= a[r0]`` once k > r0 (one replica's charge is at most the fleet's)."""
    a, b, Sa, Sb = real_array("a_sum"), real_array("b_sum"), real_array("Sa_sum"), real_array("Sb_sum")
    j, r0 = Int("j_sum"), Int("r0_sum")
    step = lambda S, x: S[j + 1] == S[j] + x[j]  # noqa: E731
    part = lambda kk: Sa[kk] >= z3.If(r0 < kk, a[r0], 0)  # noqa: E731
    return [
        ("sum-le-base", implies_all([Sa[0] == 0, Sb[0] == 0], Sa[0] <= Sb[0])),
        ("sum-le-step", implies_all([j >= 0, Sa[j] <= Sb[j], a[j] <= b[j], step(Sa, a), step(Sb, b)],
                                    Sa[j + 1] <= Sb[j + 1])),
        ("part-base", implies_all([Sa[0] == 0, r0 >= 0], part(0))),
        ("part-step", implies_all([j >= 0, r0 >= 0, a[j] >= 0, a[r0] >= 0, part(j), step(Sa, a)], part(j + 1))),
    ]


def _gap_twin_formula() -> tuple[z3.BoolRef, dict]:
    """Per-replica accounting (``shared=False``), 2 replicas, 2 unit-weight tenants, one batch
    slot each, w_in = 1, w_out = 2, requests of p prompt and o output tokens (charge u = p + 2 o,
    one request per o steps; T = p + o, so D_F = 2 * 2 * T).  Tenant 1 (g) is queued on replica 1
    only, tenant 0 (f) on both, both since fleet step 0 (so no lift ever applies to g, and the
    fleet service is what any counter of g would be).  Replica 1 alternates g, f, g, ... by its
    own counters while replica 0 serves f alone.  The pre-state is the end of fleet step
    (2 n - 1) o - 1: replica 0 has served f 2 n - 1 requests, replica 1 g n and f n - 1, nothing
    runs, f and g were last picked in fleet step (2 n - 2) o (f on replica 0, g on replica 1).
    In the step f is picked on both replicas (replica 1's own counters: (n - 1) u against n u),
    charged p + 2 on each (its prompt and first token), while g waits on replica 1.  The shape
    is one fleet step of the encoding from a state that keeps the invariant."""
    dt, dr = Domain("N", 2), Domain("R", 2)
    s = fstate("tw")
    n, pp, oo = Int("n_tw"), Int("p_tw"), Int("o_tw")
    u, t = ToReal(pp + 2 * oo), ToReal(pp + oo)
    U = z3.K(z3.IntSort(), 4 * t)
    guard, post, p = fleet_step(dt, dr, s, U, "tw", shared=False)
    q, q2, pk, cr0, D = s["q"], p["q2"], p["pk"], p["cr0"], p["D"]
    last = (2 * n - 2) * oo
    shape = And(n >= 1, n <= 6, pp >= 1, oo >= 1, pp + oo <= 8,
                s["c"][0] == ToReal(3 * n - 2) * u, s["c"][1] == ToReal(n) * u, s["G"][0] == 0, s["G"][1] == 0,
                q[0][0], z3.Not(q[0][1]), q[1][0], q[1][1], s["sn"][0][0] == 0, s["sn"][1][0] == 0, s["sn"][1][1] == 0,
                s["lp"][0] == last, s["lp"][1] == last, s["P"][0][0], z3.Not(s["P"][0][1]), s["P"][1][1],
                z3.Not(s["P"][1][0]), s["k"] == last + oo, s["ll"] == 0,
                dt.forall(lambda i: z3.Not(p["A"][i])),
                cr0[0][0] == ToReal(2 * n - 1) * u, cr0[0][1] == 0, cr0[1][0] == ToReal(n - 1) * u,
                cr0[1][1] == ToReal(n) * u,
                pk[0][0], pk[1][0], z3.Not(pk[0][1]), z3.Not(pk[1][1]),
                q2[0][0], z3.Not(q2[0][1]), z3.Not(q2[1][0]), q2[1][1],
                D[0][0] == ToReal(pp + 2), D[1][0] == ToReal(pp + 2), D[0][1] == 0, D[1][1] == 0,
                dt.forall(lambda i: p["dt"][i] == D[0][i] + D[1][i]))
    bad = And(related(post, 0, 1, 1), post["c"][0] - post["c"][1] > U[0])
    f = And(gap_invariant(dt, dr, s, U), guard, shape, bad)
    return f, {"n": n, "p": pp, "o": oo, "U": U[0], "k": s["k"], "pre": (s["c"][0], s["c"][1]),
               "gap": post["c"][0] - post["c"][1]}


def _gap_twin_replay(model: z3.ModelRef, sym: dict) -> Replay:
    """Replay on the model: ``tenant_affinity`` with t0 on both replicas and t1 on replica 1,
    least outstanding within the subset, ties to replica 0.  At 0 s t1 sends n + 1 requests
    (all to replica 1), then t0 sends 3 n + 1 (the first n + 2 to replica 0, then alternately
    to 1 and 0: n on replica 1, 2 n + 1 on replica 0).  The run must reach the decoded state
    (the fleet service of both tenants before fleet step (2 n - 1) o, D_F), and the catalog's
    spread over the fleet service (:func:`~tenantry.spec.invariants_fleet.spread_findings` on
    :func:`~tenantry.spec.invariants_fleet.fleet_service_counters`) must flag t0 against t1 at
    that step with the decoded gap (it may flag earlier rounds too: every round from the second
    breaks it); FLEET-VTC-GAP must hold on the same workload under fleet accounting."""
    from tenantry.model.routers import FleetConfig
    from tenantry.runner.fleet import simulate_fleet
    from tenantry.model.workload import Request
    from tenantry.spec.invariants_fleet import _read, check_fleet_history, fleet_charge_bound, \
        fleet_service_counters, spread_findings

    from .vtc import replay_config

    n, pp, oo = val(model, sym["n"]), val(model, sym["p"]), val(model, sym["o"])
    k, gap = val(model, sym["k"]), val(model, sym["gap"])
    cfg = replay_config(2, lift=True, max_num_seqs=1)
    wl = [Request(i, "t1", 0.0, pp, oo) for i in range(n + 1)]
    wl += [Request(n + 1 + i, "t0", 0.0, pp, oo) for i in range(3 * n + 1)]
    subsets = {"t0": (0, 1), "t1": (1,)}
    hist = {acc: simulate_fleet(FleetConfig((cfg, cfg), router="tenant_affinity", accounting=acc,
                                            tenant_replicas=subsets), wl) for acc in ("replica", "fleet")}
    h = hist["replica"]
    d_f = fleet_charge_bound(_read(h))
    counters = fleet_service_counters(h)
    want_pre = {"t0": float(val(model, sym["pre"][0])), "t1": float(val(model, sym["pre"][1]))}
    pre = counters[k - 1] if 0 < k <= len(counters) else None
    on = [sum(1 for q in h.requests if q.tenant == "t0" and q.replica == r) for r in (0, 1)]
    facts = {"rounds": n, "prompt": pp, "output": oo, "D_F": d_f, "step": k, "fleet_service_before": pre,
             "t0_per_replica": on, "decoded_gap": gap}
    if d_f != val(model, sym["U"]) or pre != want_pre or on != [2 * n + 1, n]:
        return Replay(False, f"the run did not reach the decoded state: D_F {d_f} against {val(model, sym['U'])}, "
                      f"fleet service before step {k} {pre} against {want_pre}, t0 per replica {on}", facts)
    found = [x for x in spread_findings(h, counters) if x.tenants == ("t0", "t1")]
    bad = [x for x in found if x.step == k and x.observed == gap]
    facts["first_finding_step"] = found[0].step if found else None
    if found and not bad:
        return Replay(False, f"the model flags t0 against t1 ({found[0].render()}) but not at the decoded step {k} "
                      f"with the decoded gap {gap}", facts)
    good = check_fleet_history(hist["fleet"], ["FLEET-VTC-GAP"], replicas=False)
    ok = bool(bad) and not good
    detail = (f"t1 queued on replica 1 from 0 s, t0 on both; replica 0 serves t0 alone, replica 1 alternates by its "
              f"own counters ({pp}/{oo}-token requests): " + (bad[0].render() if bad else "no finding")
              + ("; fleet accounting keeps it" if not good
                 else f"; but fleet accounting breaks it: {good[0].render()}"))
    return Replay(ok, detail, facts)


def pool_config(block: int, num_blocks: int):
    """The replica of the limit ``pool-refused``: :func:`~tenantry.proofs.vtc.replay_config` for two
    unit-weight tenants with two batch slots, KV blocks of ``block`` tokens, ``num_blocks`` of them."""
    import attrs

    from .vtc import replay_config
    return attrs.evolve(replay_config(2, lift=True, max_num_seqs=2), num_blocks=num_blocks, block_size_tokens=block)


def _pool_refused_formula(ample: bool = False) -> tuple[z3.BoolRef, dict]:
    """H1 dropped (``ample=False``; True keeps it, for the tests: then it has no model): on
    replica 0 the pick is least only among the tenants whose head fits.  2 tenants, 2
    replicas, fleet accounting, KV blocks of b tokens, two batch slots; replica 0 has a
    pool of 3 blocks, replica 1 an ample one (2 * ceil(8 / b)).  Tenant 0 (f)
    sends requests of b prompt and 2 output tokens to both replicas, tenant 1 (g) one of b + 1
    prompt tokens to replica 0.  On each replica f's running sequence, decoding its last token
    (b + 1 tokens, 2 blocks), leaves one free block: f's next head (1 block) fits, g's (2 blocks)
    does not on replica 0, so every fleet step f is picked on both replicas and charged b + 4 on
    each (its prompt, its first token and the previous sequence's last at w_out = 2) while g,
    lifted at fleet step 2 to f's counter after fleet step 1 (2 (b + 2) + 2 (b + 4)), waits on
    replica 0.  The pre-state is the end of fleet step k - 1 (f owes one token on each replica);
    T = b + 2, so D_F = 2 (min(3 b, 2 T) + 2 T).  The shape is one fleet step of the encoding from
    a state that keeps the invariant, ending with the checked spread broken."""
    dt, dr = Domain("N", 2), Domain("R", 2)
    s = fstate("pr")
    b, k = Int("b_pr"), Int("k_pr")
    rb = ToReal(b)
    m0 = z3.If(3 * b <= 2 * b + 4, 3 * b, 2 * b + 4)
    U = z3.K(z3.IntSort(), ToReal(2 * (m0 + 2 * b + 4)))
    guard, post, p = fleet_step(dt, dr, s, U, "pr", ample=ample)
    q, q2, pk, D, fit = s["q"], p["q2"], p["pk"], p["D"], p["fit"]
    shape = And(b >= 1, b <= 6, k >= 3, k <= 12,
                s["c"][0] == 2 * (rb + 2) + 2 * (rb + 4) * ToReal(k - 1), s["c"][1] == 4 * rb + 12,
                s["G"][0] == 4, s["G"][1] == 0,
                q[0][0], q[1][0], q[0][1], z3.Not(q[1][1]),
                s["sn"][0][0] == 1, s["sn"][1][0] == 1, s["sn"][0][1] == 2, s["sn"][1][1] == -1,
                s["lp"][0] == k - 1, s["lp"][1] == -1, s["P"][0][0], s["P"][0][1], z3.Not(s["P"][1][0]),
                z3.Not(s["P"][1][1]), s["k"] == k, s["ll"] == 0,
                dt.forall(lambda i: z3.Not(p["A"][i])),
                pk[0][0], pk[1][0], z3.Not(pk[0][1]), z3.Not(pk[1][1]), z3.Not(fit[0][1]),
                q2[0][0], q2[1][0], q2[0][1], z3.Not(q2[1][1]),
                D[0][0] == rb + 4, D[1][0] == rb + 4, D[0][1] == 0, D[1][1] == 0,
                dt.forall(lambda i: p["dt"][i] == D[0][i] + D[1][i]), p["G2"][0] == 4, p["G2"][1] == 0)
    bad = And(related(post, 0, 1, 0), post["c"][0] - post["c"][1] > U[0])
    f = And(gap_invariant(dt, dr, s, U), guard, shape, bad)
    return f, {"b": b, "k": k, "U": U[0], "pre": (s["c"][0], s["c"][1]), "gap": post["c"][0] - post["c"][1]}


def _pool_refused_replay(model: z3.ModelRef, sym: dict) -> Replay:
    """Replay on the model: ``tenant_affinity`` with t0 on both replicas and t1 on replica 0,
    fleet accounting.  At 0 s t0 sends 2 requests (one per replica), at 1 s 2 (k + 1) more
    (alternately to 0 and 1), and t1 one at 1.001 s (fleet step 2).  The run must reach the
    decoded state (D_F, the fleet counters after fleet step k - 1); the catalog's FLEET-VTC-GAP
    (:func:`~tenantry.spec.invariants_fleet.h_fleet_vtc_gap`, its ``applies`` not consulted) must
    flag t0 against t1 first at fleet step k with the decoded gap and nothing else; the catalog
    must not claim FLEET-VTC-GAP on this fleet (replica 0 is not ample KV); and with replica 0's
    pool ample too the same workload must keep it, claimed."""
    from tenantry.model.routers import FleetConfig
    from tenantry.runner.fleet import simulate_fleet
    from tenantry.model.workload import Request
    from tenantry.spec.invariants_fleet import _read, check_fleet_history, fleet_charge_bound, fleet_coverage, \
        h_fleet_vtc_gap

    from .vtc import T_MAX

    b, k, gap = val(model, sym["b"]), val(model, sym["k"]), val(model, sym["gap"])
    ample = 2 * -(-T_MAX // b)
    wl = [Request(i, "t0", 0.0, b, 2) for i in range(2)]
    wl += [Request(2 + i, "t0", 1.0, b, 2) for i in range(2 * (k + 1))]
    wl += [Request(1000, "t1", 1.001, b + 1, 1)]
    subsets = {"t0": (0, 1), "t1": (0,)}
    def fleet(pool: int) -> FleetConfig:
        return FleetConfig((pool_config(b, pool), pool_config(b, ample)), router="tenant_affinity",
                           accounting="fleet", tenant_replicas=subsets)
    h, good = simulate_fleet(fleet(3), wl), simulate_fleet(fleet(ample), wl)
    v = _read(h)
    d_f = fleet_charge_bound(v)
    steps = h.fleet_steps
    pre = steps[k - 1].counters if k <= len(steps) else None
    want_pre = {"t0": float(val(model, sym["pre"][0])), "t1": float(val(model, sym["pre"][1]))}
    facts = {"block_tokens": b, "step": k, "D_F": d_f, "fleet_counters_before": pre, "decoded_gap": gap,
             "ample_pool": ample}
    if d_f != val(model, sym["U"]) or pre != want_pre:
        return Replay(False, f"the run did not reach the decoded state: D_F {d_f} against {val(model, sym['U'])}, "
                      f"fleet counters after step {k - 1} {pre} against {want_pre}", facts)
    found = h_fleet_vtc_gap(v)
    facts["first_finding_step"] = found[0].step if found else None
    if not found or found[0].step != k or found[0].tenants != ("t0", "t1") or found[0].observed != gap:
        return Replay(False, "the catalog's FLEET-VTC-GAP did not flag t0 against t1 first at the decoded step "
                      f"{k} with the decoded gap {gap}: " + (found[0].render() if found else "no finding"), facts)
    other = [x for x in found if x.tenants != ("t0", "t1")]
    if other:
        return Replay(False, f"the run breaks the premise, not the spread: {other[0].render()}", facts)
    claimed = fleet_coverage(h)["FLEET-VTC-GAP"]
    if not claimed.startswith("skipped: replica 0 is not ample KV"):
        return Replay(False, f"the catalog's coverage of the small-pool fleet: {claimed!r}", facts)
    kept = check_fleet_history(good, ["FLEET-VTC-GAP"], replicas=False)
    if kept or fleet_coverage(good)["FLEET-VTC-GAP"] != "checked":
        return Replay(False, "with replica 0 ample too the catalog " + (f"flags {kept[0].render()}" if kept
                      else "does not claim FLEET-VTC-GAP"), facts)
    return Replay(True, f"blocks of {b} tokens, replica 0 a 3-block pool: t1's {b + 1}-token head is refused there "
                  f"while t0 is picked on both replicas each fleet step: {found[0].render()}; not claimed on this "
                  f"fleet (replica 0 is not ample KV); with an ample pool ({ample} blocks) the same workload keeps it",
                  facts)


FLEET_VTC_GAP = Proof(
    "FLEET-VTC-GAP", FAMILY,
    "with fleet accounting, c_f + owed_f <= c_g + D_F/w_f whenever f's last pick was on a replica where g has been "
    "queued since; so such a tenant runs at most D_F/w_f ahead of g (D_F = sum_r max(w_in, w_out) M_r)",
    "any N (tenants), any R (replicas)",
    gap_fleet_obligations,
    (Twin("per-replica", "fleet accounting (accounting='replica': each replica picks by its own counters) under "
          "tenant affinity", _gap_twin_formula, _gap_twin_replay, scope="one fleet step of a run from 0 s"),
     Twin("pool-refused", "H1: no replica's pool refuses the head of a tenant with a lower counter than one it "
          "picks (ample KV on every replica)", _pool_refused_formula, _pool_refused_replay, kind="limit",
          scope="one fleet step of a run from 0 s")),
    ("H1 on every replica (ample KV, vtc): a tenant picked on r had the least counter r saw among those queued "
     "there, and one queued at the step's end was queued through r's waiting phase",
     "H2 on every replica: in a step, r's charges to f plus what f's sequences on r still owe after it are at most "
     "max(w_in, w_out) M_r / w_f; a tenant picked nowhere is charged only what it owed"),
)

PROOFS = PROOFS + (FLEET_VTC_GAP,)
