"""``tenantry check``: the done-criteria of the adversary matrix, as assertions.

Each criterion runs the matrix cell(s) it is about with a fixed seed and a
small budget (the patterns' documented defaults are among the candidates), so
the default run stays fast; with ``--hypothesis-profile=deep`` (or ``HYPOTHESIS_PROFILE=deep``) the same
assertions run with up to 60 s of search per cell (``test_criteria_hold_after_60s_searches``).
"""

from __future__ import annotations

import json
import os

import pytest

from tenantry.adversaries.check import run_cell, run_check
from tenantry.adversaries.evaluate import InlineExecutor, run_scenario
from tenantry.adversaries.patterns import PATTERNS, make_scenario
from tenantry.adversaries.search import Budget
from tenantry.runner.setups import HYSTERESIS, SETUPS, get_setup

SEED = 0


def _deep_profile() -> bool:
    """True under ``HYPOTHESIS_PROFILE=deep`` or ``pytest --hypothesis-profile=deep`` (the loaded profile)."""
    from hypothesis import settings

    loaded = getattr(settings, "_current_profile", None)  # private; fall back to the deep profile's size
    return (os.environ.get("HYPOTHESIS_PROFILE") == "deep" or loaded == "deep"
            or settings.default.max_examples >= settings.get_profile("deep").max_examples)


DEEP = _deep_profile()


def cell(setup: str, pattern: str, budget: str = "3", searches=("random", "evolution", "hypothesis"),
         executor=None) -> dict:
    return run_cell(setup, pattern, seed=SEED, budget=Budget.parse(budget), executor=executor or InlineExecutor(),
                    out=None, shrink_evaluations=0, searches=searches)


def history_of(c: dict):
    sc = make_scenario(c["pattern"], c["params"], SEED)
    h, base, _, _ = run_scenario(c["setup"], sc, depth=None)
    return sc, h, base


# --- the criteria -----------------------------------------------------------------


def check_fcfs_flood(c):
    # the light victim (chat: 1 req/s, 160-token prompts) suffers at least 20-fold at p99
    assert c["metrics"]["ttft_p99_inflation[chat]"] >= 20.0
    assert not c["findings"]


def _backlog_stretch(h, adv):
    """(start, end) of the high tier's first unbroken backlog: queued at the end of every step in it."""
    queued = [(s.start_s + s.duration_s, any(s.queued.get(t, 0) > 0 for t in adv)) for s in h.steps]
    start = next(i for i, (_, q) in enumerate(queued) if q)
    stop = next((i for i in range(start, len(queued)) if not queued[i][1]), len(queued) - 1)
    return queued[start][0], queued[stop][0]


def _sched(r, h):
    return r.first_scheduled_s if r.first_scheduled_s is not None else h.end_s


def _overtaking_s(h, victims, adv):
    """Longest lead by which a high-tier request that arrived after a waiting low-tier one went first."""
    a_reqs = [r for r in h.requests if r.tenant in adv and r.first_scheduled_s is not None]
    return max((a.arrival_s - v.arrival_s for v in h.requests if v.tenant in victims and v.admitted_step is not None
                for a in a_reqs if a.arrival_s > v.arrival_s and a.first_scheduled_s < _sched(v, h)), default=0.0)


def check_priority_starves_and_aging_floors_bound(pri, aging, floors):
    rate = get_setup("aging").order.aging_rate_per_s
    sc, h, _ = history_of(pri)
    adv = set(sc.adversaries)
    a_s, b_s = _backlog_stretch(h, adv)
    assert b_s - a_s >= 0.6 * h.end_s
    # strict priority: a low-tier request that arrived as the high tier's backlog began waits it out whole,
    # while high-tier requests sent seconds later go first
    early = [r for r in h.requests if r.tenant in sc.victims and r.admitted_step is not None and a_s <= r.arrival_s < a_s + 2]
    assert max(_sched(r, h) for r in early) >= b_s - 0.5
    assert pri["metrics"]["starvation_s"] >= 0.6 * h.end_s
    assert _overtaking_s(h, sc.victims, adv) > 5.0 / rate
    # the same workload under aging and under floors: no low-tier request waits out the backlog
    for setup in ("aging", "floors"):
        h2, _, _, ev = run_scenario(setup, sc, depth="full")
        a2, b2 = _backlog_stretch(h2, adv)
        early2 = [r for r in h2.requests if r.tenant in sc.victims and r.admitted_step is not None and a2 <= r.arrival_s < a2 + 2]
        assert max(_sched(r, h2) for r in early2) < b2 - 1.0, setup
        assert not ev.findings, setup
        if setup == "aging":  # and nothing sent more than 1 / aging_rate later jumps ahead
            assert _overtaking_s(h2, sc.victims, adv) <= 1.0 / rate + 0.1
    # each one's own worst workload: its claims hold (AGING, FLOOR, QUEUE-BOUND), and aging's overtaking bound
    assert not aging["findings"] and "AGING" not in aging["unchecked"]
    assert not floors["findings"] and "FLOOR" not in floors["unchecked"]
    sc3, h3, _ = history_of(aging)
    assert _overtaking_s(h3, sc3.victims, set(sc3.adversaries)) <= 1.0 / rate + 0.1


