"""Process-group state: init_process_group, destroy_process_group and the queries on groups."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import warnings
from datetime import timedelta
from typing import Any, Callable, NoReturn, TypeVar

from . import _C, constants
from ._C import PrefixStore, Store, TCPStore
from ._C import ProcessGroup as _NativeProcessGroup
from ._resolve import NON_GROUP_MEMBER, default_group, joined_group, rank_not_in_group, registered, resolve
from ._world import world
from .backend import Backend, BackendConfig, is_nccl_available, parse_backend, registered_plugin, unavailable_reason
from .errors import DistBackendError, DistStoreError
from .launch_env import local_rank
from .rendezvous import rendezvous

__all__ = [
    "GroupMember",
    "ProcessGroup",
    "abort_process_group",
    "destroy_process_group",
    "get_backend",
    "get_backend_config",
    "get_node_local_rank",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "is_available",
    "is_initialized",
    "is_torchelastic_launched",
]

# Key (in each group's store) counting the ranks that destroyed the group or exited.
_EXITED_KEY = "ringtree/exited"


class ProcessGroup:
    """A set of ranks that communicate together; the handle that ``group=`` arguments take.

    Created by :func:`init_process_group` (the default group) and by the functions of
    ``groups.py`` (new_group, new_subgroups, split_group). ``rank()`` and ``size()`` are
    this process's rank in the group and the group's size.

    Every field is declared in ``__slots__`` and set here; the other modules of the
    package read a group through the read-only accessors below. Those the hot calls use
    on every call cost no more than an attribute: ``engine`` and ``p2p`` (the native
    engines; only _start_engine, _stop_engine and _abort_engine replace them) and the
    rank lookups ``group_rank_of`` and ``peer_rank_of``.
    """

    __slots__ = (
        "__weakref__",
        "_backend_config",
        "_backend_str",
        "_barrier_count",
        "_engine",
        "_group_desc",
        "_group_name",
        "_p2p",
        "_plugin_backends",
        "_rank",
        "_ranks",
        "_root_store",
        "_size",
        "_store",
        "_timeout",
        "group_rank_of",
        "peer_rank_of",
    )

    def __init__(
        self,
        root_store: Store,
        rank: int,
        timeout: timedelta,
        backend: str,
        group_name: str,
        ranks: list[int],
        group_desc: str = "undefined",
    ) -> None:
        self._root_store = root_store
        self._store = PrefixStore(group_name, root_store)
        self._rank = rank
        self._ranks = tuple(ranks)
        self._size = len(self._ranks)
        self._timeout = timeout
        self._backend_str = backend
        self._backend_config = BackendConfig(None if backend == Backend.UNDEFINED else backend)
        self._group_name = group_name
        self._group_desc = group_desc
        group_ranks = {global_rank: group_rank for group_rank, global_rank in enumerate(self._ranks)}
        peer_ranks = {global_rank: peer for global_rank, peer in group_ranks.items() if peer != rank}
        #: group_rank_of(global_rank): the group rank of the member whose global rank is
        #: ``global_rank``; None for a rank that is not a member.
        self.group_rank_of: Callable[[int], int | None] = group_ranks.get
        #: peer_rank_of(global_rank): as group_rank_of, but None for this rank too (the
        #: group rank of a peer this rank can send to or receive from).
        self.peer_rank_of: Callable[[int], int | None] = peer_ranks.get
        # Objects created by plugin backends (Backend.register_backend), by device type.
        self._plugin_backends: dict[str, Any] = {}
        # The native CPU engine that runs this group's collectives (see _start_engine).
        self._engine: _NativeProcessGroup | _NoEngine = _NoEngine(
            f"group {group_name!r} has no CPU collective engine (backend {backend!r} does not map 'cpu' to 'gloo')"
        )
        # The same native backend for send, recv, ... (replaced alone when the group is
        # aborted, so that point-to-point calls say so).
        self._p2p: _NativeProcessGroup | _NoEngine = self._engine
        # Calls of _store_barrier on this group (numbers its store keys).
        self._barrier_count = 0

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def name(self) -> str:
        return self._backend_str

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    @property
    def store(self) -> Store:
        """The group's store: its keys, under ``<group_name>/`` in :attr:`root_store`."""
        return self._store

    @property
    def root_store(self) -> Store:
        """The job's store, which every group's store is a prefix of (new groups are
        created over it)."""
        return self._root_store

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    @property
    def backend_config(self) -> BackendConfig:
        """Which backend serves which device type in this group."""
        return self._backend_config

    @property
    def ranks(self) -> tuple[int, ...]:
        """The members' global ranks, in group rank order."""
        return self._ranks

    #: The native engine that runs this group's collectives (ringtree._C.ProcessGroup), or
    #: a _NoEngine whose every call raises DistBackendError saying why there is none.
    engine: _NativeProcessGroup | _NoEngine

    #: The native backend's point-to-point side (the same ringtree._C.ProcessGroup: send,
    #: recv, isend, irecv), or a _NoEngine as for ``engine``.
    p2p: _NativeProcessGroup | _NoEngine

    def __repr__(self) -> str:
        return (
            f"ProcessGroup(name={self._group_name!r}, backend={self._backend_str!r}, "
            f"rank={self._rank}, size={self._size})"
        )

    def abort(self) -> None:
        """Aborts this group's collectives: the one running (on any thread) fails within
        about 100 ms with DistBackendError saying it was aborted, queued ones fail without
        running, later ones raise at once, and the group's connections and shared memory
        are released (its peers see this rank leave). The group stays registered:
        destroy_process_group still removes it, dump_flight_recorder still reads it.
        Returns once nothing runs any more. Idempotent."""
        _abort_engine(self)


