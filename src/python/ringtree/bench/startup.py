"""``ringtree-bench startup``: wall time from launch to the first barrier at 2 ranks.

Compares, on this machine:

* ringtree: ``python -m ringtree.run --nproc-per-node 2`` of a worker doing
  ``ringtree.init_process_group()`` and a barrier;
* torch gloo: ``python -m torch.distributed.run --standalone --nproc-per-node 2`` of a
  worker doing ``dist.init_process_group("gloo")`` and ``dist.barrier()``
  (skipped when torch is not installed);
* mpi4py: ``mpirun -n 2 python`` of a worker doing ``MPI.COMM_WORLD.Barrier()``
  (skipped when mpirun or mpi4py is missing).

"First barrier" is from just before the launcher is started to the moment the last rank
is past its barrier (each worker writes ``time.time()`` to a file right after it);
"exit" is from the same start until the launcher has exited. Systems are interleaved,
run after run, so that drifts of the machine hit all of them alike.

Usage: ``ringtree-bench startup [--repeats 7] [--warmup 1] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import run
from .launch import availability, mpirun_command

WORLD_SIZE = 2

# Appended to every worker: write the time right after the barrier to $BENCH_OUT/t_<rank>.
_REPORT = """
import os as _os
with open(_os.path.join(_os.environ["BENCH_OUT"], f"t_{_rank}"), "w") as _f:
    _f.write(repr(_t))
"""

RINGTREE_WORKER = """
import time
import ringtree
ringtree.init_process_group()
ringtree.barrier()
_t = time.time()
_rank = ringtree.get_rank()
""" + _REPORT + """
ringtree.destroy_process_group()
"""

TORCH_WORKER = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
_t = time.time()
_rank = dist.get_rank()
""" + _REPORT + """
dist.destroy_process_group()
"""

MPI_WORKER = """
import time
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
_t = time.time()
_rank = MPI.COMM_WORLD.Get_rank()
""" + _REPORT


class System:
    """One launcher + worker pair; ``command(script)`` is the launch command line."""

    def __init__(self, name: str, worker: str, command) -> None:
        self.name = name
        self.worker = worker
        self.command = command
        self.first_barrier_s: list[float] = []
        self.exit_s: list[float] = []


def _systems() -> tuple[list[System], dict[str, str]]:
    """The systems available here, and a note for each one skipped."""
    candidates = [
        System("ringtree", RINGTREE_WORKER, lambda script: run.command(WORLD_SIZE, [script])),
        System(
            "torch gloo",
            TORCH_WORKER,
            lambda script: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", str(WORLD_SIZE), script],
        ),
        System("mpi4py", MPI_WORKER, lambda script: mpirun_command(WORLD_SIZE, [sys.executable, script])),
    ]  # fmt: skip
    # The launchers that need more than ringtree: as ringtree-bench's gloo and mpi systems.
    reasons = {"ringtree": None, "torch gloo": availability("gloo"), "mpi4py": availability("mpi")}
    systems = [system for system in candidates if reasons[system.name] is None]
    skipped = {name: reason for name, reason in reasons.items() if reason is not None}
    return systems, skipped


def _run_once(system: System, script: str, out: Path, timeout: float) -> tuple[float, float]:
    """Launch ``system`` once; returns (seconds to the last rank's barrier, seconds to exit).

    Raises RuntimeError with the launcher's output when it fails, times out, or a rank
    reports no time.
    """
    for stale in out.glob("t_*"):
        stale.unlink()
    env = dict(os.environ, BENCH_OUT=str(out))
    start = time.time()
    try:
        proc = subprocess.run(
            system.command(script),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.output or b"").decode(errors="replace")
        raise RuntimeError(f"timed out after {timeout} s:\n{output}") from None
    end = time.time()
    output = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"exit code {proc.returncode}:\n{output}")
    times = [float(path.read_text()) for path in out.glob("t_*")]
    if len(times) != WORLD_SIZE:
        raise RuntimeError(f"{len(times)} of {WORLD_SIZE} ranks reported a time:\n{output}")
    return max(times) - start, end - start


def _row(name: str, values: list[float], base: float | None) -> str:
    median = statistics.median(values)
    ratio = f"{median / base:10.2f}x" if base else ""
    return f"{name:<12} {median:8.3f} {min(values):8.3f} {max(values):8.3f} {ratio}"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; returns 1 when ringtree itself failed."""
    parser = argparse.ArgumentParser(
        prog="ringtree-bench startup", description="Wall time from launch to the first barrier at 2 ranks."
    )
    parser.add_argument("--repeats", type=int, default=7, help="measured runs per system")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured runs per system first")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    parser.add_argument("--json", metavar="FILE", help="write the raw numbers to FILE")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")

    systems, skipped = _systems()
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ringtree-startup-") as tmp:
        tmp_path = Path(tmp)
        out = tmp_path / "out"
        out.mkdir()
        scripts = {}
        for system in systems:
            script = tmp_path / f"{system.name.replace(' ', '_')}_worker.py"
            script.write_text(system.worker)
            scripts[system.name] = str(script)
        for iteration in range(args.warmup + args.repeats):
            for system in systems:
                if system.name in failed:
                    continue
                try:
                    first, total = _run_once(system, scripts[system.name], out, args.timeout)
                except RuntimeError as exc:
                    failed[system.name] = str(exc)
                    print(f"{system.name} failed: {exc}", file=sys.stderr)
                    continue
                if iteration >= args.warmup:
                    system.first_barrier_s.append(first)
                    system.exit_s.append(total)

    measured = [s for s in systems if s.name not in failed]
    print(f"start-up at {WORLD_SIZE} ranks, {args.repeats} runs each "
          f"(python {platform.python_version()}, {os.cpu_count()} CPUs)")  # fmt: skip
    header = f"{'system':<12} {'median':>8} {'min':>8} {'max':>8} {'vs ringtree':>11}"
    for title, attr in (
        ("launch -> last rank past the first barrier (s)", "first_barrier_s"),
        ("launch -> launcher exited (s)", "exit_s"),
    ):
        # systems[0] is ringtree: the ratios are of medians, against its median.
        base = None if "ringtree" in failed else statistics.median(getattr(systems[0], attr))
        print(f"\n{title}\n{header}")
        for system in measured:
            print(_row(system.name, getattr(system, attr), base))
    for name, note in {**skipped, **{n: "failed (see above)" for n in failed}}.items():
        print(f"{name}: skipped, {note}")

    if args.json:
        record = {
            "world_size": WORLD_SIZE,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "systems": {
                s.name: {"first_barrier_s": s.first_barrier_s, "exit_s": s.exit_s}
                for s in measured
            },
            "skipped": skipped,
            "failed": failed,
        }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 1 if "ringtree" in failed else 0
