"""Benchmark: cost per step of vLLM's scheduler against the reference model's step
and the fast replica, in one run, on the same workload, at 16, 128 and 512 running requests.

Run on demand (not a test; needs vLLM for its half, see scripts/install_vllm.sh):

    python benchmarks/bench_model_vs_vllm.py [--running 16 128 512] [--steps 200] [--repeats 3] [--baseline REV]

Workload: N requests of 4 tenants, 128-token prompts and outputs longer than
the run, all admitted at once; each scheduler runs until every request is
decoding, then ``--steps`` decode steps are timed, each with N requests in the
batch.  The pool is large enough that nothing is preempted.  The columns:

* vLLM 0.33: ``Scheduler.schedule()`` plus ``Scheduler.update_from_output()``
  (the two scheduler calls of ``EngineCore.step``), driven through
  :class:`tenantry.engines.vllm.VllmScheduler`'s scheduler; the fabricated
  model output of each step is built outside the timed region.
* model fcfs, model vtc: :func:`tenantry.model.step.step` (pure: a new state
  every step), policy ``fcfs`` and ``vtc``.
* fast fcfs, fast vtc: :class:`tenantry.runner.fast.FastReplica` (the same steps
  computed in place, no step records), ``rep.step(StepInput())`` on the same
  configuration; it decodes lazily (a sequence is touched when it needs a KV
  block, not every step), so its cost is amortized over the timed steps.  After
  them the benchmark checks, untimed, that the N requests produced N tokens a
  step between them.  When :func:`tenantry.runner.fast.unsupported` rejects the
  configuration, the columns read ``n/a`` and the reason is printed instead.

Prints microseconds per step and per running request, and each column's cost
as a fraction of vLLM's (``ratio``).  Timings are wall-clock
(``time.perf_counter``), the best of ``--repeats`` rounds; each round times
every column once, in turn, so that a busy machine slows them alike.
``--baseline REV`` also times the model's step as it was at git revision REV
(its ``model/`` folder, extracted to a temporary package), in the same run and
on the same workload, and prints the current step's cost as a fraction of that
one's.
"""

from __future__ import annotations

import argparse
import time

import importlib
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import tenantry.model.config as config_mod
import tenantry.runner.fast as fast_mod
import tenantry.model.state as state_mod
import tenantry.model.step as step_mod
import tenantry.model.workload as workload_mod

PROMPT_TOKENS = 128
TENANTS = 4


def token_budget(n: int) -> int:
    """Tokens per step: enough for every prompt of the warm-up at once, and >= N (vLLM requires it)."""
    return max(2048, n)


CURRENT = types.SimpleNamespace(config=config_mod, state=state_mod, step=step_mod, workload=workload_mod)


def baseline_model(rev: str) -> types.SimpleNamespace:
    """The model package as it was at git revision ``rev`` (its ``model/`` folder, extracted
    with ``git archive`` into a temporary folder and imported as ``tenantry_baseline_model``)."""
    root = Path(__file__).resolve().parent.parent
    tmp = Path(tempfile.mkdtemp(prefix="tenantry-baseline-"))
    pkg = tmp / "tenantry_baseline_model"
    pkg.mkdir()
    tar = subprocess.run(["git", "-C", str(root), "archive", rev, "model"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(pkg), "--strip-components=1"], input=tar, check=True)
    (pkg / "__init__.py").touch()
    sys.path.insert(0, str(tmp))
    mods = {m: importlib.import_module(f"tenantry_baseline_model.{m}") for m in ("config", "state", "step", "workload")}
    return types.SimpleNamespace(**mods)


def model_config(n: int, policy: str, m: types.SimpleNamespace = CURRENT):
    """The model's configuration (modules ``m``) for n running requests under ``policy``."""
    c = m.config
    return c.Config(tenants=tuple(c.TenantConfig(f"t{i}") for i in range(TENANTS)), num_blocks=200_000,
                    max_num_seqs=n, token_budget=token_budget(n), order=c.OrderConfig(policy=policy))


def model_requests(n: int, m: types.SimpleNamespace = CURRENT) -> list:
    """The workload's n requests (modules ``m``), all arriving at 0."""
    return [m.workload.Request(i, f"t{i % TENANTS}", 0.0, PROMPT_TOKENS, 100_000) for i in range(n)]


def model_us(n: int, steps: int, policy: str, m: types.SimpleNamespace = CURRENT) -> float:
    """Microseconds per decode step of the reference model (modules ``m``) with n running requests."""
    cfg = model_config(n, policy, m)
    step = m.step.step
    st, _ = step(cfg, m.state.initial_state(cfg), m.workload.StepInput(arrivals=model_requests(n, m)))
    while any(t.queue for t in st.tenants) or any(s.output_done == 0 for s in st.running):
        st, _ = step(cfg, st)
    assert len(st.running) == n
    t0 = time.perf_counter()
    for _ in range(steps):
        st, out = step(cfg, st)
    dt = time.perf_counter() - t0
    assert len(out.batch) == n
    return dt / steps * 1e6


