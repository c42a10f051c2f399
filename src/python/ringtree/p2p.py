"""Point-to-point: send, recv, isend, irecv, P2POp and batch_isend_irecv.

Signatures and behaviour are torch.distributed 2.13's. Each group has a point-to-point
engine of its own, beside its collective engine, over connections of its own, so messages
never mix with collectives and may be sent while collectives are queued. Buffers are the
ones the collectives take (see collectives.py), used in place.

Matching: a receive from rank ``src`` with ``tag`` takes the oldest message that ``src``
sent with that tag and that no earlier receive took (messages with one tag between two
ranks arrive in send order; different tags in any order); a receive from any source
(``src=None``) takes the oldest such message from whichever rank. A message and its
receive must have the same dtype and number of elements, else the receive raises
CollectiveMismatchError, and so does the send when it is still pending (otherwise the
sender's next operation with that rank). A send of up to 64 KiB completes without waiting for its receive
to be posted; a larger one waits until the peer posts a matching receive (as with gloo and
MPI), so two ranks that both block in a large send first wait for each other until the
timeout: use isend/irecv or batch_isend_irecv for such exchanges. send and recv run on the
calling thread (no hand-off to the engine's thread) when nothing else is pending with
that peer. What isend/irecv cannot finish at once, ``Work.wait()`` drives on the waiting
thread; the engine's thread takes over whatever no wait() finished within 200 µs (up to
about 1 ms when the thread was idle), so operations nobody waits for still complete.

Errors: ``ValueError`` for an invalid peer (not in the group, or this rank itself) or tag
(negative), raised by the call; ``DistNetworkError`` naming the peer when its connection
breaks, ``DistTimeoutError`` when an operation is still pending after the group's timeout,
raised by ``Work.wait()`` (or by send/recv).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._C import Work
from ._resolve import destination, member_group, p2p_op_group, resolve_rank, source
from ._world import world
from .process_group import ProcessGroup, native_front

__all__ = ["P2POp", "batch_isend_irecv", "irecv", "isend", "recv", "send"]

# The common call (the default group, a peer's global rank) is served before any helper
# is called (see _resolve.py): ``peer_rank_of`` is None for a rank that is not a peer,
# and the default group's ranks are the global ranks.


@native_front
def isend(
    tensor: Any,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> Work | None:
    """Sends a tensor asynchronously.

    Modifying ``tensor`` before the request completes causes undefined behavior.

    Args:
        tensor (Tensor): Tensor to send.
        dst (int): Destination rank on the global process group (regardless of ``group``).
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        tag (int, optional): Tag to match send with remote recv (non-negative).
        group_dst (int, optional): Destination rank on ``group``. Invalid to specify both
            ``dst`` and ``group_dst``.

    Returns:
        A distributed request object (its ``wait()`` returns once ``tensor`` may be
        reused). None, if not part of the group.
    """
    pg = world.default_pg
    if group is None and group_dst is None and pg is not None:  # the common call
        peer = pg.peer_rank_of(dst)
        if peer is not None:
            return pg.p2p.isend(tensor, peer, tag)
    pg = member_group(group, "isend")
    if pg is None:
        return None
    return pg.p2p.isend(tensor, resolve_rank(pg, dst, group_dst, "dst"), tag)


@native_front
def irecv(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_src: int | None = None,
) -> Work | None:
    """Receives a tensor asynchronously.

    Args:
        tensor (Tensor): Tensor to fill with received data.
        src (int, optional): Source rank on the global process group (regardless of
            ``group``). Receives from any process if both ``src`` and ``group_src`` are
            unspecified; the request's ``source_rank()`` then names the sender's rank in
            ``group``.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        tag (int, optional): Tag to match recv with remote send (non-negative).
        group_src (int, optional): Source rank on ``group``. Invalid to specify both
            ``src`` and ``group_src``.

    Returns:
        A distributed request object. None, if not part of the group.
    """
    pg = world.default_pg
    if group is None and group_src is None and pg is not None:  # the common call
        peer = pg.peer_rank_of(src)
        if peer is not None:
            return pg.p2p.irecv(tensor, peer, tag)
    pg = member_group(group, "irecv")
    if pg is None:
        return None
    return pg.p2p.irecv(tensor, source(pg, src, group_src), tag)


@native_front
def send(
    tensor: Any,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> None:
    """Sends a tensor synchronously: returns once ``tensor`` may be reused.

    Args:
        tensor (Tensor): Tensor to send.
        dst (int): Destination rank on the global process group (regardless of
            ``group``). Must not be the rank of the current process.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        tag (int, optional): Tag to match send with remote recv (non-negative).
        group_dst (int, optional): Destination rank on ``group``. Invalid to specify both
            ``dst`` and ``group_dst``.
    """
    pg = world.default_pg
    if group is None and group_dst is None and pg is not None:  # the common call
        peer = pg.peer_rank_of(dst)
        if peer is not None:
            pg.p2p.send(tensor, peer, tag)
            return
    pg = member_group(group, "send")
    if pg is None:
        return
    pg.p2p.send(tensor, destination(pg, dst, group_dst), tag)


@native_front
def recv(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_src: int | None = None,
) -> int:
    """Receives a tensor synchronously.

    Args:
        tensor (Tensor): Tensor to fill with received data.
        src (int, optional): Source rank on the global process group (regardless of
            ``group``). Receives from any process if both ``src`` and ``group_src`` are
            unspecified.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        tag (int, optional): Tag to match recv with remote send (non-negative).
        group_src (int, optional): Source rank on ``group``. Invalid to specify both
            ``src`` and ``group_src``.

    Returns:
        The sender's global rank; -1, if not part of the group.
    """
    pg = world.default_pg
    if group is None and group_src is None and pg is not None:  # the common call
        peer = pg.peer_rank_of(src)
        if peer is not None:
            return pg.p2p.recv(tensor, peer, tag)
    pg = member_group(group, "recv")
    if pg is None:
        return -1
    return pg.ranks[pg.p2p.recv(tensor, source(pg, src, group_src), tag)]


class P2POp:
    """One point-to-point operation for :func:`batch_isend_irecv`.

    Args:
        op (Callable): :func:`isend` or :func:`irecv`.
        tensor (Tensor): Tensor to send or receive.
        peer (int, optional): Destination or source rank on the global process group.
        group (ProcessGroup, optional): The process group to work on. If None, the
            default process group is used.
        tag (int, optional): Tag to match send with recv.
        group_peer (int, optional): Destination or source rank on ``group``. Exactly one
            of ``peer`` and ``group_peer`` must be given.

    Attributes ``peer`` (global) and ``group_peer`` hold both forms of the rank.
    """

    def __init__(
        self,
        op: Callable[..., Work | None],
        tensor: Any,
        peer: int | None = None,
        group: ProcessGroup | None = None,
        tag: int = 0,
        group_peer: int | None = None,
    ) -> None:
        if op is not isend and op is not irecv:
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``ringtree.isend`` or ``ringtree.irecv``.")
        self.op = op
        self.tensor = tensor
        self.group = p2p_op_group(group)
        self.group_peer = resolve_rank(self.group, peer, group_peer, "peer")
        self.peer = self.group.ranks[self.group_peer]
        self.tag = tag

    def __repr__(self) -> str:
        me = self.group.rank()
        src, dst = (me, self.group_peer) if self.op is isend else (self.group_peer, me)
        return (
            f"P2POp({self.op.__name__} pg={self.group.group_name}, group_src={src}, group_dst={dst}, "
            f"{getattr(self.tensor, 'shape', None)}, {getattr(self.tensor, 'dtype', None)})"
        )


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Posts a batch of sends and receives at once and returns their requests, in order.

    The relative order of sends and receives in the list does not matter and cannot
    deadlock (``[recv_from_1, send_to_1]`` is ``[send_to_1, recv_from_1]``); several
    operations between the same pair of ranks in the same direction with the same tag match
    in list order. On ringtree's own engine the batch is checked whole before anything is
    posted (an invalid buffer or peer raises and posts nothing) and CUDA tensors run as one
    NCCL group; on the ``mpi`` backend an operation that raises leaves the ones before it
    posted.

    Args:
        p2p_op_list (list[P2POp]): The operations, all on one group.

    Returns:
        One request per operation.
    """
    if not isinstance(p2p_op_list, list) or not all(isinstance(p2p_op, P2POp) for p2p_op in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type ``ringtree.P2POp``.")
    if not p2p_op_list:
        raise ValueError("batch_isend_irecv needs at least one P2POp, got an empty list")
    group = p2p_op_list[0].group
    if not all(p2p_op.group is group for p2p_op in p2p_op_list):
        raise ValueError("All ops need to use the same group.")
    engine = group.p2p
    if hasattr(engine, "batch_isend_irecv"):  # ringtree's engine: posted as one batch (one NCCL group on CUDA)
        return engine.batch_isend_irecv(
            [(p2p_op.op is isend, p2p_op.tensor, p2p_op.group_peer, p2p_op.tag) for p2p_op in p2p_op_list]
        )
    works = []
    for p2p_op in p2p_op_list:
        works.append((engine.isend if p2p_op.op is isend else engine.irecv)(p2p_op.tensor, p2p_op.group_peer, p2p_op.tag))
    return works
