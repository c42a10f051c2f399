"""Started by test_mpi_backend.py under ``mpirun -n 2``: one behaviour of the MPI backend
per mode (argv[1]); each prints "<mode>: ok" on every rank that checks something.

- progress: an async all_reduce completes its Future with nobody calling wait (the
  progress thread); wait(timeout) raises DistTimeoutError while the peer is late, and
  the operation still completes after; algorithm= is refused.
- barrier-timeout: barrier(timeout=1 s) raises DistTimeoutError on rank 0 while rank 1
  is late; the barrier stays pending in MPI, rank 1's barrier later matches it, and the
  next collective works on both.
- kill: rank 1 kills itself (SIGKILL) while rank 0 waits in an all_reduce.
- hang: rank 1 never enters the all_reduce; the group timeout (3 s) ends the job.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch

import ringtree as dist


def progress(rank: int) -> None:
    engine = dist.group.WORLD.engine
    # Synchronous all_reduce and broadcast take the C path until the first async collective.
    assert type(engine.allreduce).__name__ == "builtin_function_or_method" and engine._fast.enabled
    tensor = torch.full((3,), float(rank + 1))
    dist.all_reduce(tensor)
    dist.broadcast(tensor, src=1)
    assert tensor.tolist() == [3.0] * 3 and engine._fast.enabled
    done = threading.Event()
    tensor = torch.full((1000,), float(rank + 1))
    work = dist.all_reduce(tensor, async_op=True)
    assert not engine._fast.enabled  # the group has a worker now: the ordered Python path
    future = work.get_future()
    future.add_done_callback(lambda _: done.set())
    assert done.wait(30), "the Future was not completed without wait()"
    assert future.value()[0] is tensor and tensor[0].item() == 3.0
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert work.result()[0] is tensor

    if rank == 0:
        late = torch.ones(4)
        work = dist.all_reduce(late, async_op=True)
        started = time.monotonic()
        try:
            work.wait(timeout=timedelta(milliseconds=300))
        except dist.DistTimeoutError as exc:
            assert "all_reduce" in str(exc) and "rank 0" in str(exc), exc
            assert time.monotonic() - started < 5
        else:
            raise AssertionError("wait(timeout) did not time out")
        assert work.wait() and late.tolist() == [2.0] * 4  # once rank 1 arrives
    else:
        time.sleep(1.5)
        dist.all_reduce(torch.ones(4))

    # Ranks may differ in async_op on the same call, as with ringtree's own engine.
    mixed = torch.full((5,), float(rank))
    if rank == 0:
        work = dist.all_reduce(mixed, async_op=True)
        dist.broadcast(torch.zeros(1), src=1)  # queued behind the all_reduce, in order
        work.wait()
    else:
        dist.all_reduce(mixed)
        dist.broadcast(torch.zeros(1), src=1, async_op=True).wait()
    assert mixed.tolist() == [1.0] * 5, mixed

    try:
        dist.all_reduce(torch.ones(2), algorithm="ring")
    except ValueError as exc:
        assert "backend 'mpi' runs the MPI library's" in str(exc), exc
    else:
        raise AssertionError("algorithm= was accepted")
    print("progress: ok", flush=True)


def barrier_timeout(rank: int) -> None:
    if rank == 0:
        started = time.monotonic()
        try:
            dist.barrier(timeout=timedelta(seconds=1))
        except dist.DistTimeoutError as exc:
            elapsed = time.monotonic() - started
            assert 1 <= elapsed < 6, elapsed
            assert "barrier" in str(exc) and "timed out after" in str(exc), exc
        else:
            raise AssertionError("barrier(timeout) returned while rank 1 was late")
    else:
        time.sleep(3)
        dist.barrier()  # matches rank 0's barrier, still pending in MPI
    # The next collective, in the same order on both ranks, completes after it.
    tensor = torch.ones(2)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [2.0, 2.0]
    print("barrier-timeout: ok", flush=True)


def kill(rank: int) -> None:
    dist.all_reduce(torch.ones(8))
    if rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1 << 20))
    raise AssertionError("the all_reduce returned although its peer was killed")


def hang(rank: int) -> None:
    if rank == 1:
        time.sleep(120)
    dist.all_reduce(torch.ones(4))
    raise AssertionError("the all_reduce returned although its peer never entered it")


def main() -> None:
    mode = sys.argv[1]
    timeout = timedelta(seconds=3) if mode == "hang" else timedelta(seconds=60)
    dist.init_process_group("mpi", timeout=timeout)
    {"progress": progress, "barrier-timeout": barrier_timeout, "kill": kill, "hang": hang}[mode](dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
