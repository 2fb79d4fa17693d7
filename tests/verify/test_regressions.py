"""Regression cases as data: one folder per case under ``tests/regressions/``,
run by one parametrised test (the format: ``tests/regressions/README.md``).

Each case runs its workload on the reference model through the checked run
(:func:`tenantry.spec.invariants_run.run_checked`, the catalog's state forms
after every step and its history forms at the end), so no invariant may break
unless the case expects it; then every expected value is compared exactly.
A case with a ``history.jsonl`` (or an ``offline`` block) also has a history
judged offline (:func:`tenantry.verify.offline.verify_history`).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from tenantry.model.config import Config
from tenantry.model.workload import Workload
from tenantry.runner.history import History, read_history, write_history
from tenantry.runner.setups import apply_setup, load_config_toml
from tenantry.runner.simulate import simulate
from tenantry.runner.traces import read_workload_jsonl
from tenantry.spec.invariants_core import largest_charge
from tenantry.spec.invariants_run import run_checked
from tenantry.testing.mutants import MUTANTS
from tenantry.verify.offline import verify_history
from tenantry.verify.reference import make_reference
from tenantry.verify.run import bind, verify_workload
from tenantry.verify.target import load_factory
from conftest import REPO

ROOT = REPO / "tests" / "regressions"
#: Where a ``step_mode`` ``target`` (``module:factory``) is imported from (as ``verify --target-path``).
EXAMPLES = REPO / "examples"
CASES = sorted(p.name for p in ROOT.iterdir() if (p / "expected.json").is_file())

KEYS = {"about", "run", "findings", "requests", "steps", "derived", "offline", "step_mode"}
RUN_KEYS = {"horizon_s", "max_steps", "variant", "ids", "depth"}
OFFLINE_KEYS = {"setup", "claims_toml", "claimed", "findings"}
STEP_MODE_KEYS = {"variant", "target", "claimed", "findings"}
FINDING_KEYS = {"invariant", "step", "requests", "tenants", "observed", "allowed", "count"}


# --- derived values: the whole vocabulary (documented in tests/regressions/README.md) ---------


def _runs(values: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def _refusals(h: History) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, set]] = {}
    for r in h.requests:
        if r.outcome == "rejected":
            d = out.setdefault(r.reason, {"retry_after_s": set(), "waited_s": set()})
            d["retry_after_s"].add(r.retry_after_s)
            d["waited_s"].add(r.finish_s - r.arrival_s)
    return {k: {f: sorted(v, key=lambda x: (x is None, x)) for f, v in d.items()} for k, d in out.items()}


def _max_service_gap(cfg: Config, h: History) -> float:
    a, b = cfg.tenants[0].name, cfg.tenants[1].name
    return max(abs(s.service[a] - s.service[b]) for s in h.steps)


def _gap_bound(cfg: Config, h: History) -> float:
    rs = h.requests
    d = largest_charge(cfg, max(r.prompt_tokens for r in rs), max(r.prompt_tokens + r.output_tokens for r in rs))
    return sum(d / cfg.tenants[i].weight for i in (0, 1))


DERIVED: dict[str, Callable[[Config, History], Any]] = {
    "steps": lambda cfg, h: len(h.steps),
    "outcomes": lambda cfg, h: dict(Counter(r.outcome + (f"/{r.reason}" if r.reason else "") for r in h.requests)),
    "refusals": lambda cfg, h: _refusals(h),
    "preempted": lambda cfg, h: [[s.step_index, rid] for s in h.steps for rid in s.preempted],
    "queued_runs": lambda cfg, h: {t.name: _runs([s.queued[t.name] for s in h.steps]) for t in cfg.tenants},
    "backlogged_steps": lambda cfg, h: sum(all(s.queued[t.name] for t in cfg.tenants) for s in h.steps),
    "max_service_gap": _max_service_gap,
    "gap_bound": _gap_bound,
    "ttft_s": lambda cfg, h: {str(r.request_id): r.first_token_s - r.arrival_s
                              for r in h.requests if r.first_token_s is not None},
}


# --- loading and comparing ---------------------------------------------------------------------


def plain(v: Any) -> Any:
    """A value as JSON would give it back: tuples as lists, mapping keys as strings."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def load(d: Path) -> tuple[Config, Workload, dict[str, Any]]:
    """A case folder's replica, workload and expectations (the format checked)."""
    name = d.name
    expected = json.loads((d / "expected.json").read_text())
    unknown = set(expected) - KEYS
    assert not unknown, f"{name}: unknown keys in expected.json: {sorted(unknown)}"
    assert expected.get("about", "").strip(), f"{name}: expected.json needs an 'about'"
    run = expected["run"]
    assert set(run) <= RUN_KEYS and {"horizon_s", "max_steps"} <= set(run), \
        f"{name}: 'run' takes {sorted(RUN_KEYS)} and must give horizon_s and max_steps"
    assert run.get("depth", "state") in ("state", "full"), f"{name}: a case runs at depth state or full"
    assert set(expected.get("derived", {})) <= set(DERIVED), f"{name}: unknown derived values"
    return load_config_toml(d / "config.toml"), read_workload_jsonl(d / "workload.jsonl"), expected


