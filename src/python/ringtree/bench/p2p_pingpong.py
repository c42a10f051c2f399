"""``ringtree-bench p2p-pingpong``: point-to-point ping-pong between two ranks, one-way time
and bandwidth.

Runs as one of two ranks, under either launcher:

* ringtree: ``RINGTREE_TRANSPORT=shm ringtree-run --nproc-per-node 2 -m ringtree.bench
  p2p-pingpong`` measures ``ringtree.send``/``ringtree.recv``,
  ``ringtree.isend``/``ringtree.irecv`` followed by ``Work.wait()``, and sendrecv
  (``RINGTREE_TRANSPORT=tcp`` for TCP);
* mpi4py: ``mpirun -n 2 python -m ringtree.bench p2p-pingpong --mpi`` measures
  ``Comm.Send``/``Comm.Recv``, ``Comm.Isend``/``Comm.Irecv`` followed by ``Wait()``, and
  sendrecv (Open MPI picks shared memory on one host; ``--mca btl self,tcp`` forces TCP);
* ringtree over MPI: ``mpirun -n 2 python -m ringtree.bench p2p-pingpong --backend mpi``
  measures ringtree's calls on ``backend="mpi"`` (torch tensors over the same memory) and
  mpi4py's same calls in one job, mode by mode, and prints the layer (ringtree's time
  minus mpi4py's, per call: a one-way time is one call on each rank).

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


_receive_buffers: dict[tuple[type, int], object] = {}


def _receive_buffer(buf):
    """A buffer like `buf` (a NumPy array or torch tensor) for sendrecv's incoming message,
    made once per type and size."""
    key = (type(buf), buf.nbytes)
    if key not in _receive_buffers:
        _receive_buffers[key] = buf.new_empty(buf.shape) if hasattr(buf, "new_empty") else np.empty_like(buf)
    return _receive_buffers[key]


def _ringtree_modes(backend: str = "gloo"):
    import ringtree as dist

    dist.init_process_group(backend)
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


def one_way_seconds(rank: int, step, nbytes: int, repeats: int, wrap=None) -> float:
    """Best over `repeats` runs of the mean one-way time of `nbytes` messages (the buffer
    passed as ``wrap(array)`` if given)."""
    buf = np.ones(nbytes, dtype=np.uint8)
    if wrap is not None:
        buf = wrap(buf)
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
    parser.add_argument("--backend", choices=("gloo", "mpi"), default="gloo",
                        help="ringtree's backend; mpi (under mpirun) also times mpi4py's same calls, side by side")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.backend == "mpi" and not args.mpi:
        return _layer_over_mpi(sizes, args.repeats)
    rank, modes, finish = _mpi_modes() if args.mpi else _ringtree_modes(args.backend)
    if rank == 0:
        print(f"{'size':>10}  {'mode':<18} {'time(us)':>9} {'algbw(GB/s)':>11}", flush=True)
    for nbytes in sizes:
        for name, step in modes.items():
            seconds = one_way_seconds(rank, step, nbytes, args.repeats)
            if rank == 0:
                print(f"{nbytes:>10}  {name:<18} {seconds * 1e6:>9.2f} {nbytes / seconds / 1e9:>11.2f}", flush=True)
    finish()
    return 0


def _layer_over_mpi(sizes: list[int], repeats: int) -> int:
    """ringtree on backend "mpi" and mpi4py, mode by mode in one job: each figure the best
    of ``repeats`` runs, the two sides' runs interleaved."""
    import torch

    rank, ringtree_modes, finish = _ringtree_modes("mpi")
    _, mpi_modes, _ = _mpi_modes()
    if rank == 0:
        print(f"{'size':>10}  {'mode':<18} {'ringtree-mpi(us)':>16} {'mpi4py(us)':>10} {'layer(us)':>9}", flush=True)
    for nbytes in sizes:
        for (name, ours), theirs in zip(ringtree_modes.items(), mpi_modes.values()):
            # ringtree takes what its users pass: torch tensors (here over NumPy's memory).
            best = [float("inf"), float("inf")]
            for _ in range(repeats):
                best[0] = min(best[0], one_way_seconds(rank, ours, nbytes, 1, torch.from_numpy))
                best[1] = min(best[1], one_way_seconds(rank, theirs, nbytes, 1))
            if rank == 0:
                print(f"{nbytes:>10}  {name:<18} {best[0] * 1e6:>16.2f} {best[1] * 1e6:>10.2f} "
                      f"{(best[0] - best[1]) * 1e6:>9.2f}", flush=True)
    finish()
    return 0
