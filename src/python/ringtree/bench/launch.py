"""The orchestrator's side: launch one system's job of ``--nproc`` local ranks, follow the
rows its rank 0 writes, and stop it on failure or timeout.

- ringtree, gloo and nccl: ringtree's launcher (:func:`ringtree.run.command`), ``python -m
  ringtree.run --nproc-per-node N -m ringtree.bench ...``, which gives every rank its
  RANK, LOCAL_RANK (its GPU with ``--device cuda``), WORLD_SIZE, ... and supervises them.
  ``--algo``/``--transport`` become ``RINGTREE_ALGO`` and ``RINGTREE_TRANSPORT``. The
  ranks of gloo and nccl meet at a ``torch.distributed.TCPStore`` this process hosts on
  a port the kernel picks (torch cannot use the launcher's store; nothing is shared with
  it), named by ``RINGTREE_BENCH_STORE``; ``GLOO_SOCKET_IFNAME=lo`` unless set, so gloo
  runs over loopback.
- mpi and ringtree-mpi: ``mpirun --allow-run-as-root --oversubscribe -n N python -m ringtree.bench ...``
  (plus ``--mpirun-args``).

The launched process (ringtree-run or mpirun) gets ``OMP_NUM_THREADS=1`` unless set, runs
in its own session, and writes its ranks' output to a log file whose tail is reported
when the job fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any, Callable

from .. import run
from .options import worker_argv
from .systems import STORE_ENV

__all__ = ["LaunchResult", "availability", "mpirun_command", "run_system"]

_POLL_S = 0.05
# Seconds the launched process gets to exit after SIGTERM before SIGKILL: ringtree-run's
# grace period for its ranks, and 2 s more for itself.
_GRACE_S = run.GRACE_PERIOD_S + 2.0
_LOG_TAIL_LINES = 12


@dataclasses.dataclass
class LaunchResult:
    """What one launch of one system produced. ``status`` is "ok" or "failed" (the rows
    written before a failure are kept); ``notes`` holds the collectives rank 0 skipped and
    the failure description."""

    system: str
    status: str
    seconds: float
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def availability(system: str) -> str | None:
    """Why ``system`` cannot be launched here (None when it can)."""
    if system in ("gloo", "nccl") and importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    if system == "nccl":
        import torch.distributed as dist

        if not dist.is_nccl_available():
            return "this torch has no NCCL backend"
    if system in ("mpi", "ringtree-mpi"):
        if shutil.which("mpirun") is None:
            return "mpirun is not on PATH"
        for module in ("mpi4py", "numpy"):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed"
    return None


def mpirun_command(nproc: int, program: list[str], mpirun_args: list[str] | None = None) -> list[str]:
    """The mpirun command line that runs ``program`` as ``nproc`` local ranks (also as
    root, and with more ranks than cores), ``mpirun_args`` before the program."""
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(nproc), *(mpirun_args or []), *program]


class _ResultReader:
    """Reads the complete JSON lines appended to the result file since the last call."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._offset = 0

    def poll(self) -> list[dict[str, Any]]:
        """The records of the lines completed since the last call."""
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the launched process's session, SIGKILL it after the grace period; reaps."""
    if proc.poll() is None:
        run.signal_process_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=_GRACE_S)
        except subprocess.TimeoutExpired:
            run.signal_process_group(proc.pid, signal.SIGKILL)
            proc.wait()


def _log_tail(path: str) -> list[str]:
    """The last lines of the log, indented, under its name (nothing for an empty log)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        tail = f.read().splitlines()[-_LOG_TAIL_LINES:]
    return [f"  --- {os.path.basename(path)} ---", *(f"  {line}" for line in tail)] if tail else []


def _command(system: str, args: argparse.Namespace, worker: list[str], port: int) -> tuple[list[str], dict[str, str]]:
    """The command and environment that start ``system``'s job; ``port`` is the one of
    the gloo or nccl job's store."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if system in ("mpi", "ringtree-mpi"):
        bench = [sys.executable, "-m", "ringtree.bench", *worker]
        return mpirun_command(args.nproc, bench, shlex.split(args.mpirun_args)), env
    if system == "ringtree":
        if args.algo is not None:
            env["RINGTREE_ALGO"] = args.algo
        if args.transport is not None:
            env["RINGTREE_TRANSPORT"] = args.transport
    else:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env[STORE_ENV] = f"127.0.0.1:{port}"
    return run.command(args.nproc, ["ringtree.bench", *worker], module=True), env


def _follow(
    proc: subprocess.Popen,
    label: str,
    reader: _ResultReader,
    result: LaunchResult,
    on_record: Callable[[dict[str, Any]], None] | None,
    deadline: float,
) -> str | None:
    """Collect records into ``result`` until the launched process has exited; returns None
    on success, else what went wrong (it failed, rank 0 did not finish, timeout)."""
    done = False

    def drain() -> None:
        nonlocal done
        for record in reader.poll():
            if "meta" in record:
                result.meta = record["meta"]
            elif "row" in record:
                result.rows.append(record["row"])
            elif "skip" in record:
                skip = record["skip"]
                result.notes.append(f"{result.system} {skip['collective']}: skipped: {skip['reason']}")
            elif "done" in record:
                done = True
            if on_record is not None:
                on_record(record)

    while True:
        drain()
        code = proc.poll()
        if code is not None:
            drain()
            if code != 0:
                return f"{label}: {run.describe_status(code)}"
            return None if done else "rank 0 exited without finishing"
        if time.monotonic() > deadline:
            return "timed out (--timeout)"
        time.sleep(_POLL_S)


def run_system(
    system: str, args: argparse.Namespace, on_record: Callable[[dict[str, Any]], None] | None = None
) -> LaunchResult:
    """Launch ``system``'s job of ``args.nproc`` ranks and wait for it (at most
    ``args.timeout`` seconds). ``on_record`` sees every record of the result file as it
    arrives (``meta``, ``begin``, ``row``, ``end``, ``skip``, ``done``)."""
    start = time.monotonic()
    result = LaunchResult(system, "failed", 0.0)
    with tempfile.TemporaryDirectory(prefix=f"ringtree-bench-{system}-") as tmp:
        result_path = os.path.join(tmp, "result.jsonl")
        open(result_path, "w").close()
        store = None
        if system in ("gloo", "nccl"):
            import torch.distributed as dist

            store = dist.TCPStore(
                "127.0.0.1", 0, None, True, timedelta(seconds=args.timeout), wait_for_workers=False
            )
        command, env = _command(system, args, worker_argv(args, system, result_path), store.port if store else 0)
        log_path = os.path.join(tmp, f"{system}.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        label = "mpirun" if system in ("mpi", "ringtree-mpi") else "ringtree-run"
        try:
            failure = _follow(proc, label, _ResultReader(result_path), result, on_record, start + args.timeout)
        finally:
            _stop(proc)
        if failure is None:
            result.status = "ok"
        else:
            result.notes.append(f"{system}: failed: {failure}")
            result.notes.extend(_log_tail(log_path))
        del store  # the last reference: stops the gloo or nccl job's store server
    result.seconds = time.monotonic() - start
    return result
