"""Events of a history whose steps carry none (format 1, or a scheduler's logs), derived
from its request records and step lists: what :class:`~tenantry.spec.replay.Replay` walks
when the steps do not say what happened in them (SPEC.md 6)."""

from __future__ import annotations

from tenantry.runner.history import History, StepEvent


def derive_events(history: History) -> dict[int, tuple[StepEvent, ...]]:
    """Events of a history whose steps carry none (format 1, or a scheduler's logs),
    derived from its request records and step lists, in the canonical order:
    a cancellation at the step starting at its ``finish_s``; an admission at its
    ``admitted_step``; a refusal at admission at the first step starting at or
    after its arrival; another rejection at the step starting at its
    ``finish_s``; evictions from ``preempted``; an entry into the batch for each
    batch entry of a request not running before (with its recorded cache hits
    on its first entry).  Request-level events only as precise as the records:
    the replay marks computed tokens inexact when cache hits cannot be placed.
    """
    starts = [s.start_s for s in history.steps]
    by_start = {s.start_s: s.step_index for s in history.steps}
    at: dict[int, dict[str, list[StepEvent]]] = {}

    def add(k: int | None, group: str, e: StepEvent) -> None:
        if k is not None:
            at.setdefault(k, {}).setdefault(group, []).append(e)

    for r in sorted(history.requests, key=lambda r: (r.arrival_s, r.request_id)):
        if r.outcome == "cancelled":
            add(by_start.get(r.finish_s), "cancelled", StepEvent("cancelled", r.request_id))
        if r.admitted_step is not None:
            add(r.admitted_step, "answers", StepEvent("queued", r.request_id))
        elif r.outcome == "rejected":
            i = next((j for j, t in enumerate(starts) if t >= r.arrival_s - 1e-9), None)
            add(None if i is None else history.steps[i].step_index, "answers",
                StepEvent("rejected", r.request_id, r.reason, r.retry_after_s))
        if r.outcome == "rejected" and r.admitted_step is not None:
            add(by_start.get(r.finish_s), "rejected", StepEvent("rejected", r.request_id, r.reason, r.retry_after_s))
    recs = {r.request_id: r for r in history.requests}
    running: set[int] = set()
    entered: set[int] = set()
    for s in history.steps:
        k = s.step_index
        for rid in s.preempted:
            add(k, "preempted", StepEvent("preempted", rid))
        running -= set(s.preempted)
        for rid, _ in s.batch:
            if rid not in running and rid in recs:
                r = recs[rid]
                hit = r.cached_prompt_tokens if rid not in entered and not r.preemptions else 0
                add(k, "scheduled", StepEvent("scheduled", rid, tokens=hit))
                entered.add(rid)
        running = set(s.running)
    order = ("cancelled", "answers", "preempted", "rejected", "scheduled")
    return {k: tuple(e for g in order for e in groups.get(g, ())) for k, groups in at.items()}
