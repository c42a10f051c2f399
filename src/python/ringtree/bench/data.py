"""Benchmark buffers and verifiable data (nccl-tests' ``-c``).

Every rank fills its buffer with small non-negative integers derived from (rank, index)
by a multiplicative hash, chosen so that the result of the collective is exact in the
element type whatever the reduction order: sums stay below the type's largest exact
integer, products are powers of two. A :class:`Plan` holds, for the largest size of a
sweep, what this rank writes and what it must read back; every size of the sweep uses a
prefix of it, since the values depend on the index only. Verification compares exactly,
except float ``avg`` (2 ulp, as nccl-tests) and integer ``avg`` (either neighbour of the
exact quotient, so truncating and rounding implementations both pass).

Buffers are torch CPU tensors (:class:`TorchBuffer`) or NumPy arrays
(:class:`NumpyBuffer`), allocated once at the largest size and written through, so their
pages are faulted in before anything is timed. This module imports NumPy; torch only
when a torch buffer is made.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .options import Collective, DType

__all__ = ["NumpyBuffer", "Plan", "TorchBuffer", "count_wrong", "make_plan"]

# Elements processed at once while generating and verifying (bounds temporary memory).
CHUNK = 1 << 20
# Values of min, max, bitwise and broadcast data are in [0, 2**PATTERN_BITS).
PATTERN_BITS = 6
# Products use a factor 2 from at most this many ranks (2**62 is exact in every type).
_MAX_PROD_RANKS = 62
_GOLDEN = 0x9E3779B97F4A7C15
_RANK_STRIDE = 0x632BE59BD9B4E019
_MASK64 = (1 << 64) - 1


def pattern(rank: int, start: int, stop: int, bits: int) -> np.ndarray:
    """Values in [0, 2**bits) for elements start..stop-1 of ``rank`` (uint8)."""
    if bits == 0:
        return np.zeros(stop - start, dtype=np.uint8)
    x = np.arange(start, stop, dtype=np.uint64)
    x += np.uint64((rank * _RANK_STRIDE) & _MASK64)
    x *= np.uint64(_GOLDEN)
    x >>= np.uint64(64 - bits)
    return x.astype(np.uint8)


def sum_bits(dtype: DType, world_size: int) -> int:
    """Bits per rank's value such that the sum over ``world_size`` ranks is exact."""
    bits = PATTERN_BITS
    while bits and world_size * ((1 << bits) - 1) > dtype.exact_max:
        bits -= 1
    return bits


@dataclasses.dataclass
class Plan:
    """What one rank writes before a checked operation and what it must hold after it.

    ``source`` (uint8 values) or ``constant`` is written; ``expected`` (float32, exact
    integers) is None when this rank's result is not checked (non-root ranks of reduce).
    The result must equal ``expected / divisor``: exactly when ``rtol`` is 0 and not
    ``integer_quotient``, within ``rtol`` relative when ``rtol`` > 0, within 1 (exclusive)
    when ``integer_quotient``.
    """

    source: np.ndarray | None
    constant: int
    expected: np.ndarray | None
    divisor: int = 1
    rtol: float = 0.0
    integer_quotient: bool = False


def _values(op: str, dtype: DType, world_size: int):
    """The function (rank, start, stop) -> uint8 values every rank contributes for ``op``."""
    if op == "prod":
        ranks_with_twos = min(dtype.pow2_max, _MAX_PROD_RANKS)

        def values(rank: int, start: int, stop: int) -> np.ndarray:
            if rank >= ranks_with_twos:
                return np.ones(stop - start, dtype=np.uint8)
            return pattern(rank, start, stop, 1) + np.uint8(1)

        return values
    bits = sum_bits(dtype, world_size) if op in ("sum", "avg") else PATTERN_BITS
    return lambda rank, start, stop: pattern(rank, start, stop, bits)


_FOLDS = {
    "sum": np.add,
    "avg": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
}


