"""Process groups beyond the world: new_group, new_subgroups, split_group and rank
translation (monitored_barrier is in monitored_barrier.py).

Semantics are torch.distributed 2.13's. A group is a subset of the world's ranks with its
own group ranks (0..size-1, in the order of its ``ranks``), its own keys in the job's store
(under ``<group name>/``, so groups never see each other's keys) and its own CPU engine:
the members connect to each other afresh when the group is created, like gloo; a group
does not share the world's connections.

Group names are agreed without communication: every rank of the world calls new_group in
the same order, so a counter of those calls names the group (``"1"``, ``"2"``, ... after the
world's ``"0"``), like torch. Groups made by their members only are named by a hash of
what the members agree on without the other ranks: the members and how many such groups
they made before (``use_local_synchronization``), or the members, the parent's name and
how many splits of the parent came before (``split_group``).

A rank that is not a member gets ``GroupMember.NON_GROUP_MEMBER`` instead of a group;
``get_rank``/``get_world_size`` of it are -1, collectives given it warn and return None,
``destroy_process_group`` of it does nothing.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from . import constants
from ._resolve import check_registered, default_group, registered, resolve
from ._world import world
from .backend import Backend, BackendConfig, parse_backend
from .process_group import GroupMember, ProcessGroup, _check_device_id, _check_timeout, _create_group, _store_barrier

__all__ = [
    "get_global_rank",
    "get_group_rank",
    "get_pg_count",
    "get_process_group_ranks",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group",
]

# How many member-only groups (use_local_synchronization) each exact list of members has
# created in this process; part of those groups' names. Never reset: a store outlives a
# destroyed world (init after destroy reuses it), so names must never repeat.
_local_group_counts: Counter[tuple[int, ...]] = Counter()


@dataclass
class _GroupState:
    """What this module keeps about one group, in _group_states."""

    #: Calls of split_group on the group (each member of the group counts every call);
    #: part of the names of the groups they create.
    split_count: int = 0


# The state of each group that split_group was called on: written and read by it only; an
# entry goes away with its group.
_group_states: weakref.WeakKeyDictionary[ProcessGroup, _GroupState] = weakref.WeakKeyDictionary()


def _state(pg: ProcessGroup) -> _GroupState:
    state = _group_states.get(pg)
    if state is None:
        state = _group_states[pg] = _GroupState()
    return state


# --- rank translation ---------------------------------------------------------------------


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """The rank in ``group`` of the process whose world rank is ``global_rank``.

    The default group maps every rank to itself. ValueError when ``group`` is not a live
    group of this rank or ``global_rank`` is not one of its members.
    """
    if group is world.default_pg:
        return global_rank
    converted = check_registered(group).group_rank_of(global_rank)
    if converted is None:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return converted


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """The world rank of the process whose rank in ``group`` is ``group_rank``.

    The default group maps every rank to itself. ValueError when ``group`` is not a live
    group of this rank or has no rank ``group_rank``.
    """
    if group is world.default_pg:
        return group_rank
    ranks = check_registered(group).ranks
    if not isinstance(group_rank, int) or not 0 <= group_rank < len(ranks):
        raise ValueError(f"Group rank {group_rank} is not part of group {group}")
    return ranks[group_rank]


def get_process_group_ranks(group: ProcessGroup | None) -> list[int]:
    """The world ranks of ``group``'s members, ordered by group rank (None: the world)."""
    return list(check_registered(resolve(group)).ranks)


def get_pg_count() -> int:
    """The number of groups created by init_process_group and new_group (member-only groups
    and split_group's excepted, as in torch) since the default group was created; 0 when
    there is none."""
    return 0 if world.default_pg is None else world.group_count - world.group_count_at_init


# --- creating groups ----------------------------------------------------------------------


def _hashed_name(members: list[int], salt: str) -> str:
    text = "_".join(map(str, members)) + "_" + salt
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def _group_backend(backend: str | None, default_pg: ProcessGroup) -> str:
    """The backend string of a new group: the default group's when ``backend`` is None."""
    return default_pg.name() if not backend else parse_backend(backend)


