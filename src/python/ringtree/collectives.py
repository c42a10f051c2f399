"""Collectives on CPU buffers: all_reduce, broadcast, reduce, barrier, the gather/scatter
family (all_gather, gather, scatter, reduce_scatter, all_to_all and their single-tensor
forms) and the coalesced all_reduce/all_gather.

Signatures and behaviour are torch.distributed 2.13's. A buffer is a torch tensor, a NumPy
array, any object with ``__dlpack__`` or, failing that, the buffer protocol (bytearray,
memoryview, array.array); it must be contiguous host memory and is used in place,
zero-copy. Every rank of the group must make the same calls in the same order with
matching buffers (element count and dtype) and arguments. All buffers of one call hold one
dtype. A rank that is not a member of ``group`` (``GroupMember.NON_GROUP_MEMBER``) gets
torch's warning and the call does nothing (returns None).

Errors: ``ValueError`` (or ``TypeError`` for an unsupported dtype) for invalid arguments,
raised before any data moves; ``DistNetworkError`` when a peer dies,
``DistTimeoutError`` past the group's timeout, ``CollectiveMismatchError`` when ranks
disagree on the call. After any of the last three the group is unusable.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ._C import Work
from ._reduce_op import ReduceOp
from ._resolve import default_group, member_group, resolve_rank, resolve_root
from ._world import world
from .process_group import ProcessGroup

__all__ = [
    "Work",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
]


def all_reduce(
    tensor: Any,
    op: Any = ReduceOp.SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Reduces the tensor data across all ranks so that all get the final result.

    After the call ``tensor`` is bitwise identical in all processes.

    Args:
        tensor: Input and output of the collective; modified in place.
        op (ReduceOp, optional): One of the ``ReduceOp.RedOpType`` values, or a
            ``ReduceOp`` instance (``ReduceOp(ReduceOp.PREMUL_SUM, factor)``). Complex
            tensors support SUM, AVG and PREMUL_SUM; BAND, BOR and BXOR need integer or
            bool tensors.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        algorithm (str, optional): ringtree extension, keyword only: run this call with
            the named algorithm instead of the automatic choice (``"ring"``, ``"tree"``,
            ``"halving_doubling"``, ``"chain"``, ``"shm_direct"``; each collective accepts
            the ones it implements, see docs/architecture.md). Every rank must pass the same.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op.
    """
    # The default group read inline (see _resolve.py): small-message latency rides on this call.
    pg = (world.default_pg or default_group()) if group is None else member_group(group, "all_reduce")
    if pg is None:
        return None
    work = pg.engine.allreduce(tensor, op, async_op, algorithm)
    if work is not None:  # async: the tensors for Work.result()/get_future() (work.py)
        work._outputs = [tensor]
    return work


