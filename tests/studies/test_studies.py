"""tenantry study: the seed-001 experiments' directions, the abuse heat map from a matrix, determinism, bad input."""

from __future__ import annotations

import json

import pytest

from tenantry.cli import main
from tenantry.model.config import ConfigError
from tenantry.studies import abuse_study, get_study, seed001_study, write_study


@pytest.fixture(scope="module")
def seed001():
    return seed001_study(quick=True)


def _row(result, experiment, measure):
    (r,) = [r for r in result.headline.rows if r[0] == experiment and r[1] == measure]
    return r


def test_seed001_queue_bound_and_token_rate_go_the_way_the_lesson_predicts(seed001):
    before, after = _row(seed001, "2 queue bound 50", "bulk 429s")[2:4]
    assert before == 0 and after > 100  # the bound turns bulk's excess away ...
    before, after = _row(seed001, "2 queue bound 50", "bulk TTFT p99 [s]")[2:4]
    assert after < before / 2  # ... and what it admits waits far less
    before, after = _row(seed001, "4 token rate vs request rate", "app 429s")[2:4]
    assert before > 50 and after == 0  # a token rate spares the tenant of many mid-size requests
    before, after = _row(seed001, "4 token rate vs request rate", "total tokens/s")[2:4]
    assert after > 1.1 * before


def test_seed001_weights_and_the_lift_change_nothing_for_tenants_that_get_all_they_ask(seed001):
    """The lesson predicts changes that need a backlogged tenant; in its own workload only bulk
    stays backlogged, so the model shows none, and the answer says why."""
    for experiment, measure in (("1 chat weight 2", "chat TTFT p99 [s]"), ("3 w_out = 1", "bulk / app tokens"),
                                ("5 chat late: no lift vs lift", "bulk/app worst TTFT p99 [s]")):
        r = _row(seed001, experiment, measure)
        assert r[2] == pytest.approx(r[3]) and r[-1] == "no"
    assert "only bulk stays backlogged" in seed001.answer


def test_seed001_contended_variant_goes_the_way_the_lesson_predicts(seed001):
    """With every tenant backlogged (app 4x, chat 100x), weight 2 lowers chat's TTFT and costs
    app tokens, w_out = 1 moves the bulk/app share, and a late chat without the lift takes
    service from the others (their TTFT up, their tokens down)."""
    before, after = _row(seed001, "1c chat weight 2 (contended)", "chat TTFT p99 [s]")[2:4]
    assert after < 0.8 * before
    before, after = _row(seed001, "1c chat weight 2 (contended)", "app tokens/s")[2:4]
    assert after < 0.9 * before
    before, after = _row(seed001, "3c w_out = 1 (contended)", "bulk / app tokens")[2:4]
    assert after < 0.97 * before  # bulk's output is cheaper relative to its prompt: its share falls
    before, after = _row(seed001, "5c chat late: no lift vs lift (contended)", "app TTFT p99 [s]")[2:4]
    assert after > 1.05 * before
    before, after = _row(seed001, "5c chat late: no lift vs lift (contended)", "bulk + app tokens/s")[2:4]
    assert after < 0.9 * before
    assert "rows 1c, 3c, 5c" in seed001.answer


