"""Functions run by harness.run_world in each rank's process (see harness.py)."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import ringtree


def _exchange(rank: int, world_size: int) -> list[str]:
    """Every rank publishes a value and reads everyone's: proves the ranks share a store."""
    pg = ringtree.group.WORLD
    pg.store.set(f"value/{rank}", f"from-{rank}")
    return [pg.store.get(f"value/{r}").decode() for r in range(world_size)]


def init_and_exchange(rank: int, world_size: int, method: str, port: int = 0, path: str = "") -> dict:
    timeout = timedelta(seconds=20)
    if method == "env":
        ringtree.init_process_group("gloo", timeout=timeout)
    elif method == "tcp":
        ringtree.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world_size, timeout=timeout)
    elif method == "file":
        ringtree.init_process_group("gloo", init_method=f"file://{path}", rank=rank,
                                    world_size=world_size, timeout=timeout)
    elif method == "store-tcp":
        store = ringtree.TCPStore("127.0.0.1", port, timeout=timeout)
        ringtree.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    elif method == "store-file":
        store = ringtree.FileStore(path, world_size)
        ringtree.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    else:
        raise ValueError(method)
    result = {
        "rank": ringtree.get_rank(),
        "world_size": ringtree.get_world_size(),
        "backend": ringtree.get_backend(),
        "initialized": ringtree.is_initialized(),
        "values": _exchange(rank, world_size),
    }
    ringtree._store_barrier()
    ringtree._store_barrier()
    ringtree.destroy_process_group()
    result["initialized_after"] = ringtree.is_initialized()
    return result


def host_leaves_first(rank: int, world_size: int) -> dict:
    """Rank 0 (hosting the store) finishes at once; the others keep using the store."""
    ringtree.init_process_group("gloo", timeout=timedelta(seconds=20))
    pg = ringtree.group.WORLD
    if rank == 0:
        pg.store.set("from-host", "hello")
        ringtree.destroy_process_group()
        return {"left_at": time.time()}
    pg.store.wait(["from-host"])
    time.sleep(1.0)  # rank 0 has called destroy and is exiting meanwhile
    value = pg.store.get("from-host").decode()
    total = pg.store.add("late", 1)
    ringtree.destroy_process_group()
    return {"value": value, "late": total, "done_at": time.time()}


def get_missing_key(rank: int, world_size: int, timeout_ms: int) -> dict:
    ringtree.init_process_group("gloo", timeout=timedelta(milliseconds=timeout_ms))
    start = time.monotonic()
    try:
        ringtree.group.WORLD.store.get("never-set")
    except ringtree.DistStoreError as exc:
        return {"elapsed": time.monotonic() - start, "message": str(exc)}
    finally:
        ringtree.destroy_process_group()
    return {"elapsed": None}


def env_snapshot(rank: int, world_size: int) -> dict:
    return {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}


def algorithm_choice(rank: int, world_size: int, port: int) -> dict:
    """Each collective with every algorithm it implements, chosen per call; a wrong one
    raises ValueError before any data moves."""
    from array import array

    store = ringtree.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=20))
    ringtree.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=20))
    results = {}
    for algorithm in ("ring", "tree", "halving_doubling", "shm_direct"):
        data = array("d", [rank + 1.0] * 1000)
        ringtree.all_reduce(data, algorithm=algorithm)
        results[f"all_reduce/{algorithm}"] = data[0] == world_size * (world_size + 1) / 2
    for algorithm in ("tree", "chain", "shm_direct"):
        data = array("d", [float(rank)] * 1000)
        ringtree.broadcast(data, src=world_size - 1, algorithm=algorithm)
        results[f"broadcast/{algorithm}"] = data[999] == world_size - 1
    for algorithm in ("tree", "ring"):
        data = array("d", [rank + 1.0] * 1000)
        ringtree.reduce(data, dst=0, algorithm=algorithm)
        results[f"reduce/{algorithm}"] = data[0] == (world_size * (world_size + 1) / 2 if rank == 0 else rank + 1.0)
    errors = []
    for call in (lambda d: ringtree.all_reduce(d, algorithm="chain"),
                 lambda d: ringtree.reduce(d, dst=0, algorithm="nonsense"),
                 lambda d: ringtree.broadcast(d, src=0, algorithm="ring")):
        data = array("d", [1.0])
        try:
            call(data)
        except ValueError as exc:
            errors.append(str(exc))
    ringtree.barrier()  # nothing was sent by the refused calls: the group still works
    ringtree.destroy_process_group()
    return {"results": results, "errors": errors}


