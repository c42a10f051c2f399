"""Started by test_mpi_backend.py under ``mpirun -n 2``: one behaviour of the MPI backend
per mode (argv[1]); each prints "<mode>: ok" on every rank that checks something.

- progress: an async all_reduce completes its Future with nobody calling wait (the
  progress thread); wait(timeout) raises DistTimeoutError while the peer is late, and
  the operation still completes after; algorithm= is refused.
- p2p: isend/irecv works (_C._MpiRequestWork): a dropped isend still delivers, an
  irecv's Future completes without wait, wait(timeout) raises DistTimeoutError while the
  peer is late and the receive completes after, any-source receives name the sender, two
  threads may wait on one work, an MPI error (a truncated message) is raised by wait()
  naming the call, bad arguments are refused, a destroyed group refuses calls.
- barrier-timeout: barrier(timeout=1 s) raises DistTimeoutError on rank 0 while rank 1
  is late; the barrier stays pending in MPI, rank 1's barrier later matches it, and the
  next collective works on both.
- kill: rank 1 kills itself (SIGKILL) while rank 0 waits in an all_reduce.
- hang: rank 1 never enters the all_reduce; the group timeout (3 s) ends the job.
- hang-irecv: rank 0 waits on an irecv rank 1 never matches; the group timeout ends the job.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import numpy as np
import torch

import ringtree as dist
from ringtree import _C


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


def expect(error: type[BaseException], text: str, call, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except error as exc:
        assert text in str(exc), exc
    else:
        raise AssertionError(f"{call} did not raise {error.__name__}")


def p2p(rank: int) -> None:
    peer = 1 - rank
    # A dropped isend: the progress thread keeps the request and the tensor until MPI is done.
    if rank == 0:
        work = dist.isend(torch.full((1000,), 7.0), 1)
        assert type(work).__name__ == "_MpiRequestWork", type(work)
        del work
        gc.collect()
    else:
        time.sleep(0.3)
        received = torch.zeros(1000)
        dist.recv(received, 0)
        assert received.eq(7.0).all(), received

    # An irecv's Future completes with nobody calling wait.
    if rank == 0:
        done = threading.Event()
        tensor = torch.zeros(3, dtype=torch.int64)
        work = dist.irecv(tensor, 1, tag=2)
        future = work.get_future()
        assert work.get_future() is future
        future.add_done_callback(lambda _: done.set())
        assert done.wait(30), "the irecv's Future was not completed without wait()"
        assert future.value()[0] is tensor and tensor.tolist() == [5, 5, 5], tensor
        assert work.is_completed() and work.is_success() and work.exception() is None
        assert work.source_rank() == 1 and work.result()[0] is tensor
        assert "completed" in repr(work) and "irecv (int64, 3 elements)" in repr(work), repr(work)
    else:
        time.sleep(0.3)
        dist.send(torch.full((3,), 5, dtype=torch.int64), 0, tag=2)

    # wait(timeout) while the peer is late; the receive still completes after.
    if rank == 0:
        tensor = torch.zeros(4)
        work = dist.irecv(tensor, 1, tag=3)
        started = time.monotonic()
        expect(dist.DistTimeoutError, "rank 0: irecv (float32, 4 elements)", work.wait, timedelta(milliseconds=200))
        assert time.monotonic() - started < 5
        assert not work.is_completed() and work.exception() is None and work.source_rank() == -1
        expect(RuntimeError, "Work needs to be completed", work.result)
        assert "pending" in repr(work)
        expect(TypeError, "timeout must be a datetime.timedelta", work.wait, 5)
        expect(ValueError, "must not be negative", work.wait, timeout=timedelta(seconds=-1))
        assert work.wait(timeout=timedelta(seconds=30)) and tensor.tolist() == [1.0] * 4
    else:
        time.sleep(1.0)
        dist.isend(torch.ones(4), 0, tag=3).wait()

    # Any source: the work names the sender; two threads waiting on one work both return.
    tensor = torch.zeros(2)
    if rank == 0:
        work = dist.irecv(tensor)
        results = []
        waiter = threading.Thread(target=lambda: results.append(work.wait()))
        waiter.start()
        assert work.wait()
        waiter.join(30)
        assert results == [True] and work.source_rank() == 1 and tensor.tolist() == [3.0, 3.0]
    else:
        time.sleep(0.2)
        dist.send(torch.full((2,), 3.0), 0)

    # A message larger than the receive: MPI's error, raised by wait() naming the call;
    # the group goes on.
    if rank == 0:
        work = dist.irecv(torch.zeros(4), 1, tag=11)
        expect(dist.DistBackendError, "rank 0: irecv (float32, 4 elements) on group", work.wait)
        assert work.is_completed() and not work.is_success() and isinstance(work.exception(), dist.DistBackendError)
        expect(dist.DistBackendError, "failed in the MPI library", work.wait)
    else:
        dist.send(torch.ones(10), 0, tag=11)

    # Arguments: peers and tags the call refuses, and ones it takes that are not plain ints.
    expect(ValueError, f"peer {rank} is not another rank", dist.isend, torch.ones(1), rank)
    expect(ValueError, "tag -1 is outside", dist.irecv, torch.ones(1), peer, tag=-1)
    expect(TypeError, "made by ringtree.mpi's isend and irecv", _C._MpiRequestWork)
    sent = torch.arange(6, dtype=torch.int32)
    received = torch.zeros(6, dtype=torch.int32)
    works = [dist.irecv(received, np.int64(peer), tag=np.int32(4)), dist.isend(sent, np.int64(peer), tag=np.int32(4))]
    assert all(work.wait() for work in works) and received.tolist() == list(range(6))

    # A destroyed group refuses point-to-point calls.
    group = dist.new_group(backend="mpi")
    engine = group.p2p
    dist.destroy_process_group(group)
    expect(dist.DistBackendError, "has been destroyed", engine.isend, torch.ones(1), peer, 0)
    expect(dist.DistBackendError, "has been destroyed", engine.irecv, torch.ones(1), peer, 0)
    dist.barrier()
    print("p2p: ok", flush=True)


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


def hang_irecv(rank: int) -> None:
    if rank == 1:
        time.sleep(120)
    dist.irecv(torch.zeros(2), 1, tag=6).wait()
    raise AssertionError("the irecv completed although nobody sent")


def main() -> None:
    mode = sys.argv[1]
    timeout = timedelta(seconds=3) if mode.startswith("hang") else timedelta(seconds=60)
    dist.init_process_group("mpi", timeout=timeout)
    modes = {"progress": progress, "p2p": p2p, "barrier-timeout": barrier_timeout, "kill": kill, "hang": hang,
             "hang-irecv": hang_irecv}
    modes[mode](dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