def new_group(
    ranks: list[int] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any | None = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any | None = None,
    sort_ranks: bool = True,
) -> ProcessGroup | int | None:
    """Creates a group of the world ranks ``ranks`` (None: all of them).

    Every rank of the world must call new_group, in the same order, even ranks that are
    not members; with ``use_local_synchronization=True`` only the members call it. Members
    connect to each other here (blocks until every member has arrived, bounded by
    ``timeout``); non-members return at once.

    Args:
        ranks: World ranks of the members. With ``sort_ranks`` (the default) they are
            sorted first; otherwise their order gives the group ranks (every member must
            then pass the same list).
        timeout: Deadline of the group's operations (default 30 minutes, not the world's).
        backend: As for init_process_group; the default group's backend when None.
        pg_options: Accepted for compatibility; the built-in backends take none.
        use_local_synchronization: Only members call new_group (see above).
        group_desc: A description of the group (``group.group_desc``).
        device_id: Must be None: binding an accelerator needs the NCCL backend.

    Returns:
        The group for members. Non-members get ``GroupMember.NON_GROUP_MEMBER``, or None
        with ``use_local_synchronization=True`` (as torch does: None means the world to
        the collectives, so do not pass it on).

    Raises ValueError for duplicate ranks ("ranks list must not contain duplicate
    entries"), a rank outside the world ("Rank 5 is out of range. Valid ranks are 0 to 3
    (world_size=4)"), more ranks than the world has, a bad backend or device_id;
    DistStoreError/DistNetworkError/DistTimeoutError when a member does not join in time.
    """
    default_pg = default_group()
    _check_device_id(device_id)
    backend_str = _group_backend(backend, default_pg)
    timeout = _check_timeout(timeout)
    global_rank, global_world_size = default_pg.rank(), default_pg.size()
    if ranks is None:
        ranks = list(range(global_world_size))
    else:
        ranks = sorted(ranks) if sort_ranks else list(ranks)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ranks list must not contain duplicate entries, got {ranks}")
        if len(ranks) > global_world_size:
            raise ValueError(
                "the new group's world size should be less or equal to the world size set by init_process_group"
            )
        for rank in ranks:
            if not isinstance(rank, int) or not 0 <= rank < global_world_size:
                raise ValueError(
                    f"Rank {rank} is out of range. Valid ranks are 0 to {global_world_size - 1} "
                    f"(world_size={global_world_size})"
                )
    is_member = global_rank in ranks
    if use_local_synchronization:
        if not is_member:
            return None
        _local_group_counts[tuple(ranks)] += 1
        name = _hashed_name(ranks, f"local{_local_group_counts[tuple(ranks)]}")
    else:
        name = str(world.group_count)
        world.group_count += 1
    pg = None
    if is_member:
        pg = _create_group(
            default_pg.root_store, name, ranks.index(global_rank), ranks, timeout, backend_str,
            "undefined" if group_desc is None else group_desc,
        )
    if os.environ.get(constants.ENV_INIT_BARRIER, "0") == "1":
        # Like init_process_group: return only once every rank that takes part has the group.
        _store_barrier(pg if use_local_synchronization else default_pg, timeout)
    return GroupMember.NON_GROUP_MEMBER if pg is None else pg


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: list[list[int]],
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any | None = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[ProcessGroup | int]]:
    """Creates one group per list of world ranks (the lists must not overlap; a rank may be
    in none). Every rank of the world must call it.

    Returns ``(the group this rank is in, or None; every group created)``: the list holds
    the groups this rank is in and ``GroupMember.NON_GROUP_MEMBER`` for the others.
    ValueError for an empty list or overlapping lists (checked before any group is made).
    """
    if ranks_per_subgroup_list is None or len(ranks_per_subgroup_list) == 0:
        raise ValueError("The arg 'ranks_per_subgroup_list' cannot be empty")
    owner: dict[int, list[int]] = {}
    for ranks in ranks_per_subgroup_list:
        for rank in ranks:
            if rank in owner:
                raise ValueError(f"Rank {rank} has appeared in both subgroup {owner[rank]} and {ranks}")
            owner[rank] = ranks
    my_rank = default_group().rank()
    subgroups: list[ProcessGroup | int] = []
    cur_subgroup = None
    for ranks in ranks_per_subgroup_list:
        subgroup = new_group(ranks=ranks, timeout=timeout, backend=backend, pg_options=pg_options,
                             group_desc=group_desc)
        subgroups.append(subgroup)
        if my_rank in ranks:
            cur_subgroup = subgroup
    return cur_subgroup, subgroups


def new_subgroups(
    group_size: int | None = None,
    group: ProcessGroup | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any | None = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[ProcessGroup | int]]:
    """Splits ``group`` (default: the world) into consecutive groups of ``group_size``
    ranks, in group rank order: with 4 ranks and ``group_size=2``, {0, 1} and {2, 3}.
    Every rank of the world must call it.

    ``group_size`` is required (its CUDA-device-count default needs a GPU build) and must
    divide the group's size: ValueError otherwise. Returns as
    :func:`new_subgroups_by_enumeration`.
    """
    if group_size is None:
        raise ValueError(
            "Default group size only takes effect when CUDA is available.If your subgroup using a backend "
            "that does not depend on CUDA,please pass in 'group_size' correctly."
        )
    if group_size <= 0:
        raise ValueError(f"The arg 'group_size' ({group_size}) must be positive")
    ranks = get_process_group_ranks(group)
    if len(ranks) < group_size:
        raise ValueError(f"The arg 'group_size' ({group_size}) must not exceed the world size ({len(ranks)})")
    if len(ranks) % group_size != 0:
        raise ValueError(f"The world size ({len(ranks)}) must be divisible by '{group_size=}'")
    return new_subgroups_by_enumeration(
        [ranks[i:i + group_size] for i in range(0, len(ranks), group_size)],
        timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc,
    )