def work_results_and_futures(rank: int, world_size: int, port: int) -> dict:
    """Work.result() / get_future() / synchronize() for async collectives and p2p at 2
    ranks; returns what failed (empty when everything held)."""
    import torch

    store = ringtree.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=20))
    ringtree.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=20))
    peer = 1 - rank
    failures = []

    def check(name, condition):
        if not condition:
            failures.append(name)

    # The future completes without wait(): DDP only ever waits on the future.
    t = torch.full((4,), float(rank + 1))
    work = ringtree.all_reduce(t, async_op=True)
    future = work.get_future()
    check("get_future returns one Future", work.get_future() is future)
    deadline = time.monotonic() + 10
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    check("completed without wait()", future.done())
    value = future.wait()
    check("all_reduce value is [tensor]", len(value) == 1 and value[0] is t and t.tolist() == [3.0] * 4)
    check("result() is the same list", work.result() == [t] and work.result()[0] is t)
    check("synchronize() returns None", work.synchronize() is None)
    check("then() chains", ringtree.all_reduce(torch.ones(2), async_op=True).get_future()
          .then(lambda f: f.value()[0] * 2).wait().tolist() == [4.0, 4.0])

    outs = [torch.zeros(2) for _ in range(world_size)]
    work = ringtree.all_gather(outs, torch.full((2,), float(rank)), async_op=True)
    work.wait()
    check("all_gather result is the output list", work.result() == outs and work.result()[1] is outs[1])
    gather_list = [torch.zeros(1) for _ in range(world_size)] if rank == 0 else None
    work = ringtree.gather(torch.ones(1), gather_list, dst=0, async_op=True)
    check("gather value", work.get_future().wait() == (gather_list if rank == 0 else []))
    check("barrier value is []", ringtree.barrier(async_op=True).get_future().wait() == [])
    single = torch.zeros(2)
    work = ringtree.all_to_all_single(single, torch.ones(2), async_op=True)
    check("all_to_all_single value is [output]", work.get_future().wait()[0] is single)
    check("sync call returns None", ringtree.all_reduce(torch.ones(1)) is None)

    # Point-to-point: supported (gloo raises "not implemented" for both).
    received = torch.zeros(3)
    if rank == 0:
        pending = ringtree.irecv(received, peer)
        try:
            pending.result()
            check("result() before completion raises", False)
        except RuntimeError as exc:
            check("result() message", "Work needs to be completed before calling result()" in str(exc))
        ringtree.barrier()
        check("irecv future value", pending.get_future().wait()[0] is received and received.tolist() == [7.0] * 3)
    else:
        ringtree.barrier()
        sent = torch.full((3,), 7.0)
        check("isend future value", ringtree.isend(sent, peer).get_future().wait()[0] is sent)
    ops = [ringtree.P2POp(ringtree.isend, torch.ones(1), peer), ringtree.P2POp(ringtree.irecv, torch.zeros(1), peer)]
    works = ringtree.batch_isend_irecv(ops)
    check("batch works carry their tensors",
          [w.get_future().wait()[0] for w in works] == [op.tensor for op in ops])

    # A failed operation fails its future with the operation's error.
    if rank == 0:
        work = ringtree.irecv(torch.zeros(5), peer, tag=9)  # the peer sends 2 elements
        try:
            work.get_future().wait()
            check("failed future raises", False)
        except Exception as exc:  # noqa: BLE001 - the type is checked
            check(f"failed future raises the mismatch ({type(exc).__name__})",
                  isinstance(exc, ringtree.CollectiveMismatchError) or "CollectiveMismatchError" in repr(exc))
            check("work.exception() is set", work.exception() is not None)
    else:
        try:
            ringtree.isend(torch.zeros(2), peer, tag=9).wait()
        except ringtree.CollectiveMismatchError:
            pass
    ringtree.destroy_process_group()
    return {"failures": failures}


def file_init_all_reduce(rank: int, world_size: int, path: str, crash: bool) -> float:
    """Rendezvous through file://PATH, all_reduce, then either finish (destroying the group)
    or crash: report the result and exit at once, leaving the rendezvous file behind."""
    import sys

    import numpy as np

    import harness

    ringtree.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=20))
    data = np.full(4, rank + 1, dtype=np.float32)
    ringtree.all_reduce(data)
    if crash:
        ringtree.barrier()  # every rank has its result before any of them dies
        print(harness.RESULT_PREFIX + '{"ok": %r}' % float(data[0]), flush=True)
        sys.stderr.flush()
        os._exit(1)
    ringtree.destroy_process_group()
    return float(data[0])


