"""MpiEngine: one group's collectives and point-to-point calls, delegated to MPI.

It has the method set and semantics of the native engine (ringtree._C.ProcessGroup), so
every front of ringtree (collectives, the gather/scatter family, p2p, object
collectives) runs on it unchanged: ranks are group ranks, buffers are borrowed zero-copy
through the core's buffer checks, ``async_op=True`` returns an MpiWork.

Each call maps onto one MPI call on the group's own communicator (a duplicate, so a
program's own MPI traffic never matches ours):

- allreduce, broadcast, reduce, barrier, all_gather_into_tensor, reduce_scatter_tensor
  and send/recv are MPI_Allreduce, MPI_Bcast, MPI_Reduce, MPI_Barrier, MPI_Allgather,
  MPI_Reduce_scatter_block and MPI_Send/MPI_Recv on the caller's memory (nonblocking
  MPI_I* forms when async), no copy.
- The list forms (all_gather, gather, scatter, reduce_scatter, all_to_all and the
  coalesced ones) are the MPI "v" collectives over the list's buffers: in place when the
  buffers lie end to end in rank order (views of one tensor), else through one packed
  scratch buffer and a copy.
- all_to_all_single with split sizes is MPI_Alltoallv on the caller's memory.

Counts are MPI ints: a buffer (or packed list) of 2**31 elements or more raises
ValueError. Reductions: see reductions.py.
"""

from __future__ import annotations

import ctypes
import time
from datetime import timedelta
from typing import Any, Callable, Sequence

from .. import _C
from ..errors import DistBackendError, DistTimeoutError
from .reductions import AVG, PREMUL_SUM, Reductions, datatypes, op_code
from .work import CollectiveOrder, MpiWork, Progress, _wrap

__all__ = ["MpiEngine"]

_borrow = _C._borrow
_memmove = ctypes.memmove
_MAX_COUNT = 2**31 - 1
_ITEM_SIZE = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
    "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16,
}


class _Packed:
    """A list of borrowed buffers seen as one run of memory: the buffers themselves when
    they lie end to end (``copied`` False), else a scratch buffer. ``load()`` copies the
    buffers into the scratch, ``store()`` copies it back."""

    __slots__ = ("address", "copied", "nbytes", "parts", "scratch")

    def __init__(self, parts: Sequence[Any], force_copy: bool = False) -> None:
        self.parts = parts
        self.nbytes = sum(part.nbytes for part in parts)
        address = parts[0].address if parts else 0
        adjacent = not force_copy
        offset = 0
        for part in parts:
            if part.nbytes and part.address != address + offset:
                adjacent = False
                break
            offset += part.nbytes
        self.copied = not adjacent
        self.scratch = None
        if adjacent:
            self.address = address
        else:
            self.scratch = _borrow(bytearray(self.nbytes), True, "scratch")
            self.address = self.scratch.address

    def load(self) -> None:
        offset = self.address
        for part in self.parts:
            _memmove(offset, part.address, part.nbytes)
            offset += part.nbytes

    def store(self, _status: Any = None) -> None:
        offset = self.address
        for part in self.parts:
            _memmove(part.address, offset, part.nbytes)
            offset += part.nbytes


