"""The fast step against a frozen copy of the step as it was (tests/frozen_step.py):
histories byte for byte (issue 13).

Each workload runs twice, once through the model's :func:`~tenantry.model.step.step`
and once through the frozen copy's own ``step`` function, with the same driver
(:func:`~tenantry.runner.simulate.drive`) and recorder (detailed step records:
blocks held and block ids too), and the two histories' JSON Lines must be equal.

Workloads: the seed-001 default of ``tenantry simulate`` under its three policies,
the packaged Azure pair excerpt under every setup, each adversary pattern's
default check-cell scenario (on one setup each; every setup under FULL), and Hypothesis-drawn
workloads across every setup (:data:`~tenantry.runner.setups.SETUPS`) and
every policy family (:func:`~tenantry.testing.strategies.configs`).  By
default the two trace workloads are cut at a horizon that keeps the test to
seconds; ``TENANTRY_DIFFERENTIAL=full`` runs them whole.
"""

from __future__ import annotations

import json
import os
import pickle

import attrs
import pytest
from hypothesis import given, settings, strategies as st

import frozen_step
from tenantry.model.config import Config
from tenantry.model.state import Running, initial_state
from tenantry.model.step import Step
from tenantry.model.workload import Workload
from tenantry.runner.history import history_lines
from tenantry.runner.setups import SETUPS, apply_setup, build_config, default_config, seed001_config
from tenantry.runner.simulate import ModelReplica, Recorder, Transition, check_workload, drive
from tenantry.runner.traces import azure_two_tenant_workload, seed001_workload
from tenantry.testing.strategies import configs, workloads

FULL = os.environ.get("TENANTRY_DIFFERENTIAL") == "full"


class _FrozenReplica(ModelReplica):
    """The model replica, stepping with the frozen copy's own ``step`` function."""

    def step(self, inputs):
        new, out = frozen_step.step(self.config, self.state, inputs)
        self.last = Transition(self.state, inputs, new, out)
        self.state = new
        return self.last


def _history_text(config: Config, workload: Workload, replica_cls, horizon_s: float | None) -> str:
    check_workload(config, workload)
    rec = Recorder(config, record_steps=True, detail=True)
    for r in workload.requests:
        rec.offered(r)
    rep = replica_cls(config)
    for _ in drive(rep, workload, horizon_s=horizon_s):
        rec.observe(rep.state, rep.last.output)
    return "\n".join(history_lines(rec.history(rep.state, {"requests": len(workload)})))


def without_newer_mechanisms(config: Config) -> Config:
    """``config`` with the mechanisms added after the frozen copy turned off (slot caps,
    output reservation, the starvation guard and its skip budget, preemption for priority: issue 12), so the
    two steps are compared on what both implement."""
    return attrs.evolve(
        config, tenants=tuple(attrs.evolve(t, max_running_seqs=None) for t in config.tenants),
        admission=attrs.evolve(config.admission, tier_slot_caps=(), reserve_output=False),
        order=attrs.evolve(config.order, guard_steps=None, guard_wait_s=None, guard_skips=None),
        eviction=attrs.evolve(config.eviction, preempt_for_priority=False))


def assert_same_history(config: Config, workload: Workload, horizon_s: float | None = None,
                        replicas: tuple = ("model",)) -> None:
    """The fast step and the frozen one record byte-identical histories (on what both implement).
    ``replicas``: the fast steps to compare, ``model`` and/or ``always_lazy`` (:class:`_AlwaysLazy`)."""
    config = without_newer_mechanisms(config)
    frozen = _history_text(config, workload, _FrozenReplica, horizon_s)
    for name in replicas:
        _same_text(_history_text(config, workload, _REPLICAS[name], horizon_s), frozen, name)


def _same_text(fast: str, frozen: str, name: str) -> None:
    if fast != frozen:
        a, b = fast.splitlines(), frozen.splitlines()
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        pytest.fail(f"{name}: histories differ first at line {first} of {len(b)}:\n fast:   "
                    f"{a[first] if first < len(a) else '<end>'}\n frozen: {b[first] if first < len(b) else '<end>'}")


#: The one-replica setups (a fleet setup's replica runs the policies of these: VTC, a shared cache).
ONE_REPLICA = sorted(n for n, x in SETUPS.items() if x.fleet is None)


