"""Collectives on picklable Python objects: all_gather_object, broadcast_object_list,
gather_object, scatter_object_list, send_object_list and recv_object_list.

Signatures and behaviour are torch.distributed 2.13's. Each object is pickled into a
``bytearray``; the sizes travel first (as int64 in an ``array.array``), then the bytes,
over the group's CPU collectives or point-to-point engine. torch is not needed; torch
tensors inside the objects are pickled like any other object. Every call blocks (no
``async_op``). ``device=`` arguments are accepted and ignored: the bytes always travel
through host memory.

.. warning::
    These functions use ``pickle``: unpickling data runs arbitrary code chosen by whoever
    produced it. Only use them with peers you trust.
"""

from __future__ import annotations

import pickle
from array import array
from itertools import accumulate
from typing import Any

from ._resolve import destination, member_group, resolve_root, source
from .process_group import ProcessGroup

__all__ = [
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]


def _sizes(count: int) -> array:
    """``count`` int64 zeros, a buffer the engines accept."""
    return array("q", bytes(8 * count))


def _unpickle(data: bytearray, sizes: array, offsets: list[int] | None = None) -> list[Any]:
    """The objects pickled in ``data``: the i-th has ``sizes[i]`` bytes at ``offsets[i]``
    (back to back from the start when there are no offsets)."""
    view = memoryview(data)
    objects = []
    offset = 0
    for i, size in enumerate(sizes):
        start = offset if offsets is None else offsets[i]
        objects.append(pickle.loads(view[start : start + size]))
        offset += size
    return objects


def all_gather_object(object_list: list[Any], obj: Any, group: ProcessGroup | None = None) -> None:
    """Gathers picklable objects from the whole group into a list:
    ``object_list[r]`` <- rank ``r``'s ``obj``.

    Two all_gathers: the sizes, then the pickled bytes (of each rank's own size, no
    padding).

    .. warning::
        Unpickling runs arbitrary code: only use with peers you trust.

    Args:
        object_list (list[Any]): Output list, of the group's size.
        obj (Any): Picklable object to be broadcast from current process.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.

    Returns:
        None. If the calling rank is not part of the group, ``object_list`` is left
        unmodified.
    """
    pg = member_group(group, "all_gather_object")
    if pg is None:
        return
    payload = pickle.dumps(obj)
    sizes = _sizes(pg.size())
    pg.engine.allgather_single(sizes, array("q", [len(payload)]), False)
    data = bytearray(sum(sizes))
    view = memoryview(data)
    offsets = list(accumulate(sizes, initial=0))
    pg.engine.allgather([view[offsets[r] : offsets[r] + sizes[r]] for r in range(pg.size())], payload, False)
    for r, value in enumerate(_unpickle(data, sizes, offsets)):
        object_list[r] = value


def _check_gather_list(is_root: bool, object_gather_list: list[Any] | None, size: int) -> None:
    """torch's rule for gather_object's output list: given (not None nor empty) on the
    destination only, there with one entry per rank. The list holds objects, which never
    reach the engine, so it is checked here."""
    given = object_gather_list is not None and len(object_gather_list) > 0
    if is_root and not given:
        raise ValueError("Argument ``gather_list`` must be specified on destination rank.")
    if not is_root and given:
        raise ValueError("Argument ``gather_list`` must NOT be specified on non-destination ranks.")
    if is_root and len(object_gather_list) != size:
        raise ValueError(
            f"gather_object: object_gather_list must hold one entry per rank of the group ({size}), "
            f"got {len(object_gather_list)}"
        )