def broadcast(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_src: int | None = None,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Broadcasts the tensor to the whole group.

    ``tensor`` must have the same number of elements in all processes participating in
    the collective.

    Args:
        tensor: Data to be sent if ``src`` is the rank of the current process, and the
            tensor that receives the data otherwise.
        src (int): Source rank on the global process group (regardless of ``group``).
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        group_src (int): Source rank on ``group``. Must specify one of ``group_src`` and
            ``src`` but not both.
        algorithm (str, optional): ringtree extension, keyword only: run this call with
            the named algorithm instead of the automatic choice (``"ring"``, ``"tree"``,
            ``"halving_doubling"``, ``"chain"``, ``"shm_direct"``; each collective accepts
            the ones it implements, see docs/architecture.md). Every rank must pass the same.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op.
    """
    pg = (world.default_pg or default_group()) if group is None else member_group(group, "broadcast")
    if pg is None:
        return None
    root = resolve_rank(pg, src, group_src, "src")
    work = pg.engine.broadcast(tensor, root, async_op, algorithm)
    if work is not None:
        work._outputs = [tensor]
    return work


def reduce(
    tensor: Any,
    dst: int | None = None,
    op: Any = ReduceOp.SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_dst: int | None = None,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Reduces the tensor data across all ranks; only the process with rank ``dst`` gets
    the result (the others' tensors are left unchanged).

    Args:
        tensor: Input of the collective, and its output on ``dst``; modified in place.
        dst (int): Destination rank on the global process group (regardless of
            ``group``).
        op (ReduceOp, optional): As for :func:`all_reduce`.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        group_dst (int): Destination rank on ``group``. Must specify one of ``group_dst``
            and ``dst`` but not both.
        algorithm (str, optional): ringtree extension, keyword only: run this call with
            the named algorithm instead of the automatic choice (``"ring"``, ``"tree"``,
            ``"halving_doubling"``, ``"chain"``, ``"shm_direct"``; each collective accepts
            the ones it implements, see docs/architecture.md). Every rank must pass the same.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op.
    """
    pg = (world.default_pg or default_group()) if group is None else member_group(group, "reduce")
    if pg is None:
        return None
    root = resolve_rank(pg, dst, group_dst, "dst")
    work = pg.engine.reduce(tensor, root, op, async_op, algorithm)
    if work is not None:
        work._outputs = [tensor]
    return work


def barrier(
    group: ProcessGroup | None = None,
    async_op: bool = False,
    device_ids: list[int] | None = None,
    timeout: timedelta | None = None,
) -> Work | None:
    """Synchronizes all processes: blocks until the whole group enters this function
    (or, if async_op, until the returned work's ``wait()`` is called).

    Args:
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        device_ids ([int], optional): Accelerator ids; accepted for compatibility, unused
            by the CPU engine.
        timeout (datetime.timedelta, optional): Deadline of this barrier; the group's
            timeout when None. Past it, DistTimeoutError names the ranks that never came.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op.
    """
    pg = (world.default_pg or default_group()) if group is None else member_group(group, "barrier")
    if pg is None:
        return None
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {type(timeout).__name__}")
    work = pg.engine.barrier(timeout, async_op)
    if work is not None:
        work._outputs = []
    return work


# --- The gather/scatter family --------------------------------------------------------------
#
# Every function below takes torch.distributed 2.13's arguments; where a collective
# implements several algorithms it also takes ringtree's keyword-only ``algorithm=``
# (see all_reduce). Sizes are checked before any data moves (ValueError naming the
# argument); the element counts of one rank's call must match what the other ranks' calls
# expect, else every rank raises CollectiveMismatchError.


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`ringtree.{old}` is deprecated. Please use `ringtree.{new}` instead.", FutureWarning, stacklevel=3)


def _check_root_list(is_root: bool, tensors: Sequence[Any] | None, name: str, root_name: str) -> None:
    """torch's rule for gather_list/scatter_list: given (not None nor empty) on the root only.
    Anything but a list or tuple counts as given (the engine then refuses it)."""
    given = tensors is not None and not (isinstance(tensors, (list, tuple)) and len(tensors) == 0)
    if is_root and not given:
        raise ValueError(f"Argument ``{name}`` must be specified on {root_name} rank.")
    if not is_root and given:
        raise ValueError(f"Argument ``{name}`` must NOT be specified on non-{root_name} ranks.")


def all_gather(
    tensor_list: list[Any],
    tensor: Any,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Gathers tensors from the whole group in a list.

    Complex and uneven sized tensors are supported: ``tensor_list[r]`` must have rank
    ``r``'s ``tensor``'s number of elements. ``tensor`` may be ``tensor_list[rank]``
    itself (in place).

    Args:
        tensor_list (list[Tensor]): Output list, one correctly-sized tensor per rank.
        tensor (Tensor): Tensor to be broadcast from current process.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        algorithm (str, optional): ringtree extension: ``"ring"``, ``"halving_doubling"``
            or ``"shm_direct"`` instead of the automatic choice (see :func:`all_reduce`).

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op or if not part of the group.
    """
    pg = member_group(group, "all_gather")
    if pg is None:
        return None
    work = pg.engine.allgather(tensor_list, tensor, async_op, algorithm)
    if work is not None:
        work._outputs = tensor_list
    return work


def all_gather_single(
    output_tensor: Any,
    input_tensor: Any,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Gathers tensors from all ranks into a single output tensor.

    Every rank's ``input_tensor`` has the same size; ``output_tensor`` holds world_size
    times as many elements, rank ``r``'s input at elements ``[r * n, (r + 1) * n)``: the
    concatenation or the stack of the inputs along dim 0. In place: ``input_tensor`` is
    that part of ``output_tensor`` on each rank.

    Args:
        output_tensor (Tensor): Output tensor to accommodate tensor elements from all ranks.
        input_tensor (Tensor): Tensor to be gathered from current rank.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        algorithm (str, optional): As for :func:`all_gather`.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op or if not part of the group.
    """
    pg = member_group(group, "all_gather_single")
    if pg is None:
        return None
    work = pg.engine.allgather_single(output_tensor, input_tensor, async_op, algorithm)
    if work is not None:
        work._outputs = [output_tensor]
    return work


def all_gather_into_tensor(
    output_tensor: Any, input_tensor: Any, group: ProcessGroup | None = None, async_op: bool = False
) -> Work | None:
    """Deprecated alias of :func:`all_gather_single` (FutureWarning, as in torch 2.13)."""
    _deprecated("all_gather_into_tensor", "all_gather_single")
    return all_gather_single(output_tensor, input_tensor, group, async_op)


def _all_gather_base(
    output_tensor: Any, input_tensor: Any, group: ProcessGroup | None = None, async_op: bool = False
) -> Work | None:
    """Private alias of :func:`all_gather_single` (FutureWarning, as in torch 2.13)."""
    warnings.warn(
        "`ringtree._all_gather_base` is a private function and will be deprecated. "
        "Please use `ringtree.all_gather_single` instead.",
        FutureWarning,
        stacklevel=2,
    )
    return all_gather_single(output_tensor, input_tensor, group, async_op)


def gather(
    tensor: Any,
    gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_dst: int | None = None,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Gathers a list of tensors in a single process.

    Every rank's ``tensor`` and every tensor of ``gather_list`` have the same size.

    Args:
        tensor (Tensor): Input tensor.
        gather_list (list[Tensor], optional): One tensor per rank for the gathered data;
            must be given on the destination rank and only there.
        dst (int, optional): Destination rank on the global process group (regardless of
            ``group``). If both ``dst`` and ``group_dst`` are None, global rank 0.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        group_dst (int, optional): Destination rank on ``group``. Invalid to specify both
            ``dst`` and ``group_dst``.
        algorithm (str, optional): ringtree extension: ``"tree"`` or ``"linear"``.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op or if not part of the group.
    """
    pg = member_group(group, "gather")
    if pg is None:
        return None
    root = resolve_root(pg, dst, group_dst, "dst")
    _check_root_list(pg.rank() == root, gather_list, "gather_list", "destination")
    work = pg.engine.gather(tensor, gather_list, root, async_op, algorithm)
    if work is not None:
        work._outputs = gather_list if root == pg.rank() else []
    return work


def scatter(
    tensor: Any,
    scatter_list: list[Any] | None = None,
    src: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_src: int | None = None,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Scatters a list of tensors to all processes in a group: each receives
    ``scatter_list[rank]`` of the source into ``tensor``. Complex tensors are supported.

    Args:
        tensor (Tensor): Output tensor.
        scatter_list (list[Tensor], optional): One tensor per rank, each of ``tensor``'s
            size; must be given on the source rank and only there.
        src (int, optional): Source rank on the global process group (regardless of
            ``group``). If both ``src`` and ``group_src`` are None, global rank 0.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        group_src (int, optional): Source rank on ``group``. Invalid to specify both
            ``src`` and ``group_src``.
        algorithm (str, optional): ringtree extension: ``"tree"`` or ``"linear"``.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op or if not part of the group.
    """
    pg = member_group(group, "scatter")
    if pg is None:
        return None
    root = resolve_root(pg, src, group_src, "src")
    _check_root_list(pg.rank() == root, scatter_list, "scatter_list", "source")
    work = pg.engine.scatter(tensor, scatter_list, root, async_op, algorithm)
    if work is not None:
        work._outputs = [tensor]
    return work


def reduce_scatter(
    output: Any,
    input_list: list[Any],
    op: Any = ReduceOp.SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Reduces, then scatters a list of tensors to all processes in a group:
    ``output`` <- op over every rank's ``input_list[rank]``.

    ``input_list[r]`` may have a different size for each ``r`` (the same on every rank);
    ``output`` has the size of ``input_list[rank]`` and may be that tensor (in place).

    Args:
        output (Tensor): Output tensor.
        input_list (list[Tensor]): List of tensors to reduce and scatter, one per rank.
        op (ReduceOp, optional): As for :func:`all_reduce`.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        algorithm (str, optional): ringtree extension: ``"ring"``, ``"pairwise"`` or
            ``"shm_direct"``.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op or if not part of the group.
    """
    pg = member_group(group, "reduce_scatter")
    if pg is None:
        return None
    work = pg.engine.reduce_scatter(output, input_list, op, async_op, algorithm)
    if work is not None:
        work._outputs = [output]
    return work


def reduce_scatter_single(
    output: Any,
    input: Any,  # noqa: A002 (torch's name)
    op: Any = ReduceOp.SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Reduces, then scatters a tensor to all ranks in a group.

    ``input`` holds world_size times ``output``'s number of elements (the concatenation or
    the stack of the parts along dim 0); ``output`` <- op over every rank's part ``rank``
    of ``input``. In place: ``output`` is that part of ``input``.

    Args:
        output (Tensor): Output tensor, of the same size on every rank.
        input (Tensor): Input tensor to be reduced and scattered.
        op (ReduceOp, optional): As for :func:`all_reduce`.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        algorithm (str, optional): As for :func:`reduce_scatter`.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op or if not part of the group.
    """
    pg = member_group(group, "reduce_scatter_single")
    if pg is None:
        return None
    work = pg.engine.reduce_scatter_single(output, input, op, async_op, algorithm)
    if work is not None:
        work._outputs = [output]
    return work


def reduce_scatter_tensor(
    output: Any,
    input: Any,  # noqa: A002 (torch's name)
    op: Any = ReduceOp.SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Deprecated alias of :func:`reduce_scatter_single` (FutureWarning, as in torch 2.13)."""
    _deprecated("reduce_scatter_tensor", "reduce_scatter_single")
    return reduce_scatter_single(output, input, op, group, async_op)


def _reduce_scatter_base(
    output: Any,
    input: Any,  # noqa: A002 (torch's name)
    op: Any = ReduceOp.SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Private alias of :func:`reduce_scatter_single` (FutureWarning, as in torch 2.13)."""
    warnings.warn(
        "`ringtree._reduce_scatter_base` is a private function and will be deprecated. "
        "Please use `ringtree.reduce_scatter_single` instead.",
        FutureWarning,
        stacklevel=2,
    )
    return reduce_scatter_single(output, input, op, group, async_op)


def all_to_all(
    output_tensor_list: list[Any],
    input_tensor_list: list[Any],
    group: ProcessGroup | None = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Scatters a list of input tensors to all processes in a group and gathers what each
    sends into a list: ``output_tensor_list[r]`` <- rank ``r``'s ``input_tensor_list[rank]``.

    Sizes may differ: ``input_tensor_list[p]`` here must have the size of
    ``output_tensor_list[rank]`` on rank ``p``. Complex tensors are supported. Inputs and
    outputs must not overlap, except ``input_tensor_list[rank]`` being
    ``output_tensor_list[rank]``.

    Args:
        output_tensor_list (list[Tensor]): Tensors to be gathered, one per rank.
        input_tensor_list (list[Tensor]): Tensors to scatter, one per rank.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        algorithm (str, optional): ringtree extension: ``"pairwise"`` or ``"shm_direct"``.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op or if not part of the group.
    """
    pg = member_group(group, "all_to_all")
    if pg is None:
        return None
    work = pg.engine.alltoall(output_tensor_list, input_tensor_list, async_op, algorithm)
    if work is not None:
        work._outputs = output_tensor_list
    return work


def _split_sizes(split_sizes: Sequence[int] | None, name: str) -> list[int] | None:
    """``split_sizes`` as a list of ints for the engine, which checks them against the
    buffer's dim 0 and the group size; None or empty means equal parts."""
    if not split_sizes:
        return None
    sizes = list(split_sizes)
    if any(not isinstance(s, int) or s < 0 for s in sizes):
        raise ValueError(f"all_to_all_single: {name}_split_sizes must be non-negative ints, got {sizes}")
    return sizes


def all_to_all_single(
    output: Any,
    input: Any,  # noqa: A002 (torch's name)
    output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Splits ``input`` along dim 0, sends part ``r`` to rank ``r``, and concatenates what
    every rank sent into ``output``, in rank order. Complex tensors are supported.

    Args:
        output (Tensor): Gathered concatenated output tensor.
        input (Tensor): Input tensor to scatter. Must not overlap ``output``.
        output_split_sizes (list[int], optional): Rows of dim 0 of ``output`` received
            from each rank; None or empty: dim 0 of ``output`` divides equally by
            world_size.
        input_split_sizes (list[int], optional): Rows of dim 0 of ``input`` sent to each
            rank; None or empty: dim 0 of ``input`` divides equally by world_size.
            ``input_split_sizes[p]`` here must equal ``output_split_sizes[rank]`` on rank
            ``p`` (in elements).
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.
        algorithm (str, optional): As for :func:`all_to_all`.

    Returns:
        Async work handle, if async_op is set to True.
        None, if not async_op or if not part of the group.
    """
    pg = member_group(group, "all_to_all_single")
    if pg is None:
        return None
    work = pg.engine.alltoall_single(
        output,
        input,
        _split_sizes(output_split_sizes, "output"),
        _split_sizes(input_split_sizes, "input"),
        async_op,
        algorithm,
    )
    if work is not None:
        work._outputs = [output]
    return work


# --- Coalesced ------------------------------------------------------------------------------


def all_reduce_coalesced(
    tensors: Any, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None, async_op: bool = False
) -> Work | None:
    """Reduces each tensor of ``tensors`` (one dtype) across all ranks, as one operation, so
    that all get the final results; every rank ends with bitwise-identical tensors.

    Tensors smaller than 256 KiB are packed into one scratch buffer that a single allreduce
    reduces (one round of latency for all of them), larger ones are reduced in place one by
    one. Shapes are not checked across ranks (as in torch): every rank must pass tensors of
    the same sizes in the same order, else the results are wrong. Warns (FutureWarning) that
    it will be deprecated, as torch 2.13 does.

    Args:
        tensors (list[Tensor] or Tensor): Input and output of the collective, in place.
        op (ReduceOp, optional): As for :func:`all_reduce`.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.

    Returns:
        Async work handle (a Work, where torch returns its future), if async_op is set to
        True. None, if not async_op or if not part of the group.
    """
    warnings.warn(
        "`ringtree.all_reduce_coalesced` will be deprecated, as torch.distributed's is; "
        "prefer all_reduce on each tensor",
        FutureWarning,
        stacklevel=2,
    )
    pg = member_group(group, "all_reduce_coalesced")
    if pg is None:
        return None
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    work = pg.engine.allreduce_coalesced(tensors, op, async_op)
    if work is not None:
        work._outputs = tensors
    return work


def all_gather_coalesced(
    output_tensor_lists: list[list[Any]],
    input_tensor_list: list[Any],
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Gathers every tensor of ``input_tensor_list`` from the whole group as one operation:
    ``output_tensor_lists[r][i]`` <- rank ``r``'s ``input_tensor_list[i]``.

    One allgather of each rank's inputs packed end to end, unpacked into the outputs.
    Shapes are not checked across ranks beyond the total per rank (as in torch). Warns
    (FutureWarning) that it will be deprecated, as torch 2.13 does.

    Args:
        output_tensor_lists (list[list[Tensor]]): One list per rank, each with one
            correctly-sized tensor per input tensor.
        input_tensor_list (list[Tensor]): Tensors to be broadcast from current process.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        async_op (bool, optional): Whether this op should be an async op.

    Returns:
        Async work handle (a Work, where torch returns its future), if async_op is set to
        True. None, if not async_op or if not part of the group.
    """
    warnings.warn(
        "`ringtree.all_gather_coalesced` will be deprecated, as torch.distributed's is; "
        "prefer all_gather on each tensor",
        FutureWarning,
        stacklevel=2,
    )
    pg = member_group(group, "all_gather_coalesced")
    if pg is None:
        return None
    work = pg.engine.allgather_coalesced(output_tensor_lists, input_tensor_list, async_op)
    if work is not None:
        work._outputs = [tensor for outputs in output_tensor_lists for tensor in outputs]
    return work
