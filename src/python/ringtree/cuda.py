"""What this process has for CUDA buffers: ringtree's CUDA library (built when a CUDA
toolkit was found), a driver with a device, and NCCL.

Nothing here is loaded at ``import ringtree``: the first question (or the first CUDA
tensor a group meets) opens ringtree's CUDA library and NCCL with dlopen, once per
process. NCCL is searched for as docs/gpu.md says: a libnccl this process already loaded
(torch's), the ``nvidia-nccl-cu13``/``-cu12`` wheels, ``RINGTREE_NCCL_PATH``, then the
system's. Asking initialises the CUDA driver (as ``torch.cuda.device_count()`` does), so
ask after forking worker processes, not before.
"""

from __future__ import annotations

from typing import Any

from . import _C

__all__ = ["is_available", "device_count", "unavailable_reason", "is_nccl_available", "nccl_version", "nccl_path"]

_cuda: dict[str, Any] | None = None
_nccl: dict[str, Any] | None = None


def _cuda_status() -> dict[str, Any]:
    global _cuda
    if _cuda is None:
        _cuda = _C._cuda_status()
    return _cuda


def _nccl_status() -> dict[str, Any]:
    global _nccl
    if _nccl is None:
        _nccl = _C._nccl_status()
    return _nccl


def is_available() -> bool:
    """True when ringtree's CUDA library loads and the driver sees at least one device."""
    return bool(_cuda_status()["available"])


def device_count() -> int:
    """The CUDA devices the driver sees (0 when ringtree's CUDA library or the driver is missing)."""
    return int(_cuda_status()["device_count"])


def unavailable_reason() -> str:
    """Why CUDA buffers cannot be used here ('' when they can): what is missing and where
    ringtree looked, then the same for NCCL."""
    reasons = [status["reason"] for status in (_cuda_status(), _nccl_status()) if not status["available"]]
    return "; ".join(reasons)


def is_nccl_available() -> bool:
    """True exactly when a usable NCCL (2.10 or later) and a CUDA device are there."""
    return is_available() and bool(_nccl_status()["available"])


def nccl_version() -> tuple[int, int, int]:
    """The loaded NCCL's version, ``(2, 28, 7)``, as ``torch.cuda.nccl.version()`` reports
    it. Raises RuntimeError saying why when no usable NCCL is found."""
    status = _nccl_status()
    if not status["available"]:
        raise RuntimeError(status["reason"])
    code = int(status["version"])
    if code >= 10000:
        return code // 10000, code // 100 % 100, code % 100
    return code // 1000, code // 100 % 10, code % 100


def nccl_path() -> str:
    """The file of the loaded NCCL ('' when none is usable)."""
    return str(_nccl_status()["path"])