# ``engine`` and ``p2p`` read the slots _engine and _p2p: the descriptors of those slots
# under a second name, as fast as an attribute (a property would cost a few percent of a
# small all_reduce). Read-only by contract: only this module assigns _engine and _p2p.
ProcessGroup.engine = ProcessGroup._engine  # type: ignore[misc]
ProcessGroup.p2p = ProcessGroup._p2p  # type: ignore[misc]

_Call = TypeVar("_Call", bound=Callable[..., Any])


def native_front(function: _Call) -> _Call:
    """Decorator of the front's hot calls (all_reduce, broadcast, reduce, all_gather_single,
    reduce_scatter_single, all_to_all_single, barrier, send, recv, isend, irecv): the call
    behind its C entry (``ringtree._C.FrontCall``), which runs the function's common branch
    itself (no group argument, the default group, a rank its map knows), reading
    ``world.default_pg`` and the group's slots and calling the engine's method directly,
    and hands every other call to ``function``. That branch must stay as the C entry has it:
    ``pg.engine.<method>(...)`` (``pg.p2p`` for point-to-point calls) with the arguments in
    the engine method's order. Behaviour is the same either way (the C entry reads the
    function's defaults at each call and raises what the rank lookup raises); the C entry
    spares ~0.1 us of interpreter work per call. It does not see a patched
    ``ProcessGroup.engine``/``p2p``, patched methods of ``ringtree._C.ProcessGroup`` or a
    replaced ``world`` in these modules, and tracebacks and profilers show no frame of
    ``function`` for the calls it runs. ``__wrapped__`` is ``function``; the wrapper binds
    as a function does, so inspect, pydoc and help() document it as one."""
    return _C.FrontCall(function, world, ProcessGroup)  # type: ignore[no-any-return]


class _CudaOnlyEngine:
    """The native engine of a group whose backend serves CUDA buffers only ("nccl"): a call
    given a host tensor or array (its ``__dlpack_device__`` says CPU) raises ValueError
    with torch's words, as torch's NCCL groups do. Host memory without DLPack (the bytes
    of the object collectives) still passes: those travel through host memory by design.
    ``native`` is the engine itself."""

    __slots__ = ("native",)

    def __init__(self, native: _NativeProcessGroup) -> None:
        self.native = native

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.native, name)
        if not callable(attribute):
            return attribute

        def checked(*args: Any, **kwargs: Any) -> Any:
            _refuse_host_tensors(args)
            _refuse_host_tensors(tuple(kwargs.values()))
            return attribute(*args, **kwargs)

        return checked


def _refuse_host_tensors(values: tuple | list) -> None:
    for value in values:
        if isinstance(value, (list, tuple)):
            _refuse_host_tensors(value)
            continue
        device = getattr(value, "__dlpack_device__", None)
        if device is not None and device()[0] == 1:  # kDLCPU
            raise ValueError("No backend type associated with device type cpu")


