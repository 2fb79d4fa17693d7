"""The adapter harness (spec/adapter*.py) against the reference model behind the protocol.

The model wrapped as a scheduler under test must give, through the harness,
exactly the history that ``simulate`` gives, with no finding: the harness's
token accounting, KV checks and lockstep comparison agree with the model.
"""

import random

import attrs
import pytest

from tenantry.model.config import Config, EvictionConfig, OrderConfig, TenantConfig
from tenantry.model.workload import Request, Workload
from tenantry.runner.simulate import simulate
from tenantry.verify.harness import Harness
from tenantry.verify.protocol import Claims, Plan, PlanError, Scheduled, normalise_plan
from tenantry.verify.reference import make_reference


def _workload(seed: int, n: int = 120) -> Workload:
    rng = random.Random(seed)
    reqs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(20.0)
        prefix = tuple(range(rng.randint(0, 6))) if rng.random() < 0.6 else ()
        reqs.append(Request(i, rng.choice("abc"), t, rng.randint(1, 600), rng.randint(1, 60), prefix))
    return Workload(reqs)


BASE = Config(
    tenants=(TenantConfig("a", queue_bound=5, kv_block_cap=60), TenantConfig("b", weight=2.0, tier=1),
             TenantConfig("c", tier=1, queue_bound=3)),
    num_blocks=120, max_num_seqs=8, token_budget=256,
)


@pytest.mark.parametrize("policy,cache,bounded", [
    ("fcfs", "off", False), ("vtc", "salted", True), ("drr_tokens", "shared", False),
    ("drr_block_seconds", "off", True), ("priority", "salted", False), ("aging", "shared", True),
])
def test_reference_through_harness_equals_simulate(policy, cache, bounded):
    ev = EvictionConfig(victim="largest", max_evictions=2, cooldown_steps=3, min_free_blocks=4) if bounded else EvictionConfig()
    cfg = attrs.evolve(BASE, order=OrderConfig(policy=policy), prefix_cache=cache, eviction=ev)
    wl = _workload(7)
    h = Harness.start(make_reference(cfg, invariants=("WORK-CONSERVING",)), wl.tenants, timeout_s=None)
    h.run(wl.requests)
    got = h.history(wl.requests)
    want = simulate(cfg, wl, detail=True)
    assert [f.render() for f in h.findings] == []
    assert got.steps == want.steps
    assert got.requests == want.requests
    assert h.stats["steps"] == len(want.steps)
    assert h.stats["preemptions"] == sum(len(s.preempted) for s in want.steps) > 0


def test_salts_stop_cross_tenant_reuse_seen_from_outside():
    wl = _workload(3)
    reuse = {}
    for cache in ("shared", "salted"):
        cfg = attrs.evolve(BASE, prefix_cache=cache)
        h = Harness.start(make_reference(cfg), wl.tenants, timeout_s=None)
        h.run(wl.requests)
        assert h.findings == []
        reuse[cache] = (h.stats["cache_hit_blocks"], h.stats["cross_tenant_hit_blocks"])
    assert reuse["shared"][1] > 0
    assert reuse["salted"][0] > 0 and reuse["salted"][1] == 0


def test_normalise_plan_accepts_tuples_and_names_bad_fields():
    p = normalise_plan(Plan(batch=((3, 16), (4, 1, 32)), blocks={3: 1, 4: [7, 8, 9]}))
    assert p.batch == (Scheduled(3, 16, None), Scheduled(4, 1, 32))
    assert p.blocks == {3: 1, 4: (7, 8, 9)}
    with pytest.raises(PlanError, match=r"batch\[0\].num_tokens='16'"):
        normalise_plan(Plan(batch=((3, "16"),)))
    with pytest.raises(PlanError, match="must return a tenantry.verify.protocol.Plan"):
        normalise_plan({"batch": []})


def test_claims_imply_invariants_from_config():
    cfg = attrs.evolve(BASE, prefix_cache="salted", eviction=EvictionConfig(max_evictions=3, cooldown_steps=2))
    assert Claims(cfg, invariants=("WORK-CONSERVING",)).claimed() == {
        "WORK-CONSERVING", "SALT-ISOLATION", "EVICT-BOUNDED", "EVICT-COOLDOWN"}


