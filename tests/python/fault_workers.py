"""Rank-side code of the fault-injection tests (test_fault_injection.py).

The functions taking ``(rank, world_size, ...)`` run in each rank's process through
harness.run_world's child entry point (``harness._child_main``) and return a JSON-able
record. Every rank also connects to the test's *control store* (a TCPStore the test
process hosts at ``control_port``), which is not the job's store: through it ranks say
where they are (``ready/<rank>``, ``inside/<rank>``) and the test says when a planned
fault has happened (``go``) or when the victim must act itself (``act``). The job's own
store is hosted by rank 0 at ``MASTER_PORT`` (``env://``), so that its port being free
again after a failure says something about the job, not about the test.

Timestamps are ``time.monotonic()``: CLOCK_MONOTONIC is one clock for every process of
the machine, so the test compares them with the time it injected the fault.

Run as a program (``python -m fault_workers``) it is the worker script of the launcher
test: every rank reports its pid to the control store and runs large allreduces until
one fails, which then ends the process with an unhandled exception.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta

import numpy as np

import ringtree as dist

# How long a rank waits for a step of the test (the test's own deadlines are shorter).
CONTROL_TIMEOUT = timedelta(seconds=60)
# Elements of the buffers of "large" collectives: 4 MiB of float32.
LARGE_COUNT = 1 << 20
# The longest a "during" loop runs when no fault stops it.
LOOP_LIMIT_S = 30.0


def _control(port: int) -> dist.TCPStore:
    """A client of the test's control store. Not thread-safe: one per thread."""
    return dist.TCPStore("127.0.0.1", port, timeout=CONTROL_TIMEOUT)


def _call_of(collective: str, rank: int, world_size: int, count: int):
    """A function that runs one ``collective`` over buffers of ``count`` float32 elements
    made once here (so a loop of calls allocates nothing)."""
    data = np.full(count, rank + 1, dtype=np.float32)
    if collective == "allreduce":
        return lambda: dist.all_reduce(data)
    if collective == "broadcast":
        return lambda: dist.broadcast(data, src=0)
    if collective == "all_gather":
        outputs = [np.empty_like(data) for _ in range(world_size)]
        return lambda: dist.all_gather(outputs, data)
    raise ValueError(f"unknown collective {collective!r}")


def _failure(exc: BaseException) -> dict:
    """What the test checks of an exception: type, the classes it derives from, text and
    when it reached this rank."""
    return {
        "error": type(exc).__name__,
        "bases": [cls.__name__ for cls in type(exc).__mro__],
        "message": str(exc),
        "at": time.monotonic(),
    }


def _act_on_signal(control: dist.TCPStore, fault: str) -> None:
    """The victim's own faults: waits for the test's ``act``, records the time, then
    exits at once (``exit``) or closes its connections by destroying the group
    (``close``) and stays alive until the test says the case is over."""
    control.wait(["act"])
    control.set("fault_at", repr(time.monotonic()))
    if fault == "exit":
        os._exit(3)
    dist.destroy_process_group()
    control.set("closed", "1")
    control.wait(["finished"], timedelta(seconds=30))


def _report_and_wait_for_the_others(control: dist.TCPStore, rank: int, result: dict, survivors: int) -> dict:
    """Publishes this rank's outcome as ``outcome/<rank>`` (so that the test can tell,
    should a rank hang, which ranks got what), then keeps this rank and its connections
    alive until every one of the ``survivors`` has its outcome, so that no rank fails
    because another survivor left. Returns ``result``."""
    control.set(f"outcome/{rank}", json.dumps(result))
    if control.add("outcomes", 1) == survivors:
        control.set("all-outcomes", "1")
    control.wait(["all-outcomes"])
    return result


def _start_exit_watcher(control_port: int) -> None:
    """For ``exit`` faults in the middle of collectives: a thread, with its own control
    client, that ends the process when the test sets ``act`` while the main thread runs
    collectives."""
    control = _control(control_port)

    def watch() -> None:
        control.wait(["act"])
        control.set("fault_at", repr(time.monotonic()))
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def collective_under_fault(
    rank: int,
    world_size: int,
    *,
    collective: str,
    point: str,
    fault: str,
    victim: int,
    count: int,
    group_timeout_s: float,
    control_port: int,
) -> dict:
    """One rank of a job whose rank ``victim`` fails at ``point``:

    - ``before``: the others are inside ``collective``, the victim has not entered it;
    - ``during``: every rank runs ``collective`` in a loop;
    - ``between``: every rank finished one call, nobody is in the next one.

    ``fault`` is ``kill`` (the test sends SIGKILL), ``exit`` (the victim ends its process
    when the test sets ``act``) or ``close`` (the victim destroys its group then). The
    others return the failure of the call that was pending or came next, then the
    failure of one more call, which must fail as well.
    """
    dist.init_process_group("gloo", timeout=timedelta(seconds=group_timeout_s))
    control = _control(control_port)
    call = _call_of(collective, rank, world_size, count)
    call()  # every rank is connected and has run one call
    control.set(f"ready/{rank}", str(os.getpid()))
    if rank == victim:
        if fault == "exit" and point == "during":
            _start_exit_watcher(control_port)
        elif fault != "kill":
            _act_on_signal(control, fault)
            return {"victim": True}
        if point != "during":
            time.sleep(LOOP_LIMIT_S)  # killed long before
            return {"victim": True}
    if point == "between":
        control.wait(["go"])
    control.set(f"inside/{rank}", "1")
    calls = 0
    stop = time.monotonic() + LOOP_LIMIT_S
    try:
        call()
        calls += 1
        while point == "during" and time.monotonic() < stop:
            call()
            calls += 1
    except Exception as exc:  # noqa: BLE001 - the failure under test, reported to the test
        first = _failure(exc)
    else:
        first = None
    after = None
    if first is not None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001
            after = _failure(exc)
    return _report_and_wait_for_the_others(control, rank, {"calls": calls, "first": first, "next": after},
                                           world_size - 1)


