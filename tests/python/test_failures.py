"""Failures seen from Python in real processes: a rank killed mid-collective, a rank that
never arrives, over TCP and shared memory. Each must fail the others quickly with an
error naming the culprit, and leave nothing behind in /dev/shm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import ringtree

WORKER = r"""
import json, os, signal, sys, time
from array import array
from datetime import timedelta
import ringtree as dist

rank, mode = int(os.environ["RANK"]), os.environ["FAILURE_MODE"]
dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ["GROUP_TIMEOUT"])))
data = array("f", [1.0] * (1 << 20))
dist.all_reduce(data)  # everyone is connected and working
if rank == int(os.environ["VICTIM"]):
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(os.environ["GROUP_TIMEOUT"]) + 3)  # "freeze": never enter the call
    sys.exit(0)
start = time.monotonic()
try:
    for _ in range(100):
        dist.all_reduce(data)
    result = {"error": None}
except Exception as exc:  # reported to the test
    result = {"error": type(exc).__name__, "message": str(exc), "bases": [c.__name__ for c in type(exc).__mro__]}
result["elapsed"] = time.monotonic() - start
print("RESULT " + json.dumps(result), flush=True)
# Stay connected a while, so that a peer still waiting reaches its own deadline instead
# of seeing this rank leave.
time.sleep(float(os.environ["LINGER"]))
os._exit(0)
"""


def _shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _run(world_size: int, victim: int, mode: str, transport: str, group_timeout: float) -> list[dict]:
    agent = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(agent.port), RINGTREE_USE_AGENT_STORE="1", RINGTREE_TRANSPORT=transport,
                   FAILURE_MODE=mode, VICTIM=str(victim), GROUP_TIMEOUT=str(group_timeout),
                   LINGER="0" if mode == "kill" else "2")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=60)
            if rank == victim:
                continue
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            assert lines, f"rank {rank} printed no result (exit {proc.returncode}); stderr:\n{err}"
            results.append(json.loads(lines[-1][len("RESULT "):]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("world_size,victim", [(2, 1), (3, 2), (4, 0)])
def test_killed_rank_fails_the_others_quickly_naming_it(transport, world_size, victim):
    before = _shm_entries()
    results = _run(world_size, victim, "kill", transport, group_timeout=60)
    assert len(results) == world_size - 1
    for result in results:
        assert result["error"] == "DistNetworkError", result
        assert "ConnectionError" in result["bases"]
        # The error names the dead rank, or (further along a ring) a rank that failed
        # because of it: either way some peer rank and a host are named.
        assert "rank " in result["message"] and "host" in result["message"], result["message"]
        assert result["elapsed"] < 5.0, result
    assert any(f"rank {victim}" in r["message"] for r in results), [r["message"] for r in results]
    assert _shm_entries() <= before, _shm_entries() - before


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_rank_that_never_arrives_times_out_naming_it(transport):
    results = _run(3, 1, "freeze", transport, group_timeout=1.5)
    for result in results:
        assert result["error"] == "DistTimeoutError", result
        assert "TimeoutError" in result["bases"]
        assert result["elapsed"] < 1.5 + 2.0, result
    assert any("rank 1" in r["message"] for r in results), [r["message"] for r in results]
