"""The step against its own old bytes: SHA-256 digests of every step's output and state,
stored in ``tests/runner/step_digests.json`` (issue 30).

The readable step (:func:`tenantry.model.step.step`) was rewritten without its speed tricks
(issue 30) and must not change by one byte.  Before the rewrite each run below was traced
with the old step and its digest stored; the test traces it again and compares.  A trace
(:func:`trace_digest`) hashes, step by step, the step's output (batch, preemptions, every
event field, the sequences that left, the reservation) and the state after it (every tenant
record whose value changed, its queue whole; the running sequences; the KV pool, dicts in
their order; the lifts, tier counters and skip counts), each sequence with its request
reduced to the request id: what a history records and what it does not (progress, buckets,
skip counts), in a form that owes nothing to the history's format.

Runs: the seed-001 default workload (seed 9) to 10 s under every one-replica setup, the
packaged Azure pair excerpt (60 rows, 30 s) under every one-replica setup, each adversary
pattern's default check-cell scenario (8 s) on one setup in turn, two fleet cells, 1,124
tenants under vtc and round robin; and
``tenantry check`` on six cells, its matrix's cells reduced to what the runs decide.

A behaviour fix changes digests on purpose: regenerate them with
``python tests/runner/test_step_digests.py --write`` and say in the commit which changed and why.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from tenantry.model.config import Config
from tenantry.model.workload import Workload
from tenantry.runner.setups import SETUPS, apply_setup, build_config, build_fleet, default_config, seed001_config
from tenantry.runner.simulate import ModelReplica, check_workload, drive

DIGESTS = Path(__file__).resolve().parent / "step_digests.json"

#: The one-replica setups (a fleet setup's replicas run the step too: :data:`FLEET_CELLS`).
ONE_REPLICA = sorted(n for n, x in SETUPS.items() if x.fleet is None)
#: Fleet cells traced (setup, pattern): fleet accounting with the shared cache, and tenant affinity.
FLEET_CELLS = (("fleet_prefix_affinity_fleetacct", "flood"), ("fleet_tenant_affinity", "sybil"))


def _seq(s) -> tuple:
    return (s.request.request_id,) + tuple(s)[1:]


def _tenant(t) -> tuple:
    return (tuple(_seq(q) for q in t.queue),) + tuple(t)[1:]


def _event(e) -> tuple:
    return (e.kind, e.request_id, e.tenant, e.t_s, e.reason, e.retry_after_s, e.tokens, e.blocks)


class Trace:
    """A running SHA-256 over steps (see the module docstring); :meth:`feed` each step's
    state and output in order, :meth:`digest` at the end."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.tenants: tuple | None = None
        self.steps = 0

    def feed(self, state, out) -> None:
        self.steps += 1
        self.h.update(repr((out.step_index, out.start_s, out.duration_s, out.batch, out.preempted,
                            tuple(_event(e) for e in out.events), tuple(_seq(s) for s in out.finished),
                            out.reserved, out.reserved_reason)).encode())
        ts, prev = tuple(state.tenants), self.tenants
        changed = [(i, _tenant(t)) for i, t in enumerate(ts) if prev is None or t != prev[i]]
        self.tenants = ts
        kv = state.kv
        self.h.update(repr((state.step_index, state.t_s, state.last_step_s, changed,
                            tuple(_seq(s) for s in state.running), kv.used_blocks, list(kv.refs.items()),
                            list(kv.retained.items()), list(kv.key_salt.items()), state.next_arrival_seq,
                            state.rr_next, state.tier_counters, state.last_left_counter,
                            state.last_left_tier_counter, state.last_left_skips, state.tier_skips,
                            state.last_left_tier_skips)).encode())

    def digest(self) -> str:
        """``<sha256 hex> <steps>``."""
        return f"{self.h.hexdigest()} {self.steps}"


def trace_digest(config: Config, workload: Workload, horizon_s: float | None) -> str:
    """The digest of a run of the model (the one driver loop, :func:`~tenantry.runner.simulate.drive`)."""
    check_workload(config, workload)
    rep, tr = ModelReplica(config), Trace()
    for _ in drive(rep, workload, horizon_s=horizon_s):
        tr.feed(rep.state, rep.last.output)
    return tr.digest()


def fleet_trace_digest(setup: str, pattern: str) -> str:
    """The digest of a fleet cell: every replica's steps, in fleet-step then replica order."""
    from tenantry.adversaries.evaluate import Task, scenario_of
    from tenantry.runner.fleet import run_fleet

    sc = scenario_of(Task(setup, pattern, (), 0))
    tr = Trace()
    for t, _ in run_fleet(build_fleet(setup, sc.roles), sc.workload, horizon_s=min(sc.horizon_s, 8.0)):
        for sub in t.replicas:
            if sub is not None:
                tr.feed(sub.state, sub.output)
    return tr.digest()


def many_tenants(policy: str) -> tuple[Config, Workload]:
    """1,124 tenants of weights 1-3 under ``policy``, 600 requests spread over them in 2.4 s
    (the step once kept the records of 1,024 tenants or more in a table of its own)."""
    from tenantry.model.config import CostConfig, OrderConfig, TenantConfig
    from tenantry.model.workload import Request

    n = 1124
    cfg = Config(tenants=[TenantConfig(f"t{i}", weight=1.0 + i % 3) for i in range(n)], num_blocks=4_000,
                 max_num_seqs=32, token_budget=512, order=OrderConfig(policy=policy),
                 cost=CostConfig(mode="unit", unit_step_s=0.01))
    wl = Workload(tuple(Request(j, f"t{(j * 37) % n}", round(j * 0.004, 6), 32 + j % 50, 4 + j % 20)
                        for j in range(600)))
    return cfg, wl


