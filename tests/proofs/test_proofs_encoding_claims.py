"""The encodings of the claim proofs agree with the Python model (SPEC.md 8.1,
8.10 to 8.13): REFUSAL-TRUTH and REQUEST-RATE (``Step.arrive``, ``_refill``,
``_charge_step``), FCFS-TENANT / FCFS-TIER / TIER-ORDER (``_admit_head``,
``select_fcfs``, ``select_priority``, the queues and the waiting phase's
room), BOUNDED-WAIT (the ranking function on fcfs runs) and EVICT-MINIMAL /
EVICT-PROGRESS (``schedule_running``, ``_make_room``, ``_evict``, and the
sole-block invariant with the prefix cache on).

As in ``test_proofs_encoding.py``: each test draws concrete states and
inputs, runs the model's own rule, and evaluates the encoding on the same
values (the guard must admit what the model did, the post-state must be the
one the encoding computes); the ``*_runs`` tests evaluate the proved
invariants on every state of random model runs.  The ``planted_*`` tests
show that a wrong encoding fails these same checks.

Fast by default (40 examples each); ``--hypothesis-profile=deep`` runs 2000.
"""

from __future__ import annotations

from fractions import Fraction

import attrs
import pytest
import z3
from hypothesis import assume, given
from hypothesis import strategies as st

from tenantry.model.config import AdmissionConfig, Config, CostConfig, EvictionConfig, OrderConfig, TenantConfig
from tenantry.model.policies import SelectView, select_fcfs, select_priority
from tenantry.model.step import Step, step
from tenantry.model.workload import Request, StepInput
from tenantry.proofs import admission, bucket, order, preempt, wait
from tenantry.proofs.agree import apply, arr, holds
from tenantry.proofs.concrete import SeqSpec, TenantSpec, build_state, run_workload
from tenantry.proofs.core import Domain

QUARTERS = st.integers(-8, 64).map(lambda k: k / 4)


def true_of(formula: z3.BoolRef) -> bool:
    """Truth of a closed formula over concrete values: Z3's simplifier decides it (fast), the
    solver when it leaves something open."""
    v = z3.simplify(formula)
    if z3.is_true(v) or z3.is_false(v):
        return z3.is_true(v)
    return holds(formula)


# --- REFUSAL-TRUTH and REQUEST-RATE: the arrival cascade and the buckets ------------------