@pytest.mark.parametrize("policy", ["fcfs", "rate_limit", "vtc"])
def test_seed001_default_workload(policy):
    wl = seed001_workload(seed=9)
    horizon = max(3 * wl.duration_s, wl.duration_s + 600.0) if FULL else 15.0
    assert_same_history(apply_setup(seed001_config(wl.tenants), policy), wl, horizon)


@pytest.mark.parametrize("setup", ONE_REPLICA)
def test_azure_pair_excerpt(setup):
    wl = azure_two_tenant_workload(speedup=5.0, use_shared=False, max_rows=None if FULL else 60)
    assert_same_history(apply_setup(default_config(wl.tenants), setup), wl, None if FULL else 30.0)


@settings(max_examples=60 if FULL else 12)
@given(data=st.data(), setup=st.sampled_from(ONE_REPLICA))
def test_hypothesis_workloads_on_every_setup(data, setup):
    roles = (("a", "adversary"), ("b", "victim"), ("c", "victim"))
    cfg = build_config(setup, roles)
    wl = data.draw(workloads(cfg, max_requests=25, long_outputs=True, shared_prefixes=True, cancels=True,
                             bursty=data.draw(st.booleans())))
    assert_same_history(cfg, wl, horizon_s=120.0, replicas=("model", "always_lazy"))
    _lockstep(without_newer_mechanisms(cfg), wl, 120.0, _AlwaysLazyReplica)
    # with every mechanism on: the model, always lazy, keeping every sequence up to date (_UpToDate, below),
    # and scanning every candidate at every pick (_NoKeyMemo: the frozen copy shares the key memo's code)
    model = _history_text(cfg, wl, ModelReplica, 120.0)
    assert model == _history_text(cfg, wl, _UpToDateReplica, 120.0) == _history_text(cfg, wl, _AlwaysLazyReplica, 120.0)
    assert model == _history_text(cfg, wl, lambda c: ModelReplica(c, variant=_NoKeyMemo), 120.0)


@settings(max_examples=200 if FULL else 40)
@given(data=st.data())
def test_hypothesis_workloads_on_every_policy_family(data):
    cfg = data.draw(configs(lanes=False))  # the frozen copy predates strict tiers, queued watermarks, wait shedding
    wl = data.draw(workloads(cfg, max_requests=20, big=data.draw(st.booleans()), long_outputs=True,
                             shared_prefixes=cfg.prefix_cache != "off", cancels=True, idle_gaps=True))
    assert_same_history(cfg, wl, horizon_s=60.0, replicas=("model", "always_lazy"))
    _lockstep(without_newer_mechanisms(cfg), wl, 60.0, _AlwaysLazyReplica)


@pytest.mark.parametrize("k", range(16))
def test_check_cell_workloads(k):
    """Each adversary pattern's default scenario (a check cell's workload, with its victims),
    each on another setup in turn (every setup under FULL)."""
    from tenantry.adversaries.evaluate import scenario_of, Task
    from tenantry.adversaries.patterns import PATTERNS

    patterns, setups = sorted(PATTERNS), ONE_REPLICA
    if k >= len(patterns):
        pytest.skip(f"{len(patterns)} patterns")
    cells = [(patterns[k], s) for s in setups] if FULL else [(patterns[k], setups[k % len(setups)])]
    for pattern, setup in cells:
        sc = scenario_of(Task(setup, pattern, (), 0))
        assert_same_history(build_config(setup, sc.roles), sc.workload, sc.horizon_s if FULL else min(sc.horizon_s, 8.0))


def test_the_frozen_copy_is_not_the_model():
    """The comparison is not vacuous: the reference is its own code, not the model's step."""
    from tenantry.model import step as model_step

    assert frozen_step.Step is not model_step.Step
    assert frozen_step.step is not model_step.step
    cfg = seed001_config()
    assert frozen_step.step(cfg, initial_state(cfg))[0] == model_step.step(cfg, initial_state(cfg))[0]


# --- lazy decode accounting (SPEC.md 3 and 5) ------------------------------------------------


class _UpToDate(Step):
    """The model with every running sequence kept up to date (it overrides a method that
    reads running sequences, so ``LAZY`` is False): what a mutant runs on."""

    def execute(self):
        super().execute()


class _UpToDateReplica(ModelReplica):
    def __init__(self, config):
        super().__init__(config, variant=_UpToDate)


