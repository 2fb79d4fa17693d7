"""One evaluation: build a scenario, run it on a system, score it; and the
executors that run many evaluations.

A *system* is what an adversary is put against: a setup of the reference model
(:class:`ModelSystem`, by name; a fleet setup's :class:`FleetSystem`) or a scheduler under test behind its adapter
(:class:`tenantry.verify.system.TargetSystem`).  Both give the same three things
(:class:`System`): the configuration a scenario runs under, a checked run
(history, findings, what was left unchecked) and a plain run, so every search,
shrink and report of ``tenantry check`` serves ``tenantry verify --target``
unchanged.  A system is a picklable value: a worker process rebuilds what it
needs (a target's factory is imported in the worker).

:func:`evaluate` is a top-level function of one picklable :class:`Task`, so
it runs unchanged in any ``concurrent.futures`` executor: a process pool here,
or a Ray instance or cluster (:class:`RayExecutor`; :func:`make_executor` makes
either).  :func:`evaluate_batch` submits a batch
and returns results in task order, so a search that evaluates fixed batches
and reduces them in order gets the same answer with any number of workers.

Each evaluation simulates the scenario with the adversary, checks the setup's
claimed invariants on that run (:func:`tenantry.spec.invariants_run.run_checked`), and
compares with the baseline run of the same victims without the adversary
(cached per process: it depends only on the setup, the victims and the horizon).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping, Sequence

import attrs

from typing import Protocol, runtime_checkable

from tenantry.model.config import Config, ConfigError
from tenantry.model.workload import Workload, renumber
from tenantry.runner.fleet import simulate_fleet
from tenantry.runner.history import History
from tenantry.runner.setups import build_config, build_fleet, get_setup
from tenantry.runner.simulate import simulate
from tenantry.spec.invariants_core import Finding
from tenantry.spec.invariants_run import CheckedRun, run_checked, run_fleet_checked

from .objectives import TTFT_SLO_S, all_metrics
from .patterns import ADVERSARY, PATTERNS, Scenario, get_pattern, limits_of, make_scenario
from .space import freeze
from .victims import DEFAULT_VICTIMS


@runtime_checkable
class System(Protocol):
    """What an adversary is put against (see the module docstring).

    Attributes:
        name: its label in reports and progress bars (a setup name, a target).
    """

    name: str

    def config(self, roles: Iterable[tuple[str, str]]) -> Config:
        """The configuration a scenario with these (tenant, role) pairs runs under."""

    def checked(self, workload: Workload, horizon_s: float, depth: str,
                roles: Sequence[tuple[str, str]]) -> CheckedRun:
        """Run ``workload`` (tenants with these roles, in this order) and check what the
        system claims, at ``depth`` (:data:`~tenantry.spec.invariants_run.DEPTHS`; the
        adversaries observe for NONINTERFERENCE)."""

    def plain(self, workload: Workload, horizon_s: float, roles: Sequence[tuple[str, str]]) -> History:
        """Run ``workload`` with nothing checked (the baseline, the probe's control twin)."""


@attrs.frozen
class ModelSystem:
    """A built-in setup of the reference model (:data:`tenantry.runner.setups.SETUPS`),
    checked for the invariants it claims (``Setup.all_claims``)."""

    name: str

    def config(self, roles: Iterable[tuple[str, str]]) -> Config:
        return build_config(self.name, roles)

    def checked(self, workload: Workload, horizon_s: float, depth: str,
                roles: Sequence[tuple[str, str]]) -> CheckedRun:
        observers = tuple(t for t, r in roles if r == "adversary")
        return run_checked(self.config(roles), workload, ids=get_setup(self.name).all_claims, depth=depth,
                           horizon_s=horizon_s, max_steps=None, observers=observers)

    def plain(self, workload: Workload, horizon_s: float, roles: Sequence[tuple[str, str]]) -> History:
        return simulate(self.config(roles), workload, horizon_s=horizon_s)


@attrs.frozen
class FleetSystem:
    """A built-in fleet setup of the reference model (a setup with a ``fleet`` part,
    :func:`tenantry.runner.setups.build_fleet`): the fleet run by the one driver loop, each
    replica checked for the setup's claims (``Setup.all_claims``) and the fleet for every
    applicable fleet invariant (:func:`~tenantry.spec.invariants_run.run_fleet_checked`, the
    judge of ``tenantry verify --history`` on a fleet history).  Its :meth:`config` is one
    replica's (limits, costs and SLOs read from it; every replica has the same)."""

    name: str

    def config(self, roles: Iterable[tuple[str, str]]) -> Config:
        return build_config(self.name, roles)

    def checked(self, workload: Workload, horizon_s: float, depth: str,
                roles: Sequence[tuple[str, str]]) -> CheckedRun:
        return run_fleet_checked(build_fleet(self.name, roles), workload, ids=get_setup(self.name).all_claims,
                                 depth=depth, horizon_s=horizon_s, max_steps=None)

    def plain(self, workload: Workload, horizon_s: float, roles: Sequence[tuple[str, str]]) -> History:
        return simulate_fleet(build_fleet(self.name, roles), workload, horizon_s=horizon_s)


def system_of(setup: "str | System") -> System:
    """A system: a setup name becomes its :class:`ModelSystem` (a fleet setup its :class:`FleetSystem`).

    Raises:
        ConfigError: on an unknown setup name.
    """
    if isinstance(setup, str):
        return FleetSystem(setup) if get_setup(setup).fleet is not None else ModelSystem(setup)
    return setup


@attrs.frozen
class Task:
    """What to evaluate (picklable).

    Attributes:
        setup: a built-in setup name, or a :class:`System`.
        pattern: a pattern name.
        params: the pattern's parameters, frozen (see :func:`~tenantry.adversaries.space.freeze`).
        seed: the victims' seed.
        objective: metric to report as the score; None: the pattern's own.
        scenario: an explicit scenario (shrinking, replay) instead of
            generating one from pattern and params.
        victims: ``excerpt`` (packaged traces) or ``shared`` (../shared/traces).
        depth: how deep to check the setup's claimed invariants (one of
            :data:`~tenantry.spec.invariants_run.DEPTHS`), or None for no checks.
    """

    setup: "str | System"
    pattern: str
    params: tuple = ()
    seed: int = 0
    objective: str | None = None
    scenario: Scenario | None = None
    depth: str | None = "history"
    victims: str = "excerpt"


@attrs.frozen
class Evaluation:
    """The result of one :class:`Task`.

    Attributes:
        score: the objective's value (larger is worse for the victims).
        metrics: every metric (:data:`~tenantry.adversaries.objectives.OBJECTIVES`).
        findings: the claimed invariants that broke, as data (deduplicated).
        unchecked: claimed ids that could not be checked.
        coverage: every invariant id -> what was checked, or why not (SPEC.md 7).
    """

    score: float
    metrics: Mapping[str, float]
    findings: tuple[Finding, ...] = ()
    unchecked: tuple[str, ...] = ()
    coverage: Mapping[str, str] = attrs.field(factory=dict, eq=False)


_BASELINES: dict[tuple, History] = {}


def _baseline(system: System, scenario: Scenario) -> History:
    """The run without the adversary (memoised per process)."""
    adv = set(scenario.adversaries)
    victims = tuple(renumber(r for r in scenario.workload if r.tenant not in adv))
    key = (system, scenario.roles, scenario.horizon_s, victims)
    h = _BASELINES.get(key)
    if h is None:
        if len(_BASELINES) > 256:
            _BASELINES.clear()
        h = system.plain(Workload(victims), scenario.horizon_s, scenario.roles)
        _BASELINES[key] = h
    return h


def scenario_of(task: Task) -> Scenario:
    """The task's scenario (explicit, or generated from pattern, params and seed; a
    pattern that reads limits gets those of the configuration the system claims)."""
    if task.scenario is not None:
        return task.scenario
    limits = None
    if get_pattern(task.pattern).uses_limits:
        roles = ((ADVERSARY, "adversary"),) + tuple((v.name, "victim") for v in DEFAULT_VICTIMS)
        limits = limits_of(system_of(task.setup).config(roles), ADVERSARY)
    return make_scenario(task.pattern, dict(task.params), task.seed, victims=task.victims, limits=limits)


def cached_before(scenario: Scenario) -> dict[int, bool]:
    """For the prefix probe: slot i (i-th adversary request) -> a victim sent its guessed
    prefix (same first content id) strictly before the probe arrived."""
    adv = set(scenario.adversaries)
    first_seen: dict[int, float] = {}
    for r in scenario.workload:
        if r.tenant not in adv and r.prefix_ids:
            first_seen.setdefault(r.prefix_ids[0], r.arrival_s)
    probes = [r for r in scenario.workload if r.tenant in adv]
    return {i: bool(r.prefix_ids) and first_seen.get(r.prefix_ids[0], float("inf")) < r.arrival_s
            for i, r in enumerate(probes)}


def run_scenario(setup: "str | System", scenario: Scenario, depth: str | None = "history",
                 ) -> tuple[History, History, History | None, Evaluation]:
    """Run a scenario on a system: (history, baseline history, twin history or None, evaluation).

    ``depth``: how deep to check the system's claims (None: not at all).

    The evaluation's score is the pattern's objective (``replay`` scenarios:
    ``ttft_p99_inflation``).
    """
    system = system_of(setup)
    if depth is None:
        run = CheckedRun(system.plain(scenario.workload, scenario.horizon_s, scenario.roles), ())
    else:
        run = system.checked(scenario.workload, scenario.horizon_s, depth, scenario.roles)
    return scored(system, scenario, run)


def scored(setup: "str | System", scenario: Scenario, run: CheckedRun,
           ) -> tuple[History, History, History | None, Evaluation]:
    """A scenario's run (history and findings, however it was made) with its metrics: the
    baseline (the victims alone) and the probe's control twin are run here.  Returns what
    :func:`run_scenario` returns."""
    system = system_of(setup)
    cfg = system.config(scenario.roles)
    hist = run.history
    base = _baseline(system, scenario)
    twin = system.plain(scenario.twin.workload, scenario.horizon_s, scenario.roles) if scenario.twin is not None else None
    unit = max((cfg.order.w_in * r.prompt_tokens + cfg.order.w_out * r.output_tokens for r in scenario.workload), default=1.0)
    m = all_metrics(hist, base, adversaries=scenario.adversaries, victims=scenario.victims,
                    horizon_s=scenario.horizon_s, unit_cost=unit, twin=twin,
                    cached_before=cached_before(scenario) if twin is not None else None,
                    slos={t.name: (t.slo_ttft_s if t.slo_ttft_s is not None else TTFT_SLO_S, t.slo_tpot_s)
                          for t in cfg.tenants if t.name in set(scenario.victims)})
    objective = PATTERNS[scenario.pattern].objective if scenario.pattern in PATTERNS else "ttft_p99_inflation"
    ev = Evaluation(m[objective], m, run.findings, run.unchecked, run.coverage)
    return hist, base, twin, ev


def evaluate(task: Task) -> Evaluation:
    """Evaluate one task (top level and picklable: runs in any executor)."""
    sc = scenario_of(task)
    _, _, _, ev = run_scenario(task.setup, sc, task.depth)
    if task.objective is not None:
        ev = attrs.evolve(ev, score=ev.metrics[task.objective])
    return ev


class InlineExecutor(cf.Executor):
    """An executor that runs each call at submit time, in this process (workers=0)."""

    def submit(self, fn, /, *args, **kwargs):  # noqa: D102
        f: cf.Future = cf.Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as e:  # the future carries it, as a pool's would
            f.set_exception(e)
        return f


def _worker_init() -> None:
    """In each worker process: leave SIGINT to the parent (which stops the pool: no worker traceback on
    Ctrl-C), die on SIGTERM, and (Linux) be killed when the parent dies, so no worker outlives its run."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _ready() -> int:
    return os.getpid()


def make_executor(workers: int | None = None, kind: str = "process") -> cf.Executor:
    """The executor that runs a matrix's evaluations.

    Args:
        workers: processes (default: the CPU count); with ``process``, 0 or 1
            runs inline.  With ``ray`` (a local Ray instance started for the run)
            the CPUs it may use; with ``ray:ADDRESS`` ignored (the cluster's CPUs).
        kind: ``process`` (a process pool on this machine), ``ray`` (a local Ray
            instance) or ``ray:ADDRESS`` (an existing Ray cluster, e.g.
            ``ray:auto`` or ``ray:10.0.0.5:6379``; see :class:`RayExecutor`),
            ``dask`` (a local Dask cluster) or ``dask:ADDRESS`` (a running Dask
            scheduler, e.g. ``dask:tcp://10.0.0.5:8786``; see :class:`DaskExecutor`).

    The pool's workers are started at once, from the calling thread (the
    parent-death signal is tied to the thread that starts a process): call it
    from the main thread.

    Raises:
        ConfigError: on an unknown kind, or ``ray`` / ``dask`` when that library is not installed.
    """
    if kind == "ray" or kind.startswith("ray:"):
        return RayExecutor(address=kind[4:] or None, num_cpus=workers)
    if kind == "dask" or kind.startswith("dask:"):
        return DaskExecutor(address=kind[5:] or None, num_workers=workers)
    if kind != "process":
        raise ConfigError("--executor", kind, "unknown executor; choose process, ray, ray:ADDRESS, dask or dask:ADDRESS")
    n = (os.cpu_count() or 1) if workers is None else workers
    if n <= 1:
        return InlineExecutor()
    ex = cf.ProcessPoolExecutor(max_workers=n, initializer=_worker_init)
    try:
        ex.submit(_ready).result()
    except BaseException:  # Ctrl-C while the workers start: none may outlive this call
        terminate_executor(ex)
        raise
    return ex


def executor_slots(executor: cf.Executor) -> int | None:
    """How many evaluations ``executor`` runs at once (None: not known; a
    :class:`RayExecutor`: the cluster's CPUs), to size how many cells run at once."""
    return getattr(executor, "slots", None)


def _call(fn, args, kwargs):
    """Run ``fn(*args, **kwargs)`` (a Ray task's body)."""
    return fn(*args, **kwargs)


class _ClusterExecutor(cf.Executor):
    """What :class:`RayExecutor` and :class:`DaskExecutor` share: the cluster's tasks not
    finished yet, kept so that a shutdown (Ctrl-C) can cancel them."""

    def __init__(self) -> None:
        self._pending: set = set()
        self._lock = threading.Lock()

    def _track(self, task) -> None:
        with self._lock:
            self._pending.add(task)

    def _forget(self, task) -> None:
        with self._lock:
            self._pending.discard(task)

    def _take_pending(self) -> list:
        """The unfinished tasks, no longer tracked (a shutdown cancels them)."""
        with self._lock:
            out, self._pending = list(self._pending), set()
        return out


class RayExecutor(_ClusterExecutor):
    """Runs each call as a Ray task: on a local Ray instance it starts, or on an
    existing cluster.

    Results are the same values as a process pool's (each call is one pure
    :func:`evaluate` of a picklable :class:`Task`; results come back in task
    order through :func:`evaluate_batch`), so a matrix's ``matrix.json`` is the
    same bytes on either.  Every node of a cluster needs tenantry installed
    (the same version) and, for ``verify --target``, the target's module
    importable.

    Args:
        address: a cluster to join (``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``);
            None starts a local instance that :meth:`shutdown` stops.
        num_cpus: CPUs of the local instance (default: the CPU count).

    Raises:
        ConfigError: when Ray is not installed (``pip install 'tenantry[ray]'``).
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor", "ray" if address is None else f"ray:{address}",
                              "Ray is not installed: pip install 'tenantry[ray]'") from None
        self._ray = ray
        self._own = not ray.is_initialized()
        if self._own:
            opts = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
            if address is None:
                opts["num_cpus"] = num_cpus or os.cpu_count() or 1
            ray.init(address=address, **opts)
        self.slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._task = ray.remote(num_cpus=1, max_retries=0)(_call)
        super().__init__()

    def submit(self, fn, /, *args, **kwargs):  # noqa: D102
        ref = self._task.remote(fn, args, kwargs)
        self._track(ref)
        fut = ref.future()
        fut.add_done_callback(lambda _f, ref=ref: self._forget(ref))
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Cancel what is left when asked (killing its worker processes), and stop
        the local instance this executor started (a joined cluster keeps running)."""
        refs = self._take_pending()
        if cancel_futures:
            for ref in refs:
                try:
                    self._ray.cancel(ref, force=True)
                except Exception:  # already finished or gone
                    pass
        if self._own and self._ray.is_initialized():
            self._ray.shutdown()
            self._own = False


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored inside (main thread only; elsewhere nothing changes), so that processes
    started meanwhile inherit SIG_IGN.  A Ctrl-C inside is lost: keep it short (a local Dask
    cluster's start, about a second)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class DaskExecutor(_ClusterExecutor):
    """Runs each call as a Dask task (``dask.distributed``): on a local cluster it
    starts, or on a running scheduler.

    Like :class:`RayExecutor`, results are the values a process pool gives (pure
    :func:`evaluate` calls on picklable tasks, gathered in task order), so the
    same seed gives the same ``matrix.json`` bytes.  Every worker needs tenantry
    installed (the same version) and, for ``verify --target``, the target's module.

    Args:
        address: a scheduler to join (``tcp://HOST:8786``, or ``HOST:8786``); None
            starts a local cluster of ``num_workers`` single-threaded worker
            processes that :meth:`shutdown` stops.
        num_workers: workers of the local cluster (default: the CPU count).

    Raises:
        ConfigError: when ``distributed`` is not installed (``pip install 'tenantry[dask]'``),
            or the scheduler at ``address`` cannot be reached within 10 seconds.
    """

    def __init__(self, address: str | None = None, num_workers: int | None = None) -> None:
        where = "dask" if address is None else f"dask:{address}"
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ConfigError("--executor", where, "Dask is not installed: pip install 'tenantry[dask]'") from None
        self._cluster = None
        try:
            if address is None:
                import logging

                # A terminal's Ctrl-C goes to the whole process group: workers started while SIGINT is
                # ignored keep ignoring it (Python leaves an inherited SIG_IGN alone), so only this
                # process stops the run and no worker prints a KeyboardInterrupt traceback; quiet logs too.
                with _sigint_ignored():
                    self._cluster = LocalCluster(n_workers=num_workers or os.cpu_count() or 1, threads_per_worker=1,
                                                 processes=True, dashboard_address=None,
                                                 silence_logs=logging.CRITICAL)
                self._client = Client(self._cluster)
            else:
                self._client = Client(address, timeout=10)
        except OSError as e:
            if self._cluster is not None:
                self._cluster.close()
            raise ConfigError("--executor", where, f"cannot reach the Dask scheduler: {e}") from None
        self.slots = max(1, sum(self._client.nthreads().values()))
        super().__init__()

    def submit(self, fn, /, *args, **kwargs):  # noqa: D102
        f = self._client.submit(_call, fn, args, kwargs, pure=False, retries=0)
        self._track(f)
        out: cf.Future = cf.Future()

        def done(g, out=out) -> None:
            self._forget(g)
            if g.cancelled():
                out.cancel()
                out.set_running_or_notify_cancel()
            elif g.status == "error":
                out.set_exception(g.exception())
            else:
                out.set_result(g.result())

        f.add_done_callback(done)
        return out

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Cancel what is left when asked, and stop the local cluster this executor
        started (a joined scheduler keeps running)."""
        futures = self._take_pending()
        if cancel_futures and futures:
            try:
                self._client.cancel(futures, force=True)
            except Exception:  # the client is already closing
                pass
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


def terminate_executor(executor: cf.Executor, timeout_s: float = 3.0) -> None:
    """Stop an executor now: cancel what is queued and kill its worker processes (a process pool's;
    a :class:`RayExecutor`'s tasks, and the local Ray instance it started).

    Used on Ctrl-C and SIGTERM, so that a run stops within seconds instead of
    finishing the evaluations already queued.
    """
    executor.shutdown(wait=False, cancel_futures=True)
    procs = list((getattr(executor, "_processes", None) or {}).values())
    for p in procs:
        try:
            p.terminate()
        except (OSError, ValueError, AttributeError):
            pass
    for p in procs:
        try:
            p.join(timeout_s)
            if p.is_alive():
                p.kill()
                p.join(timeout_s)
        except (OSError, ValueError, AttributeError, AssertionError):
            pass


#: Evaluations of the reference model made during the runs under way (:func:`same_tasks_once`), by task;
#: and how many such runs are under way (the memo goes when the last ends).
_DONE: dict[Task, Evaluation] | None = None
_RUNS = [0]
_RUNS_LOCK = threading.Lock()


@contextmanager
def same_tasks_once() -> Iterator[None]:
    """Inside, :func:`evaluate_batch` evaluates a task of a built-in setup (``setup`` a name:
    the reference model, deterministic, as DETERMINISM checks) generated from its parameters
    once and answers it again from memory: the searches of a cell all start from the pattern's
    defaults, so the same task comes several times with the same evaluation.  A scheduler
    under test (a :class:`System`) is evaluated every time: it may not be deterministic.
    ``tenantry check`` runs inside one; runs under way at once (threads) share the memory
    (the answers are the same), and nothing is kept once the last has ended."""
    global _DONE
    with _RUNS_LOCK:
        _RUNS[0] += 1
        if _DONE is None:
            _DONE = {}
    try:
        yield
    finally:
        with _RUNS_LOCK:
            _RUNS[0] -= 1
            if _RUNS[0] == 0:
                _DONE = None


def evaluate_batch(executor: cf.Executor, tasks: Sequence[Task]) -> list[Evaluation]:
    """Evaluate tasks through ``executor``; results in task order (inside :func:`same_tasks_once`,
    a task already evaluated in the run is answered from memory)."""
    done = _DONE
    memo = (lambda t: isinstance(t.setup, str) and t.scenario is None) if done is not None else (lambda t: False)
    futures = {i: executor.submit(evaluate, t) for i, t in enumerate(tasks) if not (memo(t) and t in done)}
    out = [futures[i].result() if i in futures else done[t] for i, t in enumerate(tasks)]
    if done is not None:
        done.update((t, ev) for t, ev in zip(tasks, out) if memo(t))
    return out


@attrs.frozen
class ShrunkScenario:
    """A scenario reduced by :func:`shrink_scenario`.

    Attributes:
        scenario: the reduced scenario (ids renumbered 0..n-1).
        evaluation: its evaluation (score at or above the threshold, or the invariant broken).
        original_requests, requests: requests that could go (the adversary's, or every
            request when shrinking an invariant's finding) before and after.
        evaluations: evaluations spent.
        note: why it was not reduced, if it was not tried (:func:`hang_note`), else empty.
    """

    scenario: Scenario
    evaluation: Evaluation
    original_requests: int
    requests: int
    evaluations: int
    note: str = ""

    @property
    def finding(self) -> "Finding | None":
        """The first finding of the evaluation (of the invariant shrunk for, if any was)."""
        return self.evaluation.findings[0] if self.evaluation.findings else None


def hang_note(ev: Evaluation) -> str:
    """Why a workload on which the system hung (an ADAPTER-HANG finding in ``ev``) is not
    shrunk, or "" when it did not hang: every candidate that still hangs would wait out the
    per-call timeout (a blind test's hanging scheduler spent 25 of its 27 timeouts, 250 s,
    shrinking two such witnesses)."""
    hang = next((f for f in ev.findings if f.invariant == "ADAPTER-HANG"), None)
    if hang is None:
        return ""
    return (f"not shrunk: the system hangs on this workload (ADAPTER-HANG at step {hang.step}), and each "
            "candidate that hangs would wait out the call timeout")


def shrink_scenario(setup: "str | System", scenario: Scenario, threshold: float | None = None, *,
                    executor: cf.Executor, max_evaluations: int = 60, objective: str | None = None,
                    progress: bool = False, invariant: str | None = None, depth: str = "history",
                    cut_after_s: float | None = None) -> ShrunkScenario | None:
    """Reduce ``scenario`` while it still fails, with the one shrinker
    (:func:`tenantry.testing.shrink.shrink`); candidates are evaluated in batches
    through ``executor``.

    Two tests:

    - ``threshold`` (a hurt adversary): the score stays at or above it; only the
      adversary's requests shrink, the victims stay as they are; the candidates run
      unchecked (``depth`` None: only their score is kept, so checking them found
      nothing anyone would see);
    - ``invariant`` (a broken invariant, checked at ``depth``): a finding of that
      invariant still shows; every request may go, from those arriving after
      ``cut_after_s`` (seconds) on; the evaluation kept has that invariant's
      finding first.

    The prefix probe's control twin follows the same request slots (each kept probe
    keeps its decoy prefix, trimmed like the probe's).

    A scenario on which the system hangs is not reduced (:func:`hang_note`): the result is the
    scenario itself, with that note, after one evaluation.

    Returns None when the scenario itself does not fail.

    Raises:
        ValueError: if neither or both of ``threshold`` and ``invariant`` are given.
    """
    from tenantry.testing.shrink import PHASES, shrink

    if (threshold is None) == (invariant is None):
        raise ValueError("shrink_scenario: give threshold or invariant, not both or neither")
    adv = set(scenario.adversaries)
    twin_of: dict[int, tuple[int, ...]] = {}
    if scenario.twin is not None:
        mains = [r for r in scenario.workload if r.tenant in adv]
        twins = [r for r in scenario.twin.workload if r.tenant in adv]
        twin_of = {m.request_id: t.prefix_ids for m, t in zip(mains, twins)}

    def build(wl: Workload) -> Scenario:
        twin = None
        if scenario.twin is not None:
            decoys = [attrs.evolve(r, prefix_ids=twin_of[r.request_id][:len(r.prefix_ids)])
                      if r.request_id in twin_of else r for r in wl]
            twin = scenario.twin.with_workload(Workload(renumber(decoys)))
        return scenario.with_workload(Workload(renumber(wl.requests)), twin)

    def fails(ev: Evaluation) -> Evaluation | None:
        if invariant is None:
            return ev if ev.score >= threshold else None
        hit = [f for f in ev.findings if f.invariant == invariant]
        return attrs.evolve(ev, findings=tuple(hit + [f for f in ev.findings if f.invariant != invariant])) if hit else None

    best: list[Evaluation] = []

    def test(cands) -> int | None:
        tasks = [Task(setup, scenario.pattern, (), scenario.seed, objective, build(c),
                      depth=depth if invariant is not None else None) for c in cands]
        for i, ev in enumerate(evaluate_batch(executor, tasks)):
            kept = fails(ev)
            if kept is not None:
                best.append(kept)
                return i
        return None

    if test([scenario.workload]) is None:
        return None
    block = system_of(setup).config(scenario.roles).block_size_tokens
    if invariant is None:
        fixed, phases = (lambda r: r.tenant not in adv), ("requests", "output_tokens", "prompt_tokens")
        n_adv = lambda wl: sum(1 for r in wl if r.tenant in adv)
    else:
        fixed, phases, n_adv = (lambda r: False), PHASES, len
    note = hang_note(best[0]) if invariant != "ADAPTER-HANG" else ""
    if note:
        n = n_adv(scenario.workload)
        return ShrunkScenario(build(scenario.workload), best[0], n, n, 1, note)
    res = shrink(scenario.workload, test, fixed=fixed, block_size_tokens=block, phases=phases,
                 min_prompt_tokens=block, max_evaluations=max(0, max_evaluations - 1), cut_after_s=cut_after_s,
                 progress=(f"shrink     {system_of(setup).name}/{scenario.pattern}"
                           + (f" {invariant}" if invariant else "")) if progress else None)
    return ShrunkScenario(build(res.workload), best[-1], n_adv(scenario.workload), n_adv(res.workload),
                          res.evaluations + 1)
