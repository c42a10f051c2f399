"""Where ``env://`` finds rank, world size, local rank and the job's store when the program
was started by an HPC launcher instead of torchrun or ringtree-run.

Precedence (the first that is set wins; a value given in the ``env://`` URL's query, or as
an argument of ``init_process_group``, wins over all of them):

- rank: ``RANK``; else, by launcher, Open MPI's ``OMPI_COMM_WORLD_RANK``, MPICH's and
  Intel MPI's Hydra ``PMI_RANK``, Slurm's ``SLURM_PROCID``. The launcher that gave the
  rank is the job's launcher for the rest.
- world size: from the same source as the rank: ``WORLD_SIZE`` with ``RANK``; the
  launcher's ``OMPI_COMM_WORLD_SIZE``, ``PMI_SIZE`` or ``SLURM_NTASKS`` with the launcher's
  rank (a ``WORLD_SIZE`` that disagrees with it is an error: a stale export would otherwise
  make the job wait for ranks that never come).
- local rank (``get_node_local_rank``): ``LOCAL_RANK``; else ``OMPI_COMM_WORLD_LOCAL_RANK``,
  ``MPI_LOCALRANKID``, ``SLURM_LOCALID`` (of whichever is set, in that order).
- store address: ``MASTER_ADDR``; else, under Slurm, the first host of
  ``SLURM_JOB_NODELIST`` (``SLURM_NODELIST`` for older Slurm), where rank 0 runs; under
  mpirun, 127.0.0.1 when every rank runs on this host (``OMPI_COMM_WORLD_LOCAL_SIZE``
  or Hydra's ``MPI_LOCALNRANKS`` equals the world size); otherwise it must be set.
- store port: ``MASTER_PORT``; else 29500 (torchrun's default) under one of these
  launchers.

When ``RANK`` is set (torchrun, ringtree-run, or by hand) no launcher's variable is read
for the rank, the world size or the store (the local rank still falls back to them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Launch", "find_launch", "first_host", "local_rank"]

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class _Launcher:
    name: str
    rank: str
    world_size: str
    local_rank: str
    local_size: str | None  # ranks on this host, where the launcher says it


_LAUNCHERS = (
    _Launcher("Open MPI's mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE"),
    _Launcher("Hydra's mpiexec (MPICH, Intel MPI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    _Launcher("Slurm's srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),
)


@dataclass(frozen=True)
class Launch:
    """What ``env://`` takes from the environment. Each field is the variable's text and
    the variable's name (for errors), or None when nothing set it."""

    rank: tuple[str, str] | None
    world_size: tuple[str, str] | None
    master_addr: tuple[str, str] | None
    master_port: tuple[str, str] | None


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    return value if value else None


def _launcher(environ: Mapping[str, str]) -> _Launcher | None:
    return next((launcher for launcher in _LAUNCHERS if _get(environ, launcher.rank) is not None), None)


def find_launch(environ: Mapping[str, str] = os.environ) -> Launch:
    """Reads the environment by the precedence of the module doc."""
    launcher = None if _get(environ, "RANK") is not None else _launcher(environ)

    def first(*names: str | None) -> tuple[str, str] | None:
        for name in names:
            if name is not None and _get(environ, name) is not None:
                return environ[name], name
        return None

    rank = first("RANK", launcher.rank if launcher else None)
    world_size = first(launcher.world_size if launcher else "WORLD_SIZE")
    if launcher is not None and world_size is not None:
        given = _get(environ, "WORLD_SIZE")
        if given is not None and given != world_size[0]:
            raise ValueError(f"WORLD_SIZE={given} disagrees with {launcher.world_size}={world_size[0]} of "
                             f"{launcher.name}, which gave the rank: unset WORLD_SIZE, or set RANK too")
    master_addr = first("MASTER_ADDR")
    master_port = first("MASTER_PORT")
    if launcher is not None:
        if master_addr is None:
            master_addr = _default_master(environ, launcher, world_size)
        if master_port is None:
            master_port = (str(DEFAULT_PORT), f"the default port under {launcher.name}")
    return Launch(rank, world_size, master_addr, master_port)


def _default_master(environ: Mapping[str, str], launcher: _Launcher,
                    world_size: tuple[str, str] | None) -> tuple[str, str] | None:
    nodes = _get(environ, "SLURM_JOB_NODELIST") or _get(environ, "SLURM_NODELIST")
    if launcher.rank == "SLURM_PROCID" and nodes is not None:
        return first_host(nodes), "the first host of SLURM_JOB_NODELIST"
    local_size = _get(environ, launcher.local_size) if launcher.local_size else None
    if local_size is not None and world_size is not None and local_size == world_size[0]:
        return "127.0.0.1", f"this host: every rank runs here ({launcher.local_size}={local_size})"
    return None


def local_rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """The node-local rank by the precedence of the module doc, or None."""
    for name in ("LOCAL_RANK", *(launcher.local_rank for launcher in _LAUNCHERS)):
        value = _get(environ, name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {value!r}") from None
    return None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: "node[03-05,9],gpu1" -> "node03",
    "rack[1-2]-n[01-04]" -> "rack1-n01", "login2" -> "login2"."""
    entry = re.split(r",(?![^\[]*\])", nodelist.strip(), maxsplit=1)[0]
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1), maxsplit=1)[0], entry)