class _AlwaysLazy(Step):
    """The model with its large-replica representations at any size: decode progress kept
    lazily at any batch size (the model does from ``Step.LAZY_MIN_RUNNING`` running sequences
    on) and the per-tenant records in a :class:`~tenantry.model.state.TenantTable` at any
    number of tenants (the model does from ``Step.TABLE_MIN_TENANTS`` on): the small workloads
    of these tests then exercise both."""

    LAZY_MIN_RUNNING = 0
    TABLE_MIN_TENANTS = 0


class _AlwaysLazyReplica(ModelReplica):
    def __init__(self, config):
        super().__init__(config, variant=_AlwaysLazy)


_REPLICAS = {"model": ModelReplica, "always_lazy": _AlwaysLazyReplica}


def _lockstep(config: Config, workload: Workload, horizon_s: float, replica=ModelReplica) -> tuple[int, int]:
    """Step the model (or ``replica``) and the frozen copy side by side: every state equal (each
    running sequence brought up to date, the pool, every tenant).  Returns (running sequences
    seen over the run, of which lazy)."""
    fast, frozen = replica(config), _FrozenReplica(config)
    seen = lazy = 0
    for _ in drive(fast, workload, horizon_s=horizon_s):
        frozen.idle(fast.last.prev.t_s)  # the driver idled the model to this step's start
        frozen.step(fast.last.inputs)
        r = fast.state.running
        assert isinstance(r, Running)
        seen, lazy = seen + len(r), lazy + len(r.marks)
        assert fast.state == frozen.state, f"states differ after step {fast.state.step_index - 1}"
    return seen, lazy


def test_lazy_states_equal_the_frozen_steps_and_most_decode_is_lazy():
    """Beyond the history (which records running ids, not progress), every state of the
    seed-001 run equals the frozen step's once read; and the lazy path is the one taken:
    most running sequences are lazy (the history test alone would pass if none were)."""
    wl = seed001_workload(seed=9)
    seen, lazy = _lockstep(without_newer_mechanisms(apply_setup(seed001_config(wl.tenants), "vtc")), wl, 40.0)
    assert seen > 10_000
    assert lazy > 0.7 * seen, (lazy, seen)


def test_running_reads_as_the_tuple_of_its_sequences():
    wl = seed001_workload(seed=9)
    rep = ModelReplica(apply_setup(seed001_config(wl.tenants), "vtc"))
    for _ in drive(rep, wl, horizon_s=20.0):
        pass
    r = rep.state.running
    assert isinstance(r, Running) and r.marks and len(r) == len(r.as_tuple()) > 0
    t = tuple(r)
    assert r == t and t == r and hash(r) == hash(t) and list(r) == list(t) and r[0] == t[0]
    assert r.request_ids() == tuple(s.request_id for s in t)
    assert all(s.computed_tokens == s.request.prompt_tokens + s.output_done - 1 for s in (r.current(i) for i in r.marks))
    back = pickle.loads(pickle.dumps(rep.state))
    assert back == rep.state and type(back.running) is tuple


def test_up_to_date_variant_is_not_lazy():
    assert Step.LAZY and not _UpToDate.LAZY and _AlwaysLazy.LAZY


def test_small_batches_are_not_lazy():
    """Below ``LAZY_MIN_RUNNING`` running sequences no sequence is lazy (the bookkeeping would
    cost more than it spares: a check cell runs at most 8), at and above it most are; both
    give the frozen step's states."""
    wl = seed001_workload(seed=9)
    cfg = without_newer_mechanisms(apply_setup(seed001_config(wl.tenants), "vtc"))
    small = attrs.evolve(cfg, max_num_seqs=Step.LAZY_MIN_RUNNING - 1)
    seen, lazy = _lockstep(small, wl, 20.0)
    assert seen > 1_000 and lazy == 0
    seen, lazy = _lockstep(small, wl, 20.0, _AlwaysLazyReplica)
    assert lazy > 0.5 * seen, (lazy, seen)


@pytest.mark.parametrize("setup", ONE_REPLICA)
def test_lazy_and_up_to_date_steps_agree_on_every_setup(setup):
    """With every mechanism on (issue 12's too, which the frozen copy lacks): the model
    and the model keeping every sequence up to date record the same history."""
    wl = azure_two_tenant_workload(speedup=5.0, use_shared=False, max_rows=None if FULL else 60)
    cfg = apply_setup(default_config(wl.tenants), setup)
    horizon = None if FULL else 30.0
    assert _history_text(cfg, wl, ModelReplica, horizon) == _history_text(cfg, wl, _UpToDateReplica, horizon)



