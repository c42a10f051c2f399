"""ringtree: collective communication with torch.distributed's API.

``import ringtree as dist`` and use it as ``torch.distributed``: ``init_process_group``,
``get_rank``, ``Backend``, ``ReduceOp``, the stores, ... See the README for what this
version provides.
"""

from __future__ import annotations

import warnings as _warnings

from ._C import FileStore, HashStore, PrefixStore, Store, TCPStore
from ._C import __version__ as __version__
from .backend import (
    Backend,
    BackendConfig,
    get_default_backend_for_device,
    is_backend_available,
    is_gloo_available,
    is_mpi_available,
    is_nccl_available,
    is_ucc_available,
    is_xccl_available,
)
from .constants import default_pg_timeout
from . import work as _work  # noqa: F401 - adds result()/get_future() to Work
from .collectives import _all_gather_base as _all_gather_base
from .collectives import _reduce_scatter_base as _reduce_scatter_base
from .collectives import (
    Work,
    all_gather,
    all_gather_coalesced,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
)
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
    abort_process_group,
    destroy_process_group,
    get_backend,
    get_backend_config,
    get_node_local_rank,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_initialized,
    is_torchelastic_launched,
)
from .process_group import _store_barrier as _store_barrier
from .diagnostics import dump_flight_recorder
from .groups import (
    get_global_rank,
    get_group_rank,
    get_pg_count,
    get_process_group_ranks,
    monitored_barrier,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    split_group,
)
from ._reduce_op import ReduceOp, supports_complex
from .object_collectives import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
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
    "P2POp",
    "PrefixStore",
    "ProcessGroup",
    "ReduceOp",
    "supports_complex",
    "Store",
    "TCPStore",
    "Work",
    "abort_process_group",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "default_pg_timeout",
    "destroy_process_group",
    "dump_flight_recorder",
    "gather",
    "gather_object",
    "get_backend",
    "get_backend_config",
    "get_default_backend_for_device",
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_pg_count",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "irecv",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_torchelastic_launched",
    "is_ucc_available",
    "is_xccl_available",
    "is_nccl_available",
    "isend",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "register_rendezvous_handler",
    "rendezvous",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "split_group",
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
