"""Refusals tell the truth: every 429's reason held when it was given
(REFUSAL-TRUTH, SPEC.md 8.10).

The reason of a refusal is the first failing check of ``Step.arrive``
(SPEC.md 4.2), so "the reason was true" is two facts:

1. **The cascade** (``arrive``): a refusal names the first failing check,
   and each check reads the model's own values: the prompt and output,
   ``blocks_for`` of them against the pool and the enforced cap, the two
   buckets just refilled by ``_refill``, ``fresh_queued`` against the bound,
   ``used_blocks`` against the tier's watermark.
2. **The books** those values come from are the rules' books, the ones the
   catalog recomputes from the records:

   * *buckets*: the model refills lazily (``_refill`` only when the tenant
     arrives or is charged for produced tokens) from its level ``lvl`` and the
     time of its last refill; the rules' bucket ``S`` refills continuously
     (``min(burst, S + rate * dt)``).  With ``u = rate * (t - bucket_t_s)``
     (the credit accrued since the last refill, normalised per tenant and per
     bucket so the encoding stays linear) the invariant is
     ``S = min(burst, lvl + u)``, ``u >= 0``, ``lvl <= burst``:
     ``min(b, min(b, l + u) + d) = min(b, l + u + d)`` for ``d >= 0``, so
     lazy and continuous refills agree wherever the model looks, and both
     are charged the same (one request and the prompt when queued, the tokens
     produced; nothing for a refusal);
   * *never-scheduled count*: ``fresh_queued[i]`` moves, in every action, by
     exactly the change in the number of i's queued sequences never
     scheduled (``first_scheduled_s is None``): arrival +1, a cancelled
     or first-scheduled fresh one -1, a readmitted or re-queued (evicted)
     one 0 (a running sequence has been scheduled).  From 0 at the start,
     it *is* that number, the one QUEUE-BOUND and the catalog count;
   * *blocks in use*: ``used_blocks`` is the number of distinct blocks in
     use (KV-CONSERVE, 8.8), the records' ``used_blocks``.

   ``evicted_too_often`` is given by ``_evict`` only to a victim with
   ``preemptions >= max_evictions`` (the encoding of 8.7).

Twin ``charged-refusal``: a ``queue_full`` refusal charges the token bucket
(the mutant ``bucket_charges_rejected`` of ``testing/mutants.py``; no
configuration removes "charge only what is admitted"), after which a prompt
the rules' bucket can pay for is refused ``token_bucket``.
"""

from __future__ import annotations

import z3
from z3 import And, Bool, If, Implies, Int, Not, Or, Real, Store

from tenantry.model.config import AdmissionConfig, Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.workload import Request
from tenantry.runner.simulate import simulate
from tenantry.testing.mutants import BucketChargesRejected

from . import evict
from .checks import EPS, catalog_history, verdict
from .concrete import run_workload
from .core import Domain, Proof, Replay, Twin, bool_array, implies_all, int_array, real_array, val, zmin

FAMILY = "admission"

#: Codes of an arrival's answer: the admission reasons in cascade order, then ``queued``.
#: The encoding covers the cascade with ``kv_watermark_queued`` off and no
#: ``wait_limits_s`` (its domain, see :func:`arrive`); ``estimated_wait`` is judged
#: by the catalog only (SPEC.md 8.10).
TOO_LONG, TOO_LARGE, RATE_LIMIT, TOKEN_BUCKET, QUEUE_FULL, KV_WATERMARK, QUEUED = range(7)
ANSWERS = ("too_long", "too_large", "rate_limit", "token_bucket", "queue_full", "kv_watermark", "queued")


# --- the buckets -------------------------------------------------------------------------


def bstate(tag: str) -> dict:
    """Per tenant, for the request bucket (``r``) and the token bucket (``t``): the model's
    level ``l``, the credit ``u`` accrued since its last refill, the rules' level ``S``."""
    return {f"{v}{b}": real_array(f"{v}{b}_{tag}") for v in ("l", "u", "S") for b in ("r", "t")}


def params(tag: str) -> dict:
    """Bursts (per tenant, requests and tokens)."""
    return {"br": real_array(f"br_{tag}"), "bt": real_array(f"bt_{tag}")}


def setup(dom: Domain, p: dict) -> z3.BoolRef:
    return And(dom.size >= 1, dom.forall(lambda f: And(p["br"][f] > 0, p["bt"][f] > 0)))