@st.composite
def admission_case(draw):
    """A one- or two-tenant replica with every admission check possible, a state, a request."""
    n = draw(st.integers(1, 2))
    tenants = []
    for j in range(n):
        rr = draw(st.sampled_from([None, 0.5, 1.0, 2.0]))
        tr = draw(st.sampled_from([None, 1.0, 2.0, 4.0]))
        tenants.append(TenantConfig(
            f"t{j}", tier=draw(st.integers(0, 1)), queue_bound=draw(st.sampled_from([None, 0, 1, 2])),
            kv_block_cap=draw(st.sampled_from([None, 2, 4])),
            request_rate_per_s=rr, request_burst=None if rr is None else draw(st.sampled_from([1.0, 2.0, 3.5])),
            token_rate_per_s=tr, token_burst_tokens=None if tr is None else draw(st.sampled_from([4.0, 8.0, 16.0]))))
    adm = AdmissionConfig(token_bucket=draw(st.booleans()), request_rate_limit=draw(st.booleans()),
                          queue_bound=draw(st.booleans()), kv_cap=draw(st.booleans()),
                          kv_watermarks=draw(st.sampled_from([(), (0.5,), (0.25, 0.75)])))
    cfg = Config(tenants=tuple(tenants), block_size_tokens=4, num_blocks=draw(st.sampled_from([4, 8])),
                 max_num_seqs=8, token_budget=64, max_context_tokens=draw(st.sampled_from([16, 40])), admission=adm,
                 order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"))
    i = draw(st.integers(0, n - 1))
    specs = []
    for j in range(n):
        fresh = tuple(SeqSpec(1, 1) for _ in range(draw(st.integers(0, 2))))
        running = tuple(SeqSpec(draw(st.integers(1, 8)), 2, done=1, running=True)
                        for _ in range(draw(st.integers(0, 2))))
        specs.append(TenantSpec(seqs=fresh + running))
    assume(sum(cfg.blocks_for(s.prompt) for sp in specs for s in sp.seqs if s.running) <= cfg.num_blocks)
    dt = draw(st.integers(0, 8)) / 4
    state = build_state(cfg, specs, t_s=4.0)
    ts = list(state.tenants)
    for j, tc in enumerate(cfg.tenants):
        lr = min(tc.request_burst, draw(QUARTERS)) if tc.request_burst else 0.0
        lt = min(tc.token_burst_tokens, draw(QUARTERS)) if tc.token_burst_tokens else 0.0
        ts[j] = ts[j]._replace(bucket_requests=lr, bucket_tokens=lt, bucket_t_s=4.0 - dt)
    state = attrs.evolve(state, tenants=tuple(ts))
    req = Request(999, f"t{i}", 4.0, draw(st.integers(1, 12)), draw(st.integers(1, 12)))
    return cfg, state, i, req


def bucket_pre(cfg: Config, state) -> tuple[dict, dict]:
    """The encoding's pre-state: levels, credit accrued since the last refill, the rules' levels."""
    br = [Fraction(t.request_burst or 1) for t in cfg.tenants]
    bt = [Fraction(t.token_burst_tokens or 1) for t in cfg.tenants]
    ur = [Fraction(t.request_rate_per_s or 0) * Fraction(state.t_s - ts.bucket_t_s)
          for t, ts in zip(cfg.tenants, state.tenants)]
    ut = [Fraction(t.token_rate_per_s or 0) * Fraction(state.t_s - ts.bucket_t_s)
          for t, ts in zip(cfg.tenants, state.tenants)]
    lr = [Fraction(t.bucket_requests) for t in state.tenants]
    lt = [Fraction(t.bucket_tokens) for t in state.tenants]
    pre = {"lr": arr(lr), "ur": arr(ur), "lt": arr(lt), "ut": arr(ut),
           "Sr": arr(min(b, x + u) for b, x, u in zip(br, lr, ur)), "St": arr(min(b, x + u) for b, x, u in zip(bt, lt, ut))}
    return pre, {"br": arr(br), "bt": arr(bt)}


def arrival_binds(cfg: Config, state, i: int, req: Request, a: dict) -> list:
    tc, adm = cfg.tenants[i], cfg.admission
    wms = adm.kv_watermarks
    return [a["i"] == i, a["total"] == req.total_tokens, a["x"] == req.prompt_tokens,
            a["need"] == cfg.blocks_for(req.total_tokens), a["B"] == cfg.block_size_tokens,
            a["maxctx"] == cfg.max_context_tokens, a["P"] == cfg.num_blocks,
            a["cap_on"] == (adm.kv_cap and tc.kv_block_cap is not None), a["cap"] == (tc.kv_block_cap or 1),
            a["limited"] == (adm.request_rate_limit and tc.request_rate_per_s is not None),
            a["bucket"] == (adm.token_bucket and tc.token_rate_per_s is not None),
            a["qb_on"] == (adm.queue_bound and tc.queue_bound is not None), a["bound"] == (tc.queue_bound or 0),
            a["fresh"] == state.tenants[i].fresh_queued, a["wm_on"] == bool(wms),
            a["wm"] == (Fraction(wms[min(tc.tier, len(wms) - 1)]) if wms else 0), a["used"] == state.kv.used_blocks]


def check_arrival(cfg, state, i, req, encode=admission.arrive) -> str | None:
    """Run ``Step.arrive`` and the encoding's ``arrive`` on the same values; None when they
    agree, else what differs."""
    s = Step(cfg, state)
    s.arrive(req)
    ev = s.events[-1]
    want = admission.ANSWERS.index(ev.reason if ev.kind == "rejected" else "queued")
    n = len(cfg.tenants)
    pre, p = bucket_pre(cfg, state)
    guard, post, a = encode(Domain("N", n), pre, p, "c")
    got = apply(guard, arrival_binds(cfg, state, i, req, a), {"code": a["code"], "lr": post["lr"][i],
                                                               "lt": post["lt"][i], "Sr": post["Sr"][i],
                                                               "St": post["St"][i]})
    if got is None:
        return "the encoding's guard rejects the model's arrival"
    if got["code"] != want:
        return f"answer: model {admission.ANSWERS[want]}, encoding {admission.ANSWERS[got['code']]}"
    tc, t = cfg.tenants[i], s.tenants[i]
    if tc.request_rate_per_s is not None and got["lr"] != Fraction(t.bucket_requests):
        return f"request bucket: model {t.bucket_requests}, encoding {got['lr']}"
    if tc.token_rate_per_s is not None and got["lt"] != Fraction(t.bucket_tokens):
        return f"token bucket: model {t.bucket_tokens}, encoding {got['lt']}"
    if want == admission.QUEUED and tc.request_rate_per_s is not None and t.bucket_t_s == state.t_s:
        # after a refill the model's level is the rules' level (the bucket invariant with u = 0)
        if cfg.admission.request_rate_limit and got["Sr"] != Fraction(t.bucket_requests):
            return f"rules' request bucket {got['Sr']} differs from the model's {t.bucket_requests}"
    return None


@given(admission_case())
def test_arrival_cascade_and_buckets_are_the_model_s(case):
    cfg, state, i, req = case
    assert check_arrival(cfg, state, i, req) is None, check_arrival(cfg, state, i, req)


def test_planted_cascade_error_is_caught():
    """The queue check placed before the token bucket (a plausible slip) disagrees with the model."""
    def swapped(dom, s, p, tag, charge_refused=False):
        g, post, a = admission.arrive(dom, s, p, tag, charge_refused)
        qfull = z3.And(a["qb_on"], a["fresh"] >= a["bound"])
        code = z3.If(z3.And(qfull, a["code"] == admission.TOKEN_BUCKET), admission.QUEUE_FULL, a["code"])
        return g, post, {**a, "code": code}
    cfg = Config(tenants=(TenantConfig("t0", queue_bound=0, token_rate_per_s=1.0, token_burst_tokens=4.0),),
                 block_size_tokens=4, num_blocks=8, max_context_tokens=40,
                 admission=AdmissionConfig(token_bucket=True), order=OrderConfig(policy="fcfs"),
                 cost=CostConfig(mode="unit"))
    state = build_state(cfg, [TenantSpec(bucket_tokens=1.0)], t_s=0.0)
    req = Request(9, "t0", 0.0, 3, 1)
    assert check_arrival(cfg, state, 0, req) is None
    assert "answer: model token_bucket, encoding queue_full" in check_arrival(cfg, state, 0, req, swapped)


@given(st.integers(0, 12), st.integers(0, 8), st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([1.0, 2.0, 3.5]))
def test_request_bucket_admission_is_the_model_s(level, dt, rate, burst):
    cfg = Config(tenants=(TenantConfig("a", request_rate_per_s=rate, request_burst=burst),), max_num_seqs=4,
                 num_blocks=8, max_context_tokens=16, admission=AdmissionConfig(request_rate_limit=True),
                 order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"))
    lvl0 = min(burst, level / 4)
    state = build_state(cfg, [TenantSpec()], t_s=float(dt))
    state = attrs.evolve(state, tenants=(state.tenants[0]._replace(bucket_requests=lvl0, bucket_t_s=0.0),))
    s = Step(cfg, state)
    s.arrive(Request(0, "a", float(dt), 1, 1))
    queued = s.events[-1].kind == "queued"
    dom = Domain("N", 1)
    pre = {"lvl": arr([lvl0]), "A": arr([0]), "O": arr([0]), "tau": z3.RealVal(0)}
    g1, mid, p1 = bucket.refill(dom, pre, arr([burst]), "r")
    g2, post, p2 = bucket.admit_request(dom, mid, "a")
    got = apply(z3.And(g1, g2), [p1["i"] == 0, p1["dt"] == Fraction(rate) * dt, p2["i"] == 0], {"lvl": post["lvl"][0]})
    if queued:
        assert got is not None and got["lvl"] == Fraction(s.tenants[0].bucket_requests)
    else:
        assert got is None, "the model refused what the encoding admits"


@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.integers(-8, 32), st.integers(0, 8))
def test_produced_tokens_charge_the_refilled_bucket(outputs, level, dt):
    """``_charge_step``: a step's produced tokens leave ``min(burst, lvl + u) - n`` (encoding ``produce``)."""
    cfg = Config(tenants=(TenantConfig("a", token_rate_per_s=2.0, token_burst_tokens=8.0),), max_num_seqs=4,
                 num_blocks=8, max_context_tokens=16, admission=AdmissionConfig(token_bucket=True),
                 order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"))
    lvl0 = min(8.0, level / 4)
    state = build_state(cfg, [TenantSpec(seqs=tuple(SeqSpec(2, o + 1, done=o, running=True) for o in outputs))],
                        t_s=float(dt))
    state = attrs.evolve(state, tenants=(state.tenants[0]._replace(bucket_tokens=lvl0, bucket_t_s=0.0),))
    post_state, _ = step(cfg, state, StepInput())
    pre, p = bucket_pre(cfg, state)
    guard, post, a = admission.produce(Domain("N", 1), pre, p, "p")
    got = apply(guard, [a["i"] == 0, a["n"] == len(outputs)], {"lt": post["lt"][0], "St": post["St"][0]})
    assert got["lt"] == Fraction(post_state.tenants[0].bucket_tokens) == got["St"]


# --- FCFS-TENANT, FCFS-TIER, TIER-ORDER -------------------------------------------------------


def queue_arrays(state, extra: int = 0) -> tuple[dict, int, list[int]]:
    """The queue encoding's arrays for a concrete state (pos: the place in the queue;
    ``extra`` unused indices for sequences not yet alive), their number, and the
    request id at each index."""
    seqs = []
    for i, t in enumerate(state.tenants):
        for j, q in enumerate(t.queue):
            seqs.append((q, True, False, j))
    for q in state.running:
        seqs.append((q, False, True, 0))
    n = len(seqs) + extra
    pad = lambda xs, v: list(xs) + [v] * extra  # noqa: E731
    s = {"q": arr(pad((x[1] for x in seqs), False), "bool"), "run": arr(pad((x[2] for x in seqs), False), "bool"),
         "fr": arr(pad((x[0].never_scheduled for x in seqs), False), "bool"),
         "sq": arr(pad((x[0].arrival_seq for x in seqs), 0), "int"), "pos": arr(pad((x[3] for x in seqs), 0)),
         "rdy": arr(pad((x[0].ready_step for x in seqs), 0), "int"),
         "ten": arr(pad((x[0].tenant for x in seqs), 0), "int"), "k": z3.IntVal(state.step_index),
         "nxt": z3.IntVal(state.next_arrival_seq)}
    return s, n, [x[0].request_id for x in seqs]


@st.composite
def queue_state(draw, n_tenants=None):
    """Tenants whose queues hold preempted sequences (some in their cooldown) before fresh ones."""
    n = n_tenants or draw(st.integers(1, 3))
    cfg = Config(tenants=tuple(TenantConfig(f"t{j}", tier=draw(st.integers(0, 1))) for j in range(n)),
                 max_num_seqs=8, num_blocks=64, max_context_tokens=16, order=OrderConfig(policy="fcfs"),
                 cost=CostConfig(mode="unit"))
    specs = []
    for _ in range(n):
        pre = tuple(SeqSpec(2, 2, preemptions=1, ready_step=draw(st.integers(3, 7)))
                    for _ in range(draw(st.integers(0, 2))))
        fresh = tuple(SeqSpec(1, 1) for _ in range(draw(st.integers(0, 2))))
        specs.append(TenantSpec(seqs=pre + fresh))
    return cfg, build_state(cfg, specs, step_index=5)


@given(queue_state())
def test_admit_head_takes_the_first_ready_and_the_oldest_fresh(case):
    cfg, state = case
    back = [i for i, t in enumerate(state.tenants) if t.queue]
    assume(back)
    s, n, ids = queue_arrays(state)
    dom = Domain("S", n)
    assert true_of(order.queue_inv(dom, s)), "the drawn state breaks the queue invariant"
    for i in back:
        st_ = Step(cfg, state)
        ok = st_._admit_head(i)
        if not ok:  # none ready: the encoding has no first ready sequence either
            assert not true_of(dom.exists(lambda x: z3.And(s["q"][x], s["ten"][x] == i, s["rdy"][x] <= s["k"])))
            continue
        rid = next(r for r in st_.running if r not in {q.request_id for q in state.running})
        x = ids.index(rid)
        assert true_of(order.first_ready(dom, s, z3.IntVal(x), z3.IntVal(i))), f"tenant {i}: {rid} is not first ready"
        assert true_of(order.tenant_claim(dom, s, z3.IntVal(x)))


def test_planted_head_error_is_caught():
    """Ranking by the queue's first sequence, ready or not (the model before the FCFS-TIER fix):
    on a queue whose front is in its cooldown it names another sequence than _admit_head takes."""
    cfg = Config(tenants=(TenantConfig("t0"),), max_num_seqs=8, num_blocks=64, max_context_tokens=16,
                 order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"))
    state = build_state(cfg, [TenantSpec(seqs=(SeqSpec(2, 2, preemptions=1, ready_step=9), SeqSpec(1, 1)))],
                        step_index=5)
    s, n, ids = queue_arrays(state)
    dom = Domain("S", n)
    st_ = Step(cfg, state)
    assert st_._admit_head(0)
    x = ids.index(next(r for r in st_.running))
    wrong = lambda x_, i: z3.And(s["q"][x_], s["ten"][x_] == i, dom.forall(  # noqa: E731
        lambda t: z3.Implies(z3.And(s["q"][t], s["ten"][t] == i), s["pos"][x_] <= s["pos"][t])))
    assert holds(order.first_ready(dom, s, z3.IntVal(x), z3.IntVal(0)))
    assert not holds(wrong(z3.IntVal(x), z3.IntVal(0)))


@given(queue_state(), st.sampled_from(["fcfs", "priority"]))
def test_fcfs_and_priority_picks_are_the_model_s(case, policy):
    cfg, state = case
    cfg = attrs.evolve(cfg, order=OrderConfig(policy=policy))
    cands = [i for i, t in enumerate(state.tenants) if t.queue]
    assume(cands)
    view = SelectView(cfg, list(state.tenants), cands, state.t_s, 0, state.tier_counters, {}, cands,
                      state.step_index)
    A = (select_fcfs if policy == "fcfs" else select_priority)(view)
    h = next((q for q in state.tenants[A].queue if q.ready_step <= state.step_index), None)
    assume(h is not None)  # a tenant with nothing ready is picked and then blocked: no admission
    s, n, ids = queue_arrays(state)
    dom = Domain("S", n)
    g, p = order.pick(dom, s, "pk", policy)
    hw = []
    for i, t in enumerate(state.tenants):
        f = next((q for q in t.queue if q.ready_step <= state.step_index), None)
        hw.append(ids.index(f.request_id) if f is not None else 0)
    sol = z3.Solver()
    sol.add(g, p["A"] == A, p["r"] == ids.index(h.request_id), p["hw"] == arr(hw + [0] * 4, "int"),
            p["cand"] == arr([i in cands for i in range(len(state.tenants))], "bool"),
            p["tier"] == arr([t.tier for t in cfg.tenants], "int"))
    assert sol.check() == z3.sat, f"{policy} picked tenant {A}, which the encoding does not allow"


class _Probe(Step):
    """The model's step, recording for each tenant blocked in the waiting phase its first ready
    sequence, the free blocks then and its blocks then."""

    def schedule_waiting(self):
        self.blocked = {}
        super().schedule_waiting()

    def _admit_head(self, i):
        ok = super()._admit_head(i)
        if not ok:
            t = self.tenants[i]
            h = next((q for q in t.queue if q.ready_step <= self.k), None)
            self.blocked[i] = (h, self.cfg.num_blocks - self.used, t.blocks)
        return ok


def probed(cfg: Config, tr, cls):
    """Re-run one transition of a model run with the probing subclass ``cls`` (the same step:
    a probe only records); returns the probe after the step."""
    p = cls(cfg, tr.prev)
    for rid in tr.inputs.cancellations:
        p.cancel(rid)
    for r in tr.inputs.arrivals:
        p.arrive(r)
    p.schedule_running()
    p.schedule_waiting()
    p.execute()
    new, _ = p.result()
    assert new == tr.state, "the probe changed the step"
    return p


tight_workloads = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 24), st.integers(1, 40), st.integers(1, 6)),
                           min_size=1, max_size=14)


