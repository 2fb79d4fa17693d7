"""Metamorphic properties of the reference model (SPEC.md 7.6): transformations of
the input that must change no scheduling decision.

* scaling every weight by the same power of two (exact in binary floating point,
  so no comparison can flip by rounding) changes no decision, for every policy
  but the DRR pair (their quantum is per unit of weight, so scaling weights
  scales the quantum against the unscaled costs);
* renaming tenants (same order) changes no decision;
* a tenant alone gets the whole replica: its requests are scheduled exactly as
  on a replica configured with that tenant only (work conservation).
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings

from tenantry.model.config import ORDER_POLICIES, CostConfig, EvictionConfig, OrderConfig
from tenantry.runner.simulate import simulate
from tenantry.testing.mutants import _cfg, _tenants
from tenantry.testing.strategies import workloads

FEW = settings(max_examples=max(5, settings.default.max_examples // 4))


def decisions(history, rename=None):
    """Everything the scheduler decided: per step batch, preemptions, running set,
    timing; per request outcome and times (tenant names mapped by ``rename``)."""
    rename = rename or {}
    steps = [(s.step_index, s.start_s, s.duration_s, s.batch, s.preempted, s.running) for s in history.steps]
    reqs = [attrs.evolve(r, tenant=rename.get(r.tenant, r.tenant)) for r in history.requests]
    return steps, reqs


def config_for(policy: str, tight: bool):
    return _cfg(policy, ample=not tight, tenants=_tenants(3, queue_bound=4),
                order=OrderConfig(policy=policy, drr_quantum=64.0, drr_carry_bound=128.0, tier_floors=(0.5, 0.3, 0.2),
                                  aging_rate_per_s=20.0),
                eviction=EvictionConfig(victim="most_over_share", cooldown_steps=1, max_evictions=2),
                prefix_cache="salted")


SCALABLE = [p for p in ORDER_POLICIES if not p.startswith("drr")]


@pytest.mark.parametrize("policy", SCALABLE)
@pytest.mark.parametrize("factor", [2.0, 0.25])
def test_scaling_every_weight_changes_no_decision(policy, factor):
    cfg = config_for(policy, tight=True)
    scaled = attrs.evolve(cfg, tenants=tuple(attrs.evolve(t, weight=t.weight * factor) for t in cfg.tenants))

    @FEW
    @given(workloads(cfg, big=True, shared_prefixes=True))
    def same(wl):
        reqs = wl.requests
        assert decisions(simulate(scaled, reqs, max_steps=400)) == decisions(simulate(cfg, reqs, max_steps=400))

    same()


@pytest.mark.parametrize("policy", ORDER_POLICIES)
def test_renaming_tenants_changes_no_decision(policy):
    cfg = config_for(policy, tight=True)
    new = {"a": "zeta", "b": "alpha", "c": "m"}
    renamed = attrs.evolve(cfg, tenants=tuple(attrs.evolve(t, name=new[t.name]) for t in cfg.tenants))

    @FEW
    @given(workloads(cfg, big=True, shared_prefixes=True))
    def same(wl):
        reqs = wl.requests
        moved = [attrs.evolve(r, tenant=new[r.tenant]) for r in reqs]
        assert decisions(simulate(renamed, moved, max_steps=400)) == decisions(
            simulate(cfg, reqs, max_steps=400), rename=new)

    same()


@pytest.mark.parametrize("policy", ORDER_POLICIES)
def test_a_tenant_alone_gets_the_whole_replica(policy):
    cfg = config_for(policy, tight=False)
    alone = attrs.evolve(cfg, tenants=cfg.tenants[1:2])  # tenant b (tier 1, weight 2) only

    @FEW
    @given(workloads(cfg, long_outputs=True, bursty=True))
    def same(wl):
        reqs = [attrs.evolve(r, tenant="b") for r in wl]
        h_many, h_one = simulate(cfg, reqs, max_steps=400), simulate(alone, reqs, max_steps=400)
        assert decisions(h_many) == decisions(h_one)
        for s in h_many.steps:  # ample pool: work left waiting means every slot or every token was used
            if s.queued["b"]:
                assert len(s.batch) == cfg.max_num_seqs or sum(n for _, n in s.batch) == cfg.token_budget

    same()
