"""How each (dtype, ReduceOp) of ringtree is done over MPI.

- MPI's own operator where MPI defines it with ringtree's meaning: SUM, PRODUCT, MIN,
  MAX, BAND, BOR, BXOR on the integer types; SUM and PRODUCT on float32/float64; SUM on
  complex.
- Otherwise an MPI operator whose function is ringtree's C++ reduction kernel, so results
  follow the CPU engine's rules exactly: float16/bfloat16 (MPI has no such types; every
  step widens to float32 and rounds once), bool (logical values), and MIN/MAX of floats
  (NaN propagates as torch.minimum/maximum do; MPI leaves NaN to the library).
- AVG is SUM, then ringtree's division by the group size on the result; PREMUL_SUM is
  ringtree's scaling of each rank's input, then SUM. Both exactly as the CPU engine.

Unsupported combinations (BAND on float32, AVG on bool, ...) raise ValueError before any
data moves, with the CPU engine's rule.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .. import _C

AVG = 1
PREMUL_SUM = 8
_SUM, _PRODUCT, _MIN, _MAX, _BAND, _BOR, _BXOR = 0, 2, 3, 4, 5, 6, 7

_INTEGERS = ("int8", "uint8", "int16", "int32", "int64")


class Reduction(NamedTuple):
    """An MPI operator and what ringtree does around it (``kind``: AVG, PREMUL_SUM or
    another op code)."""

    op: Any  # the mpi4py Op
    kind: int


def datatypes(MPI: Any) -> dict[str, Any]:  # noqa: N803 (the module's name)
    """The MPI datatype that carries each ringtree dtype: an exact one, or an unsigned
    integer of the element's size for the types MPI lacks (reduced by ringtree's kernels)."""
    return {
        "float16": MPI.UINT16_T,
        "bfloat16": MPI.UINT16_T,
        "float32": MPI.FLOAT,
        "float64": MPI.DOUBLE,
        "int8": MPI.INT8_T,
        "uint8": MPI.UINT8_T,
        "int16": MPI.INT16_T,
        "int32": MPI.INT32_T,
        "int64": MPI.INT64_T,
        "bool": MPI.UINT8_T,
        "complex64": MPI.C_FLOAT_COMPLEX,
        "complex128": MPI.C_DOUBLE_COMPLEX,
    }


class Reductions:
    """The Reduction of each (dtype, op code), made on first use and cached (ringtree
    operators are created once per process and live until it exits)."""

    def __init__(self, MPI: Any) -> None:  # noqa: N803
        self._MPI = MPI
        self._native = {
            _SUM: MPI.SUM, _PRODUCT: MPI.PROD, _MIN: MPI.MIN, _MAX: MPI.MAX,
            _BAND: MPI.BAND, _BOR: MPI.BOR, _BXOR: MPI.BXOR,
        }
        self._cache: dict[tuple[str, int], Reduction] = {}

    def get(self, dtype: str, code: int, what: str) -> Reduction:
        """The Reduction for ``dtype`` and op ``code``; ValueError when the CPU engine does
        not define the op on the type."""
        reduction = self._cache.get((dtype, code))
        if reduction is None:
            reduction = self._cache[(dtype, code)] = self._make(dtype, code, what)
        return reduction

    def _make(self, dtype: str, code: int, what: str) -> Reduction:
        _C._check_reduction(what, dtype, code)
        base = _SUM if code in (AVG, PREMUL_SUM) else code
        op = self._native[base] if self._mpi_defines(dtype, base) else self._ringtree_op(dtype, base)
        return Reduction(op, code)

    @staticmethod
    def _mpi_defines(dtype: str, code: int) -> bool:
        if dtype in _INTEGERS:
            return True
        if dtype in ("float32", "float64"):
            return code in (_SUM, _PRODUCT)
        if dtype in ("complex64", "complex128"):
            return code == _SUM
        return False

    def _ringtree_op(self, dtype: str, code: int) -> Any:
        MPI = self._MPI  # noqa: N806
        handle = _C._mpi_reduce_op(MPI.__file__, dtype, code, MPI._sizeof(MPI.Op))
        return MPI.Op.fromhandle(handle)


def op_code(op: Any) -> tuple[int, float | None]:
    """(op code, PREMUL_SUM factor) of a ReduceOp, RedOpType, int, or torch's ReduceOp."""
    inner = op if isinstance(op, int) else getattr(op, "op", op)
    try:
        code = int(inner)
    except (TypeError, ValueError):
        raise TypeError(f"op must be a ReduceOp or a ReduceOp.RedOpType, got {type(op).__name__}") from None
    factor = None
    if code == PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if factor is None:
            raise ValueError("ReduceOp.PREMUL_SUM needs a factor: pass ReduceOp(ReduceOp.PREMUL_SUM, factor)")
        factor = float(factor)
    return code, factor