def fast_us(n: int, steps: int, policy: str) -> float:
    """Microseconds per decode step of the fast replica with n running requests."""
    StepInput = workload_mod.StepInput
    rep = fast_mod.FastReplica(model_config(n, policy))
    rep.step(StepInput(arrivals=model_requests(n)))
    while any(s.output_done == 0 for s in rep.sequences()):  # queued ones have none either
        rep.step(StepInput())
    done = [s.output_done for s in rep.sequences() if s.running]
    assert len(done) == n
    rep.step(StepInput())  # untimed: sequences() brought every sequence up to date; let them decode lazily again
    t0 = time.perf_counter()
    for _ in range(steps):
        rep.step(StepInput())
    dt = time.perf_counter() - t0
    after = {s.request_id: s.output_done for s in rep.sequences() if s.running}
    assert len(after) == n and sum(after.values()) == sum(done) + n * (steps + 1)
    return dt / steps * 1e6


def vllm_us(n: int, steps: int) -> float:
    """Microseconds per decode step of vLLM's schedule() + update_from_output() with n running requests."""
    from tenantry.engines.vllm import VllmScheduler, _token, _TAG_SAMPLE, _vllm

    v = _vllm()
    blocks = n * (PROMPT_TOKENS + 4 * steps + 64) // 16 + 64
    vs = VllmScheduler(num_blocks=blocks, max_num_seqs=n, token_budget=token_budget(n), policy="fcfs",
                       max_model_len=PROMPT_TOKENS + 100_000 + 16)
    for i in range(n):
        vs.add_request(i, f"t{i % TENANTS}", PROMPT_TOKENS, 100_000)
    sched = vs.scheduler
    while vs.num_waiting() or any(r.num_output_tokens == 0 for r in sched.running):
        vs.step()
    assert vs.num_running() == n
    total = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        so = sched.schedule()
        t1 = time.perf_counter()
        ids = list(so.num_scheduled_tokens)
        out = v["ModelRunnerOutput"](
            req_ids=ids, req_id_to_index={rid: j for j, rid in enumerate(ids)},
            sampled_token_ids=[[_token(_TAG_SAMPLE, int(rid), sched.requests[rid].num_output_tokens)] for rid in ids])
        t2 = time.perf_counter()
        sched.update_from_output(so, out)
        total += (t1 - t0) + (time.perf_counter() - t2)
        assert len(ids) == n
    return total / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, nargs="+", default=[16, 128, 512])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="also time the model's step at this git revision, in the same run")
    args = ap.parse_args()
    from tenantry.engines.vllm import vllm_available

    ok, why = vllm_available()
    print(f"vLLM: {why}")
    base = baseline_model(args.baseline) if args.baseline else None
    policies = ("fcfs", "vtc")
    no_fast = {(n, p): fast_mod.unsupported(model_config(n, p)) for n in args.running for p in policies}
    for p, why in sorted({(p, why) for (_, p), why in no_fast.items() if why is not None}):
        print(f"fast {p}: not timed: the fast replica does not implement the configuration's {why}")
    head = (f"{'running':>8} {'vLLM us/step':>13} {'us/req':>7} {'model fcfs us/step':>19} {'us/req':>7} "
            f"{'ratio':>6} {'model vtc us/step':>18} {'us/req':>7} {'ratio':>6} "
            f"{'fast fcfs us/step':>18} {'us/req':>7} {'ratio':>6} {'fast vtc us/step':>17} {'us/req':>7} {'ratio':>6}")
    if base is not None:
        head += f" {'fcfs at ' + args.baseline[:10]:>19} {'now/then':>8} {'vtc at ' + args.baseline[:10]:>18} {'now/then':>8}"
    print(head)
    for n in args.running:
        columns = {"vllm": (lambda: vllm_us(n, args.steps)) if ok else None}
        for p in policies:
            columns[f"model {p}"] = lambda p=p: model_us(n, args.steps, p)
            columns[f"fast {p}"] = None if no_fast[(n, p)] else (lambda p=p: fast_us(n, args.steps, p))
            if base is not None:
                columns[f"base {p}"] = lambda p=p: model_us(n, args.steps, p, base)
        best = {k: float("inf") if fn else float("nan") for k, fn in columns.items()}
        for _ in range(args.repeats):  # one round times every column once, in turn
            for k, fn in columns.items():
                if fn is not None:
                    best[k] = min(best[k], fn())
        v, f, c = best["vllm"], best["model fcfs"], best["model vtc"]
        line = (f"{n:>8} {v:>13.0f} {v / n:>7.2f} {f:>19.0f} {f / n:>7.2f} {f / v:>6.2f} {c:>18.0f} {c / n:>7.2f} "
                f"{c / v:>6.2f}")
        for p, width in (("fcfs", 18), ("vtc", 17)):
            x = best[f"fast {p}"]
            line += (f" {'n/a':>{width}} {'n/a':>7} {'n/a':>6}" if no_fast[(n, p)] else
                     f" {x:>{width}.1f} {x / n:>7.2f} {x / v:>6.3f}")
        if base is not None:
            bf, bc = best["base fcfs"], best["base vtc"]
            line += f" {bf:>19.0f} {f / bf:>8.2f} {bc:>18.0f} {c / bc:>8.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
