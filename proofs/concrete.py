"""Concrete states and runs for replaying counterexamples (SPEC.md 8.1).

A Z3 model is a handful of numbers; :func:`build_state` turns a per-tenant
description of them into a consistent :class:`~tenantry.model.state.State`
(queues, running sequences holding the blocks their computed tokens need,
tenant books and pool that balance), so that one call of the model's
``step`` replays the counterexample's transition.  :func:`run_workload`
drives a whole workload step by step, as ``simulate`` does, and keeps every
transition for the checks.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import attrs

from tenantry.model.config import Config
from tenantry.model.state import KVPool, Sequence, State, TenantState, initial_state
from tenantry.model.step import Step, StepOutput, idle, step
from tenantry.model.workload import Request, StepInput, Workload
from tenantry.runner.simulate import Transition, run_steps


@attrs.frozen
class SeqSpec:
    """One sequence of a concrete state.

    Attributes:
        prompt, output: the request's prompt and output tokens.
        done: output tokens already produced.
        running: in the batch (decode: ``computed = prompt + done - 1``, so its
            next step produces a token) or waiting in its tenant's queue.
        computed: override of the computed tokens of a running sequence.
        preemptions, ready_step: eviction history (a waiting sequence with
            ``preemptions > 0`` counts as scheduled before).
        arrival_s: the request's arrival time (seconds).
        prefix_ids: cacheable block contents (prefix cache tests).
    """

    prompt: int
    output: int
    done: int = 0
    running: bool = False
    computed: int | None = None
    preemptions: int = 0
    ready_step: int = 0
    arrival_s: float = 0.0
    prefix_ids: tuple[int, ...] = ()


@attrs.frozen
class TenantSpec:
    """One tenant of a concrete state: its accounting and its sequences, in
    admission order (queued ones keep this order in the queue); ``skips`` the skip
    budget's count (SPEC.md 4.3)."""

    counter: float = 0.0
    deficit: float = 0.0
    service: float = 0.0
    block_seconds: float = 0.0
    bucket_tokens: float | None = None
    seqs: tuple[SeqSpec, ...] = ()
    skips: int = 0


def build_state(config: Config, tenants: Iterable[TenantSpec], *, step_index: int = 0, t_s: float = 0.0,
                last_step_s: float | None = None, tier_counters: tuple[float, ...] | None = None,
                last_left_counter: float = 0.0, last_left_tier_counter: float = 0.0,
                first_request_id: int = 0, last_left_skips: int = 0, tier_skips: tuple[int, ...] = ()) -> State:
    """A consistent state with the given per-tenant records.

    Sequences get request ids and admission numbers in the order given
    (tenant by tenant); running ones enter the batch in that order.  Prefix
    caching is not modelled here (no shared keys): every block is private.

    Raises:
        ValueError: if the number of tenant specs differs from the config's, or a
            sequence's numbers are impossible (done > output, computed beyond target).
    """
    specs = list(tenants)
    if len(specs) != len(config.tenants):
        raise ValueError(f"build_state: {len(specs)} tenant specs for {len(config.tenants)} configured tenants")
    base = initial_state(config)
    rid = first_request_id
    seq_no = 0
    running: list[Sequence] = []
    records: list[TenantState] = []
    used = 0
    for i, (tc, sp) in enumerate(zip(config.tenants, specs)):
        queue: list[Sequence] = []
        blocks = nrun = fresh = 0
        for q in sp.seqs:
            if not 0 <= q.done < q.output:
                raise ValueError(f"build_state: tenant {tc.name} sequence done={q.done} not in [0, output={q.output})")
            r = Request(rid, tc.name, q.arrival_s, q.prompt, q.output, prefix_ids=q.prefix_ids)
            rid += 1
            if q.running:
                computed = q.prompt + q.done - 1 if q.computed is None else q.computed
                if not 0 <= computed < q.prompt + q.done + 1:
                    raise ValueError(f"build_state: computed={computed} outside [0, target] for request {r.request_id}")
                nb = config.blocks_for(computed)
                s = Sequence(r, i, seq_no, step_index, computed_tokens=computed, output_done=q.done,
                             private_blocks=nb, preemptions=q.preemptions, ready_step=q.ready_step,
                             charged_prompt_tokens=q.prompt if config.admission.token_bucket else 0,
                             first_scheduled_s=t_s, first_token_s=t_s if q.done else None)
                running.append(s)
                blocks += nb
                used += nb
                nrun += 1
            else:
                scheduled = q.preemptions > 0 or q.done > 0
                s = Sequence(r, i, seq_no, step_index, output_done=q.done, preemptions=q.preemptions,
                             ready_step=q.ready_step, first_scheduled_s=t_s if scheduled else None,
                             charged_prompt_tokens=q.prompt if config.admission.token_bucket else 0)
                queue.append(s)
                fresh += 0 if scheduled else 1
            seq_no += 1
        bucket = float(tc.token_burst_tokens or 0.0) if sp.bucket_tokens is None else float(sp.bucket_tokens)
        records.append(TenantState(queue=tuple(queue), counter=float(sp.counter), deficit=float(sp.deficit),
                                   service=float(sp.service), block_seconds=float(sp.block_seconds),
                                   bucket_tokens=bucket, bucket_requests=base.tenants[i].bucket_requests,
                                   bucket_t_s=t_s, running=nrun, blocks=blocks, fresh_queued=fresh, skips=sp.skips))
    if used > config.num_blocks:
        raise ValueError(f"build_state: running sequences need {used} blocks, the pool has {config.num_blocks}")
    tiers = base.tier_counters if tier_counters is None else tuple(float(x) for x in tier_counters)
    return State(step_index=step_index, t_s=t_s, last_step_s=base.last_step_s if last_step_s is None else last_step_s,
                 tenants=tuple(records), running=tuple(running), kv=KVPool(used_blocks=used),
                 next_arrival_seq=seq_no, tier_counters=tiers, last_left_counter=float(last_left_counter),
                 last_left_tier_counter=float(last_left_tier_counter), last_left_skips=last_left_skips,
                 tier_skips=tuple(tier_skips))


def run_workload(config: Config, workload: Workload | Iterable[Request], *, max_steps: int = 1000,
                 state: State | None = None, variant: type[Step] | None = None) -> Iterator[Transition]:
    """Drive ``workload`` through the model step by step from ``state`` (default: the
    empty replica), with the model's one driver loop
    (:func:`tenantry.runner.simulate.run_steps`); at most ``max_steps`` steps.
    ``variant``: a :class:`~tenantry.model.step.Step` subclass (a mutant of
    ``testing/mutants.py``) for a twin whose mechanism no configuration removes."""
    return run_steps(config, workload, max_steps=max_steps, state=state, variant=variant)