def test_lazy_sequence_left_out_of_every_token_of_a_step():
    """A lazy sequence behind a prefill that takes the whole token budget gets no token
    in that step (found by the stateful machine: a decode token was counted that was never
    produced).  Request 3's prefill evicts the decoding 2 (step 12); 1 enters behind 3 and
    goes lazy, and in step 13 3's prefill chunk takes the whole budget (16 tokens): 1 gets none."""
    from tenantry.model.config import AdmissionConfig, CostConfig, EvictionConfig, OrderConfig, TenantConfig
    from tenantry.model.workload import Request

    cfg = Config(tenants=tuple(TenantConfig(n, weight=0.5, token_rate_per_s=2000.0, token_burst_tokens=600.0)
                               for n in "abc"),
                 block_size_tokens=16, num_blocks=13, max_num_seqs=2, token_budget=16, max_context_tokens=512,
                 order=OrderConfig(policy="drr_tokens", w_in=1.0, w_out=2.0, drr_quantum=32.0, drr_carry_bound=256.0),
                 admission=AdmissionConfig(token_bucket=True, kv_cap=False),
                 eviction=EvictionConfig(victim="largest"), cost=CostConfig(mode="unit", unit_step_s=0.01))
    wl = Workload((Request(0, "a", 0.15, 1, 1), Request(1, "a", 0.15, 1, 3), Request(2, "c", 0.15, 175, 3),
                   Request(3, "b", 0.15, 46, 1)))
    seen, lazy = _lockstep(cfg, wl, 10.0, _AlwaysLazyReplica)
    assert lazy > 0
    assert_same_history(cfg, wl, 10.0, replicas=("model", "always_lazy"))


# --- the tenant table (SPEC.md 3) ----------------------------------------------------------


def test_tenant_table_reads_as_the_tuple_of_its_records():
    """A TenantTable equals, hashes and pickles as the tuple of its records, and its edits
    copy only the chunks they write (across chunk boundaries: 130 records in chunks of 64)."""
    from tenantry.model.state import TenantEdits, TenantState, TenantTable

    recs = tuple(TenantState(counter=float(i)) for i in range(130))
    table = TenantTable.of(recs)
    assert table == recs and recs == table and hash(table) == hash(recs) and len(table) == 130
    assert list(table) == list(recs) and table[64] is recs[64] and table[-1] is recs[-1] and table[2:5] == recs[2:5]
    edits = TenantEdits(table)
    want = list(recs)
    for i in (0, 63, 64, 129):
        edits[i] = want[i] = recs[i]._replace(counter=-1.0 - i)
    assert edits[63] == want[63] and edits[1] is recs[1] and list(edits) == want and len(edits) == 130
    new = edits.persistent()
    assert new == tuple(want) and table == recs  # the old table is unchanged
    assert new.chunks[0] is not table.chunks[0] and new.chunks[2] is not table.chunks[2]
    with pytest.raises(IndexError):
        edits[130] = recs[0]
    back = pickle.loads(pickle.dumps(new))
    assert type(back) is tuple and back == tuple(want)


def test_many_tenants_keep_a_table_and_match_the_frozen_step():
    """From ``Step.TABLE_MIN_TENANTS`` tenants on the state's records are a TenantTable, and the
    run is the frozen step's, state by state and byte for byte."""
    from tenantry.model.config import CostConfig, OrderConfig, TenantConfig
    from tenantry.model.state import TenantTable
    from tenantry.model.workload import Request

    n = Step.TABLE_MIN_TENANTS + 100
    cfg = Config(tenants=[TenantConfig(f"t{i}", weight=1.0 + i % 3) for i in range(n)], num_blocks=4_000,
                 max_num_seqs=32, token_budget=512, order=OrderConfig(policy="vtc"),
                 cost=CostConfig(mode="unit", unit_step_s=0.01))
    wl = Workload(tuple(Request(j, f"t{(j * 37) % n}", round(j * 0.004, 6), 32 + j % 50, 4 + j % 20)
                        for j in range(600)))
    rep = ModelReplica(cfg)
    for _ in drive(rep, wl, horizon_s=1.0):
        pass
    assert isinstance(rep.state.tenants, TenantTable)
    _lockstep(cfg, wl, 4.0)
    assert_same_history(cfg, wl, 4.0)
    assert _history_text(cfg, wl, ModelReplica, 4.0) == _history_text(
        cfg, wl, lambda c: ModelReplica(c, variant=_NoKeyMemo), 4.0)


