"""What ringtree's reductions give, computed with torch on the host, and bit-for-bit
comparison: shared by the workers of the CPU grids (collective_workers.py) and of the
CUDA tests (cuda_workers.py). Needs torch only."""

from __future__ import annotations

import functools

import torch

import ringtree as dist

SUM, AVG, PRODUCT, MIN, MAX = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
                               dist.ReduceOp.MAX)
BAND, BOR, BXOR, PREMUL_SUM = dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR, dist.ReduceOp.PREMUL_SUM
BITWISE = (BAND, BOR, BXOR)
PREMUL_FACTOR = 2.0  # the factor of every PREMUL_SUM the workers run


def expected_reduction(stack: torch.Tensor, op, world_size: int) -> torch.Tensor:
    """op over dim 0 of the stacked inputs, in the inputs' dtype."""
    dtype = stack.dtype
    if dtype is torch.bool:
        if op in (SUM, MAX, BOR):
            return stack.any(0)
        if op in (PRODUCT, MIN, BAND):
            return stack.all(0)
        return functools.reduce(torch.logical_xor, stack.unbind(0))
    if op in BITWISE:
        fn = {BAND: torch.bitwise_and, BOR: torch.bitwise_or, BXOR: torch.bitwise_xor}[op]
        return functools.reduce(fn, stack.unbind(0))
    wide_type = torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64
    wide = stack.to(wide_type)
    if op == SUM:
        out = wide.sum(0)
    elif op == PREMUL_SUM:
        out = (wide * PREMUL_FACTOR).sum(0)
    elif op == AVG:
        total = wide.sum(0)
        out = torch.div(total, world_size, rounding_mode="trunc") if wide_type is torch.int64 else total / world_size
    elif op == PRODUCT:
        out = wide.prod(0)
    elif op == MIN:
        out = wide.amin(0)
    else:
        out = wide.amax(0)
    return out.to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers, so that comparisons are bit for bit (-0.0 != 0.0)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype is torch.bool:
        return t.view(torch.uint8)
    if t.is_floating_point():
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t