def make_plan(
    collective: Collective, dtype: DType, op: str, root: int, rank: int, world_size: int, count: int
) -> Plan:
    """The plan of ``rank`` for ``collective`` on up to ``count`` elements."""
    if collective.name == "broadcast":
        source = np.empty(count, dtype=np.uint8)
        for start in range(0, count, CHUNK):
            stop = min(count, start + CHUNK)
            source[start:stop] = pattern(root, start, stop, PATTERN_BITS)
        # Non-root ranks start from a value the root never sends.
        constant = (1 << PATTERN_BITS) + 1
        return Plan(source if rank == root else None, constant, source.astype(np.float32))
    if collective.name not in ("allreduce", "reduce"):
        raise ValueError(f"no verifiable data for {collective.name}")
    values = _values(op, dtype, world_size)
    checked = collective.name == "allreduce" or rank == root
    source = np.empty(count, dtype=np.uint8)
    expected = np.empty(count, dtype=np.float32) if checked else None
    fold = _FOLDS[op]
    for start in range(0, count, CHUNK):
        stop = min(count, start + CHUNK)
        source[start:stop] = values(rank, start, stop)
        if expected is None:
            continue
        acc = values(0, start, stop).astype(np.int64)
        for other in range(1, world_size):
            fold(acc, values(other, start, stop), out=acc)
        expected[start:stop] = acc
    plan = Plan(source, 0, expected)
    if op == "avg":
        plan.divisor = world_size
        plan.rtol = 2 * dtype.eps
        plan.integer_quotient = not dtype.is_float
    return plan


def count_wrong(buffer: NumpyBuffer | TorchBuffer, plan: Plan, count: int) -> int:
    """Elements among the first ``count`` of ``buffer`` that differ from the plan's
    expectation (0 when this rank checks nothing). NaN is always wrong."""
    if plan.expected is None:
        return 0
    wrong = 0
    for start in range(0, count, CHUNK):
        stop = min(count, start + CHUNK)
        got = buffer.read(start, stop)
        want = plan.expected[start:stop].astype(np.float64)
        if plan.divisor != 1:
            want /= plan.divisor
        if plan.integer_quotient:
            good = np.abs(got - want) < 1
        elif plan.rtol:
            good = np.abs(got - want) <= plan.rtol * np.abs(want)
        else:
            good = got == want
        wrong += (stop - start) - int(np.count_nonzero(good))
    return wrong


class NumpyBuffer:
    """A NumPy array of ``count`` elements, filled with ones."""

    kind = "numpy"

    def __init__(self, dtype: DType, count: int) -> None:
        if dtype.name == "bfloat16":
            raise ValueError("NumPy has no bfloat16; this system needs torch for it")
        self.array = np.ones(count, dtype=np.dtype(dtype.name))

    def view(self, count: int) -> np.ndarray:
        """The first ``count`` elements (no copy)."""
        return self.array[:count]

    def write(self, plan: Plan, count: int) -> None:
        """Write the plan's input into the first ``count`` elements."""
        if plan.source is None:
            self.array[:count] = plan.constant
        else:
            self.array[:count] = plan.source[:count]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Elements start..stop-1 as float64."""
        return self.array[start:stop].astype(np.float64)


class TorchBuffer:
    """A torch CPU tensor of ``count`` elements, filled with ones."""

    kind = "torch"

    def __init__(self, dtype: DType, count: int) -> None:
        import torch

        self._torch = torch
        self.tensor = torch.ones(count, dtype=getattr(torch, dtype.name))

    def view(self, count: int):  # noqa: ANN201 - a torch.Tensor
        """The first ``count`` elements (no copy)."""
        return self.tensor[:count]

    def write(self, plan: Plan, count: int) -> None:
        """Write the plan's input into the first ``count`` elements."""
        if plan.source is None:
            self.tensor[:count].fill_(plan.constant)
        else:
            self.tensor[:count].copy_(self._torch.from_numpy(plan.source[:count]))

    def read(self, start: int, stop: int) -> np.ndarray:
        """Elements start..stop-1 as float64."""
        return self.tensor[start:stop].to(self._torch.float64).numpy()