# --- the order keys across steps (model/policies.py KeyMemo) ---------------------------------


class _NoKeyMemo(Step):
    """The model with no key memo: every pick scans every candidate (the order policies'
    plain path), against which the memo, within a step and across steps, is compared."""

    def _view(self, cands, memo=True):
        return super()._view(cands, False)


class _FreshKeys(Step):
    """The model keying every candidate afresh in every step (no memo handed on)."""

    def _take_keys(self, st):
        from tenantry.model.policies import KeyMemo

        return KeyMemo()


def test_keys_handed_on_change_no_pick():
    """The key memo a step hands to the next (State.order_keys) changes no pick: on a floors
    replica with an eviction cooldown, a tenant keyed while its evicted head cooled down must be
    keyed again when the cooldown ends (the memo's ``volatile`` tenants; found by a random
    search with that re-keying removed, which this workload then fails)."""
    from tenantry.model.config import AdmissionConfig, CostConfig, EvictionConfig, OrderConfig, TenantConfig
    from tenantry.model.workload import Request

    cfg = Config(tenants=[TenantConfig(n, tier=1) for n in "abc"], num_blocks=7, max_num_seqs=4, token_budget=32,
                 order=OrderConfig(policy="floors", tier_floors=(0.5, 0.5)), eviction=EvictionConfig(cooldown_steps=1),
                 admission=AdmissionConfig(kv_cap=False), cost=CostConfig(mode="unit", unit_step_s=0.01))
    rows = [("a", 0.005, 3, 28), ("b", 0.009, 12, 39), ("c", 0.01, 33, 25), ("c", 0.018, 15, 24),
            ("a", 0.02, 35, 22), ("a", 0.023, 3, 32), ("a", 0.023, 40, 12), ("c", 0.044, 5, 22)]
    wl = Workload(tuple(Request(j, *row) for j, row in enumerate(rows)))
    model = _history_text(cfg, wl, ModelReplica, 5.0)
    assert '"preempted"' in model  # the workload evicts, so heads cool down
    assert model == _history_text(cfg, wl, lambda c: ModelReplica(c, variant=_FreshKeys), 5.0)


def test_keys_are_handed_on_once_and_not_for_round_robin():
    """A step from a backlogged vtc or aging state takes the memo the state carries (a second step
    from the same state keys afresh and does the same); round robin keys nothing and hands nothing on."""
    wl = seed001_workload(seed=9)
    for policy, carried in (("vtc", True), ("aging", True), ("round_robin", False)):
        cfg = apply_setup(seed001_config(wl.tenants), policy)
        rep = ModelReplica(cfg)
        for _ in drive(rep, wl, max_steps=400):
            pass
        st = rep.state
        assert st.backlogged(), policy
        assert bool(st.order_keys) is carried, policy
        if carried:
            a = model_step(cfg, st)
            assert st.order_keys == []  # taken
            b = model_step(cfg, st)
            assert a[0] == b[0] and a[1] == b[1]


def model_step(cfg, st):
    from tenantry.model.step import step

    return step(cfg, st)


def test_check_matrix_is_byte_identical_with_the_frozen_step(tmp_path, monkeypatch):
    """``tenantry check`` on three cells (budget 4, seed 5) writes the same matrix.json, byte for
    byte, whether its runs step with the model or with the frozen copy (setups whose mechanisms
    both implement): the fast step changes no evaluation, finding or score."""
    from tenantry.adversaries import evaluate
    from tenantry.adversaries.check import run_check
    from tenantry.adversaries.search import Budget
    from tenantry.runner import simulate as sim

    kw = dict(setups=["fcfs", "vtc", "drr_tokens"], patterns=["flood", "sybil"], seed=5, budget=Budget(4),
              shrink_evaluations=0, plots="none", extras=False, progress=False, workers=1)
    out = {}
    for name in ("model", "frozen"):
        evaluate._BASELINES.clear()  # each run computes its own baselines
        with monkeypatch.context() as m:
            if name == "frozen":
                m.setattr(sim, "step", frozen_step.step)
            run_check(out=tmp_path / "rep", **kw)  # one folder: the report names its path
        out[name] = (tmp_path / "rep" / "matrix.json").read_bytes()
    evaluate._BASELINES.clear()
    assert out["model"] == out["frozen"]
    cells = json.loads(out["model"])["cells"]
    assert sorted((c["setup"], c["pattern"]) for c in cells) == sorted(
        (s, p) for s in kw["setups"] for p in kw["patterns"])
    assert sum(c["evaluations"] for c in cells) >= 20  # every cell evaluated, most more than once


