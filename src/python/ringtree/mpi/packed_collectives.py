"""The list and coalesced calls of MpiEngine (all_gather, gather, scatter,
reduce_scatter, all_to_all, all_to_all_single and the coalesced forms): each is one MPI
"v" collective over its buffers, in place when they lie end to end in rank order (views
of one tensor), else through one packed scratch buffer and a copy. all_to_all_single
with split sizes is MPI_Alltoallv on the caller's memory."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .base import EngineBase, Packed, ScratchView, Whole, borrow, item_size, memmove, scale
from .reductions import PREMUL_SUM
from .work import MpiWork

__all__ = ["PackedCollectives"]


class PackedCollectives(EngineBase):
    """The calls that take lists of buffers, or several buffers as one operation."""

    def allgather(self, tensor_list: Sequence[Any], tensor: Any, async_op: bool, algorithm: Any = None):
        self._check("all_gather", algorithm)
        buffer = borrow(tensor, False, "all_gather")
        outputs = [borrow(output, True, "all_gather") for output in tensor_list]
        self._per_rank(outputs, "all_gather", "tensor_list")
        self._same_dtype(outputs, buffer.dtype, "all_gather", "tensor_list")
        if outputs[self.rank].count != buffer.count:
            raise ValueError(
                f"all_gather: tensor_list[{self.rank}] has {outputs[self.rank].count} elements, but this rank's "
                f"tensor has {buffer.count}"
            )
        packed = Packed(outputs)
        receive = self._vector(buffer, packed, [output.count for output in outputs], False)
        send = self._msg(buffer, readonly=True)
        comm = self._comm
        return self._run(
            "all_gather", buffer, async_op,
            comm.Allgatherv, (send, receive),
            list(tensor_list), (buffer, packed), packed.store if packed.copied else None,
        )

    def gather(self, tensor: Any, gather_list: Sequence[Any] | None, root: int, async_op: bool,
               algorithm: Any = None) -> MpiWork | None:
        self._check("gather", algorithm)
        self._check_root(root, "gather")
        buffer = borrow(tensor, False, "gather")
        send = self._msg(buffer, readonly=True)
        comm, packed, receive, outputs = self._comm, None, None, []
        if root == self.rank:
            if gather_list is None:
                raise ValueError("gather: gather_list must be given on the destination rank")
            parts = [borrow(output, True, "gather") for output in gather_list]
            self._per_rank(parts, "gather", "gather_list")
            self._same_dtype(parts, buffer.dtype, "gather", "gather_list")
            packed = Packed(parts)
            receive = self._vector(buffer, packed, [part.count for part in parts], False)
            outputs = list(gather_list)
        return self._run(
            "gather", buffer, async_op,
            comm.Gatherv, (send, receive, root),
            outputs, (buffer, packed), packed.store if packed is not None and packed.copied else None,
        )

    def scatter(self, tensor: Any, scatter_list: Sequence[Any] | None, root: int, async_op: bool,
                algorithm: Any = None) -> MpiWork | None:
        self._check("scatter", algorithm)
        self._check_root(root, "scatter")
        buffer = borrow(tensor, True, "scatter")
        receive = self._msg(buffer)
        comm, packed, send = self._comm, None, None
        if root == self.rank:
            if scatter_list is None:
                raise ValueError("scatter: scatter_list must be given on the source rank")
            parts = [borrow(part, False, "scatter") for part in scatter_list]
            self._per_rank(parts, "scatter", "scatter_list")
            self._same_dtype(parts, buffer.dtype, "scatter", "scatter_list")
            packed = Packed(parts)
            if packed.copied:
                packed.load()
            send = self._vector(buffer, packed, [part.count for part in parts], True)
        return self._run(
            "scatter", buffer, async_op,
            comm.Scatterv, (send, receive, root),
            [tensor], (buffer, packed),
        )

    def reduce_scatter(self, output: Any, input_list: Sequence[Any], op: Any, async_op: bool,
                       algorithm: Any = None) -> MpiWork | None:
        self._check("reduce_scatter", algorithm)
        buffer = borrow(output, True, "reduce_scatter")
        parts = [borrow(part, False, "reduce_scatter") for part in input_list]
        self._per_rank(parts, "reduce_scatter", "input_list")
        self._same_dtype(parts, buffer.dtype, "reduce_scatter", "input_list")
        mpi_op, kind, factor = self._reduction(buffer.dtype, op, "reduce_scatter")
        packed = Packed(parts, force_copy=kind == PREMUL_SUM)
        if packed.copied:
            packed.load()
        if kind == PREMUL_SUM:
            scale(ScratchView(packed.scratch, buffer), factor)
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
            comm.Reduce_scatter, ([send, self._types[buffer.dtype]], receive, counts, mpi_op),
            [output], (buffer, packed), self._divide_after(kind, buffer),
        )

    def alltoall(self, output_tensor_list: Sequence[Any], input_tensor_list: Sequence[Any], async_op: bool,
                 algorithm: Any = None) -> MpiWork | None:
        self._check("all_to_all", algorithm)
        inputs = [borrow(part, False, "all_to_all") for part in input_tensor_list]
        outputs = [borrow(part, True, "all_to_all") for part in output_tensor_list]
        self._per_rank(inputs, "all_to_all", "input_tensor_list")
        self._per_rank(outputs, "all_to_all", "output_tensor_list")
        dtype_of = inputs[0]
        self._same_dtype(inputs + outputs, dtype_of.dtype, "all_to_all", "a list")
        sent, received = Packed(inputs), Packed(outputs)
        if sent.copied:
            sent.load()
        send = self._vector(dtype_of, sent, [part.count for part in inputs], True)
        receive = self._vector(dtype_of, received, [part.count for part in outputs], False)
        comm = self._comm
        return self._run(
            "all_to_all", dtype_of, async_op,
            comm.Alltoallv, (send, receive),
            list(output_tensor_list), (inputs, sent, received), received.store if received.copied else None,
        )

    def alltoall_single(self, output: Any, input: Any, output_split_sizes: Any, input_split_sizes: Any,  # noqa: A002
                        async_op: bool, algorithm: Any = None) -> MpiWork | None:
        what = "all_to_all_single"
        self._check(what, algorithm)
        source = borrow(input, False, what)
        target = borrow(output, True, what)
        self._same_dtype([target], source.dtype, what, "output")
        send_counts = self._split_counts(source, input_split_sizes, "input_split_sizes", what)
        receive_counts = self._split_counts(target, output_split_sizes, "output_split_sizes", what)
        send = self._vector(source, Whole(source), send_counts, True)
        receive = self._vector(target, Whole(target), receive_counts, False)
        comm = self._comm
        return self._run(
            what, source, async_op,
            comm.Alltoallv, (send, receive),
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
        parts = [borrow(tensor, True, what) for tensor in tensors]
        if not parts:
            raise ValueError(f"{what}: tensors must not be empty")
        first = parts[0]
        self._same_dtype(parts, first.dtype, what, "tensors")
        mpi_op, kind, factor = self._reduction(first.dtype, op, what)
        packed = Packed(parts)
        if packed.copied:
            packed.load()
        whole = Whole(first, packed)
        if kind == PREMUL_SUM:
            scale(whole, factor)
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
            comm.Allreduce, (in_place, message, mpi_op),
            list(tensors), (parts, packed), finish,
        )

    def allgather_coalesced(self, output_tensor_lists: Sequence[Sequence[Any]], input_tensor_list: Sequence[Any],
                            async_op: bool) -> MpiWork | None:
        what = "all_gather_coalesced"
        self._check(what, None)
        inputs = [borrow(tensor, False, what) for tensor in input_tensor_list]
        if len(output_tensor_lists) != self.size:
            raise ValueError(f"{what}: output_tensor_lists must have one list per rank ({self.size}), "
                             f"got {len(output_tensor_lists)}")
        outputs = [[borrow(tensor, True, what) for tensor in row] for row in output_tensor_lists]
        if not inputs:
            raise ValueError(f"{what}: input_tensor_list must not be empty")
        first = inputs[0]
        flat = [part for row in outputs for part in row]
        self._same_dtype(inputs + flat, first.dtype, what, "a list")
        counts = [sum(part.count for part in row) for row in outputs]
        if counts[self.rank] != sum(part.count for part in inputs):
            raise ValueError(f"{what}: output_tensor_lists[{self.rank}] holds {counts[self.rank]} elements, "
                             f"but the inputs hold {sum(part.count for part in inputs)}")
        sent, received = Packed(inputs), Packed(flat)
        if sent.copied:
            sent.load()
        send = self._message(first, sent.address, sent.nbytes, counts[self.rank], True)
        receive = self._vector(first, received, counts, False)
        comm = self._comm
        return self._run(
            what, first, async_op,
            comm.Allgatherv, (send, receive),
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
        sent = Packed(inputs, force_copy=True)
        sent.load()
        block = sent.nbytes
        gathered = borrow(bytearray(block * self.size), True, "scratch")
        send = self._message(first, sent.address, block, block // item_size[first.dtype], True)
        receive = self._message(first, gathered.address, gathered.nbytes, block // item_size[first.dtype], False)

        def finish(status: Any = None) -> None:
            for rank in range(self.size):
                offset = gathered.address + rank * block
                for source, target in zip(inputs, outputs):
                    memmove(target.address + rank * source.nbytes, offset, source.nbytes)
                    offset += source.nbytes

        comm = self._comm
        return self._run(
            what, first, async_op,
            comm.Allgather, (send, receive),
            list(output_tensors), (inputs, outputs, sent, gathered), finish,
        )

    def reduce_scatter_single_coalesced(self, outputs: Sequence[Any], inputs: Sequence[Any], op: Any,
                                        async_op: bool) -> MpiWork | None:
        """One MPI_Reduce_scatter_block over the inputs regrouped by destination rank."""
        what = "reduce_scatter_tensor_coalesced"
        self._check(what, None)
        sources, targets = self._coalesced_pairs(outputs, inputs, what, lambda o, i: i == o * self.size)
        first = targets[0]
        mpi_op, kind, factor = self._reduction(first.dtype, op, what)
        block = sum(target.nbytes for target in targets)  # what each rank ends with
        regrouped = borrow(bytearray(block * self.size), True, "scratch")
        offset = regrouped.address
        for rank in range(self.size):
            for source, target in zip(sources, targets):
                memmove(offset, source.address + rank * target.nbytes, target.nbytes)
                offset += target.nbytes
        if kind == PREMUL_SUM:
            scale(ScratchView(regrouped, first), factor)
        result = borrow(bytearray(block), True, "scratch")
        count = block // item_size[first.dtype]
        send = self._message(first, regrouped.address, regrouped.nbytes, count, True)
        receive = self._message(first, result.address, block, count, False)
        divide = self._divide_after(kind, *targets)

        def finish(status: Any = None) -> None:
            offset = result.address
            for target in targets:
                memmove(target.address, offset, target.nbytes)
                offset += target.nbytes
            if divide is not None:
                divide()

        comm = self._comm
        return self._run(
            what, first, async_op,
            comm.Reduce_scatter_block, (send, receive, mpi_op),
            list(outputs), (sources, targets, regrouped, result), finish,
        )

    def _coalesced_pairs(self, outputs: Sequence[Any], inputs: Sequence[Any], what: str,
                         sizes_match: Callable[[int, int], bool]) -> tuple[list[Any], list[Any]]:
        if len(outputs) != len(inputs) or not inputs:
            raise ValueError(f"{what}: needs as many outputs as inputs (at least one), got {len(outputs)} and "
                             f"{len(inputs)}")
        sources = [borrow(tensor, False, what) for tensor in inputs]
        targets = [borrow(tensor, True, what) for tensor in outputs]
        self._same_dtype(sources + targets, sources[0].dtype, what, "a tensor")
        for index, (source, target) in enumerate(zip(sources, targets)):
            if not sizes_match(target.count, source.count):
                raise ValueError(f"{what}: outputs[{index}] ({target.count} elements) does not match "
                                 f"inputs[{index}] ({source.count} elements) for world_size {self.size}")
        return sources, targets
