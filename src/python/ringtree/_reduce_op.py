"""ReduceOp: the reduction operations, with torch.distributed's names and values."""

from __future__ import annotations

import enum

__all__ = ["ReduceOp", "supports_complex"]


class ReduceOp:
    """A reduction operation for all_reduce, reduce and reduce_scatter.

    The class attributes (``ReduceOp.SUM`` ... ``ReduceOp.PREMUL_SUM``) are members of
    :class:`ReduceOp.RedOpType`, an ``IntEnum`` with torch's values (SUM=0 ... PREMUL_SUM=8).
    ``ReduceOp(op)`` builds an instance (``.op``, and ``.factor`` for PREMUL_SUM) that
    compares equal to its ``RedOpType``.

    - SUM, PRODUCT, MIN, MAX: elementwise.
    - AVG: sum divided by the number of ranks.
    - BAND, BOR, BXOR: bitwise; integer and bool buffers only.
    - PREMUL_SUM: each input multiplied by ``factor`` before summing.
    """

    class RedOpType(enum.IntEnum):
        SUM = 0
        AVG = 1
        PRODUCT = 2
        MIN = 3
        MAX = 4
        BAND = 5
        BOR = 6
        BXOR = 7
        PREMUL_SUM = 8

    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR
    PREMUL_SUM = RedOpType.PREMUL_SUM

    __slots__ = ("op", "factor")

    def __init__(self, op: ReduceOp.RedOpType | int = RedOpType.SUM, factor: float | None = None) -> None:
        try:
            self.op = ReduceOp.RedOpType(op)
        except ValueError:
            raise ValueError(f"unknown reduce op {op!r}; expected one of {[m.name for m in ReduceOp.RedOpType]}") from None
        if factor is not None and self.op != ReduceOp.PREMUL_SUM:
            raise ValueError(f"a factor is only meaningful with PREMUL_SUM, not {self.op.name}")
        self.factor = factor

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReduceOp):
            return self.op == other.op and self.factor == other.factor
        if isinstance(other, ReduceOp.RedOpType):
            return self.op == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.op, self.factor))

    def __repr__(self) -> str:
        if self.factor is None:
            return f"ReduceOp({self.op.name})"
        return f"ReduceOp({self.op.name}, factor={self.factor})"


def supports_complex(reduceOp: ReduceOp | ReduceOp.RedOpType) -> bool:  # noqa: N803 (torch's name)
    """Whether ``reduceOp`` is defined on complex tensors: False for MAX, MIN, PRODUCT,
    BAND, BOR and BXOR (torch's rule)."""
    op = getattr(reduceOp, "op", reduceOp)
    return op not in (
        ReduceOp.RedOpType.MAX,
        ReduceOp.RedOpType.MIN,
        ReduceOp.RedOpType.PRODUCT,
        ReduceOp.RedOpType.BAND,
        ReduceOp.RedOpType.BOR,
        ReduceOp.RedOpType.BXOR,
    )


def _make_premul_sum(factor: float) -> ReduceOp:
    """Returns ``ReduceOp(PREMUL_SUM, factor)`` (torch's ``_make_nccl_premul_sum``)."""
    return ReduceOp(ReduceOp.PREMUL_SUM, factor)
