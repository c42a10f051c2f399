"""``RingtreeWork``: torch's ``Work`` over one operation of ringtree's native engine.

A synchronous call (``opts.asyncOp`` False: ``dist.all_reduce(t)``) runs on the calling
thread and yields a work that is already complete; an asynchronous one (``async_op=True``,
DDP's gradient buckets, functional collectives) holds the native Work, and the torch
Future of :meth:`get_future` completes when it finishes, without anyone calling
``wait()``: DDP only waits on that future.

Two kinds of future. torch's C++ reducer (DDP) reads an all_reduce's future value as a
list of tensors: a torch.futures.Future made in Python holds a Python object instead,
which DDP's built-in comm hooks refuse ("ProcessGroup::allreduce should return
TensorList") and which crashes torch 2.13's reducer when it carries an error. So the work
of an all_reduce gets a future typed as a list of tensors (typed_future.py: a failure
then reaches it as RuntimeError with ringtree's message). Every other work gets a
Python future that the engine thread completes, with the error as torch's class (see
errors.py); so does a point-to-point work, whose completion may depend on what the
program does next (a pool thread must not wait for it).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from .errors import torch_error
from .typed_future import typed_future

__all__ = ["RingtreeWork"]


def _same_list(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return tensors



class RingtreeWork(dist.Work):
    """One operation: ``native`` is ringtree's Work (None for a synchronous call, which
    has finished), ``outputs`` the tensors it writes (the future's value)."""

    def __init__(self, native: Any, outputs: list[torch.Tensor], typed_future: bool = False) -> None:
        super().__init__()
        self._native = native
        self._outputs = outputs
        self._typed_future = typed_future  # see the module doc: all_reduce's works
        self._future: Future | None = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Blocks until the operation finished (``timeout``: 0 = no limit); True on
        success. Raises the operation's error, or DistTimeoutError when the timeout passes
        first (the operation keeps running). On CUDA tensors, as torch's NCCL backend:
        makes the current stream wait for the operation and returns at once."""
        if self._native is None:
            return True
        if self._outputs and self._outputs[0].is_cuda:
            self._order_current_stream()
        try:
            return self._native.wait(timeout)
        except Exception as error:  # noqa: BLE001 - re-raised as torch's class
            raise torch_error(error) from None

    def is_completed(self) -> bool:
        return self._native is None or self._native.is_completed()

    def is_success(self) -> bool:
        return self._native is None or self._native.is_success()

    def exception(self) -> BaseException | None:
        if self._native is None:
            return None
        error = self._native.exception()
        return None if error is None else torch_error(error)

    def source_rank(self) -> int:
        """The group rank a receive from any source got its message from."""
        if self._native is None:
            raise RuntimeError("source_rank() is only valid on the work of a receive")
        return self._native.source_rank()

    _source_rank = source_rank

    def result(self) -> list[torch.Tensor]:
        if not self.is_completed():
            raise RuntimeError("Work needs to be completed before calling result(). Should call wait() before result().")
        return self._outputs

    def synchronize(self) -> None:
        """CUDA tensors: makes the current stream wait for the operation. CPU tensors:
        nothing to order (the data is in place once the work completed)."""
        if self._native is not None and self._outputs and self._outputs[0].is_cuda:
            self._order_current_stream()
            self._native.wait(timedelta(0))

    def _order_current_stream(self) -> None:
        """Tells ringtree the caller's current stream of the outputs' device (what the
        native wait orders after the operation)."""
        from .. import _C

        device = self._outputs[0].device
        _C._set_current_stream(device.index, torch.cuda.current_stream(device).cuda_stream)

    def get_future(self) -> Future:
        """A torch Future whose value is the list of output tensors, completed by the
        engine thread when the operation finishes (or already complete for a synchronous
        call), or failed with the operation's error. The same Future on every call."""
        if self._future is not None:
            return self._future
        if self._native is None or self._native.is_completed() and self._native.is_success():
            # Completed: a future typed as a list of tensors, which torch's C++ callers
            # (DDP's built-in comm hooks) require; torch.jit.fork of a Python function runs
            # it at once and types its result.
            self._future = torch.jit.fork(_same_list, self._outputs) if self._outputs else _completed([])
            return self._future
        if self._typed_future and self._outputs:
            self._future = typed_future(self._native, self._outputs)
            return self._future
        future: Future = Future()
        outputs = self._outputs

        def done(error: BaseException | None) -> None:
            if error is None:
                future.set_result(outputs)
            else:
                future.set_exception(torch_error(error))

        self._native._add_done_callback(done)
        self._future = future
        return future


def _completed(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future
