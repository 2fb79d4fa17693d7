"""SGLang 0.5.23's real scheduler, driven through tenantry.engines.sglang.

The tests that drive SGLang are skipped, with the reason, where SGLang 0.5.23
is not installed (scripts/install_sglang.sh installs it); the import and
version-pin tests always run.  The expected numbers are what SGLang 0.5.23
does, read off its source (sglang/srt/managers/scheduler.py, schedule_policy.py,
schedule_batch.py) and checked by running it: 16-token pages, page-aligned
prefill chunks, prefill before decode, retraction of the request with the
fewest output tokens first.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

from tenantry.engines import sglang as sg

SGLANG_OK, SGLANG_WHY = sg.sglang_available()
needs_sglang = pytest.mark.skipif(not SGLANG_OK, reason=f"SGLang unavailable: {SGLANG_WHY}")


def drive(s: sg.SglangScheduler, max_steps: int = 5_000) -> list[dict]:
    steps = []
    while s.has_unfinished():
        steps.append(s.step())
        assert len(steps) < max_steps, "SGLang did not finish the workload"
    return steps


def pages(st: dict) -> dict[int, int]:
    return {rid: len(b) for rid, b in st["blocks"].items()}


# -- always ------------------------------------------------------------------


def test_module_imports_without_sglang():
    code = ("import sys; import tenantry.engines.sglang as m; "
            "assert 'sglang' not in sys.modules, 'sglang imported eagerly'; "
            "assert callable(m.sglang_available)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sglang_available_gives_a_reason():
    ok, why = sg.sglang_available()
    assert isinstance(ok, bool) and isinstance(why, str) and why


@pytest.mark.parametrize("version", ["0.5.22", "0.5.23.post1", "0.6.0"])
def test_other_sglang_versions_are_refused(monkeypatch, version):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: version if name == "sglang" else real(name))
    sg.sglang_available.cache_clear()
    try:
        ok, why = sg.sglang_available()
        assert not ok
        assert f"sglang {version} is installed" in why and "0.5.23" in why
        with pytest.raises(RuntimeError, match="0.5.23"):
            sg.SglangScheduler(num_blocks=64)
    finally:
        monkeypatch.undo()
        sg.sglang_available.cache_clear()
    assert sg.sglang_available() == (SGLANG_OK, SGLANG_WHY)


def test_request_ids_are_never_prefixes_of_one_another():
    # SGLang aborts every request whose id starts with the aborted one.
    ids = [sg._rid(i) for i in range(200)]
    assert not any(a != b and b.startswith(a) for a in ids for b in ids)


# -- SGLang ----------------------------------------------------------------------


@needs_sglang
def test_prefill_in_page_aligned_chunks_then_decode():
    s = sg.SglangScheduler(num_blocks=64, token_budget=256, policy="lpm")
    s.add_request(0, 100, 5)
    s.add_request(1, 300, 3)
    steps = drive(s)
    # Step 0: request 0 whole, request 1's first chunk floored to whole pages
    # (256 - 100 = 156 -> 144); step 1 the rest of request 1 (prefill first,
    # so request 0 does not decode); then both decode.
    assert steps[0]["mode"] == "extend" and steps[0]["batch"] == [(0, 100), (1, 144)]
    assert steps[0]["computed"] == {0: 0, 1: 0}
    assert steps[1]["batch"] == [(1, 156)] and steps[1]["computed"] == {1: 144}
    assert [st["batch"] for st in steps[2:]] == [[(0, 1), (1, 1)]] * 2 + [[(0, 1)]] * 2
    assert [st["finished"] for st in steps] == [[], [], [], [1], [], [0]]
    # KV in 16-token pages: ceil(100/16) = 7, ceil(300/16) = 19; free = 64 - held.
    assert pages(steps[0]) == {0: 7, 1: 9} and steps[0]["free_blocks"] == 48
    assert pages(steps[1]) == {0: 7, 1: 19} and steps[1]["free_blocks"] == 38
    assert pages(steps[4]) == {0: 7} and steps[4]["free_blocks"] == 57  # request 1's pages: cached, evictable
    assert not any(st["preempted"] or st["rejected"] for st in steps)


@needs_sglang
def test_overlap_schedule_plans_the_same_batches_and_reports_finishes_a_step_later():
    def run(overlap):
        s = sg.SglangScheduler(num_blocks=64, policy="lpm", overlap=overlap)
        s.add_request(0, 100, 5)
        s.add_request(1, 300, 3)
        return drive(s)

    plain, overlap = run(False), run(True)
    assert [st["batch"] for st in overlap[:6]] == [st["batch"] for st in plain]
    fin_plain = {rid: i for i, st in enumerate(plain) for rid in st["finished"]}
    fin_overlap = {rid: i for i, st in enumerate(overlap) for rid in st["finished"]}
    assert fin_overlap == {rid: i + 1 for rid, i in fin_plain.items()}


@needs_sglang
def test_small_pool_retracts_the_newest_and_it_resumes():
    s = sg.SglangScheduler(num_blocks=40, max_num_seqs=8, policy="fcfs", conservativeness=0.3)
    steps, k, nxt = [], 0, 0
    while s.has_unfinished() or nxt < 8:
        if k % 15 == 0 and nxt < 8:
            s.add_request(nxt, 40, 150)
            nxt += 1
        steps.append(s.step())
        k += 1
        assert k < 1000
    retracted = [(i, rid) for i, st in enumerate(steps) for rid in st["preempted"]]
    assert [rid for _, rid in retracted] == [4, 3], retracted
    for i, rid in retracted:
        st = steps[i]
        assert rid not in dict(st["batch"]) and rid not in st["blocks"]
        assert all(r < rid for r in st["blocks"])  # the newest running request went
        resumed = next(j for j in range(i + 1, len(steps)) if rid in steps[j]["computed"])
        n = dict(steps[resumed]["batch"])[rid]
        assert n > 40  # its prompt and the tokens it had generated are computed again
    for st in steps:
        assert st["free_blocks"] + len({p for b in st["blocks"].values() for p in b}) == 40
    assert sorted(r for st in steps for r in st["finished"]) == list(range(8))


@needs_sglang
def test_abort_during_prefill_frees_the_chunk_at_once():
    s = sg.SglangScheduler(num_blocks=200, token_budget=256)
    s.add_request(0, 1000, 4)
    s.add_request(1, 50, 2)
    st = s.step()
    assert st["batch"] == [(0, 256)] and pages(st) == {0: 16}
    s.abort_request(0)
    st = s.step()
    assert 0 not in dict(st["batch"]) and 0 not in st["blocks"]
    assert st["batch"] == [(1, 50)] and st["free_blocks"] == 200 - 4
    rest = drive(s)
    assert [r for x in rest for r in x["finished"]] == [1]
    assert 0 not in {r for x in rest for r in x["finished"] + [q for q, _ in x["rejected"]]}
    s.abort_request(12345)  # unknown ids are ignored


@needs_sglang
def test_abort_of_a_decoding_request_releases_its_kv_after_one_more_step():
    s = sg.SglangScheduler(num_blocks=100, prefix_cache=False)
    s.add_request(0, 100, 50)
    s.add_request(1, 100, 50)
    s.step()
    s.abort_request(0)
    st = s.step()
    # SGLang runs an aborted running request once more to free it: the driver
    # leaves it out of the batch and withholds the free count meanwhile.
    assert st["batch"] == [(1, 1)] and 0 not in st["blocks"] and st["free_blocks"] is None
    st = s.step()
    assert st["batch"] == [(1, 1)] and st["free_blocks"] == 100 - 7


def _prefix_pair(key_a, key_b):
    s = sg.SglangScheduler(num_blocks=100, policy="fcfs")
    s.add_request(0, 100, 5, prefix_ids=(1, 2, 3, 4), extra_key=key_a)
    s.step()
    s.add_request(1, 100, 5, prefix_ids=(1, 2, 3, 4), extra_key=key_b)
    return s.step()


@needs_sglang
def test_radix_cache_hit_with_the_same_extra_key():
    st = _prefix_pair("tenant-a", "tenant-a")
    assert st["computed"] == {1: 64}  # the 4 full prefix pages
    assert st["batch"] == [(1, 36)]
    shared = set(st["blocks"][0]) & set(st["blocks"][1])
    assert len(shared) == 4


@needs_sglang
@pytest.mark.parametrize("key_a,key_b", [("tenant-a", "tenant-b"), ("tenant-a", None), (None, "tenant-b")])
def test_no_radix_cache_hit_across_extra_keys(key_a, key_b):
    st = _prefix_pair(key_a, key_b)
    assert st["computed"] == {1: 0} and st["batch"] == [(1, 100)]
    assert not set(st["blocks"][0]) & set(st["blocks"][1])


@needs_sglang
def test_extra_key_isolates_tenants_seen_from_outside():
    from tenantry.model.workload import Request, Workload
    from tenantry.verify.run import verify_workload

    prefix = tuple(range(1000, 1016))
    wl = Workload(tuple(Request(i, "a", 0.1 * i, 400, 4, prefix) for i in range(3))
                  + tuple(Request(3 + i, "b", 1.0 + 0.1 * i, 400, 4, prefix) for i in range(3)))
    shared = verify_workload(sg.make_shared_cache, wl, timeout_s=None)
    salted = verify_workload(sg.make_salted_cache, wl, timeout_s=None)
    assert shared.ok and salted.ok, (shared.render(), salted.render())
    assert "SALT-ISOLATION" in salted.claimed and "SALT-ISOLATION" not in shared.claimed
    assert shared.stats["cross_tenant_hit_blocks"] >= 3 * 16  # b reuses a's prefix pages
    assert salted.stats["cross_tenant_hit_blocks"] == 0
    assert salted.stats["cache_hit_blocks"] > 0  # each tenant still hits its own prefix


@needs_sglang
@pytest.mark.parametrize("factory", ["make_lpm", "make_fcfs", "make_priority", "make_dfs_weight",
                                     "make_lpm_overlap", "make_fcfs_small"])
def test_every_plan_passes_the_harness_checks(factory):
    from tenantry.model.workload import Request, Workload
    from tenantry.verify.run import verify_workload

    wl = Workload(tuple(Request(i, f"t{i % 3}", 0.05 * i, 50 + 37 * i, 3 + i % 5, (i % 2, 7) if i % 3 else ())
                        for i in range(20)))
    v = verify_workload(getattr(sg, factory), wl, timeout_s=None)
    assert v.ok, v.render()
    assert v.stats["steps"] > 20
    recs = v.history.requests
    assert sorted(r.request_id for r in recs if r.outcome == "finished") == list(range(20))
    assert all(r.tokens_generated == r.output_tokens for r in recs)


@needs_sglang
def test_too_large_for_the_pool_is_refused_not_clipped():
    from tenantry.model.workload import Request

    a = sg.SglangAdapter(policy="lpm", num_blocks=64)  # 1024 tokens
    assert a.add_request(Request(0, "t", 0.0, 900, 200)) == "too_large"
    assert a.add_request(Request(1, "t", 0.0, 900, 60)) is None
    assert a.add_request(Request(2, "t", 0.0, 1010, 14)) == "too_large"  # SGLang keeps a page + 1 token
    assert a.add_request(Request(3, "t", 0.0, 8000, 500)) == "too_long"  # over the 8,192-token context
    big = sg.SglangAdapter(policy="lpm")  # an ample pool: the context binds, six tokens short of 8,192
    assert big.claims.config.max_context_tokens == big.s.max_request_tokens == 8186
    assert big.s.max_input_tokens == 8185  # SGLang refuses a prompt of max_req_input_len (8,186) or more
    assert big.add_request(Request(4, "t", 0.0, 8000, 187)) == "too_long"
    assert big.add_request(Request(5, "t", 0.0, 8186, 1)) == "too_long"  # SGLang would abort it with an error
    assert big.add_request(Request(6, "t", 0.0, 8185, 1)) is None  # the longest prompt SGLang takes


@needs_sglang
def test_the_longest_prompt_the_adapter_lets_through_finishes_on_sglang():
    """The boundary pattern found the adapter one token generous: a prompt of exactly
    max_req_input_len went to SGLang, which aborted it with an error and still put it in a
    batch (NO-LOSS and KV-CONSERVE on the adapter's books).  At the limit it now runs."""
    from tenantry.model.workload import Request, Workload
    from tenantry.verify.run import verify_workload

    a = sg.SglangAdapter(policy="lpm")
    limit = a.s.max_input_tokens
    v = verify_workload(lambda: sg.SglangAdapter(policy="lpm"), Workload((
        Request(0, "t", 0.0, limit, 1), Request(1, "t", 0.0, limit + 1, 1), Request(2, "t", 0.0, 100, 3))),
        timeout_s=None, determinism=False)
    assert v.ok, v.render()
    out = {r.request_id: (r.outcome, r.reason) for r in v.history.requests}
    assert out == {0: ("finished", None), 1: ("rejected", "too_long"), 2: ("finished", None)}


@needs_sglang
def test_claims_per_policy():
    assert {"FCFS-TENANT", "FCFS-TIER"} == set(sg.make_fcfs().claims.claimed())
    assert {"FCFS-TENANT", "TIER-ORDER", "VICTIM"} == set(sg.make_priority().claims.claimed())
    assert set(sg.make_lpm().claims.claimed()) == set()
    assert set(sg.make_dfs_weight().claims.claimed()) == set()
    # order claims are checked on admissions, past requests that surely did not fit: any pool
    assert set(sg.make_fcfs_small().claims.claimed()) == {"FCFS-TENANT", "FCFS-TIER"}
    assert set(sg.make_priority_small().claims.claimed()) == {"FCFS-TENANT", "TIER-ORDER"}  # VICTIM: ample KV
    assert sg.make_lpm().claims.describe.startswith("sglang 0.5.23")


def _mixed_drive():
    s = sg.SglangScheduler(num_blocks=40, token_budget=256, max_num_seqs=8, policy="lpm", conservativeness=0.3)
    steps = []
    for rid in range(12):
        s.add_request(rid, 40 + 17 * rid, 20 + 9 * (rid % 4), prefix_ids=(rid % 2, 5) if rid % 3 else ())
        steps.append(s.step())
        if rid == 6:
            s.abort_request(2)
    return steps + drive(s)


@needs_sglang
def test_identical_drives_give_identical_steps():
    a, b = _mixed_drive(), _mixed_drive()
    assert a == b
    assert any(n for st in a for n in st["computed"].values())
    code = ("import json, runpy, sys; "
            f"m = runpy.run_path({__file__!r}); "
            "sys.stdout.write(json.dumps(m['_mixed_drive'](), sort_keys=True))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out == json.dumps(a, sort_keys=True)


@needs_sglang
def test_verify_target_on_sglang_runs_end_to_end(tmp_path):
    from tenantry.cli import main

    out = tmp_path / "rep"
    code = main(["verify", "--target", "tenantry.engines.sglang:make_fcfs", "--patterns", "flood", "--quick",
                 "--budget", "2", "--workers", "1", "--out", str(out)])
    rep = json.loads((out / "matrix.json").read_text())
    (cell,) = rep["cells"]
    assert code == 0 and cell["findings"] == []
    assert rep["summary"]["describe"]["tenantry.engines.sglang:make_fcfs"].startswith("sglang 0.5.23")
    assert cell["steps"] > 100 and cell["coverage"]["KV-CONSERVE"].startswith("checked")
    # SGLang promises no tenant fairness: under a flood, FCFS order makes the light tenant wait.
    assert cell["metrics"]["ttft_p99_inflation[chat]"] > 20


@needs_sglang
def test_sglang_aborts_every_request_whose_id_starts_with_the_aborted_id():
    # SGLang's own behaviour (Scheduler.abort_request matches req.rid.startswith):
    # an abort of "r1" also reaches a request whose id is "r10"; the driver's ids
    # ("r1.", "r10.") are chosen so that it never does.
    s = sg.SglangScheduler(num_blocks=64)
    S = s.scheduler
    for rid in ("r1", "r10", "r2"):
        with s._context():
            s._sched.handle_generate_request(_raw_request(s, rid))
    with s._context():
        S.abort_request(sg._sglang()["AbortReq"](rid="r1"))
    assert [r.rid for r in S.waiting_queue] == ["r2"]


def _raw_request(s, rid):
    from array import array

    m = sg._sglang()
    sp = m["SamplingParams"](max_new_tokens=4)
    sp.normalize(None)
    sp.verify(s.model_config.vocab_size)
    return m["TokenizedGenerateReqInput"](
        rid=rid, input_text=None, input_ids=array("q", [5] * 20), input_embeds=None, mm_inputs=None,
        token_type_ids=None, sampling_params=sp, return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
        token_ids_logprob=None, stream=False)


@needs_sglang
@pytest.mark.parametrize("policy", ["fcfs", "priority", "lpm"])
def test_retraction_passes_the_harness_checks(policy):
    import functools

    from tenantry.model.workload import Request, Workload
    from tenantry.verify.run import verify_workload

    wl = Workload(tuple(Request(i, f"t{i % 2}", 0.4 * i, 40, 150) for i in range(8)))
    fac = functools.partial(sg.SglangAdapter, policy=policy, num_blocks=40, conservativeness=0.3)
    v = verify_workload(fac, wl, timeout_s=None)
    assert v.ok, v.render()
    assert v.stats["preemptions"] == 2  # retract_decode, seen as requests re-entering the queue
    recs = v.history.requests
    assert sum(r.preemptions for r in recs) == 2 and sum(r.wasted_prefill_tokens for r in recs) > 2 * 40
    assert all(r.outcome == "finished" and r.tokens_generated == 150 for r in recs)