def gather_object(
    obj: Any,
    object_gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    group_dst: int | None = None,
) -> None:
    """Gathers picklable objects from the whole group in a single process:
    ``object_gather_list[r]`` <- rank ``r``'s ``obj`` on the destination.

    An all_gather of the sizes (every rank pads its bytes to the largest), then a gather.

    .. warning::
        Unpickling runs arbitrary code: only use with peers you trust.

    Args:
        obj (Any): Input object. Must be picklable.
        object_gather_list (list[Any]): Output list, of the group's size, on the
            destination rank; must be None on the others.
        dst (int, optional): Destination rank on the global process group (regardless of
            ``group``). If both ``dst`` and ``group_dst`` are None, global rank 0.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        group_dst (int, optional): Destination rank on ``group``. Invalid to specify both
            ``dst`` and ``group_dst``.
    """
    pg = member_group(group, "gather_object")
    if pg is None:
        return
    root = resolve_root(pg, dst, group_dst, "dst")
    is_root = pg.rank() == root
    _check_gather_list(is_root, object_gather_list, pg.size())
    payload = pickle.dumps(obj)
    sizes = _sizes(pg.size())
    pg.engine.allgather_single(sizes, array("q", [len(payload)]), False)
    padded = max(sizes)
    data = bytearray(padded * pg.size()) if is_root else None
    view = memoryview(data) if is_root else None
    outputs = [view[r * padded : (r + 1) * padded] for r in range(pg.size())] if is_root else None
    pg.engine.gather(payload.ljust(padded, b"\0"), outputs, root, False)
    if is_root:
        offsets = [r * padded for r in range(pg.size())]
        for r, value in enumerate(_unpickle(data, sizes, offsets)):
            object_gather_list[r] = value


def broadcast_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: ProcessGroup | None = None,
    device: Any | None = None,
    group_src: int | None = None,
) -> None:
    """Broadcasts the picklable objects in ``object_list`` from the source to the whole
    group: every rank passes a list of the same length, whose elements the source's
    objects replace.

    Two broadcasts: the sizes, then the pickled bytes.

    .. warning::
        Unpickling runs arbitrary code: only use with peers you trust.

    Args:
        object_list (list[Any]): Objects to broadcast (on the source), the list to fill
            (elsewhere).
        src (int, optional): Source rank on the global process group (regardless of
            ``group``). If both ``src`` and ``group_src`` are None, global rank 0.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        device (optional): Accepted for compatibility; ignored.
        group_src (int, optional): Source rank on ``group``. Invalid to specify both
            ``src`` and ``group_src``.
    """
    pg = member_group(group, "broadcast_object_list")
    if pg is None:
        return
    root = resolve_root(pg, src, group_src, "src")
    if pg.rank() == root:
        payloads = [pickle.dumps(obj) for obj in object_list]
        pg.engine.broadcast(array("q", map(len, payloads)), root, False)
        pg.engine.broadcast(b"".join(payloads), root, False)
        return
    sizes = _sizes(len(object_list))
    pg.engine.broadcast(sizes, root, False)
    data = bytearray(sum(sizes))
    pg.engine.broadcast(data, root, False)
    object_list[:] = _unpickle(data, sizes)


