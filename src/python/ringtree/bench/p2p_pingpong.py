"""``ringtree-bench p2p-pingpong``: point-to-point ping-pong between two ranks, one-way time
and bandwidth.

Runs as one of two ranks, under either launcher:

* ringtree: ``RINGTREE_TRANSPORT=shm ringtree-run --nproc-per-node 2 -m ringtree.bench
  p2p-pingpong`` measures ``ringtree.send``/``ringtree.recv``,
  ``ringtree.isend``/``ringtree.irecv`` followed by ``Work.wait()``, and sendrecv
  (``RINGTREE_TRANSPORT=tcp`` for TCP);
* mpi4py: ``mpirun -n 2 python -m ringtree.bench p2p-pingpong --mpi`` measures
  ``Comm.Send``/``Comm.Recv``, ``Comm.Isend``/``Comm.Irecv`` followed by ``Wait()``, and
  sendrecv (Open MPI picks shared memory on one host; ``--mca btl self,tcp`` forces TCP).

Rank 0 sends and then receives, rank 1 the reverse; the one-way time is half a round
trip, averaged over the iterations of one run. The sendrecv mode is the exchange
nccl-tests times: both ranks post a receive from the other and a send to it, then wait
for both; its figure is the time of one exchange. Each figure is the best of
``--repeats`` runs (the machine may be shared: the best run is the least disturbed).
Buffers are NumPy uint8 arrays. Rank 0 prints one line per mode and size:
``size  mode  time(us)  algbw(GB/s)``, decimal GB/s.

Usage: ``... ringtree.bench p2p-pingpong [--mpi] [--sizes 8,67108864] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np

# Round trips per run: enough for a stable average, few enough for a quick run.
_ITERATIONS_SMALL = 3000
_ITERATIONS_LARGE = 4
_LARGE_BYTES = 1 << 20


_receive_buffers: dict[int, np.ndarray] = {}


def _receive_buffer(buf: np.ndarray) -> np.ndarray:
    """A buffer the size of `buf` for sendrecv's incoming message, made once per size."""
    if buf.nbytes not in _receive_buffers:
        _receive_buffers[buf.nbytes] = np.empty_like(buf)
    return _receive_buffers[buf.nbytes]


def _ringtree_modes():
    import ringtree as dist

    dist.init_process_group("gloo")
    peer = 1 - dist.get_rank()

    def blocking(sending, buf):
        if sending:
            dist.send(buf, peer)
        else:
            dist.recv(buf, peer)

    def asynchronous(sending, buf):
        (dist.isend(buf, peer) if sending else dist.irecv(buf, peer)).wait()

    def sendrecv(_sending, buf):
        incoming = dist.irecv(_receive_buffer(buf), peer)
        outgoing = dist.isend(buf, peer)
        incoming.wait()
        outgoing.wait()

    modes = {"send/recv": blocking, "isend/irecv+wait": asynchronous, "sendrecv": sendrecv}
    return dist.get_rank(), modes, dist.destroy_process_group


def _mpi_modes():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    peer = 1 - comm.Get_rank()

    def blocking(sending, buf):
        if sending:
            comm.Send(buf, dest=peer, tag=0)
        else:
            comm.Recv(buf, source=peer, tag=0)

    def asynchronous(sending, buf):
        (comm.Isend(buf, dest=peer, tag=0) if sending else comm.Irecv(buf, source=peer, tag=0)).Wait()

    def sendrecv(_sending, buf):
        incoming = comm.Irecv(_receive_buffer(buf), source=peer, tag=0)
        outgoing = comm.Isend(buf, dest=peer, tag=0)
        MPI.Request.Waitall([incoming, outgoing])

    modes = {"Send/Recv": blocking, "Isend/Irecv+Wait": asynchronous, "sendrecv": sendrecv}
    return comm.Get_rank(), modes, lambda: None


def one_way_seconds(rank: int, step, nbytes: int, repeats: int) -> float:
    """Best over `repeats` runs of the mean one-way time of `nbytes` messages."""
    buf = np.ones(nbytes, dtype=np.uint8)
    iterations = _ITERATIONS_LARGE if nbytes >= _LARGE_BYTES else _ITERATIONS_SMALL
    warmup = iterations // 10 + 1
    best = float("inf")
    for _ in range(repeats):
        for i in range(warmup + iterations):
            if i == warmup:
                start = time.perf_counter()
            step(rank == 0, buf)
            step(rank != 0, buf)
        best = min(best, (time.perf_counter() - start) / iterations / 2)
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the measurement as one of the two ranks of a launched job; returns 0."""
    parser = argparse.ArgumentParser(
        prog="ringtree-bench p2p-pingpong", description="Point-to-point ping-pong between two ranks."
    )
    parser.add_argument("--mpi", action="store_true", help="measure mpi4py instead of ringtree")
    parser.add_argument("--sizes", default="8,67108864", help="message sizes in bytes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the best is printed")
    args = parser.parse_args(argv)
    rank, modes, finish = _mpi_modes() if args.mpi else _ringtree_modes()
    if rank == 0:
        print(f"{'size':>10}  {'mode':<18} {'time(us)':>9} {'algbw(GB/s)':>11}", flush=True)
    for nbytes in (int(size) for size in args.sizes.split(",")):
        for name, step in modes.items():
            seconds = one_way_seconds(rank, step, nbytes, args.repeats)
            if rank == 0:
                print(f"{nbytes:>10}  {name:<18} {seconds * 1e6:>9.2f} {nbytes / seconds / 1e9:>11.2f}", flush=True)
    finish()
    return 0
