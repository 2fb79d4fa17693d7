"""The planted faults of ``examples/faults``, fast: the registry agrees with the files,
each fault's stored witness (``examples/faults/witness/``: a small workload, shrunk by
tenantry's shrinker from what ``tenantry verify --target`` found) still raises exactly
the invariants recorded for it, its expected one at the recorded steps, and
neither the same scheduler with the fault removed nor any clean scheduler raises
anything on it; the gap cases still behave as recorded.

Every witness runs through :meth:`tenantry.verify.system.TargetSystem.checked`, the
check the adversary matrix of ``verify --target`` applies to each cell's workload.
The full default verification of every fault (tens of minutes) is
``scripts/faults_table.py``, run on demand; it writes the witnesses and what their
index records (``--refresh-index`` re-judges them after a change to tenantry).
"""

import ast
import json
import os
import shlex
import subprocess
import sys

import attrs
import pytest

from conftest import REPO
from tenantry.runner.traces import read_workload_jsonl
from tenantry.spec.invariants import INVARIANTS
from tenantry.verify.protocol import PROTOCOL, Claims
from tenantry.verify.run import bind, scenario_tenants, verify_workload
from tenantry.verify.suite import STATEFUL_TENANTS
from tenantry.verify.system import RERUN_HASH_SEEDS, TargetSystem
from tenantry.verify.target import load_factory

EXAMPLES = REPO / "examples"
FAULTS_DIR = EXAMPLES / "faults"
WITNESS = FAULTS_DIR / "witness"
sys.path.insert(0, str(EXAMPLES))

from faults import CLEAN, FAULTS, GAPS, PENDING  # noqa: E402
from faults.base import fixed_twin  # noqa: E402

INDEX = json.loads((WITNESS / "index.json").read_text())
WITNESSES = sorted(INDEX)
#: Modules of the package that are not schedulers.
NOT_SCHEDULERS = {"__init__", "base"}


def _roles(workload, weighted: bool = False):
    """Every tenant a victim, in the order the witness's replay gives them: a weighted witness comes
    from the stateful extra, whose tenant order (and so weights) is ``STATEFUL_TENANTS``."""
    first = list(STATEFUL_TENANTS) if weighted else []
    return [(n, "victim") for n in first + [t for t in workload.tenants if t not in first]]


def _checked(target: str, workload, horizon_s, timeout_s: float | None = 10.0, weighted: bool = False):
    """The matrix's check of one workload (state forms; DETERMINISM needs a fresh process, below);
    ``weighted``: the tenants with the stateful extra's weights (the witness's ``weighted``)."""
    return TargetSystem(target, timeout_s=timeout_s, path=str(EXAMPLES), weighted=weighted).checked(
        workload, horizon_s, "state", _roles(workload, weighted))