@given(tight_workloads, st.sampled_from(["fcfs", "priority"]), st.integers(3, 8), st.sampled_from([None, 4]))
def test_blocked_heads_still_have_no_room_at_the_step_end_on_runs(raw, policy, pool, cap):
    """room:block and room:end on the model: a tenant blocked in the waiting phase had no room for its
    fresh head in the catalog's measure, and has none at the step's end."""
    cfg = Config(tenants=tuple(TenantConfig(f"t{j}", tier=j % 2, kv_block_cap=cap) for j in range(3)),
                 max_num_seqs=3, token_budget=32, num_blocks=pool, max_context_tokens=48,
                 order=OrderConfig(policy=policy), cost=CostConfig(mode="unit", unit_step_s=0.25),
                 eviction=EvictionConfig(victim="newest"))
    reqs = [Request(k, f"t{t}", a / 4, p, o) for k, (t, a, p, o) in enumerate(raw)]
    for tr in run_workload(cfg, reqs, max_steps=150):
        p = probed(cfg, tr, _Probe)
        held = {}
        for sq in tr.output.finished:
            held[sq.tenant] = held.get(sq.tenant, 0) + cfg.blocks_for(sq.computed_tokens)
        free_cat = cfg.num_blocks - tr.state.kv.used_blocks - sum(held.values())
        for i, (h, free_then, tb_then) in p.blocked.items():
            if h is None or not h.never_scheduled:
                continue
            need = cfg.blocks_for(min(h.request.prompt_tokens, cfg.token_budget))
            # room:block: the encoding's invariant with the model's numbers at the moment it blocked
            assert need > free_then or (cap is not None and tb_then + need > cap)
            # room:end: the catalog's measure at the step's end
            mine = tr.state.tenants[i].blocks + held.get(i, 0)
            assert not (need <= free_cat and (cap is None or mine + need <= cap)), \
                f"step {tr.output.step_index}: tenant {i} was blocked but its head fits in the catalog's measure"


