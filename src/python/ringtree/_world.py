"""The process-wide state of ringtree's groups, kept in one object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .process_group import ProcessGroup


@dataclass
class _World:
    """Written by process_group.py (init, destroy) and groups.py (new_group); read by every
    module that resolves a group (``_resolve.py``)."""

    #: The default (world) group, None before init_process_group / after destroy.
    default_pg: ProcessGroup | None = None
    #: Every live group, the default one included, by name.
    groups: dict[str, ProcessGroup] = field(default_factory=dict)
    #: Number of groups created so far (names default groups "0", "1", ...).
    group_count: int = 0
    #: ``group_count`` just before the default group was created: get_pg_count counts the
    #: groups created from there on.
    group_count_at_init: int = 0


world = _World()
