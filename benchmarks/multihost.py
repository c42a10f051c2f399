"""allreduce across simulated hosts on one machine (tests/python/testbed.py: network
namespaces joined by veth links, shaped to ``--rate``): ringtree's flat ring, ringtree's
automatic choice (hierarchical across hosts) and torch's gloo, in one run, on the same
test bed, each job launched per host with ringtree-run. Needs root and torch.

    python benchmarks/multihost.py --hosts 2 --nproc 2 --rate 1gbit --mtu 9000

Prints a table: size, time (median of --iterations after one warm-up) and bus bandwidth
(2 (n-1)/n x size / time) per system, and the link bound: what each host must send each
way at the least, 2 (H-1)/H x size, over the link's rate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "python"))

import testbed  # noqa: E402

SYSTEMS = [("ringtree ring", "ringtree", "ring"), ("ringtree auto", "ringtree", None), ("gloo", "gloo", None)]
_CLEAN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RINGTREE_", "TORCHELASTIC_")


def _rate_bits(rate: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if match is None:
        raise ValueError(f"rate {rate!r}: expected e.g. 1gbit, 100mbit")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def _job(bed: testbed.Testbed, nproc: int, system: str, algorithm: str | None, sizes: list[int], iterations: int,
         out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLEAN)}
    worker = [str(HERE / "multihost_worker.py"), "--system", system, "--iterations", str(iterations), "--out", str(out)]
    if algorithm:
        worker += ["--algorithm", algorithm]
    worker += [str(s) for s in sizes]
    procs = [bed.start(host, [sys.executable, "-m", "ringtree.run", "--nnodes", str(bed.hosts), "--node-rank",
                              str(host), "--master-addr", bed.hostname(0), "--master-port", "29500",
                              "--nproc-per-node", str(nproc), *worker],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for host in range(bed.hosts)]
    errors = [proc.communicate(timeout=1800)[1] for proc in procs]
    if not out.exists():
        raise RuntimeError(f"{system} job failed: {errors[0][-2000:]}")
    return {int(k): v for k, v in json.loads(out.read_text()).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2, help="ranks per host")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--sizes", default="8,65536,1048576,16777216,67108864", help="bytes, comma-separated")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    n = args.hosts * args.nproc
    results = {}
    with tempfile.TemporaryDirectory() as tmp, testbed.Testbed(args.hosts, args.rate, args.mtu) as bed:
        for name, system, algorithm in SYSTEMS:
            results[name] = _job(bed, args.nproc, system, algorithm, sizes, args.iterations,
                                 Path(tmp) / f"{system}-{algorithm}.json")
    bits = _rate_bits(args.rate)
    print(f"allreduce, float32, {args.hosts} hosts x {args.nproc} ranks (simulated: network namespaces on one "
          f"{os.cpu_count()}-CPU machine), links {args.rate} each way, MTU {args.mtu}, {date.today().isoformat()}; "
          f"median of {args.iterations}\n")
    header = "| size | link bound | " + " | ".join(f"{name} (s) | busbw (GB/s)" for name, _, _ in SYSTEMS) + " |"
    print(header)
    print("|" + "---|" * (2 + 2 * len(SYSTEMS)))
    for size in sizes:
        bound = 2 * (args.hosts - 1) / args.hosts * size * 8 / bits
        cells = []
        for name, _, _ in SYSTEMS:
            t = results[name][size]
            cells += [f"{t:.4f}", f"{2 * (n - 1) / n * size / t / 1e9:.3f}"]
        print(f"| {size} | {bound:.4f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
