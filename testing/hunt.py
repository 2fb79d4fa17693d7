"""Hunt a mutant: search for a workload on which its killing invariant fails,
then shrink the workload by deleting requests (SPEC.md 7.7).

:func:`hunt` uses Hypothesis only to generate (``find`` without its shrink
phase, derandomised so a run is reproducible), then a greedy one-at-a-time
deletion of requests (Zeller's ddmin with granularity one) down to a
workload where every remaining request is needed; that is much cheaper here
than Hypothesis's byte-level shrinker, since each candidate replays a whole run.
"""

from __future__ import annotations

from typing import Callable

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from tenantry.spec.invariants import check_pair, relabel_contents
from tenantry.spec.invariants_run import run_checked
from .strategies import workloads
from .mutants import Mutant, applied

Workload = tuple[tuple, tuple]


@attrs.frozen
class Kill:
    """A mutant caught: by which invariant, on how small a workload.

    Attributes:
        mutant, killer: names.
        requests: the shrunk workload's requests; cancellations: its cancellations.
        steps: steps the shrunk workload runs; examples: workloads generated until the first catch.
    """

    mutant: str
    killer: str
    requests: tuple
    cancellations: tuple
    steps: int
    examples: int

    def line(self) -> str:
        return (f"{self.mutant:26s} killed by {self.killer:18s} shrunk to {len(self.requests):2d} requests, "
                f"{self.steps:3d} steps (found after {self.examples} examples)")


def caught_by(mutant: Mutant, killer: str, wl: Workload, max_steps: int = 300,
              history_only: bool = False) -> tuple[bool, int]:
    """Whether ``killer`` finds a violation when ``mutant`` runs ``wl``; and the run's step count.

    ``history_only`` judges the recorded history alone (the path used for
    schedulers tenantry did not write)."""
    reqs, canc = wl
    cfg = mutant.config
    with applied(mutant):
        if killer in ("DETERMINISM", "NONINTERFERENCE"):
            a = run_checked(cfg, reqs, cancellations=canc, max_steps=max_steps, ids=()).history
            other = reqs if killer == "DETERMINISM" else relabel_contents(reqs, "b", 1 << 20)
            b = run_checked(cfg, other, cancellations=canc, max_steps=max_steps, ids=()).history
            kw = {} if killer == "DETERMINISM" else {"observer": "a"}
            return bool(check_pair(killer, a, b, **kw)), len(a.steps)
        r = run_checked(cfg, reqs, cancellations=canc, max_steps=max_steps, ids=(killer,),
                        state_checks=not history_only)
        return any(f.invariant == killer for f in r.findings), len(r.history.steps)


def shrink(wl: Workload, pred: Callable[[Workload], bool]) -> Workload:
    """Delete requests one at a time while ``pred`` still holds (a 1-minimal workload)."""
    reqs, canc = wl
    i = 0
    while i < len(reqs):
        rid = reqs[i].request_id
        cand = (reqs[:i] + reqs[i + 1:], tuple(c for c in canc if c[1] != rid))
        if cand[0] and pred(cand):
            reqs, canc = cand
        else:
            i += 1
    return reqs, canc


def hunt(mutant: Mutant, killer: str, max_examples: int = 400, history_only: bool = False) -> Kill | None:
    """Search (then shrink) a workload on which ``killer`` catches ``mutant``; None if it survives."""
    tried = [0]

    def pred(wl: Workload) -> bool:
        tried[0] += 1
        return caught_by(mutant, killer, wl, history_only=history_only)[0]

    try:
        wl = find(workloads(mutant.config, **mutant.shape), pred,
                  settings=settings(max_examples=max_examples, database=None, deadline=None, derandomize=True,
                                    phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    except NoSuchExample:
        return None
    examples = tried[0]
    small = shrink(wl, pred)
    return Kill(mutant.name, killer, small[0], small[1], caught_by(mutant, killer, small)[1], examples)
