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

Wall-clock time is used only to decide a timeout, never in a result.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import traceback
from typing import Any, Callable

import attrs

from tenantry.adversaries.outdir import stop_if_requested


@attrs.frozen
class CallFailure:
    """A call into the scheduler under test that did not return normally.

    Attributes:
        call: the method called (``factory``, ``add_request``, ``plan_step``, ...).
        kind: ``raised`` or ``timeout``.
        detail: exception type and message, or the timeout in seconds.
        where: the innermost traceback frame inside the scheduler, ``file:line``.
    """

    call: str
    kind: str
    detail: str
    where: str = ""


class _Box:
    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


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
                try:
                    box.value = fn(*args)
                except _Abandoned:
                    return
                except BaseException as e:  # the scheduler's exception, of any kind, is a finding
                    box.error = e
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
            try:
                return True, fn(*args)
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # SystemExit from a scheduler is a finding too
                return False, CallFailure(name, "raised", f"{type(e).__name__}: {e}", _frame(e))
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
        if box.error is not None:
            e = box.error
            if isinstance(e, KeyboardInterrupt):
                raise e
            return False, CallFailure(name, "raised", f"{type(e).__name__}: {e}", _frame(e))
        return True, box.value

    def close(self) -> None:
        """Stop the worker thread (if it is not hung)."""
        if self._q is not None and not self.dead:
            self._q.put(None)
        self._q = None