# --- the fast replica (runner/fast.py): the readable step's request records, byte for byte -------------


def _records_text(config: Config, workload: Workload, horizon_s: float | None, replica_cls=None) -> str:
    """The history a run keeps without step records (what ``tenantry simulate`` keeps without
    ``--history``): :func:`~tenantry.runner.simulate.simulate` through the readable step when
    ``replica_cls`` is None, else on that fast replica class (put in the fast replica's place)."""
    from unittest import mock

    from tenantry.runner import simulate as sim

    if replica_cls is None:
        return "\n".join(history_lines(sim.simulate(config, workload, horizon_s=horizon_s, record_steps=False,
                                                     fast=False)))
    with mock.patch.object(sim, "FastReplica", replica_cls):
        return "\n".join(history_lines(sim.simulate(config, workload, horizon_s=horizon_s, record_steps=False,
                                                     fast=True)))


def assert_fast_same(config: Config, workload: Workload, horizon_s: float | None = None) -> bool:
    """The fast replica records what the readable step records (False when it does not
    implement ``config``: nothing to compare)."""
    from tenantry.runner.fast import FastReplica, unsupported

    if unsupported(config) is not None:
        return False
    _same_text(_records_text(config, workload, horizon_s, FastReplica), _records_text(config, workload, horizon_s),
               "fast replica")
    return True


#: The one-replica setups the fast replica implements (the others fall back to the readable step).
FAST_SETUPS = [n for n in ONE_REPLICA if __import__("tenantry.runner.fast", fromlist=["x"]).unsupported(
    build_config(n, (("a", "adversary"), ("b", "victim"), ("c", "victim")))) is None]


def test_fast_replica_covers_the_simulate_defaults_and_refuses_the_rest():
    from tenantry.runner.fast import FastReplica, unsupported
    from tenantry.runner.simulate import simulate

    assert {"fcfs", "rate_limit", "vtc", "vtc_nolift", "priority", "aging", "hysteresis"} <= set(FAST_SETUPS)
    for name in ("shared_cache", "drr_tokens", "floors", "skip_budget", "protected", "round_robin"):
        cfg = build_config(name, (("a", "adversary"), ("b", "victim")))
        assert unsupported(cfg) is not None, name
        with pytest.raises(ValueError, match="does not implement"):
            FastReplica(cfg)
    with pytest.raises(ValueError, match="no step records"):
        simulate(seed001_config(), Workload(()), record_steps=True, fast=True)


@pytest.mark.parametrize("policy", ["fcfs", "rate_limit", "vtc"])
def test_fast_replica_seed001_default_workload(policy):
    wl = seed001_workload(seed=9)
    horizon = max(3 * wl.duration_s, wl.duration_s + 600.0) if FULL else 120.0
    assert assert_fast_same(apply_setup(seed001_config(wl.tenants), policy), wl, horizon)


@pytest.mark.parametrize("setup", FAST_SETUPS)
def test_fast_replica_azure_pair(setup):
    wl = azure_two_tenant_workload(speedup=5.0, use_shared=False, max_rows=None if FULL else 400)
    assert assert_fast_same(apply_setup(default_config(wl.tenants), setup), wl)


@pytest.mark.parametrize("k", range(16))
def test_fast_replica_check_cell_workloads(k):
    """Each adversary pattern's default scenario on every setup the fast replica implements."""
    from tenantry.adversaries.evaluate import Task, scenario_of
    from tenantry.adversaries.patterns import PATTERNS

    patterns = sorted(PATTERNS)
    if k >= len(patterns):
        pytest.skip(f"{len(patterns)} patterns")
    for setup in FAST_SETUPS:
        sc = scenario_of(Task(setup, patterns[k], (), 0))
        assert assert_fast_same(build_config(setup, sc.roles), sc.workload, sc.horizon_s)


