"""``ringtree-bench scale``: what a job costs as its ranks per host grow.

For each rank count (``--ranks 8,16,32``) it launches one job per system on this host:
ringtree over shared memory (its default here), ringtree with ``RINGTREE_TRANSPORT=tcp``
and, where mpirun and mpi4py are installed, Open MPI. Each rank reports:

* init: from the first rank starting (its first import) to the last one past the first
  barrier, in seconds; rendezvous: from the last rank done with its imports (numpy and
  ringtree; for MPI numpy only, since importing mpi4py initialises MPI) to the last one
  past that barrier: what the library itself takes once every process is up;
* shm in use: the growth of the machine's shared memory (``Shmem`` in /proc/meminfo) from
  before the launch to just after that barrier, in MB, and what is left of it once the
  launcher has exited ("left after exit": 0 when nothing leaks);
* mapped per rank: the shared-memory mappings of rank 0 (memfd segments, /dev/shm files),
  in MB; fds per rank: rank 0's open file descriptors; both after that barrier and again
  after the allreduces below ("after calls": with lazy connections, what the calls
  connected);
* the median time of an 8 B and a 1 MiB float32 allreduce (the slowest rank's, over
  ``--iterations`` calls after a warm-up), in us.

``--connect eager,lazy`` runs each ringtree system once per connection mode
(``RINGTREE_CONNECT``); the default, ``auto``, runs ringtree as it configures itself.

Usage: ``ringtree-bench scale [--ranks 8,16,32] [--iterations 20] [--connect auto] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .launch import availability, mpirun_command

def shmem_kb() -> int:
    """The machine's shared memory in use (``Shmem`` in /proc/meminfo), in kB."""
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Shmem:"))


def open_sockets() -> int:
    """This process's open sockets."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # the listing's own descriptor, closed since
    return count


def mapped_shm_bytes() -> int:
    """This process's shared-memory mappings (memfd segments, /dev/shm files), in bytes,
    resident or not."""
    total = 0
    with open("/proc/self/maps") as f:
        for line in f:
            if "/memfd:" in line or "/dev/shm/" in line:
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                total += end - start
    return total


# The body every worker runs once its system is up; the worker defines _t0, _t1, _rank,
# _iterations, _allreduce(array) and _longest(times).
_MEASURE = """
import json as _json, os as _os, statistics as _statistics, time as _time
import numpy as _np
from ringtree.bench.scale import mapped_shm_bytes as _mapped_shm_bytes, shmem_kb as _shmem_kb

_report = {"t0": _t0, "tr": _tr, "t1": _t1, "rank": _rank}
if _rank == 0:
    _report["shm_kb"] = _shmem_kb() - int(_os.environ["BENCH_SHMEM_KB"])
    _report["mapped"] = _mapped_shm_bytes()
    _report["fds"] = len(_os.listdir("/proc/self/fd"))
for _count, _name in ((2, "small"), (1 << 18, "large")):
    _a = _np.ones(_count, _np.float32)
    _allreduce(_a)
    _times = []
    for _ in range(_iterations):
        _start = _time.perf_counter()
        _allreduce(_a)
        _times.append(_time.perf_counter() - _start)
    _report[_name] = _statistics.median(_longest(_times))
if _rank == 0:
    _report["mapped_end"] = _mapped_shm_bytes()
    _report["fds_end"] = len(_os.listdir("/proc/self/fd"))
with open(_os.path.join(_os.environ["BENCH_OUT"], f"r_{_rank}.json"), "w") as _f:
    _json.dump(_report, _f)
"""

RINGTREE_WORKER = """
import time
_t0 = time.time()
import numpy as np
import ringtree
_tr = time.time()
ringtree.init_process_group()
ringtree.barrier()
_t1 = time.time()
_rank = ringtree.get_rank()
_iterations = {iterations}
_allreduce = ringtree.all_reduce
def _longest(times):
    a = np.array(times, np.float64)
    ringtree.all_reduce(a, ringtree.ReduceOp.MAX)
    return a.tolist()
