"""URL rendezvous: ``env://``, ``tcp://host:port`` and ``file:///path`` -> (store, rank, world_size).

Mirrors torch.distributed.rendezvous: :func:`rendezvous` returns an iterator whose first
item is ``(store, rank, world_size)``; handlers for further schemes are added with
:func:`register_rendezvous_handler`.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

from . import constants
from .launch_env import find_launch
from ._C import FileStore, ForeignStore, Store, TCPStore
from .errors import DistNetworkError

__all__ = ["rendezvous", "register_rendezvous_handler"]

RendezvousResult = Iterator["tuple[Store, int, int]"]

_rendezvous_handlers: dict[str, Callable[..., RendezvousResult]] = {}

# TCPStore servers this process started, by port. A later rendezvous on the same port
# (init after destroy) becomes a client of the server still running here instead of
# failing to bind the port again.
_hosted_servers: dict[int, TCPStore] = {}


def register_rendezvous_handler(scheme: str, handler: Callable[..., RendezvousResult]) -> None:
    """Registers ``handler(url, **kwargs)`` for URLs of ``scheme``.

    The handler returns an iterator of ``(store, rank, world_size)``. Registering a
    scheme twice raises RuntimeError.
    """
    if scheme in _rendezvous_handlers:
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")
    _rendezvous_handlers[scheme] = handler


def rendezvous(url: str, rank: int = -1, world_size: int = -1, **kwargs: Any) -> RendezvousResult:
    """Resolves ``url`` into an iterator of ``(store, rank, world_size)``.

    ``rank`` and ``world_size`` given here are added to the URL's query; giving them in
    both places raises ValueError. Keyword arguments (e.g. ``timeout``) go to the handler.
    """
    if not isinstance(url, str):
        raise TypeError(f"URL must be a string, got {type(url).__name__}: {url!r}")
    if not isinstance(rank, int) or not isinstance(world_size, int):
        raise TypeError(f"rank and world_size must be int, got {rank!r} and {world_size!r}")
    parsed = urlparse(url)
    if rank != -1 or world_size != -1:
        query = _query_dict(parsed.query)
        if "rank" in query or "world_size" in query:
            raise ValueError(f"The url: {url} has node-specific arguments(rank, world_size) already.")
        if rank != -1:
            query["rank"] = str(rank)
        if world_size != -1:
            query["world_size"] = str(world_size)
        parsed = parsed._replace(query=urlencode(query))
        url = urlunparse(parsed)
    if parsed.scheme not in _rendezvous_handlers:
        raise RuntimeError(
            f"No rendezvous handler for {parsed.scheme}://; known: "
            f"{', '.join(s + '://' for s in sorted(_rendezvous_handlers))}"
        )
    return _rendezvous_handlers[parsed.scheme](url, **kwargs)


def _query_dict(query: str) -> dict[str, str]:
    return {key: values[-1] for key, values in parse_qs(query).items()}


def _error(scheme: str, message: str) -> ValueError:
    return ValueError(f"Error initializing ringtree using {scheme}:// rendezvous: {message}")


def _int_param(scheme: str, query: dict[str, str], name: str) -> int:
    if name not in query:
        raise _error(scheme, f"{name} parameter missing")
    try:
        return int(query[name])
    except ValueError:
        raise _error(scheme, f"{name} parameter must be an integer, got {query[name]!r}") from None


def _check_rank(scheme: str, rank: int, world_size: int) -> None:
    if world_size <= 0:
        raise _error(scheme, f"world_size must be positive, got {world_size}")
    if not 0 <= rank < world_size:
        raise _error(scheme, f"rank must be in [0, world_size={world_size}), got {rank}")


def _create_tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Store:
    """Rank 0 hosts the server (other ranks are clients), unless ringtree-run hosts it for
    the whole job (RINGTREE_USE_AGENT_STORE=1): then every rank is a client. Under torchrun
    (TORCHELASTIC_USE_AGENT_STORE=True without RINGTREE_USE_AGENT_STORE) torchrun's agent
    hosts a torch TCPStore: every rank is a client of it, through torch."""
    if not 0 < port < 65536:
        raise ValueError(f"Error initializing ringtree: port must be in [1, 65535], got {port}")
    use_agent_store = os.environ.get(constants.ENV_USE_AGENT_STORE, "0") == "1"
    if not use_agent_store and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return _torchrun_agent_store(host, port, timeout)
    is_master = rank == 0 and not use_agent_store and port not in _hosted_servers
    try:
        store = TCPStore(host, port, world_size, is_master, timeout, wait_for_workers=False)
    except DistNetworkError as exc:
        if not is_master or "Address already in use" not in str(exc):
            raise
        raise DistNetworkError(
            f"rank 0 cannot host the job's store on port {port}: {exc}. A process that still holds "
            f"the port (a rank of an earlier job that lingers?) would answer the other ranks in "
            f"this job's place: stop it, or give this job another port (MASTER_PORT or the "
            f"tcp:// URL)"
        ) from None
    if is_master:
        _hosted_servers[port] = store
    return store


def _torchrun_agent_store(host: str, port: int, timeout: timedelta) -> Store:
    """A client of the torch TCPStore that torchrun's agent hosts at host:port, as a
    ringtree Store (ForeignStore). Needs torch, which torchrun comes with."""
    try:
        from torch.distributed import TCPStore as TorchTCPStore
    except ImportError:
        raise DistNetworkError(
            "TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the job's store in torch's format, and "
            "reaching it needs torch installed"
        ) from None
    return ForeignStore(TorchTCPStore(host, port, is_master=False, timeout=timeout))


def _tcp_rendezvous_handler(url: str, timeout: timedelta = constants.default_pg_timeout, **kwargs: Any) -> RendezvousResult:
    parsed = urlparse(url)
    if not parsed.hostname:
        raise _error("tcp", f"host name missing in {url!r}")
    try:
        port = parsed.port
    except ValueError:
        raise _error("tcp", f"invalid port in {url!r}") from None
    if port is None:
        raise _error("tcp", "port number missing")
    query = _query_dict(parsed.query)
    rank = _int_param("tcp", query, "rank")
    world_size = _int_param("tcp", query, "world_size")
    _check_rank("tcp", rank, world_size)
    store = _create_tcp_store(parsed.hostname, port, rank, world_size, timeout)
    yield (store, rank, world_size)
    raise RuntimeError("Unable to perform re-rendezvous using tcp:// method")


def _env_rendezvous_handler(url: str, timeout: timedelta = constants.default_pg_timeout, **kwargs: Any) -> RendezvousResult:
    """RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the URL's query or the
    environment; under mpirun or srun without them, from the launcher's variables
    (launch_env.py has the precedence)."""
    query = _query_dict(urlparse(url).query)
    launch = find_launch()
    found = {"rank": launch.rank, "world_size": launch.world_size, "master_addr": launch.master_addr,
             "master_port": launch.master_port}
    hints = {
        "rank": " (nor a launcher's OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)",
        "world_size": "",
        "master_addr": " (under mpirun with ranks on several hosts, set it to rank 0's host)",
        "master_port": "",
    }
    env_names = {"rank": constants.ENV_RANK, "world_size": constants.ENV_WORLD_SIZE,
                 "master_addr": constants.ENV_MASTER_ADDR, "master_port": constants.ENV_MASTER_PORT}

    def setting(name: str) -> tuple[str, str]:
        if name in query:
            return query[name], f"the URL's {name}"
        if found[name] is None:
            raise _error("env", f"environment variable {env_names[name]} expected, but not set{hints[name]}")
        return found[name]

    def integer(name: str) -> int:
        value, source = setting(name)
        try:
            return int(value)
        except ValueError:
            raise _error("env", f"{source} must be an integer, got {value!r}") from None

    rank = integer("rank")
    world_size = integer("world_size")
    master_addr = setting("master_addr")[0]
    master_port = integer("master_port")
    _check_rank("env", rank, world_size)
    store = _create_tcp_store(master_addr, master_port, rank, world_size, timeout)
    yield (store, rank, world_size)
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def _file_rendezvous_handler(url: str, **kwargs: Any) -> RendezvousResult:
    parsed = urlparse(url)
    path = parsed.path
    if parsed.netloc:
        # file://relative/path is read by urlparse as host "relative"; keep it as a path.
        path = parsed.netloc + path
    if not path:
        raise _error("file", "path missing")
    query = _query_dict(parsed.query)
    rank = _int_param("file", query, "rank")
    world_size = _int_param("file", query, "world_size")
    _check_rank("file", rank, world_size)
    store = FileStore(path, world_size)
    yield (store, rank, world_size)
    raise RuntimeError("Unable to perform re-rendezvous using file:// method")


register_rendezvous_handler("tcp", _tcp_rendezvous_handler)
register_rendezvous_handler("env", _env_rendezvous_handler)
register_rendezvous_handler("file", _file_rendezvous_handler)
