"""The orchestrator's side: launch one system's job of ``--nproc`` local ranks, follow the
rows its rank 0 writes, and stop it on failure or timeout.

- ringtree: ``python -m ringtree.run --nproc-per-node N -m ringtree.bench ...`` (the
  launcher hosts the job's store); ``--algo``/``--transport`` become ``RINGTREE_ALGO`` and
  ``RINGTREE_TRANSPORT``.
- gloo: N processes ``python -m ringtree.bench ...`` with ``RANK``/``WORLD_SIZE`` and the
  address of a ``torch.distributed.TCPStore`` this process hosts on a port the kernel
  picks (no port race, nothing shared with ringtree's store); ``GLOO_SOCKET_IFNAME=lo``
  unless set, so gloo runs over loopback.
- mpi: ``mpirun --allow-run-as-root --oversubscribe -n N python -m ringtree.bench ...``
  (plus ``--mpirun-args``).

Every launched process gets ``OMP_NUM_THREADS=1`` unless set, runs in its own session,
and writes its output to a log file whose tail is reported when the job fails.
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

from .options import worker_argv
from .systems import STORE_ENV

__all__ = ["LaunchResult", "availability", "run_system"]

_POLL_S = 0.05
# Seconds a process gets to exit after SIGTERM before SIGKILL.
_GRACE_S = 5.0
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
    if system == "gloo" and importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    if system == "mpi":
        if shutil.which("mpirun") is None:
            return "mpirun is not on PATH"
        for module in ("mpi4py", "numpy"):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed"
    return None


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


def _signal_session(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every running process's session, SIGKILL after the grace period, reap all."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        _signal_session(proc, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_session(proc, signal.SIGKILL)
            proc.wait()


def _log_tail(paths: list[str]) -> list[str]:
    """The last lines of every non-empty log, indented, each log under its name."""
    lines = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = f.read().splitlines()[-_LOG_TAIL_LINES:]
        if tail:
            lines.append(f"  --- {os.path.basename(path)} ---")
            lines.extend(f"  {line}" for line in tail)
    return lines


def _commands(
    system: str, args: argparse.Namespace, worker: list[str], port: int
) -> list[tuple[list[str], dict[str, str]]]:
    """The (command, environment) of every process to start for ``system``; ``port`` is
    the one of the gloo job's store."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    nproc = str(args.nproc)
    bench = [sys.executable, "-m", "ringtree.bench", *worker]
    if system == "ringtree":
        if args.algo is not None:
            env["RINGTREE_ALGO"] = args.algo
        if args.transport is not None:
            env["RINGTREE_TRANSPORT"] = args.transport
        launcher = [sys.executable, "-m", "ringtree.run", "--nproc-per-node", nproc, "-m", "ringtree.bench"]
        return [([*launcher, *worker], env)]
    if system == "mpi":
        mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", nproc]
        return [([*mpirun, *shlex.split(args.mpirun_args), *bench], env)]
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env[STORE_ENV] = f"127.0.0.1:{port}"
    ranks = range(args.nproc)
    return [
        (bench, dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=nproc, LOCAL_WORLD_SIZE=nproc))
        for r in ranks
    ]


def _describe_exit(code: int) -> str:
    """A ``Popen.returncode`` in words (negative: killed by that signal)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


def _follow(
    procs: list[subprocess.Popen],
    labels: list[str],
    reader: _ResultReader,
    result: LaunchResult,
    on_record: Callable[[dict[str, Any]], None] | None,
    deadline: float,
) -> str | None:
    """Collect records into ``result`` until every process has exited; returns None on
    success, else what went wrong (a process failed, rank 0 did not finish, timeout)."""
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
        codes = [proc.poll() for proc in procs]
        for label, code in zip(labels, codes):
            if code not in (None, 0):
                drain()
                return f"{label} ended with {_describe_exit(code)}"
        if all(code == 0 for code in codes):
            drain()
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
        if system == "gloo":
            import torch.distributed as dist

            store = dist.TCPStore(
                "127.0.0.1", 0, None, True, timedelta(seconds=args.timeout), wait_for_workers=False
            )
        commands = _commands(system, args, worker_argv(args, system, result_path), store.port if store else 0)
        logs, procs = [], []
        try:
            for index, (command, env) in enumerate(commands):
                log_path = os.path.join(
                    tmp, f"{system}-{index}.log" if len(commands) > 1 else f"{system}.log"
                )
                logs.append(log_path)
                with open(log_path, "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            command,
                            env=env,
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
            labels = {"ringtree": ["ringtree-run"], "mpi": ["mpirun"]}.get(system) or [
                f"rank {i}" for i in range(len(procs))
            ]
            failure = _follow(
                procs, labels, _ResultReader(result_path), result, on_record, start + args.timeout
            )
        finally:
            _stop(procs)
        if failure is None:
            result.status = "ok"
        else:
            result.notes.append(f"{system}: failed: {failure}")
            result.notes.extend(_log_tail(logs))
        del store  # the last reference: stops the gloo job's store server
    result.seconds = time.monotonic() - start
    return result
