"""MpiEngine: one group's collectives and point-to-point calls, delegated to MPI.

It has the method set and semantics of the native engine (ringtree._C.ProcessGroup), so
every front of ringtree (collectives, the gather/scatter family, p2p, object
collectives) runs on it unchanged: ranks are group ranks, buffers are borrowed zero-copy
through the core's buffer checks, ``async_op=True`` returns an MpiWork (isend/irecv a
_C._MpiRequestWork).

Each call is one MPI call on the group's own communicator (a duplicate, so a program's
own MPI traffic never matches ours). This module has the one-buffer calls, which are the
latency-bound ones: allreduce, broadcast, reduce, barrier, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single in equal parts and send/recv are MPI_Allreduce,
MPI_Bcast, MPI_Reduce, MPI_Barrier, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall
and MPI_Send/MPI_Recv on the caller's memory (MPI_Isend/MPI_Irecv for isend/irecv), no
copy. The synchronous ones and isend/irecv are served in C (see MpiEngine); the methods
here are the full path, with every check. The list and coalesced calls are in packed_collectives.py.

Counts are MPI ints: a buffer (or packed list) of 2**31 elements or more raises
ValueError. Reductions: see reductions.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .. import _C
from ..errors import DistTimeoutError
from .base import scale
from .packed_collectives import PackedCollectives
from .reductions import AVG, PREMUL_SUM
from .work import MpiWork, _run_callback, _wrap, future_of

__all__ = ["MpiEngine"]

_mpi_borrow = _C._mpi_borrow


class MpiEngine(PackedCollectives):
    """The MPI side of one group (see the module docstring).

    An instance's allreduce, broadcast, reduce, allgather_single, reduce_scatter_single,
    alltoall_single, send, recv, isend and irecv are C calls (_C._MpiFastCalls): they
    serve the synchronous collectives of a group that never ran an asynchronous one, with
    a cached reduction that needs no scaling and buffers that match, and point-to-point
    calls with a valid peer and tag, and hand every other call to the methods of this
    class, which do everything (isend/irecv: the checks, then the C call with plain ints).
    Collectives of one group must come from one thread at a time, as MPI requires of a
    communicator's collectives.
    """

    _FAST = ("allreduce", "broadcast", "reduce", "allgather_single", "reduce_scatter_single", "alltoall_single",
             "send", "recv", "isend", "irecv")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        fast = _C._MpiFastCalls(
            self._comm, self, self._datatypes, self._op_cache, self._in_place, self._raise_mpi_error,
            self._mpi_error, self.rank, self.size, self._tag_ub, self._timeout,
            status_type=self._MPI.Status, any_source=self._any_source, progress=self._progress, wrap=_wrap,
            future_of=future_of, run_callback=_run_callback, timeout_error=DistTimeoutError,
        )
        self._fast = fast
        for name in self._FAST:
            setattr(self, name, getattr(fast, name))

    def allreduce(self, tensor: Any, op: Any, async_op: bool, algorithm: Any = None) -> MpiWork | None:
        self._check("all_reduce", algorithm)
        message, dtype = _mpi_borrow(tensor, True, "all_reduce", self._datatypes)
        buffer = message[0]
        mpi_op, kind, factor = self._reduction(dtype, op, "all_reduce")
        if kind == PREMUL_SUM:
            scale(buffer, factor)
        return self._run(
            "all_reduce", buffer, async_op, self._comm.Allreduce, (self._in_place, message, mpi_op),
            [tensor], buffer, None if kind != AVG else self._divide_after(kind, buffer),
        )

    def broadcast(self, tensor: Any, root: int, async_op: bool, algorithm: Any = None) -> MpiWork | None:
        self._check("broadcast", algorithm)
        self._check_root(root, "broadcast")
        message, _ = _mpi_borrow(tensor, root != self.rank, "broadcast", self._datatypes)
        buffer = message[0]
        comm = self._comm
        return self._run("broadcast", buffer, async_op, comm.Bcast, (message, root), [tensor], buffer)

    def reduce(self, tensor: Any, root: int, op: Any, async_op: bool, algorithm: Any = None) -> MpiWork | None:
        self._check("reduce", algorithm)
        self._check_root(root, "reduce")
        is_root = root == self.rank
        message, dtype = _mpi_borrow(tensor, is_root, "reduce", self._datatypes)
        buffer = message[0]
        mpi_op, kind, factor = self._reduction(dtype, op, "reduce")
        keep = buffer
        if is_root:
            if kind == PREMUL_SUM:
                scale(buffer, factor)
            send, receive = self._in_place, message
        else:
            if kind == PREMUL_SUM:  # the input must stay unchanged: scale a copy
                keep = self._scaled_copy(buffer, factor)
                message = [keep.scratch, keep.count, message[2]]
            send, receive = message, None
        comm = self._comm
        return self._run(
            "reduce", buffer, async_op, comm.Reduce, (send, receive, mpi_op, root),
            [tensor], keep, self._divide_after(kind, buffer) if is_root else None,
        )

    def barrier(self, timeout: timedelta | None, async_op: bool) -> MpiWork | None:
        self._check("barrier", None)
        comm = self._comm
        if timeout is None or async_op:
            return self._run("barrier", None, async_op, comm.Barrier, (), [], None)
        # A deadline of its own: MPI_Barrier on the group's worker, waited for until then.
        # Past it DistTimeoutError; the barrier stays pending in MPI, and the group's later
        # collectives run after it (when every rank has entered it).
        work = self._submit("barrier", None, comm.Barrier, (), [], None, None)
        try:
            work.wait(timeout)
        except DistTimeoutError:
            raise DistTimeoutError(
                f"{self._describe('barrier')}: timed out after {timeout} waiting for the other ranks"
            ) from None
        return None

    def allgather_single(self, output_tensor: Any, input_tensor: Any, async_op: bool,
                         algorithm: Any = None) -> MpiWork | None:
        what = "all_gather_into_tensor"
        self._check(what, algorithm)
        send, dtype = _mpi_borrow(input_tensor, False, what, self._datatypes)
        buffer = send[0]
        receive, output_dtype = _mpi_borrow(output_tensor, True, what, self._datatypes)
        output = receive[0]
        if output_dtype != dtype or send[1] * self.size != receive[1]:
            self._same_dtype([output], dtype, what, "output_tensor")
            raise ValueError(
                f"{what}: output_tensor must hold world_size ({self.size}) times the input's "
                f"{send[1]} elements, got {receive[1]}"
            )
        receive[1] = send[1]  # MPI_Allgather's count is per rank
        comm = self._comm
        return self._run(what, buffer, async_op, comm.Allgather, (send, receive), [output_tensor],
                         (buffer, output))

    def reduce_scatter_single(self, output: Any, input: Any, op: Any, async_op: bool,  # noqa: A002 (torch's name)
                              algorithm: Any = None) -> MpiWork | None:
        what = "reduce_scatter_tensor"
        self._check(what, algorithm)
        receive, dtype = _mpi_borrow(output, True, what, self._datatypes)
        buffer = receive[0]
        send, source_dtype = _mpi_borrow(input, False, what, self._datatypes)
        source = send[0]
        if source_dtype != dtype or send[1] != receive[1] * self.size:
            self._same_dtype([source], dtype, what, "input")
            raise ValueError(
                f"{what}: input must hold world_size ({self.size}) times the output's {receive[1]} elements, "
                f"got {send[1]}"
            )
        mpi_op, kind, factor = self._reduction(dtype, op, what)
        keep = source
        if kind == PREMUL_SUM:  # the input must stay unchanged: scale a copy
            keep = self._scaled_copy(source, factor)
            send = [keep.scratch, keep.count, send[2]]
        send[1] = receive[1]  # MPI_Reduce_scatter_block's count is per rank
        comm = self._comm
        return self._run(
            what, buffer, async_op, comm.Reduce_scatter_block, (send, receive, mpi_op),
            [output], (buffer, keep), self._divide_after(kind, buffer),
        )

    def alltoall_single(self, output: Any, input: Any, output_split_sizes: Any, input_split_sizes: Any,  # noqa: A002
                        async_op: bool, algorithm: Any = None) -> MpiWork | None:
        """Equal parts (no split sizes): MPI_Alltoall; split sizes: MPI_Alltoallv
        (PackedCollectives)."""
        what = "all_to_all_single"
        if output_split_sizes or input_split_sizes or self._closed is not None or algorithm is not None:
            return super().alltoall_single(output, input, output_split_sizes, input_split_sizes, async_op, algorithm)
        send, dtype = _mpi_borrow(input, False, what, self._datatypes)
        receive, output_dtype = _mpi_borrow(output, True, what, self._datatypes)
        source, target = send[0], receive[0]
        size = self.size
        if output_dtype != dtype or send[1] != receive[1] or source.rows % size or target.rows % size:
            # Not equal parts of one size: the general path says what is wrong.
            return super().alltoall_single(output, input, None, None, async_op, algorithm)
        send[1] //= size  # MPI_Alltoall's counts are per rank
        receive[1] //= size
        return self._run(what, source, async_op, self._comm.Alltoall, (send, receive), [output], (source, target))

    # --- point to point ----------------------------------------------------------------

    def send(self, tensor: Any, dst: int, tag: int) -> None:
        self._check_p2p("send", dst, tag, False)
        message, _ = _mpi_borrow(tensor, False, "send", self._datatypes)
        buffer = message[0]
        comm = self._comm
        self._call("send", buffer, comm.Send, (message, dst, tag))

    def isend(self, tensor: Any, dst: int, tag: int) -> Any:
        """MPI_Isend; its _C._MpiRequestWork (the C call, once the checks passed)."""
        self._check_p2p("isend", dst, tag, False)
        return self._fast.isend(tensor, int(dst), int(tag))

    def recv(self, tensor: Any, src: int, tag: int) -> int:
        """Returns the sender's group rank (src = -1: any rank)."""
        self._check_p2p("recv", src, tag, True)
        message, _ = _mpi_borrow(tensor, True, "recv", self._datatypes)
        buffer = message[0]
        comm = self._comm
        if src != -1:
            self._call("recv", buffer, comm.Recv, (message, src, tag))
            return src
        status = self._MPI.Status()
        self._call("recv", buffer, comm.Recv, (message, self._any_source, tag, status))
        return status.Get_source()

    def irecv(self, tensor: Any, src: int, tag: int) -> Any:
        """MPI_Irecv (src -1: MPI_ANY_SOURCE); its _C._MpiRequestWork, whose source_rank()
        names the sender (the C call, once the checks passed)."""
        self._check_p2p("irecv", src, tag, True)
        return self._fast.irecv(tensor, int(src), int(tag))
