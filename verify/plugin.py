"""pytest plugin: the tenantry suite against your scheduler, as ordinary tests.

Installed with tenantry (entry point ``pytest11``), it does nothing unless
asked.  Two ways to ask:

* name a factory on the command line::

      pytest --tenantry-target=mypkg.sched:make_scheduler

  which adds the items ``tenantry[mypkg.sched:make_scheduler]::stateful`` (a
  Hypothesis stateful run) and ``...::pattern[<name>]`` for every adversary
  pattern (``--tenantry-patterns`` picks some);
* or use the ``tenantry_verify`` fixture in your own test::

      def test_scheduler(tenantry_verify):
          tenantry_verify(make_scheduler)

A factory returns a :class:`~tenantry.verify.protocol.SchedulerAdapter` (it may
take ``tenants=``).  A finding fails the test with the invariant, the step,
the request, the shrunk workload (written under ``--tenantry-out``) and the
``tenantry verify`` command that replays it.

Only pytest is imported at load time: the plugin is loaded in every pytest
run of an environment where tenantry is installed.

Ctrl-C and SIGTERM stop the run within a second or two, with pytest's
"interrupted" status (2), pytest-xdist's workers included: while tenantry's
checks run, both signals go to the one handler the command line uses
(:func:`tenantry.adversaries.outdir.catch_stop_signals`), which raises
KeyboardInterrupt and sets ``STOP_REQUESTED``; every call into the scheduler
polls that flag, so a stop whose KeyboardInterrupt was swallowed (Python drops
an exception raised inside a finaliser or a garbage-collector callback, such as
Hypothesis's) still stops at the next call.  Under pytest-xdist the controller
passes the signal on to its workers (a SIGTERM sent to it alone stops them too).
"""

from __future__ import annotations

import os
import sys
import warnings

from pathlib import Path
from typing import Any, Callable

import pytest


def pytest_addoption(parser: Any) -> None:
    g = parser.getgroup("tenantry", "tenantry: verify a scheduler against the tenantry suite")
    g.addoption("--tenantry-target", action="append", default=[], metavar="MODULE:FACTORY",
                help="run the tenantry suite against this adapter factory (repeatable)")
    g.addoption("--tenantry-patterns", default="", metavar="NAMES",
                help="comma-separated adversary patterns (default: all); 'none' for none")
    g.addoption("--tenantry-examples", default=None, metavar="N",
                help="stateful examples (default: the Hypothesis profile's max_examples)")
    g.addoption("--tenantry-out", default=".tenantry", metavar="DIR",
                help="folder for shrunk failing workloads (default .tenantry)")
    g.addoption("--tenantry-tiered", action="store_true",
                help="adversary tier 0, victims tier 1 in the pattern scenarios")
    g.addoption("--tenantry-weighted", action="store_true",
                help="tenants' weights 1, 2, 0.5 in tenant order in the pattern scenarios (the stateful run always)")
    g.addoption("--tenantry-timeout-s", default="10", metavar="S",
                help="per-call timeout for the scheduler (default 10 s)")


def _number(flag: str, text: Any, kind: type, low: float) -> Any:
    """``text`` as a ``kind`` (int or float) that is finite and > ``low``, else a usage error naming the flag."""
    try:
        v = kind(text)
    except (TypeError, ValueError):
        v = None
    if v is None or v != v or v in (float("inf"), float("-inf")) or not v > low:
        what = "a whole number >= 1" if kind is int else "a positive finite number of seconds"
        raise pytest.UsageError(f"{flag}={text}: must be {what}")
    return v


def _options(config: Any) -> dict[str, Any]:
    """The plugin's options, checked: a bad value is a usage error (exit 4, one line naming the flag)."""
    pats = config.getoption("tenantry_patterns")
    patterns = None if not pats else [] if pats.strip() == "none" else [p.strip() for p in pats.split(",") if p.strip()]
    if patterns == [] and pats.strip() != "none":
        raise pytest.UsageError(f"--tenantry-patterns={pats}: names no pattern; give comma-separated names, or none")
    if patterns:
        from tenantry.adversaries.patterns import get_pattern
        from tenantry.model.config import ConfigError

        for p in patterns:
            try:
                get_pattern(p)
            except ConfigError as e:
                raise pytest.UsageError(f"--tenantry-patterns: {e}") from None
    examples = config.getoption("tenantry_examples")
    out = Path(config.getoption("tenantry_out"))
    if out.exists() and not out.is_dir():
        raise pytest.UsageError(f"--tenantry-out={out}: is a file, not a folder (the shrunk failing workloads go there)")
    return {
        "patterns": patterns,
        "examples": None if examples is None else _number("--tenantry-examples", examples, int, 0),
        "out": out,
        "tiered": config.getoption("tenantry_tiered"),
        "weighted": config.getoption("tenantry_weighted"),
        "timeout_s": _number("--tenantry-timeout-s", config.getoption("tenantry_timeout_s"), float, 0),
    }


# --- stopping: Ctrl-C and SIGTERM -------------------------------------------------------------


