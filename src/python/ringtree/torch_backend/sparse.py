"""all_reduce of sparse COO tensors (SUM), which torch's gloo backend serves and DDP uses for
``nn.Embedding(sparse=True)`` gradients.

Every rank contributes its (coalesced) indices and values; each rank gathers all of them
over the native engine and adds them up (``coalesce``) in rank order, so every rank gets
the same bits. Three native all_gathers: each rank's shape description (to check that the
ranks agree and to size the rest), then the indices and the values, padded to the largest
count of non-zeros. The result is written into the caller's tensor (``copy_``), as torch's
gloo backend does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["sparse_all_reduce"]


def sparse_all_reduce(native: Any, tensor: torch.Tensor, op: Any) -> None:
    """Sums the sparse COO ``tensor`` over the group of ``native`` (ringtree's native process
    group), in place, on the calling thread. ValueError for an op other than SUM, for a
    layout other than COO, and when the ranks' tensors differ in shape, dtype or dimensions."""
    if tensor.layout != torch.sparse_coo:
        raise ValueError(f"all_reduce: ringtree takes sparse tensors in COO layout only, got {tensor.layout}")
    if op != dist.ReduceOp.SUM:
        raise ValueError(f"all_reduce: sparse tensors are reduced with SUM only, got {op}")
    size = native.size
    local = tensor.coalesce()
    indices, values = local.indices(), local.values()
    nnz = indices.shape[1]
    # The shape description, the same length on every rank (so that ranks whose tensors
    # differ in dimensions still exchange it and fail alike): nnz, sparse_dim, dense_dim,
    # dtype code, number of dimensions, then the sizes padded to _MAX_DIMS.
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"all_reduce: sparse tensors of at most {_MAX_DIMS} dimensions, got {tensor.dim()}")
    sizes = [*tensor.shape] + [0] * (_MAX_DIMS - tensor.dim())
    description = torch.tensor([nnz, local.sparse_dim(), local.dense_dim(), _dtype_code(tensor.dtype), tensor.dim(),
                                *sizes], dtype=torch.int64)
    descriptions = [torch.empty_like(description) for _ in range(size)]
    native.allgather(descriptions, description, False)
    for rank, other in enumerate(descriptions):
        if not torch.equal(other[1:], description[1:]):
            raise ValueError(
                f"all_reduce of a sparse tensor: rank {rank} gave shape {_shape_of(other)} with "
                f"{other[1].item()} sparse and {other[2].item()} dense dimensions, this rank "
                f"{tuple(tensor.shape)} with {local.sparse_dim()} and {local.dense_dim()}, or another dtype"
            )
    counts = [int(d[0]) for d in descriptions]
    most = max(counts)
    if most == 0:
        with torch.no_grad():  # written below autograd, as torch's gloo does
            tensor.copy_(local)
        return
    dense_shape = values.shape[1:]
    padded_indices = torch.zeros((indices.shape[0], most), dtype=indices.dtype)
    padded_indices[:, :nnz] = indices
    padded_values = torch.zeros((most, *dense_shape), dtype=values.dtype)
    padded_values[:nnz] = values
    all_indices = [torch.empty_like(padded_indices) for _ in range(size)]
    all_values = [torch.empty_like(padded_values) for _ in range(size)]
    native.allgather(all_indices, padded_indices, False)
    native.allgather(all_values, padded_values, False)
    summed = torch.sparse_coo_tensor(
        torch.cat([i[:, :n] for i, n in zip(all_indices, counts)], dim=1),
        torch.cat([v[:n] for v, n in zip(all_values, counts)]),
        tensor.shape,
    ).coalesce()
    with torch.no_grad():
        tensor.copy_(summed)


# Every dtype a sparse tensor may have, in a fixed order: its index is the dtype's code in
# the shape description, the same on every rank.
_DTYPES = (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
)


def _shape_of(description: torch.Tensor) -> tuple[int, ...]:
    return tuple(description[5:5 + int(description[4])].tolist())


# Most dimensions a sparse tensor's description carries.
_MAX_DIMS = 16


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)
