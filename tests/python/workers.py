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
