"""Adversaries: parameter spaces, patterns, objectives, searches, shrinking and files.

Small budgets throughout; the done-criteria of ``tenantry check`` are in
tests/test_check.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tenantry.adversaries.evaluate import (
    InlineExecutor, Task, evaluate, make_executor, run_scenario, shrink_scenario as shrink,
)
from tenantry.adversaries.objectives import (
    MIN_PROBES, contended_share, jain, percentile, probe_auc, roc_auc, service_gap,
)
from tenantry.adversaries.patterns import PATTERNS, make_scenario, scenario_from_workload
from tenantry.adversaries.report import write_workload_files
from tenantry.adversaries.search import BATCH, Budget, run_search
from tenantry.adversaries.space import Param, Space, freeze
from tenantry.adversaries.victims import DEFAULT_VICTIMS, default_victims, victim_requests
from tenantry.model.config import ConfigError
from tenantry.model.workload import Workload
from tenantry.runner.history import History, RequestRecord, StepRecord
from tenantry.runner.setups import SETUPS, build_config
from tenantry.runner.traces import read_azure_csv, read_mooncake_jsonl, read_workload_jsonl


# --- spaces -----------------------------------------------------------------------


def test_space_decode_encode_round_trip_and_clamping():
    sp = Space([Param("rate_per_s", 2, 60, 30, log=True), Param("n", 1, 9, 3, integer=True), Param("x", 0, 1, 0.5)])
    assert sp.decode([0, 0, 0]) == {"rate_per_s": 2.0, "n": 1, "x": 0.0}
    assert sp.decode([1, 1, 1]) == {"rate_per_s": 60.0, "n": 9, "x": 1.0}
    # log scale: the midpoint is the geometric mean
    assert sp.decode([0.5, 0.5, 0.5])["rate_per_s"] == pytest.approx(math.sqrt(2 * 60), rel=1e-5)
    p = {"rate_per_s": 11.0, "n": 4, "x": 0.25}
    assert sp.decode(sp.encode(p)) == p
    assert sp.complete({"n": 100}) == {"rate_per_s": 30.0, "n": 9, "x": 0.5}
    with pytest.raises(ConfigError, match="unknown parameter"):
        sp.complete({"nope": 1})
    with pytest.raises(ConfigError, match="default outside"):
        Param("bad", 0, 1, 2)


def test_every_pattern_is_documented_and_its_defaults_make_a_scenario():
    for name, pat in PATTERNS.items():
        assert pat.exploits and pat.space.names, name
        assert all(h in SETUPS for h in pat.hurts), name  # empty: a pattern for the checks alone (cancellations)
        sc = make_scenario(name, {}, seed=3)
        assert sc.adversaries and sc.victims == ("chat", "conv", "code")
        adv = [r for r in sc.workload if r.tenant in sc.adversaries]
        assert adv, f"{name} sends nothing at its defaults"
        assert [r.request_id for r in sc.workload] == list(range(len(sc.workload)))
        build_config("protected", sc.roles)  # every tenant is configured


def test_victims_are_seeded_real_trace_windows():
    a, b = default_victims(5), default_victims(5)
    assert a == b and default_victims(6) != a
    conv = victim_requests(DEFAULT_VICTIMS[1], seed=5)
    assert conv and all(r.prefix_ids and r.prompt_tokens >= 16 * len(r.prefix_ids) for r in conv)
    assert all(0 <= r.arrival_s < 12.0 for r in a)
    assert all(r.predicted_output_tokens == r.output_tokens for r in a)


def test_sybil_uses_one_tenant_id_per_share():
    sc = make_scenario("sybil", {"n_ids": 5}, seed=0)
    assert sc.adversaries == ("adv0", "adv1", "adv2", "adv3", "adv4")
    counts = [sum(1 for r in sc.workload if r.tenant == t) for t in sc.adversaries]
    assert max(counts) - min(counts) <= 1


# --- objectives -------------------------------------------------------------------


def test_roc_auc_counts_ties_as_half():
    assert roc_auc([3, 4], [1, 2]) == 1.0
    assert roc_auc([1, 2], [3, 4]) == 0.0
    assert roc_auc([1, 2, 3], [1, 2, 3]) == 0.5
    assert roc_auc([2], [1, 2, 3]) == 0.5
    assert roc_auc([], [1]) == 0.5
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0


def _rec(rid, tenant, arrival, first_token, outcome="finished"):
    return RequestRecord(rid, tenant, arrival, 16, 1, outcome, first_scheduled_s=arrival, first_token_s=first_token,
                         finish_s=first_token, tokens_generated=1, admitted_step=0)


def test_probe_auc_pairs_each_guess_with_its_control():
    n = MIN_PROBES + 1
    fast = History({}, (), tuple(_rec(i, "adv", float(i), i + 0.1) for i in range(n)))
    slow = History({}, (), tuple(_rec(i, "adv", float(i), i + 0.5) for i in range(n)))
    labels = {i: True for i in range(n)}
    assert probe_auc(fast, slow, ["adv"], labels) == 1.0
    assert probe_auc(slow, slow, ["adv"], labels) == 0.5  # identical runs: exactly no information
    assert probe_auc(fast, slow, ["adv"], {0: True}) == 0.5  # too few labelled probes


def _step(k, queued, service):
    return StepRecord(k, float(k), 1.0, (), (), (), queued, {}, 0, {}, {}, service, {})


def test_service_gap_and_jain_over_common_backlog():
    steps = (
        _step(0, {"adv": 1, "v": 1}, {"adv": 0.0, "v": 0.0}),
        _step(1, {"adv": 1, "v": 1}, {"adv": 100.0, "v": 0.0}),
        _step(2, {"adv": 1, "v": 1}, {"adv": 300.0, "v": 50.0}),
        _step(3, {"adv": 0, "v": 1}, {"adv": 300.0, "v": 350.0}),  # v catches up; adv's queue empties
        _step(4, {"adv": 0, "v": 1}, {"adv": 300.0, "v": 900.0}),  # adv no longer backlogged: not counted
    )
    h = History({}, steps, ())
    # while both were backlogged at each step's start (steps 1-3), service(adv) - service(v)
    # went 0, 100, 250, -50: the largest swing over a sub-interval is 300, in units of 100
    assert service_gap(h, ["adv"], ["v"], unit=100.0) == pytest.approx(3.0)
    # contended steps 1..4 (v queued when each began): adv got 300, v got 900
    assert jain(h, ["adv"], ["v"]) == pytest.approx(1200 ** 2 / (2 * (300 ** 2 + 900 ** 2)))


def test_jain_counts_a_queued_actor_that_was_never_served():
    """Only the adversary served while two victims waited: 1/3 (it read 1, "equal", when only
    the served actors were counted); a victim never queued in a contended step is not an actor."""
    steps = (
        _step(0, {"adv": 1, "v1": 1, "v2": 1, "idle": 0}, {"adv": 0.0, "v1": 0.0, "v2": 0.0, "idle": 0.0}),
        _step(1, {"adv": 1, "v1": 1, "v2": 1, "idle": 0}, {"adv": 100.0, "v1": 0.0, "v2": 0.0, "idle": 0.0}),
        _step(2, {"adv": 1, "v1": 1, "v2": 1, "idle": 0}, {"adv": 250.0, "v1": 0.0, "v2": 0.0, "idle": 0.0}),
    )
    h = History({}, steps, ())
    assert jain(h, ["adv"], ["v1", "v2", "idle"]) == pytest.approx(1 / 3)
    assert contended_share(h, ["adv"], ["v1", "v2", "idle"]) == 1.0
    assert jain(History({}, steps[:1], ()), ["adv"], ["v1"]) == 1.0  # no contended step: nothing to compare


# --- evaluation, searches, shrinking ---------------------------------------------------


def test_evaluation_is_deterministic_and_scores_the_patterns_objective():
    t = Task("fcfs", "flood", freeze({"rate_per_s": 20}), seed=1)
    a, b = evaluate(t), evaluate(t)
    assert a == b
    assert a.score == a.metrics["ttft_p99_inflation"] > 1.0
    assert not a.findings


def test_budget_parsing():
    assert Budget.parse("40") == Budget(40, None)
    assert Budget.parse("30s") == Budget(None, 30.0)
    assert Budget.parse("40,2.5s") == Budget(40, 2.5)
    assert Budget(12).split(3) == Budget(4)
    with pytest.raises(ConfigError, match="--budget"):
        Budget.parse("lots")


@pytest.mark.parametrize("name", ["random", "evolution", "hypothesis"])
def test_search_spends_its_budget_and_is_reproducible(name):
    ex = InlineExecutor()
    a = run_search(name, "vtc_nolift", "idle_burst", seed=11, budget=Budget(BATCH + 2), executor=ex)
    b = run_search(name, "vtc_nolift", "idle_burst", seed=11, budget=Budget(BATCH + 2), executor=ex)
    assert a.evaluations == BATCH + 2
    assert a.scores == b.scores and a.best.params == b.best.params
    assert a.best.score == max(a.scores)
    assert a.best.index == a.scores.index(max(a.scores))  # ties go to the earliest


def test_results_do_not_depend_on_the_number_of_workers():
    budget = Budget(2 * BATCH)
    one = run_search("evolution", "fcfs", "queue_stuffing", seed=4, budget=budget, executor=InlineExecutor())
    with make_executor(2) as pool:
        two = run_search("evolution", "fcfs", "queue_stuffing", seed=4, budget=budget, executor=pool)
        shrunk_two = shrink("no_hysteresis", make_scenario("eviction_thrash", {}, 0), 10.0, executor=pool,
                            max_evaluations=10)
    assert one.scores == two.scores and one.best.params == two.best.params
    shrunk_one = shrink("no_hysteresis", make_scenario("eviction_thrash", {}, 0), 10.0, executor=InlineExecutor(),
                        max_evaluations=10)
    assert shrunk_one.scenario.workload == shrunk_two.scenario.workload


def test_z3_search_proposes_arrivals_that_replay_on_the_model():
    res = run_search("z3", "priority", "timed_arrivals", seed=0, budget=Budget(2), executor=InlineExecutor())
    assert res.evaluations == 2
    counts = [res.best.params[f"c{k}"] for k in range(8)]
    assert sum(counts) == sum(PATTERNS["timed_arrivals"].space.defaults().values())
    # the replayed score is the real model's, not the abstraction's
    again = evaluate(Task("priority", "timed_arrivals", freeze(res.best.params), 0))
    assert again.score == res.best.score
    unsupported = run_search("z3", "aging", "timed_arrivals", seed=0, budget=Budget(2), executor=InlineExecutor())
    assert unsupported.evaluations == 0 and "aging" in unsupported.note


def test_shrinking_keeps_the_objective_and_removes_requests():
    sc = make_scenario("flood", {}, 0)
    res = shrink("fcfs", sc, 20.0, executor=InlineExecutor(), max_evaluations=30)
    assert res.evaluation.score >= 20.0
    assert res.requests < res.original_requests // 4
    # the reduced workload replays to the same score
    _, _, _, ev = run_scenario("fcfs", res.scenario)
    assert ev.score == res.evaluation.score
    assert shrink("fcfs", sc, 1e9, executor=InlineExecutor(), max_evaluations=5) is None


def test_workload_files_replay_in_all_three_formats(tmp_path):
    sc = make_scenario("prefix_probe", {}, 2)
    files = write_workload_files(sc, tmp_path)
    back = read_workload_jsonl(tmp_path / files["jsonl"])
    assert back == sc.workload
    adv = [r for r in sc.workload if r.tenant == "adv"]
    az = read_azure_csv(tmp_path / files["azure"]["adv"], "adv", start="2023-11-16 00:00:00")
    assert [(r.prompt_tokens, r.output_tokens) for r in az] == [(r.prompt_tokens, r.output_tokens) for r in adv]
    assert [r.arrival_s for r in az] == pytest.approx([r.arrival_s for r in adv], abs=1e-6)
    mc = read_mooncake_jsonl(tmp_path / files["mooncake"]["conv"], "conv")
    conv = [r for r in sc.workload if r.tenant == "conv"]
    assert [r.prompt_tokens for r in mc] == [r.prompt_tokens for r in conv]
    assert read_workload_jsonl(tmp_path / "twin.jsonl") == sc.twin.workload
    # a replayed file is a scenario again
    again = scenario_from_workload(back, ("adv",), victims=sc.victims, pattern="prefix_probe")
    assert again.roles == sc.roles
    assert scenario_from_workload(back, ("adv",)).victims == tuple(t for t in back.tenants if t != "adv")


def test_a_run_evaluates_a_built_in_setups_task_once_and_a_system_every_time():
    """Inside same_tasks_once, a repeated task of a built-in setup is answered from memory with the
    same evaluation; a System's (a scheduler under test, maybe not deterministic) runs each time;
    outside, nothing is kept."""
    from tenantry.adversaries.evaluate import ModelSystem, evaluate_batch, same_tasks_once

    class Counting(InlineExecutor):
        def __init__(self):
            super().__init__()
            self.calls = []

        def submit(self, fn, /, *args, **kwargs):
            self.calls.append(args[0])
            return super().submit(fn, *args, **kwargs)

    params = freeze(PATTERNS["flood"].space.defaults())
    named, system = Task("fcfs", "flood", params, 0), Task(ModelSystem("fcfs"), "flood", params, 0)
    ex = Counting()
    with same_tasks_once():
        first = evaluate_batch(ex, [named, system])
        again = evaluate_batch(ex, [named, system, named])
    assert ex.calls == [named, system, system]
    assert again[0] is first[0] and again[2] is first[0] and again[1] == first[1] == first[0]
    evaluate_batch(ex, [named])
    assert ex.calls[-1] == named and len(ex.calls) == 4


def test_overlapping_runs_share_the_memory_and_the_last_to_end_drops_it():
    """Two runs under way at once (threads of one process) share what was evaluated; it goes when
    the last of them ends, whichever order they end in (a fresh user left it set by ending them
    in the other order than they began)."""
    from tenantry.adversaries import evaluate as ev_mod

    first, second = ev_mod.same_tasks_once(), ev_mod.same_tasks_once()
    first.__enter__()
    second.__enter__()
    shared = ev_mod._DONE
    assert shared == {}
    first.__exit__(None, None, None)
    assert ev_mod._DONE is shared
    second.__exit__(None, None, None)
    assert ev_mod._DONE is None


def test_cancellations_abort_requests_that_share_a_cached_prefix():
    """Found by a blind fault test: no cancelled request ever had prefix ids (0 of 351), so a
    scheduler that leaks cached prefix blocks on abort was caught only in two fleet cells."""
    sc = make_scenario("cancellations", None, seed=0)
    adv = [r for r in sc.workload if r.tenant in sc.adversaries]
    shared = [r for r in adv if r.prefix_ids]
    assert shared and all(r.cancel_s is not None for r in adv)
    assert len({r.prefix_ids for r in shared}) == 1 and len(shared) >= len(adv) // 2
    assert {r.cancel_s - r.arrival_s for r in shared} != {shared[0].cancel_s - shared[0].arrival_s}  # every stage
