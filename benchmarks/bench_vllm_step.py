"""Cost of one step of vLLM's real V1 scheduler on this machine's CPU.

Measures ``Scheduler.schedule()`` plus ``Scheduler.update_from_output()`` (the
scheduler's whole share of an engine step; no model runs) with N requests all
decoding, through :class:`tenantry.engines.vllm.VllmScheduler`.  The
fabricated model output is built before the timer starts, so only vLLM's own
code is timed; ``--adapter`` times the adapter's full ``step()`` instead
(schedule, fabrication, update and the adapter's per-step report).

    python benchmarks/bench_vllm_step.py            # 16, 128 and 512 running
    python benchmarks/bench_vllm_step.py 64 1024 --steps 500 --repeat 5

Needs vLLM 0.33 (scripts/install_vllm.sh).  The reported figure is the best
of ``--repeat`` runs, to damp noise from other work on the machine.
"""

from __future__ import annotations

import argparse
import sys
import time

from tenantry.engines.vllm import VllmScheduler, vllm_available

PROMPT_TOKENS = 32


def _decoding_scheduler(num_running: int, steps: int) -> VllmScheduler:
    """A scheduler with ``num_running`` requests past their prefill that will
    all keep decoding for at least ``steps`` more steps."""
    warmup = 3
    output_tokens = steps + warmup + 2
    blocks_per_request = -(-(PROMPT_TOKENS + output_tokens) // 16)
    s = VllmScheduler(
        num_blocks=num_running * blocks_per_request + 1,
        block_size_tokens=16,
        max_num_seqs=num_running,
        token_budget=max(512, num_running * PROMPT_TOKENS),
    )
    for rid in range(num_running):
        s.add_request(rid, f"t{rid % 4}", PROMPT_TOKENS, output_tokens)
    for _ in range(warmup):  # prefill every request in one step, then decode
        s.step()
    assert s.num_running() == num_running and s.num_waiting() == 0
    return s


def vllm_step_cost_us(
    num_running: int, steps: int = 200, *, adapter: bool = False, clock: str = "wall"
) -> float:
    """Mean microseconds of one vLLM scheduler step (schedule +
    update_from_output) with ``num_running`` requests decoding.

    ``clock="wall"`` times with ``time.perf_counter``; ``clock="cpu"`` with
    ``time.process_time`` (this process's CPU time, less sensitive to other
    work on a loaded machine).  With ``adapter=True``, the adapter's full
    ``step()`` is timed instead.
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', not {clock!r}")
    timer = time.perf_counter if clock == "wall" else time.process_time
    ok, why = vllm_available()
    if not ok:
        raise RuntimeError(why)
    if num_running < 1 or steps < 1:
        raise ValueError("num_running and steps must be >= 1")
    s = _decoding_scheduler(num_running, steps)
    if adapter:
        t0 = timer()
        for _ in range(steps):
            st = s.step()
        elapsed = timer() - t0
        assert len(st["batch"]) == num_running and not st["finished"]
        return elapsed / steps * 1e6

    from vllm.v1.outputs import ModelRunnerOutput

    sched = s.scheduler
    ids = [str(rid) for rid in range(num_running)]
    # Decoding requests are scheduled in the same order every step, so one
    # fabricated output (token 7 for each) serves every step.
    output = ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={rid: i for i, rid in enumerate(ids)},
        sampled_token_ids=[[7] for _ in ids],
    )
    elapsed = 0.0
    for _ in range(steps):
        t0 = timer()
        so = sched.schedule()
        sched.update_from_output(so, output)
        elapsed += timer() - t0
        if len(so.num_scheduled_tokens) != num_running:
            raise AssertionError("a request left the decode batch during the benchmark")
    return elapsed / steps * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("num_running", nargs="*", type=int, default=[16, 128, 512])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--adapter", action="store_true", help="time the adapter's full step()")
    args = ap.parse_args(argv)
    ok, why = vllm_available()
    if not ok:
        print(f"vLLM unavailable: {why}", file=sys.stderr)
        return 2
    what = "adapter step()" if args.adapter else "schedule()+update_from_output()"
    print(f"{why}, {what}, {args.steps} steps, best of {args.repeat}")
    print(f"{'running':>8} {'wall us/step':>13} {'wall us/req':>12} {'cpu us/step':>12} {'cpu us/req':>11}")
    for n in args.num_running:
        row = [n]
        for clock in ("wall", "cpu"):
            us = min(
                vllm_step_cost_us(n, args.steps, adapter=args.adapter, clock=clock)
                for _ in range(args.repeat)
            )
            row += [us, us / n]
        print(f"{row[0]:>8} {row[1]:>13.1f} {row[2]:>12.2f} {row[3]:>12.1f} {row[4]:>11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