def test_a_study_writes_the_same_bytes_twice(tmp_path, seed001):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, result in ((a, seed001), (b, seed001_study(quick=True))):
        d.mkdir()
        write_study(result, d, command="tenantry study seed-001 --quick")
    for name in ("report.md", "experiments.csv", "runs.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "experiments.png").stat().st_size > 1000


def _matrix(path, cells):
    path.mkdir()
    (path / "matrix.json").write_text(json.dumps({"cells": [
        {"setup": s, "pattern": p, "metrics": {"ttft_p99_inflation": v}} for s, p, v in cells]}))
    return path


def test_abuse_reads_a_check_matrix_into_a_heat_map(tmp_path):
    src = _matrix(tmp_path / "check", [("fcfs", "flood", 130.0), ("fcfs", "sybil", 2.0),
                                       ("vtc", "flood", 7.0), ("vtc", "sybil", 8.0)])
    r = abuse_study(source=src)
    assert r.headline.rows == (("fcfs", "flood", 130.0, 1), ("vtc", "sybil", 8.0, 0))
    assert r.tables[0].rows == (("fcfs", 130.0, 2.0), ("vtc", 7.0, 8.0))
    assert "vtc holds the victims' worst TTFT p99 to x8" in r.answer and "fcfs lets it reach x130" in r.answer
    out = tmp_path / "rep"
    out.mkdir()
    write_study(r, out, command="x")
    assert (out / "heatmap.png").stat().st_size > 1000
    assert (out / "ttft_p99_inflation.csv").read_text().splitlines()[1] == "fcfs,130.0,2.0"


def test_a_cell_not_run_is_grey_in_the_heat_map_not_the_scales_low_end(tmp_path):
    """fleet_rr runs only the fleet patterns: its few_huge cell has no value, drawn light grey
    (it was drawn as the colour of inflation 0.001, which reads as "no harm at all")."""
    import numpy as np
    from matplotlib.image import imread

    src = _matrix(tmp_path / "check", [("fcfs", "flood", 130.0), ("fcfs", "few_huge", 2.0),
                                       ("fleet_rr", "flood", 7.0)])
    out = tmp_path / "rep"
    out.mkdir()
    write_study(abuse_study(source=src), out, command="x")
    px = (imread(out / "heatmap.png")[..., :3] * 255).round().astype(int)
    grey = np.all(px == 211, axis=-1)  # matplotlib's "lightgrey"
    assert grey.sum() > 0.05 * grey.size  # one of four cells


def test_bad_study_input_is_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match="unknown study"):
        get_study("nope")
    (tmp_path / "junk").mkdir()
    with pytest.raises(ConfigError, match="not a tenantry check report"):
        abuse_study(source=tmp_path / "junk")
    assert main(["study", "nope", "--out", str(tmp_path / "x")]) == 2
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["study", "seed-001", "--quick", "--out", str(mine)]) == 2
    assert (mine / "notes.txt").read_text() == "keep me" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "not a tenantry study report" in err


