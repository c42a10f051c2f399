"""ringtree: collective communication with torch.distributed's API.

``import ringtree as dist`` and use it as ``torch.distributed``: ``init_process_group``,
``get_rank``, ``Backend``, ``ReduceOp``, the stores, ... See the README for what this
version provides.
"""

from __future__ import annotations

import warnings as _warnings

from ._C import FileStore, HashStore, PrefixStore, Store, TCPStore
from ._C import __version__ as __version__
from . import _reduce_op, backend as _backend, collectives as _collectives, diagnostics as _diagnostics
from . import errors as _errors, gather_scatter as _gather_scatter, groups as _groups
from . import monitored_barrier as _monitored_barrier
from . import object_collectives as _object_collectives, p2p as _p2p, process_group as _process_group
from . import rendezvous as _rendezvous
from ._reduce_op import *  # noqa: F403 - each module's __all__ is the package's API
from .backend import *  # noqa: F403
from .collectives import *  # noqa: F403
from .constants import default_pg_timeout
from .diagnostics import *  # noqa: F403
from .errors import *  # noqa: F403
from .gather_scatter import *  # noqa: F403
from .gather_scatter import _all_gather_base as _all_gather_base
from .gather_scatter import _reduce_scatter_base as _reduce_scatter_base
from .groups import *  # noqa: F403
from .monitored_barrier import *  # noqa: F403
from .object_collectives import *  # noqa: F403
from .p2p import *  # noqa: F403
from .process_group import *  # noqa: F403
from .process_group import _store_barrier as _store_barrier
from .rendezvous import *  # noqa: F403

__all__ = ["FileStore", "HashStore", "PrefixStore", "Store", "TCPStore", "default_pg_timeout"]
__all__ += _reduce_op.__all__
__all__ += _backend.__all__
__all__ += _collectives.__all__
__all__ += _diagnostics.__all__
__all__ += _errors.__all__
__all__ += _gather_scatter.__all__
__all__ += _groups.__all__
__all__ += _monitored_barrier.__all__
__all__ += _object_collectives.__all__
__all__ += _p2p.__all__
__all__ += _process_group.__all__
__all__ += _rendezvous.__all__


def __getattr__(name: str):  # noqa: ANN202
    if name == "reduce_op":
        _warnings.warn(
            "ringtree.reduce_op is deprecated, please use ringtree.ReduceOp instead",
            FutureWarning,
            stacklevel=2,
        )
        return ReduceOp
    raise AttributeError(f"module 'ringtree' has no attribute {name!r}")
