"""env:// under HPC launchers: rank, world size, local rank and the store's address taken
from Open MPI's mpirun, Hydra's (MPICH, Intel MPI) and Slurm's srun variables when RANK and
WORLD_SIZE are not set (the precedence is launch_env.py's). Checked by hand-set variables,
by processes started with Slurm's variables, and under a real mpirun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from harness import free_port, launcher_free_env

from ringtree.launch_env import find_launch, first_host, local_rank

OMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
HYDRA = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu-[003-004,9]"}


def test_each_launcher_gives_rank_size_and_store():
    launch = find_launch(OMPI)
    assert launch.rank == ("1", "OMPI_COMM_WORLD_RANK") and launch.world_size == ("2", "OMPI_COMM_WORLD_SIZE")
    assert launch.master_addr[0] == "127.0.0.1" and launch.master_port[0] == "29500"
    launch = find_launch(HYDRA)
    assert launch.rank[0] == "2" and launch.world_size[0] == "4"
    assert launch.master_addr is None, "ranks on several hosts: MASTER_ADDR must be given"
    launch = find_launch(SLURM)
    assert (launch.rank[0], launch.world_size[0], launch.master_addr[0]) == ("5", "8", "gpu-003")
    assert local_rank(OMPI) == 1 and local_rank(HYDRA) == 0 and local_rank(SLURM) == 1


def test_precedence():
    # torch's variables win over every launcher's, and then no launcher default is used.
    launch = find_launch({**SLURM, "RANK": "0", "WORLD_SIZE": "2"})
    assert launch.rank == ("0", "RANK") and launch.world_size == ("2", "WORLD_SIZE")
    assert launch.master_addr is None and launch.master_port is None
    # Explicit store variables win over the launcher's defaults.
    launch = find_launch({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "1234", "WORLD_SIZE": "8"})
    assert (launch.master_addr[0], launch.master_port[0], launch.world_size) == ("head", "1234", ("8", "SLURM_NTASKS"))
    # The size comes with the rank: a WORLD_SIZE that disagrees with the launcher's is refused.
    with pytest.raises(ValueError, match="WORLD_SIZE=6 disagrees with SLURM_NTASKS=8"):
        find_launch({**SLURM, "WORLD_SIZE": "6"})
    # Open MPI before Hydra before Slurm (srun starting mpirun-style ranks sets both).
    assert find_launch({**SLURM, **OMPI}).rank[1] == "OMPI_COMM_WORLD_RANK"
    assert find_launch({**SLURM, **HYDRA}).rank[1] == "PMI_RANK"
    assert local_rank({**SLURM, "LOCAL_RANK": "3"}) == 3
    assert find_launch({}).rank is None and local_rank({}) is None
    with pytest.raises(ValueError, match="SLURM_LOCALID must be an integer"):
        local_rank({"SLURM_LOCALID": "x"})


@pytest.mark.parametrize(("nodelist", "first"), [
    ("node07", "node07"), ("node[03-05,9],gpu1", "node03"), ("rack[1-2]-n[01-04]", "rack1-n01"),
    ("a[7],b[1-3]", "a7"), ("gpu-[001-003]-ib,cpu01", "gpu-001-ib"),
])
def test_first_host_of_a_slurm_host_list(nodelist, first):
    assert first_host(nodelist) == first


PROGRAM = textwrap.dedent("""
    import os, sys, numpy as np, ringtree as dist
    dist.init_process_group("gloo")
    a = np.full(3, dist.get_rank() + 1, dtype=np.float32)
    dist.all_reduce(a)
    sys.stdout.write(f"rank {dist.get_rank()} of {dist.get_world_size()} local {dist.get_node_local_rank()} "
                     f"sum {a.tolist()}\\n")
    dist.destroy_process_group()
""")

def _expected_lines(world_size: int, local=lambda rank: rank) -> list[str]:
    total = float(world_size * (world_size + 1) // 2)
    return [f"rank {r} of {world_size} local {local(r)} sum {[total] * 3}" for r in range(world_size)]


def test_ranks_started_with_slurms_variables(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    port = str(free_port())
    procs = [
        subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=launcher_free_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                                        SLURM_JOB_NODELIST="localhost", MASTER_PORT=port))
        for rank in range(2)
    ]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    assert sorted(out.strip() for out, _ in outputs) == _expected_lines(2)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun (Open MPI)")
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_started_by_mpirun(tmp_path, world_size):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    command = ["mpirun", "-n", str(world_size), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    proc = subprocess.run([*command, sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=launcher_free_env(MASTER_PORT=str(free_port())))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.strip().splitlines()) == _expected_lines(world_size)


def test_missing_variables_are_named():
    proc = subprocess.run([sys.executable, "-c", "import ringtree as d; d.init_process_group('gloo')"],
                          capture_output=True, text=True, timeout=60, env=launcher_free_env())
    assert proc.returncode != 0
    assert "environment variable RANK expected, but not set (nor a launcher's OMPI_COMM_WORLD_RANK" in proc.stderr
    proc = subprocess.run([sys.executable, "-c", "import ringtree as d; d.init_process_group('gloo')"],
                          capture_output=True, text=True, timeout=60,
                          env=launcher_free_env(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="4",
                                         OMPI_COMM_WORLD_LOCAL_SIZE="2"))
    assert "MASTER_ADDR expected, but not set (under mpirun with ranks on several hosts" in proc.stderr
