"""Token bucket: the prompt tokens a tenant has admitted in any window of length
T total at most ``burst + rate * T`` (SPEC.md 8.6); the request-rate limit:
the requests admitted in any window number at most ``burst + rate * T``
(REQUEST-RATE, SPEC.md 8.10: the same encoding with every charge one request
and nothing produced).

Time is normalised by the rate (``tau = rate * t``: refill credit in tokens),
which keeps the encoding linear.  Per tenant (any number, arrays over the
tenant index): the level ``lvl``, and ghosts for a window opened at
``tau1``: ``A`` (prompt tokens admitted since), ``O`` (generated tokens
charged since).  Transitions of ``model/step.py``:

* ``refill(dt)``: ``_refill``: ``lvl = min(burst, lvl + dt)``, the clock moves;
* ``admit(x)``: ``arrive`` with the bucket on: refused unless ``x <= burst`` and
  ``lvl >= x``; then ``lvl -= x`` (``prompt_estimate = tokens``: x = prompt);
* ``produce(n)``: ``_charge_output``: ``lvl -= n`` (it may go negative).

Invariant: ``lvl <= burst``, ``A + O + lvl <= burst + (tau - tau1)`` and
``A <= burst + (tau - tau1)``: an admission needs ``lvl >= x``, so it keeps
``A + x <= A + lvl <= burst + (tau - tau1) - O``.
"""

from __future__ import annotations

import z3
from z3 import And, Int, Real, Store

from tenantry.model.config import AdmissionConfig, Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.workload import Request
from tenantry.runner.simulate import simulate

from .checks import EPS, catalog_history, verdict
from .concrete import run_workload
from .core import Domain, Proof, Replay, Twin, implies_all, real_array, val, zmin

FAMILY = "bucket"


def bstate(tag: str) -> dict:
    return {"lvl": real_array(f"lvl_{tag}"), "A": real_array(f"A_{tag}"), "O": real_array(f"O_{tag}"),
            "tau": Real(f"tau_{tag}")}


def inv(dom: Domain, s: dict, burst: z3.ArrayRef, tau1: z3.ArithRef) -> z3.BoolRef:
    return And(s["tau"] >= tau1, dom.forall(lambda f: And(
        s["lvl"][f] <= burst[f], s["A"][f] >= 0, s["O"][f] >= 0,
        s["A"][f] <= burst[f] + (s["tau"] - tau1),
        s["A"][f] + s["O"][f] + s["lvl"][f] <= burst[f] + (s["tau"] - tau1))))