def native_engine(engine: Any) -> Any:
    """The native engine behind ``engine`` (itself, or a _CudaOnlyEngine's)."""
    return engine.native if isinstance(engine, _CudaOnlyEngine) else engine


class _NoEngine:
    """Stands in for the native engine of a group that has none (or no longer has one):
    every collective raises DistBackendError saying why."""

    __slots__ = ("_reason",)

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def _fail(self, *args: Any) -> NoReturn:
        raise DistBackendError(self._reason)

    allreduce = broadcast = reduce = barrier = _fail
    allgather = allgather_single = gather = scatter = reduce_scatter = reduce_scatter_single = _fail
    alltoall = alltoall_single = allreduce_coalesced = allgather_coalesced = _fail
    allgather_single_coalesced = reduce_scatter_single_coalesced = _fail
    send = recv = isend = irecv = _fail


def _start_engine(pg: ProcessGroup) -> None:
    """Starts the group's native backend with the group's timeout. The world's connects
    its ranks (a collective: blocks until all arrive; store keys under ``comm/``); every
    other group runs over the world's connections, on channels of its own, and opens
    none (it returns at once). Collectives and point-to-point messages travel on separate
    channels."""
    parent = world.default_pg
    parent_engine = None if parent is None else native_engine(parent._engine)
    if isinstance(parent_engine, _NativeProcessGroup):
        engine = _NativeProcessGroup.create_over(parent_engine, list(pg.ranks), pg.group_name, pg.store, pg.timeout)
    else:
        engine = _NativeProcessGroup.create(pg.store, pg.rank(), pg.size(), pg.timeout)
    # Flight-record dumps name the rank by its global rank; the group created first (by
    # init_process_group) is the world.
    _C._set_identity(engine.communicator, pg.group_name, pg.ranks[pg.rank()], world.default_pg is None)
    # A group of one device's backend ("nccl") serves that device only, as torch's.
    pg._engine = pg._p2p = engine if "cpu" in pg._backend_config.device_backend_map else _CudaOnlyEngine(engine)


def _start_mpi_engine(pg: ProcessGroup) -> None:
    """Starts the group's MPI backend: a communicator of its members (a collective over
    them, through MPI)."""
    from .mpi.world import create_engine

    pg._engine = pg._p2p = create_engine(pg.group_name, pg.ranks, pg.rank(), pg.timeout)


def _stop_engine(pg: ProcessGroup) -> None:
    """Runs the group's queued collectives to completion and stops its engine (pending
    point-to-point operations fail)."""
    engine = native_engine(pg._engine)
    pg._engine = pg._p2p = _NoEngine(f"group {pg.group_name!r} has been destroyed")
    if not isinstance(engine, _NoEngine):
        engine.shutdown()
    if isinstance(engine, _NativeProcessGroup):
        _dump_flight_record(engine, "destroy_process_group")


def _abort_engine(pg: ProcessGroup) -> None:
    """Aborts the group's native backend (see ProcessGroup.abort), keeping it in place for
    collectives so that its flight record stays readable and its refusals say why."""
    engine = pg._engine
    if not isinstance(engine, _NoEngine):
        pg._p2p = _NoEngine(f"group {pg.group_name!r} has been aborted")
        engine.abort()


def _dump_flight_record(engine: _NativeProcessGroup, reason: str) -> None:
    """Writes the engine's flight record into RINGTREE_FLIGHT_RECORDER_DIR when that is
    set; a failure to write is a warning, not an error of the caller."""
    try:
        _C._dump_flight_record(engine.communicator, reason)
    except Exception as exc:  # noqa: BLE001 - diagnostics must not fail a shutdown
        warnings.warn(f"cannot write the flight record: {exc}", RuntimeWarning, stacklevel=3)


