"""``ringtree-bench groups``: what making process groups costs a job.

One job of ``--nproc`` ranks (default 4) on this host per system: ringtree's own API
(``ringtree.new_group``), and, where torch is installed, torch.distributed over the
"ringtree" backend and over torch's gloo. Every rank creates ``--groups`` groups (default
20) of all ranks, one after another, each followed by one 8-element all_reduce in it, and
reports:

* new_group: the median and the total of the creations, in ms (the slowest rank's);
* first all_reduce: the median of each group's first call, in us (set-up a group leaves
  to its first call shows here);
* sockets and fds per rank: rank 0's sockets and open descriptors before the first group
  and after the last;
* mapped per rank: rank 0's shared-memory mappings (memfd segments, /dev/shm files) before
  and after, in MB.

Usage: ``ringtree-bench groups [--nproc 4] [--groups 20] [--system ringtree,torch-ringtree,gloo]
[--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .systems import have_torch

__all__ = ["main"]

SYSTEMS = ("ringtree", "torch-ringtree", "gloo")


_WORKER = """
import json, os, time
from ringtree.bench.scale import mapped_shm_bytes, open_sockets as sockets
SYSTEM = {system!r}
GROUPS = {groups}
if SYSTEM == "ringtree":
    import numpy as np
    import ringtree as dist
    dist.init_process_group()
    def vector():
        return np.ones(8, np.float32)
else:
    import torch
    import torch.distributed as dist
    dist.init_process_group("ringtree" if SYSTEM == "torch-ringtree" else "gloo")
    def vector():
        return torch.ones(8)
rank, size = dist.get_rank(), dist.get_world_size()
dist.barrier()
before = {{"sockets": sockets(), "fds": len(os.listdir("/proc/self/fd")), "mapped": mapped_shm_bytes()}}
creations, firsts, groups = [], [], []
for _ in range(GROUPS):
    start = time.perf_counter()
    group = dist.new_group(list(range(size)))
    made = time.perf_counter()
    x = vector()
    dist.all_reduce(x, group=group)
    creations.append(made - start)
    firsts.append(time.perf_counter() - made)
    groups.append(group)
    assert float(x[0]) == size, x
dist.barrier()
after = {{"sockets": sockets(), "fds": len(os.listdir("/proc/self/fd")), "mapped": mapped_shm_bytes()}}
report = {{"rank": rank, "creations": creations, "firsts": firsts, "before": before, "after": after}}
with open(os.path.join(os.environ["BENCH_OUT"], f"r_{{rank}}.json"), "w") as f:
    json.dump(report, f)
dist.barrier()
dist.destroy_process_group()
"""


def _run(system: str, nproc: int, groups: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="rt-groups-") as tmp:
        out = Path(tmp)
        script = out / "worker.py"
        script.write_text(_WORKER.format(system=system, groups=groups))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
        env["BENCH_OUT"] = str(out)
        proc = subprocess.run([sys.executable, "-m", "ringtree.run", "--nproc-per-node", str(nproc), str(script)],
                              env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{system} failed:\n{proc.stderr[-3000:]}")
        reports = [json.loads((out / f"r_{r}.json").read_text()) for r in range(nproc)]
    creations = [max(r["creations"][i] for r in reports) for i in range(groups)]
    firsts = [max(r["firsts"][i] for r in reports) for i in range(groups)]
    first = reports[0]
    return {
        "new_group_median_ms": sorted(creations)[groups // 2] * 1e3,
        "new_group_total_ms": sum(creations) * 1e3,
        "first_allreduce_median_us": sorted(firsts)[groups // 2] * 1e6,
        "sockets_before": first["before"]["sockets"],
        "sockets_after": first["after"]["sockets"],
        "fds_before": first["before"]["fds"],
        "fds_after": first["after"]["fds"],
        "mapped_before_mb": first["before"]["mapped"] / 2**20,
        "mapped_after_mb": first["after"]["mapped"] / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ringtree-bench groups", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--system", default=",".join(SYSTEMS), help="systems, comma-separated: " + ", ".join(SYSTEMS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds a job may take")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    systems = [s for s in args.system.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    if not have_torch():
        skipped = [s for s in systems if s != "ringtree"]
        systems = [s for s in systems if s == "ringtree"]
        if skipped:
            print(f"(left out, torch is not installed: {', '.join(skipped)})")
    print(f"groups: {args.groups} new_group() of all {args.nproc} ranks on one host, each with one all_reduce\n")
    print("| system | new_group median (ms) | new_group total (ms) | first all_reduce median (us) | sockets per rank "
          "before / after | fds per rank before / after | mapped per rank before / after (MB) |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for system in systems:
        r = _run(system, args.nproc, args.groups, args.timeout)
        rows.append({"system": system, **r})
        print(f"| {system} | {r['new_group_median_ms']:.2f} | {r['new_group_total_ms']:.0f} | "
              f"{r['first_allreduce_median_us']:.0f} | {r['sockets_before']} / {r['sockets_after']} | "
              f"{r['fds_before']} / {r['fds_after']} | {r['mapped_before_mb']:.1f} / {r['mapped_after_mb']:.1f} |",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0
