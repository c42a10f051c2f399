"""monitored_barrier: a barrier that names the ranks that did not reach it in time
(torch's gloo semantics), for ringtree's groups and for the torch backend's.

Runs over the group's store, not its engine, so that it names a rank stuck anywhere (in a
collective included). Barrier number k of a group uses the keys
  ringtree/monitored_barrier/<k>/arrived/<rank>   set by each rank when it arrives
  ringtree/monitored_barrier/<k>/verdict          b"ok", or why the barrier failed
Rank 0 waits for the others' arrivals until its deadline, then writes the verdict; the
others wait for the verdict. The verdict is written with compare_set, so the first writer
wins: a rank that gives up waiting for rank 0 writes its own failure, and rank 0, arriving
later, fails with it instead of passing alone. A rank only gives up when rank 0 has not
arrived; if rank 0 is there, it is waiting for someone and its verdict is due by its own
deadline, so the rank waits for that (one more timeout at most) and reports it. Rank 0
deletes its own and the arrival keys it saw at once, and the verdicts (and arrival keys of
ranks that came late) of earlier barriers once a later barrier has passed: every rank has
read them by then.
"""

from __future__ import annotations

import time
import warnings
import weakref
from datetime import timedelta
from typing import Any

from . import constants
from ._resolve import member_group, registered
from .backend import Backend
from .errors import DistBackendError, DistStoreError, DistTimeoutError
from .process_group import ProcessGroup

__all__ = ["monitored_barrier"]  # MonitoredBarrier is for the torch backend

_PREFIX = "ringtree/monitored_barrier"
_PASSED = b"ok"


class MonitoredBarrier:
    """The monitored barriers of one group: numbers them and, on rank 0, keeps the store
    keys of earlier ones that can only be deleted once a later one has passed.

    ``store`` is the group's ringtree Store (its own key space); ``name`` names the group in
    errors. Every member calls :meth:`run` in the same order."""

    def __init__(self, store: Any, rank: int, size: int, name: str) -> None:
        self._store, self._rank, self._size, self._name = store, rank, size, name
        self._count = 0
        self._stale_keys: list[str] = []

    def run(self, timeout: timedelta, wait_all_ranks: bool) -> None:
        """One barrier (see :func:`monitored_barrier` for what it raises)."""
        self._count += 1
        if self._size == 1:
            return
        prefix = f"{_PREFIX}/{self._count}"
        if self._rank == 0:
            self._root(prefix, timeout, wait_all_ranks)
        else:
            self._member(prefix, timeout)

    def _root(self, prefix: str, timeout: timedelta, wait_all_ranks: bool) -> None:
        store = self._store
        deadline = time.monotonic() + timeout.total_seconds()
        store.set(f"{prefix}/arrived/0", b"1")
        seen: list[int] = []
        missing: list[int] = []
        failure = None
        for peer in range(1, self._size):
            key = f"{prefix}/arrived/{peer}"
            remaining = deadline - time.monotonic()
            if remaining <= 0 and not wait_all_ranks:
                # Out of time before this rank could be waited for: rank 0's own timeout.
                processed = ("Successfully processed ranks: " + ", ".join(map(str, seen)) if seen
                             else "No ranks successfully processed in monitoredBarrier.")
                failure = f"Rank 0 timed out in monitoredBarrier after {_milliseconds(timeout)} ms.\n{processed}"
                break
            arrived = _wait_for_key(store, key, timedelta(seconds=remaining)) if remaining > 0 else store.check([key])
            (seen if arrived else missing).append(peer)
            if missing and not wait_all_ranks:
                break
        if missing:
            who = f"Rank {missing[0]}" if len(missing) == 1 else "Ranks " + ", ".join(map(str, missing))
            failure = f"[Rank 0]: {who} failed to pass monitoredBarrier in {_milliseconds(timeout)} ms"
        verdict = store.compare_set(f"{prefix}/verdict", "", failure or _PASSED)
        store.delete_key(f"{prefix}/arrived/0")
        passed = verdict == _PASSED
        # The verdict, and the arrival keys of ranks not seen yet (they may still come), are
        # kept until a later barrier passes; earlier ones go now if this one passed.
        if passed:
            for key in self._stale_keys:
                store.delete_key(key)
            self._stale_keys.clear()
        self._stale_keys.append(f"{prefix}/verdict")
        for peer in range(1, self._size):
            key = f"{prefix}/arrived/{peer}"
            if peer in seen:
                store.delete_key(key)
            else:
                self._stale_keys.append(key)
        if failure is not None:
            raise DistTimeoutError(failure)
        if not passed:
            raise DistTimeoutError(
                f"[Rank 0]: monitoredBarrier of group {self._name!r} failed before rank 0 arrived: {verdict.decode()}"
            )

    def _member(self, prefix: str, timeout: timedelta) -> None:
        store, rank = self._store, self._rank
        verdict_key = f"{prefix}/verdict"
        store.set(f"{prefix}/arrived/{rank}", b"1")
        gave_up = None
        if not _wait_for_key(store, verdict_key, timeout):
            if not store.check([f"{prefix}/arrived/0"]):
                gave_up = f"rank 0 did not release it within {_milliseconds(timeout)} ms"
            elif not _wait_for_key(store, verdict_key, timeout):
                gave_up = f"rank 0 reached it but gave no verdict within {2 * _milliseconds(timeout)} ms"
        if gave_up is not None:
            gave_up = (
                f"Rank {rank} successfully reached monitoredBarrier, but {gave_up}. "
                "Please check rank 0 logs for faulty rank."
            )
            if store.compare_set(verdict_key, "", gave_up) == gave_up.encode():
                raise DistTimeoutError(gave_up)
        verdict = store.get(verdict_key)
        if verdict != _PASSED:
            raise DistTimeoutError(
                f"Rank {rank} successfully reached monitoredBarrier, but it failed: {verdict.decode()}"
            )