class MpiEngine:
    """The MPI side of one group. ``comm`` is the group's own communicator (freed by
    shutdown); ``timeout`` bounds every operation (see work.py: past it the job is
    aborted)."""

    def __init__(
        self, MPI: Any, comm: Any, progress: Progress, reductions: Reductions, timeout: timedelta,  # noqa: N803
        group_name: str, global_rank: int,
    ) -> None:
        self._MPI = MPI
        self._comm = comm
        self._progress = progress
        self._reductions = reductions
        self._timeout = timeout.total_seconds()
        self._group_name = group_name
        self._global_rank = global_rank
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._types = datatypes(MPI)
        self._fromaddress = MPI.buffer.fromaddress
        self._in_place = MPI.IN_PLACE
        self._any_source = MPI.ANY_SOURCE
        self._tag_ub = comm.Get_attr(MPI.TAG_UB) or 32767
        self._closed: str | None = None
        # The synchronous call running now: (deadline, what, buffer) for the watchdog.
        self._running: tuple[float, str, Any] | None = None
        self._order = CollectiveOrder(f"ringtree-mpi-{group_name}")
        progress.engines.add(self)

    # --- plumbing ---------------------------------------------------------------------

    def _describe(self, what: str, buffer: Any = None) -> str:
        detail = f" ({buffer.dtype}, {buffer.count} elements)" if buffer is not None else ""
        return f"rank {self._global_rank}: {what}{detail} on group {self._group_name!r} (MPI)"

    def overdue(self, now: float) -> str | None:
        running = self._running
        if running is None or now <= running[0]:
            return None
        return self._describe(running[1], running[2])

    def _check(self, what: str, algorithm: Any) -> None:
        if self._closed is not None:
            raise DistBackendError(f"{what}: {self._closed}")
        if algorithm is not None:
            raise ValueError(
                f"{what}: algorithm={algorithm!r} selects one of ringtree's own engine algorithms; a group on "
                "backend 'mpi' runs the MPI library's (pass algorithm=None)"
            )

    def _message(self, buffer: Any, address: int, nbytes: int, count: int, readonly: bool) -> list[Any]:
        if count > _MAX_COUNT:
            raise ValueError(f"the mpi backend moves at most {_MAX_COUNT} elements in one call, got {count}")
        return [self._fromaddress(address, nbytes, readonly), count, self._types[buffer.dtype]]

    def _msg(self, buffer: Any, readonly: bool = False) -> list[Any]:
        return self._message(buffer, buffer.address, buffer.nbytes, buffer.count, readonly)

    def _vector(self, buffer: Any, packed: _Packed, counts: list[int], readonly: bool) -> list[Any]:
        """A "v" message over ``packed`` (one block of ``counts[r]`` elements per rank)."""
        total = sum(counts)
        if total > _MAX_COUNT:
            raise ValueError(f"the mpi backend moves at most {_MAX_COUNT} elements in one call, got {total}")
        displacements = [0] * len(counts)
        for index in range(1, len(counts)):
            displacements[index] = displacements[index - 1] + counts[index - 1]
        return [self._fromaddress(packed.address, packed.nbytes, readonly), (counts, displacements),
                self._types[buffer.dtype]]

    def _call(self, what: str, buffer: Any, call: Callable[[], Any]) -> None:
        """Runs one blocking MPI call, watched by the watchdog; MPI errors become
        DistBackendError naming the call."""
        self._running = (time.monotonic() + self._timeout, what, buffer)
        try:
            call()
        except self._MPI.Exception as exc:
            raise _wrap(exc, self._describe(what, buffer))  # noqa: B904 - _wrap sets the cause
        finally:
            self._running = None

    def _run(
        self,
        what: str,
        buffer: Any,
        async_op: bool,
        call: Callable[[], Any],
        outputs: list[Any],
        keep: Any,
        finish: Callable[[Any], None] | None = None,
    ) -> MpiWork | None:
        """Runs one collective in the group's order: a synchronous one on this thread when
        nothing is queued before it (then ``finish``), else through the group's worker
        thread, which runs the asynchronous ones (see CollectiveOrder)."""
        if not async_op:
            with self._order.lock:
                if not self._order.pending():
                    self._call(what, buffer, call)
                    if finish is not None:
                        finish(None)
                    return None
            self._submit(what, buffer, call, outputs, keep, finish).wait()
            return None
        return self._submit(what, buffer, call, outputs, keep, finish)

    def _submit(self, what: str, buffer: Any, call: Callable[[], Any], outputs: list[Any], keep: Any,
                finish: Callable[[Any], None] | None) -> MpiWork:
        work = MpiWork(None, None, outputs, keep, finish, lambda: self._describe(what, buffer), float("inf"))

        def run() -> None:
            try:
                self._call(what, buffer, call)
            except BaseException as exc:  # noqa: BLE001 - stored in the Work
                work._finished(exc)
            else:
                work._finished(None)

        self._order.submit(run)
        return work

    def _p2p(self, what: str, buffer: Any, start: Callable[[], Any], outputs: list[Any], status: Any) -> MpiWork:
        """Starts a nonblocking MPI point-to-point operation behind an MpiWork, completed
        by the progress thread or by wait()."""
        try:
            request = start()
        except self._MPI.Exception as exc:
            raise _wrap(exc, self._describe(what, buffer))  # noqa: B904
        work = MpiWork(request, status, outputs, buffer, None, lambda: self._describe(what, buffer),
                       time.monotonic() + self._timeout)
        self._progress.add(work)
        return work

    def _reduction(self, buffer: Any, op: Any, what: str) -> tuple[Any, int, float | None]:
        code, factor = op_code(op)
        reduction = self._reductions.get(buffer.dtype, code, what)
        return reduction.op, reduction.kind, factor

    def _divide_after(self, kind: int, *targets: Any) -> Callable[[Any], None] | None:
        if kind != AVG:
            return None
        size = self.size

        def divide(_status: Any = None) -> None:
            for target in targets:
                _C._divide_by_ranks(target.address, target.count, target.dtype, size)

        return divide

    def _scaled_copy(self, buffer: Any, factor: float) -> Any:
        """A scratch copy of ``buffer`` multiplied by factor (PREMUL_SUM on an input that
        must stay unchanged)."""
        copy = _ScratchView(_borrow(bytearray(buffer.nbytes), True, "scratch"), buffer)
        _memmove(copy.address, buffer.address, buffer.nbytes)
        _scale(copy, factor)
        return copy

    @staticmethod
    def _same_dtype(buffers: Sequence[Any], dtype: str, what: str, name: str) -> None:
        for buffer in buffers:
            if buffer.dtype != dtype:
                raise ValueError(f"{what}: every buffer must hold {dtype}, but {name} holds {buffer.dtype}")

    def _per_rank(self, buffers: Sequence[Any], what: str, name: str) -> None:
        if len(buffers) != self.size:
            raise ValueError(f"{what}: {name} must have one buffer per rank ({self.size}), got {len(buffers)}")

    # --- collectives -----------------------------------------------------------------

    def allreduce(self, tensor: Any, op: Any, async_op: bool, algorithm: Any = None) -> MpiWork | None:
        self._check("all_reduce", algorithm)
        buffer = _borrow(tensor, True, "all_reduce")
        mpi_op, kind, factor = self._reduction(buffer, op, "all_reduce")
        if kind == PREMUL_SUM:
            _scale(buffer, factor)
        message = self._msg(buffer)
        comm, in_place = self._comm, self._in_place
        return self._run(
            "all_reduce", buffer, async_op,
            lambda: comm.Allreduce(in_place, message, mpi_op),
            [tensor], buffer, self._divide_after(kind, buffer),
        )

    def broadcast(self, tensor: Any, root: int, async_op: bool, algorithm: Any = None) -> MpiWork | None:
        self._check("broadcast", algorithm)
        self._check_root(root, "broadcast")
        buffer = _borrow(tensor, root != self.rank, "broadcast")
        message = self._msg(buffer, readonly=root == self.rank)
        comm = self._comm
        return self._run(
            "broadcast", buffer, async_op,
            lambda: comm.Bcast(message, root), [tensor], buffer,
        )

    def reduce(self, tensor: Any, root: int, op: Any, async_op: bool, algorithm: Any = None) -> MpiWork | None:
        self._check("reduce", algorithm)
        self._check_root(root, "reduce")
        is_root = root == self.rank
        buffer = _borrow(tensor, is_root, "reduce")
        mpi_op, kind, factor = self._reduction(buffer, op, "reduce")
        comm, keep = self._comm, buffer
        if is_root:
            if kind == PREMUL_SUM:
                _scale(buffer, factor)
            send, receive = self._in_place, self._msg(buffer)
        else:
            source = buffer
            if kind == PREMUL_SUM:
                source = keep = self._scaled_copy(buffer, factor)
            send, receive = self._msg(source, readonly=True), None
        return self._run(
            "reduce", buffer, async_op,
            lambda: comm.Reduce(send, receive, mpi_op, root),
            [tensor], keep, self._divide_after(kind, buffer) if is_root else None,
        )

    def barrier(self, timeout: timedelta | None, async_op: bool) -> MpiWork | None:
        self._check("barrier", None)
        comm = self._comm
        if timeout is None or async_op:
            return self._run("barrier", None, async_op, comm.Barrier, [], None)
        # A deadline of its own: MPI_Barrier on the group's worker, waited for until then.
        # Past it DistTimeoutError; the barrier stays pending in MPI, and the group's later
        # collectives run after it (when every rank has entered it).
        work = self._submit("barrier", None, comm.Barrier, [], None, None)
        try:
            work.wait(timeout)
        except DistTimeoutError:
            raise DistTimeoutError(
                f"{self._describe('barrier')}: timed out after {timeout} waiting for the other ranks"
            ) from None
        return None

    def allgather(self, tensor_list: Sequence[Any], tensor: Any, async_op: bool, algorithm: Any = None):
        self._check("all_gather", algorithm)
        buffer = _borrow(tensor, False, "all_gather")
        outputs = [_borrow(output, True, "all_gather") for output in tensor_list]
        self._per_rank(outputs, "all_gather", "tensor_list")
        self._same_dtype(outputs, buffer.dtype, "all_gather", "tensor_list")
        if outputs[self.rank].count != buffer.count:
            raise ValueError(
                f"all_gather: tensor_list[{self.rank}] has {outputs[self.rank].count} elements, but this rank's "
                f"tensor has {buffer.count}"
            )
        packed = _Packed(outputs)
        receive = self._vector(buffer, packed, [output.count for output in outputs], False)
        send = self._msg(buffer, readonly=True)
        comm = self._comm
        return self._run(
            "all_gather", buffer, async_op,
            lambda: comm.Allgatherv(send, receive),
            list(tensor_list), (buffer, packed), packed.store if packed.copied else None,
        )

    def allgather_single(self, output_tensor: Any, input_tensor: Any, async_op: bool, algorithm: Any = None):
        self._check("all_gather_into_tensor", algorithm)
        buffer = _borrow(input_tensor, False, "all_gather_into_tensor")
        output = _borrow(output_tensor, True, "all_gather_into_tensor")
        self._same_dtype([output], buffer.dtype, "all_gather_into_tensor", "output_tensor")
        if output.count != buffer.count * self.size:
            raise ValueError(
                f"all_gather_into_tensor: output_tensor must hold world_size ({self.size}) times the input's "
                f"{buffer.count} elements, got {output.count}"
            )
        send = self._msg(buffer, readonly=True)
        receive = self._message(output, output.address, output.nbytes, buffer.count, False)
        comm = self._comm
        return self._run(
            "all_gather_into_tensor", buffer, async_op,
            lambda: comm.Allgather(send, receive),
            [output_tensor], (buffer, output),
        )

    def gather(self, tensor: Any, gather_list: Sequence[Any] | None, root: int, async_op: bool,
               algorithm: Any = None) -> MpiWork | None:
        self._check("gather", algorithm)
        self._check_root(root, "gather")
        buffer = _borrow(tensor, False, "gather")
        send = self._msg(buffer, readonly=True)
        comm, packed, receive, outputs = self._comm, None, None, []
        if root == self.rank:
            if gather_list is None:
                raise ValueError("gather: gather_list must be given on the destination rank")
            parts = [_borrow(output, True, "gather") for output in gather_list]
            self._per_rank(parts, "gather", "gather_list")
            self._same_dtype(parts, buffer.dtype, "gather", "gather_list")
            packed = _Packed(parts)
            receive = self._vector(buffer, packed, [part.count for part in parts], False)
            outputs = list(gather_list)
        return self._run(
            "gather", buffer, async_op,
            lambda: comm.Gatherv(send, receive, root),
            outputs, (buffer, packed), packed.store if packed is not None and packed.copied else None,
        )

    def scatter(self, tensor: Any, scatter_list: Sequence[Any] | None, root: int, async_op: bool,
                algorithm: Any = None) -> MpiWork | None:
        self._check("scatter", algorithm)
        self._check_root(root, "scatter")
        buffer = _borrow(tensor, True, "scatter")
        receive = self._msg(buffer)
        comm, packed, send = self._comm, None, None
        if root == self.rank:
            if scatter_list is None:
                raise ValueError("scatter: scatter_list must be given on the source rank")
            parts = [_borrow(part, False, "scatter") for part in scatter_list]
            self._per_rank(parts, "scatter", "scatter_list")
            self._same_dtype(parts, buffer.dtype, "scatter", "scatter_list")
            packed = _Packed(parts)
            if packed.copied:
                packed.load()
            send = self._vector(buffer, packed, [part.count for part in parts], True)
        return self._run(
            "scatter", buffer, async_op,
            lambda: comm.Scatterv(send, receive, root),
            [tensor], (buffer, packed),
        )

    def reduce_scatter(self, output: Any, input_list: Sequence[Any], op: Any, async_op: bool,
                       algorithm: Any = None) -> MpiWork | None:
        self._check("reduce_scatter", algorithm)
        buffer = _borrow(output, True, "reduce_scatter")
        parts = [_borrow(part, False, "reduce_scatter") for part in input_list]
        self._per_rank(parts, "reduce_scatter", "input_list")
        self._same_dtype(parts, buffer.dtype, "reduce_scatter", "input_list")
        mpi_op, kind, factor = self._reduction(buffer, op, "reduce_scatter")
        packed = _Packed(parts, force_copy=kind == PREMUL_SUM)
        if packed.copied:
            packed.load()
        if kind == PREMUL_SUM:
            _scale(_ScratchView(packed.scratch, buffer), factor)
        counts = [part.count for part in parts]
        if counts[self.rank] != buffer.count:
            raise ValueError(
                f"reduce_scatter: output has {buffer.count} elements, but input_list[{self.rank}] has "
                f"{counts[self.rank]}"
            )
        send = self._vector(buffer, packed, counts, True)[0]
        receive = self._msg(buffer)
        comm = self._comm
        return self._run(
            "reduce_scatter", buffer, async_op,
            lambda: comm.Reduce_scatter([send, self._types[buffer.dtype]], receive, counts, mpi_op),
            [output], (buffer, packed), self._divide_after(kind, buffer),
        )

    def reduce_scatter_single(self, output: Any, input: Any, op: Any, async_op: bool,  # noqa: A002 (torch's name)
                              algorithm: Any = None) -> MpiWork | None:
        what = "reduce_scatter_tensor"
        self._check(what, algorithm)
        buffer = _borrow(output, True, what)
        source = keep = _borrow(input, False, what)
        self._same_dtype([source], buffer.dtype, what, "input")
        if source.count != buffer.count * self.size:
            raise ValueError(
                f"{what}: input must hold world_size ({self.size}) times the output's {buffer.count} elements, "
                f"got {source.count}"
            )
        mpi_op, kind, factor = self._reduction(buffer, op, what)
        if kind == PREMUL_SUM:
            source = keep = self._scaled_copy(source, factor)
        send = self._message(source, source.address, source.nbytes, buffer.count, True)
        receive = self._msg(buffer)
        comm = self._comm
        return self._run(
            what, buffer, async_op,
            lambda: comm.Reduce_scatter_block(send, receive, mpi_op),
            [output], (buffer, keep), self._divide_after(kind, buffer),
        )

    def alltoall(self, output_tensor_list: Sequence[Any], input_tensor_list: Sequence[Any], async_op: bool,
                 algorithm: Any = None) -> MpiWork | None:
        self._check("all_to_all", algorithm)
        inputs = [_borrow(part, False, "all_to_all") for part in input_tensor_list]
        outputs = [_borrow(part, True, "all_to_all") for part in output_tensor_list]
        self._per_rank(inputs, "all_to_all", "input_tensor_list")
        self._per_rank(outputs, "all_to_all", "output_tensor_list")
        dtype_of = inputs[0]
        self._same_dtype(inputs + outputs, dtype_of.dtype, "all_to_all", "a list")
        sent, received = _Packed(inputs), _Packed(outputs)
        if sent.copied:
            sent.load()
        send = self._vector(dtype_of, sent, [part.count for part in inputs], True)
        receive = self._vector(dtype_of, received, [part.count for part in outputs], False)
        comm = self._comm
        return self._run(
            "all_to_all", dtype_of, async_op,
            lambda: comm.Alltoallv(send, receive),
            list(output_tensor_list), (inputs, sent, received), received.store if received.copied else None,
        )

    def alltoall_single(self, output: Any, input: Any, output_split_sizes: Any, input_split_sizes: Any,  # noqa: A002
                        async_op: bool, algorithm: Any = None) -> MpiWork | None:
        what = "all_to_all_single"
        self._check(what, algorithm)
        source = _borrow(input, False, what)
        target = _borrow(output, True, what)
        self._same_dtype([target], source.dtype, what, "output")
        send_counts = self._split_counts(source, input_split_sizes, "input_split_sizes", what)
        receive_counts = self._split_counts(target, output_split_sizes, "output_split_sizes", what)
        send = self._vector(source, _Whole(source), send_counts, True)
        receive = self._vector(target, _Whole(target), receive_counts, False)
        comm = self._comm
        return self._run(
            what, source, async_op,
            lambda: comm.Alltoallv(send, receive),
            [output], (source, target),
        )

    def _split_counts(self, buffer: Any, sizes: Any, name: str, what: str) -> list[int]:
        rows = buffer.rows
        row = buffer.count // rows if rows else 0
        if sizes is None or len(sizes) == 0:
            if rows % self.size:
                raise ValueError(f"{what}: dim 0 ({rows}) must divide evenly by world_size ({self.size}) "
                                 f"when {name} is not given")
            return [rows // self.size * row] * self.size
        sizes = list(sizes)
        if len(sizes) != self.size or any(not isinstance(size, int) or size < 0 for size in sizes):
            raise ValueError(f"{what}: {name} must be {self.size} non-negative ints, got {sizes}")
        if sum(sizes) != rows:
            raise ValueError(f"{what}: {name} adds up to {sum(sizes)} rows, but the buffer has {rows}")
        return [size * row for size in sizes]

    # --- coalesced ---------------------------------------------------------------------

    def allreduce_coalesced(self, tensors: Sequence[Any], op: Any, async_op: bool) -> MpiWork | None:
        what = "all_reduce_coalesced"
        self._check(what, None)
        parts = [_borrow(tensor, True, what) for tensor in tensors]
        if not parts:
            raise ValueError(f"{what}: tensors must not be empty")
        first = parts[0]
        self._same_dtype(parts, first.dtype, what, "tensors")
        mpi_op, kind, factor = self._reduction(first, op, what)
        packed = _Packed(parts)
        if packed.copied:
            packed.load()
        whole = _Whole(first, packed)
        if kind == PREMUL_SUM:
            _scale(whole, factor)
        message = self._message(first, whole.address, whole.nbytes, whole.count, False)
        divide = self._divide_after(kind, whole)

        def finish(status: Any = None) -> None:
            if divide is not None:
                divide()
            if packed.copied:
                packed.store()

        comm, in_place = self._comm, self._in_place
        return self._run(
            what, first, async_op,
            lambda: comm.Allreduce(in_place, message, mpi_op),
            list(tensors), (parts, packed), finish,
        )

    def allgather_coalesced(self, output_tensor_lists: Sequence[Sequence[Any]], input_tensor_list: Sequence[Any],
                            async_op: bool) -> MpiWork | None:
        what = "all_gather_coalesced"
        self._check(what, None)
        inputs = [_borrow(tensor, False, what) for tensor in input_tensor_list]
        if len(output_tensor_lists) != self.size:
            raise ValueError(f"{what}: output_tensor_lists must have one list per rank ({self.size}), "
                             f"got {len(output_tensor_lists)}")
        outputs = [[_borrow(tensor, True, what) for tensor in row] for row in output_tensor_lists]
        if not inputs:
            raise ValueError(f"{what}: input_tensor_list must not be empty")
        first = inputs[0]
        flat = [part for row in outputs for part in row]
        self._same_dtype(inputs + flat, first.dtype, what, "a list")
        counts = [sum(part.count for part in row) for row in outputs]
        if counts[self.rank] != sum(part.count for part in inputs):
            raise ValueError(f"{what}: output_tensor_lists[{self.rank}] holds {counts[self.rank]} elements, "
                             f"but the inputs hold {sum(part.count for part in inputs)}")
        sent, received = _Packed(inputs), _Packed(flat)
        if sent.copied:
            sent.load()
        send = self._message(first, sent.address, sent.nbytes, counts[self.rank], True)
        receive = self._vector(first, received, counts, False)
        comm = self._comm
        return self._run(
            what, first, async_op,
            lambda: comm.Allgatherv(send, receive),
            [tensor for row in output_tensor_lists for tensor in row], (inputs, sent, received),
            received.store if received.copied else None,
        )

    def allgather_single_coalesced(self, output_tensors: Sequence[Any], input_tensors: Sequence[Any],
                                   async_op: bool) -> MpiWork | None:
        """One MPI_Allgather of every input packed end to end; each output is then cut
        from the gathered blocks."""
        what = "all_gather_into_tensor_coalesced"
        self._check(what, None)
        inputs, outputs = self._coalesced_pairs(output_tensors, input_tensors, what, lambda o, i: o == i * self.size)
        first = inputs[0]
        sent = _Packed(inputs, force_copy=True)
        sent.load()
        block = sent.nbytes
        gathered = _borrow(bytearray(block * self.size), True, "scratch")
        send = self._message(first, sent.address, block, block // _ITEM_SIZE[first.dtype], True)
        receive = self._message(first, gathered.address, gathered.nbytes, block // _ITEM_SIZE[first.dtype], False)

        def finish(status: Any = None) -> None:
            for rank in range(self.size):
                offset = gathered.address + rank * block
                for source, target in zip(inputs, outputs):
                    _memmove(target.address + rank * source.nbytes, offset, source.nbytes)
                    offset += source.nbytes

        comm = self._comm
        return self._run(
            what, first, async_op,
            lambda: comm.Allgather(send, receive),
            list(output_tensors), (inputs, outputs, sent, gathered), finish,
        )

    def reduce_scatter_single_coalesced(self, outputs: Sequence[Any], inputs: Sequence[Any], op: Any,
                                        async_op: bool) -> MpiWork | None:
        """One MPI_Reduce_scatter_block over the inputs regrouped by destination rank."""
        what = "reduce_scatter_tensor_coalesced"
        self._check(what, None)
        sources, targets = self._coalesced_pairs(outputs, inputs, what, lambda o, i: i == o * self.size)
        first = targets[0]
        mpi_op, kind, factor = self._reduction(first, op, what)
        block = sum(target.nbytes for target in targets)  # what each rank ends with
        regrouped = _borrow(bytearray(block * self.size), True, "scratch")
        offset = regrouped.address
        for rank in range(self.size):
            for source, target in zip(sources, targets):
                _memmove(offset, source.address + rank * target.nbytes, target.nbytes)
                offset += target.nbytes
        if kind == PREMUL_SUM:
            _scale(_ScratchView(regrouped, first), factor)
        result = _borrow(bytearray(block), True, "scratch")
        count = block // _ITEM_SIZE[first.dtype]
        send = self._message(first, regrouped.address, regrouped.nbytes, count, True)
        receive = self._message(first, result.address, block, count, False)
        divide = self._divide_after(kind, *targets)

        def finish(status: Any = None) -> None:
            offset = result.address
            for target in targets:
                _memmove(target.address, offset, target.nbytes)
                offset += target.nbytes
            if divide is not None:
                divide()

        comm = self._comm
        return self._run(
            what, first, async_op,
            lambda: comm.Reduce_scatter_block(send, receive, mpi_op),
            list(outputs), (sources, targets, regrouped, result), finish,
        )

    def _coalesced_pairs(self, outputs: Sequence[Any], inputs: Sequence[Any], what: str,
                         sizes_match: Callable[[int, int], bool]) -> tuple[list[Any], list[Any]]:
        if len(outputs) != len(inputs) or not inputs:
            raise ValueError(f"{what}: needs as many outputs as inputs (at least one), got {len(outputs)} and "
                             f"{len(inputs)}")
        sources = [_borrow(tensor, False, what) for tensor in inputs]
        targets = [_borrow(tensor, True, what) for tensor in outputs]
        self._same_dtype(sources + targets, sources[0].dtype, what, "a tensor")
        for index, (source, target) in enumerate(zip(sources, targets)):
            if not sizes_match(target.count, source.count):
                raise ValueError(f"{what}: outputs[{index}] ({target.count} elements) does not match "
                                 f"inputs[{index}] ({source.count} elements) for world_size {self.size}")
        return sources, targets

    # --- point to point ----------------------------------------------------------------

    def _check_peer(self, peer: int, what: str, any_source: bool = False) -> None:
        if any_source and peer == -1:
            return
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"{what}: peer {peer} is not another rank of this group of {self.size}")

    def _check_root(self, root: int, what: str) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"{what}: root {root} is not a rank of this group of {self.size} ranks")

    def _check_tag(self, tag: int, what: str) -> None:
        if not 0 <= tag <= self._tag_ub:
            raise ValueError(f"{what}: tag {tag} is outside the MPI library's range 0..{self._tag_ub}")

    def send(self, tensor: Any, dst: int, tag: int) -> None:
        self._check("send", None)
        self._check_peer(dst, "send")
        self._check_tag(tag, "send")
        buffer = _borrow(tensor, False, "send")
        message = self._msg(buffer, readonly=True)
        comm = self._comm
        self._call("send", buffer, lambda: comm.Send(message, dst, tag))

    def isend(self, tensor: Any, dst: int, tag: int) -> MpiWork:
        self._check("isend", None)
        self._check_peer(dst, "isend")
        self._check_tag(tag, "isend")
        buffer = _borrow(tensor, False, "isend")
        message = self._msg(buffer, readonly=True)
        comm = self._comm
        return self._p2p("isend", buffer, lambda: comm.Isend(message, dst, tag), [tensor], None)

    def recv(self, tensor: Any, src: int, tag: int) -> int:
        self._check("recv", None)
        self._check_peer(src, "recv", any_source=True)
        self._check_tag(tag, "recv")
        buffer = _borrow(tensor, True, "recv")
        message = self._msg(buffer)
        status = self._MPI.Status()
        source = self._any_source if src == -1 else src
        comm = self._comm
        self._call("recv", buffer, lambda: comm.Recv(message, source, tag, status))
        return status.Get_source()

    def irecv(self, tensor: Any, src: int, tag: int) -> MpiWork:
        self._check("irecv", None)
        self._check_peer(src, "irecv", any_source=True)
        self._check_tag(tag, "irecv")
        buffer = _borrow(tensor, True, "irecv")
        message = self._msg(buffer)
        source = self._any_source if src == -1 else src
        comm = self._comm
        return self._p2p("irecv", buffer, lambda: comm.Irecv(message, source, tag), [tensor], self._MPI.Status())

    # --- lifetime ----------------------------------------------------------------------

    @property
    def is_shutdown(self) -> bool:
        return self._closed is not None

    def shutdown(self) -> None:
        """Refuses new calls and frees the group's communicator (MPI completes what is
        pending on it first)."""
        if self._closed is None:
            self._closed = f"group {self._group_name!r} has been destroyed"
            self._order.stop()  # after the queued collectives ran
            self._progress.engines.discard(self)
            if not self._MPI.Is_finalized():
                self._comm.Free()

    def abort(self) -> None:
        """Refuses new calls. MPI cannot abort one communicator's operations: one that is
        running keeps running (the watchdog ends the job if it outlives the timeout)."""
        if self._closed is None:
            self._closed = f"group {self._group_name!r} has been aborted"


class _Whole:
    """A run of memory with a dtype (what _scale and _divide_after take, and what _vector
    reads): one borrowed buffer, or a _Packed run of buffers of ``like``'s dtype."""

    __slots__ = ("address", "count", "dtype", "nbytes")

    def __init__(self, like: Any, packed: _Packed | None = None) -> None:
        self.address = like.address if packed is None else packed.address
        self.nbytes = like.nbytes if packed is None else packed.nbytes
        self.dtype = like.dtype
        self.count = self.nbytes // _ITEM_SIZE[like.dtype]


class _ScratchView(_Whole):
    """A scratch buffer (a borrowed bytearray, kept alive here) read as elements of
    ``like``'s dtype."""

    __slots__ = ("scratch",)

    def __init__(self, scratch: Any, like: Any) -> None:
        self.scratch = scratch
        self.address = scratch.address
        self.nbytes = scratch.nbytes
        self.dtype = like.dtype
        self.count = scratch.nbytes // _ITEM_SIZE[like.dtype]


def _scale(run: Any, factor: float) -> None:
    """PREMUL_SUM's scaling, in place on a borrowed buffer or a _Whole."""
    _C._premultiply(run.address, run.count, run.dtype, factor)
