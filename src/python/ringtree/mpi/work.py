"""Work handles of the MPI backend, the worker that runs a group's asynchronous
collectives, and the progress thread that completes point-to-point requests.

Collectives (see CollectiveOrder): MPI requires every rank to issue a communicator's
collectives in the same order, and a nonblocking collective (MPI_Iallreduce) never
matches a blocking one (MPI_Allreduce) on another rank. ringtree, like torch, lets each
rank choose ``async_op`` per call, so every collective is a blocking MPI call: a
synchronous one on the calling thread (no hand-off) when nothing is queued before it,
an asynchronous one on the group's worker thread, in submission order, which completes
its :class:`MpiWork`. (MPI's nonblocking collectives would also cost more: Open MPI
4.1's MPI_Iallreduce + MPI_Wait takes 1.8-4x the time of MPI_Allreduce from 8 B to 4 MiB
at 2 ranks, docs/performance.md.)

Point to point (isend, irecv): nonblocking MPI requests, which do match blocking sends
and receives, behind a _C._MpiRequestWork (the Work API in C: a small exchange must not
pay for a Python object with a lock). They complete in the caller's ``wait()``
(MPI_Wait) or ``is_completed()`` (MPI_Test), or, for a work with a done callback or
Future and for one dropped unfinished, on the progress thread, which tests such requests
every 10 ms (sleeping in between, so that waiting never burns a core). One thread at a
time touches a request: the work marks it busy, with the GIL held, around each MPI call
on it.

Completion runs the call's finishing step (a collective's AVG division, copying a
packed result into the caller's list, ...), then callbacks and the torch Future.

The progress thread is also the backend's watchdog: a blocking MPI call cannot be
cancelled, so an operation still running past its group's timeout is reported (rank,
call, group) on stderr and the job is ended with MPI_Abort, as NCCL's watchdog ends a
job whose collective hangs. ``wait(timeout)`` with an explicit timeout raises
DistTimeoutError instead and leaves the operation running.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from datetime import timedelta
from collections import deque
from typing import Any, Callable

from ..errors import DistBackendError, DistTimeoutError

__all__ = ["CollectiveOrder", "MpiWork", "Progress"]

_NO_TIMEOUT = timedelta(0)


class MpiWork:
    """torch 2.13's Work API over a collective that the group's worker runs and finishes
    (see ringtree.Work for the contract). isend/irecv return _C._MpiRequestWork, the same
    API over one MPI request, in C (bindings/mpi_request_work.cc)."""

    __slots__ = ("_callbacks", "_describe", "_done", "_error", "_event", "_finish", "_future", "_keep", "_lock",
                 "_outputs")

    def __init__(self, outputs: list[Any], keep: Any, finish: Callable[[Any], None] | None,
                 describe: Callable[[], str]) -> None:
        self._outputs = outputs
        self._keep = keep  # the borrowed buffers and scratch, held until completion
        self._finish = finish
        self._describe = describe  # the engine's overdue() watches the call while the worker runs it
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._done = False
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[BaseException | None], None]] = []
        self._future: Any = None

    def _finished(self, error: BaseException | None) -> None:
        """Completes the work (the worker calls this once the collective returned): the
        finishing step, then callbacks and the Future."""
        with self._lock:
            if error is None and self._finish is not None:
                try:
                    self._finish(None)
                except BaseException as exc:  # noqa: BLE001 - the operation's error, stored
                    error = exc
            self._error = error
            self._keep = self._finish = None
            self._done = True
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _run_callback(callback, error)

    # --- the Work API -------------------------------------------------------------

    def wait(self, timeout: timedelta = _NO_TIMEOUT) -> bool:
        """Blocks until the operation finished (timeout 0: no limit); True on success,
        raises its error otherwise. Past a positive timeout, DistTimeoutError (the
        operation keeps running)."""
        if timeout is not _NO_TIMEOUT:  # the default skips the checks: the common, short path
            if not isinstance(timeout, timedelta):
                raise TypeError(f"Work.wait: timeout must be a datetime.timedelta, got {type(timeout).__name__}")
            if timeout.total_seconds() < 0:
                raise ValueError(f"Work.wait: timeout must not be negative, got {timeout}")
        if not self._done and not self._event.wait(timeout.total_seconds() or None):
            raise DistTimeoutError(f"Work.wait timed out after {timeout} in {self._describe()}")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self) -> BaseException | None:
        return self._error if self._done else None

    def source_rank(self) -> int:
        return -1

    _source_rank = source_rank

    def result(self) -> list[Any]:
        if not self._done:
            raise RuntimeError("Work needs to be completed before calling result(). Should call wait() before result().")
        return list(self._outputs)

    def synchronize(self) -> None:
        """Nothing to do for host memory."""

    def _add_done_callback(self, callback: Callable[[BaseException | None], None]) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(callback)
                return
        _run_callback(callback, self._error)

    def get_future(self) -> Any:
        """A torch.futures.Future completed with result()'s list, or with the error."""
        if self._future is None:
            self._future = future_of(self)
        return self._future

    def __repr__(self) -> str:
        state = "pending" if not self._done else ("completed" if self._error is None else "failed")
        return f"<ringtree.mpi Work {self._describe()} {state}>"