def check_lift(nolift, lift):
    # without the lift, the returning tenant is served ahead of the victims for seconds and
    # gains several of the largest requests' worth of service over them
    assert nolift["metrics"]["starvation_s"] >= 4.0
    assert nolift["metrics"]["service_gap"] >= 4.0
    # with it, the service gap is at most half as large (the VTC bound holds: nothing broken),
    # and a victim waits no longer than twice the time the adversary's requests hold a batch slot
    assert nolift["metrics"]["service_gap"] >= 2 * lift["metrics"]["service_gap"]
    assert not lift["findings"]
    sc, h, _ = history_of(lift)
    hold_s = max(r.finish_s - r.first_scheduled_s for r in h.requests
                 if r.tenant in sc.adversaries and r.finish_s is not None and r.first_scheduled_s is not None)
    assert lift["metrics"]["starvation_s"] <= 2 * hold_s < nolift["metrics"]["starvation_s"]


def check_hysteresis(no_h, with_h):
    assert no_h["metrics"]["max_evictions"] >= 10
    assert with_h["metrics"]["max_evictions"] <= HYSTERESIS.max_evictions
    assert with_h["metrics"]["wasted_prefill_tokens"] < no_h["metrics"]["wasted_prefill_tokens"]
    assert not with_h["findings"]


def check_probe(shared, salted):
    assert shared["metrics"]["probe_auc"] >= 0.9
    assert abs(salted["metrics"]["probe_auc"] - 0.5) <= 0.05
    assert not salted["findings"]  # SALT-ISOLATION and NONINTERFERENCE hold


def check_few_huge(rr, rl):
    for c in (rr, rl):
        assert c["metrics"]["contended_share"] > 0.5  # the heavy tenant gets most of the tokens


def test_fcfs_flood_inflates_a_light_victims_p99_20_fold():
    check_fcfs_flood(cell("fcfs", "flood"))


def test_strict_priority_starves_while_aging_and_floors_bound_the_wait():
    check_priority_starves_and_aging_floors_bound(cell("priority", "flood"), cell("aging", "flood"),
                                                  cell("floors", "flood"))


def test_idle_then_burst_banks_credit_only_without_the_lift():
    check_lift(cell("vtc_nolift", "idle_burst"), cell("vtc", "idle_burst"))


def test_eviction_thrash_without_hysteresis_and_bounded_with_it():
    check_hysteresis(cell("no_hysteresis", "eviction_thrash"), cell("hysteresis", "eviction_thrash"))


def test_prefix_probe_reads_a_shared_cache_but_not_a_salted_one():
    check_probe(cell("shared_cache", "prefix_probe"), cell("salted_cache", "prefix_probe"))


def test_few_huge_requests_take_most_tokens_under_request_fairness():
    check_few_huge(cell("round_robin", "few_huge"), cell("rate_limit", "few_huge"))


def test_fully_protected_setups_break_no_invariant():
    # every pattern at its defaults against VTC with every protection; the DRR variant on the
    # patterns aimed at it.  Checked at depth "full": state, history and two-run forms.
    cells = [("protected", p) for p in PATTERNS] + [("protected_drr", p) for p in ("churn", "sybil", "idle_burst")]
    for setup, pattern in cells:
        c = cell(setup, pattern, budget="1", searches=("random",))
        assert not c["findings"], (setup, pattern, c["findings"])
        assert "KV-CONSERVE" not in c["unchecked"] and "NO-LOSS" not in c["unchecked"]


@pytest.mark.skipif(not DEEP, reason="60-second searches: run with --hypothesis-profile=deep or HYPOTHESIS_PROFILE=deep")
def test_criteria_hold_after_60s_searches():
    from tenantry.adversaries.evaluate import make_executor

    with make_executor(2) as pool:
        def deep(setup, pattern, seconds=60):
            return cell(setup, pattern, f"100000,{seconds}s", executor=pool)

        check_fcfs_flood(deep("fcfs", "flood"))
        check_priority_starves_and_aging_floors_bound(deep("priority", "flood"), deep("aging", "flood"),
                                                      deep("floors", "flood"))
        check_lift(deep("vtc_nolift", "idle_burst"), deep("vtc", "idle_burst"))
        check_hysteresis(deep("no_hysteresis", "eviction_thrash"), deep("hysteresis", "eviction_thrash"))
        check_probe(deep("shared_cache", "prefix_probe"), deep("salted_cache", "prefix_probe"))
        check_few_huge(deep("round_robin", "few_huge"), deep("rate_limit", "few_huge"))
        for pattern in PATTERNS:
            assert not deep("protected", pattern, 20)["findings"], pattern


# --- the command ---------------------------------------------------------------------


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix in (".jsonl", ".csv", ".json", ".md") and p.name != "timing.json"}


