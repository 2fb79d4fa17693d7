"""Hunt a mutant: search for a workload on which its killing invariant fails,
then shrink it with the one shrinker (SPEC.md 7.7).

:func:`hunt` uses Hypothesis only to generate (``find`` without its shrink
phase, derandomised so a run is reproducible), then
:func:`tenantry.testing.shrink.shrink` reduces the workload; that is much
cheaper here than Hypothesis's byte-level shrinker, since each candidate
replays a whole run.  A :class:`Kill` says which invariant caught the mutant,
in which form (state, history or pair), on how small a workload.

A hunt is a function of its arguments alone: Hypothesis (6.13x and later) also
draws literal constants found in the source of every local module the process
has loaded, cached on first use, so the same derandomised search drew other
workloads after other imports (``skip_budget_ignored_block_seconds`` was killed
by DRR-DEFICIT after 211 workloads in a fresh process and survived 1,000 after
``tenantry.cli.build_parser()``).  :func:`hunt` switches that pool off while it
generates (:func:`~tenantry.testing.strategies.without_local_constants`).
"""

from __future__ import annotations

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from tenantry.model.workload import Workload
from tenantry.runner.simulate import run_steps
from tenantry.spec.invariants import check_pair, check_state, relabel_contents
from tenantry.spec.invariants_run import run_checked

from .mutants import Mutant
from .shrink import first_failing, shrink
from .strategies import without_local_constants, workloads

#: Forms a killer can catch a mutant in (``state`` runs the state and history forms,
#: ``step`` the state forms alone, ``history`` the history form alone).
FORMS = ("state", "step", "history", "pair")


@attrs.frozen
class Kill:
    """A mutant caught: by which invariant and form, on how small a workload.

    Attributes:
        mutant, killer: names; form: ``state`` (state forms after every step,
            then the history form), ``step`` (the state form alone),
            ``history`` (the history form alone) or ``pair`` (a two-run form).
        workload: the shrunk workload (cancellations included).
        steps: steps the shrunk workload runs; examples: workloads generated until the first catch.
    """

    mutant: str
    killer: str
    form: str
    workload: Workload
    steps: int
    examples: int

    def line(self) -> str:
        """One line of the kill report."""
        n = len(self.workload)
        return (f"{self.mutant:26s} killed by {self.killer:18s} ({self.form:7s}) shrunk to {n:2d} requests, "
                f"{self.steps:3d} steps (found after {self.examples} examples)")


def form_of(mutant: Mutant, killer: str, history_only: bool = False, state_only: bool = False) -> str:
    """The form in which ``killer`` judges ``mutant``'s runs."""
    if killer in ("DETERMINISM", "NONINTERFERENCE"):
        return "pair"
    return "history" if history_only else "step" if state_only else "state"


def caught_by(mutant: Mutant, killer: str, wl: Workload, max_steps: int = 300,
              history_only: bool = False, state_only: bool = False) -> tuple[bool, int]:
    """Whether ``killer`` finds a violation when ``mutant`` runs ``wl``; and the run's step count.

    ``history_only`` judges the recorded history alone (the path used for
    schedulers tenantry did not write); ``state_only`` the state form alone,
    after every step (form ``step``)."""
    cfg, v = mutant.config, mutant.variant
    if state_only:
        n, hit = 0, False
        for tr in run_steps(cfg, wl, max_steps=max_steps, variant=v):
            n += 1
            hit = hit or any(f.invariant == killer for f in check_state(cfg, tr.prev, tr.state, tr.output, tr.inputs,
                                                                      (killer,)))
        return hit, n
    if form_of(mutant, killer) == "pair":
        a = run_checked(cfg, wl, max_steps=max_steps, ids=(), variant=v).history
        other = wl if killer == "DETERMINISM" else relabel_contents(wl, "b", 1 << 20)
        b = run_checked(cfg, other, max_steps=max_steps, ids=(), variant=v).history
        kw = {} if killer == "DETERMINISM" else {"observer": "a"}
        return bool(check_pair(killer, a, b, **kw)), len(a.steps)
    r = run_checked(cfg, wl, max_steps=max_steps, ids=(killer,), variant=v,
                    depth="history" if history_only else "state")
    return any(f.invariant == killer for f in r.findings), len(r.history.steps)


def hunt(mutant: Mutant, killer: str, max_examples: int | None = None, history_only: bool = False,
         state_only: bool = False) -> Kill | None:
    """Search (then shrink) a workload on which ``killer`` catches ``mutant``; None if it
    survives.  ``max_examples``: workloads drawn (None: the mutant's ``examples``);
    ``history_only`` / ``state_only``: that form alone (see :func:`caught_by`)."""
    if max_examples is None:
        max_examples = mutant.examples
    tried = [0]
    only = {"history_only": history_only, "state_only": state_only}

    def pred(wl: Workload) -> bool:
        tried[0] += 1
        return caught_by(mutant, killer, wl, **only)[0]

    try:
        with without_local_constants():
            wl = find(workloads(mutant.config, **mutant.shape), pred,
                      settings=settings(max_examples=max_examples, database=None, deadline=None, derandomize=True,
                                        phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    except NoSuchExample:
        return None
    examples = tried[0]
    small = shrink(wl, first_failing(lambda w: caught_by(mutant, killer, w, **only)[0]),
                   block_size_tokens=mutant.config.block_size_tokens,
                   phases=("requests", "cancellations", "output_tokens", "prompt_tokens"), max_evaluations=200).workload
    return Kill(mutant.name, killer, form_of(mutant, killer, history_only, state_only), small,
                caught_by(mutant, killer, small, **only)[1], examples)
