"""``RingtreeProcessGroup``: the ``torch.distributed.ProcessGroup`` of backend "ringtree".

torch creates one per group (``init_process_group``, ``new_group``, each DeviceMesh
dimension) through :func:`create_process_group`, handing it a prefix store of the job's
store (TCPStore, FileStore, HashStore, torchrun's agent store): the native process group
rendezvouses through that store. Each method takes torch's arguments (lists of tensors,
options structs, group ranks) and calls the native process group with the tensors
themselves: zero-copy, every dtype and ReduceOp (PREMUL_SUM's factor read from the op).
Calls with ``opts.asyncOp`` False run on the calling thread (no hand-off, the GIL
released); the others are queued to the group's engine thread, in submission order.

Methods are named as torch's Python ProcessGroup trampoline looks them up, so that torch's
C++ callers (DDP's reducer, functional collectives, DTensor, FSDP2) reach them as well as
``torch.distributed``'s Python functions. ``monitored_barrier`` is served when called on
the group (torch's ``dist.monitored_barrier`` allows only its gloo backend). A
collective's ``opts.timeout``, when set, is that call's deadline (else the group's
timeout applies), as with gloo.
"""

from __future__ import annotations

import atexit
import weakref
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _C
from ..monitored_barrier import MonitoredBarrier, barrier_timeout
from .errors import torch_error
from .sparse import sparse_all_reduce
from .work import RingtreeWork

__all__ = ["RingtreeProcessGroup", "create_process_group"]

_BACKEND_NAME = "ringtree"
_NO_TIMEOUT = timedelta(0)  # torch's unset per-call timeout is negative (-1 ms)

# Groups torch has not destroyed. torch does not destroy process groups at exit, and a
# native engine thread still running while the interpreter finalises would crash it (a
# thread that takes the GIL then is ended by Python in the middle of C++ code).
_live_groups: weakref.WeakSet = weakref.WeakSet()

# The world group of this backend (the one torch made with no member list), whose
# connections every other group of the backend runs over: a group opens no connection of
# its own (its messages travel on channels of their own over the world's). None until
# torch makes a world of this backend (a "ringtree" group in a world of another backend
# connects its members itself).
_world: weakref.ReferenceType | None = None


@atexit.register
def _abort_live_groups() -> None:
    """At exit, before the interpreter finalises: aborts every group not aborted yet (what
    it had pending fails; nobody waits for it any more) and joins its threads. A group
    torch shut down is aborted too: shutdown leaves its status thread running."""
    for group in list(_live_groups):
        try:
            group._native.abort()
        except Exception:  # noqa: BLE001 - the others must still be aborted
            pass


def create_process_group(options: Any, pg_options: Any) -> RingtreeProcessGroup:
    """torch's backend creator (``extended_api=True``): options carries the prefix store,
    group rank and size, timeout, group id and the members' global ranks ([] for the
    world). ``pg_options`` (``init_process_group(pg_options=)``) is unused."""
    _refuse_mixed_devices()
    return RingtreeProcessGroup(
        options.store, options.group_rank, options.group_size, options.timeout, options.group_id,
        list(options.global_ranks_in_group),
    )


def _refuse_mixed_devices() -> None:
    """Raises ValueError when the backend string being initialised maps a device to another
    backend ("cpu:ringtree,cuda:gloo") or to ringtree on a device it has no path for
    (ringtree serves cpu and cuda): the group torch makes of a Python process group is that
    process group alone, so torch would drop the other device silently. Reads the map from
    torch's caller frame; does nothing when that is not where torch 2.x keeps it."""
    import sys

    try:
        config = sys._getframe(2).f_locals.get("backend_config")
    except ValueError:  # called directly, not by torch: nothing to check
        return
    device_map = getattr(config, "device_backend_map", None)
    if not isinstance(device_map, dict):
        return
    for device, backend in device_map.items():
        if backend != _BACKEND_NAME:
            raise ValueError(
                f"backend '{config}': the ringtree backend serves every device of its process group, so it cannot "
                f"share one with '{backend}' for {device}; give one backend for all devices ('ringtree', or "
                f"torch's own)"
            )
        if device not in ("cpu", "cuda"):
            raise ValueError(
                f"backend '{config}': ringtree serves cpu and cuda tensors, not {device}; "
                f"use 'cpu:ringtree' with another backend's process group for {device} tensors"
            )


