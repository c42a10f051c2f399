"""Worker functions of test_torch_training.py: the same training steps under torch's
"gloo" backend and under "ringtree", one after the other in each rank's process; each
returns, per backend, what the test compares (parameters after the steps, tensors of the
functional collectives and DTensor), or the error."""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

TIMEOUT = timedelta(seconds=30)
STEPS = 3


def _each_backend(rank: int, world_size: int, ports: dict[str, int], cases: dict[str, Callable[[int, int], Any]]):
    """{backend: {case: {"ok": value} | {"error": text}}}: every case under gloo, then ringtree."""
    torch.set_num_threads(1)
    results: dict[str, dict[str, Any]] = {}
    for backend, port in ports.items():
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=TIMEOUT)
        results[backend] = {}
        for name, case in cases.items():
            try:
                results[backend][name] = {"ok": case(rank, world_size)}
            except Exception as exc:  # noqa: BLE001 - compared by the test
                results[backend][name] = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
            dist.barrier()
        dist.destroy_process_group()
    return results


def _flat(tensors) -> list[float]:
    return torch.cat([t.detach().reshape(-1).double() for t in tensors]).tolist()


# --- DDP -----------------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self, batch_norm: bool = False, unused: bool = False) -> None:
        super().__init__()
        self.first = nn.Linear(16, 32)
        self.norm = nn.BatchNorm1d(32) if batch_norm else nn.Identity()
        self.second = nn.Linear(32, 4)
        self.unused = nn.Linear(32, 4) if unused else None

    def forward(self, x):
        return self.second(torch.relu(self.norm(self.first(x))))


def _ddp_case(kwargs: dict | None = None, batch_norm: bool = False, unused: bool = False,
              hook: str | None = None, no_sync: bool = False, device: str = "cpu"):
    def case(rank: int, world_size: int) -> dict[str, list[float]]:
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch.manual_seed(0)
        model = _Net(batch_norm, unused).to(device)
        # Different initial weights on every rank: the constructor's broadcast must fix them
        # (unless init_sync=False, where they start equal).
        if (kwargs or {}).get("init_sync", True):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(rank)
        ddp = DDP(model, **(kwargs or {}))
        if hook == "allreduce":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        elif hook == "fp16_compress":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif hook in ("builtin_allreduce", "builtin_fp16_compress"):
            kind = dist.BuiltinCommHookType.ALLREDUCE if hook == "builtin_allreduce" else \
                dist.BuiltinCommHookType.FP16_COMPRESS
            ddp._register_builtin_comm_hook(kind)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(100 + rank)
        for _ in range(STEPS):
            optimizer.zero_grad()
            if no_sync:
                with ddp.no_sync():
                    ddp(torch.randn(8, 16, generator=generator).to(device)).sum().backward()
            ddp(torch.randn(8, 16, generator=generator).to(device)).square().mean().backward()
            optimizer.step()
        # Buffers (BatchNorm's running statistics) are broadcast before each forward, so
        # after the last step they differ between ranks, as they do under gloo.
        return {"parameters": _flat(ddp.parameters()), "buffers": _flat(ddp.buffers()) if batch_norm else []}
    return case


# Each configuration: _ddp_case's arguments.
_DDP_CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "gradient_as_bucket_view": {"kwargs": {"gradient_as_bucket_view": True}},
    "static_graph": {"kwargs": {"static_graph": True}},
    "find_unused_parameters": {"kwargs": {"find_unused_parameters": True}, "unused": True},
    "broadcast_buffers_batch_norm": {"kwargs": {"broadcast_buffers": True}, "batch_norm": True},
    "no_sync": {"no_sync": True},
    "hook_allreduce": {"hook": "allreduce"},
    "hook_fp16_compress": {"hook": "fp16_compress"},
    "builtin_hook_allreduce": {"hook": "builtin_allreduce"},
    "builtin_hook_fp16_compress": {"hook": "builtin_fp16_compress"},
    "init_sync_false": {"kwargs": {"init_sync": False}},
    "small_buckets": {"kwargs": {"bucket_cap_mb": 0.001}},
}
DDP_CASES = {name: _ddp_case(**arguments) for name, arguments in _DDP_CONFIGURATIONS.items()}
CUDA_DDP_CASES = {name: _ddp_case(**arguments, device="cuda") for name, arguments in _DDP_CONFIGURATIONS.items()}


