"""ringtree's errors as torch's classes: what the backend raises inside torch.

Each class subclasses torch.distributed's matching class and ringtree's, so that
``except torch.distributed.DistNetworkError`` (torchelastic, user code) and ``except
ringtree.DistNetworkError`` (or ``ConnectionError``, ``TimeoutError``) both catch it. torch
2.13 has no timeout class: a timeout is a ``torch.distributed.DistBackendError`` that is
also a ``TimeoutError``; a mismatched call a ``DistBackendError`` that is also a
``ValueError``. The message is ringtree's (culprit rank, host, pid, call).
"""

from __future__ import annotations

import torch.distributed as dist

from .. import errors as ringtree_errors

__all__ = ["torch_error"]


class DistBackendError(dist.DistBackendError, ringtree_errors.DistBackendError):
    """A backend failure, as torch.distributed.DistBackendError."""


class DistNetworkError(dist.DistNetworkError, ringtree_errors.DistNetworkError):
    """A peer or the store lost, as torch.distributed.DistNetworkError."""


class DistStoreError(dist.DistStoreError, ringtree_errors.DistStoreError):
    """A store failure (a key that never came), as torch.distributed.DistStoreError."""


class DistTimeoutError(dist.DistBackendError, ringtree_errors.DistTimeoutError):
    """An operation past its timeout: torch.distributed.DistBackendError and TimeoutError."""


class CollectiveMismatchError(dist.DistBackendError, ringtree_errors.CollectiveMismatchError):
    """Ranks that made different calls: torch.distributed.DistBackendError and ValueError."""


# Most specific first: ringtree's DistTimeoutError and CollectiveMismatchError are not
# subclasses of one another, nor of the other three.
_BY_RINGTREE_CLASS = {
    ringtree_errors.DistTimeoutError: DistTimeoutError,
    ringtree_errors.CollectiveMismatchError: CollectiveMismatchError,
    ringtree_errors.DistNetworkError: DistNetworkError,
    ringtree_errors.DistStoreError: DistStoreError,
    ringtree_errors.DistBackendError: DistBackendError,
}


def torch_error(error: BaseException) -> BaseException:
    """The exception to raise inside torch for ``error``: ringtree's classes become the
    classes above (same message); anything else (ValueError, TypeError, ...) is kept."""
    for ringtree_class, torch_class in _BY_RINGTREE_CLASS.items():
        if isinstance(error, ringtree_class):
            return error if isinstance(error, torch_class) else torch_class(str(error))
    return error