def _one(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
    """The single tensor of torch's one-element list (one device per process)."""
    if len(tensors) != 1:
        raise ValueError(f"{what}: ringtree takes exactly one tensor per process, got a list of {len(tensors)}")
    return _usable(tensors[0])


def _usable(tensor: torch.Tensor) -> torch.Tensor:
    """tensor itself, or a detached view of it (same memory) when it requires grad, as
    torch's backends accept parameters. ValueError for a tensor that is not strided."""
    if tensor.layout != torch.strided:
        raise ValueError(f"ringtree takes strided tensors, got one of layout {tensor.layout} (sparse COO tensors: "
                         f"all_reduce with SUM only)")
    return tensor.detach() if tensor.requires_grad else tensor


def _all(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [_usable(t) for t in tensors]


class RingtreeProcessGroup(dist.ProcessGroup):
    """One torch process group over ringtree's native process group (see module doc)."""

    def __init__(
        self, store: Any, rank: int, size: int, timeout: timedelta, group_name: str = "",
        global_ranks: list[int] | None = None,
    ) -> None:
        super().__init__(rank, size)
        self._group_name = group_name
        self._group_desc = "undefined"
        self._timeout = timeout
        global _world
        ranks = global_ranks or list(range(size))
        native_store = _C.ForeignStore(store)
        self._monitored_barrier = MonitoredBarrier(native_store, rank, size, group_name)
        world = _world() if _world is not None and global_ranks else None
        try:
            if world is not None and not world._native.is_shutdown:
                self._native = _C.ProcessGroup.create_over(world._native, ranks, group_name, native_store, timeout)
            else:
                self._native = _C.ProcessGroup.create(native_store, rank, size, timeout)
        except Exception as error:  # noqa: BLE001 - re-raised as torch's class
            raise torch_error(error) from None
        if not global_ranks:
            _world = weakref.ref(self)
        _live_groups.add(self)
        _C._set_identity(self._native.communicator, group_name, ranks[rank], not global_ranks)

    # --- identity -------------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return _BACKEND_NAME

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def _get_backend(self, device: Any) -> RingtreeProcessGroup:
        """This group serves every device type itself. torch asks for a device's backend
        (``batch_isend_irecv`` in torch 2.14 checks its ``supports_coalescing``); the base
        class would raise "No backend type associated with device type cpu", since a
        Python process group registers no per-device backends."""
        return self

    @property
    def native(self) -> Any:
        """The native process group (diagnostics, flight recorder)."""
        return self._native

    # --- the calls ------------------------------------------------------------------------

    def _run(self, opts: Any, outputs: list[torch.Tensor], call: Callable[..., Any],
             typed_future: bool = False) -> RingtreeWork:
        """call(async_op) on the native group, async_op being ``opts.asyncOp`` (True for
        options without the field: torch releases before it, or point-to-point calls,
        which pass None): its Work when async_op, else it has run. A collective's
        ``opts.timeout``, when set (torch's unset one is negative), becomes the call's
        deadline: call(async_op, timeout=opts.timeout)."""
        timeout = getattr(opts, "timeout", None)
        try:
            if timeout is not None and timeout > _NO_TIMEOUT:
                native = call(getattr(opts, "asyncOp", True), timeout=timeout)
            else:
                native = call(getattr(opts, "asyncOp", True))
        except Exception as error:  # noqa: BLE001 - re-raised as torch's class
            raise torch_error(error) from None
        return RingtreeWork(native, outputs, typed_future)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> RingtreeWork:
        opts = dist.AllreduceOptions() if opts is None else opts
        if len(tensors) == 1 and tensors[0].is_sparse:
            # On the calling thread also when async: the work returned has completed.
            try:
                sparse_all_reduce(self._native, tensors[0], opts.reduceOp)
            except Exception as error:  # noqa: BLE001 - re-raised as torch's class
                raise torch_error(error) from None
            return RingtreeWork(None, tensors)
        tensor = _one(tensors, "allreduce")
        return self._run(opts, [tensor], lambda a, **t: self._native.allreduce(tensor, opts.reduceOp, a, **t),
                         typed_future=True)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> RingtreeWork:
        opts = dist.AllreduceCoalescedOptions() if opts is None else opts
        tensors = _all(tensors)
        return self._run(opts, tensors,
                         lambda a, **t: self._native.allreduce_coalesced(tensors, opts.reduceOp, a, **t), typed_future=True)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> RingtreeWork:
        opts = dist.BroadcastOptions() if opts is None else opts
        tensor = _one(tensors, "broadcast")
        return self._run(opts, [tensor], lambda a, **t: self._native.broadcast(tensor, opts.rootRank, a, **t))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> RingtreeWork:
        opts = dist.ReduceOptions() if opts is None else opts
        tensor = _one(tensors, "reduce")
        return self._run(opts, [tensor],
                         lambda a, **t: self._native.reduce(tensor, opts.rootRank, opts.reduceOp, a, **t))

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> RingtreeWork:
        opts = dist.AllgatherOptions() if opts is None else opts
        tensor = _one(input_tensors, "allgather")
        outputs = _all(_one_list(output_tensors, "allgather"))
        return self._run(opts, outputs, lambda a, **t: self._native.allgather(outputs, tensor, a, **t))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts: Any = None) -> RingtreeWork:
        opts = dist.AllgatherOptions() if opts is None else opts
        outputs = [_all(per_rank) for per_rank in output_lists]
        inputs = _all(input_list)
        flat = [t for per_rank in outputs for t in per_rank]
        return self._run(opts, flat,
                         lambda a, **t: self._native.allgather_coalesced(outputs, inputs, a, **t))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> RingtreeWork:  # noqa: A002
        opts = dist.AllgatherOptions() if opts is None else opts
        output, input = _usable(output), _usable(input)  # noqa: A001
        return self._run(opts, [output], lambda a, **t: self._native.allgather_single(output, input, a, **t))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> RingtreeWork:
        opts = dist.AllgatherOptions() if opts is None else opts
        outputs, inputs = _all(outputs), _all(inputs)
        return self._run(opts, outputs,
                         lambda a, **t: self._native.allgather_single_coalesced(outputs, inputs, a, **t))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> RingtreeWork:
        opts = dist.GatherOptions() if opts is None else opts
        tensor = _one(input_tensors, "gather")
        gather_list = _all(_one_list(output_tensors, "gather")) if output_tensors else None
        outputs = gather_list or []
        return self._run(opts, outputs,
                         lambda a, **t: self._native.gather(tensor, gather_list, opts.rootRank, a, **t))

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> RingtreeWork:
        opts = dist.ScatterOptions() if opts is None else opts
        tensor = _one(output_tensors, "scatter")
        scatter_list = _all(_one_list(input_tensors, "scatter")) if input_tensors else None
        return self._run(opts, [tensor],
                         lambda a, **t: self._native.scatter(tensor, scatter_list, opts.rootRank, a, **t))

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> RingtreeWork:
        opts = dist.ReduceScatterOptions() if opts is None else opts
        tensor = _one(output_tensors, "reduce_scatter")
        inputs = _all(_one_list(input_tensors, "reduce_scatter"))
        return self._run(opts, [tensor],
                         lambda a, **t: self._native.reduce_scatter(tensor, inputs, opts.reduceOp, a, **t))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> RingtreeWork:  # noqa: A002
        opts = dist.ReduceScatterOptions() if opts is None else opts
        output, input = _usable(output), _usable(input)  # noqa: A001
        return self._run(opts, [output],
                         lambda a, **t: self._native.reduce_scatter_single(output, input, opts.reduceOp, a, **t))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> RingtreeWork:
        opts = dist.ReduceScatterOptions() if opts is None else opts
        outputs, inputs = _all(outputs), _all(inputs)
        return self._run(opts, outputs,
                         lambda a, **t: self._native.reduce_scatter_single_coalesced(outputs, inputs, opts.reduceOp, a, **t))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> RingtreeWork:
        opts = dist.AllToAllOptions() if opts is None else opts
        outputs, inputs = _all(output_tensors), _all(input_tensors)
        return self._run(opts, outputs,
                         lambda a, **t: self._native.alltoall(outputs, inputs, a, **t))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],  # noqa: A002
                          input_split_sizes: list[int], opts: Any = None) -> RingtreeWork:
        opts = dist.AllToAllOptions() if opts is None else opts
        output, input = _usable(output), _usable(input)  # noqa: A001
        return self._run(opts, [output], lambda a, **t: self._native.alltoall_single(
            output, input, output_split_sizes, input_split_sizes, a, **t))

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> RingtreeWork:
        opts = dist.BarrierOptions() if opts is None else opts
        return self._run(opts, [], lambda a, timeout=None: self._native.barrier(timeout, a))

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """``ringtree.monitored_barrier`` on this group, over its store: names the ranks that
        did not arrive in time. Reached by ``group.monitored_barrier(timeout)``; torch's
        ``dist.monitored_barrier`` refuses every backend but gloo by name before calling it.
        No timeout, or torch's unset (negative) one: the group's timeout."""
        if timeout is None or (isinstance(timeout, timedelta) and timeout < timedelta(0)):
            timeout = self._timeout
        try:
            self._monitored_barrier.run(barrier_timeout(timeout, self._timeout), wait_all_ranks)
        except Exception as error:  # noqa: BLE001 - re-raised as torch's class
            raise torch_error(error) from None

    # --- point to point (dst, src: group ranks) ---------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> RingtreeWork:
        tensor = _one(tensors, "send")
        return self._run(None, [tensor], lambda _: self._native.isend(tensor, dst, tag))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> RingtreeWork:
        tensor = _one(tensors, "recv")
        return self._run(None, [tensor], lambda _: self._native.irecv(tensor, src, tag))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> RingtreeWork:
        tensor = _one(tensors, "recv")
        return self._run(None, [tensor], lambda _: self._native.irecv(tensor, _C.ANY_SOURCE, tag))

    # --- life cycle -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Runs the queued collectives, then stops the engine (destroy_process_group)."""
        self._native.shutdown()

    def abort(self) -> None:
        """Fails what runs within about 100 ms and releases connections and shared memory."""
        self._native.abort()
        _live_groups.discard(self)


def _one_list(lists: list[list[torch.Tensor]], what: str) -> list[torch.Tensor]:
    """The single tensor list of torch's one-element list of lists."""
    if len(lists) != 1:
        raise ValueError(f"{what}: ringtree takes exactly one tensor list per process, got {len(lists)}")
    return lists[0]
