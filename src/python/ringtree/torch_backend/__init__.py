"""ringtree as a ``torch.distributed`` backend: ``init_process_group("ringtree")``.

``import torch`` registers the backend "ringtree" through the ``torch.backends`` entry
point of ringtree's distribution (:func:`_autoload`), so a training program needs no
``import ringtree``: the backend name is the only change. :func:`register` does the same
by hand (for ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); it is idempotent.

The backend is a ``torch.distributed.ProcessGroup`` subclass
(:class:`~ringtree.torch_backend.process_group.RingtreeProcessGroup`) over ringtree's
native process group: every collective and point-to-point call torch can make runs in
ringtree's C++ engine, zero-copy, for every dtype and ReduceOp. Nothing here is compiled
against torch, so one ringtree wheel serves every torch release that keeps the Python
backend interface (tested: 2.13 and 2.14; the autoload entry point needs 2.5 or later).

This package imports torch; ``import ringtree`` never imports it.
"""

from __future__ import annotations

__all__ = ["BACKEND_NAME", "register"]

#: The name torch knows the backend by (``Backend.RINGTREE``).
BACKEND_NAME = "ringtree"


def register() -> None:
    """Registers the backend with torch.distributed (once; later calls do nothing)."""
    import torch.distributed as dist

    from .process_group import create_process_group

    if BACKEND_NAME in dist.Backend.backend_list:
        return
    # One process group serves both devices: CPU tensors go to ringtree's CPU engine, CUDA
    # tensors to its CUDA path (NCCL, or host staging), each call by its tensors' device.
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=["cpu", "cuda"])


def _autoload() -> None:
    """The ``torch.backends`` entry point, run by ``import torch``."""
    import torch.distributed as dist

    if dist.is_available():
        register()