def refill(dom: Domain, s: dict, burst: z3.ArrayRef, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    i, dt = Int(f"i_{tag}"), Real(f"dt_{tag}")
    lvl = s["lvl"]
    return And(dom.has(i), dt >= 0), {**s, "lvl": Store(lvl, i, zmin(burst[i], lvl[i] + dt)), "tau": s["tau"] + dt}, \
        {"i": i, "dt": dt}


def admit(dom: Domain, s: dict, burst: z3.ArrayRef, tag: str, guarded: bool = True) -> tuple[z3.BoolRef, dict, dict]:
    i, x = Int(f"i_{tag}"), Real(f"x_{tag}")
    lvl, A = s["lvl"], s["A"]
    g = And(dom.has(i), x >= 1)
    if guarded:
        g = And(g, x <= burst[i], lvl[i] >= x)
    return g, {**s, "lvl": Store(lvl, i, lvl[i] - x), "A": Store(A, i, A[i] + x)}, {"i": i, "x": x}


def produce(dom: Domain, s: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    i, n = Int(f"i_{tag}"), Real(f"n_{tag}")
    lvl, O = s["lvl"], s["O"]
    return And(dom.has(i), n >= 0), {**s, "lvl": Store(lvl, i, lvl[i] - n), "O": Store(O, i, O[i] + n)}, \
        {"i": i, "n": n}


def obligations() -> list[tuple[str, z3.BoolRef]]:
    dom, burst, tau1 = Domain("N"), real_array("burst"), Real("tau1")
    setup = And(dom.size >= 1, dom.forall(lambda f: burst[f] > 0))
    out = []
    s0 = bstate("open")
    # A window may open in any reachable state: the level is at most the burst.
    opened = And(s0["tau"] == tau1, dom.forall(lambda f: And(s0["A"][f] == 0, s0["O"][f] == 0, s0["lvl"][f] <= burst[f])))
    out.append(("open", implies_all([setup, opened], inv(dom, s0, burst, tau1))))
    for name in ("refill", "admit", "produce"):
        s = bstate(name)
        if name == "refill":
            g, post, _ = refill(dom, s, burst, name)
        elif name == "admit":
            g, post, _ = admit(dom, s, burst, name)
        else:
            g, post, _ = produce(dom, s, name)
        out.append((name, implies_all([setup, inv(dom, s, burst, tau1), g], inv(dom, post, burst, tau1))))
    s = bstate("claim")
    f = Int("f_claim")
    out.append(("window", implies_all([setup, inv(dom, s, burst, tau1), dom.has(f)],
                                      s["A"][f] <= burst[f] + (s["tau"] - tau1))))
    return out


RATE, BURST = 4.0, 8.0


def bucket_config(on: bool, estimate: str = "tokens") -> Config:
    """One tenant with a bucket of burst 8 tokens refilled at 4 tokens/s."""
    return Config(tenants=(TenantConfig("a", token_rate_per_s=RATE, token_burst_tokens=BURST),),
                  max_num_seqs=8, token_budget=64, num_blocks=64, max_context_tokens=16,
                  admission=AdmissionConfig(token_bucket=on, prompt_estimate=estimate, bytes_per_token=4.0),
                  order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"))


def window_violations(config: Config, transitions) -> list[str]:
    """TOKEN-BUCKET over a run: prompt tokens queued in any window [t1, t2] of
    admission (step start) times total at most burst + rate * (t2 - t1)."""
    out = []
    for i, tc in enumerate(config.tenants):
        if tc.token_rate_per_s is None:
            continue
        adm = []
        for tr in transitions:
            arr = {r.request_id: r for r in tr.inputs.arrivals}
            for e in tr.output.events:
                if e.kind == "queued" and e.tenant == i and e.request_id in arr:
                    adm.append((tr.prev.t_s, arr[e.request_id].prompt_tokens))
        for a in range(len(adm)):
            total = 0
            for b in range(a, len(adm)):
                total += adm[b][1]
                allowed = tc.token_burst_tokens + tc.token_rate_per_s * (adm[b][0] - adm[a][0])
                if total > allowed + EPS:
                    return [f"{tc.name} had {total} prompt tokens admitted between t={adm[a][0]:g}s and "
                            f"t={adm[b][0]:g}s, more than burst + rate x window = {allowed:g}"]
    return out


def _twin():
    def formula() -> tuple[z3.BoolRef, dict]:
        dom, burst, tau1 = Domain("N"), real_array("burst_t"), Real("tau1_t")
        s = bstate("tw")
        g, post, p = admit(dom, s, burst, "tw", guarded=False)
        xi = Int("xi_tw")
        f = Int("f_tw")
        # decodable: one tenant, the replay bucket, a window opened at this step (nothing admitted yet),
        # an integral prompt that fits a request.
        shape = And(dom.size == 1, burst[0] == BURST, s["tau"] == tau1, s["A"][0] == 0, s["O"][0] == 0,
                    s["lvl"][0] == BURST, p["x"] == z3.ToReal(xi), xi >= 1, xi <= 15)
        bad = And(dom.has(f), post["A"][f] > burst[f] + (post["tau"] - tau1))
        return And(dom.forall(lambda x: burst[x] > 0), inv(dom, s, burst, tau1), g, shape, bad), {"xi": xi}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        x = val(m, sym["xi"])
        cfg, ref = bucket_config(False), bucket_config(True)
        reqs = [Request(0, "a", 0.0, x, 1)]
        trs = list(run_workload(cfg, reqs, max_steps=20))
        h = simulate(cfg, reqs, max_steps=20)
        ok, detail = verdict(window_violations(ref, trs), catalog_history("TOKEN-BUCKET", ref, h),
                             f"token_bucket=False, burst {BURST:g}, rate {RATE:g}/s, one {x}-token prompt at t=0")
        return Replay(ok, detail, {"prompt_tokens": x, "burst": BURST, "rate_per_s": RATE})
    return formula, replay


def admit_estimated(dom: Domain, s: dict, burst: z3.ArrayRef, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """``arrive`` under ``prompt_estimate = bytes``: the bucket is checked and charged
    the estimate ``x``; the prompt really has ``y >= 1`` tokens (the difference
    is charged when it is first scheduled, like generated tokens)."""
    i, x, y = Int(f"i_{tag}"), Real(f"x_{tag}"), Real(f"y_{tag}")
    lvl, A = s["lvl"], s["A"]
    g = And(dom.has(i), x >= 0, y >= 1, x <= burst[i], lvl[i] >= x)
    return g, {**s, "lvl": Store(lvl, i, lvl[i] - x), "A": Store(A, i, A[i] + y)}, {"i": i, "x": x, "y": y}


def _bytes_limit():
    def formula() -> tuple[z3.BoolRef, dict]:
        dom, burst, tau1 = Domain("N"), real_array("burst_b"), Real("tau1_b")
        s = bstate("bl")
        g, post, p = admit_estimated(dom, s, burst, "bl")
        yi, xi = Int("yi_bl"), Int("xi_bl")
        shape = And(dom.size == 1, burst[0] == BURST, s["tau"] == tau1, s["A"][0] == 0, s["O"][0] == 0,
                    s["lvl"][0] == BURST, p["y"] == z3.ToReal(yi), p["x"] == z3.ToReal(xi), yi <= 15, xi >= 1)
        bad = post["A"][0] > burst[0] + (post["tau"] - tau1)
        return And(inv(dom, s, burst, tau1), g, shape, bad), {"x": xi, "y": yi}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        est, true = val(m, sym["x"]), val(m, sym["y"])
        cfg = bucket_config(True, estimate="bytes")
        reqs = [Request(0, "a", 0.0, true, 1, prompt_bytes=4 * est)]
        trs = list(run_workload(cfg, reqs, max_steps=20))
        ok, detail = verdict(window_violations(cfg, trs), None,
                             f"prompt_estimate=bytes: a {true}-token prompt declared as {4 * est} bytes (~{est} tokens)")
        return Replay(ok, detail, {"true_prompt_tokens": true, "estimated_tokens": est, "burst": BURST})
    return formula, replay


_f, _r = _twin()
_bf, _br = _bytes_limit()
BUCKET = Proof(
    id="TOKEN-BUCKET", family=FAMILY,
    claim="prompt tokens admitted in any window of length T <= burst + rate*T (generated tokens only lower it)",
    scope="any N, any window", obligations=obligations,
    twins=(Twin("no-bucket", "the token bucket (AdmissionConfig(token_bucket=False))", _f, _r),
           Twin("bytes-estimate", "true prompt lengths: prompt_estimate='bytes' charges what the client declares",
                _bf, _br, kind="limit")),
    hypotheses=("prompt_estimate = tokens (the bytes estimate bounds estimated, not true, prompt tokens)",))

# --- REQUEST-RATE: the request bucket --------------------------------------------------


def admit_request(dom: Domain, s: dict, tag: str, limited: bool = True) -> tuple[z3.BoolRef, dict, dict]:
    """``arrive`` with the request-rate limit on: refused ``rate_limit`` unless the
    (refilled) request bucket holds at least one request; then ``lvl -= 1`` and
    ``A += 1`` (A counts requests).  ``limited=False``: the limit switched off
    (``AdmissionConfig(request_rate_limit=False)``): every arrival passes."""
    i = Int(f"i_{tag}")
    lvl, A = s["lvl"], s["A"]
    g = And(dom.has(i), lvl[i] >= 1) if limited else dom.has(i)
    post = {**s, "A": Store(A, i, A[i] + 1)}
    if limited:
        post["lvl"] = Store(lvl, i, lvl[i] - 1)
    return g, post, {"i": i}


def rate_obligations() -> list[tuple[str, z3.BoolRef]]:
    """REQUEST-RATE: the token-bucket invariant with every charge one request and no
    ``produce`` (O stays 0).  No burst guard is needed: ``lvl <= burst`` and
    ``lvl >= 1`` already imply ``1 <= burst``."""
    dom, burst, tau1 = Domain("N"), real_array("rburst"), Real("rtau1")
    setup = And(dom.size >= 1, dom.forall(lambda f: burst[f] > 0))
    s0 = bstate("ropen")
    opened = And(s0["tau"] == tau1, dom.forall(lambda f: And(s0["A"][f] == 0, s0["O"][f] == 0,
                                                             s0["lvl"][f] <= burst[f])))
    out = [("open", implies_all([setup, opened], inv(dom, s0, burst, tau1)))]
    s = bstate("rrefill")
    g, post, _ = refill(dom, s, burst, "rrefill")
    out.append(("refill", implies_all([setup, inv(dom, s, burst, tau1), g], inv(dom, post, burst, tau1))))
    s = bstate("radmit")
    g, post, _ = admit_request(dom, s, "radmit")
    out.append(("admit", implies_all([setup, inv(dom, s, burst, tau1), g], inv(dom, post, burst, tau1))))
    s, f = bstate("rclaim"), Int("f_rclaim")
    out.append(("window", implies_all([setup, inv(dom, s, burst, tau1), dom.has(f)],
                                      s["A"][f] <= burst[f] + (s["tau"] - tau1))))
    return out


R_RATE, R_BURST = 1.0, 2.0


def rate_config(on: bool, burst: float = R_BURST) -> Config:
    """One tenant limited to ``R_RATE`` requests/s with a burst of ``burst`` requests."""
    return Config(tenants=(TenantConfig("a", request_rate_per_s=R_RATE, request_burst=burst),),
                  max_num_seqs=8, token_budget=64, num_blocks=64, max_context_tokens=16,
                  admission=AdmissionConfig(request_rate_limit=on), order=OrderConfig(policy="fcfs"),
                  cost=CostConfig(mode="unit"))


def request_window_violations(config: Config, transitions) -> list[str]:
    """REQUEST-RATE over a run: the requests queued in any window [t1, t2] of admission
    (step start) times number at most burst + rate * (t2 - t1)."""
    for i, tc in enumerate(config.tenants):
        if tc.request_rate_per_s is None:
            continue
        adm = [tr.prev.t_s for tr in transitions for e in tr.output.events if e.kind == "queued" and e.tenant == i]
        for a in range(len(adm)):
            for b in range(a, len(adm)):
                allowed = tc.request_burst + tc.request_rate_per_s * (adm[b] - adm[a])
                if b - a + 1 > allowed + EPS:
                    return [f"{tc.name} had {b - a + 1} requests admitted between t={adm[a]:g}s and t={adm[b]:g}s, "
                            f"more than burst + rate x window = {allowed:g}"]
    return []


def _rate_twin():
    def formula() -> tuple[z3.BoolRef, dict]:
        dom, burst, tau1 = Domain("N"), real_array("rburst_t"), Real("rtau1_t")
        s = bstate("rtw")
        g, post, p = admit_request(dom, s, "rtw", limited=False)
        bi = Int("bi_rtw")
        # decodable: one tenant with an integral burst, the window opened at this step with the
        # bucket emptied by `burst` admissions (all at once), one more arrival in the same step.
        shape = And(dom.size == 1, burst[0] == z3.ToReal(bi), bi >= 1, bi <= 4, s["tau"] == tau1,
                    s["A"][0] == burst[0], s["O"][0] == 0, s["lvl"][0] == 0)
        bad = post["A"][0] > burst[0] + (post["tau"] - tau1)
        return And(dom.forall(lambda x: burst[x] > 0), inv(dom, s, burst, tau1), g, shape, bad), {"burst": bi}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        b = val(m, sym["burst"])
        cfg, ref = rate_config(False, float(b)), rate_config(True, float(b))
        reqs = [Request(k, "a", 0.0, 1, 1) for k in range(b + 1)]
        trs = list(run_workload(cfg, reqs, max_steps=20))
        h = simulate(cfg, reqs, max_steps=20)
        ok, detail = verdict(request_window_violations(ref, trs), catalog_history("REQUEST-RATE", ref, h),
                             f"request_rate_limit=False, burst {b}, rate {R_RATE:g}/s, {b + 1} requests at t=0")
        return Replay(ok, detail, {"burst": b, "requests": b + 1, "rate_per_s": R_RATE})
    return formula, replay


_rf, _rr = _rate_twin()
REQUEST_RATE = Proof(
    id="REQUEST-RATE", family=FAMILY,
    claim="requests admitted in any window of length T <= burst + rate*T (refused requests cost nothing)",
    scope="any N, any window", obligations=rate_obligations,
    twins=(Twin("no-limit", "the request-rate limit (AdmissionConfig(request_rate_limit=False))", _rf, _rr),))

PROOFS = (BUCKET, REQUEST_RATE)
