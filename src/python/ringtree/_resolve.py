"""Group and rank resolution: the one place where the Python layer decides which group a
call runs on, whether this rank is a member of it, and which group rank a rank argument
names: ``src``/``dst``/``peer`` (global ranks) or ``group_src``/``group_dst``/
``group_peer`` (ranks in the group), with torch 2.13's errors and warnings. Everything
else about a call's arguments (buffers, dtypes, sizes, ops, tags) is the native layer's
to check, but for the few checks torch itself makes in Python, which the callers keep
with torch's texts (gather_list/scatter_list given on the root only, split sizes, the
object collectives' lists).

A rank that is not a member of a group holds ``NON_GROUP_MEMBER`` where members hold the
group (new_group's return value); collectives given it warn and do nothing.

The hot calls (all_reduce, broadcast, reduce, barrier, all_gather_single,
reduce_scatter_single, all_to_all_single, send, recv, isend, irecv with ``group=None``)
read ``world.default_pg`` themselves and call :func:`default_group` only for its error:
one more Python call is a few percent of a small collective.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from ._C import ANY_SOURCE
from ._world import world

if TYPE_CHECKING:
    from .process_group import ProcessGroup

#: What new_group returns to a rank that is not a member (``GroupMember.NON_GROUP_MEMBER``).
NON_GROUP_MEMBER = -100

_NOT_INITIALIZED = "Default process group has not been initialized, please make sure to call init_process_group."


def default_group() -> ProcessGroup:
    """The default (world) group; ValueError (torch's text) before init_process_group."""
    group = world.default_pg
    if group is None:
        raise ValueError(_NOT_INITIALIZED)
    return group


def resolve(group: ProcessGroup | None) -> ProcessGroup:
    """``group``, or the default group for None; no membership check (for callers that
    made it, or that refuse a non-member's value for reasons of their own)."""
    return default_group() if group is None else group


def rank_not_in_group(group: ProcessGroup | int | None) -> bool:
    """True when ``group`` is what new_group gave a rank that is not a member
    (``NON_GROUP_MEMBER``); None (the world) and ProcessGroup objects are groups this rank
    belongs to. Cheap: the collectives call it on every call."""
    return group is not None and group == NON_GROUP_MEMBER


def warn_not_in_group(op_name: str, stacklevel: int = 3) -> None:
    """Warns, as torch does, that ``op_name`` was called with a group this rank is not in
    (the call then does nothing). ``stacklevel`` as for warnings.warn, counted from here:
    the default 3 names the caller of a public function that calls this directly."""
    global_rank = -1 if world.default_pg is None else world.default_pg.rank()
    warnings.warn(
        f"Running {op_name} on global rank {global_rank} which does not belong to the given group.",
        stacklevel=stacklevel,
    )


def member_group(group: ProcessGroup | int | None, op_name: str) -> ProcessGroup | None:
    """The group ``op_name`` runs on (the default group for None), or None after torch's
    warning when this rank is not a member of ``group``. For public functions that call it
    directly (the warning names their caller)."""
    if group is None:
        return default_group()
    if rank_not_in_group(group):
        warn_not_in_group(op_name, stacklevel=4)
        return None
    return group


def joined_group(group: ProcessGroup | int | None) -> ProcessGroup:
    """``group`` (the default group for None); ValueError (torch's text) when this rank is
    not in it."""
    if rank_not_in_group(group):
        raise ValueError("Invalid process group specified")
    return resolve(group)


def p2p_op_group(group: ProcessGroup | int | None) -> ProcessGroup:
    """The group of a P2POp (the default group for None); ValueError (torch's text) when
    this rank is not in it."""
    if rank_not_in_group(group):
        raise ValueError(f"P2POp: global rank {default_group().rank()} is not a member of the given group")
    return resolve(group)


def registered(group: object) -> bool:
    """Whether ``group`` is a live group of this rank (created and not yet destroyed)."""
    name = getattr(group, "group_name", None)
    return name is not None and world.groups.get(name) is group


def check_registered(group: object) -> ProcessGroup:
    """``group`` when it is a live group of this rank; ValueError (torch's text) otherwise."""
    if not registered(group):
        raise ValueError(f"Group {group} is not registered, please create group with ringtree.new_group API")
    return group  # type: ignore[return-value]


def resolve_rank(group: ProcessGroup, rank: int | None, group_rank: int | None, name: str) -> int:
    """The group rank named by ``rank`` (global) or ``group_rank``, exactly one of them;
    ``name`` is the argument's name (``"src"``, ``"dst"``, ``"peer"``) for the errors."""
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
    converted = group.group_rank_of(rank)
    if converted is None:
        raise ValueError(
            f"{name}={rank} is not a rank of group {group.group_name!r} (its global ranks: {list(group.ranks)})"
        )
    return converted


def resolve_root(group: ProcessGroup, rank: int | None, group_rank: int | None, name: str) -> int:
    """The group rank of a rooted call's root, as :func:`resolve_rank` reads it, with torch's
    default for gather/scatter and their object forms: global rank 0 when neither is given."""
    if rank is None and group_rank is None:
        rank = 0
    return resolve_rank(group, rank, group_rank, name)


def destination(group: ProcessGroup, dst: int | None, group_dst: int | None) -> int:
    """The group rank a blocking send goes to: ``dst`` (global) or ``group_dst``, and not
    this rank (torch's check and text)."""
    return _peer(group, dst, group_dst, "dst", "destination")


def source(group: ProcessGroup, src: int | None, group_src: int | None) -> int:
    """The group rank a receive takes from: ``src`` (global) or ``group_src``, not this
    rank (torch's check and text), or ANY_SOURCE when neither is given."""
    if src is None and group_src is None:
        return ANY_SOURCE
    return _peer(group, src, group_src, "src", "source")


def _peer(group: ProcessGroup, rank: int | None, group_rank: int | None, name: str, role: str) -> int:
    peer = resolve_rank(group, rank, group_rank, name)
    if peer == group.rank():
        raise ValueError(f"Invalid {role} rank: {role} rank should not be the same as the rank of the current process.")
    return peer
