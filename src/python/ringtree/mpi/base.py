"""What every MPI-backend call shares: the group's communicator and order, buffer
borrowing and MPI messages, running a blocking call (watched by the watchdog) or
queueing it for the group's worker, reductions around MPI (AVG, PREMUL_SUM), argument
checks and the group's lifetime; plus the packed runs of memory the list calls use.
MpiEngine (engine.py) is built on it."""

from __future__ import annotations

import ctypes
import time
from datetime import timedelta
from typing import Any, Callable, Sequence

from .. import _C
from ..errors import DistBackendError
from .reductions import AVG, Reductions, datatypes, op_code
from .work import CollectiveOrder, MpiWork, Progress, _wrap

__all__ = ["EngineBase", "Packed", "ScratchView", "Whole", "borrow", "item_size", "memmove", "scale"]

borrow = _C._borrow
memmove = ctypes.memmove
_MAX_COUNT = 2**31 - 1
_monotonic = time.monotonic
item_size = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
    "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16,
}


class Packed:
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
            self.scratch = borrow(bytearray(self.nbytes), True, "scratch")
            self.address = self.scratch.address

    def load(self) -> None:
        offset = self.address
        for part in self.parts:
            memmove(offset, part.address, part.nbytes)
            offset += part.nbytes

    def store(self, _status: Any = None) -> None:
        offset = self.address
        for part in self.parts:
            memmove(part.address, offset, part.nbytes)
            offset += part.nbytes