def _checked_full_in_fresh_process(target: str, path, horizon_s) -> list[list]:
    """[invariant, step] of every finding at depth ``full`` in a process with ``PYTHONHASHSEED=2`` (so that
    tenantry's fresh-process re-run, seed 1, is the same comparison on every test run), as the table script does."""
    code = ("import json, sys; from tenantry.runner.traces import read_workload_jsonl; "
            "from tenantry.verify.system import TargetSystem; "
            "t, p, h, x = sys.argv[1:]; wl = read_workload_jsonl(p); "
            "r = TargetSystem(t, path=x).checked(wl, float(h), 'full', [(n, 'victim') for n in wl.tenants]); "
            "print(json.dumps([[f.invariant, f.step] for f in r.findings]))")
    p = subprocess.run([sys.executable, "-c", code, target, str(path), str(horizon_s), str(EXAMPLES)],
                       env={**os.environ, "PYTHONHASHSEED": RERUN_HASH_SEEDS[1]}, cwd=EXAMPLES,
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


# --- the registry and the files ------------------------------------------------------------


def test_registry_names_every_module_once_and_the_modules_name_their_invariants():
    modules = {p.stem for p in FAULTS_DIR.glob("*.py")} - NOT_SCHEDULERS
    named = [t.split(":")[0].split(".", 1)[1] for t in
             [f.target for f in FAULTS.values()] + list(CLEAN.values()) + [t for t, _ in GAPS.values()]
             if t.startswith("faults.")]
    assert sorted(named) == sorted(modules)  # every module listed, none twice
    assert len(FAULTS) >= 20 and len(CLEAN) >= 2
    assert set(PENDING) <= set(FAULTS)
    known = set(INVARIANTS) | set(PROTOCOL)
    for name, (target, expected, kind) in FAULTS.items():
        assert target == f"faults.{name}:make_scheduler"
        assert expected and set(expected) <= known, name
        assert kind.split()[0].isdigit() and 1 <= int(kind.split()[0]) <= 13, kind
        doc = ast.get_docstring(ast.parse((FAULTS_DIR / f"{name}.py").read_text()))
        first = doc.splitlines()[0]
        assert first.startswith("Fault (kind ") and all(i in first for i in expected), first
        assert "Imitates" in doc, name
    kinds = {f.kind.split()[0] for f in FAULTS.values()}
    assert kinds == {str(k) for k in range(1, 14)}  # every kind of the brief covered


@pytest.mark.parametrize("name", sorted(FAULTS) + sorted(CLEAN) + sorted(GAPS))
def test_every_factory_builds_an_adapter_that_claims_what_it_is_judged_on(name):
    target = FAULTS[name].target if name in FAULTS else CLEAN.get(name) or GAPS[name][0]
    adapter = load_factory(target, path=str(EXAMPLES))()
    assert isinstance(adapter.claims, Claims)
    for inv in FAULTS[name].expected if name in FAULTS else ():
        if inv in INVARIANTS and not INVARIANTS[inv].always and inv != "DETERMINISM":
            assert inv in adapter.claims.claimed(), f"{name} does not claim {inv}"


def test_every_fault_has_a_witness_per_expected_invariant_and_no_stray_file():
    files = {p.name for p in WITNESS.glob("*.jsonl")}
    assert files == set(INDEX)
    for fname, meta in INDEX.items():
        assert meta["fault"] in FAULTS and meta["invariant"] in FAULTS[meta["fault"]].expected, fname
        assert meta["source"] and meta["invariant"] in meta["raises"] and meta["steps"], fname
        one = len(FAULTS[meta["fault"]].expected) == 1
        assert fname == (f"{meta['fault']}.jsonl" if one else f"{meta['fault']}.{meta['invariant']}.jsonl")
    for name, f in FAULTS.items():
        have = {m["invariant"] for m in INDEX.values() if m["fault"] == name}
        assert have == set(f.expected), name


# --- each witness raises exactly what it raised, and only because of the fault ------------------


@pytest.mark.parametrize("fname", WITNESSES)
def test_witness_raises_exactly_its_recorded_invariants(fname):
    meta = INDEX[fname]
    target, inv, path = FAULTS[meta["fault"]].target, meta["invariant"], WITNESS / fname
    if inv == "DETERMINISM":  # only another hash seed shows it, in another process
        found = _checked_full_in_fresh_process(target, path, meta["horizon_s"])
    else:
        run = _checked(target, read_workload_jsonl(path), meta["horizon_s"],
                       timeout_s=1.0 if inv == "ADAPTER-HANG" else 10.0, weighted=meta.get("weighted", False))
        found = [[f.invariant, f.step] for f in run.findings]
    assert sorted({i for i, _ in found}) == meta["raises"], found
    assert [s for i, s in found if i == inv] == meta["steps"], found


#: Witnesses on which the fixed twin is flagged: tenantry's false positives, kept strict so a fix shows.
#: Witnesses on which a fault's fixed twin is still flagged (a verifier false positive), with why.
TWIN_FLAGGED: dict[str, str] = {}


@pytest.mark.parametrize("fname", [pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=TWIN_FLAGGED[f]))
                                   if f in TWIN_FLAGGED else f for f in WITNESSES])
def test_fixed_twin_is_clean_on_the_witness(fname):
    meta = INDEX[fname]
    wl = read_workload_jsonl(WITNESS / fname)
    twin = fixed_twin(load_factory(FAULTS[meta["fault"]].target, path=str(EXAMPLES)))
    weighted = meta.get("weighted", False)
    v = verify_workload(bind(twin, scenario_tenants(_roles(wl, weighted), False, weighted)), wl,
                        horizon_s=meta["horizon_s"], determinism=False)
    assert v.ok, v.render()


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_clean_scheduler_raises_nothing_on_any_witness(name):
    for fname in WITNESSES:
        run = _checked(CLEAN[name], read_workload_jsonl(WITNESS / fname), INDEX[fname]["horizon_s"],
                       weighted=INDEX[fname].get("weighted", False))
        assert not run.findings, (fname, [f.render() for f in run.findings[:5]])