class _WorldAccessor(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:  # noqa: N802 (torch's name)
        return world.default_pg


class GroupMember(metaclass=_WorldAccessor):
    """``GroupMember.WORLD`` is the default group (None before init);
    ``GroupMember.NON_GROUP_MEMBER`` is what non-members get from new_group."""

    NON_GROUP_MEMBER = NON_GROUP_MEMBER


class group(metaclass=_WorldAccessor):  # noqa: N801 (torch's name)
    """``group.WORLD`` is the default group (None before init)."""


def is_available() -> bool:
    """ringtree's distributed package is always available."""
    return True


def is_torchelastic_launched() -> bool:
    """Whether this process was started by torchelastic (torchrun), as torch decides it:
    ``TORCHELASTIC_RUN_ID`` is set. ringtree-run does not set it."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def is_initialized() -> bool:
    """Whether the default group exists."""
    return world.default_pg is not None


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (default: the world); -1 if not a member."""
    if rank_not_in_group(group):
        return -1
    return resolve(group).rank()


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (default: the world); -1 if not a member."""
    if rank_not_in_group(group):
        return -1
    return resolve(group).size()


def get_backend(group: ProcessGroup | None = None) -> str:
    """The backend string ``group`` was created with (e.g. ``'gloo'``, ``'cpu:gloo,cuda:nccl'``,
    or ``'undefined'`` for ``backend=None``).
    ValueError for a group this rank is not in."""
    return joined_group(group).name()


def get_backend_config(group: ProcessGroup | None = None) -> str:
    """The per-device backend map of ``group`` as a string, e.g. ``'cpu:gloo,cuda:nccl'``.
    ValueError for a group this rank is not in."""
    return repr(joined_group(group).backend_config)


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """LOCAL_RANK from the environment, else the launcher's (mpirun's
    OMPI_COMM_WORLD_LOCAL_RANK, Hydra's MPI_LOCALRANKID, srun's SLURM_LOCALID), else
    ``fallback_rank``, else RuntimeError."""
    value = local_rank()
    if value is not None:
        return value
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow "
        "`get_node_local_rank` to work, assuming you are not running in a multi-device context "
        "and want the code to run locally instead."
    )


def _check_timeout(timeout: Any) -> timedelta:
    if timeout is None:
        return constants.default_pg_timeout
    if not isinstance(timeout, timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {type(timeout).__name__}")
    if timeout <= timedelta(0):
        raise ValueError(f"timeout must be positive, got {timeout}")
    return timeout


def _check_device_id(device_id: Any) -> None:
    if device_id is None:
        return
    device_type = getattr(device_id, "type", "cuda" if isinstance(device_id, int) else device_id)
    if device_type == "cpu":
        raise ValueError(f"init_process_group device_id parameter must be an accelerator with an index, got {device_id}")
    if device_type == "cuda" and is_nccl_available():
        return  # the group's CUDA backend is made on its first CUDA tensor, on that tensor's device
    raise DistBackendError(
        f"init_process_group(device_id={device_id!r}) binds an accelerator, which needs the NCCL backend: "
        + unavailable_reason(Backend.NCCL)
    )


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Store | None = None,
    group_name: str = "",
    pg_options: Any | None = None,
    device_id: Any | None = None,
) -> None:
    """Initializes the default process group (torch.distributed's signature and rules).

    Rendezvous is through ``store`` (needs ``rank`` and ``world_size``) or
    ``init_method`` (``env://`` by default, ``tcp://host:port``, ``file:///path``, or a
    registered scheme). ``backend=None`` means torch's defaults (``cpu:gloo``, and
    ``cuda:nccl`` where NCCL is available; the group's backend reads "undefined"). ``timeout``
    (default 30 min) bounds every operation of the group and the store's waits.

    With 'cpu' on ``mpi`` (a job started by mpirun or srun), ``rank`` and ``world_size``
    come from MPI (given ones must agree, else ValueError), and with neither ``store`` nor
    ``init_method`` the job's store is bootstrapped over MPI: rank 0 serves it on a port
    the kernel picks, so no environment variable is needed.

    Blocks until this rank reached the store (rank 0 or ringtree-run hosts it) and, when
    'cpu' maps to 'gloo', until every rank has joined: like torch's gloo, the CPU engine
    connects the ranks here. Raises ValueError for bad arguments (second init, missing env
    variables, rank >= world_size, both store and init_method), DistNetworkError when the
    store or a peer cannot be reached within the timeout, DistStoreError when a peer never
    joins within it, DistBackendError for an unavailable backend.
    ``pg_options`` is accepted for compatibility and unused by the built-in backends.
    """
    if world.default_pg is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if init_method is not None and store is not None:
        raise ValueError("Cannot specify both init_method and store.")
    timeout = _check_timeout(timeout)
    if not isinstance(world_size, int) or not isinstance(rank, int):
        raise TypeError(f"rank and world_size must be int, got rank={rank!r}, world_size={world_size!r}")
    backend_str = parse_backend(backend)
    _check_device_id(device_id)

    if _uses_mpi(backend_str):
        from .mpi.world import bootstrap_store, world_rank_and_size

        rank, world_size = world_rank_and_size(rank, world_size)
        if store is None and init_method is None:
            store = bootstrap_store(timeout)
    if store is None:
        if init_method is None:
            init_method = "env://"
        store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
        store.set_timeout(timeout)
    else:
        if world_size <= 0:
            raise ValueError("world_size must be positive if using store")
        if rank < 0:
            raise ValueError("rank must be non-negative if using store")
    if rank >= world_size:
        raise ValueError(f"rank {rank} must be lower than world_size {world_size}")

    name = group_name or str(world.group_count)
    pg = _create_group(store, name, rank, list(range(world_size)), timeout, backend_str, "default_pg")
    world.default_pg = pg
    world.group_count_at_init = world.group_count
    world.group_count += 1
    if os.environ.get(constants.ENV_INIT_BARRIER, "0") == "1":
        _store_barrier(pg)


def _uses_mpi(backend_str: str) -> bool:
    """Whether a group created with ``backend_str`` runs its CPU buffers on MPI."""
    return BackendConfig(None if backend_str == Backend.UNDEFINED else backend_str).device_backend_map.get("cpu") == Backend.MPI


def _create_group(
    root_store: Store,
    name: str,
    group_rank: int,
    global_ranks: list[int],
    timeout: timedelta,
    backend_str: str,
    group_desc: str,
) -> ProcessGroup:
    """Creates this rank's handle of group ``name`` (members ``global_ranks``, in group
    rank order), whose store keys all live under ``name/`` in ``root_store``, with its
    backends: the registered plugins by device, and ringtree's CPU engine when 'cpu' maps
    to 'gloo'. The engine connects the members (a collective over them: blocks until each
    member arrives, bounded by ``timeout``). Registers the group in ``world.groups`` once
    everything succeeded. ValueError when ``name`` is taken."""
    if name in world.groups:
        raise ValueError(f"The specified group name {name} has already been created, please use a different group name")
    pg = ProcessGroup(root_store, group_rank, timeout, backend_str, name, global_ranks, group_desc)
    device_backends = pg.backend_config.device_backend_map
    for device, backend_name in device_backends.items():
        plugin = registered_plugin(backend_name)
        if plugin is None:
            continue
        device_store = PrefixStore(f"{device}", pg.store)
        if plugin.extended_api:
            raise ValueError(f"backend {backend_name!r} was registered with extended_api=True, which ringtree does not support")
        pg._plugin_backends[device] = plugin.creator_fn(device_store, group_rank, pg.size(), timeout)
    # ringtree's engine serves gloo's CPU buffers and nccl's CUDA ones (an "nccl"-only
    # group's engine refuses host tensors: see _start_engine).
    if device_backends.get("cpu") == Backend.GLOO or (
        "cpu" not in device_backends and device_backends.get("cuda") == Backend.NCCL
    ):
        _start_engine(pg)
    elif device_backends.get("cpu") == Backend.MPI:
        _start_mpi_engine(pg)
    world.groups[name] = pg
    return pg


def _store_barrier(group: ProcessGroup | None = None, timeout: timedelta | None = None) -> None:
    """Blocks until every rank of ``group`` called this function the same number of times.

    Store-based: two store round trips per rank. Raises DistStoreError naming the group
    and how many ranks arrived when the timeout (default: the group's) passes.
    """
    pg = resolve(group)
    timeout = pg.timeout if timeout is None else _check_timeout(timeout)
    pg._barrier_count += 1
    key = f"ringtree/barrier/{pg._barrier_count}"
    arrived = pg.store.add(key, 1)
    if arrived == pg.size():
        if pg._barrier_count > 1:
            # Everyone has passed the previous barrier (they all arrived at this one).
            pg.store.delete_key(f"ringtree/barrier/{pg._barrier_count - 1}")
            pg.store.delete_key(f"ringtree/barrier/{pg._barrier_count - 1}/done")
        pg.store.set(key + "/done", b"1")
        return
    try:
        pg.store.wait([key + "/done"], timeout)
    except DistStoreError:
        now = pg.store.add(key, 0)
        raise DistStoreError(
            f"barrier #{pg._barrier_count} of group {pg.group_name!r} timed out after {timeout}: "
            f"{now} of {pg.size()} ranks arrived (rank {pg.rank()} waiting)"
        ) from None


# --- Shutdown ------------------------------------------------------------------------------
#
# A rank that hosts the job's TCPStore (rank 0 without ringtree-run) must keep it alive
# until every other rank has destroyed its groups or exited, or they would lose the
# store under their feet. destroy_process_group therefore never blocks on the others:
# it hands a hosted store to _retained_stores, and the process waits for them only at
# exit (and not when it exits because of an unhandled exception).

_retained_stores: list[tuple[TCPStore, Store, int, float]] = []
_exiting_on_exception = False
_retain_lock = threading.Lock()


def _retire_store(pg: ProcessGroup) -> None:
    """Tells the group's other ranks that this one is done with it; hands the job's store
    to _retained_stores when this process hosts it and ``pg`` is the world group."""
    try:
        pg.store.add(_EXITED_KEY, 1)
    except Exception:  # noqa: BLE001 - the store may be gone already; nothing to tell then
        return
    root = pg.root_store
    if pg is world.default_pg and isinstance(root, TCPStore) and root._num_server_clients >= 0 and pg.size() > 1:
        deadline = time.monotonic() + pg.timeout.total_seconds()
        with _retain_lock:
            _retained_stores.append((root, pg.store, pg.size(), deadline))


def _wait_for_retained_stores() -> None:
    with _retain_lock:
        retained = list(_retained_stores)
        _retained_stores.clear()
    if _exiting_on_exception:
        return
    for root, pg_store, size, deadline in retained:
        delay = 0.001
        while time.monotonic() < deadline:
            try:
                # Done when every rank said it finished, or when every rank has connected
                # at some point and only our own connection is left (the others exited).
                all_left = root._total_server_clients >= size and root._num_server_clients <= 1
                if all_left or pg_store.add(_EXITED_KEY, 0) >= size:
                    break
            except Exception:  # noqa: BLE001
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Destroys ``group``; every group when it is None or the default group (the process
    may init again after). Does nothing for ``GroupMember.NON_GROUP_MEMBER``.

    Never waits for other ranks. If this process hosts the job's TCPStore, the store is
    kept serving until every other rank has destroyed the group or exited (bounded by
    the group timeout), and the process waits for that only at interpreter exit.
    Raises ValueError for a group that is not (or no longer) registered.
    """
    if rank_not_in_group(group):
        return
    if group is None or group is world.default_pg:
        default_group()  # ValueError before init
        for pg in list(world.groups.values()):
            _stop_engine(pg)
            _retire_store(pg)
        world.groups.clear()
        world.default_pg = None
        return
    if not registered(group):
        raise ValueError(f"Invalid process group specified: {group!r}")
    _stop_engine(group)
    _retire_store(group)
    del world.groups[group.group_name]


def abort_process_group(group: ProcessGroup | None = None) -> None:
    """Aborts ``group`` and removes it; every group when it is None or the default group
    (the process may init again right after). Unlike destroy_process_group it does not
    wait for a collective running on another thread: that one fails within about 100 ms
    with DistBackendError, and queued ones fail without running (see
    ProcessGroup.abort). Does nothing for ``GroupMember.NON_GROUP_MEMBER``; ValueError for
    a group that is not (or no longer) registered.
    """
    if rank_not_in_group(group):
        return
    if group is None or group is world.default_pg:
        default_group()  # ValueError before init
        aborted = list(world.groups.values())
    elif not registered(group):
        raise ValueError(f"Invalid process group specified: {group!r}")
    else:
        aborted = [group]
    for pg in aborted:
        _abort_engine(pg)
    destroy_process_group(group)


def _at_exit() -> None:
    if world.default_pg is not None and not _exiting_on_exception:
        destroy_process_group()
    _wait_for_retained_stores()


def _note_unhandled_exception(exc_type, exc, tb, _previous=sys.excepthook):  # noqa: ANN001
    global _exiting_on_exception
    _exiting_on_exception = True
    _previous(exc_type, exc, tb)


sys.excepthook = _note_unhandled_exception
atexit.register(_at_exit)
