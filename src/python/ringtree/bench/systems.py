"""The rank side of each benchmarked system: joining the job, allocating buffers, building
the timed operation, and gathering per-rank results to rank 0.

Every adapter offers the same small surface: ``rank``, ``world_size``, ``new_buffer``,
``operation(collective, send_buf, recv_buf, op, root)`` (a zero-argument callable doing
one call of the collective, so that the timed loop costs the same for every system;
``send_buf is recv_buf`` for an in-place collective), ``synchronize`` (returns once the
device work this rank enqueued has finished; nothing to do on host buffers), ``barrier``,
``gather`` (rank 0 gets a list by rank, the others None), ``describe`` and ``close``. On
CUDA buffers a call may return before its work is done: the worker calls
``synchronize`` before reading the clock. Adding a collective means adding its branch to
``_TorchStyleSystem.operation`` (ringtree, gloo and nccl) and to ``MpiSystem.operation``.

- ringtree: ``ringtree.init_process_group()`` (env://, as set up by ringtree-run; its
  default backend, which sends CUDA tensors to ringtree's CUDA path), torch CPU tensors
  (NumPy arrays when torch is missing) or, with ``--device cuda``, torch CUDA tensors;
  results gathered through the group's store so that a wrong ringtree collective cannot
  corrupt the report.
- gloo and nccl: torch's ``init_process_group("gloo")`` / ``("nccl")``, through the
  orchestrator's TCPStore when ``RINGTREE_BENCH_STORE=host:port`` is set (env://
  otherwise, e.g. under torchrun); nccl on CUDA tensors only, bound to the rank's GPU.
- ringtree, gloo and nccl run the same torch.distributed calls: ``all_reduce``,
  ``broadcast``, ``reduce``, ``barrier`` in place; ``all_gather_single(out, in)``,
  ``reduce_scatter_single(out, in, op)`` (torch before 2.13: ``all_gather_into_tensor``,
  ``reduce_scatter_tensor``), ``all_to_all_single(out, in)``; sendrecv as
  ``isend`` to rank + 1 and ``irecv`` from rank - 1, then both waits (on CUDA buffers as
  one ``batch_isend_irecv`` of the two, which NCCL needs so that two ranks sending to
  each other at once do not wait for each other's receive); pingpong as ``send`` then
  ``recv`` on rank 0, ``recv`` then ``send`` on rank 1.
- ringtree-mpi: ringtree's calls as for ringtree, on ``init_process_group("mpi")``
  under mpirun: the layer ringtree adds over the MPI library.
- mpi: mpi4py's ``COMM_WORLD`` with NumPy buffers: ``Allreduce(IN_PLACE)``, ``Bcast``,
  ``Reduce(IN_PLACE at the root)``, ``Barrier``, ``Allgather``, ``Reduce_scatter_block``,
  ``Alltoall``, ``Sendrecv``, ``Send``/``Recv``; operations that reduce nothing move
  bytes (``MPI.BYTE``), the same transfer for every element type.
"""

from __future__ import annotations

import importlib.util
import json
import os
from datetime import timedelta
from typing import Any, Callable

from .options import Collective, DType

__all__ = ["STORE_ENV", "create", "device_reason", "have_torch", "unsupported_reason"]

# Set by the orchestrator for gloo and nccl workers: "host:port" of its torch TCPStore.
STORE_ENV = "RINGTREE_BENCH_STORE"
# What torch's NCCL backend refuses: element types it has no NCCL type for, and reductions.
_NCCL_MISSING_TYPES = ("int16", "bool")
_BITWISE = ("band", "bor", "bxor")