""" + _MEASURE + """
ringtree.barrier()
ringtree.destroy_process_group()
"""

MPI_WORKER = """
import time
_t0 = time.time()
import numpy as np
_tr = time.time()
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
_t1 = time.time()
_rank = MPI.COMM_WORLD.Get_rank()
_iterations = {iterations}
def _allreduce(a):
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)
def _longest(times):
    a = np.array(times, np.float64)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
    return a.tolist()
""" + _MEASURE + """
MPI.COMM_WORLD.Barrier()
"""


def _launch(system: str, ranks: int, script: Path) -> list[str]:
    if system.startswith("Open MPI"):
        return mpirun_command(ranks, [sys.executable, str(script)], ["--bind-to", "none"])
    return [sys.executable, "-m", "ringtree.run", "--nproc-per-node", str(ranks), str(script)]


def _run(system: str, ranks: int, iterations: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="rt-scale-") as tmp:
        out = Path(tmp)
        script = out / "worker.py"
        worker = MPI_WORKER if system.startswith("Open MPI") else RINGTREE_WORKER
        script.write_text(worker.replace("{iterations}", str(iterations)))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
        if system.startswith("ringtree tcp"):
            env["RINGTREE_TRANSPORT"] = "tcp"
        for mode in ("eager", "lazy"):
            if system.endswith(" " + mode):
                env["RINGTREE_CONNECT"] = mode
        before = shmem_kb()
        env.update(BENCH_OUT=str(out), BENCH_SHMEM_KB=str(before))
        proc = subprocess.run(_launch(system, ranks, script), env=env, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{system} at {ranks} ranks failed:\n{proc.stderr[-3000:]}")
        # Segments go when their last mapping does: give the kernel a moment after exit.
        time.sleep(0.2)
        left = shmem_kb() - before
        reports = [json.loads((out / f"r_{r}.json").read_text()) for r in range(ranks)]
    first = reports[0]
    return {
        "init_s": max(r["t1"] for r in reports) - min(r["t0"] for r in reports),
        "rendezvous_s": max(r["t1"] for r in reports) - max(r["tr"] for r in reports),
        "shm_mb": first["shm_kb"] / 1024,
        "left_mb": left / 1024,
        "mapped_mb": first["mapped"] / 2**20,
        "fds": first["fds"],
        "mapped_end_mb": first["mapped_end"] / 2**20,
        "fds_end": first["fds_end"],
        "allreduce_8B_us": first["small"] * 1e6,
        "allreduce_1MiB_us": first["large"] * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ringtree-bench scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,16,32", help="rank counts, comma-separated")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600, help="seconds a job may take")
    parser.add_argument("--connect", default="auto",
                        help="ringtree's connection modes to run, comma-separated (auto, eager, lazy)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    modes = [m for m in args.connect.split(",") if m]
    if any(m not in ("auto", "eager", "lazy") for m in modes):
        parser.error(f"--connect takes auto, eager or lazy, got {args.connect!r}")
    systems = [f"ringtree {transport}" + ("" if mode == "auto" else f" {mode}")
               for transport in ("shm", "tcp") for mode in modes]
    missing = availability("mpi")
    if missing is None:
        systems.append("Open MPI")
    rows = []
    print(f"scale on one host ({os.cpu_count()} CPUs): init, shared memory, descriptors and allreduce per job\n")
    print("| ranks | system | init (s) | rendezvous (s) | shm in use (MB) | left after exit (MB) | mapped per rank (MB) "
          "| fds per rank | mapped after calls (MB) | fds after calls | 8 B allreduce (us) | 1 MiB allreduce (us) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for ranks in (int(r) for r in args.ranks.split(",")):
        for system in systems:
            result = _run(system, ranks, args.iterations, args.timeout)
            rows.append({"ranks": ranks, "system": system, **result})
            print(f"| {ranks} | {system} | {result['init_s']:.2f} | {result['rendezvous_s']:.2f} | "
                  f"{result['shm_mb']:.0f} | {result['left_mb']:.0f} | "
                  f"{result['mapped_mb']:.1f} | {result['fds']} | {result['mapped_end_mb']:.1f} | "
                  f"{result['fds_end']} | {result['allreduce_8B_us']:.1f} | "
                  f"{result['allreduce_1MiB_us']:.0f} |", flush=True)
    if missing is not None:
        print(f"\n(Open MPI left out: {missing})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0