def barrier_timeout(timeout: Any, default: timedelta) -> timedelta:
    """The deadline a monitored barrier call asks for: ``default`` for None, a float taken
    as seconds (with torch's warning), a timedelta. Zero is allowed, as torch allows it
    (rank 0 is out of time at once); TypeError for another type, ValueError when negative."""
    if timeout is None:
        return default
    if isinstance(timeout, float):
        warnings.warn(
            "Please specify timeout arg as a timedelta. "
            f"Converting current value of {timeout} assuming it represents seconds",
            stacklevel=3,
        )
        timeout = timedelta(seconds=timeout)
    if not isinstance(timeout, timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {type(timeout).__name__}")
    if timeout < timedelta(0):
        raise ValueError(f"monitored_barrier: timeout must not be negative, got {timeout}")
    return timeout


# The barriers of each ringtree group monitored_barrier was called on; an entry goes away
# with its group.
_barriers: weakref.WeakKeyDictionary[ProcessGroup, MonitoredBarrier] = weakref.WeakKeyDictionary()


def monitored_barrier(
    group: ProcessGroup | None = None,
    timeout: timedelta | None = None,
    wait_all_ranks: bool = False,
) -> None:
    """A barrier that names the ranks that did not reach it in time (torch's gloo semantics).

    Every rank but 0 reports its arrival to rank 0 and waits to be released; rank 0 waits
    for every other rank until ``timeout`` has passed since it arrived, then releases them
    or fails. Works over the group's store, so it also names ranks stuck outside ringtree.

    Args:
        group: The group (default: the world); a group this rank is not in: warning, no-op.
        timeout: Deadline (default 30 minutes, not the group's timeout). A float is taken
            as seconds, with a warning.
        wait_all_ranks: False: rank 0 fails at the first rank (in rank order) that has not
            arrived by the deadline, or, when the deadline passes before it could wait for
            the next rank, with "Rank 0 timed out in monitoredBarrier after N ms" and the
            ranks it saw. True: it names every rank that had not arrived.

    Raises:
        DistTimeoutError (a RuntimeError): on rank 0, "[Rank 0]: Rank 1 failed to pass
            monitoredBarrier in 5000 ms" or, with ``wait_all_ranks``, "[Rank 0]: Ranks 1, 3
            failed to pass monitoredBarrier in 5000 ms"; on the others, "Rank 2 successfully
            reached monitoredBarrier, but ..." with rank 0's verdict, or saying that rank 0
            did not release it in time.
        ValueError: the group's backend is not "gloo" (as torch), or a negative timeout;
            TypeError for a timeout that is not a timedelta; DistBackendError for a
            destroyed group.
    """
    pg = member_group(group, "monitored_barrier")
    if pg is None:
        return
    if pg.name() != Backend.GLOO:
        raise ValueError("monitored_barrier is only implemented for GLOO backend.")
    timeout = barrier_timeout(timeout, constants.default_pg_timeout)
    if not registered(pg):
        raise DistBackendError(f"monitored_barrier on group {pg.group_name!r}, which has been destroyed")
    barrier = _barriers.get(pg)
    if barrier is None:
        barrier = _barriers[pg] = MonitoredBarrier(pg.store, pg.rank(), pg.size(), pg.group_name)
    barrier.run(timeout, wait_all_ranks)


def _wait_for_key(store: Any, key: str, timeout: timedelta) -> bool:
    """Whether ``key`` was set within ``timeout``."""
    try:
        store.wait([key], timeout)
    except DistStoreError:
        return False
    return True


def _milliseconds(timeout: timedelta) -> int:
    return int(timeout / timedelta(milliseconds=1))
