"""One rank of benchmarks/multihost.py: times all_reduce of float32 buffers (sizes in bytes
from argv) over ringtree (``--system ringtree``, with ``--algorithm``) or torch's gloo
(``--system gloo``), and rank 0 writes the medians (seconds) to ``--out`` as JSON."""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=["ringtree", "gloo"], required=True)
    parser.add_argument("--algorithm", default=None)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("sizes", type=int, nargs="+")
    args = parser.parse_args()
    if args.system == "ringtree":
        import numpy as np

        import ringtree as dist

        dist.init_process_group("gloo")

        def buffer(nbytes: int):
            return np.ones(nbytes // 4, np.float32)

        def all_reduce(a) -> None:
            dist.all_reduce(a, algorithm=args.algorithm)
    else:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")

        def buffer(nbytes: int):
            return torch.ones(nbytes // 4, dtype=torch.float32)

        def all_reduce(a) -> None:
            dist.all_reduce(a)

    medians = {}
    for nbytes in args.sizes:
        a = buffer(nbytes)
        all_reduce(a)
        times = []
        for _ in range(args.iterations):
            dist.barrier()
            start = time.perf_counter()
            all_reduce(a)
            times.append(time.perf_counter() - start)
        medians[nbytes] = statistics.median(times)
    if dist.get_rank() == 0:
        with open(args.out + ".tmp", "w") as f:
            json.dump(medians, f)
        import os

        os.replace(args.out + ".tmp", args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
