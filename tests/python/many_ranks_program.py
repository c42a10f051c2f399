"""The program test_many_ranks.py runs as every rank of one large job on this host: every
collective (small and past the 64 KiB small-message bound) and point-to-point call, each
result checked exactly against what the ranks' data gives (integer-valued, so every
reduction order gives the same bits). Each rank writes rank_<r>.json to argv[1]: the
mismatches it found (none when all is right), its transports and its host's shared memory
in use after init (Shmem in /proc/meminfo, kB)."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import ringtree as dist
from ringtree.bench.scale import shmem_kb


def _data(rank: int, count: int, dtype=np.float32) -> np.ndarray:
    return ((np.arange(count) % 31) + rank).astype(dtype)


def check_everything(rank: int, n: int) -> list[str]:
    wrong: list[str] = []

    def expect(name: str, got, want) -> None:
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            wrong.append(f"{name}: got {np.asarray(got)[:4]}..., want {np.asarray(want)[:4]}...")

    everyone = sum(_data(r, 1)[0] for r in range(n))  # element 0 of every rank's data, summed
    for count in (5, 20_000):
        base = np.arange(count) % 31
        a = _data(rank, count)
        dist.all_reduce(a)
        expect(f"all_reduce sum {count}", a, n * base + everyone)
        a = _data(rank, count, np.int64)
        dist.all_reduce(a, dist.ReduceOp.MAX)
        expect(f"all_reduce max {count}", a, base + n - 1)
        b = _data(rank, count)
        dist.broadcast(b, src=n - 1)
        expect(f"broadcast {count}", b, _data(n - 1, count))
        r = _data(rank, count)
        dist.reduce(r, dst=5 % n)
        expect(f"reduce {count}", r, n * base + everyone if rank == 5 % n else _data(rank, count))
        outputs = [np.empty(count, np.float32) for _ in range(n)]
        dist.all_gather(outputs, _data(rank, count))
        for q in range(n):
            expect(f"all_gather {count} block {q}", outputs[q], _data(q, count))
        rs = np.empty(count, np.float32)
        # Every rank gives block k the data of "rank" k: the result is n times it.
        dist.reduce_scatter(rs, [_data(k, count) for k in range(n)])
        expect(f"reduce_scatter {count}", rs, n * _data(rank, count))
        outs = [np.empty(count, np.float32) for _ in range(n)]
        dist.all_to_all(outs, [_data(rank * n + k, count) for k in range(n)])
        for q in range(n):
            expect(f"all_to_all {count} from {q}", outs[q], _data(q * n + rank, count))
        gathered = [np.empty(count, np.float32) for _ in range(n)] if rank == 0 else None
        dist.gather(_data(rank, count), gathered, dst=0)
        if rank == 0:
            for q in range(n):
                expect(f"gather {count} block {q}", gathered[q], _data(q, count))
        sc = np.empty(count, np.float32)
        dist.scatter(sc, [_data(k + 7, count) for k in range(n)] if rank == 0 else None, src=0)
        expect(f"scatter {count}", sc, _data(rank + 7, count))
        got = np.empty(count, np.float32)
        send = dist.isend(_data(rank, count), (rank + 1) % n)
        dist.recv(got, (rank - 1) % n)
        send.wait()
        expect(f"send/recv {count}", got, _data((rank - 1) % n, count))
    dist.barrier()
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": rank})
    if [o["rank"] for o in objects] != list(range(n)):
        wrong.append(f"all_gather_object: {objects}")
    return wrong


def main() -> int:
    out = sys.argv[1]
    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    report = {"shmem_kb_after_init": shmem_kb(), "pid": os.getpid()}
    started = time.monotonic()
    report["wrong"] = check_everything(rank, n)
    report["seconds"] = time.monotonic() - started
    communicator = dist.group.WORLD.engine.communicator
    report["transports"] = sorted({communicator.transport_to(p) for p in range(n) if p != rank})
    with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