@st.composite
def fast_configs(draw):
    """A drawn configuration (:func:`~tenantry.testing.strategies.configs`) brought into what
    the fast replica implements: its mechanisms outside that set turned off, its order
    policy one of :data:`~tenantry.runner.fast.ORDERS` when it was another."""
    from tenantry.runner.fast import ORDERS, unsupported

    cfg = draw(configs(lanes=False))
    order = attrs.evolve(cfg.order, guard_steps=None, guard_wait_s=None, guard_skips=None)
    if order.policy not in ORDERS:
        order = attrs.evolve(order, policy=draw(st.sampled_from(ORDERS)))
    cfg = attrs.evolve(
        cfg, prefix_cache="off", order=order,
        admission=attrs.evolve(cfg.admission, token_bucket=False, reserve_output=False, tier_slot_caps=()),
        eviction=attrs.evolve(cfg.eviction, preempt_for_priority=False))
    assert unsupported(cfg) is None, unsupported(cfg)
    return cfg


@settings(max_examples=200 if FULL else 40)
@given(data=st.data())
def test_fast_replica_on_hypothesis_workloads(data):
    """Drawn configurations the fast replica implements (caps, cooldowns, eviction limits,
    every victim policy, tiny pools), drawn workloads with cancellations and idle gaps."""
    cfg = data.draw(fast_configs())
    wl = data.draw(workloads(cfg, max_requests=25, big=data.draw(st.booleans()), long_outputs=True,
                             cancels=True, idle_gaps=True))
    assert assert_fast_same(cfg, wl, horizon_s=60.0)


class _LateBlocks(__import__("tenantry.runner.fast", fromlist=["x"]).FastReplica):
    """A broken fast replica: a lazy sequence's next KV block falls due one step late."""

    def _lazify(self, s):
        s.blocks += 1
        try:
            super()._lazify(s)
        finally:
            s.blocks -= 1


def test_the_fast_replica_comparison_catches_a_broken_replica():
    """The comparison is not vacuous: a fast replica that lets a lazy sequence decode past
    its last KV block records other outcomes than the readable step on the seed workload."""
    wl = seed001_workload(seed=9)
    cfg = apply_setup(seed001_config(wl.tenants), "vtc")
    assert _records_text(cfg, wl, 60.0, _LateBlocks) != _records_text(cfg, wl, 60.0)


def _lockstep_fast(config: Config, workload: Workload, horizon_s: float | None) -> int:
    """Step the readable model and the fast replica side by side: after every step the same
    clock, the same events (every field) and the same running request ids in batch order.
    Returns the steps compared."""
    from tenantry.runner.fast import FastReplica
    from tenantry.model.state import running_ids

    fast, model = FastReplica(config), ModelReplica(config)
    n = 0
    for inputs in drive(fast, workload, horizon_s=horizon_s):
        model.idle(fast.last_start_s)
        tr = model.step(inputs)
        n += 1
        k = tr.output.step_index
        assert fast.last.step_index == k
        assert fast.t_s == tr.state.t_s, f"clocks differ after step {k}"
        assert list(fast.last.events) == list(tr.output.events), f"events differ in step {k}"
        assert tuple(s.request_id for s in fast.batch.values()) == running_ids(tr.state), f"batch differs after step {k}"
    assert not model.has_work() or horizon_s is not None
    return n


@pytest.mark.parametrize("policy", ["fcfs", "vtc"])
def test_fast_replica_steps_in_lockstep_with_the_model(policy):
    """Beyond the records: every step's clock, events and batch membership agree (seed-001)."""
    wl = seed001_workload(seed=9)
    assert _lockstep_fast(apply_setup(seed001_config(wl.tenants), policy), wl, 40.0) > 2_000


@settings(max_examples=200 if FULL else 30)
@given(data=st.data())
def test_fast_replica_lockstep_on_hypothesis_workloads(data):
    cfg = data.draw(fast_configs())
    wl = data.draw(workloads(cfg, max_requests=25, big=data.draw(st.booleans()), long_outputs=True,
                             cancels=True, idle_gaps=True))
    _lockstep_fast(cfg, wl, 60.0)