def binv(dom: Domain, s: dict, p: dict) -> z3.BoolRef:
    """The model's lazily refilled buckets are the rules' continuously refilled ones."""
    def one(f, b):
        return And(s[f"u{b}"][f] >= 0, s[f"l{b}"][f] <= p[f"b{b}"][f],
                   s[f"S{b}"][f] == zmin(p[f"b{b}"][f], s[f"l{b}"][f] + s[f"u{b}"][f]))
    return dom.forall(lambda f: And(one(f, "r"), one(f, "t")))


def initial(dom: Domain, s: dict, p: dict) -> z3.BoolRef:
    """Initial state: both buckets full, nothing accrued (SPEC.md 3)."""
    return dom.forall(lambda f: And(*[And(s[f"l{b}"][f] == p[f"b{b}"][f], s[f"S{b}"][f] == p[f"b{b}"][f],
                                          s[f"u{b}"][f] == 0) for b in ("r", "t")]))


def _upd(s: dict, i, **vals) -> dict:
    return {**s, **{k: Store(s[k], i, v) for k, v in vals.items()}}


def tick(dom: Domain, s: dict, p: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """Time passes for tenant i (between steps): the model's credit grows, the rules'
    bucket refills.  ``dr = rate_r * dt`` and ``dt_ = rate_t * dt`` (any ``>= 0``)."""
    i, dr, dt = Int(f"i_{tag}"), Real(f"dr_{tag}"), Real(f"dt_{tag}")
    post = _upd(s, i, ur=s["ur"][i] + dr, ut=s["ut"][i] + dt,
                Sr=zmin(p["br"][i], s["Sr"][i] + dr), St=zmin(p["bt"][i], s["St"][i] + dt))
    return And(dom.has(i), dr >= 0, dt >= 0), post, {"i": i, "dr": dr, "dt": dt}


def refilled(s: dict, p: dict, i) -> dict:
    """``_refill(i)``: both levels catch up with the credit, which is spent."""
    return {"lr": zmin(p["br"][i], s["lr"][i] + s["ur"][i]), "ur": z3.RealVal(0),
            "lt": zmin(p["bt"][i], s["lt"][i] + s["ut"][i]), "ut": z3.RealVal(0)}


def produce(dom: Domain, s: dict, p: dict, tag: str) -> tuple[z3.BoolRef, dict, dict]:
    """``_charge_step``: tenant i produced n tokens: ``_refill``, then the token level
    drops by n (it may go negative); the rules' bucket is charged the same."""
    i, n = Int(f"i_{tag}"), Real(f"n_{tag}")
    r = refilled(s, p, i)
    post = _upd(s, i, lr=r["lr"], ur=r["ur"], lt=r["lt"] - n, ut=r["ut"], St=s["St"][i] - n)
    return And(dom.has(i), n >= 0), post, {"i": i, "n": n}


# --- the cascade -------------------------------------------------------------------------


def arrive(dom: Domain, s: dict, p: dict, tag: str, charge_refused: bool = False) -> tuple[z3.BoolRef, dict, dict]:
    """``Step.arrive`` of one request of tenant i: the answer ``code`` (one of
    :data:`ANSWERS`) is the first failing check, read from the model's values.

    Parameters (per arrival): ``total`` = prompt + output tokens, ``x`` the prompt
    (the token-bucket charge under ``prompt_estimate = tokens``), ``need`` =
    ``blocks_for(total)`` with block size ``B``, the pool ``P``, the cap
    (``cap_on``: ``kv_cap`` and a cap set), the switches ``limited`` (request
    rate on and configured) and ``bucket`` (token bucket on and configured),
    ``qb_on``/``bound``/``fresh`` (queue bound on and set; ``fresh_queued``),
    ``wm_on``/``wm``/``used`` (a watermark fraction for the tier; blocks in use).

    ``charge_refused``: the twin: a ``queue_full`` or ``kv_watermark`` refusal
    still takes the prompt from the token bucket (``BucketChargesRejected``).
    """
    i = Int(f"i_{tag}")
    v = {n: Int(f"{n}_{tag}") for n in ("total", "x", "need", "B", "maxctx", "P", "cap", "bound", "fresh", "used")}
    b = {n: Bool(f"{n}_{tag}") for n in ("cap_on", "limited", "bucket", "qb_on", "wm_on")}
    wm = Real(f"wm_{tag}")
    r = refilled(s, p, i)
    too_long = v["total"] > v["maxctx"]
    too_large = Or(v["need"] > v["P"], And(b["cap_on"], v["need"] > v["cap"]))
    rate = And(b["limited"], r["lr"] < 1)
    token = And(b["bucket"], Or(z3.ToReal(v["x"]) > p["bt"][i], r["lt"] < z3.ToReal(v["x"])))
    qfull = And(b["qb_on"], v["fresh"] >= v["bound"])
    wmark = And(b["wm_on"], z3.ToReal(v["used"]) >= wm * z3.ToReal(v["P"]))
    code = If(too_long, TOO_LONG, If(too_large, TOO_LARGE, If(rate, RATE_LIMIT, If(token, TOKEN_BUCKET, If(
        qfull, QUEUE_FULL, If(wmark, KV_WATERMARK, QUEUED))))))
    guard = And(dom.has(i), v["x"] >= 1, v["total"] > v["x"], v["B"] >= 1, v["P"] >= 1, v["cap"] >= 1,
                v["maxctx"] >= 1, v["bound"] >= 0, v["fresh"] >= 0, v["used"] >= 0, v["used"] <= v["P"],
                wm >= 0, wm <= 1, v["B"] * (v["need"] - 1) < v["total"], v["total"] <= v["B"] * v["need"])
    checked = Not(Or(too_long, too_large))  # _refill runs after the two size checks
    queued = code == QUEUED
    x = z3.ToReal(v["x"])
    charged_t = Or(And(queued, b["bucket"]), And(charge_refused, b["bucket"], Or(code == QUEUE_FULL,
                                                                                 code == KV_WATERMARK)))
    post = _upd(s, i,
                lr=If(checked, r["lr"] - If(And(queued, b["limited"]), 1, 0), s["lr"][i]),
                ur=If(checked, r["ur"], s["ur"][i]),
                lt=If(checked, r["lt"] - If(charged_t, x, 0), s["lt"][i]),
                ut=If(checked, r["ut"], s["ut"][i]),
                Sr=s["Sr"][i] - If(And(queued, b["limited"]), 1, 0),
                St=s["St"][i] - If(And(queued, b["bucket"]), x, 0))
    return guard, post, {"i": i, "code": code, "wm": wm, **v, **b}


def truth(s: dict, p: dict, a: dict) -> z3.BoolRef:
    """The catalog's reading of each refusal (``_false_refusal``), on the rules' books:
    the answer's condition holds.  ``fresh`` and ``used`` are the rules' numbers by
    the fresh-count obligations and KV-CONSERVE."""
    i, c, x = a["i"], a["code"], z3.ToReal(a["x"])
    need_max = If(a["cap_on"], If(a["cap"] < a["P"], a["cap"], a["P"]), a["P"])
    return And(Implies(c == TOO_LONG, a["total"] > a["maxctx"]),
               Implies(c == TOO_LARGE, a["need"] > need_max),
               Implies(c == RATE_LIMIT, And(a["limited"], s["Sr"][i] < 1)),
               Implies(c == TOKEN_BUCKET, And(a["bucket"], Or(x > p["bt"][i], s["St"][i] < x))),
               Implies(c == QUEUE_FULL, And(a["qb_on"], a["fresh"] >= a["bound"])),
               Implies(c == KV_WATERMARK, And(a["wm_on"], z3.ToReal(a["used"]) >= a["wm"] * z3.ToReal(a["P"]))))


def bucket_obligations() -> list[tuple[str, z3.BoolRef]]:
    dom, p = Domain("N"), params("rt")
    out = []
    s0 = bstate("init")
    out.append(("init", implies_all([setup(dom, p), initial(dom, s0, p)], binv(dom, s0, p))))
    for name, act in (("tick", tick), ("produce", produce), ("arrive", arrive)):
        s = bstate(name)
        g, post, a = act(dom, s, p, name)
        out.append((name, implies_all([setup(dom, p), binv(dom, s, p), g], binv(dom, post, p))))
        if name == "arrive":
            out.append(("reason", implies_all([setup(dom, p), binv(dom, s, p), g], truth(s, p, a))))
    return out


# --- the never-scheduled count -----------------------------------------------------------


def fresh_obligations() -> list[tuple[str, z3.BoolRef]]:
    """Each action on sequence x moves ``fresh_queued`` of x's tenant by the change of
    ``[queued and never scheduled](x)``, and no other tenant's; a running sequence has
    been scheduled.  Sequences and tenants: any number."""
    q, nv, run, ten, fq = (bool_array("q_fr"), bool_array("nv_fr"), bool_array("run_fr"), int_array("ten_fr"),
                           int_array("fq_fr"))
    x, j = Int("x_fr"), Int("j_fr")
    inv = lambda run_, nv_: Implies(run_[x], Not(nv_[x]))  # noqa: E731
    fresh = lambda q_, nv_: If(And(q_[x], nv_[x]), 1, 0)  # noqa: E731
    base = [inv(run, nv), Not(And(q[x], run[x]))]
    # (name, guard, q', nv', run', model's change of fresh_queued[ten[x]])
    acts = (
        ("arrive", And(Not(q[x]), Not(run[x])), True, True, False, 1),              # arrive: queued, +1
        ("cancel-queued", q[x], False, nv[x], False, If(nv[x], -1, 0)),             # cancel: -1 if never_scheduled
        ("admit-head", q[x], False, False, True, If(nv[x], -1, 0)),                 # _admit_head: -1 if first
        ("evict", run[x], True, nv[x], False, 0),                                   # _evict: back to the front
        ("leave-running", run[x], False, nv[x], False, 0),                          # finish, cancel, rejection
    )
    out = []
    for name, g, q1, nv1, run1, d in acts:
        q_, nv_, run_ = Store(q, x, q1), Store(nv, x, nv1), Store(run, x, run1)
        fq_ = Store(fq, ten[x], fq[ten[x]] + d)
        goal = And(inv(run_, nv_), Not(And(q_[x], run_[x])),
                   fq_[ten[x]] - fq[ten[x]] == fresh(q_, nv_) - fresh(q, nv),
                   Implies(j != ten[x], fq_[j] == fq[j]))
        out.append((f"fresh:{name}", implies_all(base + [g], goal)))
    return out


def evicted_too_often_obligation() -> list[tuple[str, z3.BoolRef]]:
    """``_evict`` rejects a victim ``evicted_too_often`` only with max_evictions set and
    reached (the 8.7 encoding: the victim leaves alive=False)."""
    dom, K, m = Domain("S"), Int("K_eto"), int_array("m_eto")
    s = evict.bstate("eto")
    g, post, p = evict.evict_bounded(dom, s, K, m, "eto")
    g2, post2, p2 = evict.evict_bounded(dom, s, K, m, "eto2", limited=False)
    v = p["v"]
    return [("evicted_too_often", implies_all([K >= 0, g, Not(post["alive"][v])], s["pre"][v] >= K)),
            ("evicted_too_often:off", implies_all([g2], post2["alive"][p2["v"]]))]


def obligations() -> list[tuple[str, z3.BoolRef]]:
    return bucket_obligations() + fresh_obligations() + evicted_too_often_obligation()


# --- replay: a queue_full refusal charged, then a false token_bucket refusal ------------


def refusal_config(burst: float) -> Config:
    """One tenant, a token bucket of ``burst`` tokens refilled at 1 token/s, a queue bound of 1."""
    return Config(tenants=(TenantConfig("a", queue_bound=1, token_rate_per_s=1.0, token_burst_tokens=burst),),
                  max_num_seqs=1, token_budget=64, num_blocks=64, max_context_tokens=32,
                  admission=AdmissionConfig(token_bucket=True), order=OrderConfig(policy="fcfs"),
                  cost=CostConfig(mode="unit"))


def false_token_refusals(config: Config, transitions) -> list[str]:
    """REFUSAL-TRUTH for ``token_bucket`` over a run: the rules' bucket (refilled at each
    step's start, charged the prompts queued and the tokens produced) held at least the
    refused prompt, which fitted the burst."""
    level = {i: tc.token_burst_tokens for i, tc in enumerate(config.tenants) if tc.token_rate_per_s is not None}
    last = 0.0
    for tr in transitions:
        t0 = tr.prev.t_s
        for i, tc in enumerate(config.tenants):
            if i in level:
                level[i] = min(tc.token_burst_tokens, level[i] + tc.token_rate_per_s * (t0 - last))
        last = t0
        prompts = {r.request_id: r.prompt_tokens for r in tr.inputs.arrivals}
        for e in tr.output.events:
            if e.request_id not in prompts or e.tenant not in level:
                continue
            x = prompts[e.request_id]
            if e.kind == "queued":
                level[e.tenant] -= x
            elif e.kind == "rejected" and e.reason == "token_bucket" and \
                    x <= config.tenants[e.tenant].token_burst_tokens and level[e.tenant] >= x - EPS:
                return [f"request {e.request_id} ({x} prompt tokens) was refused token_bucket while the bucket "
                        f"held {level[e.tenant]:g} tokens"]
        before = {s.request_id: s.output_done for s in tr.prev.sequences()}
        for s in tuple(tr.state.sequences()) + tuple(tr.output.finished):
            if s.tenant in level:
                level[s.tenant] -= s.output_done - before.get(s.request_id, 0)
    return []


def _charged_twin():
    def formula() -> tuple[z3.BoolRef, dict]:
        dom, p = Domain("N"), params("ctw")
        s = bstate("ctw")
        g1, mid, a1 = arrive(dom, s, p, "ctw1", charge_refused=True)
        g2, post, a2 = arrive(dom, mid, p, "ctw2")
        bi, x1 = Int("burst_ctw"), Int("x1_ctw")
        fixed = lambda a: And(a["i"] == 0, a["limited"] == False, a["bucket"], a["qb_on"], a["bound"] == 1,  # noqa
                              a["fresh"] == 1, a["wm_on"] == False, a["cap_on"] == False, a["P"] == 64,
                              a["maxctx"] == 32, a["B"] == 16, a["total"] == a["x"] + 1)
        # decodable: one tenant whose full bucket paid for one queued x1-token prompt in this step (its
        # queue is at its bound of 1); then x2 is refused queue_full, then x3 is refused token_bucket
        shape = And(dom.size == 1, p["bt"][0] == z3.ToReal(bi), bi >= 2, bi <= 31, x1 >= 1,
                    s["lt"][0] == z3.ToReal(bi - x1), s["St"][0] == s["lt"][0], s["ut"][0] == 0,
                    fixed(a1), fixed(a2), a1["code"] == QUEUE_FULL, a2["code"] == TOKEN_BUCKET)
        # false by a whole token: the catalog allows float slack at the boundary (level == prompt)
        bad = And(Not(truth(mid, p, a2)), mid["St"][0] >= z3.ToReal(a2["x"]) + 1)
        return And(setup(dom, p), binv(dom, s, p), g1, g2, shape, bad), {"burst": bi, "x1": x1, "x2": a1["x"],
                                                                         "x3": a2["x"]}

    def replay(m: z3.ModelRef, sym: dict) -> Replay:
        b, x1, x2, x3 = (val(m, sym[k]) for k in ("burst", "x1", "x2", "x3"))
        cfg = refusal_config(float(b))
        reqs = [Request(0, "a", 0.0, x1, 1), Request(1, "a", 0.0, x2, 1), Request(2, "a", 0.0, x3, 1)]
        trs = list(run_workload(cfg, reqs, max_steps=20, variant=BucketChargesRejected))
        h = simulate(cfg, reqs, max_steps=20, variant=BucketChargesRejected)
        ok, detail = verdict(false_token_refusals(cfg, trs), catalog_history("REFUSAL-TRUTH", cfg, h),
                             f"variant bucket_charges_rejected, burst {b}: prompts {x1}, {x2}, {x3} at t=0")
        return Replay(ok, detail, {"burst": b, "prompts": [x1, x2, x3]})
    return formula, replay


_cf, _cr = _charged_twin()
REFUSAL_TRUTH = Proof(
    id="REFUSAL-TRUTH", family=FAMILY,
    claim="every 429 names the first failing check, read on the rules' books: lazily refilled buckets are the "
          "continuous ones, fresh_queued counts the never-scheduled queued requests",
    scope="any N (tenants, sequences)", obligations=obligations,
    twins=(Twin("charged-refusal", "charging only what is admitted (variant bucket_charges_rejected)", _cf, _cr),),
    hypotheses=("prompt_estimate = tokens (the catalog does not judge a bucket charged by a byte estimate)",
                "kv_watermark reads used_blocks, the distinct blocks in use (KV-CONSERVE, 8.8)"))

PROOFS = (REFUSAL_TRUTH,)
