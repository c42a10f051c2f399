"""Collectives on CPU buffers: all_reduce, broadcast, reduce, barrier and the coalesced
all_reduce/all_gather (the gather/scatter family is in gather_scatter.py).

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
from datetime import timedelta
from typing import Any

from ._C import Work
from ._reduce_op import ReduceOp
from ._resolve import default_group, member_group, resolve_rank
from ._world import world
from .process_group import ProcessGroup, native_front

__all__ = [
    "Work",
    "all_gather_coalesced",
    "all_reduce",
    "all_reduce_coalesced",
    "barrier",
    "broadcast",
    "reduce",
]


@native_front
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
    # The default group is read inline (see _resolve.py) and tested with "is None" rather
    # than for truth, here and in broadcast, reduce and barrier: small-message latency
    # rides on these calls.
    pg = world.default_pg if group is None else member_group(group, "all_reduce")
    if pg is None:
        if group is None:
            default_group()  # raises: there is no default group
        return None
    return pg.engine.allreduce(tensor, op, async_op, algorithm)


@native_front
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
    pg = world.default_pg
    if group is None and group_src is None and pg is not None:  # the common call
        root = pg.group_rank_of(src)  # None for what resolve_rank refuses, below
        if root is not None:
            return pg.engine.broadcast(tensor, root, async_op, algorithm)
    pg = pg if group is None else member_group(group, "broadcast")
    if pg is None:
        if group is None:
            default_group()  # raises: there is no default group
        return None
    root = resolve_rank(pg, src, group_src, "src")
    return pg.engine.broadcast(tensor, root, async_op, algorithm)


@native_front
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
    pg = world.default_pg
    if group is None and group_dst is None and pg is not None:  # the common call
        root = pg.group_rank_of(dst)  # None for what resolve_rank refuses, below
        if root is not None:
            return pg.engine.reduce(tensor, root, op, async_op, algorithm)
    pg = pg if group is None else member_group(group, "reduce")
    if pg is None:
        if group is None:
            default_group()  # raises: there is no default group
        return None
    root = resolve_rank(pg, dst, group_dst, "dst")
    return pg.engine.reduce(tensor, root, op, async_op, algorithm)


@native_front
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
    pg = world.default_pg if group is None else member_group(group, "barrier")
    if pg is None:
        if group is None:
            default_group()  # raises: there is no default group
        return None
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {type(timeout).__name__}")
    return pg.engine.barrier(timeout, async_op)


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
    return pg.engine.allreduce_coalesced(tensors, op, async_op)


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
    return pg.engine.allgather_coalesced(output_tensor_lists, input_tensor_list, async_op)
