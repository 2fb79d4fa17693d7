"""Careless and hostile adapters: a scheduler at fault is a finding naming the call and the
field, a user at fault (a target that is not one) is exit 2 and one line; either way
tenantry never gives a wrong answer, never dies with the adapter, and changes nothing
outside ``--out``.  Issue 34.  (tests/test_adapter_hostile.py holds the older cases: a
call that raises or hangs, a plan that is not a Plan, an impossible plan.)

The adapters are minisched (examples/minisched) with one careless behaviour each, written
into a module in the test's folder, so that the same factories run in-process and behind
``tenantry verify --target`` (and the pytest plugin).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import attrs
import numpy as np
import pytest

from conftest import REPO
from conftest import snapshot
from tenantry.cli import main
from tenantry.model.config import ConfigError
from tenantry.model.workload import Request, Workload
from tenantry.runner.history import history_lines, read_history, write_history
from tenantry.verify.protocol import Plan, PlanError, Rejection, Scheduled, normalise_plan
from tenantry.verify.run import verify_workload
from tenantry.verify.system import TargetSystem
from tenantry.verify.target import load_factory

EXAMPLES = REPO / "examples"

#: Six requests of two tenants: chunked prefills, decodes, one finishing early (about 40 steps).
WL = Workload(tuple(Request(i, "ab"[i % 2], 0.01 * i, 300 + 10 * i, 3 + i % 4) for i in range(6)))
WL_LINES = "".join(json.dumps({"request_id": r.request_id, "tenant": r.tenant, "arrival_s": r.arrival_s,
                               "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens}) + "\n"
                   for r in WL.requests)

#: The hostile adapters, one factory per behaviour (``MODES``); written to ``careless_sched.py``.
MODULE = '''
import copy, os, signal, sys

import attrs
import numpy as np

from minisched.tenantry_adapter import MiniSchedAdapter
from tenantry.verify.protocol import Claims, Plan, Rejection, Scheduled

MAIN = os.getpid()


class Fatal(BaseException):
    """A BaseException of the scheduler's own (neither Exception nor SystemExit)."""


class Careless(MiniSchedAdapter):
    def __init__(self, tenants=(), mode="none"):
        super().__init__(tenants)
        self.mode, self.steps, self.kept = mode, 0, []

    def add_request(self, request):
        m = self.mode
        if m.startswith("set:"):  # set:<field>:<python literal>
            _, field, value = m.split(":", 2)
            object.__setattr__(request, field, eval(value))
        if m == "del_tenant":
            object.__delattr__(request, "tenant")
        if m == "set_swallowed":
            try:
                object.__setattr__(request, "output_tokens", 1)
            except AttributeError:
                pass
        if m == "evolve_own_copy":  # careful: its own copy may change
            request = attrs.evolve(request, prompt_tokens=request.prompt_tokens)
            object.__setattr__(request, "predicted_output_tokens", 7)
        if m == "copy_own_copy":
            request = copy.copy(request)
            object.__setattr__(request, "output_tokens", 1)
        self.kept.append(request)
        answer = super().add_request(request)
        if m == "answer_int" and request.request_id == 2:
            return 429
        if m == "answer_unknown" and request.request_id == 2:
            return np.str_("overloaded")
        return answer

    def plan_step(self, t_s):
        self.steps += 1
        m, k = self.mode, self.steps - 1
        if m == "set_later" and k == 3:
            object.__setattr__(self.kept[0], "prompt_tokens", 1)
        if m == "exit" and k == 2:
            os._exit(7)
        if m == "exit_swallowed" and k == 2:
            try:
                os._exit(7)
            except BaseException:
                pass
        if m == "abort" and k == 2:
            os.abort()
        if m == "keyboard" and k == 2:
            raise KeyboardInterrupt
        if m == "fatal" and k == 2:
            raise Fatal("scheduler state lost")
        if m == "kill_in_worker" and k == 40 and os.getpid() != MAIN:
            os.kill(os.getpid(), signal.SIGKILL)
        if m == "rebind_claims" and k == 2:
            self.claims = attrs.evolve(self.claims, config=attrs.evolve(self.claims.config, num_blocks=200))
        if m == "rebind_equal_claims" and k == 2:
            self.claims = attrs.evolve(self.claims)
        if m == "claims_in_place" and k == 2:
            object.__setattr__(self.claims.config, "max_num_seqs", 2)
        if m == "generator":
            return (x for x in ())
        p = super().plan_step(t_s)
        if m == "batch_generator":
            return attrs.evolve(p, batch=(e for e in p.batch))
        if m == "numpy":
            return numpy_plan(p)
        if m.startswith("ids:"):
            return attrs.evolve(p, blocks={r: tuple(spell(m[4:], b) for b in ids) for r, ids in p.blocks.items()})
        if m == "preempted_set" and p.batch:
            return attrs.evolve(p, preempted={p.batch[0].request_id})
        if m == "float_tokens" and p.batch:
            return attrs.evolve(p, batch=((p.batch[0].request_id, np.float64(p.batch[0].num_tokens)),) + p.batch[1:])
        if m == "retry_negative" and k == 1:
            return attrs.evolve(p, rejected=(Rejection(5, "queue_full", -1.0),))
        if m == "over_pool" and p.blocks:  # counts over the pool, no free count of its own
            return attrs.evolve(p, blocks={r: 400 for r in p.blocks}, free_blocks=None)
        if m == "counter_nan" and k == 1:
            return attrs.evolve(p, counters={**p.counters, "a": float("nan")})
        return p

    def take_results(self, results):
        m = self.mode
        if m == "results_finished" and results.finished:
            object.__setattr__(results, "finished", ())
        if m == "results_tokens" and results.step_index == 4:
            object.__setattr__(results, "tokens", results.tokens + (99,))
        if m == "sys_exit" and results.step_index == 3:
            sys.exit(3)
        super().take_results(results)