def split_group(
    parent_pg: ProcessGroup | None = None,
    split_ranks: list[list[int]] | None = None,
    timeout: timedelta | None = None,
    pg_options: Any | None = None,
    group_desc: str | None = None,
    backend: str | None = None,
) -> ProcessGroup | None:
    """Splits ``parent_pg`` (default: the world) into the groups ``split_ranks``, lists of
    *parent group* ranks. Every member of the parent calls it with the same lists; the
    other ranks do not call it.

    Each rank's new group connects only the members of its split (blocks until they all
    arrive, bounded by ``timeout``, default 30 minutes). Unlike torch's CPU build, which
    can only split a group bound to an accelerator, ringtree splits any group.

    Args:
        parent_pg: The group to split; this rank must be a member.
        split_ranks: Non-overlapping lists of parent group ranks; a parent rank in none
            of them gets None.
        timeout, pg_options, group_desc: As for :func:`new_group`.
        backend: A subset of the parent's per-device backends to keep (e.g. ``"gloo"``
            or ``"cpu:gloo"``); each device named must map to the same backend in the
            parent. None keeps the parent's.

    Returns the new group containing this rank, or None. ValueError for an empty or
    duplicate split, a split larger than the world, a rank outside the parent, a parent
    this rank is not in, or a backend the parent lacks.
    """
    if split_ranks is None or len(split_ranks) == 0:
        raise ValueError("split_ranks cannot be None or empty")
    default_pg = default_group()
    parent = default_pg if parent_pg is None else parent_pg
    if not registered(parent):
        raise ValueError(f"Group {parent} is not registered")
    backend_str = parent.name() if backend is None else _split_backend(parent, backend)
    timeout = _check_timeout(timeout)
    my_split = None
    for split in split_ranks:
        if len(split) == 0:
            raise ValueError("the split group cannot be empty")
        if len(split) > default_pg.size():
            raise ValueError(
                "the split group's size should be less or equal to the world_size set by init_process_group"
            )
        if len(split) != len(set(split)):
            raise ValueError("the split group cannot have duplicate ranks")
        for rank in split:
            if not isinstance(rank, int) or not 0 <= rank < parent.size():
                raise ValueError(
                    f"Rank {rank} in split_ranks is not a rank of the parent group {parent.group_name!r} "
                    f"(of size {parent.size()})"
                )
        if my_split is None and parent.rank() in split:
            my_split = sorted(split)
    # Every member of the parent counts the split, members of a split or not, so that the
    # name of each split's group is the same on all its members.
    state = _state(parent)
    state.split_count += 1
    if my_split is None:
        return None
    members = [parent.ranks[rank] for rank in my_split]
    name = _hashed_name(members, f"split{state.split_count}:{parent.group_name}")
    return _create_group(
        default_pg.root_store, name, my_split.index(parent.rank()), members, timeout, backend_str,
        f"{parent.group_desc}:split:{state.split_count}" if group_desc is None else group_desc,
    )


def _split_backend(parent: ProcessGroup, backend: str) -> str:
    """Checks that ``backend`` names only per-device backends the parent has (a plain name
    stands for the devices it is the default backend of: ``"gloo"`` -> cpu); returns the
    child's backend string."""
    requested = parse_backend(backend)
    if ":" in requested:
        named = BackendConfig(requested).device_backend_map
    else:
        named = {device: requested for device, name in Backend.default_device_backend_map.items() if name == requested}
    if not named:
        raise ValueError(
            f"Unknown backend '{backend}'. Specify a 'device:backend' string or use one of: "
            f"{sorted(set(Backend.default_device_backend_map.values()))}"
        )
    parent_map = parent.backend_config.device_backend_map
    for device, name in named.items():
        if device not in parent_map:
            raise ValueError(
                f"Requested backend for device '{device}' is not present in the parent process group "
                f"(parent backends: {parent_map})"
            )
        if parent_map[device] != name:
            raise ValueError(
                f"Backend mismatch for device '{device}': parent has '{parent_map[device]}', requested "
                f"'{name}'. Backend names must match exactly when filtering split_group backends."
            )
    return requested
