"""Default timeouts and the names of the environment variables ringtree's Python layer reads."""

from __future__ import annotations

from datetime import timedelta

__all__ = ["default_pg_timeout", "default_store_timeout"]

#: Default timeout of a process group's operations (torch.distributed's value).
default_pg_timeout = timedelta(minutes=30)

#: Default timeout of a store's get()/wait() when none is given (torch's TCPStore value).
default_store_timeout = timedelta(seconds=300)

# Environment variables read by the Python layer.
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
#: Set to 1 by ``ringtree-run``: the launcher hosts the job's TCPStore and every rank,
#: rank 0 included, is a client of it.
ENV_USE_AGENT_STORE = "RINGTREE_USE_AGENT_STORE"
#: Shared secret of the job's TCPStore (read by the C++ core as well).
ENV_STORE_TOKEN = "RINGTREE_STORE_TOKEN"
#: Set to 1 to make init_process_group end with a store-based barrier over all ranks.
ENV_INIT_BARRIER = "RINGTREE_INIT_BARRIER"