def ddp(rank: int, world_size: int, ports: dict[str, int]) -> dict:
    return _each_backend(rank, world_size, ports, DDP_CASES)


def ddp_cuda(rank: int, world_size: int, ports: dict[str, int]) -> dict:
    """DDP_CASES on a model and data on GPU LOCAL_RANK (every rank's, where they share one)."""
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return _each_backend(rank, world_size, ports, CUDA_DDP_CASES)


# --- functional collectives, DTensor, FSDP2, object collectives ----------------------------


def _funcol(rank: int, world_size: int) -> dict[str, list[float]]:
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    x = torch.arange(6, dtype=torch.float32) + 10 * rank
    out = {
        "all_reduce": funcol.all_reduce(x, "sum", group),
        "all_gather_tensor": funcol.all_gather_tensor(x, 0, group),
        "reduce_scatter_tensor": funcol.reduce_scatter_tensor(torch.arange(4.0 * world_size) + rank, "sum", 0, group),
        "all_to_all_single": funcol.all_to_all_single(torch.arange(2.0 * world_size) + rank, None, None, group),
        "broadcast": funcol.broadcast(x, 0, group),
    }
    return {name: torch.as_tensor(funcol.wait_tensor(t) if hasattr(funcol, "wait_tensor") else t).tolist()
            for name, t in out.items()}


def _funcol_compiled(rank: int, world_size: int) -> list[float]:
    """Functional collectives inside a function torch.compile traces as one graph
    (fullgraph=True; the aot_eager backend: dynamo and AOT autograd trace the collectives,
    nothing is compiled to C++, which would take ~35 s a rank here)."""
    import torch._dynamo
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD

    def step(x):
        y = funcol.all_reduce(x * 2, "sum", group)
        z = funcol.all_gather_tensor(y + 1, 0, group)
        w = funcol.reduce_scatter_tensor(z.repeat(world_size), "avg", 0, group)
        return funcol.wait_tensor(w) if hasattr(funcol, "wait_tensor") else w

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    return compiled(torch.arange(4.0) + rank).tolist()


def _dtensor(rank: int, world_size: int) -> dict[str, list[float]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    full = torch.randn(8, 8)
    sharded = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    replicated = sharded.redistribute(mesh, [Replicate(), Replicate()])
    partial_sum = (sharded * 2).sum()
    return {
        "local_shard": sharded.to_local().reshape(-1).tolist(),
        "replicated": replicated.to_local().reshape(-1).tolist(),
        "sum": [float(partial_sum.full_tensor())],
        "equal_to_full": [float(torch.equal(replicated.to_local(), full))],
    }


def _fsdp2(rank: int, world_size: int) -> list[float]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        optimizer.zero_grad()
        model(torch.randn(8, 16, generator=generator)).square().mean().backward()
        optimizer.step()
    return _flat([p.full_tensor() for p in model.parameters()])


def _objects(rank: int, world_size: int) -> dict:
    gathered = [None] * world_size
    dist.all_gather_object(gathered, {"rank": rank, "text": "x" * rank})
    objects = [{"from": 0}] if rank == 0 else [None]
    dist.broadcast_object_list(objects, src=0)
    return {"gathered": gathered, "broadcast": objects}


HIGHER_LAYER_CASES = {"funcol": _funcol, "funcol_compiled": _funcol_compiled, "objects": _objects, "fsdp2": _fsdp2}


def higher_layers(rank: int, world_size: int, ports: dict[str, int]) -> dict:
    cases = dict(HIGHER_LAYER_CASES)
    if world_size % 2 == 0:
        cases["dtensor_2d"] = _dtensor
    return _each_backend(rank, world_size, ports, cases)
