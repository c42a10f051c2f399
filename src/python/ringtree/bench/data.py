"""Benchmark buffers and verifiable data (nccl-tests' ``-c``).

Every rank fills its input with small non-negative integers derived from (rank, index)
by a multiplicative hash, chosen so that the result of the collective is exact in the
element type whatever the reduction order: sums stay below the type's largest exact
integer, products are powers of two. Collectives that only move data use the same hash
per stream: a rank's own data (allgather, sendrecv, pingpong) or one (sender, receiver)
pair's (alltoall).

A buffer is a row of parts (see :meth:`Collective.buffer_parts`): one for most
collectives, one per rank for allgather, reduce_scatter and alltoall. A :class:`Plan`
holds, for the largest size of a sweep, what this rank writes into each part of its input
and what each part of its output must hold; every size uses the first elements of each
part, since the values depend on the index only. Verification compares exactly, except
float ``avg`` (2 ulp, as nccl-tests) and integer ``avg`` (either neighbour of the exact
quotient, so truncating and rounding implementations both pass). Before a checked
operation an output that is not also the input is filled with :func:`unwritten_value`,
which no correct result holds, so an element the collective never wrote counts as wrong.

Buffers are torch CPU tensors (:class:`TorchBuffer`), NumPy arrays (:class:`NumpyBuffer`)
or torch CUDA tensors (a :class:`TorchBuffer` with a device), allocated once at the
largest size and written through, so their pages are faulted in before anything is
timed. Host buffers of both kinds take their memory from NumPy (a torch CPU buffer is a
view of a NumPy array), so every system moves data between memory of the same kind:
NumPy asks the kernel for transparent huge pages on large arrays and torch's allocator
does not, which alone changes large-message bandwidth by 2x and more. CUDA buffers come
from torch's allocator for every system alike; plans are copied to them from NumPy, and
checks read copies on the host. This module imports NumPy; torch only when a torch
buffer is made.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .options import Collective, DType

__all__ = ["FOLDS", "NumpyBuffer", "Plan", "TorchBuffer", "count_wrong", "make_plan", "unwritten_value"]

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

    ``source`` (uint8 values, one row per part of the input) is written into the input;
    when it is None the input is one part filled with ``constant``. ``expected`` (float32,
    exact integers, one row per part of the output) is None when this rank's result is not
    checked (non-root ranks of reduce, ranks other than 0 and 1 of pingpong). The result
    must equal ``expected / divisor``: exactly when ``rtol`` is 0 and not
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


#: The NumPy function that folds two ranks' values for each reduction (avg: the sum, divided
#: at the end).
FOLDS = {
    "sum": np.add,
    "avg": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
}


def _stream_rows(streams: list[int], length: int) -> np.ndarray:
    """One row of ``length`` pattern values (PATTERN_BITS) per stream, uint8."""
    rows = np.empty((len(streams), length), dtype=np.uint8)
    for row, stream in zip(rows, streams):
        for start in range(0, length, CHUNK):
            stop = min(length, start + CHUNK)
            row[start:stop] = pattern(stream, start, stop, PATTERN_BITS)
    return rows


def _reduction_plan(
    collective: Collective, dtype: DType, op: str, root: int, rank: int, world_size: int, count: int
) -> Plan:
    """allreduce, reduce and reduce_scatter: each rank's input is its values over the whole
    array; the output is their fold over every rank, all of it (allreduce, and reduce at
    the root) or the rank's own part (reduce_scatter)."""
    values = _values(op, dtype, world_size)
    parts = collective.parts(world_size)
    part = count // parts
    source = np.empty(count, dtype=np.uint8)
    for start in range(0, count, CHUNK):
        stop = min(count, start + CHUNK)
        source[start:stop] = values(rank, start, stop)
    expected = None
    if collective.name != "reduce" or rank == root:
        first = rank * part if parts > 1 else 0
        expected = np.empty((1, part), dtype=np.float32)
        fold = FOLDS[op]
        for start in range(first, first + part, CHUNK):
            stop = min(first + part, start + CHUNK)
            acc = values(0, start, stop).astype(np.int64)
            for other in range(1, world_size):
                fold(acc, values(other, start, stop), out=acc)
            expected[0, start - first : stop - first] = acc
    plan = Plan(source.reshape(parts, part), 0, expected)
    if op == "avg":
        plan.divisor = world_size
        plan.rtol = 2 * dtype.eps
        plan.integer_quotient = not dtype.is_float
    return plan