run_workloads = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 24), st.integers(1, 40), st.integers(1, 6),
                                   st.sampled_from([None, None, 0, 1, 3])), min_size=1, max_size=14)


def _requests(raw, cancels: bool = True, prefix: bool = False):
    return [Request(k, f"t{t}", a / 4, p, o, prefix_ids=(1, 2, t % 2)[: p // 16] if prefix else (),
                    cancel_s=(a + c) / 4 if cancels and c is not None else None)
            for k, (t, a, p, o, c) in enumerate(raw)]


@given(run_workloads, st.sampled_from([0, 2]), st.integers(4, 10))
def test_queue_invariant_holds_on_model_runs(raw, cooldown, pool):
    """The FCFS-TENANT invariant, as the Z3 formula, on every state of runs with evictions,
    cooldowns and cancellations."""
    cfg = Config(tenants=tuple(TenantConfig(f"t{j}") for j in range(3)), max_num_seqs=3, token_budget=32,
                 num_blocks=pool, max_context_tokens=48, order=OrderConfig(policy="fcfs"),
                 cost=CostConfig(mode="unit", unit_step_s=0.25),
                 eviction=EvictionConfig(victim="newest", cooldown_steps=cooldown))
    reqs = [r for r in _requests(raw) if cfg.blocks_for(r.total_tokens) <= pool]
    for tr in run_workload(cfg, reqs, max_steps=120):
        s, n, _ = queue_arrays(tr.state)
        if n:
            assert true_of(order.queue_inv(Domain("S", n), s)), f"queue invariant broken at step {tr.output.step_index}"


# --- BOUNDED-WAIT -------------------------------------------------------------------------


def owed_before(state, r_seq: int) -> int:
    """mu: the work left of the sequences (queued or running) admitted before ``r_seq``."""
    return sum(s.request.prompt_tokens + s.request.output_tokens - 1 - s.computed_tokens
               for s in state.sequences() if s.arrival_seq < r_seq)


@given(run_workloads, st.integers(1, 3), st.lists(st.integers(1, 3), min_size=3, max_size=3), st.booleans())
def test_waiting_work_drops_every_step_under_fcfs_with_ample_kv(raw, slots, bounds, cancels):
    """The BOUNDED-WAIT ranking on the model: while a fresh request waits, every running sequence
    is older than it and mu drops by at least one per step; every wait is within wait_bound_s."""
    cfg = Config(tenants=tuple(TenantConfig(f"t{j}", queue_bound=bounds[j], max_wait_s=1.0) for j in range(3)),
                 max_num_seqs=slots, token_budget=32, num_blocks=slots * 3, max_context_tokens=48,
                 order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit", unit_step_s=0.25))
    bound = wait.wait_bound_s(cfg)
    first = {}
    arrival = {}
    for tr in run_workload(cfg, _requests(raw, cancels), max_steps=400):
        queued = {q.request_id: q for t in tr.state.tenants for q in t.queue if q.never_scheduled}
        for r in tr.inputs.arrivals:
            arrival[r.request_id] = r.arrival_s
        for s in tuple(tr.state.sequences()) + tuple(tr.output.finished):
            if s.first_scheduled_s is not None:
                first.setdefault(s.request_id, s.first_scheduled_s)
        admitted = [s for s in tuple(tr.state.sequences()) + tuple(tr.output.finished)
                    if s.arrival_seq >= tr.prev.next_arrival_seq]  # admitted in this step (after cancellations)
        for rid, q in queued.items():
            assert all(s.arrival_seq < q.arrival_seq for s in tr.state.running), "a younger request runs"
            mu = owed_before(tr.prev, q.arrival_seq) + sum(
                s.request.prompt_tokens + s.request.output_tokens - 1 for s in admitted if s.arrival_seq < q.arrival_seq)
            assert owed_before(tr.state, q.arrival_seq) <= mu - 1, \
                f"step {tr.output.step_index}: the work owed before request {rid} did not drop"
    for rid, t in first.items():
        assert t - arrival[rid] <= bound + 1e-9, f"request {rid} waited {t - arrival[rid]} s > {bound} s"


# --- EVICT-MINIMAL and EVICT-PROGRESS --------------------------------------------------------


class _EvictProbe(Step):
    """The model's step, checking at every eviction the encoding's guard (the requester is
    short), the books ``F + AP + AV = F0 + EV`` and that the victim frees a block."""

    def schedule_running(self):
        self.F0, self.EV, self.AV, self.RM = self.cfg.num_blocks - self.used, 0, 0, self.cfg.num_blocks - self.used
        self.held0 = {rid: s.blocks_held for rid, s in self.running.items()}
        self.comp0 = {rid: (s.computed_tokens, s.target_tokens) for rid, s in self.running.items()}
        self.need = None
        super().schedule_running()

    def _make_room(self, s, need):
        self.need, self.requester = need, s.request_id
        return super()._make_room(s, need)

    def _allowance(self, rid):
        """The catalog's allowance g: the next chunk at the whole token budget, less what it held."""
        c, target = self.comp0[rid]
        return max(0, self.cfg.blocks_for(c + min(target - c, self.cfg.token_budget)) - self.held0[rid])

    def _allocated(self, rid):
        return self.running[rid].blocks_held - self.held0[rid] if rid in self.running else 0

    def _evict(self, v):
        if self.need is not None:  # in the running phase
            F = self.cfg.num_blocks - self.used
            AP = sum(self._allocated(rid) for rid in self.planned)
            assert F + AP + self.AV == self.F0 + self.EV, "books"
            assert self.need > F, "evicted while the requester fits"
            a = self._allocated(v.request_id) if v.request_id in self.planned else 0
            g, fb = self._allowance(v.request_id), self._freeable(v)
            self_evict = v.request_id == self.requester
            # the encoding's evict on these numbers: index 0 the victim, 1 the requester (or 0 itself)
            dom = Domain("S", 2)
            pre = {"run": arr([True, True], "bool"), "pl": arr([v.request_id in self.planned, False], "bool"),
                   "a": arr([a, 0], "int"), "fb": arr([fb, 1], "int"),
                   "g": arr([g, self._allowance(self.requester)], "int"),
                   **{n: z3.IntVal(x) for n, x in (("F", F), ("F0", self.F0), ("EV", self.EV), ("AV", self.AV),
                                                   ("AP", AP), ("RM", self.RM))}}
            assert true_of(preempt.ainv(dom, pre)), "the books of the encoding"
            guard, post, p = preempt.evict(dom, pre, "probe")
            got = apply(guard, [p["v"] == 0, p["x"] == (0 if self_evict else 1), p["d"] == self.need],
                        {n: post[n] for n in ("F", "EV", "AV", "RM")})
            assert got is not None, "the encoding's guard rejects the model's eviction"
            before = self.used
            super()._evict(v)
            freed = before - self.used
            assert freed == fb >= 1, f"victim {v.request_id} freed {freed}"
            self.EV, self.AV, self.RM = self.EV + freed, self.AV + a, self.RM + max(0, freed - g)
            assert (got["F"], got["EV"], got["AV"], got["RM"]) == (self.cfg.num_blocks - self.used, self.EV, self.AV,
                                                                   self.RM)
        else:
            super()._evict(v)


def sole_blocks(state) -> list[int]:
    """Running sequences holding no block of their own (no private block, no key only they hold)."""
    return [s.request_id for s in state.running
            if s.private_blocks == 0 and not any(state.kv.refs.get(k) == 1 for k in s.shared_keys)]


evict_workloads = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(1, 24), st.integers(1, 12),
                                     st.sampled_from([None, None, 0, 2]), st.lists(st.integers(0, 1), max_size=6)),
                           min_size=1, max_size=12)