class EngineBase:
    """The shared part of MpiEngine (see the module docstring). ``comm`` is the group's
    own communicator (freed by shutdown); ``timeout`` bounds every operation (past it the
    job is aborted, see work.py)."""

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
        # The MPI datatype of each ringtree DataType, in the enum's order (_C._mpi_borrow).
        self._datatypes = tuple(self._types.values())
        self._mpi_error = MPI.Exception
        # (dtype, op) -> (MPI op, op code, PREMUL_SUM factor): the calls' reductions.
        self._op_cache: dict[tuple[str, Any], tuple[Any, int, float | None]] = {}
        self._fromaddress = MPI.buffer.fromaddress
        self._in_place = MPI.IN_PLACE
        self._any_source = MPI.ANY_SOURCE
        self._tag_ub = comm.Get_attr(MPI.TAG_UB) or 32767
        self._closed: str | None = None
        # The synchronous call running now: (deadline, what, buffer) for the watchdog.
        self._running: tuple[float, str, Any] | None = None
        # MpiEngine's C calls (_C._MpiFastCalls), if any: told here when they must stop
        # serving (the group got a worker, or was closed).
        self._fast: Any = None
        self._order = CollectiveOrder(f"ringtree-mpi-{group_name}")
        progress.engines.add(self)

    # --- plumbing ---------------------------------------------------------------------

    def _describe(self, what: str, buffer: Any = None) -> str:
        return self._describe_call(what, None if buffer is None else (buffer.dtype, buffer.count))

    def _describe_call(self, what: str, data: tuple[str, int] | None) -> str:
        detail = f" ({data[0]}, {data[1]} elements)" if data is not None else ""
        return f"rank {self._global_rank}: {what}{detail} on group {self._group_name!r} (MPI)"

    def overdue(self, now: float) -> str | None:
        """The call this group runs past its deadline (Python path or C calls), else None."""
        running = self._running
        if running is not None and now > running[0]:
            return self._describe(running[1], running[2])
        late = self._fast.overdue(now) if self._fast is not None else None
        return None if late is None else self._describe_call(late[0], (late[1], late[2]))

    def _raise_mpi_error(self, what: str, buffer: Any, exc: BaseException) -> None:
        """Raises an MPI error of ``what`` as ringtree's (the C calls' error path)."""
        raise _wrap(exc, self._describe(what, buffer))

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

    def _vector(self, buffer: Any, packed: Packed, counts: list[int], readonly: bool) -> list[Any]:
        """A "v" message over ``packed`` (one block of ``counts[r]`` elements per rank)."""
        total = sum(counts)
        if total > _MAX_COUNT:
            raise ValueError(f"the mpi backend moves at most {_MAX_COUNT} elements in one call, got {total}")
        displacements = [0] * len(counts)
        for index in range(1, len(counts)):
            displacements[index] = displacements[index - 1] + counts[index - 1]
        return [self._fromaddress(packed.address, packed.nbytes, readonly), (counts, displacements),
                self._types[buffer.dtype]]

    def _call(self, what: str, buffer: Any, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Runs one blocking MPI call, function(*args), watched by the watchdog; MPI
        errors become DistBackendError naming the call."""
        self._running = (_monotonic() + self._timeout, what, buffer)
        try:
            function(*args)
        except self._mpi_error as exc:
            raise _wrap(exc, self._describe(what, buffer))  # noqa: B904 - _wrap sets the cause
        finally:
            self._running = None

    def _run(
        self,
        what: str,
        buffer: Any,
        async_op: bool,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        outputs: list[Any],
        keep: Any,
        finish: Callable[[Any], None] | None = None,
    ) -> MpiWork | None:
        """Runs one collective, function(*args), in the group's order: a synchronous one on
        this thread when nothing is queued before it (then ``finish``), else through the
        group's worker thread, which runs the asynchronous ones (see CollectiveOrder)."""
        if not async_op:
            with self._order.lock:
                if not self._order.queue:
                    self._call(what, buffer, function, args)
                    if finish is not None:
                        finish(None)
                    return None
            self._submit(what, buffer, function, args, outputs, keep, finish).wait()
            return None
        return self._submit(what, buffer, function, args, outputs, keep, finish)

    def _submit(self, what: str, buffer: Any, function: Callable[..., Any], args: tuple[Any, ...],
                outputs: list[Any], keep: Any, finish: Callable[[Any], None] | None) -> MpiWork:
        if self._fast is not None:
            # From now on synchronous calls may have to queue behind the worker's: only the
            # Python path, which takes the group's order lock, knows how.
            self._fast.enabled = False
        work = MpiWork(outputs, keep, finish, lambda: self._describe(what, buffer))

        def run() -> None:
            try:
                self._call(what, buffer, function, args)
            except BaseException as exc:  # noqa: BLE001 - stored in the Work
                work._finished(exc)
            else:
                work._finished(None)

        self._order.submit(run)
        return work

    def _reduction(self, dtype: str, op: Any, what: str) -> tuple[Any, int, float | None]:
        """(MPI op, op code, factor) of ``op`` on ``dtype``, cached by (dtype, op);
        ValueError/TypeError for an op the engine does not define on the type."""
        key = (dtype, op)
        try:
            cached = self._op_cache.get(key)
        except TypeError:  # an unhashable op object: worked out on every call
            key, cached = None, None
        if cached is None:
            code, factor = op_code(op)
            reduction = self._reductions.get(dtype, code, what)
            cached = (reduction.op, reduction.kind, factor)
            if key is not None:
                self._op_cache[key] = cached
        return cached

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
        copy = ScratchView(borrow(bytearray(buffer.nbytes), True, "scratch"), buffer)
        memmove(copy.address, buffer.address, buffer.nbytes)
        scale(copy, factor)
        return copy

    @staticmethod
    def _same_dtype(buffers: Sequence[Any], dtype: str, what: str, name: str) -> None:
        for buffer in buffers:
            if buffer.dtype != dtype:
                raise ValueError(f"{what}: every buffer must hold {dtype}, but {name} holds {buffer.dtype}")

    def _per_rank(self, buffers: Sequence[Any], what: str, name: str) -> None:
        if len(buffers) != self.size:
            raise ValueError(f"{what}: {name} must have one buffer per rank ({self.size}), got {len(buffers)}")

    def _check_root(self, root: int, what: str) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"{what}: root {root} is not a rank of this group of {self.size} ranks")

    def _check_p2p(self, what: str, peer: int, tag: int, any_source: bool) -> None:
        """Raises for a closed group, a peer that is not another rank of it (-1 is any
        rank, where ``any_source``) or a tag outside MPI's range."""
        self._check(what, None)
        if not (any_source and peer == -1) and (not 0 <= peer < self.size or peer == self.rank):
            raise ValueError(f"{what}: peer {peer} is not another rank of this group of {self.size}")
        if not 0 <= tag <= self._tag_ub:
            raise ValueError(f"{what}: tag {tag} is outside the MPI library's range 0..{self._tag_ub}")

    # --- lifetime ----------------------------------------------------------------------

    @property
    def is_shutdown(self) -> bool:
        return self._closed is not None

    def shutdown(self) -> None:
        """Refuses new calls and frees the group's communicator (MPI completes what is
        pending on it first)."""
        if self._closed is None:
            self._closed = f"group {self._group_name!r} has been destroyed"
            if self._fast is not None:
                self._fast.enabled, self._fast.closed = False, True
            self._order.stop()  # after the queued collectives ran
            self._progress.engines.discard(self)
            if not self._MPI.Is_finalized():
                self._comm.Free()

    def abort(self) -> None:
        """Refuses new calls. MPI cannot abort one communicator's operations: one that is
        running keeps running (the watchdog ends the job if it outlives the timeout)."""
        if self._closed is None:
            self._closed = f"group {self._group_name!r} has been aborted"
            if self._fast is not None:
                self._fast.enabled, self._fast.closed = False, True


class Whole:
    """A run of memory with a dtype (what _scale and _divide_after take, and what _vector
    reads): one borrowed buffer, or a Packed run of buffers of ``like``'s dtype."""

    __slots__ = ("address", "count", "dtype", "nbytes")

    def __init__(self, like: Any, packed: Packed | None = None) -> None:
        self.address = like.address if packed is None else packed.address
        self.nbytes = like.nbytes if packed is None else packed.nbytes
        self.dtype = like.dtype
        self.count = self.nbytes // item_size[like.dtype]


class ScratchView(Whole):
    """A scratch buffer (a borrowed bytearray, kept alive here) read as elements of
    ``like``'s dtype."""

    __slots__ = ("scratch",)

    def __init__(self, scratch: Any, like: Any) -> None:
        self.scratch = scratch
        self.address = scratch.address
        self.nbytes = scratch.nbytes
        self.dtype = like.dtype
        self.count = scratch.nbytes // item_size[like.dtype]


def scale(run: Any, factor: float) -> None:
    """PREMUL_SUM's scaling, in place on a borrowed buffer or a Whole."""
    _C._premultiply(run.address, run.count, run.dtype, factor)