class _Stop:
    """What a stop needs: the one SIGINT / SIGTERM handler while tenantry's checks run, the
    pytest-xdist workers it passes the signal on to, and a quick end once stopped."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.old: dict | None = None  # the handlers replaced, while caught
        self.worker_pids: list[int] = []
        self.stopped = False  # a check was stopped

    def catch(self) -> None:
        """Install the handler (main thread only; elsewhere nothing changes) until :meth:`release`."""
        from tenantry.adversaries.outdir import catch_stop_signals

        if self.old is None:
            self.old = catch_stop_signals(self._forward)[0]
            self.unraisable, sys.unraisablehook = sys.unraisablehook, self._unraisable

    def release(self) -> None:
        if self.old is not None:
            from tenantry.adversaries.outdir import restore_signals

            restore_signals(self.old)
            self.old = None
            if sys.unraisablehook == self._unraisable:
                sys.unraisablehook = self.unraisable

    def _unraisable(self, u: Any) -> None:
        """A stop's KeyboardInterrupt that Python dropped (raised inside a finaliser or a garbage-collector
        callback) is no news: the stop goes on through ``STOP_REQUESTED``.  Anything else goes to pytest."""
        outdir = sys.modules.get("tenantry.adversaries.outdir")
        if not (isinstance(u.exc_value, KeyboardInterrupt) and outdir is not None and outdir.STOP_REQUESTED.is_set()):
            self.unraisable(u)

    def _forward(self, signum: int) -> None:
        for pid in self.worker_pids:  # pytest-xdist's workers (a SIGTERM sent to the controller alone)
            try:
                os.kill(pid, signum)
            except OSError:  # gone already
                pass

    def run(self, check: Callable[[], None]) -> None:
        """Run ``check()``; a stop leaves as a fresh KeyboardInterrupt.

        A stop is a KeyboardInterrupt out of the check, or one asked for (``STOP_REQUESTED``) whose
        KeyboardInterrupt was lost, before the check or in its last stretch (the check has then not
        passed).  The fresh exception carries none of the check's frames: pytest renders an
        interrupt's whole traceback, every frame's arguments included, before it prints its one
        line, which took seconds through a Hypothesis run's frames."""
        from tenantry.adversaries.outdir import STOP_REQUESTED

        stopped = STOP_REQUESTED.is_set()
        if not stopped:
            try:
                check()
            except KeyboardInterrupt:
                stopped = True
        if stopped or STOP_REQUESTED.is_set():
            self.stopped = True
            raise KeyboardInterrupt("tenantry: stopped")

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """pytest-xdist's controller: note each worker's process id (execnet's popen gateway)."""
        pid = getattr(getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None), "pid", None)
        if pid is not None:
            self.worker_pids.append(pid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        """The session ends on a stop: pytest's report of it shows only the last frame (unless
        ``--full-trace``), so it renders only that one; the garbage collector's passes over what
        the checks left (pytest collects five times at its end, Python once more at exit: seconds
        on a loaded machine) are skipped by freezing what is there now."""
        outdir = sys.modules.get("tenantry.adversaries.outdir")
        if not (self.stopped or (self.old is not None and outdir is not None and outdir.STOP_REQUESTED.is_set())):
            return
        if not self.config.option.fulltrace and len(excinfo.traceback) > 1:
            excinfo.traceback = excinfo.traceback[-1:]
        import gc

        gc.freeze()

    @pytest.hookimpl(trylast=True)  # after pytest's last garbage collection and its report of what it dropped
    def pytest_unconfigure(self, config: Any) -> None:
        self.release()


_STOP = pytest.StashKey[_Stop]()


@pytest.hookimpl(trylast=True)  # after pytest's own sys.unraisablehook is in place
def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "tenantry: a check of the tenantry suite against a --tenantry-target")
    stop = config.stash[_STOP] = _Stop(config)
    config.pluginmanager.register(stop, "tenantry-stop")
    if config.getoption("tenantry_target"):
        _options(config)  # a bad option is a usage error before any work
        stop.catch()
        # Hypothesis's pytest plugin imports hypothesis at every session's end (its terminal summary):
        # now, in pytest-xdist's controller too, rather than after a stop (seconds on a loaded machine)
        import hypothesis  # noqa: F401


def pytest_report_header(config: Any) -> list[str] | None:
    targets = config.getoption("tenantry_target")
    return [f"tenantry targets: {', '.join(targets)}"] if targets else None


# --- collection: one collector per target, one item per check ------------------------------


class TenantryItem(pytest.Item):
    """One check of the suite against one target (marked ``tenantry``)."""

    def __init__(self, *, check: Callable[[], None], **kw: Any) -> None:
        super().__init__(**kw)
        self.check = check
        self.add_marker("tenantry")

    def runtest(self) -> None:
        self.config.stash[_STOP].run(self.check)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        from .suite import TenantryFailure

        if isinstance(excinfo.value, TenantryFailure):
            return excinfo.value.report()
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