def _patterns() -> list[str]:
    from tenantry.adversaries.patterns import PATTERNS

    return sorted(PATTERNS)


def run_digest(name: str) -> str:
    """The digest of run ``name`` (``seed001/<setup>``, ``azure/<setup>``, ``cell/<pattern>``,
    ``fleet/<setup>/<pattern>``, ``many/<policy>``)."""
    kind, _, rest = name.partition("/")
    if kind == "seed001":
        from tenantry.runner.traces import seed001_workload

        wl = seed001_workload(seed=9)
        return trace_digest(apply_setup(seed001_config(wl.tenants), rest), wl, 10.0)
    if kind == "azure":
        from tenantry.runner.traces import azure_two_tenant_workload

        wl = azure_two_tenant_workload(speedup=5.0, use_shared=False, max_rows=60)
        return trace_digest(apply_setup(default_config(wl.tenants), rest), wl, 30.0)
    if kind == "cell":
        from tenantry.adversaries.evaluate import Task, scenario_of

        k = _patterns().index(rest)
        setup = ONE_REPLICA[k % len(ONE_REPLICA)]
        sc = scenario_of(Task(setup, rest, (), 0))
        return trace_digest(build_config(setup, sc.roles), sc.workload, min(sc.horizon_s, 8.0))
    if kind == "fleet":
        return fleet_trace_digest(*rest.split("/"))
    if kind == "many":
        cfg, wl = many_tenants(rest)
        return trace_digest(cfg, wl, 4.0)
    raise ValueError(f"unknown run {name!r}")


def run_names() -> list[str]:
    return ([f"seed001/{s}" for s in ONE_REPLICA] + [f"azure/{s}" for s in ONE_REPLICA]
            + [f"cell/{p}" for p in _patterns()] + [f"fleet/{s}/{p}" for s, p in FLEET_CELLS]
            + ["many/vtc", "many/round_robin"])


def _stored() -> dict[str, str]:
    return json.loads(DIGESTS.read_text(encoding="utf-8"))


#: The check run whose matrix is held to its old values (:func:`check_digest`).
CHECK = dict(setups=["fcfs", "vtc", "drr_tokens"], patterns=["flood", "sybil"], seed=5, budget=4)
#: The fields of a matrix cell that the model's runs decide (not its paths or its layout).
CELL_FIELDS = ("setup", "pattern", "evaluations", "score", "steps", "metrics", "findings", "verdict", "params")


def check_digest(out: Path) -> str:
    """The digest of ``tenantry check`` on :data:`CHECK`'s six cells, written into folder ``out``:
    each cell's :data:`CELL_FIELDS` as matrix.json holds them (JSON, keys sorted)."""
    from tenantry.adversaries import evaluate
    from tenantry.adversaries.check import run_check
    from tenantry.adversaries.search import Budget

    evaluate._BASELINES.clear()  # the run computes its own baselines
    kw = dict(CHECK, budget=Budget(CHECK["budget"]))
    run_check(out=out, shrink_evaluations=0, plots="none", extras=False, progress=False, workers=1, **kw)
    evaluate._BASELINES.clear()
    cells = json.loads((out / "matrix.json").read_text(encoding="utf-8"))["cells"]
    text = json.dumps([{k: c.get(k) for k in CELL_FIELDS} for c in cells], sort_keys=True)
    return f"{hashlib.sha256(text.encode()).hexdigest()} {len(cells)}"


def test_every_run_has_a_stored_digest():
    assert sorted(_stored()) == sorted(run_names() + ["check"])


def test_check_matrix_is_byte_identical_with_its_stored_digest(tmp_path):
    """``tenantry check`` on six cells (budget 4, seed 5) finds, scores and counts what it did
    with the old step: every evaluation, finding and score is the old one."""
    got = check_digest(tmp_path / "rep")
    assert got == _stored()["check"]


@pytest.mark.parametrize("name", run_names())
def test_step_is_byte_identical_with_its_stored_digest(name):
    want = _stored()[name]
    got = run_digest(name)
    assert got == want, f"{name}: the step's trace changed (stored {want}, now {got})"


def test_a_changed_step_changes_the_digest():
    """The digest is not vacuous: one different token count in one step changes it."""
    from tenantry.model.step import Step
    from tenantry.runner.traces import seed001_workload

    class OneTokenShort(Step):
        def execute(self):
            if self.k == 40 and self.planned:
                rid = next(iter(self.planned))
                self.planned[rid] = max(self.planned[rid] - 1, 0)
            super().execute()

    wl = seed001_workload(seed=9)
    cfg = apply_setup(seed001_config(wl.tenants), "vtc")
    rep, tr = ModelReplica(cfg, variant=OneTokenShort), Trace()
    for _ in drive(rep, wl, horizon_s=10.0):
        tr.feed(rep.state, rep.last.output)
    assert tr.digest() != _stored()["seed001/vtc"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/runner/test_step_digests.py --write  (rewrites tests/runner/step_digests.json)")
    import tempfile

    digests = {n: run_digest(n) for n in run_names()}
    with tempfile.TemporaryDirectory() as d:
        digests["check"] = check_digest(Path(d) / "rep")
    DIGESTS.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {DIGESTS}")
