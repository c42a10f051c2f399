"""Exception classes raised by ringtree.

Each class subclasses :class:`DistError` (itself a ``RuntimeError``, as in
torch.distributed) and, where one fits, the matching built-in exception, so that plain
``except TimeoutError`` or ``except ConnectionError`` clauses work too. Invalid arguments
raise the built-in ``ValueError`` (or ``TypeError`` for a wrong type).
"""

from __future__ import annotations

__all__ = [
    "CollectiveMismatchError",
    "DistError",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "DistTimeoutError",
]


class DistError(RuntimeError):
    """Base class of every ringtree error."""


class DistBackendError(DistError):
    """A communication backend failed."""


class DistNetworkError(DistError, ConnectionError):
    """A connection could not be made, was refused, or broke."""


class DistStoreError(DistError):
    """A store operation failed, most often a key that did not appear in time."""


class DistTimeoutError(DistError, TimeoutError):
    """An operation did not complete within its deadline."""


class CollectiveMismatchError(DistError, ValueError):
    """Ranks called different collectives, or one collective with different arguments
    (operation, data type, element count, root). The message names both ranks and both calls."""
