"""``ringtree-bench failure-table``: what a 2-rank job reports when something goes wrong,
under ringtree and under torch 2.x's gloo backend, measured on this machine.

Faults (rank 1 is the culprit; rank 0 reports):

* ``kill``: rank 1 is killed (SIGKILL) while both ranks run 4 MiB allreduces; time from
  the kill to rank 0's error.
* ``exit``: rank 1 exits (``sys.exit(1)``) after an allreduce; rank 0 enters the next one
  a second later; time from that call to its error.
* ``freeze``: rank 1 is stopped (SIGSTOP) between allreduces, with a 5 s group timeout;
  time from rank 0's next call to its error.
* ``op_mismatch``: rank 0 calls all_reduce, rank 1 broadcast (same tensor shape); time
  from the call to the error, on both ranks.
* ``count_mismatch``: all_reduce of 1024 elements on rank 0, 1025 on rank 1; likewise.

Each run starts two fresh processes (``ringtree-bench failure-table --worker ...``) that join
through a TCPStore this process hosts on a port the kernel picks (ringtree's TCPStore for
ringtree, torch's for gloo): one store and one port per run. Group timeout: 30 s, except
5 s for ``freeze``; every run is stopped after ``--limit`` seconds (default 40) at most.
gloo runs over loopback (``GLOO_SOCKET_IFNAME=lo`` unless set).

Usage: ``ringtree-bench failure-table [--limit 40] [--faults kill,exit,...]
[--transport auto|tcp|shm]`` (needs torch). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import time
from datetime import date, timedelta
from typing import NoReturn

from .rank_processes import Ranks, chosen_faults, emit, key_text, seconds_text

FAULTS = ["kill", "exit", "freeze", "op_mismatch", "count_mismatch"]
LIBRARIES = ["ringtree", "gloo"]
FAULT_TITLES = {
    "kill": "peer SIGKILL mid-allreduce",
    "exit": "peer exits between collectives",
    "freeze": "peer frozen (SIGSTOP), 5 s timeout",
    "op_mismatch": "op mismatch (all_reduce vs broadcast)",
    "count_mismatch": "count mismatch (1024 vs 1025 elements)",
}
GROUP_TIMEOUT_S = 30.0
FREEZE_TIMEOUT_S = 5.0
LARGE = 1 << 20  # float32 elements of the allreduces of "kill": 4 MiB
# The command line of one rank of a run, before its arguments (library, fault, rank, port).
_WORKER = [sys.executable, "-m", "ringtree.bench", "failure-table", "--worker"]


# --- worker side (one rank) -------------------------------------------------------------


def _worker(library: str, fault: str, rank: int, port: int) -> NoReturn:
    """Joins the 2-rank group, runs one fault's script, reports the outcome on stdout and
    exits the process (or is killed)."""
    import torch

    timeout = timedelta(seconds=FREEZE_TIMEOUT_S if fault == "freeze" else GROUP_TIMEOUT_S)
    if library == "ringtree":
        import ringtree as dist

        store = dist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    else:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    data = torch.ones(LARGE)
    dist.all_reduce(data)  # connected and working
    emit("ready")
    victim = rank == 1
    small = torch.ones(1024)
    if fault == "exit" and victim:
        sys.exit(1)
    if fault == "freeze" and victim:
        time.sleep(3600)  # stopped by the driver, then killed
    if fault in ("exit", "freeze"):
        time.sleep(1.0)  # the peer is gone (exit) or stopped (freeze) by now
    started = time.monotonic()
    try:
        if fault == "kill":
            while True:
                dist.all_reduce(data)
        elif fault == "op_mismatch" and victim:
            dist.broadcast(small, src=0)
        elif fault == "count_mismatch" and victim:
            dist.all_reduce(torch.ones(1025))
        else:
            dist.all_reduce(small)
    except Exception as exc:  # noqa: BLE001 - the outcome being measured
        emit("error", type=type(exc).__name__, message=str(exc), started=started)
        os._exit(0)  # report only this first failure, without the library's exit handling
    emit("returned", started=started)
    os._exit(0)


# --- driver side ------------------------------------------------------------------------------


def _start(library: str, fault: str, limit: float, transport: str) -> tuple[object, Ranks]:
    """The store this process hosts for one (library, fault) run (ringtree's TCPStore or
    torch's) and the two rank processes that meet at it."""
    if library == "ringtree":
        import ringtree

        store = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    else:
        import torch.distributed as tdist

        store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = dict(os.environ, OMP_NUM_THREADS="1", RINGTREE_TRANSPORT=transport)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    commands = [[*_WORKER, library, fault, str(rank), str(store.port)] for rank in range(2)]
    return store, Ranks(commands, env, time.monotonic() + limit)


def measure(library: str, fault: str, limit: float, transport: str) -> dict:
    """Runs one fault under one library (ringtree over ``transport``); returns what rank 0
    (and for mismatches rank 1) reported and how long it took."""
    _store, run = _start(library, fault, limit, transport)  # the store lives until the run ends
    try:
        for rank in range(2):
            if run.wait_for(rank, ("ready",)) is None:
                raise RuntimeError(f"{library}: rank {rank} exited before its first allreduce")
        reference = None
        if fault == "kill":
            time.sleep(0.3)  # both ranks are in their allreduce loop
            reference = time.monotonic()
            os.kill(run.procs[1].pid, signal.SIGKILL)
        elif fault == "freeze":
            os.kill(run.procs[1].pid, signal.SIGSTOP)
        reporters = [0, 1] if fault.endswith("mismatch") else [0]
        outcomes = {rank: run.wait_for(rank, ("error", "returned")) for rank in reporters}
        if fault == "freeze":
            os.kill(run.procs[1].pid, signal.SIGKILL)
            os.kill(run.procs[1].pid, signal.SIGCONT)
    finally:
        run.close()
    result = {}
    for rank, outcome in outcomes.items():
        if outcome is None:
            result[rank] = {"text": f"nothing (still waiting when stopped after {limit:.0f} s)", "seconds": None}
            continue
        start = reference if reference is not None else outcome["started"]
        took = outcome["at"] - start
        if outcome["event"] == "returned":
            result[rank] = {"text": "no error: the call returned", "seconds": took}
        else:
            result[rank] = {"text": f"{outcome['type']}: {key_text(outcome['message'])}", "seconds": took}
    return result


def _cell_time(result: dict, fault: str, limit: float) -> str:
    seconds = result[0]["seconds"]
    if seconds is None:
        return f"hangs (no error within {limit:.0f} s)"
    if fault == "freeze":
        return f"{seconds:.2f} s (timeout {FREEZE_TIMEOUT_S:.0f} s)"
    if seconds >= 0.9 * GROUP_TIMEOUT_S:
        return f"hangs until the {GROUP_TIMEOUT_S:.0f} s timeout ({seconds:.1f} s)"
    return seconds_text(seconds)


def _cell_text(result: dict) -> str:
    text = result[0]["text"]
    if 1 in result:
        text = f"rank 0: {text}<br>rank 1: {result[1]['text']}"
    return text


def main(argv: list[str] | None = None) -> int:
    """Measure every fault and print the table; with ``--worker library fault rank port``
    as the arguments, be one rank of a run instead."""
    if argv and argv[0] == "--worker":
        library, fault, rank, port = argv[1:5]
        _worker(library, fault, int(rank), int(port))
    parser = argparse.ArgumentParser(
        prog="ringtree-bench failure-table", description="What a 2-rank job reports when something goes wrong."
    )
    parser.add_argument("--limit", type=float, default=40.0, help="seconds after which a run is stopped (default 40)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    parser.add_argument("--transport", choices=["auto", "tcp", "shm"], default="auto",
                        help="RINGTREE_TRANSPORT of the ringtree runs (default auto: shared memory on one host)")
    args = parser.parse_args(argv)
    faults = chosen_faults(parser, args.faults, FAULTS)
    import ringtree
    import torch

    rows = []
    for fault in faults:
        results = {library: measure(library, fault, args.limit, args.transport) for library in LIBRARIES}
        rows.append((fault, results))
        print(f"measured {fault}", file=sys.stderr, flush=True)
    print(f"2 ranks on one host, {date.today().isoformat()}, {os.cpu_count()} CPUs ({platform.machine()}), "
          f"ringtree {ringtree.__version__} (transport {args.transport}), torch {torch.__version__} gloo; "
          f"group timeout {GROUP_TIMEOUT_S:.0f} s ({FREEZE_TIMEOUT_S:.0f} s for the frozen peer), runs stopped "
          f"after {args.limit:.0f} s.\n")
    print("| fault | what ringtree reports | ringtree time to report | what gloo reports | gloo time to report |")
    print("|---|---|---|---|---|")
    for fault, results in rows:
        ours, theirs = results["ringtree"], results["gloo"]
        cells = [FAULT_TITLES[fault], _cell_text(ours), _cell_time(ours, fault, args.limit), _cell_text(theirs),
                 _cell_time(theirs, fault, args.limit)]
        print("| " + " | ".join(cells) + " |")
    return 0
