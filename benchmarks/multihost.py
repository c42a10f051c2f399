"""Collectives across simulated hosts on one machine (tests/python/testbed.py: network
namespaces joined by veth links, shaped to ``--rate``): ringtree's flat algorithm,
ringtree's automatic choice (hierarchical across hosts), torch's gloo and Open MPI
(mpi4py), in one run, on the same test bed. The ringtree and gloo jobs are launched per host
by ringtree-run; the MPI job by mpirun on the first host, which starts its daemons on the
others through the test bed's ssh stand-in (Testbed.launch_agent). Needs root and torch;
the Open MPI column also mpirun and mpi4py (left out, with a note, without them).

    python benchmarks/multihost.py --hosts 2 --nproc 2 --rate 1gbit --mtu 9000
    python benchmarks/multihost.py --collectives all_reduce,broadcast,reduce,all_gather,reduce_scatter,barrier

Prints a table per collective: size, time in us (median of --iterations after one
warm-up; an iteration's time is the longest any rank took) and bus bandwidth (nccl-tests'
factor: 2 (n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter, 1 for
broadcast and reduce) per system, and the link bound: what the busiest host must move over
its link one way at the least, over the link's rate (all_reduce 2 (H-1)/H x size,
all_gather and reduce_scatter (H-1)/H x size, broadcast and reduce the size).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "python"))

import testbed  # noqa: E402

SYSTEMS = [("ringtree flat", "ringtree", "flat"), ("ringtree auto", "ringtree", None), ("gloo", "gloo", None),
           ("Open MPI", "mpi", None)]
# ringtree's flat algorithm for large messages per collective (barrier has no choice).
FLAT = {"all_reduce": "ring", "broadcast": "chain", "reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring",
        "barrier": None}
# (bus bandwidth factor, link bound factor) of each collective for n ranks on H hosts.
FACTORS = {
    "all_reduce": lambda n, h: (2 * (n - 1) / n, 2 * (h - 1) / h),
    "broadcast": lambda n, h: (1.0, 1.0),
    "reduce": lambda n, h: (1.0, 1.0),
    "all_gather": lambda n, h: ((n - 1) / n, (h - 1) / h),
    "reduce_scatter": lambda n, h: ((n - 1) / n, (h - 1) / h),
    "barrier": lambda n, h: (0.0, 0.0),
}
_CLEAN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RINGTREE_", "TORCHELASTIC_")


def _rate_bits(rate: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if match is None:
        raise ValueError(f"rate {rate!r}: expected e.g. 1gbit, 100mbit")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def _job(bed: testbed.Testbed, nproc: int, system: str, collective: str, algorithm: str | None, sizes: list[int],
         iterations: int, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLEAN)}
    worker = [str(HERE / "multihost_worker.py"), "--system", system, "--collective", collective, "--iterations",
              str(iterations), "--out", str(out)]
    if algorithm:
        worker += ["--algorithm", algorithm]
    worker += [str(s) for s in sizes]
    if system == "mpi":
        procs = [bed.start(0, _mpirun(bed, nproc) + [sys.executable, *worker], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)]
    else:
        procs = [bed.start(host, [sys.executable, "-m", "ringtree.run", "--nnodes", str(bed.hosts), "--node-rank",
                                  str(host), "--master-addr", bed.hostname(0), "--master-port", "29500",
                                  "--nproc-per-node", str(nproc), *worker],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for host in range(bed.hosts)]
    errors = [proc.communicate(timeout=1800)[1] for proc in procs]
    if not out.exists():
        if system == "gloo" and "not supported" in errors[0]:
            return {}  # a collective torch's gloo lacks
        raise RuntimeError(f"{system} {collective} job failed: {errors[0][-2000:]}")
    return {int(k): v for k, v in json.loads(out.read_text()).items()}


def _mpirun(bed: testbed.Testbed, nproc: int) -> list[str]:
    """mpirun over every host of the bed, nproc ranks on each, host-major as ringtree-run
    places them; its TCP traffic (daemons and data) on the bed's links."""
    hostfile = Path(bed.launch_agent()).with_name("mpi_hostfile")
    hostfile.write_text("".join(f"{bed.hostname(h)} slots={nproc}\n" for h in range(bed.hosts)))
    return ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--hostfile", str(hostfile), "-n",
            str(bed.hosts * nproc), "--map-by", "slot", "--mca", "plm_rsh_agent", bed.launch_agent(),
            "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
            # More ranks than cores on the machine under the bed: waiting ranks must yield.
            "--mca", "mpi_yield_when_idle", "1"]


def _mpi_missing() -> str | None:
    if shutil.which("mpirun") is None:
        return "no mpirun"
    if importlib.util.find_spec("mpi4py") is None:
        return "no mpi4py"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2, help="ranks per host")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--sizes", default="8,65536,1048576,16777216,67108864", help="bytes, comma-separated")
    parser.add_argument("--collectives", default="all_reduce", help="comma-separated: " + ", ".join(FLAT))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    collectives = args.collectives.split(",")
    unknown = [c for c in collectives if c not in FLAT]
    if unknown:
        parser.error(f"unknown collective(s) {', '.join(unknown)}; choose from {', '.join(FLAT)}")
    n = args.hosts * args.nproc
    bits = _rate_bits(args.rate)
    with tempfile.TemporaryDirectory() as tmp, testbed.Testbed(args.hosts, args.rate, args.mtu) as bed:
        for collective in collectives:
            results = {}
            for name, system, algorithm in SYSTEMS:
                if system == "mpi" and _mpi_missing():
                    continue
                if algorithm == "flat":
                    algorithm = FLAT[collective]
                    if algorithm is None:
                        continue
                results[name] = _job(bed, args.nproc, system, collective, algorithm,
                                     [8] if collective == "barrier" else sizes, args.iterations,
                                     Path(tmp) / f"{collective}-{system}-{algorithm}.json")
            _print_table(collective, results, sizes if collective != "barrier" else [8], n, args, bits)
    if _mpi_missing():
        print(f"(Open MPI left out: {_mpi_missing()})")
    return 0


def _print_table(collective: str, results: dict, sizes: list[int], n: int, args, bits: float) -> None:
    bus, link = FACTORS[collective](n, args.hosts)
    print(f"{collective}, float32, {args.hosts} hosts x {args.nproc} ranks (simulated: network namespaces on one "
          f"{os.cpu_count()}-CPU machine), links {args.rate} each way, MTU {args.mtu}, {date.today().isoformat()}; "
          f"median of {args.iterations}\n")
    names = list(results)
    print("| size | link bound (us) | " + " | ".join(f"{name} (us) | busbw (GB/s)" for name in names) + " |")
    print("|" + "---|" * (2 + 2 * len(names)))
    for size in sizes:
        cells = []
        for name in names:
            t = results[name].get(size)
            cells += ["n/a", "n/a"] if t is None else [f"{t * 1e6:.1f}", f"{bus * size / t / 1e9:.3f}"]
        print(f"| {size} | {link * size * 8 / bits * 1e6:.1f} | " + " | ".join(cells) + " |")
    print()


if __name__ == "__main__":
    sys.exit(main())