def test_same_seed_gives_the_same_matrix_and_workload_files(tmp_path):
    kw = dict(setups=["fcfs", "vtc_nolift"], patterns=["flood"], seed=3, budget=Budget(3),
              shrink_evaluations=4, plots="none", extras=False, progress=False)
    out = tmp_path / "rep"
    run_check(out=out, workers=1, **{**kw, "setups": ["fcfs", "vtc_nolift", "vtc"]})  # a previous, larger run
    assert (out / "cells" / "vtc").is_dir()
    a = run_check(out=out, workers=1, **kw)
    fa = _files(out)
    assert not (out / "cells" / "vtc").exists()  # the previous run's cells do not survive: replaced whole
    marker_a = (out / ".tenantry-report").read_bytes()
    b = run_check(out=out, workers=2, cell_threads=1, **kw)
    fb = _files(out)
    assert fa == fb  # byte-identical matrix.json, matrix.md, report.md, cell.json and workload files
    assert {"matrix.json", "matrix.md", "report.md"} <= set(fa)
    marker = json.loads((out / ".tenantry-report").read_text())  # the marker lists every file of the report
    assert (marker["kind"], marker["size"]) == ("check", 2) and "cells/fcfs/flood/cell.json" in marker["files"]
    assert (out / ".tenantry-report").read_bytes() == marker_a
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # no staging folder or lock left behind
    assert (out / "matrix.json").stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert "tenantry check --replay cells/fcfs/flood`" in fa["report.md"].decode()  # run from the report folder
    assert "cells/fcfs/flood/workload.jsonl" in fa and "cells/fcfs/flood/azure/adv.csv" in fa
    assert "cells/fcfs/flood/mooncake/chat.jsonl" in fa and "cells/fcfs/flood/shrunk.jsonl" in fa
    assert a["cells"][("fcfs", "flood")]["score"] == b["cells"][("fcfs", "flood")]["score"]
    md = fa["matrix.md"].decode()  # readable alone (a fresh user: the bare table said nothing of * ? ~ !)
    assert "`*` hurt" in md and "flood: ttft_p99_inflation (" in md and "| fcfs" in md
    m = json.loads((out / "matrix.json").read_text())
    assert [c["setup"] for c in m["cells"]] == ["fcfs", "vtc_nolift"]


def _umask() -> int:
    m = os.umask(0o022)
    os.umask(m)
    return m