def test_the_cells_replay_command_reports_a_hash_seed_finding(tmp_path):
    """``verify --target T --workload W`` (the command a cell prints) re-runs W in a fresh process
    with another PYTHONHASHSEED, as the matrix does: hash_order's DETERMINISM finding replays."""
    p = subprocess.run([sys.executable, "-m", "tenantry.cli", "verify", "--target", FAULTS["hash_order"].target,
                        "--workload", str(WITNESS / "hash_order.jsonl"), "--horizon-s", "16",
                        "--out", str(tmp_path / "rep")], env={**os.environ, "PYTHONHASHSEED": RERUN_HASH_SEEDS[1]},
                       cwd=EXAMPLES, capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert "DETERMINISM" in report["findings_by_invariant"], report["findings_by_invariant"]
    assert "PYTHONHASHSEED=1" in p.stdout


# --- former gaps: caught or clean now ------------------------------------------------------------


def test_cache_at_finish_is_clean_and_only_the_last_step_block_ids_show_its_stale_salt_twin():
    """A correct cache that also caches a request's last-step blocks is clean (it was once flagged
    SALT-ISOLATION: the history had no block ids for a request in the step it finishes), and the
    fault that caches them under another tenant's salt is caught only through those block ids."""
    from tenantry.spec.invariants_history import HistoryContext
    from tenantry.spec.invariants_history_blocks import h_salt_isolation

    wl = read_workload_jsonl(FAULTS_DIR / "cache_at_finish.jsonl")
    run = _checked(CLEAN["fp_cache_at_finish"], wl, None)
    assert not run.findings, [f.render() for f in run.findings]
    assert run.coverage["SALT-ISOLATION"] == "checked"
    assert run.history.steps[-1].block_ids or any(s.block_ids for s in run.history.steps)
    wl = read_workload_jsonl(WITNESS / "stale_salt_at_finish.jsonl")
    run = _checked(FAULTS["stale_salt_at_finish"].target, wl, 16.0)
    (f,) = [f for f in run.findings if f.invariant == "SALT-ISOLATION"]
    by_id = {r.request_id: r for r in run.history.requests}
    reader, writer = f.requests
    assert (by_id[reader].tenant, by_id[writer].tenant) == ("b", "a") and by_id[writer].output_tokens == 1
    # the writer never ran after a step: only the block ids of the step it finished in name it
    assert all(writer not in s.running for s in run.history.steps)
    blind = attrs.evolve(run.history, steps=tuple(
        attrs.evolve(s, block_ids={r: b for r, b in (s.block_ids or {}).items() if r in s.running} or None)
        for s in run.history.steps))
    cfg = TargetSystem(FAULTS["stale_salt_at_finish"].target, path=str(EXAMPLES)).config(_roles(wl))
    assert h_salt_isolation(HistoryContext(run.history, cfg))
    assert not h_salt_isolation(HistoryContext(blind, cfg))

def test_a_weight_bug_shows_only_with_unequal_weights():
    """vtc_weight_ignored is VTC exactly when every weight is 1: its witness is clean without the
    stateful extra's weights (so the default matrix, all weights 1, cannot catch it) and breaks
    VTC-GAP with them (``--weighted``, as the stateful extra runs)."""
    meta = INDEX["vtc_weight_ignored.jsonl"]
    wl = read_workload_jsonl(WITNESS / "vtc_weight_ignored.jsonl")
    assert meta["weighted"] is True
    assert not _checked(FAULTS["vtc_weight_ignored"].target, wl, meta["horizon_s"]).findings
    assert "VTC-GAP" in {f.invariant for f in _checked(FAULTS["vtc_weight_ignored"].target, wl, meta["horizon_s"],
                                                       weighted=True).findings}


def test_the_stateful_extra_runs_weighted_and_its_replay_says_so(tmp_path):
    """The stateful extra (on by default) gives the tenants unequal weights: it catches
    vtc_weight_ignored, which it cannot with every weight 1, and prints a replay with --weighted
    that breaks VTC-GAP again; the fault's fixed twin passes it."""
    from tenantry.verify.suite import TenantryFailure, stateful_check

    make = load_factory(FAULTS["vtc_weight_ignored"].target, path=str(EXAMPLES))
    stateful_check(make, target="w", out_dir=tmp_path / "equal", max_examples=10, weighted=False)
    stateful_check(fixed_twin(make), target="w", out_dir=tmp_path / "fixed", max_examples=10)
    with pytest.raises(TenantryFailure) as e:
        stateful_check(make, target=FAULTS["vtc_weight_ignored"].target, out_dir=tmp_path / "w", max_examples=10)
    assert e.value.findings[0].invariant == "VTC-GAP" and " --weighted" in e.value.replay
    argv = shlex.split(e.value.replay)
    p = subprocess.run([sys.executable, "-m", "tenantry.cli", *argv[1:]], cwd=EXAMPLES, capture_output=True, text=True)
    assert p.returncode == 1 and "VTC-GAP" in p.stdout, (p.stdout, p.stderr)
