"""The gather/scatter family of collectives on CPU buffers: all_gather, gather, scatter,
reduce_scatter, all_to_all, their single-tensor forms and deprecated aliases.

Buffers, calling rules and errors are those of collectives.py. Every function takes
torch.distributed 2.13's arguments; where a collective implements several algorithms it
also takes ringtree's keyword-only ``algorithm=`` (see collectives.all_reduce). Sizes are checked
before any data moves (ValueError naming the argument); the element counts of one rank's
call must match what the other ranks' calls expect, else every rank raises
CollectiveMismatchError.
"""

from __future__ import annotations

import warnings
from typing import Any

from ._C import Work
from ._reduce_op import ReduceOp
from ._resolve import default_group, member_group, resolve_root
from ._world import world
from .process_group import ProcessGroup, native_front

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`ringtree.{old}` is deprecated. Please use `ringtree.{new}` instead.", FutureWarning, stacklevel=3)


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
    return pg.engine.allgather(tensor_list, tensor, async_op, algorithm)


@native_front
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
    pg = world.default_pg if group is None else member_group(group, "all_gather_single")
    if pg is None:
        if group is None:
            default_group()  # raises: there is no default group
        return None
    return pg.engine.allgather_single(output_tensor, input_tensor, async_op, algorithm)


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
    return pg.engine.gather(tensor, gather_list, root, async_op, algorithm)


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
    return pg.engine.scatter(tensor, scatter_list, root, async_op, algorithm)


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
    return pg.engine.reduce_scatter(output, input_list, op, async_op, algorithm)


@native_front
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
    pg = world.default_pg if group is None else member_group(group, "reduce_scatter_single")
    if pg is None:
        if group is None:
            default_group()  # raises: there is no default group
        return None
    return pg.engine.reduce_scatter_single(output, input, op, async_op, algorithm)


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
    return pg.engine.alltoall(output_tensor_list, input_tensor_list, async_op, algorithm)


@native_front
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
    pg = world.default_pg if group is None else member_group(group, "all_to_all_single")
    if pg is None:
        if group is None:
            default_group()  # raises: there is no default group
        return None
    return pg.engine.alltoall_single(output, input, output_split_sizes, input_split_sizes, async_op, algorithm)
