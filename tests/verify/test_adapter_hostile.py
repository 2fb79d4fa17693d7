"""Hostile schedulers: each bad behaviour is a finding naming the call, never a crash."""

import random
import threading

import attrs
import pytest

from tenantry.model.config import Config, TenantConfig
from tenantry.model.workload import Request, Workload
from tenantry.verify.protocol import Plan
from tenantry.verify.reference import ReferenceAdapter
from tenantry.verify.protocol import PROTOCOL
from tenantry.verify.run import verify_workload

CFG = Config(tenants=(TenantConfig("a"), TenantConfig("b")), num_blocks=64, max_num_seqs=4, token_budget=128)
WL = Workload(tuple(Request(i, "ab"[i % 2], 0.01 * i, 40 + 10 * i, 3 + i % 3) for i in range(8)))


class Hostile(ReferenceAdapter):
    """The reference model with one behaviour replaced (``mode``)."""

    def __init__(self, mode: str, release: threading.Event | None = None) -> None:
        super().__init__(CFG)
        self.mode, self.release, self.calls, self.done = mode, release, 0, []

    def add_request(self, request):
        if self.mode == "raise_add" and request.request_id == 5:
            raise RuntimeError("queue corrupted")
        return super().add_request(request)

    def plan_step(self, t_s):
        self.calls += 1
        plan = super().plan_step(t_s)
        m, k = self.mode, self.calls - 1
        if m == "raise_plan" and k == 3:
            raise ValueError("index out of range in scheduler")
        if m == "exit_plan" and k == 2:
            raise SystemExit(3)
        if m == "hang" and k == 2:
            self.release.wait(30)
        if m == "not_a_plan":
            return {"batch": plan.batch}
        if m == "bad_counters" and k == 1:
            return attrs.evolve(plan, counters={"a": "high"})
        if m == "batch_none" and k == 2:
            return attrs.evolve(plan, batch=None, preempted=7)
        if m == "twice" and plan.batch:
            return attrs.evolve(plan, batch=plan.batch + plan.batch[:1])
        if m == "finished" and self.done:
            return attrs.evolve(plan, batch=plan.batch + ((self.done[0], 1),))
        if m == "pool" and plan.blocks:
            rid = next(iter(plan.blocks))
            return attrs.evolve(plan, blocks={**plan.blocks, rid: CFG.num_blocks + 1})
        if m == "preempted_in_batch" and k == 4 and plan.batch:
            return attrs.evolve(plan, preempted=plan.preempted + (plan.batch[0].request_id,))
        if m == "nondeterministic" and len(plan.batch) > 1 and random.random() < 0.5:
            return attrs.evolve(plan, batch=plan.batch[:-1])
        return plan

    def take_results(self, results):
        if self.mode == "raise_results" and results.step_index == 1:
            raise KeyError("unknown request")
        self.done += list(results.finished)
        if self.mode != "finished":
            super().take_results(results)


def _verify(factory, **kw):
    kw.setdefault("timeout_s", 2.0)
    return verify_workload(factory, WL, **kw)


@pytest.mark.parametrize("mode,invariant,call,step", [
    ("raise_plan", "ADAPTER-RAISED", "plan_step", 3),
    ("exit_plan", "ADAPTER-RAISED", "plan_step", 2),
    ("raise_add", "ADAPTER-RAISED", "add_request", 9),
    ("raise_results", "ADAPTER-RAISED", "take_results", 1),
    ("not_a_plan", "PLAN-MALFORMED", "plan_step", 0),
    ("bad_counters", "PLAN-MALFORMED", "plan_step", 1),
    ("batch_none", "PLAN-MALFORMED", "plan_step", 2),
    ("twice", "BATCH-LIMITS", "plan_step", 0),
    ("pool", "KV-CAP", "plan_step", 0),
    ("preempted_in_batch", "BATCH-LIMITS", "plan_step", 4),
])
def test_hostile_behaviour_is_a_finding(mode, invariant, call, step):
    v = _verify(lambda: Hostile(mode), determinism=False)
    first = v.findings[0]
    assert (first.invariant, first.call, first.step) == (invariant, call, step), first.render()
    if invariant in PROTOCOL:  # the run cannot go on: recorded up to the offending step
        assert len(v.history.steps) == step + (call == "take_results")  # take_results comes after the step ran
    else:  # an impossible plan is recorded as given and judged by the catalog; the run goes on as far as it can
        assert len(v.history.steps) >= step + 1