def make_plan(
    collective: Collective, dtype: DType, op: str, root: int, rank: int, world_size: int, count: int
) -> Plan:
    """The plan of ``rank`` for ``collective`` on up to ``count`` elements (the whole array
    S: a multiple of the world size for a collective split by rank)."""
    name, n = collective.name, world_size
    part = count // collective.parts(n)
    if name in ("allreduce", "reduce", "reduce_scatter"):
        return _reduction_plan(collective, dtype, op, root, rank, n, count)
    if name == "broadcast":
        source = _stream_rows([root], count)
        # Non-root ranks start from a value the root never sends.
        constant = (1 << PATTERN_BITS) + 1
        return Plan(source if rank == root else None, constant, source.astype(np.float32))
    if name == "allgather":
        return Plan(_stream_rows([rank], part), 0, _stream_rows(list(range(n)), part).astype(np.float32))
    if name == "alltoall":
        # Stream sender * n + receiver: every (sender, receiver) pair sends its own data.
        source = _stream_rows([rank * n + peer for peer in range(n)], part)
        expected = _stream_rows([peer * n + rank for peer in range(n)], part)
        return Plan(source, 0, expected.astype(np.float32))
    if name == "sendrecv":
        return Plan(_stream_rows([rank], count), 0, _stream_rows([(rank - 1) % n], count).astype(np.float32))
    if name == "pingpong":
        # Rank 0's data goes to rank 1 and back; rank 1 sends what it received.
        expected = _stream_rows([0], count).astype(np.float32) if rank in (0, 1) else None
        return Plan(_stream_rows([0], count) if rank == 0 else None, 0, expected)
    raise ValueError(f"no verifiable data for {name}")


def unwritten_value(dtype: DType) -> int:
    """What an output is filled with before a checked operation: -1 (255 for uint8, above
    its ``exact_max``), which no correct result holds."""
    return 255 if dtype.name == "uint8" else -1


def count_wrong(buffer: NumpyBuffer | TorchBuffer, plan: Plan, part: int) -> int:
    """Elements of ``buffer`` that differ from the plan's expectation, the buffer being
    the plan's rows of ``part`` elements one after the other (0 when this rank checks
    nothing). NaN is always wrong."""
    if plan.expected is None:
        return 0
    wrong = 0
    for row, expected in enumerate(plan.expected):
        for start in range(0, part, CHUNK):
            stop = min(part, start + CHUNK)
            got = buffer.read(row * part + start, row * part + stop)
            want = expected[start:stop].astype(np.float64)
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


def _ones(numpy_dtype: str, count: int) -> np.ndarray:
    """``count`` elements set to 1, in memory from NumPy's allocator (see the module's
    docstring)."""
    return np.ones(count, dtype=np.dtype(numpy_dtype))


class _Buffer:
    """What both kinds of buffer share: writing a plan's input, through the subclass's
    ``fill(value, count)`` and ``_write_rows(rows)`` (copies a 2-D NumPy array over the
    buffer's first elements, row after row)."""

    def write(self, plan: Plan, part: int) -> None:
        """Write the plan's input, parts of ``part`` elements, at the start."""
        if plan.source is None:
            self.fill(plan.constant, part)
        else:
            self._write_rows(plan.source[:, :part])


class NumpyBuffer(_Buffer):
    """A NumPy array of ``count`` elements, filled with ones."""

    kind = "numpy"

    def __init__(self, dtype: DType, count: int) -> None:
        if dtype.name == "bfloat16":
            raise ValueError("NumPy has no bfloat16; this system needs torch for it")
        self.array = _ones(dtype.name, count)

    def view(self, count: int) -> np.ndarray:
        """The first ``count`` elements (no copy)."""
        return self.array[:count]

    def _write_rows(self, rows: np.ndarray) -> None:
        self.array[: rows.size].reshape(rows.shape)[:] = rows

    def fill(self, value: int, count: int) -> None:
        """Set the first ``count`` elements to ``value``."""
        self.array[:count] = value

    def read(self, start: int, stop: int) -> np.ndarray:
        """Elements start..stop-1 as float64."""
        return self.array[start:stop].astype(np.float64)


class TorchBuffer(_Buffer):
    """A torch tensor of ``count`` elements, filled with ones. Without ``device``: a CPU
    tensor that is a view of a NumPy array (of uint16 reinterpreted as bfloat16, which
    NumPy lacks). With ``device`` (``"cuda:1"``, a torch.device): a tensor from torch's
    allocator on that device; writes copy from NumPy to it, reads copy back to the host
    (after the work on it that torch's current stream orders before them)."""

    kind = "torch"

    def __init__(self, dtype: DType, count: int, device: object = None) -> None:
        import torch

        self._torch = torch
        if device is not None:
            self.tensor = torch.ones(count, dtype=getattr(torch, dtype.name), device=device)
        elif dtype.name == "bfloat16":
            self.tensor = torch.from_numpy(_ones("uint16", count)).view(torch.bfloat16).fill_(1)
        else:
            self.tensor = torch.from_numpy(_ones(dtype.name, count))

    def view(self, count: int):  # noqa: ANN201 - a torch.Tensor
        """The first ``count`` elements (no copy)."""
        return self.tensor[:count]

    def _write_rows(self, rows: np.ndarray) -> None:
        self.tensor[: rows.size].view(rows.shape).copy_(self._torch.from_numpy(rows))

    def fill(self, value: int, count: int) -> None:
        """Set the first ``count`` elements to ``value``."""
        self.tensor[:count].fill_(value)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Elements start..stop-1 as float64, in host memory."""
        return self.tensor[start:stop].to(self._torch.float64).cpu().numpy()
