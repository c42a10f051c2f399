"""The MPI backend's process-wide state: the initialised library, a private duplicate of
MPI_COMM_WORLD that every group's communicator is made from, the progress thread and the
reduction operators; plus what init_process_group("mpi") needs of MPI (the world's rank
and size, a store bootstrapped over MPI)."""

from __future__ import annotations

import atexit
import socket
import sys
import zlib
from datetime import timedelta

from .._C import TCPStore
from ..errors import DistBackendError
from . import load
from .engine import MpiEngine
from .reductions import Reductions
from .work import Progress

__all__ = ["bootstrap_store", "create_engine", "world_rank_and_size"]


class _Context:
    def __init__(self) -> None:
        self.MPI = load()
        # Every group's communicator derives from this duplicate: the program's own use of
        # MPI_COMM_WORLD never matches ringtree's messages.
        self.world = self.MPI.COMM_WORLD.Dup()
        self.reductions = Reductions(self.MPI)
        self.progress = Progress(self._abort)
        atexit.register(self.progress.stop)  # before mpi4py finalises MPI

    def _abort(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)
        self.MPI.COMM_WORLD.Abort(1)


_context: _Context | None = None


def _get() -> _Context:
    global _context
    if _context is None:
        _context = _Context()
    return _context


def world_rank_and_size(rank: int, world_size: int) -> tuple[int, int]:
    """MPI's rank and size of this process; ValueError when a given ``rank`` or
    ``world_size`` (-1: not given) disagrees with them."""
    world = _get().world
    mpi_rank, mpi_size = world.Get_rank(), world.Get_size()
    if world_size not in (-1, mpi_size):
        raise ValueError(f"init_process_group('mpi'): world_size={world_size} disagrees with MPI's world size {mpi_size}")
    if rank not in (-1, mpi_rank):
        raise ValueError(f"init_process_group('mpi'): rank={rank} disagrees with MPI's rank {mpi_rank} of this process")
    return mpi_rank, mpi_size


def bootstrap_store(timeout: timedelta) -> TCPStore:
    """The job's store, without any environment: rank 0 serves a TCPStore on a port the
    kernel picks and tells the others its address over MPI (127.0.0.1 when every rank is
    on this host, else rank 0's host name). A collective over MPI_COMM_WORLD."""
    context = _get()
    world = context.world
    local = world.Split_type(context.MPI.COMM_TYPE_SHARED)
    all_local = local.Get_size() == world.Get_size()
    local.Free()
    address = None
    server = None
    if world.Get_rank() == 0:
        host = "127.0.0.1" if all_local else socket.gethostname()
        try:
            server = TCPStore(host, 0, world.Get_size(), True, timeout, wait_for_workers=False)
            address = (host, server.port)
        except Exception as exc:  # noqa: BLE001 - told to every rank below
            address = ("", str(exc))
    host, port = world.bcast(address, root=0)
    if not host:
        raise DistBackendError(f"init_process_group('mpi'): rank 0 could not start the job's store: {port}")
    return server if server is not None else TCPStore(host, port, world.Get_size(), False, timeout)


def create_engine(
    group_name: str, global_ranks: tuple[int, ...], group_rank: int, timeout: timedelta
) -> MpiEngine:
    """The engine of a group of the world ranks ``global_ranks`` (in group rank order),
    over a communicator of those ranks. Called by the members only (MPI_Comm_create_group
    is collective over them); ringtree's world ranks must be MPI's."""
    context = _get()
    world = context.world
    global_rank = global_ranks[group_rank]
    if world.Get_rank() != global_rank or world.Get_size() < len(global_ranks) or max(global_ranks) >= world.Get_size():
        raise DistBackendError(
            f"backend 'mpi' for group {group_name!r}: this process is rank {global_rank} of ringtree's world, but "
            f"rank {world.Get_rank()} of MPI's world of {world.Get_size()}; the world must be started by mpirun or "
            "srun with ringtree's ranks equal to MPI's"
        )
    if list(global_ranks) == list(range(world.Get_size())):
        comm = world.Dup()
    else:
        members = world.Get_group().Incl(list(global_ranks))
        comm = world.Create_group(members, zlib.crc32(group_name.encode()) & 0x7FFF)
        members.Free()
    return MpiEngine(context.MPI, comm, context.progress, context.reductions, timeout, group_name, global_rank)