def spell(how, b):
    """Block id ``b`` in one accepted spelling (or a refused one)."""
    return {"int": b, "str": f"blk-{b}", "tuple": ("kv", "salt-a", b), "nested": ("kv", None, ("page", b)),
            "list": ["kv", b], "numpy": np.int64(b), "numpy_str": np.str_(f"b{b}"),
            "mixed": (b, f"s{b}", ("t", b))[b % 3],
            "float": float(b), "bool": b % 2 == 0, "frozenset": frozenset((b,)), "bytes": str(b).encode()}[how]


def numpy_plan(p):
    """The same plan with NumPy scalars and arrays in every field that takes numbers."""
    return Plan(batch=np.array([[e.request_id, e.num_tokens, e.computed_tokens] for e in p.batch], dtype=np.int64)
                if p.batch else np.zeros((0, 3), dtype=np.int64),
                preempted=np.array(p.preempted, dtype=np.int32),
                rejected=[(np.int64(r.request_id), None if r.reason is None else np.str_(r.reason), None if r.retry_after_s is None
                           else np.float32(r.retry_after_s)) for r in p.rejected],
                blocks={np.int64(r): np.array(ids, dtype=np.int64) for r, ids in p.blocks.items()},
                used_blocks=None, free_blocks=np.int64(p.free_blocks),
                counters={np.str_(t): np.float64(c) for t, c in p.counters.items()})


def make(tenants=(), mode="none"):
    return Careless(tenants, mode)


def factory(mode):
    return lambda tenants=(): Careless(tenants, mode)


for _mode in ("none", "numpy", "kill_in_worker", "ids:int", "ids:str", "ids:tuple", "ids:nested", "ids:list",
              "ids:numpy", "ids:numpy_str", "ids:mixed"):
    globals()["make_" + _mode.replace(":", "_")] = factory(_mode)


# --- factories a user got wrong --------------------------------------------------------------

class NoPlan:
    claims = Careless().claims

    def add_request(self, r): return None

    def abort_request(self, rid): pass

    def take_results(self, res): pass


class OnlyAdd:
    def add_request(self, r): return None


class DictClaims(Careless):
    claims = {"num_blocks": 64}

    def __init__(self, tenants=()):
        MiniSchedAdapter.__init__(self, tenants)
        del self.claims


class NoClaims(NoPlan):
    claims = property(lambda self: self.config.claims)

    def plan_step(self, t_s): return Plan()


def returns_none(tenants=()):
    return None


def returns_int(tenants=()):
    return 5


def returns_class(tenants=()):
    return Careless


def no_plan_step(tenants=()):
    return NoPlan()


def only_add(tenants=()):
    return OnlyAdd()


def dict_claims(tenants=()):
    return DictClaims(tenants)


def no_claims(tenants=()):
    return NoClaims()