def test_finished_request_in_batch_is_no_loss():
    v = _verify(lambda: Hostile("finished"), determinism=False)
    f = v.findings[0]
    assert f.invariant == "NO-LOSS" and f.call == "plan_step"
    assert "already ended (finished)" in f.message
    assert v.history.requests[f.request_id].outcome == "finished"


def test_raise_message_names_exception_and_frame():
    v = _verify(lambda: Hostile("raise_plan"), determinism=False)
    f = v.findings[0]
    assert "ValueError: index out of range in scheduler" in f.message
    assert "test_adapter_hostile.py" in f.message


def test_hang_is_reported_within_the_timeout():
    release = threading.Event()
    try:
        v = _verify(lambda: Hostile("hang", release), timeout_s=0.3)
    finally:
        release.set()
    f = v.findings[0]
    assert (f.invariant, f.call, f.step) == ("ADAPTER-HANG", "plan_step", 2)
    assert "0.3 s" in f.message
    assert len(v.findings) == 1  # no determinism re-run after a hang


def test_a_call_spinning_in_python_is_stopped_after_its_timeout():
    """A hung call is abandoned by raising inside its thread: a scheduler spinning in a
    Python loop does not keep a core busy for the rest of the run."""
    import time

    from tenantry.verify.calls import Caller

    spins = []

    def spin():
        while True:
            spins.append(1)
            if len(spins) > 10_000:
                spins.clear()

    c = Caller(timeout_s=0.2)
    ok, fail = c.call("plan_step", spin)
    assert not ok and fail.kind == "timeout" and c.dead
    deadline = time.monotonic() + 5.0
    while c._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not c._thread.is_alive()
    ok, fail = c.call("plan_step", spin)  # the caller stays dead: the scheduler's state is unknown
    assert not ok and "earlier call hung" in fail.detail


def test_factory_that_raises_or_lacks_claims():
    def boom():
        raise ImportError("no module named torch")
    v = _verify(boom)
    assert [(f.invariant, f.call) for f in v.findings] == [("ADAPTER-RAISED", "factory")]
    assert v.history.steps == () and len(v.history.requests) == len(WL)

    # no adapter at all: the user's mistake (the preflight refuses it as a usage error); a run
    # without the preflight says so in one ADAPTER-CLAIMS finding, not "raised at calls.py"
    class NoClaims(Hostile):
        claims = property(lambda self: self.nothing)

        def __init__(self):
            pass
    v = _verify(NoClaims)
    assert [(f.invariant, f.call) for f in v.findings] == [("ADAPTER-CLAIMS", "factory")]
    assert "has no claims ('NoClaims' object has no attribute 'nothing'" in v.findings[0].message

    class BadClaims(Hostile):
        claims = {"num_blocks": 4}

        def __init__(self):
            pass
    v = _verify(BadClaims)
    assert [(f.invariant, f.call) for f in v.findings] == [("ADAPTER-CLAIMS", "factory")]
    assert "whose claims is a dict ({'num_blocks': 4}), not a tenantry.verify.protocol.Claims" in v.findings[0].message


def test_nondeterminism_is_found_with_the_step():
    random.seed(1)  # the hostile scheduler uses the global random state; make this test itself repeatable
    v = _verify(lambda: Hostile("nondeterministic"), catalog=False)
    det = [f for f in v.findings if f.invariant == "DETERMINISM"]
    assert len(det) == 1 and det[0].call == "plan_step" and det[0].step is not None
    clean = _verify(lambda: Hostile("none"))
    assert clean.ok, clean.render()


def test_factory_gets_a_longer_timeout_but_a_hang_is_still_reported(monkeypatch):
    import tenantry.verify.harness as drv

    release = threading.Event()
    slow = lambda: (release.wait(0.5), Hostile("none"))[1]  # builds in 0.5 s: slower than calls may be
    monkeypatch.setattr(drv, "FACTORY_TIMEOUT_S", 2.0)
    v = _verify(slow, timeout_s=0.3, determinism=False)
    assert v.ok, v.render()
    monkeypatch.setattr(drv, "FACTORY_TIMEOUT_S", 0.1)
    hung = threading.Event()
    try:
        v = _verify(lambda: (hung.wait(30), Hostile("none"))[1], timeout_s=0.2)
    finally:
        hung.set()
    assert [(f.invariant, f.call) for f in v.findings] == [("ADAPTER-HANG", "factory")]
    assert "0.2 s" in v.findings[0].message
