"""``ringtree-bench rendezvous-faults``: what a 2-rank job reports when an earlier job, or
the loss of its store's host, gets in the way of its rendezvous, under ringtree and under
torch 2.x's gloo backend, measured on this machine.

Faults (a first job sets the scene, then a second job on the same rendezvous reports):

* ``stale_file``: the first job (``file://`` init) crashes after an all_reduce and leaves
  its file; the second runs on the same path.
* ``reused_store``: the first job meets at a TCPStore this process hosts and crashes; the
  second meets at the same store, its rank 0 starting 1 s after its rank 1.
* ``linger_rank0``: the first job (``env://``, rank 0 hosts the store on MASTER_PORT)
  ends with rank 1 crashed and rank 0 still running; the second is launched on the same
  MASTER_PORT.
* ``linger_all``: the same with both ranks of the first job still running.
* ``host_killed_store``, ``host_killed_collective``: one ``env://`` job; rank 0 (the
  store's host) is SIGKILLed while rank 1 waits in a store get, or runs all_reduces; time
  from the kill to rank 1's error.

The second job's ranks report the outcome of ``init_process_group`` + one all_reduce and
the time from their start to it. Group timeout: 20 s; every job is stopped after
``--limit`` seconds (default 40). gloo runs over loopback (``GLOO_SOCKET_IFNAME=lo``
unless set); ringtree's rank 0 hosts the store itself (``RINGTREE_USE_AGENT_STORE=0``).

Usage: ``ringtree-bench rendezvous-faults [--limit 40] [--faults stale_file,...]`` (needs
torch). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date, timedelta
from typing import NoReturn

from .rank_processes import Ranks, chosen_faults, emit, key_text, seconds_text


@dataclass(frozen=True)
class Fault:
    title: str
    method: str  # how the ranks meet: "file", "store" (hosted here) or "env"
    lingering: tuple[int, ...] = ()  # ranks of the first job that stay after it
    second_job: bool = True  # False: the first job's rank 1 reports (host_killed_*)


FAULTS = {
    "stale_file": Fault("file:// rerun after a crash left the file", "file"),
    "reused_store": Fault("rerun on a crashed job's store, rank 0 1 s late", "store"),
    "linger_rank0": Fault("relaunch on MASTER_PORT, old rank 0 (store host) still running", "env", (0,)),
    "linger_all": Fault("relaunch on MASTER_PORT, every old rank still running", "env", (0, 1)),
    "host_killed_store": Fault("store host (rank 0) SIGKILLed, rank 1 in a store get", "env", second_job=False),
    "host_killed_collective": Fault("store host (rank 0) SIGKILLed, rank 1 in all_reduce", "env",
                                    second_job=False),
}
LIBRARIES = ["ringtree", "gloo"]
GROUP_TIMEOUT_S = 20.0
LATE_S = 1.0  # how late rank 0 of reused_store's second job starts
# The command line of one rank, before its arguments (library, fault, job, rank, where).
_WORKER = [sys.executable, "-m", "ringtree.bench", "rendezvous-faults", "--worker"]


# --- rank side -----------------------------------------------------------------------------


def _init(library: str, method: str, rank: int, where: str) -> None:
    """init_process_group of a 2-rank gloo group the way ``method`` says; ``where`` is the
    file's path (file), the hosted store's port (store) or MASTER_PORT (env)."""
    timeout = timedelta(seconds=GROUP_TIMEOUT_S)
    dist = _dist(library)
    if method == "file":
        dist.init_process_group("gloo", init_method=f"file://{where}", rank=rank, world_size=2, timeout=timeout)
        return
    if method == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=where, RANK=str(rank), WORLD_SIZE="2")
        dist.init_process_group("gloo", timeout=timeout)
        return
    if library == "ringtree":
        store = dist.TCPStore("127.0.0.1", int(where), timeout=timeout)
    else:
        store = dist.TCPStore("127.0.0.1", int(where), is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)


def _dist(library: str):
    if library == "ringtree":
        import ringtree

        return ringtree
    import torch.distributed

    return torch.distributed


def _default_store(library: str):
    if library == "ringtree":
        import ringtree

        return ringtree.group.WORLD.store
    import torch.distributed.distributed_c10d as c10d

    return c10d._get_default_store()


def _worker(library: str, fault_name: str, job: str, rank: int, where: str) -> NoReturn:
    """One rank of one job: meets the other, all_reduces, then plays its part in the
    fault; reports on stdout and exits the process (or is killed)."""
    import torch

    fault = FAULTS[fault_name]
    dist = _dist(library)
    if job == "second" and fault_name == "reused_store" and rank == 0:
        time.sleep(LATE_S)
    started = time.monotonic()
    try:
        _init(library, fault.method, rank, where)
        dist.all_reduce(torch.ones(4))
    except Exception as exc:  # noqa: BLE001 - the outcome being measured
        emit("error", type=type(exc).__name__, message=str(exc), started=started)
        os._exit(0)
    if job == "second":
        emit("returned", started=started)
        os._exit(0)
    dist.barrier()  # both ranks are done with the first job before anything happens
    emit("ready")
    if fault.second_job:
        if rank in fault.lingering:
            time.sleep(3600)  # killed by the driver
        sys.stdout.flush()
        os._exit(1)  # the crash
    if rank == 0:
        time.sleep(3600)  # SIGKILLed by the driver
    started = time.monotonic()
    try:
        if fault_name == "host_killed_store":
            _default_store(library).get("never-set")
        else:
            while True:
                dist.all_reduce(torch.ones(1024))
    except Exception as exc:  # noqa: BLE001
        emit("error", type=type(exc).__name__, message=str(exc), started=started)
    os._exit(0)


# --- driver side ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outcome(record: dict | None, reference: float | None, limit: float) -> dict:
    if record is None:
        return {"text": f"nothing (still waiting when stopped after {limit:.0f} s)", "seconds": None}
    took = record["at"] - (reference if reference is not None else record["started"])
    if record["event"] == "returned":
        return {"text": "works (init and all_reduce returned)", "seconds": took}
    return {"text": f"{record['type']}: {key_text(record['message'])}", "seconds": took}


def measure(library: str, fault_name: str, limit: float) -> list[dict]:
    """Runs one fault under one library; returns the reporting ranks' outcomes (both ranks
    of the second job, or rank 1 of host_killed_*)."""
    fault = FAULTS[fault_name]
    directory = tempfile.mkdtemp(prefix="ringtree-rdv-faults-")
    env = dict(os.environ, OMP_NUM_THREADS="1", RINGTREE_USE_AGENT_STORE="0")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = None
    if fault.method == "file":
        where = os.path.join(directory, "rendezvous")
    elif fault.method == "store":
        if library == "ringtree":
            import ringtree

            store = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        else:
            import torch.distributed as tdist

            store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        where = str(store.port)
    else:
        where = str(_free_port())

    def start(job: str) -> Ranks:
        commands = [[*_WORKER, library, fault_name, job, str(rank), where] for rank in range(2)]
        return Ranks(commands, env, time.monotonic() + limit)

    jobs = [start("first")]
    try:
        first = jobs[0]
        for rank in range(2):
            if first.wait_for(rank, ("ready",)) is None:
                return [{"text": f"the first job's rank {rank} failed before the fault", "seconds": None}]
        if not fault.second_job:
            time.sleep(0.3)  # rank 1 is in its store get or all_reduce loop
            reference = time.monotonic()
            os.kill(first.procs[0].pid, signal.SIGKILL)
            return [_outcome(first.wait_for(1, ("error",)), reference, limit)]
        for rank in range(2):
            if rank not in fault.lingering:
                first.procs[rank].wait()
        jobs.append(start("second"))
        return [_outcome(jobs[1].wait_for(rank, ("error", "returned")), None, limit) for rank in range(2)]
    finally:
        for ranks in jobs:
            ranks.close()
        shutil.rmtree(directory, ignore_errors=True)


def _cells(outcomes: list[dict], limit: float) -> tuple[str, str]:
    """The table's text and time cells of one library's outcomes."""
    def time_text(seconds: float | None) -> str:
        if seconds is None:
            return f"hangs (no error within {limit:.0f} s)"
        if seconds >= 0.9 * GROUP_TIMEOUT_S:
            return f"{seconds:.1f} s (the {GROUP_TIMEOUT_S:.0f} s timeout)"
        return seconds_text(seconds)

    if len(outcomes) == 1:
        return outcomes[0]["text"], time_text(outcomes[0]["seconds"])
    texts = "<br>".join(f"rank {rank}: {o['text']}" for rank, o in enumerate(outcomes))
    times = "<br>".join(f"rank {rank}: {time_text(o['seconds'])}" for rank, o in enumerate(outcomes))
    return texts, times


def main(argv: list[str] | None = None) -> int:
    """Measure every fault and print the table; with ``--worker library fault job rank
    where`` as the arguments, be one rank of a job instead."""
    if argv and argv[0] == "--worker":
        library, fault, job, rank, where = argv[1:6]
        _worker(library, fault, job, int(rank), where)
    parser = argparse.ArgumentParser(
        prog="ringtree-bench rendezvous-faults",
        description="What a 2-rank job reports when an earlier job or a lost store host is in its way.",
    )
    parser.add_argument("--limit", type=float, default=40.0, help="seconds after which a job is stopped (default 40)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    args = parser.parse_args(argv)
    faults = chosen_faults(parser, args.faults, FAULTS)
    import ringtree
    import torch

    rows = []
    for fault in faults:
        rows.append((fault, {library: measure(library, fault, args.limit) for library in LIBRARIES}))
        print(f"measured {fault}", file=sys.stderr, flush=True)
    print(f"2 ranks on one host, {date.today().isoformat()}, {os.cpu_count()} CPUs ({platform.machine()}), "
          f"ringtree {ringtree.__version__}, torch {torch.__version__} gloo; group timeout "
          f"{GROUP_TIMEOUT_S:.0f} s, jobs stopped after {args.limit:.0f} s.\n")
    print("| fault | what ringtree reports | ringtree time | what gloo reports | gloo time |")
    print("|---|---|---|---|---|")
    for fault, results in rows:
        cells = [FAULTS[fault].title, *_cells(results["ringtree"], args.limit), *_cells(results["gloo"], args.limit)]
        print("| " + " | ".join(cells) + " |")
    return 0
