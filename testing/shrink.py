"""Shrinking: reduce a worst workload to a small one that still hurts.

:func:`shrink` keeps the victims as they are and reduces the adversary's
part, keeping the objective at or above ``threshold``:

1. **requests**: ddmin (Zeller and Hildebrandt, "Simplifying and Isolating
   Failure-Inducing Input", IEEE TSE 28(2), 2002) over the adversary's
   requests: try each of n chunks alone, then each complement; keep the first
   that passes; otherwise double n, until chunks are single requests;
2. **parameters**: halve each remaining request's output tokens, then its
   prompt tokens (never below 1 and 16), over chunks of requests from all of
   them down to one, keeping every reduction that passes, until nothing
   changes.

Every round's candidates are evaluated as one batch through the executor and
the first passing one (in a fixed order) is taken, so the result does not
depend on the number of workers.  For the prefix probe, the control twin is
reduced with the same request slots.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Callable, Sequence

import attrs
from tqdm import tqdm

from tenantry.model.workload import Request, Workload, renumber

from tenantry.adversaries.evaluate import Evaluation, Task, evaluate_batch
from tenantry.adversaries.patterns import Scenario

MIN_PROMPT, MIN_OUTPUT = 16, 1


@attrs.frozen
class ShrinkResult:
    """A reduced scenario.

    Attributes:
        scenario: the smallest passing scenario found.
        evaluation: its evaluation (score >= threshold).
        original_requests, requests: adversary requests before and after.
        evaluations: evaluations spent.
        threshold: the objective level kept.
        log: (phase, adversary requests, adversary tokens, score) after each accepted reduction.
    """

    scenario: Scenario
    evaluation: Evaluation
    original_requests: int
    requests: int
    evaluations: int
    threshold: float
    log: tuple[tuple[str, int, int, float], ...] = ()


def _split(scenario: Scenario) -> tuple[list[Request], list[Request], list[Request] | None]:
    adv = set(scenario.adversaries)
    victims = [r for r in scenario.workload if r.tenant not in adv]
    mine = [r for r in scenario.workload if r.tenant in adv]
    twin = [r for r in scenario.twin.workload if r.tenant in adv] if scenario.twin is not None else None
    return victims, mine, twin


def _build(scenario: Scenario, victims: list[Request], mine: Sequence[Request], twin: Sequence[Request] | None) -> Scenario:
    wl = Workload(renumber(victims + list(mine)))
    tw = None
    if scenario.twin is not None and twin is not None:
        tw = scenario.twin.with_workload(Workload(renumber(victims + list(twin))))
    return scenario.with_workload(wl, tw)


def shrink(setup: str, scenario: Scenario, threshold: float, *, executor: cf.Executor, max_evaluations: int = 60,
           objective: str | None = None, progress: bool = False) -> ShrinkResult | None:
    """Reduce ``scenario``'s adversary requests and sizes while the objective stays >= ``threshold``.

    Returns None when the scenario itself does not reach ``threshold``.
    """
    victims, mine, twin = _split(scenario)
    spent = 0
    bar = tqdm(total=max_evaluations, desc=f"shrink     {setup}/{scenario.pattern}", disable=not progress, leave=False)

    def test(cands: list[tuple[list[Request], list[Request] | None]]) -> int | None:
        """Index of the first candidate that passes (evaluated as one batch), or None."""
        nonlocal spent
        cands = cands[: max(0, max_evaluations - spent)]
        if not cands:
            return None
        tasks = [Task(setup, scenario.pattern, (), scenario.seed, objective, _build(scenario, victims, m, t))
                 for m, t in cands]
        evs = evaluate_batch(executor, tasks)
        spent += len(evs)
        bar.update(len(evs))
        for i, ev in enumerate(evs):
            if ev.score >= threshold:
                last[0] = ev
                return i
        return None

    last: list[Evaluation | None] = [None]
    if test([(mine, twin)]) is None:
        bar.close()
        return None
    log: list[tuple[str, int, int, float]] = []
    mine, twin = _ddmin(mine, twin, test, log, lambda: spent >= max_evaluations, last)
    mine, twin = _halve(mine, twin, test, log, lambda: spent >= max_evaluations, last)
    bar.close()
    sc = _build(scenario, victims, mine, twin)
    n0 = len(_split(scenario)[1])
    return ShrinkResult(sc, last[0], n0, len(mine), spent, threshold, tuple(log))


def _tokens(rs: Sequence[Request]) -> int:
    return sum(r.prompt_tokens + r.output_tokens for r in rs)


def _ddmin(mine, twin, test: Callable, log: list, done: Callable[[], bool], last):
    idx = list(range(len(mine)))
    n = 2
    pick = lambda ix: ([mine[i] for i in ix], None if twin is None else [twin[i] for i in ix])
    while len(idx) >= 2 and not done():
        size = -(-len(idx) // n)
        chunks = [idx[k:k + size] for k in range(0, len(idx), size)]
        subsets = chunks + ([[i for i in idx if i not in set(c)] for c in chunks] if len(chunks) > 2 else [])
        hit = test([pick(c) for c in subsets])
        if hit is not None:
            idx = subsets[hit]
            n = 2 if hit < len(chunks) else max(n - 1, 2)
            m, _ = pick(idx)
            log.append(("requests", len(idx), _tokens(m), last[0].score))
        elif n >= len(idx):
            break
        else:
            n = min(len(idx), 2 * n)
    return pick(idx)


def _halve(mine, twin, test: Callable, log: list, done: Callable[[], bool], last):
    mine, twin = list(mine), None if twin is None else list(twin)
    for field, low in (("output_tokens", MIN_OUTPUT), ("prompt_tokens", MIN_PROMPT)):
        changed = True
        while changed and not done():
            changed = False
            todo = [i for i, r in enumerate(mine) if getattr(r, field) > low]
            size = len(todo)
            while size >= 1 and todo and not done():
                chunks = [todo[k:k + size] for k in range(0, len(todo), size)]
                cands = []
                for c in chunks:
                    m2, t2 = list(mine), None if twin is None else list(twin)
                    for i in c:
                        m2[i] = _halved(m2[i], field, low)
                        if t2 is not None:
                            t2[i] = _halved(t2[i], field, low)
                    cands.append((m2, t2))
                hit = test(cands)
                if hit is not None:
                    mine, twin = cands[hit]
                    log.append((field, len(mine), _tokens(mine), last[0].score))
                    changed = True
                    break
                size //= 2
    return mine, twin


def _halved(r: Request, field: str, low: int) -> Request:
    v = max(low, getattr(r, field) // 2)
    kw = {field: v}
    if field == "output_tokens" and r.predicted_output_tokens is not None:
        kw["predicted_output_tokens"] = min(r.predicted_output_tokens, v)
    if field == "prompt_tokens":
        kw["prefix_ids"] = r.prefix_ids[: v // 16]
        if r.prompt_bytes is not None:
            kw["prompt_bytes"] = max(0, r.prompt_bytes * v // max(r.prompt_tokens, 1))
    return attrs.evolve(r, **kw)