def unsupported_reason(
    system: str, collective: Collective, dtype: DType, op: str, world_size: int, torch_found: bool
) -> str | None:
    """Why ``system`` cannot run ``collective`` with ``dtype``/``op`` on ``world_size``
    ranks (None when it can)."""
    reduces = collective.uses_redop
    if world_size < collective.min_ranks:
        return f"needs at least {collective.min_ranks} ranks"
    if system == "mpi":
        if not collective.has_data:
            return None
        if dtype.name == "bfloat16":
            return "NumPy and MPI have no bfloat16"
        if reduces and dtype.name == "float16":
            return "Open MPI has no float16 reductions"
        if reduces and op == "avg":
            return "MPI has no AVG reduction"
    elif system == "gloo":
        if not torch_found:
            return "torch is not installed"
        if reduces and op == "avg" and not dtype.is_float:
            return "gloo's AVG needs a floating-point type"
    elif system == "nccl":
        if not torch_found:
            return "torch is not installed"
        if collective.has_data and dtype.name in _NCCL_MISSING_TYPES:
            return f"torch's NCCL backend has no {dtype.name}"
        if reduces and op in _BITWISE:
            return f"torch's NCCL backend has no bitwise reductions ({op.upper()})"
        if reduces and op == "avg" and not dtype.is_float:
            return "torch's NCCL AVG needs a floating-point type"
    else:
        import ringtree

        missing = [name for name in collective.functions if not hasattr(ringtree, name)]
        if missing:
            return f"this ringtree has no {', '.join('ringtree.' + name for name in missing)}"
        if dtype.name == "bfloat16" and collective.has_data and not torch_found:
            return "bfloat16 buffers need torch"
    return None


def device_reason(system: str, device: str, ranks: int, gpus: int) -> str | None:
    """Why ``system`` cannot run a job of ``ranks`` local ranks on ``device`` with ``gpus``
    GPUs on this host (None when it can): nccl needs CUDA and a GPU per rank; ringtree on
    CUDA needs its CUDA path (:mod:`ringtree.cuda`); the others measure host buffers."""
    if device != "cuda":
        return "torch's NCCL backend needs --device cuda" if system == "nccl" else None
    if system == "nccl":
        if ranks > gpus:
            return (
                f"{ranks} ranks share {gpus} GPU(s) (--allow-shared-gpu), and torch's NCCL refuses two ranks on one GPU"
            )
        return None
    if system == "ringtree":
        try:
            from ringtree import cuda
        except ImportError:
            return "this ringtree has no CUDA path (no ringtree.cuda)"
        return None if cuda.is_available() else f"ringtree's CUDA path is unavailable: {cuda.unavailable_reason()}"
    return "it measures host buffers only (--device cpu)"


def have_torch() -> bool:
    """Whether torch is installed (looked up without importing it)."""
    return importlib.util.find_spec("torch") is not None


# The torch.distributed ReduceOp member of each reduction name of the command line.
_TORCH_REDUCE_OPS = {
    "sum": "SUM",
    "prod": "PRODUCT",
    "min": "MIN",
    "max": "MAX",
    "avg": "AVG",
    "band": "BAND",
    "bor": "BOR",
    "bxor": "BXOR",
}


def _neighbours(rank: int, world_size: int) -> tuple[int, int]:
    """sendrecv's peers: the rank sent to (rank + 1) and the rank received from (rank - 1)."""
    return (rank + 1) % world_size, (rank - 1) % world_size


def _pingpong(
    rank: int, send: Callable[[Any, int], Any], recv: Callable[[Any, int], Any], send_buf: Any, recv_buf: Any
) -> Callable[[], Any]:
    """One round trip of pingpong: rank 0 sends ``send_buf`` to rank 1 and receives into
    ``recv_buf``; rank 1 receives into ``recv_buf`` and sends it back; other ranks idle."""
    if rank == 0:

        def ping() -> None:
            send(send_buf, 1)
            recv(recv_buf, 1)

        return ping
    if rank == 1:

        def pong() -> None:
            recv(recv_buf, 0)
            send(recv_buf, 0)

        return pong
    return _idle


def _idle() -> None:
    """The operation of a rank that takes no part (pingpong beyond ranks 0 and 1)."""


def _named(dist: Any, name: str, older_name: str) -> Callable[..., Any]:
    """dist's function ``name``, or ``older_name`` where dist lacks it: torch before 2.13
    has all_gather_into_tensor and reduce_scatter_tensor only (the same calls)."""
    function = getattr(dist, name, None)
    return function if function is not None else getattr(dist, older_name)