def store_host_killed(rank: int, world_size: int, phase: str) -> dict:
    """env:// job whose rank 0 hosts the TCPStore; rank 0 is SIGKILLed 0.3 s after the
    first all_reduce while the others are in `phase`: "store" (blocked in a store get) or
    "collective" (all_reduce in a loop). The others report how long their error took."""
    import signal

    import numpy as np

    import harness

    ringtree.init_process_group("gloo", timeout=timedelta(seconds=20))
    data = np.ones(1024, dtype=np.float32)
    ringtree.all_reduce(data)
    if rank == 0:
        print(harness.RESULT_PREFIX + '{"ok": {"killed": true}}', flush=True)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        if phase == "store":
            ringtree.group.WORLD.store.get("never-set")
        else:
            while True:
                ringtree.all_reduce(data)
    except ringtree.DistNetworkError as exc:
        return {"seconds": time.monotonic() - start, "message": str(exc)}
    return {"seconds": time.monotonic() - start, "message": None}


def job_that_lingers(rank: int, world_size: int, lingering: list[int]) -> None:
    """env:// job (rank 0 hosts the TCPStore): init, all_reduce, then ranks in `lingering`
    print their result and stay (a hung or slow-to-exit process of an earlier job; the
    test kills them), the others print theirs and crash."""
    import sys

    import numpy as np

    import harness

    ringtree.init_process_group("gloo", timeout=timedelta(seconds=20))
    ringtree.all_reduce(np.ones(4, dtype=np.float32))
    ringtree.barrier()  # every rank is done with the job before any of them dies
    print(harness.RESULT_PREFIX + '{"ok": {"pid": %d}}' % os.getpid(), flush=True)
    if rank not in lingering:
        sys.stderr.flush()
        os._exit(1)
    time.sleep(120)


def timed_env_init(rank: int, world_size: int) -> dict:
    """env:// init (20 s timeout): how long it took and how it failed, if it did."""
    start = time.monotonic()
    try:
        ringtree.init_process_group("gloo", timeout=timedelta(seconds=20))
    except ringtree.DistError as exc:
        return {"seconds": time.monotonic() - start, "error": type(exc).__name__, "message": str(exc)}
    ringtree.destroy_process_group()
    return {"seconds": time.monotonic() - start, "error": None, "message": ""}


def threads_share_the_gil(rank: int, world_size: int, port: int) -> dict:
    """Three Python threads per rank at once: small all_reduces (which keep the GIL until
    they wait), isend/irecv with futures and a 1 MiB blocking exchange now and then (small
    posts keep it too; large calls release it at once), and pure Python code. Every thread
    must finish, with correct data: no call holds the GIL while another rank's progress, or
    this process's other threads, need it."""
    import threading

    import torch

    store = ringtree.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=20))
    ringtree.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=20))
    peer = 1 - rank
    errors: list[str] = []
    counts = {"all_reduce": 0, "exchanges": 0, "python": 0}

    def collectives() -> None:
        t = torch.ones(4)
        for _ in range(5000):
            t.fill_(1.0)
            ringtree.all_reduce(t)
            if t[0].item() != 2.0:
                errors.append(f"all_reduce gave {t[0].item()}")
                return
            counts["all_reduce"] += 1

    def point_to_point() -> None:
        mine, theirs = torch.full((8,), float(rank)), torch.zeros(8)
        big = torch.full((1 << 18,), float(rank))
        for i in range(2000):
            sent = ringtree.isend(mine, peer, tag=9)
            received = ringtree.irecv(theirs, peer, tag=9)
            future = received.get_future()
            sent.wait()
            received.wait()
            future.wait()
            if theirs[0].item() != float(peer):
                errors.append(f"irecv gave {theirs[0].item()}")
                return
            if i % 250 == 0:
                if rank == 0:
                    ringtree.send(big, peer, tag=11)
                else:
                    ringtree.recv(big, peer, tag=11)
            counts["exchanges"] += 1

    def python_only() -> None:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            counts["python"] += 1

    def guarded(body):  # noqa: ANN001, ANN202
        def run() -> None:
            try:
                body()
            except Exception as e:  # noqa: BLE001 - reported to the test
                errors.append(repr(e))
        return run

    threads = [threading.Thread(target=guarded(body)) for body in (collectives, point_to_point, python_only)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    hung = [name for name, thread in zip(("collectives", "point_to_point", "python"), threads) if thread.is_alive()]
    if not hung:
        ringtree.destroy_process_group()
    return {"errors": errors, "hung": hung, "counts": counts}
