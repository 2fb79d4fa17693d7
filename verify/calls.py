"""Calling a scheduler under test without trusting it: exceptions and hangs become values.

Each adapter gets one worker thread; every call is handed to it and awaited
with a per-call timeout.  A call that raises returns a :class:`CallFailure`
with kind ``raised``; one that does not return in time returns kind
``timeout`` and the worker is abandoned: an exception is raised inside it
(``PyThreadState_SetAsyncExc``), which ends a call spinning in Python code at
its next bytecode, so a scheduler stuck in a loop does not keep a core busy
for the rest of the run; a call blocked in C code (a lock, a sleep, I/O) keeps
its daemon thread until it returns to Python or the process exits.  The
harness goes on and writes its report.  With ``timeout_s=None`` calls run
inline, which is faster and still turns exceptions into failures.

A scheduler that ends the process from inside a call, ``os._exit(n)`` or
``os.abort()``, does not: while a call runs, those functions raise
:class:`AdapterExit` in the thread of the call (in any other thread, and in a
process forked from the call, they are the real ones), and the call fails
with kind ``exit`` (so does one raising ``SystemExit``: ``sys.exit``).  A
``KeyboardInterrupt`` raised on the worker thread is the scheduler's own (a
signal is delivered to the main thread only), and fails the call too; inline,
it is taken as the user's Ctrl-C and passes through.

:func:`given` hands the scheduler a record that the harness owns (a request, a
step's results): a copy whose fields cannot be written, and whose every
attempt to write one (``object.__setattr__`` on the frozen record included)
is logged for the harness to report and raises :class:`Mutated` in the
scheduler's code.  The harness keeps its own record: what it was given is
never the harness's truth.

Wall-clock time is used only to decide a timeout, never in a result.
"""

from __future__ import annotations

import ctypes
import os
import queue
import sys
import threading
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import attrs

from tenantry.adversaries.outdir import stop_if_requested
from tenantry.model.workload import Request

from .protocol import StepResults


@attrs.frozen
class CallFailure:
    """A call into the scheduler under test that did not return normally.

    Attributes:
        call: the method called (``factory``, ``add_request``, ``plan_step``, ...).
        kind: ``raised``, ``exit`` (it called ``os._exit``, ``os.abort`` or ``sys.exit``) or ``timeout``.
        detail: exception type and message, what it called, or the timeout in seconds.
        where: the innermost traceback frame inside the scheduler, ``file:line``.
    """

    call: str
    kind: str
    detail: str
    where: str = ""


class _Box:
    __slots__ = ("done", "value", "error", "exits")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.exits: list[tuple[str, str]] = []


class _Abandoned(BaseException):
    """Raised inside a worker thread whose call timed out (the call is abandoned)."""


def _abandon(thread: threading.Thread | None) -> None:
    """Raise :class:`_Abandoned` in ``thread`` at its next Python bytecode (CPython)."""
    if thread is None or thread.ident is None or not thread.is_alive():
        return
    try:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Abandoned))
    except (AttributeError, OSError):  # not CPython: the thread keeps running, as before
        pass