class _TorchStyleSystem:
    """What ringtree, gloo and nccl share: the same torch.distributed calls through
    ``_dist`` (``ringtree`` or ``torch.distributed``), which the subclass initialises
    first, on buffers on GPU ``gpu`` (torch's current device) or in host memory (None)."""

    def __init__(self, dist: Any, gpu: int | None) -> None:
        self._dist = dist
        self.gpu = gpu
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._ops = {name: getattr(dist.ReduceOp, member) for name, member in _TORCH_REDUCE_OPS.items()}

    def new_buffer(self, dtype: DType, count: int):  # noqa: ANN201
        """A torch tensor of ``count`` elements: on the GPU, or NumPy-backed in host memory."""
        from .data import TorchBuffer

        return TorchBuffer(dtype, count, None if self.gpu is None else f"cuda:{self.gpu}")

    def synchronize(self) -> None:
        """Return once this rank's device work has finished (every stream of its GPU);
        nothing to do on host buffers."""
        if self.gpu is not None:
            import torch

            torch.cuda.synchronize(self.gpu)

    def reduce_op(self, op: str) -> Any:
        return self._ops[op]

    def operation(
        self, collective: Collective, send_buf: Any, recv_buf: Any, op: Any, root: int
    ) -> Callable[[], Any]:
        """One call of ``collective``, blocking on host buffers; on CUDA buffers its device
        work may still run when it returns (see ``synchronize``)."""
        dist, name = self._dist, collective.name
        if name == "allreduce":
            return lambda: dist.all_reduce(recv_buf, op=op)
        if name == "broadcast":
            return lambda: dist.broadcast(recv_buf, src=root)
        if name == "reduce":
            return lambda: dist.reduce(recv_buf, dst=root, op=op)
        if name == "barrier":
            return dist.barrier
        if name == "allgather":
            gather = _named(dist, "all_gather_single", "all_gather_into_tensor")
            return lambda: gather(recv_buf, send_buf)
        if name == "reduce_scatter":
            scatter = _named(dist, "reduce_scatter_single", "reduce_scatter_tensor")
            return lambda: scatter(recv_buf, send_buf, op=op)
        if name == "alltoall":
            return lambda: dist.all_to_all_single(recv_buf, send_buf)
        if name == "sendrecv":
            to_rank, from_rank = _neighbours(self.rank, self.world_size)
            if self.gpu is not None:
                pair = [dist.P2POp(dist.isend, send_buf, to_rank), dist.P2POp(dist.irecv, recv_buf, from_rank)]

                def batched() -> None:
                    for work in dist.batch_isend_irecv(pair):
                        work.wait()

                return batched

            def sendrecv() -> None:
                sent = dist.isend(send_buf, to_rank)
                received = dist.irecv(recv_buf, from_rank)
                sent.wait()
                received.wait()

            return sendrecv
        if name == "pingpong":
            return _pingpong(self.rank, dist.send, dist.recv, send_buf, recv_buf)
        raise ValueError(f"no operation for {name}")

    def barrier(self) -> None:
        self._dist.barrier()

    def close(self) -> None:
        self._dist.destroy_process_group()

    def _gpu_meta(self, gpus: int) -> dict[str, Any]:
        """What describe() says of the GPUs (nothing on host buffers)."""
        if self.gpu is None:
            return {}
        from .devices import device_name

        return {"device": device_name(self.gpu), "gpus": gpus}


class RingtreeSystem(_TorchStyleSystem):
    """One rank of a ringtree job."""

    name = "ringtree"
    backend: str | None = None  # init_process_group's default: ringtree's own engine, and its CUDA path

    def __init__(self, timeout: timedelta, gpu: int | None = None) -> None:
        import ringtree

        ringtree.init_process_group(self.backend, timeout=timeout)
        super().__init__(ringtree, gpu)
        self._store = ringtree.group.WORLD.store
        self._gathers = 0
        self._torch = have_torch()

    def new_buffer(self, dtype: DType, count: int):  # noqa: ANN201
        from .data import NumpyBuffer

        return super().new_buffer(dtype, count) if self._torch else NumpyBuffer(dtype, count)

    def gather(self, obj: Any) -> list[Any] | None:
        """Through the store: each rank sets a key, rank 0 reads them all."""
        self._gathers += 1
        prefix = f"ringtree-bench/gather/{self._gathers}/"
        self._store.set(prefix + str(self.rank), json.dumps(obj))
        if self.rank != 0:
            return None
        return [json.loads(self._store.get(prefix + str(r))) for r in range(self.world_size)]

    def describe(self) -> dict[str, Any]:
        names = ("RINGTREE_ALGO", "RINGTREE_TRANSPORT", "RINGTREE_CUDA_BACKEND")
        env = {k: os.environ[k] for k in names if k in os.environ}
        meta = {
            "version": f"ringtree {self._dist.__version__}",
            "buffers": ("torch" if self._torch else "numpy") + ("" if self.gpu is None else " cuda"),
            "env": env,
        }
        if self.gpu is not None:
            from ringtree import cuda

            meta.update(self._gpu_meta(cuda.device_count()))
            meta["cuda_path"] = _ringtree_cuda_path(cuda)
        return meta