def test_study_command_prints_the_headline_and_writes_the_folder(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["study", "abuse", "--from", str(_matrix(tmp_path / "c", [("fcfs", "flood", 50.0)])),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("setup") and "fcfs" in printed and f"report: {out}" in printed
    assert {p.name for p in out.iterdir()} >= {"report.md", "heatmap.png", "worst_pattern_per_setup.csv",
                                               ".tenantry-report"}


def test_thrash_shows_without_an_adversary_on_the_small_replica_and_hysteresis_bounds_it(tmp_path):
    from tenantry.studies.load import thrash_study

    bg = tmp_path / "burst.csv"
    bg.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "".join(
        f"{i * 0.2},{('ChatGPT', 'GPT-4')[i % 2]},{1500 + 37 * i},{200 + i},{1700 + 38 * i},Conversation log\n"
        for i in range(60)))
    r = thrash_study(quick=True, source=bg)
    rows = {(t, load, rep, s): row for t, load, rep, s, *row in r.headline.rows}
    for trace in ("azure", "burstgpt"):
        for load in (1.0, 4.0):
            no, yes = rows[(trace, load, "small", "no_hysteresis")], rows[(trace, load, "small", "hysteresis")]
            assert no[1] > 1.0 and no[1] > 2 * yes[1], (trace, load, no, yes)  # evictions per sequence
            assert yes[2] <= 3 < no[2]  # most evictions of one sequence: bounded by max_evictions = 3
    assert rows[("azure", 1.0, "default", "no_hysteresis")][1] == 0  # the large pool never evicts at x1
    (adv_no, adv_yes) = sorted(r.tables[0].rows, key=lambda a: a[1] != "no_hysteresis")
    assert adv_no[2] > adv_yes[2]
    assert r.answer.startswith("Yes, without any adversary")


def test_accounting_cost_covers_every_policy_and_size_and_sets_the_decode_step_from_the_roofline():
    """Shape and sources only: the times are measurements (no speed target in a unit test)."""
    from tenantry.studies.load import COST_POLICIES, COST_RUNNING_QUICK, COST_TENANTS_QUICK, \
        accounting_cost_study
    from tenantry.model.policies import step_duration_s
    from tenantry.runner.setups import default_config

    r = accounting_cost_study(quick=True)
    rows = r.tables[0].rows
    assert {(p, n, k) for p, n, k, *_ in rows} == {(p, n, k) for p in COST_POLICIES for n in COST_TENANTS_QUICK
                                                 for k in COST_RUNNING_QUICK}
    for policy, n, running, dec, picks, stp, decode_ms, frac in rows:
        assert dec > 0 and stp > 0 and picks >= 1
        assert decode_ms == pytest.approx(step_duration_s(default_config(("t",)), running, running * 2048) * 1e3)
        assert frac == pytest.approx(stp / 1e3 / decode_ms)
    assert 5 < rows[-1][6] < 40  # the 10-30 ms decode step the question names, from the roofline
    assert r.answer.split(":")[0] in ("Yes", "Not everywhere")


def _rec(rid, tenant, ttft, tokens=5, tpot=0.01, outcome="finished"):
    from tenantry.runner.history import RequestRecord

    first = None if ttft is None else 1.0 + ttft
    return RequestRecord(rid, tenant, 1.0, 10, tokens, outcome, "queue_full" if outcome == "rejected" else None,
                         None, 0 if outcome != "rejected" else None, 1.0 if first else None, first,
                         None if first is None else first + tpot * (tokens - 1), tokens if first else 0, 0, 0, 0)


def test_outside_slo_reads_ttft_and_tpot_p99_and_counts_a_refusal_as_a_miss():
    from tenantry.adversaries.objectives import outside_slo
    from tenantry.runner.history import History

    h = History(header={}, steps=(), requests=(
        _rec(0, "a", 0.5), _rec(1, "a", 0.7, tpot=0.2),     # a: TTFT fine, one slow decode
        _rec(2, "b", 3.0),                                   # b: TTFT past 2 s
        _rec(3, "c", 0.1), _rec(4, "c", None, outcome="rejected"),  # c: one 429
        _rec(5, "d", 1.9, tpot=0.04)))                       # d: within both
    assert outside_slo(h, {"a": (2.0, 0.05), "b": (2.0, None), "c": (2.0, 0.05), "d": (2.0, 0.05)}) == ["a", "b", "c"]
    assert outside_slo(h, {"a": (2.0, None), "b": (5.0, None)}) == []
    from tenantry.adversaries.objectives import OBJECTIVES, all_metrics

    assert "victims_outside_slo" in OBJECTIVES
    m = all_metrics(h, h, adversaries=("x",), victims=("a", "b", "d"), horizon_s=10.0, unit_cost=1.0,
                    slos={"a": (2.0, 0.05), "b": (2.0, None), "d": (2.0, 0.05)})
    assert m["victims_outside_slo"] == 2.0  # a (TPOT) and b (TTFT)
    assert all_metrics(h, h, adversaries=("x",), victims=("a", "d"), horizon_s=10.0,
                       unit_cost=1.0)["victims_outside_slo"] == 1.0  # default: TTFT 1 s (d's 1.9 s misses), no TPOT


def test_batch_size_finds_the_slo_batch_and_the_throughput_batch_per_workload_and_policy():
    from tenantry.studies.load import BATCH_POLICIES_QUICK, BATCH_SEQS_QUICK, batch_size_study

    r = batch_size_study(quick=True)
    grid = r.tables[0].rows
    assert len(grid) == 2 * len(BATCH_POLICIES_QUICK) * len(BATCH_SEQS_QUICK)
    for trace, policy, slo_cfg, slo_n, slo_tput, tput_cfg, tput_n, tput in r.headline.rows:
        cells = [g for g in grid if g[0] == trace and g[1] == policy]
        assert tput == max(g[6] for g in cells)
        assert int(slo_n.split()[0]) == max(g[4] for g in cells) >= int(tput_n.split()[0])
    seed = [g for g in grid if g[0] == "seed-001" and g[1] == "vtc"]
    assert max(g[4] for g in seed) >= 1 and all("bulk" in g[7] for g in seed)  # bulk is the overload: never in SLO