class _ClaimsVtcDecidesFcfs:
    """Claims "VTC with w_in=1, w_out=2" (reference=True) but runs FCFS."""

    def __init__(self):
        from tenantry.verify.reference import ReferenceAdapter

        self.inner = ReferenceAdapter(attrs.evolve(BASE, order=OrderConfig(policy="fcfs")))
        self.claims = Claims(attrs.evolve(BASE, order=OrderConfig(policy="vtc", w_in=1.0, w_out=2.0)), reference=True)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_reference_claim_reports_first_divergent_step():
    from tenantry.verify.run import verify_workload

    wl = _workload(11)
    v = verify_workload(_ClaimsVtcDecidesFcfs, wl, timeout_s=None, determinism=False, catalog=False)
    div = [f for f in v.findings if f.invariant == "REF-DIVERGENCE"]
    assert len(div) == 1
    f = div[0]
    # The two runs agree up to that step: the recorded batches equal the reference's before it.
    ref = simulate(attrs.evolve(BASE, order=OrderConfig(policy="vtc")), wl)
    fcfs = simulate(attrs.evolve(BASE, order=OrderConfig(policy="fcfs")), wl)
    first = next(i for i, (a, b) in enumerate(zip(ref.steps, fcfs.steps)) if a.batch != b.batch or a.preempted != b.preempted)
    assert f.step == first
    assert "differs from the reference model (vtc)" in f.message and f.request_id is not None
    # an honest claim never diverges
    honest = verify_workload(make_reference(attrs.evolve(BASE, order=OrderConfig(policy="vtc"))), wl,
                             timeout_s=None, determinism=False)
    assert honest.ok, honest.render()


def test_books_read_after_the_results_through_accounting():
    """A scheduler that learns of a finish only from take_results resets an idle tenant's
    deficit then: its plan's books are the ones from before the step.  Judged on the plan's
    books it breaks NO-BANKED-CREDIT; with ``accounting()`` (read after take_results) it does not."""
    from tenantry.verify.reference import ReferenceAdapter
    from tenantry.verify.run import verify_workload

    cfg = Config(tenants=(TenantConfig("a"), TenantConfig("b")), num_blocks=64, max_num_seqs=4, token_budget=64,
                 order=OrderConfig(policy="drr_tokens"))

    class BooksBeforeResults(ReferenceAdapter):
        def plan_step(self, t_s):
            before = self.state
            plan = super().plan_step(t_s)
            names = [t.name for t in self.config.tenants]
            return attrs.evolve(plan, counters={n: t.counter for n, t in zip(names, before.tenants)},
                                deficits={n: t.deficit for n, t in zip(names, before.tenants)})

    class WithAccounting(BooksBeforeResults):
        def accounting(self):
            names = [t.name for t in self.config.tenants]
            return ({n: t.counter for n, t in zip(names, self.state.tenants)},
                    {n: t.deficit for n, t in zip(names, self.state.tenants)})

    wl = Workload((Request(0, "a", 0.0, 40, 3), Request(1, "b", 0.0, 40, 30), Request(2, "b", 0.0, 40, 30)))
    kw = dict(reference=False, invariants=("NO-BANKED-CREDIT",))
    late = verify_workload(lambda: BooksBeforeResults(cfg, **kw), wl, timeout_s=None)
    assert "NO-BANKED-CREDIT" in {f.invariant for f in late.findings}
    ok = verify_workload(lambda: WithAccounting(cfg, **kw), wl, timeout_s=None)
    assert ok.ok, ok.render()
    # a finding on the books names the call that reported them
    assert {f.call for f in late.findings if f.invariant == "NO-BANKED-CREDIT"} == {"plan_step"}

    class AccountingKeepsDeficits(WithAccounting):
        def accounting(self):
            counters, deficits = super().accounting()
            return counters, {n: d + 5 for n, d in deficits.items()}

    kept = verify_workload(lambda: AccountingKeepsDeficits(cfg, **kw), wl, timeout_s=None)
    books = [f for f in kept.findings if f.invariant == "NO-BANKED-CREDIT"]
    assert books and {f.call for f in books} == {"accounting"}, kept.render()
    assert "idle tenant kept a DRR deficit" in books[0].render() and "call accounting" in books[0].render()