def _ringtree_cuda_path(cuda: Any) -> str:
    """The path ringtree's default backend takes for this job's CUDA buffers, as seen from
    this host: NCCL (with its version) unless NCCL is unusable, RINGTREE_CUDA_BACKEND=staged
    forces host staging, or this host's ranks (LOCAL_WORLD_SIZE) outnumber its GPUs, in
    which case ringtree stages through host memory."""
    try:
        version = ".".join(str(part) for part in cuda.nccl_version())
    except RuntimeError as error:
        return f"host staging (no usable NCCL: {error})"
    if os.environ.get("RINGTREE_CUDA_BACKEND") == "staged":
        return "host staging (RINGTREE_CUDA_BACKEND=staged)"
    local_ranks, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), cuda.device_count()
    if local_ranks > gpus:
        return f"host staging ({local_ranks} ranks share {gpus} GPU(s), which NCCL {version} refuses)"
    return f"NCCL {version}"


def _join_torch(backend: str, timeout: timedelta, **options: Any) -> Any:
    """``torch.distributed`` after ``init_process_group(backend, **options)``: through the
    orchestrator's store (STORE_ENV), else env://."""
    import torch.distributed as dist

    spec = os.environ.get(STORE_ENV)
    if spec:
        host, _, port = spec.rpartition(":")
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(host, int(port), None, False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **options)
    else:
        dist.init_process_group(backend, timeout=timeout, **options)
    return dist


class _TorchBackendSystem(_TorchStyleSystem):
    """What gloo and nccl share: torch.distributed, results gathered with
    ``all_gather_object``."""

    def gather(self, obj: Any) -> list[Any] | None:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj)
        return out if self.rank == 0 else None


class GlooSystem(_TorchBackendSystem):
    """One rank of a torch.distributed job on the gloo backend (host buffers)."""

    name = "gloo"

    def __init__(self, timeout: timedelta, gpu: int | None = None) -> None:
        import torch

        self._torch = torch
        super().__init__(_join_torch("gloo", timeout), gpu)

    def describe(self) -> dict[str, Any]:
        return {"version": f"torch {self._torch.__version__} gloo", "buffers": "torch", "env": {}}


class NcclSystem(_TorchBackendSystem):
    """One rank of a torch.distributed job on the NCCL backend, on CUDA buffers of GPU
    ``gpu``, one GPU per rank (torch's NCCL refuses two ranks on one GPU: SystemExit
    when this host's ranks, LOCAL_WORLD_SIZE, outnumber its GPUs)."""

    name = "nccl"

    def __init__(self, timeout: timedelta, gpu: int | None = None) -> None:
        import torch

        if gpu is None:
            raise SystemExit("nccl: torch's NCCL backend needs --device cuda")
        local_ranks, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count()
        if local_ranks > gpus:
            raise SystemExit(
                f"nccl: {local_ranks} ranks share {gpus} GPU(s), and torch's NCCL refuses two ranks on one GPU"
            )
        self._torch = torch
        super().__init__(_join_torch("nccl", timeout, device_id=torch.device("cuda", gpu)), gpu)

    def describe(self) -> dict[str, Any]:
        version = self._torch.cuda.nccl.version()
        version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        meta = {"version": f"torch {self._torch.__version__} NCCL {version}", "buffers": "torch cuda", "env": {}}
        meta.update(self._gpu_meta(self._torch.cuda.device_count()))
        return meta