def compare_findings(where: str, expected: list[dict], actual) -> list[str]:
    """Expected findings against actual ones, in order; each compared on the keys it gives."""
    for e in expected:
        assert set(e) <= FINDING_KEYS and {"invariant", "step", "requests"} <= set(e), f"{where}: bad finding {e}"
    keys = [list(e) for e in expected] + [["invariant", "step", "requests"]] * max(0, len(actual) - len(expected))
    got = [plain({k: getattr(f, k) for k in ks}) for f, ks in zip(actual, keys)]
    if got != expected:
        return [f"{where}: expected {expected}\n  got {[str(f) for f in actual]}"]
    return []


def compare_records(where: str, expected: dict[str, dict], records: dict[int, Any]) -> list[str]:
    out = []
    for key, fields in expected.items():
        rec = records.get(int(key))
        if rec is None:
            out.append(f"{where} {key}: no such record")
            continue
        for field, want in fields.items():
            got = plain(getattr(rec, field))
            if got != want:
                out.append(f"{where} {key} {field}: expected {want!r}, got {got!r}")
    return out


def check_case(d: Path) -> list[str]:
    """Run the case in folder ``d``; every expected value that does not hold, as a line."""
    cfg, wl, exp = load(d)
    run = exp["run"]
    variant = MUTANTS[run["variant"]].variant if run.get("variant") else None
    checked = run_checked(cfg, wl, ids=run.get("ids"), depth=run.get("depth", "state"), horizon_s=run["horizon_s"],
                          max_steps=run["max_steps"], variant=variant)
    h = checked.history
    bad = compare_findings("findings", exp.get("findings", []), checked.findings)
    bad += compare_records("request", exp.get("requests", {}), {r.request_id: r for r in h.requests})
    bad += compare_records("step", exp.get("steps", {}), {s.step_index: s for s in h.steps})
    for key, want in exp.get("derived", {}).items():
        got = plain(DERIVED[key](cfg, h))
        if got != want:
            bad.append(f"derived {key}: expected {want!r}, got {got!r}")
    recorded = d / "history.jsonl"
    if "offline" in exp or recorded.exists():
        off = exp.get("offline")
        assert off is not None and set(off) <= OFFLINE_KEYS, f"{d.name}: a recorded history needs an 'offline' block"
        judged = read_history(recorded) if recorded.exists() else h
        assert not (off.get("setup") and off.get("claims_toml")), f"{d.name}: give setup or claims_toml, not both"
        claims = (load_config_toml(d / off["claims_toml"]) if off.get("claims_toml")
                  else apply_setup(cfg, off["setup"]) if off.get("setup") else cfg)
        bad += compare_findings("offline findings", off.get("findings", []),
                                verify_history(judged, claims, off.get("claimed", ())))
    if "step_mode" in exp:
        sm = exp["step_mode"]
        assert set(sm) <= STEP_MODE_KEYS and ("variant" in sm) != ("target" in sm), \
            f"{d.name}: 'step_mode' takes {sorted(STEP_MODE_KEYS)}, with one of variant and target"
        if "target" in sm:  # a scheduler of examples/ with its own configuration and claims
            assert "claimed" not in sm, f"{d.name}: a step_mode target makes its own claims"
            factory = bind(load_factory(sm["target"], path=str(EXAMPLES)), cfg.tenants)
        else:
            factory = make_reference(cfg, reference=False, invariants=tuple(sm.get("claimed", ())),
                                     variant=MUTANTS[sm["variant"]].variant)
        v = verify_workload(factory, wl, horizon_s=run["horizon_s"], max_steps=run["max_steps"], timeout_s=None,
                            determinism=False)
        bad += compare_findings("step-mode findings", sm.get("findings", []), list(v.findings))
    return bad


@pytest.mark.parametrize("name", CASES)
def test_case(name):
    bad = check_case(ROOT / name)
    assert not bad, f"{name}:\n" + "\n".join(bad)


def test_a_recorded_history_is_judged_offline(tmp_path):
    """The ``history.jsonl`` form: a recorded run of a broken scheduler (here the mutant
    preempted_left_in_batch, written as a file) is judged offline, while the model's own
    run of the same workload is clean; an offline finding the case does not list fails it."""
    src, case = ROOT / "priority-preempted-left-in-batch-mutant", tmp_path / "recorded"
    case.mkdir()
    for f in ("config.toml", "workload.jsonl"):
        shutil.copy(src / f, case / f)
    cfg, wl, _ = load(src)
    write_history(simulate(cfg, wl, max_steps=2000, variant=MUTANTS["preempted_left_in_batch"].variant),
                  case / "history.jsonl")
    found = [{"invariant": "BATCH-LIMITS", "step": 56, "requests": [0], "tenants": ["lo"]}]
    exp = {"about": "the mutant's recorded run", "run": {"horizon_s": None, "max_steps": 2000}, "findings": [],
           "offline": {"findings": found}}
    (case / "expected.json").write_text(json.dumps(exp))
    assert check_case(case) == []
    exp["offline"]["findings"] = []
    (case / "expected.json").write_text(json.dumps(exp))
    assert len(check_case(case)) == 1


def test_every_case_folder_is_complete_and_every_derived_value_is_documented():
    folders = sorted(p.name for p in ROOT.iterdir() if p.is_dir())
    assert folders == CASES, "a folder under tests/regressions/ lacks expected.json"
    for name in CASES:
        assert (ROOT / name / "config.toml").is_file() and (ROOT / name / "workload.jsonl").is_file(), name
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{key}`" in readme for key in DERIVED)
