"""torch's result and future API on ringtree's Work (the native handle, ringtree._C.Work).

The collective and point-to-point wrappers attach the tensors a call writes to the Work
they return (``_outputs``); this module adds ``result()``, ``get_future()`` and
``synchronize()`` to the Work class. The values follow torch 2.13 (gloo): ``[tensor]`` for
all_reduce, broadcast, reduce, scatter, reduce_scatter*, all_to_all_single, isend and
irecv; the output list for all_gather and all_to_all; ``gather_list`` on the destination
(``[]`` elsewhere); the flattened output lists for all_gather_coalesced; ``[]`` for
barrier; ``[output]`` for all_gather_single (gloo gives its per-rank chunks). Unlike gloo,
isend/irecv Works support both (gloo raises "not implemented").
"""

from __future__ import annotations

from typing import Any

from ._C import Work

__all__ = ["Work"]


def _result(self: Work) -> list[Any]:
    """The tensors the operation wrote (see the module docstring). Raises RuntimeError,
    as torch does, while the operation has not completed."""
    if not self.is_completed():
        raise RuntimeError("Work needs to be completed before calling result(). Should call wait() before result().")
    return list(self.__dict__.get("_outputs", ()))


def _get_future(self: Work) -> Any:
    """A ``torch.futures.Future`` that the thread finishing the operation completes: with
    ``result()``'s list on success, with the operation's error otherwise (``wait()`` and
    ``value()`` raise it). The same Future on every call. ``fut.then(...)`` callbacks run
    on that thread; DDP's communication hooks wait on this future. Needs torch."""
    future = self.__dict__.get("_future")
    if future is not None:
        return future
    try:
        from torch.futures import Future
    except ImportError:
        raise RuntimeError("Work.get_future() returns a torch.futures.Future: it needs torch installed") from None
    future = Future()
    self._future = future
    outputs = list(self.__dict__.get("_outputs", ()))

    def complete(error: BaseException | None) -> None:
        if error is None:
            future.set_result(outputs)
        else:
            future.set_exception(error)

    self._add_done_callback(complete)
    return future


def _synchronize(self: Work) -> None:
    """Nothing to do: ringtree's buffers are host memory, written before the Work
    completes (torch's synchronize() orders device streams)."""


Work.result = _result
Work.get_future = _get_future
Work.synchronize = _synchronize
