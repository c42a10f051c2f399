"""Collectives on CPU buffers: all_reduce, broadcast, reduce and barrier.

Signatures and behaviour are torch.distributed 2.13's. A buffer is a torch tensor, a NumPy
array, any object with ``__dlpack__`` or, failing that, the buffer protocol (bytearray,
memoryview, array.array); it must be contiguous host memory and is used in place,
zero-copy. Every rank of the group must make the same calls in the same order with
matching buffers (element count and dtype) and arguments.

Errors: ``ValueError`` (or ``TypeError`` for an unsupported dtype) for invalid arguments,
raised before any data moves; ``DistNetworkError`` when a peer dies,
``DistTimeoutError`` past the group's timeout, ``CollectiveMismatchError`` when ranks
disagree on the call. After any of the last three the group is unusable.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ._C import Work
from ._reduce_op import ReduceOp
from ._world import world
from .process_group import ProcessGroup

__all__ = ["Work", "all_reduce", "barrier", "broadcast", "reduce"]

_NOT_INITIALIZED = "Default process group has not been initialized, please make sure to call init_process_group."


def _default_group() -> ProcessGroup:
    group = world.default_pg
    if group is None:
        raise ValueError(_NOT_INITIALIZED)
    return group


def _group_rank(group: ProcessGroup, rank: int | None, group_rank: int | None, name: str) -> int:
    """The group rank named by ``rank`` (global) or ``group_rank``, exactly one of them."""
    if group_rank is not None:
        if rank is not None:
            raise ValueError(f"Can't specify both {name} and group_{name}")
        if not 0 <= group_rank < group.size():
            raise ValueError(
                f"group_{name}={group_rank} is not a rank of group {group.group_name!r} of size {group.size()}"
            )
        return group_rank
    if rank is None:
        raise ValueError(f"Must specify {name} (a global rank) or group_{name} (a rank in the group)")
    converted = group._group_ranks.get(rank)
    if converted is None:
        raise ValueError(
            f"{name}={rank} is not a rank of group {group.group_name!r} (its global ranks: {group._ranks})"
        )
    return converted


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
    if group is None:  # _default_group() inlined: this is the call small-message latency rides on
        group = world.default_pg
        if group is None:
            raise ValueError(_NOT_INITIALIZED)
    return group._engine.allreduce(tensor, op, async_op, algorithm)


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
    if group is None:
        group = _default_group()
    root = _group_rank(group, src, group_src, "src")
    return group._engine.broadcast(tensor, root, async_op, algorithm)


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
    if group is None:
        group = _default_group()
    root = _group_rank(group, dst, group_dst, "dst")
    return group._engine.reduce(tensor, root, op, async_op, algorithm)


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
    if group is None:
        group = _default_group()
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {type(timeout).__name__}")
    return group._engine.barrier(timeout, async_op)
