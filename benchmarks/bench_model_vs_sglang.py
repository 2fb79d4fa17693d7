"""Benchmark: cost per step of SGLang's scheduler against the reference model's step,
in one run, on the same workload, at 16, 128 and 512 running requests.

Run on demand (not a test; needs SGLang 0.5.23 for its half, see scripts/install_sglang.sh):

    python benchmarks/bench_model_vs_sglang.py [--running 16 128 512] [--steps 200] [--repeats 3]

Workload: N requests of 4 tenants, 128-token prompts and outputs longer than
the run, all admitted at once; both schedulers run until every request is
decoding, then ``--steps`` decode steps are timed, each with N requests in the
batch.  The pool is large enough that nothing is retracted.

* SGLang 0.5.23: one iteration of its non-overlap event loop,
  ``get_next_batch_to_run()`` + ``run_batch()`` + ``process_batch_result()``,
  driven through :class:`tenantry.engines.sglang.SglangScheduler`; the time
  spent inside the stand-in model worker (building the sampled-token tensor)
  is measured and subtracted, so what remains is SGLang's own scheduling and
  bookkeeping (the counterpart of vLLM's ``schedule()`` +
  ``update_from_output()`` in ``bench_model_vs_vllm.py``).
* reference model: :func:`tenantry.model.step.step` (pure: a new state every
  step), policy ``fcfs`` and ``vtc``, timed by ``bench_model_vs_vllm.model_us``.

Prints microseconds per step and per running request, and the model's cost as
a fraction of SGLang's.  Timings are wall-clock (``time.perf_counter``), the
best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model_vs_vllm import PROMPT_TOKENS, TENANTS, model_us, token_budget  # noqa: E402


def sglang_us(n: int, steps: int) -> float:
    """Microseconds per decode iteration of SGLang's scheduler with n running requests."""
    from tenantry.engines.sglang import SglangScheduler

    output = 64 + steps + 64
    context = PROMPT_TOKENS + output + 64
    blocks = n * (-(-context // 16)) + 64
    s = SglangScheduler(num_blocks=blocks, max_num_seqs=n, token_budget=token_budget(n), policy="fcfs",
                        prefix_cache=False, max_model_len=context)
    for i in range(n):
        s.add_request(i, PROMPT_TOKENS, output)
    S = s.scheduler
    while s.num_waiting() or S.chunked_req is not None or any(len(r.output_ids) == 0 for r in S.running_batch.reqs) \
            or S.last_batch is None or not S.last_batch.forward_mode.is_decode():
        s.step()
    worker = s.worker
    inner = worker.forward_batch_generation
    spent = [0.0]

    def timed_forward(batch, **kw):
        t = time.perf_counter()
        try:
            return inner(batch, **kw)
        finally:
            spent[0] += time.perf_counter() - t

    worker.forward_batch_generation = timed_forward
    total = 0.0
    with s._context():
        for _ in range(steps):
            spent[0] = 0.0
            t0 = time.perf_counter()
            plan = S.get_next_batch_to_run(running_batch=S.running_batch, last_batch=S.last_batch)
            S.running_batch = plan.running_batch
            batch = plan.batch_to_run
            result = S.run_batch(batch)
            S.process_batch_result(batch, result)
            S.last_batch = batch
            total += time.perf_counter() - t0 - spent[0]
            assert batch.forward_mode.is_decode() and len(batch.reqs) == n
    return total / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, nargs="+", default=[16, 128, 512])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from tenantry.engines.sglang import sglang_available

    ok, why = sglang_available()
    print(f"SGLang: {why}")
    print(f"{'running':>8} {'SGLang us/step':>15} {'us/req':>7} {'model fcfs us/step':>19} {'us/req':>7} "
          f"{'ratio':>6} {'model vtc us/step':>18} {'us/req':>7} {'ratio':>6}")
    for n in args.running:
        g = min(sglang_us(n, args.steps) for _ in range(args.repeats)) if ok else float("nan")
        f = min(model_us(n, args.steps, "fcfs") for _ in range(args.repeats))
        c = min(model_us(n, args.steps, "vtc") for _ in range(args.repeats))
        print(f"{n:>8} {g:>15.0f} {g / n:>7.2f} {f:>19.0f} {f / n:>7.2f} {f / g:>6.2f} {c:>18.0f} {c / n:>7.2f} "
              f"{c / g:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