def future_of(work: Any) -> Any:
    """A new torch.futures.Future that ``work`` (an MpiWork or _C._MpiRequestWork)
    completes with its result() list, or with its error."""
    try:
        from torch.futures import Future
    except ImportError:
        raise RuntimeError("Work.get_future() returns a torch.futures.Future: it needs torch installed") from None
    future = Future()

    def settle(error: BaseException | None) -> None:
        if error is None:
            future.set_result(work.result())
        else:
            future.set_exception(error)

    work._add_done_callback(settle)
    return future


class CollectiveOrder:
    """The order of one group's collectives. ``lock`` is held while one runs, on the
    caller's thread or on the worker; a caller that finds ``queue`` empty under it
    may run its blocking call at once, since the worker takes the next queued call only
    while it holds the lock. ``submit(run)`` queues a call for the worker thread (started
    on first use); ``stop()`` lets it run what is queued, then ends it."""

    def __init__(self, name: str) -> None:
        self.lock = threading.Lock()
        self._name = name
        self.queue: deque[Callable[[], None]] = deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def submit(self, run: Callable[[], None]) -> None:
        with self._wake:
            if self._stopping:
                raise DistBackendError(f"{self._name}: the group is shutting down")
            self.queue.append(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self.queue and not self._stopping:
                    self._wake.wait()
                if not self.queue:
                    return
            with self.lock:
                run = self.queue.popleft()
                run()


def _run_callback(callback: Callable[[BaseException | None], None], error: BaseException | None) -> None:
    try:
        callback(error)
    except Exception as exc:  # noqa: BLE001 - a user's callback must not break completion
        sys.unraisablehook(_Unraisable(exc, callback))


class _Unraisable:
    def __init__(self, exc: BaseException, callback: Any) -> None:
        self.exc_type, self.exc_value, self.exc_traceback = type(exc), exc, exc.__traceback__
        self.err_msg, self.object = "Exception in a ringtree.mpi Work done callback", callback


def _wrap(exc: BaseException, what: str) -> BaseException:
    """An MPI error as ringtree's DistBackendError naming the call."""
    text = exc.Get_error_string() if hasattr(exc, "Get_error_string") else str(exc)
    error = DistBackendError(f"{what} failed in the MPI library: {text}")
    error.__cause__ = exc
    return error


class Progress:
    """The process's progress and watchdog thread (one for every MPI group).

    ``add(work)`` hands it a point-to-point work (_C._MpiRequestWork) to complete without
    a waiter (one with a callback or Future, or dropped unfinished); ``waiting`` names the
    request work each thread blocks on in wait(); ``engines`` holds every group's engine, whose ``overdue(now)``
    names the call it runs past its deadline (else None).
    ``abort`` is called with a message when something outlives its deadline (MPI_Abort of
    the world).

    While works are pending it tests them every ``_POLL`` seconds, the first time one
    poll after it was woken: a caller who waits at once completes its own work, and the
    thread stays off the CPU (measured at 2 ranks on 2 cores, a 1 ms poll made an
    isend/irecv/wait exchange take 25-40 us instead of 3-8: every wake-up takes a core
    and the GIL from a rank). A work nobody waits for completes within about 10 ms.
    Idle, it sleeps, waking once a second to check deadlines; ``add`` wakes it only from
    there.
    """

    _POLL = 10e-3

    def __init__(self, abort: Callable[[str], None]) -> None:
        self._abort = abort
        self._pending: deque[Any] = deque()
        self.engines: weakref.WeakSet[Any] = weakref.WeakSet()
        # The request work each thread blocks on in wait(), by thread id (deadline checks).
        self.waiting: dict[int, Any] = {}
        self._wake = threading.Condition()
        self._idle = False
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="ringtree-mpi-progress", daemon=True)
        self._thread.start()

    def add(self, work: Any) -> None:
        self._pending.append(work)
        if self._idle:  # the thread sets it before it last looked at _pending (see _loop)
            with self._wake:
                self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._wake:
                if self._stopped:
                    return
                if not self._pending:
                    self._idle = True
                    if not self._pending:
                        self._wake.wait(timeout=1.0)
                    self._idle = False
                    if self._stopped:
                        return
            if self._pending:
                time.sleep(self._POLL)
                self._test_pending()
            self._check_deadlines()

    def _test_pending(self) -> None:
        """Tests each pending work once (one a waiter is blocked on is left to it);
        completed ones leave the queue, the others go back to its end."""
        for _ in range(len(self._pending)):
            work = self._pending.popleft()
            if not work._poll():
                self._pending.append(work)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        late = [work._describe() for work in [*self._pending, *self.waiting.values()] if now > work.deadline]
        late += [late_call for engine in list(self.engines) if (late_call := engine.overdue(now)) is not None]
        if late:
            self._abort(
                f"ringtree mpi backend (pid {os.getpid()}): {late[0]} did not complete within its group's timeout; "
                "an MPI operation cannot be cancelled, so the job is aborted (MPI_Abort)"
            )
