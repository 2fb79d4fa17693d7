"""The one shrinker: reduce a workload to a small one on which a test still fails.

Every search that finds something (an adversary that hurts, a scheduler that
breaks an invariant, a mutant caught) hands its workload here with a test; the
result is a small workload that still fails the same test, ready to be written
as a replay file.  Phases, each keeping only candidates that still fail:

1. ``cut``: drop every request arriving after ``cut_after_s`` (when given:
   what arrives after the failure cannot have caused it);
2. ``requests``: ddmin over the requests that may go (Zeller and Hildebrandt,
   "Simplifying and Isolating Failure-Inducing Input", IEEE TSE 28(2), 2002):
   try each of n chunks alone, then each complement; keep the first that
   fails; otherwise double n, until chunks are single requests;
3. ``cancellations``: forget cancellations (``cancel_s``), chunk by chunk;
4. ``together``: move every movable arrival to the earliest arrival time;
5. ``output_tokens``, ``prompt_tokens``: halve them over chunks of requests,
   from all at once down to one, keeping every reduction that fails; a
   shorter prompt keeps only the prefix content ids of its whole blocks
   (``block_size_tokens``) and a proportional ``prompt_bytes``, and a shorter
   output caps ``predicted_output_tokens``;

and again from phase 2 while anything changed and evaluations remain.
Cancellations are part of each request (``cancel_s``), so removing a request
removes its cancellation and nothing dangles.  Request ids are kept (callers
renumber if they want), so a caller can map a shrunk request back to its
origin (the prefix probe's control twin does).

A test sees a batch of candidates and returns the index of the first that
still fails (or None): a caller may evaluate the batch in parallel, and the
result does not depend on how, because the first failing one in a fixed
order is always taken.  :func:`first_failing` turns a one-workload predicate
into such a test.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import attrs
from tqdm import tqdm

from tenantry.model.workload import Request, Workload

#: A batch test: candidates -> index of the first one that still fails, or None.
BatchTest = Callable[[Sequence[Workload]], "int | None"]

PHASES = ("cut", "requests", "cancellations", "together", "output_tokens", "prompt_tokens")


@attrs.frozen
class ShrinkResult:
    """A reduced workload.

    Attributes:
        workload: the smallest failing workload found (the input itself if nothing smaller fails).
        original_requests, requests: requests before and after.
        evaluations: candidates the test saw.
        log: (phase, requests, tokens) after each accepted reduction.
    """

    workload: Workload
    original_requests: int
    requests: int
    evaluations: int
    log: tuple[tuple[str, int, int], ...] = ()


def first_failing(fails: Callable[[Workload], bool]) -> BatchTest:
    """A batch test from a predicate: tries the candidates in order, stops at the first that fails."""
    def test(cands: Sequence[Workload]) -> int | None:
        return next((i for i, c in enumerate(cands) if fails(c)), None)

    test.sequential = True  # evaluations counted up to the hit only
    return test


def tokens(requests: Iterable[Request]) -> int:
    """Prompt plus output tokens of ``requests``."""
    return sum(r.prompt_tokens + r.output_tokens for r in requests)


class _Shrinker:
    def __init__(self, test: BatchTest, fixed: Callable[[Request], bool], block_size_tokens: int | None,
                 min_prompt_tokens: int, max_evaluations: int, bar) -> None:
        self.test, self.fixed, self.block = test, fixed, block_size_tokens
        self.min_prompt = max(1, min_prompt_tokens)
        self.left, self.spent, self.bar = max_evaluations, 0, bar
        self.log: list[tuple[str, int, int]] = []

    def first(self, cands: list[list[Request]]) -> int | None:
        cands = cands[: self.left]
        if not cands:
            return None
        hit = self.test([Workload(tuple(c)) for c in cands])
        # A sequential test (first_failing) stops at the hit; a batch test evaluated them all.
        n = hit + 1 if hit is not None and getattr(self.test, "sequential", False) else len(cands)
        self.left -= n
        self.spent += n
        self.bar.update(n)
        return hit

    def accept(self, phase: str, reqs: list[Request]) -> list[Request]:
        self.log.append((phase, len(reqs), tokens(reqs)))
        return reqs

    def ddmin(self, reqs: list[Request]) -> list[Request]:
        keep = [r for r in reqs if self.fixed(r)]
        idx = [i for i, r in enumerate(reqs) if not self.fixed(r)]
        pick = lambda ix: sorted(keep + [reqs[i] for i in ix], key=lambda r: (r.arrival_s, r.request_id))
        n = 2
        while len(idx) >= 2 and self.left > 0:
            size = -(-len(idx) // n)
            chunks = [idx[k:k + size] for k in range(0, len(idx), size)]
            subsets = chunks + ([[i for i in idx if i not in set(c)] for c in chunks] if len(chunks) > 2 else [])
            hit = self.first([pick(c) for c in subsets])
            if hit is not None:
                idx = subsets[hit]
                n = 2 if hit < len(chunks) else max(n - 1, 2)
                self.accept("requests", pick(idx))
            elif n >= len(idx):
                break
            else:
                n = min(len(idx), 2 * n)
        return pick(idx)

    def halve(self, reqs: list[Request], phase: str, change: Callable[[Request], Request | None]) -> list[Request]:
        """Apply ``change`` to chunks of requests (all, halves, ... single ones) while the result still fails."""
        changed = True
        while changed and self.left > 0:
            changed = False
            todo = [i for i, r in enumerate(reqs) if not self.fixed(r) and change(r) is not None]
            size = len(todo)
            while size >= 1 and todo and self.left > 0:
                chunks = [todo[k:k + size] for k in range(0, len(todo), size)]
                cands = []
                for c in chunks:
                    cand = list(reqs)
                    for i in c:
                        cand[i] = change(cand[i])
                    cands.append(cand)
                hit = self.first(cands)
                if hit is not None:
                    reqs = self.accept(phase, cands[hit])
                    changed = True
                    break
                size //= 2
        return reqs

    def halved(self, r: Request, field: str) -> Request | None:
        low = self.min_prompt if field == "prompt_tokens" else 1
        v = max(low, getattr(r, field) // 2)
        if v >= getattr(r, field):
            return None
        kw: dict = {field: v}
        if field == "output_tokens" and r.predicted_output_tokens is not None:
            kw["predicted_output_tokens"] = min(r.predicted_output_tokens, v)
        if field == "prompt_tokens":
            whole = v // self.block if self.block else v
            kw["prefix_ids"] = r.prefix_ids[:whole]
            if r.prompt_bytes is not None:
                kw["prompt_bytes"] = max(0, r.prompt_bytes * v // max(r.prompt_tokens, 1))
        return attrs.evolve(r, **kw)


def shrink(workload: Workload, test: BatchTest, *, fixed: Callable[[Request], bool] = lambda r: False,
           block_size_tokens: int | None = None, cut_after_s: float | None = None,
           phases: Sequence[str] = PHASES, min_prompt_tokens: int = 1, max_evaluations: int = 150,
           progress: str | None = None) -> ShrinkResult:
    """Reduce ``workload`` while ``test`` still fails (see the module docstring).

    Args:
        test: a batch test (:data:`BatchTest`); use :func:`first_failing` for a predicate.
            The workload itself is assumed to fail; it is not re-tested.
        fixed: requests that must stay as they are (e.g. the victims of an adversary scenario).
        block_size_tokens: KV block size of the configuration the workload runs on
            (trims prefix content ids when a prompt is halved); None: trim to the prompt length.
        cut_after_s: drop requests arriving after this time first (seconds).
        phases: the phases to run, a subset of :data:`PHASES`.
        min_prompt_tokens: prompts are never halved below this.
        max_evaluations: most candidates the test sees.
        progress: a tqdm description to show progress under, or None.

    Returns:
        A :class:`ShrinkResult` whose workload fails ``test`` (or is the input).

    Raises:
        ValueError: on an unknown phase name.
    """
    bad = [p for p in phases if p not in PHASES]
    if bad:
        raise ValueError(f"unknown shrink phase {bad[0]!r}; choose from {', '.join(PHASES)}")
    bar = tqdm(total=max_evaluations, desc=progress or "shrink", disable=progress is None, leave=False)
    s = _Shrinker(test, fixed, block_size_tokens, min_prompt_tokens, max_evaluations, bar)
    reqs = list(workload.requests)
    n0 = len(reqs)
    if "cut" in phases and cut_after_s is not None:
        cut = [r for r in reqs if r.arrival_s <= cut_after_s or s.fixed(r)]
        if len(cut) < len(reqs) and s.first([cut]) == 0:
            reqs = s.accept("cut", cut)
    while s.left > 0:
        before = reqs
        if "requests" in phases:
            reqs = s.ddmin(reqs)
        if "cancellations" in phases:
            reqs = s.halve(reqs, "cancellations", lambda r: attrs.evolve(r, cancel_s=None) if r.cancel_s is not None else None)
        if "together" in phases and reqs:
            t0 = min(r.arrival_s for r in reqs)
            moved = [r if s.fixed(r) or r.arrival_s == t0 else attrs.evolve(r, arrival_s=t0) for r in reqs]
            if moved != reqs and s.first([moved]) == 0:
                reqs = s.accept("together", moved)
        for field in ("output_tokens", "prompt_tokens"):
            if field in phases:
                reqs = s.halve(reqs, field, lambda r, f=field: s.halved(r, f))
        if reqs == before:
            break
    bar.close()
    return ShrinkResult(Workload(tuple(reqs)), n0, len(reqs), s.spent, tuple(s.log))