def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: list[Any] | None = None,
    src: int | None = None,
    group: ProcessGroup | None = None,
    group_src: int | None = None,
) -> None:
    """Scatters the picklable objects of ``scatter_object_input_list`` (on the source, one
    per rank): rank ``r`` gets the ``r``-th in ``scatter_object_output_list[0]``.

    A broadcast of every object's size, then a scatter of the bytes padded to the largest.

    .. warning::
        Unpickling runs arbitrary code: only use with peers you trust.

    Args:
        scatter_object_output_list (list[Any]): Non-empty list whose first element
            receives the object for this rank.
        scatter_object_input_list (list[Any], optional): The objects to scatter, one per
            rank; used on the source only (may be None elsewhere).
        src (int, optional): Source rank on the global process group (regardless of
            ``group``). If both ``src`` and ``group_src`` are None, global rank 0.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        group_src (int, optional): Source rank on ``group``. Invalid to specify both
            ``src`` and ``group_src``.
    """
    pg = member_group(group, "scatter_object_list")
    if pg is None:
        return
    root = resolve_root(pg, src, group_src, "src")
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at least 1.")
    if pg.rank() == root:
        if scatter_object_input_list is None:
            raise ValueError("source rank must provide non-None scatter_object_input_list")
        if len(scatter_object_input_list) != pg.size():
            raise ValueError(
                f"scatter_object_list: scatter_object_input_list must hold one object per rank of the group "
                f"({pg.size()}), got {len(scatter_object_input_list)}"
            )
        payloads = [pickle.dumps(obj) for obj in scatter_object_input_list]
        sizes = array("q", map(len, payloads))
    else:
        payloads = None
        sizes = _sizes(pg.size())
    pg.engine.broadcast(sizes, root, False)
    padded = max(sizes)
    data = bytearray(padded)
    inputs = None if payloads is None else [payload.ljust(padded, b"\0") for payload in payloads]
    pg.engine.scatter(data, inputs, root, False)
    scatter_object_output_list[0] = _unpickle(data, sizes[pg.rank() : pg.rank() + 1])[0]


def send_object_list(
    object_list: list[Any],
    dst: int | None = None,
    group: ProcessGroup | None = None,
    device: Any | None = None,
    group_dst: int | None = None,
    use_batch: bool = False,
) -> None:
    """Sends the picklable objects in ``object_list`` synchronously to ``dst``, whose
    :func:`recv_object_list` passes a list of the same length.

    Two messages with tag 0: the sizes, then the pickled bytes.

    .. warning::
        Unpickling runs arbitrary code: only use with peers you trust.

    Args:
        object_list (list[Any]): Objects to send; each must be picklable.
        dst (int): Destination rank on the global process group (regardless of
            ``group``); not this process's rank.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        device (optional): Accepted for compatibility; ignored.
        group_dst (int, optional): Destination rank on ``group``. Must specify one of
            ``dst`` and ``group_dst`` but not both.
        use_batch (bool, optional): Accepted for compatibility; every send goes through
            the group's point-to-point engine either way.
    """
    pg = member_group(group, "send_object_list")
    if pg is None:
        return
    peer = destination(pg, dst, group_dst)
    payloads = [pickle.dumps(obj) for obj in object_list]
    works = [
        pg.p2p.isend(array("q", map(len, payloads)), peer, 0),
        pg.p2p.isend(b"".join(payloads), peer, 0),
    ]
    for work in works:
        work.wait()


def recv_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: ProcessGroup | None = None,
    device: Any | None = None,
    group_src: int | None = None,
    use_batch: bool = False,
) -> int:
    """Receives picklable objects into ``object_list`` synchronously, from the
    :func:`send_object_list` of ``src`` (of any rank when ``src`` and ``group_src`` are
    None), whose list has the same length.

    .. warning::
        Unpickling runs arbitrary code: only use with peers you trust.

    Args:
        object_list (list[Any]): List to receive into, of the sent list's length.
        src (int, optional): Source rank on the global process group (regardless of
            ``group``); any rank when both ``src`` and ``group_src`` are None.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        device (optional): Accepted for compatibility; ignored.
        group_src (int, optional): Source rank on ``group``. Invalid to specify both
            ``src`` and ``group_src``.
        use_batch (bool, optional): Accepted for compatibility; ignored.

    Returns:
        The sender's global rank; -1 if this rank is not part of the group.
    """
    pg = member_group(group, "recv_object_list")
    if pg is None:
        return -1
    peer = source(pg, src, group_src)
    sizes = _sizes(len(object_list))
    work = pg.p2p.irecv(sizes, peer, 0)
    work.wait()
    sender = work.source_rank()  # the bytes come from the same rank, after the sizes
    data = bytearray(sum(sizes))
    pg.p2p.irecv(data, sender, 0).wait()
    object_list[:] = _unpickle(data, sizes)
    return pg.ranks[sender]
