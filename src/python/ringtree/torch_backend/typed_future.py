"""A torch Future typed as a list of tensors that completes when a native Work finishes
(see work.py for why all_reduce's works need one): a TorchScript ``fork`` of a function
that waits for the Work on torch's inter-op thread pool.

No ``from __future__ import annotations`` here: TorchScript reads the annotations as
types. The script is compiled on first use, not at import (``import torch`` imports
this package).
"""

import atexit
import itertools
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from .errors import torch_error

__all__ = ["typed_future"]

# Native Works that a future waits for, by key: TorchScript passes ints, not objects.
_waited: Dict[int, Any] = {}
_keys = itertools.count()
_launch: Optional[Callable[[int, List[torch.Tensor]], Any]] = None
# When the last fork's wait returned (time.monotonic()). The pool thread then destroys
# the fork's state (its future, the captured thread-local state), which takes the GIL;
# once the interpreter is finalizing that aborts the process ("terminate called without
# an active exception"), so exit waits for it (_let_the_pool_finish).
_last_return = -1.0
_POOL_SETTLE_S = 0.02


@torch.jit.ignore
def _wait_native(key: int, outputs: List[torch.Tensor]) -> List[torch.Tensor]:
    global _last_return
    native = _waited.pop(key)
    try:
        native.wait()
    except Exception as error:  # noqa: BLE001 - re-raised as torch's class
        raise torch_error(error) from None
    finally:
        _last_return = time.monotonic()
    return outputs


@atexit.register
def _let_the_pool_finish() -> None:
    """At exit, before finalization: gives the pool thread of a fork that just returned
    time to destroy its state (measured: 4 exits in 40 aborted without this wait)."""
    remaining = _last_return + _POOL_SETTLE_S - time.monotonic()
    if _last_return >= 0 and remaining > 0:
        time.sleep(remaining)


def _fork(key: int, outputs: List[torch.Tensor]) -> torch.jit.Future[List[torch.Tensor]]:
    return torch.jit.fork(_wait_native, key, outputs)


def typed_future(native: Any, outputs: List[torch.Tensor]) -> Any:
    """A Future[List[Tensor]] completed with ``outputs`` when ``native`` (a ringtree Work)
    finishes, or failed (RuntimeError with its message) when it fails."""
    global _launch
    if _launch is None:
        _launch = torch.jit.script(_fork)
    key = next(_keys)
    _waited[key] = native
    try:
        return _launch(key, outputs)
    except BaseException:
        _waited.pop(key, None)
        raise
