"""The program test_multihost.py runs on the test bed (and on one host, for the reference):
every collective on integer-valued data (so that every reduction order gives the same
bits), small and large, written to <out>/rank_<rank>.json with the transport this rank uses
to each peer. ``--kill-rank R`` makes rank R die (SIGKILL) inside an all_reduce loop;
``--loop`` keeps every rank in all_reduce + barrier until an error, which it reports."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from datetime import timedelta

import numpy as np

import ringtree as dist


def _data(rank: int, count: int, dtype=np.float32) -> np.ndarray:
    return ((np.arange(count) % 997) + 3 * rank).astype(dtype)


def collectives(rank: int, size: int, algorithm: str | None) -> dict:
    results: dict[str, list] = {}
    for count in (5, 1 << 20):
        if algorithm is not None:
            # Under the given algorithm too (the reference runs the automatic choice).
            a = _data(rank, count + 3)
            dist.all_reduce(a, algorithm=algorithm)
            results[f"all_reduce_sum_{count}_chosen"] = a[:8].tolist() + [float(a.sum())]
        tag = f"{count}"
        a = _data(rank, count)
        dist.all_reduce(a)
        results[f"all_reduce_sum_{tag}"] = a[:8].tolist() + [float(a.sum())]
        a = _data(rank, count, np.int64)
        dist.all_reduce(a, dist.ReduceOp.MAX)
        results[f"all_reduce_max_{tag}"] = a[:8].tolist() + [int(a.sum())]
        b = _data(rank, count)
        dist.broadcast(b, src=size - 1)
        results[f"broadcast_{tag}"] = b[:8].tolist() + [float(b.sum())]
        r = _data(rank, count)
        dist.reduce(r, dst=1 % size)
        results[f"reduce_{tag}"] = (r[:8].tolist() + [float(r.sum())]) if rank == 1 % size else []
        outputs = [np.empty(count, np.float32) for _ in range(size)]
        dist.all_gather(outputs, _data(rank, count))
        results[f"all_gather_{tag}"] = [float(o.sum()) for o in outputs]
        rs = np.empty(count, np.float32)
        dist.reduce_scatter(rs, [_data(rank + k, count) for k in range(size)])
        results[f"reduce_scatter_{tag}"] = [float(rs.sum())]
        outs = [np.empty(count, np.float32) for _ in range(size)]
        dist.all_to_all(outs, [_data(rank * size + k, count) for k in range(size)])
        results[f"all_to_all_{tag}"] = [float(o.sum()) for o in outs]
        gathered = [np.empty(count, np.float32) for _ in range(size)] if rank == 0 else None
        dist.gather(_data(rank, count), gathered, dst=0)
        results[f"gather_{tag}"] = [float(g.sum()) for g in gathered] if rank == 0 else []
        sc = np.empty(count, np.float32)
        dist.scatter(sc, [_data(k + 10, count) for k in range(size)] if rank == 0 else None, src=0)
        results[f"scatter_{tag}"] = [float(sc.sum())]
        got = np.empty(count, np.float32)
        send = dist.isend(_data(rank, count), (rank + 1) % size)
        dist.recv(got, (rank - 1) % size)
        send.wait()
        results[f"send_recv_{tag}"] = [float(got.sum())]
    dist.barrier()
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank})
    results["all_gather_object"] = [o["rank"] for o in objects]
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--algorithm", help="also all_reduce with this algorithm (results stored apart)")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, size = dist.get_rank(), dist.get_world_size()
    transports = {str(p): dist.group.WORLD.engine.communicator.transport_to(p) for p in range(size) if p != rank}
    report = {"rank": rank, "host": socket.gethostname(), "transports": transports}
    path = os.path.join(args.out, f"rank_{rank}.json")
    try:
        if args.kill_rank >= 0 or args.loop:
            a = np.ones(1 << 16, np.float32)
            dist.all_reduce(a)
            with open(path + ".ready", "w"):
                pass
            started = time.monotonic()
            while True:
                if rank == args.kill_rank and time.monotonic() - started > 0.5:
                    os.kill(os.getpid(), signal.SIGKILL)
                dist.all_reduce(a)
                dist.barrier()
        report["results"] = collectives(rank, size, args.algorithm)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["failed_at"] = time.time()
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)  # readers see the whole report or none
    if "error" not in report:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
