"""The MPI backend (ringtree.mpi): the same collective module under a real ``mpirun -n 2``
and ``-n 3`` on both sides of a mixed job (world on MPI with gloo groups, and the
reverse), its failure behaviour under mpirun, and availability without MPI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import free_port, launcher_free_env

HERE = Path(__file__).resolve().parent
HAVE_MPI = shutil.which("mpirun") is not None and __import__("importlib").util.find_spec("mpi4py") is not None
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs mpirun (Open MPI) and mpi4py")


def mpirun(world_size: int, *args: str, timeout: float = 180, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    command = ["mpirun", "-n", str(world_size), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    started = time.monotonic()
    proc = subprocess.run([*command, sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env=launcher_free_env(**env))
    return proc, time.monotonic() - started


def leftover_processes(script: str) -> list[str]:
    listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in listing.splitlines() if script in line and "ps -eo" not in line]


@needs_mpi
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("mode", ["mpi-world", "gloo-world"])
def test_every_call_matches_ringtrees_engine(mode, world_size):
    proc, _ = mpirun(world_size, str(HERE / "mpi_program.py"), mode, MASTER_PORT=str(free_port()))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    counts = [int(n) for n in re.findall(r"mpi-program: (\d+) cases passed", proc.stdout)]
    assert len(counts) == world_size, proc.stdout
    # Every rank ran the world's cases (well over a thousand: 12 dtypes x 9 ops x 2 sizes
    # x sync/async of all_reduce alone), and the subgroup's members about twice that.
    assert all(count > 600 for count in counts), counts


@needs_mpi
def test_async_work_progress_and_mixed_async():
    proc, _ = mpirun(2, str(HERE / "mpi_behaviour_program.py"), "progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("progress: ok") == 2


@needs_mpi
def test_isend_irecv_works():
    proc, _ = mpirun(2, str(HERE / "mpi_behaviour_program.py"), "p2p")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("p2p: ok") == 2


@needs_mpi
def test_barrier_timeout_raises_and_the_group_goes_on():
    proc, elapsed = mpirun(2, str(HERE / "mpi_behaviour_program.py"), "barrier-timeout")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("barrier-timeout: ok") == 2
    assert elapsed < 60


@needs_mpi
def test_a_killed_rank_ends_the_job_within_seconds():
    script = str(HERE / "mpi_behaviour_program.py")
    proc, elapsed = mpirun(2, script, "kill", timeout=60)
    assert proc.returncode != 0
    assert elapsed < 30, elapsed
    output = proc.stdout + proc.stderr
    assert "rank 1" in output and "signal 9" in output, output
    assert leftover_processes(script) == []


@needs_mpi
@pytest.mark.parametrize(("mode", "call"), [("hang", "all_reduce (float32, 4 elements)"),
                                            ("hang-irecv", "irecv (float32, 2 elements)")])
def test_a_peer_that_never_comes_ends_the_job_at_the_group_timeout(mode, call):
    script = str(HERE / "mpi_behaviour_program.py")
    proc, elapsed = mpirun(2, script, mode, timeout=90)
    assert proc.returncode != 0
    assert elapsed < 30, elapsed  # group timeout 3 s; rank 1 would sleep 120 s
    assert f"rank 0: {call} on group '0' (MPI) did not complete within its group's timeout" in proc.stderr, \
        proc.stderr
    assert leftover_processes(script) == []


@needs_mpi
def test_singleton_and_disagreeing_arguments():
    program = """
import ringtree as dist, torch
try:
    dist.init_process_group("mpi", world_size=3)
except ValueError as exc:
    print("refused:", exc)
dist.init_process_group("mpi", rank=0)
t = torch.ones(3)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
print(dist.get_rank(), dist.get_world_size(), dist.get_backend(), t.tolist(), dist.is_mpi_available())
"""
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                          env=launcher_free_env())
    assert proc.returncode == 0, proc.stderr
    assert "refused: init_process_group('mpi'): world_size=3 disagrees with MPI's world size 1" in proc.stdout
    assert "0 1 mpi [1.0, 1.0, 1.0] True" in proc.stdout


def test_without_an_mpi_library_the_backend_says_what_to_install():
    program = """
import ringtree as dist
print(dist.is_mpi_available(), dist.is_backend_available("mpi"))
try:
    dist.init_process_group("mpi", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
except dist.DistBackendError as exc:
    print("error:", exc)
"""
    env = launcher_free_env(MPI4PY_LIBMPI="/nonexistent/libmpi.so")
    env.pop("MPI4PY_MPIABI", None)
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("False False"), proc.stdout
    assert "backend 'mpi' for device 'cpu' is not available" in proc.stdout
    assert "pip install 'ringtree[mpi]'" in proc.stdout