@given(evict_workloads, st.sampled_from(["off", "shared", "salted"]), st.integers(4, 14),
       st.sampled_from(["newest", "largest", "lowest_priority"]), st.sampled_from([0, 0, 2]))
def test_evictions_are_needed_and_free_blocks_on_model_runs(raw, cache, pool, victim, min_free):
    cfg = Config(tenants=tuple(TenantConfig(f"t{j}", tier=j % 2) for j in range(3)), block_size_tokens=4,
                 max_num_seqs=3, token_budget=12, num_blocks=pool, max_context_tokens=48, prefix_cache=cache,
                 order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit", unit_step_s=0.25),
                 eviction=EvictionConfig(victim=victim, min_free_blocks=min_free))
    # no cancellations with the cache on: the catalog over-counts the blocks they free (SPEC.md 8.13)
    reqs = [Request(k, f"t{t}", a / 4, p, o, prefix_ids=tuple(ids[: p // 4]) if cache != "off" else (),
                    cancel_s=(a + c) / 4 if c is not None and cache == "off" else None)
            for k, (t, a, p, o, c, ids) in enumerate(raw)]
    reqs = [r for r in reqs if cfg.blocks_for(r.total_tokens) <= pool]
    trs = list(run_workload(cfg, reqs, max_steps=150))
    for tr in trs:
        assert not sole_blocks(tr.prev), f"step {tr.output.step_index}: {sole_blocks(tr.prev)} hold no own block"
        probed(cfg, tr, _EvictProbe)
    from tenantry.runner.simulate import simulate
    from tenantry.proofs.checks import catalog_history
    h = simulate(cfg, reqs, max_steps=150, detail=True)
    assert catalog_history("EVICT-MINIMAL", cfg, h) == []
    assert catalog_history("EVICT-PROGRESS", cfg, h) == []


# --- where the catalog's record forms and the proofs part ------------------------------------


def _shared_prefix_cancel(extra, **cfg_kw):
    """X (8-token prompt, 2 cacheable blocks) runs; Y hits X's two blocks at t=1 and is cancelled
    while running, so its shared blocks stay in use by X; ``extra`` requests follow."""
    cfg = Config(tenants=(TenantConfig("a"),), block_size_tokens=4, max_num_seqs=4, token_budget=16,
                 max_context_tokens=32, prefix_cache="shared", order=OrderConfig(policy="fcfs"),
                 cost=CostConfig(mode="unit"), **cfg_kw)
    return cfg, [Request(0, "a", 0.0, 8, 10, prefix_ids=(7, 8)), *extra]


def test_catalog_refusal_truth_on_a_cancelled_request_sharing_blocks():
    from tenantry.runner.simulate import simulate
    from tenantry.proofs.checks import catalog_history
    cfg, reqs = _shared_prefix_cancel([Request(1, "a", 1.0, 9, 10, prefix_ids=(7, 8), cancel_s=2.0),
                                       Request(2, "a", 2.0, 1, 1)], num_blocks=6,
                                      admission=AdmissionConfig(kv_watermarks=(0.5,)))
    h = simulate(cfg, reqs, max_steps=30, detail=True)
    step2 = h.steps[2]
    assert step2.used_blocks == 3 and {r.request_id: r.reason for r in h.requests}[2] == "kv_watermark"
    assert step2.used_blocks >= 0.5 * cfg.num_blocks  # the refusal was true: 3 of 6 blocks in use
    assert catalog_history("REFUSAL-TRUTH", cfg, h) == []


def test_catalog_evict_progress_on_a_cancelled_request_sharing_blocks():
    from tenantry.runner.simulate import simulate
    from tenantry.proofs.checks import catalog_history
    cfg, reqs = _shared_prefix_cancel([Request(1, "a", 1.0, 9, 10, prefix_ids=(7, 8), cancel_s=5.0),
                                       Request(2, "a", 3.0, 7, 10)], num_blocks=6,
                                      eviction=EvictionConfig(victim="newest"))
    h = simulate(cfg, reqs, max_steps=30, detail=True)
    step5 = h.steps[5]
    # after the cancellation 1 block is free (Y's private one); X takes it, request 2 needs one more and
    # evicts itself: the batch needed 2 blocks and 1 was free
    assert step5.preempted == (2,) and h.steps[4].used_blocks == 6
    assert catalog_history("EVICT-PROGRESS", cfg, h) == []


def test_bounded_wait_is_kept_only_with_a_bound_the_policy_can_keep():
    """SPEC.md 8.12 on the model: the configuration that kills the mutant skips_last_tenant promises 0.3 s
    without queue bounds, and 60 requests at once break the promise on the model itself (no bound exists);
    with queue bounds of 2 and the promise set to wait_bound_s, the same flood keeps it."""
    from tenantry.runner.simulate import simulate
    from tenantry.proofs.checks import catalog_history
    from tenantry.testing.mutants import MUTANTS
    cfg = MUTANTS["skips_last_tenant"].config
    flood = [Request(k, "abc"[k % 3], 0.0, 200, 40) for k in range(60)]
    assert wait.wait_bound_s(cfg) is None
    assert catalog_history("BOUNDED-WAIT", cfg, simulate(cfg, flood, max_steps=5000))
    bounded = attrs.evolve(cfg, tenants=tuple(attrs.evolve(t, queue_bound=2) for t in cfg.tenants))
    promise = wait.wait_bound_s(bounded)
    kept = attrs.evolve(bounded, tenants=tuple(attrs.evolve(t, max_wait_s=promise) for t in bounded.tenants))
    h = simulate(kept, flood, max_steps=5000)
    assert any(r.reason == "queue_full" for r in h.requests)
    assert catalog_history("BOUNDED-WAIT", kept, h) == []