NOT_CALLABLE = 5
'''


@pytest.fixture
def sched(tmp_path, monkeypatch):
    """The module of hostile adapters, importable as ``careless_sched`` (and minisched beside it)."""
    (tmp_path / "careless_sched.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    for m in [m for m in sys.modules if m.startswith("careless_sched")]:
        del sys.modules[m]
    import careless_sched

    yield careless_sched
    sys.modules.pop("careless_sched", None)


def _run(sched, mode, timeout_s=5.0, **kw):
    kw.setdefault("determinism", False)
    return verify_workload(lambda: sched.Careless((), mode), WL, timeout_s=timeout_s, **kw)


# --- histories carry what the harness recorded (issue 34: 2) --------------------------------------

BLOCK_ID_SPELLINGS = ["int", "str", "tuple", "nested", "list", "numpy", "numpy_str", "mixed"]


@pytest.mark.parametrize("how", BLOCK_ID_SPELLINGS)
def test_every_block_id_spelling_survives_a_history_written_and_read(sched, how, tmp_path):
    """Before: tuple ids (an outer cache tier's ("kv", salt, key)) passed in-process, but the
    history they were written into was refused by tenantry's own reader.  Each spelling's
    history reads back to the same lines, with hashable ids, and verify --history judges it as
    the run was judged."""
    v = _run(sched, f"ids:{how}")
    assert v.ok, v.render()
    ids = [b for s in v.history.steps for bs in (s.block_ids or {}).values() for b in bs]
    assert ids and all(type(b) in (int, str, tuple) for b in ids) and len(set(ids)) > 1
    path = tmp_path / "h.jsonl"
    write_history(v.history, path)
    back = read_history(path)
    assert list(history_lines(back)) == list(history_lines(v.history))
    assert back.steps[5].block_ids == v.history.steps[5].block_ids  # tuples again, nested ones too
    assert main(["verify", "--history", str(path), "--out", str(tmp_path / "rep")]) == 0


def test_unknown_reasons_survive_a_history_and_are_refusal_truth(sched, tmp_path):
    v = _run(sched, "answer_unknown")
    f = v.findings[0]
    assert (f.invariant, f.request_id) == ("REFUSAL-TRUTH", 2) and "'overloaded' is not a reason" in f.message
    write_history(v.history, tmp_path / "h.jsonl")
    assert list(history_lines(read_history(tmp_path / "h.jsonl"))) == list(history_lines(v.history))
    assert main(["verify", "--history", str(tmp_path / "h.jsonl"), "--out", str(tmp_path / "rep")]) == 1
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["findings"][0]["invariant"] == "REFUSAL-TRUTH"


def test_a_plan_of_negative_tokens_is_recorded_as_given_and_its_history_reads_back(tmp_path, monkeypatch):
    """examples/faults/plan_overrun plans -63 tokens (BATCH-LIMITS, then STALLED): recorded as given,
    its history was refused by tenantry's own reader (batch pairs of integers >= 0), which ended
    a matrix at the fresh-process re-run with exit 2 and no report."""
    from tenantry.runner.traces import read_workload_jsonl

    monkeypatch.syspath_prepend(str(EXAMPLES))
    from faults.plan_overrun import make_scheduler

    v = verify_workload(make_scheduler, read_workload_jsonl(EXAMPLES / "faults" / "witness" / "plan_overrun.jsonl"),
                        determinism=False)
    assert "BATCH-LIMITS" in v.invariants() and any(n < 0 for s in v.history.steps for _, n in s.batch)
    write_history(v.history, tmp_path / "h.jsonl")
    assert list(history_lines(read_history(tmp_path / "h.jsonl"))) == list(history_lines(v.history))


def test_books_over_the_pool_are_recorded_as_given_and_read_back(sched, tmp_path):
    """Blocks over the pool make the recorded free count negative: KV-CAP and KV-CONSERVE judge
    it, and the history (free_blocks < 0) reads back as written."""
    v = _run(sched, "over_pool")
    assert {"KV-CAP", "KV-CONSERVE"} & set(v.invariants()) and min(s.free_blocks for s in v.history.steps) < 0
    write_history(v.history, tmp_path / "h.jsonl")
    assert list(history_lines(read_history(tmp_path / "h.jsonl"))) == list(history_lines(v.history))


@pytest.mark.parametrize("how", BLOCK_ID_SPELLINGS)
def test_block_id_spellings_pass_the_determinism_rerun_in_a_fresh_process(sched, how, tmp_path):
    """The fresh process of DETERMINISM writes the history that this process reads back: checked,
    not 'tenantry: error: ... block_ids=...: must be ...' (exit 2, no report)."""
    system = TargetSystem(f"careless_sched:make_ids_{how}", path=str(tmp_path))
    v = verify_workload(system.factory([("a", "victim"), ("b", "victim")]), WL, determinism=False)
    d, why = system.rerun_differs(WL, None, [("a", "victim"), ("b", "victim")], v.history)
    assert d is None and why.startswith("checked (a fresh process"), why


def test_tuple_block_ids_through_a_whole_quick_matrix_with_its_rerun(sched, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code = main(["verify", "--target", "careless_sched:make_ids_tuple", "--quick", "--budget", "1", "--workers", "1",
                 "--patterns", "flood", "--quiet", "--out", "rep"])
    assert code == 0, capsys.readouterr()
    (cell,) = json.loads((tmp_path / "rep" / "matrix.json").read_text())["cells"]
    assert cell["coverage"]["DETERMINISM"].startswith("checked (a fresh process"), cell["coverage"]["DETERMINISM"]
    assert cell["findings"] == []
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("rep")} == before


# --- every spelling of a plan is carried, or refused naming the field (2, 3) ----------------------

#: (what, a plan field's spelling, its canonical form in the normalised plan)
ACCEPTED = [
    ("batch tuple", Plan(batch=((1, 2),)), "batch", (Scheduled(1, 2),)),
    ("batch list of lists", Plan(batch=[[1, 2, 0]]), "batch", (Scheduled(1, 2, 0),)),
    ("batch numpy ints", Plan(batch=[(np.int64(1), np.int32(2), np.uint8(0))]), "batch", (Scheduled(1, 2, 0),)),
    ("batch 2-D array", Plan(batch=np.array([[1, 2], [3, 1]])), "batch", (Scheduled(1, 2), Scheduled(3, 1))),
    ("batch generator", Plan(batch=(e for e in [(1, 2)])), "batch", (Scheduled(1, 2),)),
    ("batch Scheduled of numpy", Plan(batch=(Scheduled(np.int64(1), np.int64(2), None),)), "batch", (Scheduled(1, 2),)),
    ("batch negative tokens", Plan(batch=((1, -3),)), "batch", (Scheduled(1, -3),)),
    ("preempted numpy array", Plan(preempted=np.array([4, 5])), "preempted", (4, 5)),
    ("preempted range", Plan(preempted=range(2)), "preempted", (0, 1)),
    ("rejected numpy", Plan(rejected=[(np.int64(3), np.str_("queue_full"), np.float32(0.5))]), "rejected",
     (Rejection(3, "queue_full", 0.5),)),
    ("rejected unknown reason", Plan(rejected=[(3, "overloaded")]), "rejected", (Rejection(3, "overloaded"),)),
    ("retry int", Plan(rejected=[Rejection(3, "rate_limit", 2)]), "rejected", (Rejection(3, "rate_limit", 2),)),
    ("blocks count numpy", Plan(blocks={np.int64(1): np.int64(3)}), "blocks", {1: 3}),
    ("blocks int ids", Plan(blocks={1: (7, 8)}), "blocks", {1: (7, 8)}),
    ("blocks list ids", Plan(blocks={1: [7, 8]}), "blocks", {1: (7, 8)}),
    ("blocks numpy array", Plan(blocks={1: np.array([7, 8])}), "blocks", {1: (7, 8)}),
    ("blocks str ids", Plan(blocks={1: ("a", np.str_("b"))}), "blocks", {1: ("a", "b")}),
    ("blocks tuple ids", Plan(blocks={1: (("kv", "s", 7),)}), "blocks", {1: (("kv", "s", 7),)}),
    ("blocks nested tuple ids with None", Plan(blocks={1: (("kv", None, ("page", np.int64(7))),)}), "blocks",
     {1: (("kv", None, ("page", 7)),)}),
    ("blocks list id", Plan(blocks={1: (["kv", 7],)}), "blocks", {1: (("kv", 7),)}),
    ("blocks empty tuple id", Plan(blocks={1: ((),)}), "blocks", {1: ((),)}),
    ("free and used numpy", Plan(free_blocks=np.int64(-2), used_blocks=np.int16(9)), "free_blocks", -2),
    ("counters numpy", Plan(counters={np.str_("a"): np.float32(1.5), "b": np.int64(2)}), "counters",
     {"a": 1.5, "b": 2}),
    ("freed numpy", Plan(freed={np.int64(3): np.int64(2)}), "freed", {3: 2}),
]


@pytest.mark.parametrize("what, plan, field, canonical", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_every_accepted_spelling_becomes_one_plain_canonical_value(what, plan, field, canonical):
    """Before: np.int64(0) in a plan was 'must be an integer'.  Each accepted spelling is the
    plain value (no NumPy type, no list) after the protocol boundary."""
    got = getattr(normalise_plan(plan), field)
    assert got == canonical

    def plain(x):  # no NumPy scalar, array or list survives normalisation
        if isinstance(x, (tuple, list)) and not isinstance(x, tuple):
            return False
        if isinstance(x, dict):
            return all(plain(k) and plain(v) for k, v in x.items())
        if attrs.has(type(x)):
            return all(plain(getattr(x, a.name)) for a in attrs.fields(type(x)))
        if isinstance(x, tuple):
            return all(plain(e) for e in x)
        return type(x) in (int, float, str, type(None))
    assert plain(got), got


REFUSED = [
    (Plan(batch=((1, 2.0),)), "batch[0].num_tokens=2.0: must be an integer, not a float"),
    (Plan(batch=((1, np.float64(2)),)), "batch[0].num_tokens=np.float64(2.0): must be an integer, not a float"),
    (Plan(batch=((True, 2),)), "batch[0].request_id=True: must be an integer, not a bool"),
    (Plan(batch=((np.True_, 2),)), "batch[0].request_id=np.True_: must be an integer, not a bool"),
    (Plan(batch=((-1, 2),)), "batch[0].request_id=-1: must be an integer >= 0"),
    (Plan(batch=((1, 2, -4),)), "batch[0].computed_tokens=-4: must be an integer >= 0"),
    (Plan(batch=({1: 2},)), "batch[0]={1: 2}: must be Scheduled or (request_id, num_tokens[, computed_tokens])"),
    (Plan(preempted={1, 2}), "preempted={1, 2}: must be a tuple or list (a set has no order)"),
    (Plan(preempted="12"), "preempted='12': must be a tuple or list"),
    (Plan(blocks={1: (1.0,)}), "blocks[1][0]=1.0: a block id must be an integer, a string or a tuple of them, not a float"),
    (Plan(blocks={1: (True,)}), "blocks[1][0]=True: a block id must be an integer, a string or a tuple of them, not a bool"),
    (Plan(blocks={1: (frozenset((1,)),)}), "blocks[1][0]=frozenset({1}): a block id must be"),
    (Plan(blocks={1: (b"k",)}), "blocks[1][0]=b'k': a block id must be"),
    (Plan(blocks={1: (None,)}), "blocks[1][0]=None: a block id must be"),
    (Plan(blocks={1: {7}}), "blocks[1]={7}: must be a tuple or list (a set has no order)"),
    (Plan(blocks={1: -1}), "blocks[1]=-1: must be an integer >= 0"),
    (Plan(blocks={"1": 3}), "blocks key='1': must be an integer, not a str"),
    (Plan(rejected=[(1, "queue_full", -1.0)]), "rejected[0].retry_after_s=-1.0: must be a finite number of seconds >= 0"),
    (Plan(rejected=[(1, "queue_full", float("nan"))]), "rejected[0].retry_after_s=nan"),
    (Plan(rejected=[(1, 429)]), "rejected[0].reason=429: must be a string or None"),
    (Plan(counters={"a": np.nan}), "counters['a']=nan: must be a finite number"),
    (Plan(counters={"a": True}), "counters['a']=True: must be a finite number"),
    (Plan(counters={1: 2.0}), "counters key=1: must be a tenant name (str)"),
    (Plan(free_blocks=2.5), "free_blocks=2.5: must be an integer, not a float"),
    (Plan(freed={1: -2}), "freed[1]=-2: must be an integer >= 0"),
]


@pytest.mark.parametrize("plan, words", REFUSED, ids=[w.split(":")[0] for _, w in REFUSED])
def test_every_refused_spelling_names_the_field_and_the_value(plan, words):
    with pytest.raises(PlanError) as e:
        normalise_plan(plan)
    assert words in str(e.value)


@pytest.mark.parametrize("mode, words", [
    ("ids:float", "blocks[0][0]=0.0: a block id must be an integer, a string or a tuple of them, not a float"),
    ("ids:bool", "not a bool"), ("ids:frozenset", "not a frozenset"), ("ids:bytes", "not a bytes"),
    ("preempted_set", "a set has no order"), ("float_tokens", "batch[0].num_tokens=np.float64("),
    ("counter_nan", "counters['a']=nan"), ("generator", "plan='generator': plan_step must return a"),
])
def test_a_refused_spelling_is_plan_malformed_naming_the_field(sched, mode, words):
    f = _run(sched, mode).findings[0]
    assert (f.invariant, f.call) == ("PLAN-MALFORMED", "plan_step") and words in f.message, f.render()


def test_an_add_request_answer_that_is_no_reason_is_plan_malformed(sched):
    f = _run(sched, "answer_int").findings[0]
    assert (f.invariant, f.call, f.request_id) == ("PLAN-MALFORMED", "add_request", 2)
    assert "add_request answer=429: must be a rejection reason (a string) or None" in f.message


@pytest.mark.parametrize("mode", ["none", "numpy", "batch_generator"])
def test_numpy_in_every_field_records_the_same_history_as_plain_values(sched, mode):
    """A plan spelled with NumPy arrays and scalars in every numeric field (or a generator for the
    batch) is the same run as minisched's plain plan: the histories are equal byte for byte."""
    v, clean = _run(sched, mode, determinism=True), _run(sched, "none")
    assert v.ok, v.render()
    assert list(history_lines(v.history)) == list(history_lines(clean.history))


def test_claims_take_a_numpy_bool_and_refuse_a_describe_that_is_no_string():
    """Claims.reference and describe are written into reports and history headers: a NumPy bool
    becomes a bool; a describe of None (or any non-string) is refused where the claims are made."""
    from tenantry.model.config import Config, TenantConfig
    from tenantry.verify.protocol import Claims

    c = Claims(Config(tenants=(TenantConfig("a"),)), reference=np.True_, describe=np.str_("mine"))
    assert (type(c.reference), type(c.describe)) == (bool, str) and c.reference
    with pytest.raises(ConfigError, match="claims.describe=None: must be a string"):
        Claims(Config(tenants=(TenantConfig("a"),)), describe=None)
    with pytest.raises(ConfigError, match="claims.reference='yes': must be True or False"):
        Claims(Config(tenants=(TenantConfig("a"),)), reference="yes")


# --- the harness owns the truth: what a scheduler is given, it cannot change (1) ------------------

TRUTH = {r.request_id: r for r in WL.requests}


@pytest.mark.parametrize("field, value", [
    ("prompt_tokens", "1"), ("output_tokens", "1"), ("request_id", "77"), ("tenant", "'b'"),
    ("arrival_s", "5.0"), ("prefix_ids", "[1, 2]"), ("cancel_s", "0.5"), ("predicted_output_tokens", "3"),
])
def test_a_request_changed_in_add_request_is_adapter_mutated_naming_the_field(sched, field, value):
    """Before: setting a request's sizes to 1 in add_request turned a 101-step run into '3 steps,
    0 findings' (the harness read the changed sizes).  Now the write is refused in the adapter's
    own code, the finding names the call, the request and the field, and the harness's records
    keep the true request."""
    v = _run(sched, f"set:{field}:{value}")
    f = v.findings[0]
    assert (f.invariant, f.call, f.step, f.request_id) == ("ADAPTER-MUTATED", "add_request", 0, 0), f.render()
    assert f"request 0's {field} from {getattr(TRUTH[0], field)!r} to {eval(value)!r}" in f.message
    assert "careless_sched.py" in f.message  # the line of the adapter that wrote
    (rec,) = [r for r in v.history.requests if r.request_id == 0]
    assert (rec.tenant, rec.prompt_tokens, rec.output_tokens, rec.arrival_s) == (
        TRUTH[0].tenant, TRUTH[0].prompt_tokens, TRUTH[0].output_tokens, TRUTH[0].arrival_s)


def test_a_deleted_request_field_is_adapter_mutated(sched):
    f = _run(sched, "del_tenant").findings[0]
    assert (f.invariant, f.call) == ("ADAPTER-MUTATED", "add_request") and "tenant from 'a' to '(deleted)'" in f.message
    assert "careless_sched.py" in f.message


def test_a_write_the_adapter_swallowed_is_still_a_finding(sched):
    f = _run(sched, "set_swallowed").findings[0]
    assert (f.invariant, f.call) == ("ADAPTER-MUTATED", "add_request") and "output_tokens" in f.message


def test_a_kept_request_changed_in_a_later_call_names_that_call(sched):
    f = _run(sched, "set_later").findings[0]
    assert (f.invariant, f.call, f.step) == ("ADAPTER-MUTATED", "plan_step", 3)
    assert "request 0's prompt_tokens from 300 to 1" in f.message


@pytest.mark.parametrize("mode, field", [("results_finished", "finished"), ("results_tokens", "tokens")])
def test_step_results_changed_in_take_results_is_adapter_mutated(sched, mode, field):
    f = _run(sched, mode).findings[0]
    assert (f.invariant, f.call) == ("ADAPTER-MUTATED", "take_results") and f"the results of step" in f.message
    assert f" {field} from " in f.message


@pytest.mark.parametrize("mode", ["evolve_own_copy", "copy_own_copy"])
def test_an_adapter_may_change_its_own_copy(sched, mode):
    """attrs.evolve or copy.copy of what it was given is the adapter's: no finding, the same run."""
    v, clean = _run(sched, mode), _run(sched, "none")
    assert v.ok, v.render()
    assert list(history_lines(v.history)) == list(history_lines(clean.history))


# --- a target that is not one: exit 2, one line, before any work; claims that change (4, 5) -------

BROKEN_MODULES = {
    "syntax": ("def make(:\n    pass\n", ["cannot import broken_target: SyntaxError at", "broken_target.py:1"]),
    "indent": ("def make():\nreturn 1\n", ["cannot import broken_target: IndentationError at", "broken_target.py:2"]),
    "value_error": ("x = 1\nraise ValueError('no GPU found')\n",
                    ["cannot import broken_target: importing it ValueError: no GPU found at", "broken_target.py:2"]),
    "import_error": ("import torch_is_not_installed_here\n",
                     ["cannot import broken_target (No module named 'torch_is_not_installed_here')"]),
    "sys_exit": ("import sys\nsys.exit('no config')\n",
                 ["cannot import broken_target: importing it called sys.exit('no config') at", "broken_target.py:2"]),
    "os_exit": ("import os\nos._exit(3)\n",
                ["cannot import broken_target: importing it called os._exit(3) at", "broken_target.py:2"]),
}


#: (factory in careless_sched, words of the one line)
NOT_ADAPTERS = [
    ("returns_none", ["the factory returned None, not an adapter"]),
    ("returns_int", ["the factory returned an int (5), which has no add_request, abort_request, plan_step, "
                     "take_results methods"]),
    ("returns_class", ["the factory returned the class Careless, not an adapter; return an instance, Careless(...)"]),
    ("no_plan_step", ["the factory returned a NoPlan, which has no plan_step method"]),
    ("only_add", ["which has no abort_request, plan_step, take_results methods"]),
    ("dict_claims", ["whose claims is a dict ({'num_blocks': 64}), not a tenantry.verify.protocol.Claims"]),
    ("no_claims", ["the factory returned a NoClaims, which has no claims ('NoClaims' object has no attribute 'config'"]),
    ("NOT_CALLABLE", ["target='careless_sched:NOT_CALLABLE': is not callable"]),
]


def _usage_error(tmp_path, capsys, argv, words):
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("tenantry: error: ") and all(w in lines[0] for w in words), lines[0]
    assert snapshot(tmp_path) == before  # no report, no lock, no staging folder


@pytest.mark.parametrize("name", list(BROKEN_MODULES))
@pytest.mark.parametrize("way", ["matrix", "workload"])
def test_a_target_module_that_does_not_import_is_one_line(sched, name, way, tmp_path, monkeypatch, capsys):
    """Before: a SyntaxError or an exception at import ended verify --target with a 30-line
    traceback and exit 1 (os._exit at import: tenantry gone with the module's status)."""
    monkeypatch.chdir(tmp_path)
    source, words = BROKEN_MODULES[name]
    (tmp_path / "broken_target.py").write_text(source)
    (tmp_path / "w.jsonl").write_text(WL_LINES)
    extra = ["--quick"] if way == "matrix" else ["--workload", "w.jsonl"]
    _usage_error(tmp_path, capsys, ["verify", "--target", "broken_target:make", *extra, "--out", "rep"],
                 ["target='broken_target:make'", *words])
    sys.modules.pop("broken_target", None)


@pytest.mark.parametrize("factory, words", NOT_ADAPTERS, ids=[n for n, _ in NOT_ADAPTERS])
@pytest.mark.parametrize("way", ["matrix", "workload"])
def test_a_factory_that_builds_no_adapter_is_one_line_before_any_work(sched, factory, words, way, tmp_path,
                                                                        monkeypatch, capsys):
    """Before: a factory returning None was a scheduler finding ('ADAPTER-RAISED ... at
    verify/calls.py:99') with a report, after the whole matrix ran."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.jsonl").write_text(WL_LINES)
    extra = ["--quick"] if way == "matrix" else ["--workload", "w.jsonl"]
    _usage_error(tmp_path, capsys, ["verify", "--target", f"careless_sched:{factory}", *extra, "--out", "rep"],
                 words)


def test_load_factory_says_it_in_one_configerror_for_the_plugin(sched, tmp_path):
    """The pytest plugin turns load_factory's and preflight's ConfigError into a UsageError."""
    (tmp_path / "broken_target.py").write_text("def make(:\n")
    with pytest.raises(ConfigError, match=r"cannot import broken_target: SyntaxError at .*broken_target.py:1"):
        load_factory("broken_target:make", path=str(tmp_path))
    with pytest.raises(ConfigError, match="the factory returned None, not an adapter"):
        TargetSystem("careless_sched:returns_none", path=str(tmp_path)).preflight([("a", "victim")])


@pytest.mark.parametrize("target, words", [
    ("broken_target:make", ["--tenantry-target: target='broken_target:make': cannot import broken_target: "
                            "SyntaxError at", "broken_target.py:1"]),
    ("careless_sched:returns_none", ["--tenantry-target: target='careless_sched:returns_none': the factory "
                                     "returned None, not an adapter"]),
])
def test_the_plugin_says_it_as_a_usage_error(sched, target, words, tmp_path):
    (tmp_path / "broken_target.py").write_text("def make(:\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLES), str(tmp_path)]), "PYTHONDONTWRITEBYTECODE": "1"}
    before = snapshot(tmp_path)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark",
                        f"--tenantry-target={target}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 4, p.stdout + p.stderr  # pytest's usage error
    assert all(w in p.stderr for w in words) and "Traceback" not in p.stderr, p.stderr
    assert snapshot(tmp_path) == before


def test_claims_rebound_to_other_claims_is_adapter_claims_naming_the_call(sched):
    f = _run(sched, "rebind_claims").findings[0]
    assert (f.invariant, f.call, f.step) == ("ADAPTER-CLAIMS", "plan_step", 2), f.render()
    assert "claims.config.num_blocks was 384, now 200" in f.message


def test_claims_changed_in_place_is_adapter_claims_at_the_end(sched):
    v = _run(sched, "claims_in_place")
    (f,) = v.findings  # judged on the claims it started with: minisched's batches of 6 are no BATCH-LIMITS
    assert (f.invariant, f.call) == ("ADAPTER-CLAIMS", "claims") and "claims.config.max_num_seqs was 8, now 2" in f.message
    assert max(len(s.batch) for s in v.history.steps) > 2 and v.history.header["config"]["max_num_seqs"] == 8


def test_claims_rebound_to_equal_claims_is_fine(sched):
    v = _run(sched, "rebind_equal_claims")
    assert v.ok, v.render()


# --- a scheduler cannot end tenantry (6) ----------------------------------------------------------

@pytest.mark.parametrize("timeout_s", [5.0, None], ids=["worker-thread", "inline"])
@pytest.mark.parametrize("mode, call, words", [
    ("exit", "plan_step", "plan_step called os._exit(7) at"),
    ("exit_swallowed", "plan_step", "plan_step called os._exit(7) at"),
    ("abort", "plan_step", "plan_step called os.abort() at"),
    ("sys_exit", "take_results", "take_results called sys.exit(3)"),
    ("fatal", "plan_step", "Fatal: scheduler state lost"),
])
def test_a_scheduler_ending_the_process_is_adapter_raised(sched, mode, call, words, timeout_s):
    """Before: os._exit in an adapter ended tenantry silently with the adapter's exit code,
    leaving a lock file and a staging folder.  Now it raises in the adapter's thread only."""
    v = _run(sched, mode, timeout_s=timeout_s)
    f = v.findings[0]
    assert (f.invariant, f.call) == ("ADAPTER-RAISED", call) and words in f.message, f.render()
    assert "careless_sched.py" in f.message


def test_outside_a_call_os_exit_is_the_real_one(sched):
    _run(sched, "exit")
    pid = os.fork()
    if pid == 0:  # a child forked outside any call exits for real, with its status
        os._exit(5)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 5


def test_a_keyboard_interrupt_raised_by_the_scheduler_on_its_thread_is_a_finding(sched):
    f = _run(sched, "keyboard").findings[0]
    assert (f.invariant, f.call) == ("ADAPTER-RAISED", "plan_step") and "KeyboardInterrupt" in f.message


def test_os_exit_in_a_target_run_is_a_finding_and_leaves_no_lock_or_staging(sched, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.jsonl").write_text(WL_LINES)
    (tmp_path / "careless_exit.py").write_text("from careless_sched import factory\nmake = factory('exit')\n")
    before = snapshot(tmp_path)
    assert main(["verify", "--target", "careless_exit:make", "--workload", "w.jsonl", "--out", "rep",
                 "--no-determinism"]) == 1
    out = capsys.readouterr().out
    assert "ADAPTER-RAISED step 2" in out and "os._exit(7)" in out
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("rep")} == before  # no .rep.lock, no staging
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["findings"][0]["call"] == "plan_step"


def test_a_matrix_worker_killed_under_the_scheduler_is_one_line(sched, tmp_path, monkeypatch, capsys):
    """A pool worker that dies (SIGKILL inside the adapter, as a crash in native code would) ended
    the run with a 30-line BrokenProcessPool traceback.  Now: one line, and --out not created."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code = main(["verify", "--target", "careless_sched:make_kill_in_worker", "--quick", "--budget", "2",
                 "--workers", "2", "--patterns", "flood", "--quiet", "--out", "rep"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "a worker process died while it ran careless_sched:make_kill_in_worker" in err and "rep not created" in err
    assert snapshot(tmp_path) == before


def test_there_are_at_least_25_new_hostile_adapter_cases():
    import inspect

    here = sys.modules[__name__]
    cases = 0
    for name, fn in inspect.getmembers(here, inspect.isfunction):
        if name.startswith("test_") and name != "test_there_are_at_least_25_new_hostile_adapter_cases":
            marks = getattr(fn, "pytestmark", [])
            n = 1
            for m in marks:
                if m.name == "parametrize":
                    n *= len(m.args[1])
            cases += n
    assert cases >= 25, cases
