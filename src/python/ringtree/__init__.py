"""ringtree: collective communication with torch.distributed's API.

``import ringtree as dist`` and use it as ``torch.distributed``: ``init_process_group``,
``get_rank``, ``Backend``, ``ReduceOp``, the stores, ... See the README for what this
version provides.
"""

from __future__ import annotations

import warnings as _warnings

from ._C import FileStore, HashStore, PrefixStore, Store, TCPStore
from ._C import __version__ as __version__
from .backend import Backend, BackendConfig
from .constants import default_pg_timeout
from .collectives import Work, all_reduce, barrier, broadcast, reduce
from .errors import (
    CollectiveMismatchError,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    DistTimeoutError,
)
from .process_group import (
    GroupMember,
    ProcessGroup,
    destroy_process_group,
    get_backend,
    get_backend_config,
    get_default_backend_for_device,
    get_node_local_rank,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_backend_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
)
from .process_group import _store_barrier as _store_barrier
from ._reduce_op import ReduceOp
from .rendezvous import register_rendezvous_handler, rendezvous

__all__ = [
    "Backend",
    "BackendConfig",
    "CollectiveMismatchError",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "DistTimeoutError",
    "FileStore",
    "GroupMember",
    "HashStore",
    "PrefixStore",
    "ProcessGroup",
    "ReduceOp",
    "Store",
    "TCPStore",
    "Work",
    "all_reduce",
    "barrier",
    "broadcast",
    "default_pg_timeout",
    "destroy_process_group",
    "get_backend",
    "get_backend_config",
    "get_default_backend_for_device",
    "get_node_local_rank",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "reduce",
    "register_rendezvous_handler",
    "rendezvous",
]


def __getattr__(name: str):  # noqa: ANN202
    if name == "reduce_op":
        _warnings.warn(
            "ringtree.reduce_op is deprecated, please use ringtree.ReduceOp instead",
            FutureWarning,
            stacklevel=2,
        )
        return ReduceOp
    raise AttributeError(f"module 'ringtree' has no attribute {name!r}")
