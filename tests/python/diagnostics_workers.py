"""Functions run by harness.run_world for test_diagnostics.py, in each rank's process.

Each joins the default group through the TCPStore the test hosts (at ``port``) and
returns a JSON-able summary. Buffers are array.array, so no rank imports torch.
"""

from __future__ import annotations

import threading
import time
from array import array
from datetime import timedelta

import ringtree as dist


def _init(rank: int, world_size: int, port: int, timeout_s: float) -> dist.TCPStore:
    store = dist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    return store


def record_and_dump(rank: int, world_size: int, port: int, directory: str) -> dict:
    """Three collectives, then dump_flight_recorder (returned, and written to
    ``directory/dump_<rank>.json``), then destroy_process_group (which writes into
    RINGTREE_FLIGHT_RECORDER_DIR)."""
    _init(rank, world_size, port, 30)
    data = array("f", [float(rank + 1)] * 4)
    dist.all_reduce(data)
    dist.broadcast(data, src=1)
    dist.barrier()
    entries = dist.dump_flight_recorder(path=f"{directory}/dump_{rank}.json")
    dist.destroy_process_group()
    return {"entries": entries, "result": list(data)}


def skip_the_last_call(rank: int, world_size: int, port: int, timeout_s: float) -> dict:
    """all_reduce, barrier, all_reduce; the last rank skips the last all_reduce and stays
    connected until the others timed out. Returns the others' errors and how long
    destroy_process_group took after the failure."""
    store = _init(rank, world_size, port, timeout_s)
    data = array("f", [1.0] * 4)
    dist.all_reduce(data)
    dist.barrier()
    result: dict = {}
    if rank == world_size - 1:
        store.wait([f"failed/{r}" for r in range(world_size - 1)], timedelta(seconds=30))
    else:
        try:
            dist.all_reduce(data)
        except dist.DistError as exc:
            result.update(error=type(exc).__name__, message=str(exc))
        store.set(f"failed/{rank}", b"1")
    start = time.monotonic()
    dist.destroy_process_group()
    result["destroy_s"] = time.monotonic() - start
    return result


def abort_and_init_again(rank: int, world_size: int, port: int) -> dict:
    """Rank 0 aborts its group while another thread of it is blocked in an all_reduce that
    rank 1 never joins; rank 1 then sees rank 0 gone and destroys its group. Both init a
    new group and use it, then abort it with ProcessGroup.abort()."""
    store = _init(rank, world_size, port, 30)
    data = array("f", [1.0] * 4)
    dist.all_reduce(data)
    result: dict = {}
    if rank == 0:
        failure: dict = {}

        def blocked() -> None:
            try:
                dist.all_reduce(data)
            except Exception as exc:  # noqa: BLE001 - reported to the test
                failure.update(error=type(exc).__name__, message=str(exc), at=time.monotonic())

        thread = threading.Thread(target=blocked)
        thread.start()
        time.sleep(0.5)
        aborted_at = time.monotonic()
        dist.abort_process_group()
        result["abort_s"] = time.monotonic() - aborted_at
        thread.join(10)
        if "at" in failure:
            failure["after_abort_s"] = failure.pop("at") - aborted_at
        result["failure"] = failure
        result["initialized_after_abort"] = dist.is_initialized()
        store.set("aborted", b"1")
    else:
        store.wait(["aborted"], timedelta(seconds=30))
        try:  # over shared memory the first call may still complete: rank 0 had done its part
            dist.all_reduce(data)
            dist.barrier()
        except dist.DistError as exc:
            result["peer_error"] = type(exc).__name__
        start = time.monotonic()
        dist.destroy_process_group()
        result["destroy_s"] = time.monotonic() - start

    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=30))
    again = array("f", [float(rank + 1)] * 4)
    dist.all_reduce(again)
    result["after"] = list(again)
    dist.barrier()
    dist.group.WORLD.abort()
    try:
        dist.all_reduce(again)
    except dist.DistBackendError as exc:
        result["after_abort_error"] = str(exc)
    result["recorded_after_abort"] = [e["collective"] for e in dist.dump_flight_recorder()]
    dist.destroy_process_group()
    return result