def _frame(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""


def _caller_line(depth: int = 2) -> str:
    """``file:line`` of the code that called the function calling this one."""
    f = sys._getframe(depth)
    return f"{f.f_code.co_filename}:{f.f_lineno}"


# --- a scheduler that would end the process -------------------------------------------------------


class AdapterExit(BaseException):
    """Raised in place of ``os._exit`` / ``os.abort`` inside a call into the scheduler (a
    BaseException, as SystemExit is: ``except Exception`` in the scheduler does not catch it)."""


#: Thread id -> the exits attempted by the call running on that thread (only while it runs).
_IN_CALL: dict[int, list[tuple[str, str]]] = {}


def _guarded(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(*args: Any) -> Any:
        attempts = _IN_CALL.get(threading.get_ident())
        if attempts is None:
            return real(*args)
        what = f"os.{name}({', '.join(map(repr, args))})"
        attempts.append((what, _caller_line()))
        raise AdapterExit(what)

    guarded.__wrapped__ = real  # type: ignore[attr-defined]
    guarded.__name__ = name
    guarded._tenantry_guard = True  # type: ignore[attr-defined]
    return guarded


for _name in ("_exit", "abort"):  # once per process, before any target module is imported
    if not getattr(getattr(os, _name), "_tenantry_guard", False):
        setattr(os, _name, _guarded(_name, getattr(os, _name)))
if hasattr(os, "register_at_fork"):  # a process forked during a call exits for real
    os.register_at_fork(after_in_child=_IN_CALL.clear)


@contextmanager
def exits_refused() -> Iterator[list[tuple[str, str]]]:
    """While the block runs, ``os._exit`` / ``os.abort`` called on this thread raise
    :class:`AdapterExit` instead (for code tenantry runs outside a :class:`Caller`: importing a
    target module); yields the list of (what it called, ``file:line``)."""
    me = threading.get_ident()
    outer = _IN_CALL.get(me)
    attempts: list[tuple[str, str]] = []
    _IN_CALL[me] = attempts
    try:
        yield attempts
    finally:
        if outer is None:
            _IN_CALL.pop(me, None)
        else:
            _IN_CALL[me] = outer


def _failure(name: str, e: BaseException, attempts: list[tuple[str, str]]) -> "CallFailure":
    """The :class:`CallFailure` of a call that raised ``e`` (or swallowed an exit it attempted)."""
    if attempts:
        what, where = attempts[0]
        return CallFailure(name, "exit", f"called {what}", where)
    if isinstance(e, SystemExit):
        return CallFailure(name, "exit", f"called sys.exit({e.code!r}) (SystemExit)", _frame(e))
    return CallFailure(name, "raised", f"{type(e).__name__}: {e}", _frame(e))


# --- what the scheduler is given ------------------------------------------------------------------


class Mutated(AttributeError):
    """Raised in the scheduler's code when it writes a field of a record the harness gave it."""


#: Per owned class, its given class (see :func:`given`).
_GIVEN: dict[type, type] = {}


def _owned(obj: Any) -> bool:
    """True if ``obj`` was handed over by :func:`given` (it has a log); False for the scheduler's own copies."""
    try:
        return object.__getattribute__(obj, "_log") is not None
    except AttributeError:
        return False


def _refuse(obj: Any, field: str, old: Any, new: Any) -> None:
    """Log the scheduler's write of ``field`` (at the line of its code that wrote) and raise :class:`Mutated`."""
    object.__getattribute__(obj, "_log").append((obj, field, old, new, _caller_line(3)))
    raise Mutated(f"{field} of a {type(obj).__mro__[1].__name__} the harness gave the scheduler cannot be "
                  "changed; change a copy (attrs.evolve)")


def _given_class(cls: type, name: str) -> type:
    """A subclass of the slotted attrs class ``cls`` whose fields are read as usual, but, once
    the instance is handed over (its ``_log`` set), written only into the log (and refused).
    An instance made the usual way (``attrs.evolve``, ``copy``, pickle) has no log: the
    scheduler's own object, which it may change."""
    ns: dict[str, Any] = {"__slots__": ("_log",), "__module__": __name__, "__qualname__": name,
                          "__doc__": f"A {cls.__name__} handed to a scheduler (see tenantry.verify.calls.given)."}
    for a in attrs.fields(cls):
        slot = cls.__dict__[a.name]

        def write(self: Any, value: Any, _name: str = a.name, _slot: Any = slot) -> None:
            if _owned(self):
                _refuse(self, _name, _slot.__get__(self), value)
            _slot.__set__(self, value)

        def delete(self: Any, _name: str = a.name, _slot: Any = slot) -> None:
            if _owned(self):
                _refuse(self, _name, _slot.__get__(self), "(deleted)")
            _slot.__delete__(self)

        ns[a.name] = property(slot.__get__, write, delete)
    out = type(name, (cls,), ns)
    _GIVEN[cls] = out
    return out


GivenRequest = _given_class(Request, "GivenRequest")
GivenStepResults = _given_class(StepResults, "GivenStepResults")


def given(record: Any, log: list) -> Any:
    """A copy of the harness's ``record`` (a :class:`~tenantry.model.workload.Request` or
    :class:`~tenantry.verify.protocol.StepResults`) to hand to the scheduler: equal field by
    field, an instance of the record's class, and each attempt to write a field appends
    ``(copy, field, old value, new value, "file:line")`` to ``log`` and raises :class:`Mutated`.

    Cost: one object and a slot write per field (a few microseconds), no check after a call.
    """
    sub, slots, set_log = _PLANS[type(record)]
    out = object.__new__(sub)
    for slot in slots:
        slot.__set__(out, slot.__get__(record))
    set_log(out, log)
    return out


#: Per owned class: (its given class, the slots of its fields, the setter of the given class's log).
_PLANS = {cls: (_GIVEN[cls], tuple(cls.__dict__[a.name] for a in attrs.fields(cls)),
                _GIVEN[cls].__dict__["_log"].__set__) for cls in (Request, StepResults)}


class Caller:
    """Runs calls with a per-call timeout on one daemon worker thread.

    Args:
        timeout_s: seconds each call may take (> 0), or None to call inline.

    After a timeout the caller is ``dead``: further calls fail at once with
    kind ``timeout`` (the scheduler's state is unknown once a call hung).
    """

    def __init__(self, timeout_s: float | None) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r}: must be > 0 or None")
        self.timeout_s = timeout_s
        self.dead = False
        self._q: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    def _worker(self, q: queue.SimpleQueue) -> None:
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                fn, args, box = item
                _IN_CALL[threading.get_ident()] = box.exits
                try:
                    box.value = fn(*args)
                except _Abandoned:
                    return
                except BaseException as e:  # the scheduler's exception, of any kind, is a finding
                    box.error = e
                finally:
                    _IN_CALL.pop(threading.get_ident(), None)
                box.done.set()
        except _Abandoned:  # arrived between calls: the caller is dead anyway
            return

    def call(self, name: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> tuple[bool, Any]:
        """Call ``fn(*args)``.  Returns (True, value) or (False, :class:`CallFailure`).

        ``timeout_s`` overrides the caller's timeout for this call (a longer one
        for building the scheduler, which may import a large package).

        Raises:
            KeyboardInterrupt: a stop was asked for (Ctrl-C or SIGTERM whose own
                KeyboardInterrupt a finaliser swallowed): every run stops at its next call.
        """
        stop_if_requested()
        if self.dead:
            return False, CallFailure(name, "timeout", "an earlier call hung; the scheduler is abandoned")
        if self.timeout_s is None:
            with exits_refused() as exits:
                try:
                    value = fn(*args)
                except KeyboardInterrupt:
                    if not exits:
                        raise  # inline, a KeyboardInterrupt may be the user's Ctrl-C
                    return False, _failure(name, AdapterExit(), exits)
                except BaseException as e:  # SystemExit from a scheduler is a finding too
                    return False, _failure(name, e, exits)
            return (True, value) if not exits else (False, _failure(name, AdapterExit(), exits))
        if self._q is None:
            self._q = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._worker, args=(self._q,), name="tenantry-adapter", daemon=True)
            self._thread.start()
        box = _Box()
        self._q.put((fn, args, box))
        limit = self.timeout_s if timeout_s is None else timeout_s
        if not box.done.wait(limit):
            self.dead = True
            _abandon(self._thread)
            return False, CallFailure(name, "timeout", f"no return within {limit} s")
        if box.error is not None or box.exits:  # a KeyboardInterrupt on the worker is the scheduler's own
            return False, _failure(name, box.error or AdapterExit(), box.exits)
        return True, box.value

    def close(self) -> None:
        """Stop the worker thread (if it is not hung)."""
        if self._q is not None and not self.dead:
            self._q.put(None)
        self._q = None