class TenantryTarget(pytest.Collector):
    """The checks of one ``--tenantry-target`` (``tenantry[MODULE:FACTORY]``): ``stateful`` and
    ``pattern[NAME]`` for each pattern, collected like any test (``--collect-only``, ``-k``, ``-m``)."""

    def __init__(self, *, target: str, factory: Callable[..., Any], patterns: list[str], opts: dict[str, Any],
                 **kw: Any) -> None:
        super().__init__(**kw)
        self.target, self.factory, self.patterns, self.opts = target, factory, patterns, opts

    def collect(self) -> list[TenantryItem]:
        from .suite import pattern_check, stateful_check

        opts, target, factory = self.opts, self.target, self.factory
        out = opts["out"] / target.replace(":", "_")
        items = [TenantryItem.from_parent(self, name="stateful", check=lambda: stateful_check(
            factory, target=target, out_dir=out, max_examples=opts["examples"], timeout_s=opts["timeout_s"]))]
        for p in self.patterns:
            items.append(TenantryItem.from_parent(self, name=f"pattern[{p}]", check=lambda p=p: pattern_check(
                factory, p, target=target, out_dir=out, tiered=opts["tiered"], timeout_s=opts["timeout_s"],
                weighted=opts["weighted"])))
        return items

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


def _target(session: Any, target: str, opts: dict[str, Any]) -> TenantryTarget:
    """The collector of ``target``, its factory loaded and its claims checked first (a claim that
    cannot be checked, an unknown pattern: :class:`~tenantry.model.config.ConfigError`)."""
    from tenantry.adversaries.patterns import PATTERNS

    from .target import load_factory
    from .run import preflight
    from .suite import STATEFUL_TENANTS

    factory = load_factory(target)
    for line in preflight(factory, [(t, "victim") for t in STATEFUL_TENANTS], tiered=opts["tiered"],
                          weighted=opts["weighted"], timeout_s=opts["timeout_s"], name=target):
        warnings.warn(line, stacklevel=1)
    pats = list(PATTERNS) if opts["patterns"] is None else opts["patterns"]
    return TenantryTarget.from_parent(session, name=f"tenantry[{target}]", target=target, factory=factory,
                                      patterns=pats, opts=opts)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: Any) -> Any:
    """The session's collection holds one :class:`TenantryTarget` per ``--tenantry-target`` (after
    the test files), so pytest counts, lists and selects their items as it does any test's.  A
    target that cannot be loaded or checked is a usage error (exit 4, one line)."""
    rep = yield
    targets = collector.config.getoption("tenantry_target") if isinstance(collector, pytest.Session) else None
    if targets and rep.passed:
        from tenantry.model.config import ConfigError

        opts = _options(collector.config)
        for t in targets:
            try:
                rep.result.append(_target(collector, t, opts))
            except ConfigError as e:
                raise pytest.UsageError(f"--tenantry-target: {e}") from None
    return rep


@pytest.fixture
def tenantry_verify(request: Any) -> Callable[..., None]:
    """``tenantry_verify(factory, patterns=None, stateful=True, name=None)``: run the
    suite against ``factory`` inside your test; raises one failure listing every
    check that found something (each with its shrunk workload and replay command)."""
    opts = _options(request.config)

    def run(factory: Callable[..., Any], *, patterns: list[str] | None = None, stateful: bool = True,
            name: str | None = None) -> None:
        from tenantry.adversaries.patterns import PATTERNS

        from tenantry.model.workload import Workload

        from tenantry.model.config import ConfigError

        from .run import preflight
        from .suite import STATEFUL_TENANTS, TenantryFailure, pattern_check, stateful_check

        target = name or f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', 'factory')}"
        try:
            for line in preflight(factory, [(t, "victim") for t in STATEFUL_TENANTS], tiered=opts["tiered"],
                                  weighted=opts["weighted"], timeout_s=opts["timeout_s"], name=target):
                warnings.warn(line, stacklevel=2)
        except ConfigError as e:
            pytest.fail(f"tenantry: {e}", pytrace=False)
        out = opts["out"] / request.node.name
        failures: list[TenantryFailure] = []
        checks: list[Callable[[], None]] = []
        if stateful:
            checks.append(lambda: stateful_check(factory, target=target, out_dir=out, max_examples=opts["examples"],
                                                 timeout_s=opts["timeout_s"]))
        pats = patterns if patterns is not None else (opts["patterns"] if opts["patterns"] is not None else list(PATTERNS))
        for p in pats:
            checks.append(lambda p=p: pattern_check(factory, p, target=target, out_dir=out, tiered=opts["tiered"],
                                                    timeout_s=opts["timeout_s"], weighted=opts["weighted"]))

        def all_checks() -> None:
            for c in checks:
                try:
                    c()
                except TenantryFailure as e:
                    failures.append(e)

        stop = request.config.stash[_STOP]
        caught = stop.old is None  # a --tenantry-target session has caught the signals already
        stop.catch()
        try:
            stop.run(all_checks)
        finally:
            if caught:
                stop.release()
        if failures:
            raise TenantryFailure(f"{target}: {len(failures)} of {len(checks)} tenantry checks failed\n" +
                                  "\n\n".join(f.report() for f in failures),
                                  [], Workload(()))

    return run