def test_an_interrupted_run_leaves_the_old_report_untouched(tmp_path):
    from tenantry.adversaries.outdir import staged_folder

    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.md").write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with staged_folder(out) as tmp:
            (tmp / "report.md").write_text("new, half written")
            raise KeyboardInterrupt
    assert (out / "report.md").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]
    with staged_folder(out) as tmp:
        (tmp / "matrix.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["matrix.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_command_prints_the_matrix_writes_the_report_and_replays(tmp_path, capsys):
    from tenantry.cli import main

    out = tmp_path / "rep"
    code = main(["check", "--policy", "fcfs", "vtc", "--pattern", "flood", "--budget", "2", "--out", str(out),
                 "--quiet", "--no-extras", "--workers", "1"])
    text = capsys.readouterr().out
    assert code == 0
    assert "setup \\ pattern" in text and "cells/fcfs/flood/workload.jsonl" in text and "evaluations/s" in text
    report = (out / "report.md").read_text()
    assert "| fcfs |" in report and "![ttft_cdf.png](cells/fcfs/flood/ttft_cdf.png)" in report
    assert (out / "cells" / "fcfs" / "flood" / "ttft_cdf.png").stat().st_size > 1000
    recorded = json.loads((out / "cells" / "fcfs" / "flood" / "cell.json").read_text())
    assert main(["check", "--replay", str(out / "cells" / "fcfs" / "flood")]) == 0
    replayed = capsys.readouterr().out
    assert f"(recorded {recorded['score']:.6g}: same)" in replayed
    cell_dir = out / "cells" / "fcfs" / "flood"
    witness = cell_dir / "finding-X.jsonl"  # a file of the cell (a finding's witness): run with the cell's roles
    witness.write_text("\n".join((cell_dir / "workload.jsonl").read_text().splitlines()[:3]) + "\n")
    assert main(["check", "--replay", str(witness)]) == 0
    assert "(finding-X.jsonl, 3 requests)" in capsys.readouterr().out
    (cell_dir / "workload.jsonl").write_text("")
    assert _code(["check", "--replay", str(cell_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "workload.jsonl" in err and "no requests" in err
    text = (cell_dir / "cell.json").read_text()
    (cell_dir / "cell.json").write_text(text[: len(text) // 2])
    assert _code(["check", "--replay", str(cell_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cell.json" in err and "not valid JSON" in err


def test_a_shrunk_prefix_probe_replays_with_its_own_twin_and_every_metric_is_compared(tmp_path, capsys):
    """The shrunk workload's control twin is written beside it (shrunk-twin.jsonl), so replaying
    shrunk.jsonl gives the recorded shrunk_score (without it the probe had no twin: 0.5 against 1);
    a replayed cell is compared on every recorded metric, not the score alone."""
    from tenantry.cli import main

    out = tmp_path / "rep"
    assert main(["check", "--policy", "shared_cache", "--pattern", "prefix_probe", "--budget", "8", "--out", str(out),
                 "--quiet", "--no-extras", "--workers", "1", "--plots", "none"]) == 0
    cell_dir = out / "cells" / "shared_cache" / "prefix_probe"
    cell = json.loads((cell_dir / "cell.json").read_text())
    assert cell["shrunk_requests"] < cell["adversary_requests"] and (cell_dir / "shrunk-twin.jsonl").exists()
    assert cell["replay"] == "tenantry check --replay cells/shared_cache/prefix_probe"  # from the report folder
    assert f"replay shared_cache/prefix_probe (hurt): tenantry check --replay {cell_dir}" in capsys.readouterr().out
    assert main(["check", "--replay", str(cell_dir / "shrunk.jsonl")]) == 0
    assert f"probe_auc = {cell['shrunk_score']:.6g} (recorded {cell['shrunk_score']:.6g}: same)" in capsys.readouterr().out
    cell["metrics"]["contended_share"] = 0.5  # a recorded metric the replay does not give back
    (cell_dir / "cell.json").write_text(json.dumps(cell))
    assert main(["check", "--replay", str(cell_dir)]) == 0
    text = capsys.readouterr().out
    assert f"(recorded {cell['score']:.6g}: DIFFERENT)" in text and "(recorded 0.5)" in text


def test_command_exits_nonzero_when_a_claimed_invariant_breaks(monkeypatch, capsys, tmp_path):
    from tenantry.adversaries import check as check_mod

    monkeypatch.chdir(tmp_path)  # the default ./tenantry-check of a user's main job must not matter (or be touched)

    def fake_run_check(**kw):
        c = {"setup": "vtc", "pattern": "flood", "objective": "ttft_p99_inflation", "score": 2.0, "finding": False,
             "findings": [{"invariant": "VTC-GAP", "step": 9, "message": "..."}], "search": "random",
             "workload": "cells/vtc/flood/workload.jsonl"}
        summary = {"setups": ["vtc"], "patterns": ["flood"], "extras": {}}
        return {"summary": summary, "cells": {("vtc", "flood"): c}, "claimed_broken": True, "wall_s": 1.0,
                "evaluations": 1}

    monkeypatch.setattr(check_mod, "run_check", fake_run_check)
    from tenantry.cli import main
    assert main(["check", "--policy", "vtc", "--pattern", "flood", "--quiet"]) == 1
    assert "VTC-GAP BROKEN" in capsys.readouterr().out


def test_bad_names_are_one_line_errors(capsys):
    from tenantry.cli import main
    assert main(["check", "--policy", "nope", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nope" in err and "fcfs" in err
    assert _code(["check", "--budget", "lots", "--quiet"]) == 2
    assert "--budget" in capsys.readouterr().err


def _code(argv) -> int:
    """main's exit status, also when argparse exits with a usage error."""
    from tenantry.cli import main
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("argv, words", [
    (["check", "--seed", "-1"], ["--seed", "-1", ">= 0"]),
    (["check", "--workers", "0"], ["--workers", "0", ">= 1"]),
    (["check", "--shrink", "-2"], ["--shrink", "-2", ">= 0"]),
    (["check", "--budget", "-3"], ["--budget", "-3", "positive"]),
    (["check", "--budget", "0"], ["--budget", "0", "N >= 1"]),
    (["verify", "--history", "h.jsonl", "--seed", "-1"], ["--seed", "-1"]),
    (["verify", "--target", "a:b", "--timeout-s", "nan"], ["--timeout-s", "nan", "positive finite"]),
    (["verify", "--target", "a:b", "--horizon-s", "-1"], ["--horizon-s", "-1", "positive finite"]),
    (["verify", "--target", "a:b", "--cancellations", "c.json"], ["--cancellations", "c.json", "needs --workload"]),
    (["verify", "--history", "h.jsonl", "--patterns", "flood"], ["--patterns", "flood", "only with --target"]),
    (["verify", "--history", "h.jsonl", "--workload", "w.jsonl"], ["--workload", "w.jsonl", "only with --target"]),
    (["verify", "--target", "a:b", "--claims", "VTC-GAP"], ["--claims", "VTC-GAP", "only with --history"]),
    (["verify", "--target", "a:b", "--config", "c.toml"], ["--config", "c.toml", "only with --history"]),
])
def test_bad_flag_values_are_one_line_usage_errors(argv, words, capsys):
    assert _code(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert all(w in err[-1] for w in words), err
    assert not any("Traceback" in line for line in err)


@pytest.mark.parametrize("argv, dest, want", [
    (["check", "--pattern", "flood", "sybil"], "pattern", ["flood", "sybil"]),
    (["check", "--patterns", "flood,sybil"], "pattern", ["flood", "sybil"]),
    (["check", "--policy", "vtc,fcfs", "drr_tokens", "vtc"], "policy", ["vtc", "fcfs", "drr_tokens"]),
    (["verify", "--target", "a:b", "--patterns", "flood,sybil"], "patterns", ["flood", "sybil"]),
    (["verify", "--target", "a:b", "--pattern", "flood", "sybil"], "patterns", ["flood", "sybil"]),
    (["verify", "--target", "a:b"], "patterns", None),
])
def test_pattern_and_setup_lists_take_spaces_or_commas(argv, dest, want):
    """``check --pattern`` and ``verify --patterns`` (each takes the other spelling) read the same lists."""
    from tenantry.cli.dispatch import build_parser

    assert getattr(build_parser().parse_args(argv), dest) == want


def test_an_unknown_search_or_a_replay_file_outside_a_cell_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    """A fresh user: ``check --search nosuch`` printed the run's banner before its error, and
    ``check --replay README.md`` named the folder '.', not the file given."""
    monkeypatch.chdir(tmp_path)
    assert _code(["check", "--search", "nosuch", "--out", "zz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--search='nosuch'" in err[0] and "random" in err[0], err
    assert not (tmp_path / "zz").exists()
    (tmp_path / "notes.md").write_text("mine\n")
    assert _code(["check", "--replay", "notes.md"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--replay='notes.md'" in err[0] and "beside it" in err[0], err


def test_an_empty_target_workload_names_the_file(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert _code(["verify", "--target", "a:b", "--workload", str(empty), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "empty.jsonl" in err and "no requests" in err and err.count("\n") == 0
    assert set(SETUPS) >= {"fcfs", "round_robin", "rate_limit", "vtc", "vtc_nolift", "drr_block_seconds", "priority", "aging",
                           "floors", "no_hysteresis", "shared_cache", "protected"}


def test_victims_shared_without_the_traces_names_the_flag(monkeypatch, tmp_path, capsys):
    from tenantry.adversaries import victims

    monkeypatch.setattr(victims, "_SHARED", tmp_path / "no-traces")
    assert _code(["check", "--victims", "shared", "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--victims" in err and "not found; use --victims excerpt" in err
    assert not (tmp_path / "o").exists()


# --- seed spread, expectations, budgets ---------------------------------------------------------


def test_a_verdict_near_the_hurt_level_is_rescored_on_two_more_victim_seeds():
    from tenantry.adversaries.check import near_threshold
    from tenantry.adversaries.evaluate import Task, evaluate
    from tenantry.adversaries.space import freeze

    c = run_cell("vtc", "queue_stuffing", seed=SEED, budget=Budget(6), executor=InlineExecutor(), out=None,
                 shrink_evaluations=0, searches=("random",))
    assert near_threshold(c["score"], c["threshold"]) and c["threshold"] == 20.0
    assert list(c["spread"]) == ["0", "1", "2"] and c["spread"]["0"] == c["score"]
    for k in (1, 2):  # the same adversary workload, the victims drawn from another seed
        assert c["spread"][str(k)] == evaluate(Task("vtc", "queue_stuffing", freeze(c["params"]), k, depth=None)).score
    hurt = [v >= c["threshold"] for v in c["spread"].values()]
    assert c["verdict"] == ("seed-dependent" if any(hurt) and not all(hurt) else "hurt" if all(hurt) else "not hurt")
    assert c["verdict"] == "seed-dependent"  # 10.8 on seed 0, 37.8 on seed 1
    assert c["expected_hurt"] is False and c["evaluations"] == 6 + 2
    far = run_cell("fcfs", "flood", seed=SEED, budget=Budget(1), executor=InlineExecutor(), out=None,
                   shrink_evaluations=0, searches=("random",))
    assert far["score"] >= 40 and list(far["spread"]) == ["0"] and far["verdict"] == "hurt"  # not near: not re-scored


def test_marks_and_the_expectations_section():
    from tenantry.adversaries.report import cell_lines, matrix_text, write_report

    base = {"objective": "ttft_p99_inflation", "threshold": 20.0, "findings": [], "search": "random",
            "metrics": {}, "workload": "w.jsonl"}
    cells = {("vtc", "flood"): {**base, "score": 17.4, "finding": False, "verdict": "seed-dependent",
                                "expected_hurt": True, "spread": {"0": 17.4, "1": 58.4, "2": 12.0}},
             ("fcfs", "flood"): {**base, "score": 130.0, "finding": True, "verdict": "hurt", "expected_hurt": True,
                                 "spread": {"0": 130.0}}}
    text = matrix_text(["fcfs", "vtc"], ["flood"], cells)
    assert text.splitlines()[1].split() == ["fcfs", "130*"] and text.splitlines()[2].split() == ["vtc", "17.4?~"]
    assert "  " in text.splitlines()[2]  # columns two spaces apart
    assert cell_lines(["vtc"], ["flood"], cells)[0].split()[3] == "17.4?~"
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        summary = {"setups": ["vtc"], "patterns": ["flood"], "seed": 0, "budget": "12 evaluations",
                   "searches": ["random"], "extras": {}, "expected": 1, "spread_seeds": [0, 1, 2]}
        md = write_report(d, summary, {("vtc", "flood"): cells[("vtc", "flood")]}, {}).read_text()
    assert "0 of 1 \"should hurt\" expectations met; 1 verdicts change with the victims' seed." in md
    assert "- expected to hurt, did not: `vtc` / `flood`: ttft_p99_inflation = 17.4 (hurt at >= 20); " \
           "17.4 / 58.4 / 12 on seeds 0 / 1 / 2" in md


def test_strict_fails_the_run_on_an_unmet_expectation(monkeypatch, capsys, tmp_path):
    from tenantry.adversaries import check as check_mod

    def fake_run_check(**kw):
        c = {"setup": "rate_limit", "pattern": "flood", "objective": "ttft_p99_inflation", "score": 8.4,
             "finding": False, "findings": [], "search": "random", "workload": "cells/rate_limit/flood/workload.jsonl",
             "expected_hurt": True, "verdict": "not hurt"}
        summary = {"setups": ["rate_limit"], "patterns": ["flood"], "extras": {}, "expected": 1}
        return {"summary": summary, "cells": {("rate_limit", "flood"): c}, "claimed_broken": False, "wall_s": 1.0,
                "evaluations": 1, "unmet": [("rate_limit", "flood")], "seed_dependent": []}

    monkeypatch.setattr(check_mod, "run_check", fake_run_check)
    from tenantry.cli import main
    argv = ["check", "--policy", "rate_limit", "--pattern", "flood", "--quiet", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "expectations: 0 of 1 \"should hurt\" met; not met (~): rate_limit/flood" in out and "8.4~" in out
    assert main(argv + ["--strict"]) == 1
    assert "--strict: 1 expected to hurt and did not: exit 1" in capsys.readouterr().err


def test_the_total_budget_divides_evaluations_and_paces_seconds(tmp_path):
    from tenantry.adversaries.check import cell_budget

    def cb(budget, total, **kw):
        return cell_budget(budget, total, **{"cells_left": 4, "n_cells": 4, "threads": 2, "seconds_left": None, **kw})

    assert cb(Budget(12), None) == (Budget(12), 16)
    assert cb(Budget(12), Budget(20)) == (Budget(5), 16)
    assert cb(Budget(3), Budget(20)) == (Budget(3), 16)
    # 60 s left, 2 threads, 4 cells to go: a share of 30 s; 40 % of it for the searches
    assert cb(Budget(12), Budget(None, 100.0), seconds_left=60.0) == (Budget(12, 12.0), 16)
    assert cb(Budget(12, 5.0), Budget(None, 100.0), seconds_left=60.0) == (Budget(12, 5.0), 16)
    # an evaluation measured at 2 s: 6 fit in the searches' 12 s, 3 in shrinking's 6 s
    assert cb(Budget(12), Budget(None, 100.0), seconds_left=60.0, seconds_per_evaluation=2.0) == (Budget(6, 12.0), 3)
    assert cb(Budget(12), Budget(None, 100.0), seconds_left=-3.0) == (Budget(1, 0.01), 0)  # past the deadline
    res = run_check(setups=["fcfs", "vtc"], patterns=["flood"], seed=0, budget=Budget(12), total_budget=Budget(4),
                    workers=1, shrink_evaluations=0, plots="none", extras=False, progress=False, out=None,
                    searches=("random",))
    assert [c["searches"]["random"]["evaluations"] for c in res["cells"].values()] == [2, 2]
    assert res["summary"]["total_budget"] == "4 evaluations"


def test_a_failed_proof_in_the_extras_makes_check_exit_1(monkeypatch, tmp_path, capsys):
    """A proof of the short run that does not hold failed the run's extras but check exited 0."""
    import attrs
    import z3

    from tenantry.adversaries import check as check_mod
    from tenantry.proofs import registry
    from tenantry.proofs.core import Proof

    holds = attrs.evolve(registry.PROOFS[0], twins=())  # a real proof, proved in well under a second
    broken = Proof("BROKEN-DEMO", "demo", "x > 0 for every integer x", "any N",
                   lambda: [("positive", z3.Not(z3.Int("x") > 0))])  # satisfiable: a counterexample, refuted
    monkeypatch.setattr(check_mod, "STATEFUL_SETUPS", ("protected",))
    argv = ["check", "--policy", "fcfs", "--pattern", "flood", "--budget", "2", "--quiet", "--workers", "1",
            "--plots", "none"]
    monkeypatch.setattr(registry, "PROOFS", (holds,))
    assert _code([*argv, "--out", str(tmp_path / "ok")]) == 0
    out, err = capsys.readouterr()
    assert "proofs: 1/1 proved" in out and "FAILED" not in out and "failed: exit 1" not in err
    monkeypatch.setattr(registry, "PROOFS", (holds, broken))
    assert _code([*argv, "--out", str(tmp_path / "bad")]) == 1
    out, err = capsys.readouterr()
    assert "proofs: 1/2 proved" in out and "FAILED: BROKEN-DEMO" in out, out
    assert "proofs failed: exit 1" in err and "claimed invariant broke" not in err, err
    summary = json.loads((tmp_path / "bad" / "matrix.json").read_text())["summary"]
    assert summary["extras_failed"] == ["proofs"] and "BROKEN-DEMO" in summary["extras"]["proofs"]


def test_a_long_target_name_fits_the_plot_title():
    """Past 60 characters the title shrinks (to 8 pt at least); past 90 the setup name loses its
    middle, keeping both ends and the pattern, so nothing is clipped at the figure's edge."""
    from tenantry.adversaries.report import TITLE_CHARS_SMALL, _title

    class Ax:
        def set_title(self, text, fontsize):
            self.text, self.size = text, fontsize

    ax = Ax()
    _title(ax, "vtc", " / flood")
    assert (ax.text, ax.size) == ("vtc / flood", 12)
    _title(ax, "fleet_prefix_affinity_fleetacct", " / prefix_probe: victims' TTFT CDF")
    assert ax.text == "fleet_prefix_affinity_fleetacct / prefix_probe: victims' TTFT CDF" and 8 <= ax.size < 12
    long = "my_company_internal_package.schedulers.experimental:make_weighted_fair_adapter_v2"
    _title(ax, long, " / flood: victims' TTFT CDF")
    assert len(ax.text) <= TITLE_CHARS_SMALL and ax.size == 8
    assert ax.text.startswith("my_company_internal") and ax.text.endswith("adapter_v2 / flood: victims' TTFT CDF")


def test_what_was_checked_is_one_line_per_outcome_naming_every_invariant():
    from tenantry.adversaries.report import coverage_lines

    cov = {"KV-CAP": "checked (state, history)", "NO-LOSS": "checked (state, history)", "AGING": "not claimed",
           "GUARD": "not claimed", "VTC-GAP": "not applicable to this configuration"}
    cells = {("vtc", "flood"): {"coverage": cov}, ("vtc", "sybil"): {"coverage": dict(cov, AGING="not claimed")}}
    lines = coverage_lines(["vtc"], ["flood", "sybil"], cells)
    assert lines == ["## What was checked", "", "- `vtc`:",
                     "  - checked (state, history) in 2 cells: KV-CAP, NO-LOSS",
                     "  - not applicable to this configuration: VTC-GAP",
                     "  - not claimed: AGING, GUARD", ""]


def test_the_result_lists_cells_in_matrix_order_whatever_order_they_ended_in(monkeypatch):
    """run_check's cells (read by ``tenantry study abuse`` for its columns) follow the matrix,
    not the order the cell threads ended in (the study's CSV columns changed from run to run)."""
    import time as time_mod

    from tenantry.adversaries import check as check_mod
    from tenantry.adversaries.search import Budget

    real = check_mod.run_cell

    def slow_first(setup, pattern, **kw):
        rec = real(setup, pattern, **kw)
        if (setup, pattern) == ("fcfs", "flood"):
            time_mod.sleep(1.5)  # ends after the cell started beside it
        return rec

    ended = []
    monkeypatch.setattr(check_mod, "run_cell", slow_first)
    res = check_mod.run_check(setups=["fcfs", "vtc"], patterns=["flood"], budget=Budget(1), searches=("random",),
                              workers=1, cell_threads=2, extras=False, progress=False, plots="none", spread_seeds=0,
                              shrink_evaluations=0, log=ended.append)
    assert [c.split(":")[0] for c in ended] == ["vtc/flood", "fcfs/flood"]
    assert list(res["cells"]) == [("fcfs", "flood"), ("vtc", "flood")]


def test_every_broken_invariant_gets_a_replay_and_the_printed_one_reproduces(monkeypatch):
    """Found by a blind fault test: a hang (not shrunk) or a fifth invariant broken on a search
    candidate had nothing to replay, and the one replay printed under the matrix was the cell's
    workload, on which a candidate's finding does not break.  Now such a finding's witness is
    its candidate's workload unshrunk (replayed once: ``reproduced`` says if it broke again),
    and the printed command is a witness that broke again."""
    from pathlib import Path

    from tenantry.adversaries.check import MAX_WITNESSES, _witnesses
    from tenantry.adversaries.evaluate import InlineExecutor, Task, scenario_of
    from tenantry.cli.commands.check import _replay_hint

    sc = scenario_of(Task("fcfs", "flood"))
    invs = ["ADAPTER-HANG"] + [f"X{i}" for i in range(MAX_WITNESSES + 1)] + ["DETERMINISM"]
    findings = [{"invariant": i, "step": None, "search": "random"} for i in invs]
    findings[-1].pop("search")  # DETERMINISM on the cell's own workload: the cell's replay
    sources = [(sc, None)] * (len(invs) - 1) + [(sc, object())]
    from tenantry.adversaries import check as check_mod

    budgets, real = {}, check_mod.shrink_scenario
    monkeypatch.setattr(check_mod, "shrink_scenario",
                        lambda *a, **kw: budgets.setdefault(kw["invariant"], kw["max_evaluations"]) and real(*a, **kw))
    out = _witnesses("fcfs", findings, sources, rel=Path("cells/fcfs/flood"), replay_root=None, depth="history",
                     executor=InlineExecutor(), shrink_evaluations=2, progress=False)
    witnessed = {f["invariant"]: f for f in findings if "witness" in f}
    assert sorted(witnessed) == sorted(invs[:-1])  # every one broken on a candidate, none left without
    assert [stem for stem, _, _ in out] == [f"finding-{i}" for i in invs[:-1]]
    assert [i for i, n in budgets.items() if n == 1] == ["ADAPTER-HANG", f"X{MAX_WITNESSES}"]  # replayed, not shrunk
    assert all(n > 1 for i, n in budgets.items() if i not in ("ADAPTER-HANG", f"X{MAX_WITNESSES}"))
    assert all(f["reproduced"] is False for f in witnessed.values())  # the model breaks none of these
    cells = {("fcfs", "flood"): {"setup": "fcfs", "pattern": "flood", "replay": "CELL", "finding": True,
                                 "findings": findings}}
    assert _replay_hint(cells) == ["replay fcfs/flood (broke DETERMINISM): CELL"]
    findings[2].update(reproduced=True, replay="WITNESS")
    assert _replay_hint(cells) == ["replay fcfs/flood (broke X1): WITNESS"]
    only = {("vtc", "flood"): {"setup": "vtc", "pattern": "flood", "replay": "CELL", "finding": False,
                               "findings": [{"invariant": "X0", "search": "random", "reproduced": False}]}}
    assert "did not break it again" in _replay_hint(only)[0]
    assert _replay_hint({("a", "b"): {"setup": "a", "pattern": "b", "replay": "C", "finding": True, "findings": []}}) \
        == ["replay a/b (hurt): C"]


def test_what_was_checked_names_why_not_in_the_cells_where_it_was_not():
    """Found re-testing a hang: an invariant checked in some cells and skipped in others read
    'checked in 13 cells', the other cells' reason dropped."""
    from tenantry.adversaries.report import coverage_lines

    cells = {("t", "a"): {"coverage": {"DETERMINISM": "checked (two-run)"}},
             ("t", "b"): {"coverage": {"DETERMINISM": "skipped: the run broke ADAPTER-HANG, so it was not run again"}}}
    assert coverage_lines(["t"], ["a", "b"], cells)[3] == (
        "  - checked (two-run) in 1 cells; skipped: the run broke ADAPTER-HANG, so it was not run again in 1 cells: "
        "DETERMINISM")


def test_a_cell_skips_its_later_searches_once_the_system_hung(monkeypatch):
    """A hanging target costs the per-call timeout per hanging evaluation: once one search of a
    cell found ADAPTER-HANG, the cell's later searches are skipped, and its record says why."""
    from tenantry.adversaries import check as check_mod
    from tenantry.adversaries.evaluate import InlineExecutor
    from tenantry.adversaries.search import Budget, SearchResult
    from tenantry.spec.invariants_core import Finding

    ran = []

    def search(name, setup, pattern, **kw):
        ran.append(name)
        broken = {"ADAPTER-HANG": (0, Finding("ADAPTER-HANG", 2), {})} if name == "evolution" else {}
        return SearchResult(name, "fcfs", pattern, kw["seed"], None, 2, (0.0, 0.0), broken)

    monkeypatch.setattr(check_mod, "run_search", search)
    rec = check_mod.run_cell("fcfs", "flood", seed=0, budget=Budget(6), executor=InlineExecutor(), out=None,
                             searches=("random", "evolution", "hypothesis"), shrink_evaluations=0, spread_seeds=0)
    assert ran == ["random", "evolution"]
    assert rec["searches"]["hypothesis"] == {
        "evaluations": 0, "best": None, "note": "skipped: the system hung (ADAPTER-HANG) in the evolution search"}
    assert [f["invariant"] for f in rec["findings"]] == ["ADAPTER-HANG"]


def test_a_workload_on_which_the_system_hangs_is_not_shrunk(monkeypatch):
    """Measured on examples/faults/hangs.py (two hanging cells, one worker): 25 of the run's 27
    call timeouts, 250 of its 304 s, went to shrinking NO-LOSS witnesses on which the scheduler
    also hung, each candidate waiting out the timeout.  Now a witness (or a hurt cell's worst
    workload) on which the system hangs is replayed once, kept unshrunk, and says why."""
    from pathlib import Path

    from tenantry.adversaries import evaluate as ev_mod
    from tenantry.adversaries.check import _witnesses
    from tenantry.adversaries.evaluate import Evaluation, InlineExecutor, Task, scenario_of
    from tenantry.spec.invariants_core import Finding

    sc = scenario_of(Task("fcfs", "flood"))
    calls = []

    def hangs(executor, tasks):  # every run breaks NO-LOSS, then hangs
        calls.extend(tasks)
        return [Evaluation(1.0, {}, (Finding("NO-LOSS", 0), Finding("ADAPTER-HANG", 7))) for _ in tasks]

    monkeypatch.setattr(ev_mod, "evaluate_batch", hangs)
    findings = [{"invariant": "NO-LOSS", "step": 0, "search": "random"}]
    out = _witnesses("fcfs", findings, [(sc, None)], rel=Path("cells/fcfs/flood"), replay_root=None,
                     depth="history", executor=InlineExecutor(), shrink_evaluations=16, progress=False)
    assert len(calls) == 1  # the replay only
    assert [(stem, len(s.workload), n) for stem, s, n in out] == [("finding-NO-LOSS", len(sc.workload), 1)]
    f = findings[0]
    assert f["reproduced"] is True and f["witness_requests"] == len(sc.workload)
    assert f["witness_note"].startswith("not shrunk: the system hangs on this workload (ADAPTER-HANG at step 7)")
    calls.clear()  # without the hang, the same witness is shrunk
    monkeypatch.setattr(ev_mod, "evaluate_batch", lambda executor, tasks: calls.extend(tasks) or [
        Evaluation(1.0, {}, (Finding("NO-LOSS", 0),)) for _ in tasks])
    findings = [{"invariant": "NO-LOSS", "step": 0, "search": "random"}]
    out = _witnesses("fcfs", findings, [(sc, None)], rel=Path("cells/fcfs/flood"), replay_root=None,
                     depth="history", executor=InlineExecutor(), shrink_evaluations=16, progress=False)
    assert len(calls) > 1 and "witness_note" not in findings[0] and len(out[0][1].workload) < len(sc.workload)


def test_a_hurt_cell_whose_worst_workload_hangs_is_not_shrunk(monkeypatch):
    """The score shrink of a hurt cell runs its candidates unchecked, so a hang shows only as
    the timeout's wait: when the cell's worst workload hung, it is not shrunk, and the record
    and report say why."""
    import attrs

    from tenantry.adversaries import check as check_mod
    from tenantry.adversaries.evaluate import InlineExecutor
    from tenantry.adversaries.search import Budget
    from tenantry.spec.invariants_core import Finding

    real, shrunk = check_mod.run_scenario, []

    def hung(setup, scenario, **kw):
        hist, base, twin, ev = real(setup, scenario, **kw)
        return hist, base, twin, attrs.evolve(ev, score=1e9, findings=(Finding("ADAPTER-HANG", 3),))

    monkeypatch.setattr(check_mod, "run_scenario", hung)
    monkeypatch.setattr(check_mod, "shrink_scenario", lambda *a, **kw: shrunk.append(kw) or None)
    rec = check_mod.run_cell("fcfs", "flood", seed=0, budget=Budget(2), executor=InlineExecutor(), out=None,
                             searches=("random",), shrink_evaluations=16, spread_seeds=0)
    assert rec["finding"] and rec["shrunk"] is None
    assert rec["shrunk_note"].startswith("not shrunk: the system hangs on this workload (ADAPTER-HANG at step 3)")
    assert all(kw.get("invariant") is not None for kw in shrunk)  # only witnesses were shrunk (ADAPTER-HANG's: replayed)


def test_a_seconds_only_budget_is_said_in_words(tmp_path):
    """report.md said "budget - evaluations, 0.5 s per cell" for --budget 0.5s."""
    from tenantry.adversaries.check import run_check
    from tenantry.adversaries.search import Budget

    assert Budget(seconds=20.0).describe() == "20 s" and Budget(64).describe() == "64 evaluations"
    assert Budget(64, 20.0).describe() == "64 evaluations or 20 s, whichever is spent first"
    run_check(setups=["vtc"], patterns=["flood"], budget=Budget(seconds=0.5), workers=1, shrink_evaluations=0,
              plots="none", extras=False, progress=False, out=tmp_path / "rep", spread_seeds=0)
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "budget 0.5 s per cell" in text and "- evaluations" not in text
