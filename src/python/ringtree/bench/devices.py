"""What ``--device cuda`` needs of this machine, asked before any rank starts, and the GPU
of each rank.

Every rank uses GPU ``LOCAL_RANK`` (set by the launcher; 0 when unset), made torch's
current device before the rank joins its job. A job of more local ranks than GPUs is
refused unless ``--allow-shared-gpu`` is given; with it, local rank r uses GPU
``r % count`` (round-robin), which ringtree serves by staging through host memory and
torch's NCCL refuses. GPUs are counted with ``torch.cuda.device_count()``, so
``CUDA_VISIBLE_DEVICES`` applies.

Standard library only at import: torch is imported by the functions that ask about CUDA,
and :func:`check` asks only for ``--device cuda``.
"""

from __future__ import annotations

import argparse
import os

__all__ = ["check", "cuda_problem", "device_name", "gpu_count", "local_rank", "select_gpu", "shared_gpu_problem"]

_SHARE_HINT = "--allow-shared-gpu lets ranks share them round-robin"


def cuda_problem() -> str | None:
    """What this process lacks for CUDA buffers, named (None when torch sees a GPU):
    torch itself, a torch built for GPUs, or a device torch can see."""
    try:
        import torch
    except ImportError:
        return "--device cuda needs torch, which is not installed"
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"--device cuda needs a torch built with CUDA; this one ({torch.__version__}) has no CUDA support"
    if torch.cuda.device_count() == 0 or not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hidden = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        return (
            f"--device cuda: torch {torch.__version__} sees no CUDA device "
            f"(no GPU, or no driver{hidden}; torch.cuda.is_available() is False)"
        )
    return None


def gpu_count() -> int:
    """The GPUs torch sees (``torch.cuda.device_count()``)."""
    import torch

    return int(torch.cuda.device_count())


def local_rank() -> int:
    """This rank's index on its host: ``LOCAL_RANK``, 0 when the launcher set none."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def shared_gpu_problem(ranks: int, gpus: int, allow_shared: bool, who: str) -> str | None:
    """Why ``ranks`` ranks (or, for a rank of a launched job, local rank ``ranks - 1``)
    cannot have a GPU each among ``gpus`` (None when they can, or may share). ``who``
    names them in the message."""
    if allow_shared or ranks <= gpus:
        return None
    return f"{who} needs {ranks} GPUs, one per rank, and torch sees {gpus}; {_SHARE_HINT}"


def check(args: argparse.Namespace) -> str | None:
    """Why this command line cannot run on this machine (None when it can; always None for
    ``--device cpu``): CUDA is missing (:func:`cuda_problem`), or the ranks outnumber the
    GPUs without ``--allow-shared-gpu``: the ``--nproc`` ranks of the orchestrator, or,
    for a rank of a launched job, its own local rank."""
    if args.device != "cuda":
        return None
    problem = cuda_problem()
    if problem is not None:
        return problem
    if args.nproc is not None:
        return shared_gpu_problem(args.nproc, gpu_count(), args.allow_shared_gpu, f"--nproc {args.nproc}")
    mine = local_rank()
    return shared_gpu_problem(mine + 1, gpu_count(), args.allow_shared_gpu, f"local rank {mine}")


def select_gpu(allow_shared: bool) -> int:
    """Make this rank's GPU torch's current device and return its index: ``LOCAL_RANK``,
    or ``LOCAL_RANK % count`` when ``allow_shared``. Raises SystemExit saying why when
    there is no GPU, or none of this rank's own without ``allow_shared``."""
    problem = cuda_problem()
    if problem is not None:
        raise SystemExit(problem)
    import torch

    mine, count = local_rank(), gpu_count()
    problem = shared_gpu_problem(mine + 1, count, allow_shared, f"local rank {mine}")
    if problem is not None:
        raise SystemExit(problem)
    index = mine % count
    torch.cuda.set_device(index)
    return index


def device_name(index: int) -> str:
    """The name of GPU ``index`` (``torch.cuda.get_device_name``)."""
    import torch

    return str(torch.cuda.get_device_name(index))
