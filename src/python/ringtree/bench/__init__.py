"""``ringtree-bench``: nccl-tests-style benchmarks of ringtree's collectives, side by side
with torch's gloo backend and MPI (mpi4py) on host buffers and torch's NCCL backend on
CUDA buffers (``--device cuda``), and the other measurements of ringtree's
performance notes as subcommands: ``startup``, ``call-overhead``, ``p2p-pingpong`` and
``failure-table``. All of ringtree's Python benchmark code lives here.

Run ``ringtree-bench --help`` or ``python -m ringtree.bench --help``; docs/benchmarks.md
explains the method and every column. ``ringtree`` itself never imports this package,
and importing it loads the standard library only (torch, NumPy and mpi4py are imported
by the processes that need them).
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