class MpiSystem:
    """One rank of an MPI job (mpi4py, NumPy buffers). MPI has no timeout: ``timeout``
    is accepted for a uniform constructor and unused, and so is ``gpu`` (always None:
    the options refuse mpi with --device cuda)."""

    name = "mpi"

    def __init__(self, timeout: timedelta, gpu: int | None = None) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.world_size = self._comm.Get_size()
        self._ops = {
            "sum": MPI.SUM,
            "prod": MPI.PROD,
            "min": MPI.MIN,
            "max": MPI.MAX,
            "band": MPI.BAND,
            "bor": MPI.BOR,
            "bxor": MPI.BXOR,
        }

    def new_buffer(self, dtype: DType, count: int):  # noqa: ANN201
        from .data import NumpyBuffer

        return NumpyBuffer(dtype, count)

    def synchronize(self) -> None:
        """Nothing to do: NumPy buffers live in host memory."""

    def reduce_op(self, op: str) -> Any:
        if op not in self._ops:
            raise ValueError(f"MPI has no {op} reduction")
        return self._ops[op]

    def operation(
        self, collective: Collective, send_buf: Any, recv_buf: Any, op: Any, root: int
    ) -> Callable[[], Any]:
        comm, in_place, name, rank = self._comm, self._mpi.IN_PLACE, collective.name, self.rank
        if name == "allreduce":
            return lambda: comm.Allreduce(in_place, recv_buf, op)
        if name == "reduce":
            if rank == root:
                return lambda: comm.Reduce(in_place, recv_buf, op, root)
            return lambda: comm.Reduce(recv_buf, None, op, root)
        if name == "reduce_scatter":
            return lambda: comm.Reduce_scatter_block(send_buf, recv_buf, op)
        if name == "barrier":
            return comm.Barrier
        # Everything else moves data only: as bytes, the same transfer for every element
        # type, float16 included.
        send_bytes = [send_buf.view("uint8"), self._mpi.BYTE]
        recv_bytes = [recv_buf.view("uint8"), self._mpi.BYTE]
        if name == "broadcast":
            return lambda: comm.Bcast(recv_bytes, root)
        if name == "allgather":
            return lambda: comm.Allgather(send_bytes, recv_bytes)
        if name == "alltoall":
            return lambda: comm.Alltoall(send_bytes, recv_bytes)
        if name == "sendrecv":
            to_rank, from_rank = _neighbours(self.rank, self.world_size)
            return lambda: comm.Sendrecv(send_bytes, to_rank, recvbuf=recv_bytes, source=from_rank)
        if name == "pingpong":
            return _pingpong(self.rank, comm.Send, comm.Recv, send_bytes, recv_bytes)
        raise ValueError(f"mpi: no operation for {name}")

    def barrier(self) -> None:
        self._comm.Barrier()

    def gather(self, obj: Any) -> list[Any] | None:
        return self._comm.gather(obj, root=0)

    def describe(self) -> dict[str, Any]:
        import mpi4py

        library = self._mpi.Get_library_version().splitlines()[0].split(",")[0].strip()
        return {"version": f"{library}, mpi4py {mpi4py.__version__}", "buffers": "numpy", "env": {}}

    def close(self) -> None:
        """Nothing to do: mpi4py finalizes MPI at exit."""


class RingtreeMpiSystem(RingtreeSystem):
    """One rank of a ringtree job on backend "mpi", started by mpirun (rank, size and the
    store come from MPI)."""

    name = "ringtree-mpi"
    backend = "mpi"


_SYSTEMS = {cls.name: cls for cls in (RingtreeSystem, RingtreeMpiSystem, GlooSystem, NcclSystem, MpiSystem)}


def create(
    name: str, timeout_s: float, device: str = "cpu", allow_shared_gpu: bool = False
) -> RingtreeSystem | GlooSystem | NcclSystem | MpiSystem:
    """Join the job of system ``name`` (blocks until every rank has joined). With
    ``device="cuda"`` this rank's GPU (see :func:`ringtree.bench.devices.select_gpu`) is
    made torch's current device first, and the system's buffers are on it."""
    gpu = None
    if device == "cuda":
        from .devices import select_gpu

        gpu = select_gpu(allow_shared_gpu)
    return _SYSTEMS[name](timedelta(seconds=timeout_s), gpu)