def frozen_peer(
    rank: int,
    world_size: int,
    *,
    collective: str,
    victim: int,
    group_timeout_s: float,
    control_port: int,
) -> dict:
    """One rank of a job whose rank ``victim`` is stopped (SIGSTOP) by the test after the
    first call: the others enter a second call and must time out naming the victim."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=group_timeout_s))
    control = _control(control_port)
    call = _call_of(collective, rank, world_size, 1024)
    call()
    control.set(f"ready/{rank}", str(os.getpid()))
    if rank == victim:
        control.wait(["finished"])  # frozen here, then killed
        return {"victim": True}
    control.wait(["go"])  # the victim is stopped now
    started = time.monotonic()
    try:
        call()
        result = {"error": None}
    except Exception as exc:  # noqa: BLE001 - the failure under test
        result = _failure(exc)
        result["elapsed"] = result["at"] - started
    return _report_and_wait_for_the_others(control, rank, result, world_size - 1)


# Each mismatch case: the calls of rank 0 and rank 1 as
# (collective, dtype, count, reduce op or root), and the two fragments of text that tell
# the calls apart, which every rank's error must show.
MISMATCHES = {
    "collective": (("allreduce", "float32", 16, "SUM"), ("broadcast", "float32", 16, 0),
                   ("allreduce(seq=", "broadcast(seq=")),
    "reduce_op": (("allreduce", "float32", 16, "SUM"), ("allreduce", "float32", 16, "MAX"),
                  ("op=SUM", "op=MAX")),
    "dtype": (("allreduce", "float32", 16, "SUM"), ("allreduce", "int32", 16, "SUM"),
              ("dtype=float32", "dtype=int32")),
    "count": (("allreduce", "float32", 16, "SUM"), ("allreduce", "float32", 17, "SUM"),
              ("count=16", "count=17")),
    "count_large": (("allreduce", "float32", 1 << 18, "SUM"), ("allreduce", "float32", (1 << 18) + 64, "SUM"),
                    (f"count={1 << 18}", f"count={(1 << 18) + 64}")),
    "broadcast_root": (("broadcast", "float32", 1024, 0), ("broadcast", "float32", 1024, 1),
                       ("root=0", "root=1")),
    "reduce_root": (("reduce", "float32", 1024, 0), ("reduce", "float32", 1024, 1),
                    ("root=0", "root=1")),
}


def _mismatch_call(collective: str, dtype: str, count: int, arg) -> None:
    data = np.ones(count, dtype=dtype)
    if collective == "allreduce":
        dist.all_reduce(data, op=getattr(dist.ReduceOp, arg))
    elif collective == "broadcast":
        dist.broadcast(data, src=arg)
    elif collective == "reduce":
        dist.reduce(data, dst=arg)
    else:
        raise ValueError(f"unknown collective {collective!r}")


def mismatch_matrix(rank: int, world_size: int, *, cases: list[str], group_timeout_s: float,
                    control_port: int) -> dict:
    """Runs each case of MISMATCHES in a fresh group over a store this job hosts on rank 0
    at MASTER_PORT (one group per case: a mismatch leaves its group unusable). Returns,
    per case, the failure of this rank's call, or of the barrier after it when the call
    itself returned (``at_next_call``)."""
    port = int(os.environ["MASTER_PORT"])
    timeout = timedelta(seconds=group_timeout_s)
    store = dist.TCPStore("127.0.0.1", port, world_size=world_size, is_master=rank == 0, timeout=timeout)
    results = {}
    for case in cases:
        dist.init_process_group("gloo", store=dist.PrefixStore(case, store), rank=rank, world_size=world_size,
                                timeout=timeout)
        started = time.monotonic()
        try:
            _mismatch_call(*MISMATCHES[case][rank])
        except Exception as exc:  # noqa: BLE001 - the failure under test
            results[case] = _failure(exc)
            results[case]["elapsed"] = results[case]["at"] - started
            results[case]["at_next_call"] = False
        else:
            # The call returned: the mismatch must then surface in the next call.
            try:
                dist.barrier()
            except Exception as exc:  # noqa: BLE001 - the failure under test
                results[case] = _failure(exc)
                results[case]["elapsed"] = results[case]["at"] - started
                results[case]["at_next_call"] = True
            else:
                results[case] = {"error": None}
        dist.destroy_process_group()
    # The host of the store leaves last, so that nobody loses it in the middle of a case.
    control = _control(control_port)
    if control.add("finished", 1) == world_size:
        control.set("all-finished", "1")
    if rank == 0:
        control.wait(["all-finished"])
    return results


def _launched_worker() -> None:
    """Worker of the launcher test: report the pid, then run large allreduces until one
    fails; the failure ends the process with a traceback and a non-zero status."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    control = _control(int(os.environ["FAULT_CONTROL_PORT"]))
    data = np.ones(LARGE_COUNT, dtype=np.float32)
    dist.all_reduce(data)
    control.set(f"ready/{rank}", str(os.getpid()))
    stop = time.monotonic() + LOOP_LIMIT_S
    while time.monotonic() < stop:
        dist.all_reduce(data)


if __name__ == "__main__":
    _launched_worker()
