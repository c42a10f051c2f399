"""Worker functions of test_torch_backend.py: torch programs that use torch.distributed's
own API with backend "ringtree" (and, for comparison, "gloo"), one rank each. None of
them imports ringtree before init_process_group: the torch.backends entry point registers
the backend (some use ringtree's classes or helpers afterwards to check what they saw)."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=20)


def init_and_all_reduce(rank: int, world_size: int, method: str, port: int = 0, path: str = "",
                        backend: str = "ringtree") -> dict:
    """Joins through `method` (env, tcp, file, store-tcp, store-file), all_reduces, reports."""
    if method == "env":
        dist.init_process_group(backend, timeout=TIMEOUT)
    elif method == "tcp":
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=TIMEOUT)
    elif method == "file":
        dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world_size,
                                timeout=TIMEOUT)
    elif method == "store-tcp":
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=TIMEOUT)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=TIMEOUT)
    elif method == "store-file":
        store = dist.FileStore(path, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=TIMEOUT)
    else:
        raise ValueError(method)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    result = {
        "sum": t.tolist(),
        "backend": dist.get_backend(),
        "pg_type": type(dist.group.WORLD).__name__,
        "ringtree_imported_by_torch": "ringtree" in __import__("sys").modules,
    }
    dist.destroy_process_group()
    return result


def failure(rank: int, world_size: int, port: int, fault: str) -> dict:
    """2 ranks over tcp://: rank 1 causes `fault` (kill: dies mid-job; mismatch: calls
    broadcast where rank 0 calls all_reduce; timeout: skips rank 0's all_reduce), rank 0
    reports the exception's classes and text."""
    timeout = timedelta(seconds=2) if fault == "timeout" else TIMEOUT
    dist.init_process_group("ringtree", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timeout)
    t = torch.ones(8)
    dist.all_reduce(t)
    if rank == 1:
        if fault == "kill":
            import harness

            print(harness.RESULT_PREFIX + '{"ok": {}}', flush=True)
            os._exit(1)
        if fault == "mismatch":
            try:
                dist.broadcast(t, src=0)
            except Exception:  # noqa: BLE001 - rank 0 reports
                pass
        if fault == "timeout":
            time.sleep(4)
        return {}
    start = time.monotonic()
    try:
        if fault == "kill":
            time.sleep(0.3)
        dist.all_reduce(t)
    except Exception as exc:  # noqa: BLE001 - the outcome checked
        import ringtree

        return {
            "seconds": time.monotonic() - start,
            "message": str(exc),
            "classes": {
                "torch.DistBackendError": isinstance(exc, dist.DistBackendError),
                "torch.DistNetworkError": isinstance(exc, dist.DistNetworkError),
                "torch.DistError": isinstance(exc, dist.DistError),
                "ringtree.DistNetworkError": isinstance(exc, ringtree.DistNetworkError),
                "ringtree.DistTimeoutError": isinstance(exc, ringtree.DistTimeoutError),
                "ringtree.CollectiveMismatchError": isinstance(exc, ringtree.CollectiveMismatchError),
                "TimeoutError": isinstance(exc, TimeoutError),
                "ValueError": isinstance(exc, ValueError),
                "ConnectionError": isinstance(exc, ConnectionError),
            },
        }
    return {"seconds": time.monotonic() - start, "message": None, "classes": {}}


def per_call_timeout(rank: int, world_size: int, port: int) -> dict:
    """2 ranks, group timeout 60 s: rank 1 skips two calls; rank 0 makes them through the
    group's backend with ``opts.timeout`` 500 ms (an asynchronous broadcast from rank 1,
    then a synchronous all_reduce) and reports how long each took to fail, and how."""
    dist.init_process_group("ringtree", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=TIMEOUT)
    t = torch.ones(8)
    dist.all_reduce(t)
    if rank == 1:
        time.sleep(4)
        return {}
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    outcomes = []
    for name in ("broadcast", "allreduce"):
        opts = dist.AllreduceOptions() if name == "allreduce" else dist.BroadcastOptions()
        opts.timeout = timedelta(milliseconds=500)
        if name == "broadcast":
            opts.asyncOp, opts.rootRank = True, 1  # rank 0 waits for rank 1's data
        start = time.monotonic()
        try:
            getattr(backend, name)([t], opts).wait()
        except Exception as exc:  # noqa: BLE001 - the outcome checked
            outcomes.append([time.monotonic() - start, type(exc).__name__, str(exc),
                             isinstance(exc, dist.DistError)])
        else:
            outcomes.append([time.monotonic() - start, None, None, False])
    return {"outcomes": outcomes}


