"""The process-wide state of ringtree's groups, kept in one object."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .process_group import ProcessGroup


class _World:
    """Written by process_group.py (init, destroy) and groups.py (new_group); read by every
    module that resolves a group (``_resolve.py``) and, at its slot, by the C entries of the
    hot calls (``native_front`` in process_group.py)."""

    __slots__ = ("default_pg", "groups", "group_count", "group_count_at_init")

    def __init__(self) -> None:
        #: The default (world) group, None before init_process_group / after destroy.
        self.default_pg: ProcessGroup | None = None
        #: Every live group, the default one included, by name.
        self.groups: dict[str, ProcessGroup] = {}
        #: Number of groups created so far (names default groups "0", "1", ...).
        self.group_count = 0
        #: ``group_count`` just before the default group was created: get_pg_count counts
        #: the groups created from there on.
        self.group_count_at_init = 0


world = _World()