def monitored_barrier(rank: int, world_size: int, port: int) -> dict:
    """group.monitored_barrier() on the ringtree group: passes when every rank comes; then
    the last rank stays away and rank 0 names it; timeout 0 is rank 0's own timeout."""
    dist.init_process_group("ringtree", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=TIMEOUT)
    group = dist.group.WORLD
    group.monitored_barrier(timedelta(seconds=10))
    result = {"passed": True, "refused_by_torch": None, "missing": None, "own_timeout": None}
    try:
        dist.monitored_barrier()
    except ValueError as error:
        result["refused_by_torch"] = str(error)
    if rank == 0:
        for key, timeout in (("missing", timedelta(seconds=1)), ("own_timeout", timedelta(0))):
            try:
                group.monitored_barrier(timeout)
            except RuntimeError as error:
                result[key] = [type(error).__name__, str(error)]
    elif rank != world_size - 1:
        try:
            group.monitored_barrier(timedelta(seconds=10))
        except RuntimeError as error:
            result["missing"] = [type(error).__name__, str(error)]
    dist.barrier()
    dist.destroy_process_group()
    return result


def sparse_all_reduce(rank: int, world_size: int, port: int, backend: str) -> dict:
    """Sparse COO all_reduce: overlapping indices, a dense dimension, a rank with no
    non-zeros, async; then the errors (an op other than SUM, shapes that differ)."""
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=TIMEOUT)
    results = {}
    indices = torch.tensor([[rank, 3, 5][: 3 - rank % 3], [0, 1, 2][: 3 - rank % 3]])
    values = torch.arange(1.0, 1.0 + indices.shape[1] * 2).reshape(-1, 2) * (rank + 1)
    t = torch.sparse_coo_tensor(indices, values, (6, 4, 2))
    dist.all_reduce(t)
    results["dense"] = t.to_dense().tolist()
    empty = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros(0), (5,))
    mine = empty if rank == 0 else torch.sparse_coo_tensor(torch.tensor([[rank]]), torch.tensor([2.0]), (5,))
    work = dist.all_reduce(mine, async_op=True)
    work.wait()
    results["async"] = mine.to_dense().tolist()
    if backend == "ringtree":
        try:
            dist.all_reduce(torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (3,)), dist.ReduceOp.MAX)
        except ValueError as error:
            results["max"] = str(error)
        shape = (4,) if rank == 0 else (5, 2)
        try:
            values = torch.tensor([1.0]) if rank == 0 else torch.tensor([[1.0, 2.0]])
            dist.all_reduce(torch.sparse_coo_tensor(torch.tensor([[0]]), values, shape))
        except ValueError as error:
            results["shapes"] = str(error)
        try:
            dist.broadcast(torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (3,)), 0)
        except ValueError as error:
            results["broadcast"] = str(error)
    dist.barrier()
    dist.destroy_process_group()
    return results


def shared_connections(rank: int, world_size: int, port: int) -> dict:
    """Groups of the "ringtree" backend run over the world's connections: a DeviceMesh of
    2 x 2, new_group and new_subgroups open no socket; the mesh's two dimensions and the
    world run all_reduces at once from three threads; a mismatch in one group fails that
    group's ranks alone."""
    import threading

    from torch.distributed.device_mesh import init_device_mesh

    from ringtree.bench.scale import open_sockets as sockets

    dist.init_process_group("ringtree", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=TIMEOUT)
    dist.barrier()
    before = sockets()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    pair = dist.new_group([0, 3])
    mine, _ = dist.new_subgroups(group_size=2)
    after = sockets()
    dims = {name: mesh.get_group(name) for name in ("dp", "tp")}
    ok: dict = {}

    def loop(name, group):
        ranks = dist.get_process_group_ranks(group)
        good = True
        for r in range(6):
            t = torch.full((1 << 18,), float(rank + r))
            dist.all_reduce(t, group=group)
            good = good and bool((t == float(sum(x + r for x in ranks))).all())
        ok[name] = good

    threads = [threading.Thread(target=loop, args=(name, group)) for name, group in dims.items()]
    threads.append(threading.Thread(target=loop, args=("world", dist.group.WORLD)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mismatch = None
    if rank in (0, 3):
        t = torch.ones(8)
        try:
            if rank == 0:
                dist.all_reduce(t, group=pair)
            else:
                dist.broadcast(t, src=0, group=pair)
        except Exception as exc:  # noqa: BLE001 - reported
            mismatch = {"torch_class": isinstance(exc, dist.DistBackendError), "message": str(exc)}
    t = torch.ones(4)
    dist.all_reduce(t)
    s = torch.ones(4)
    dist.all_reduce(s, group=mine)
    dist.destroy_process_group()
    return {"before": before, "after": after, "concurrent": ok, "mismatch": mismatch, "world": t.tolist(),
            "subgroup": s.tolist()}
