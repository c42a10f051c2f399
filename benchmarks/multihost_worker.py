"""One rank of benchmarks/multihost.py: times one collective (``--collective``) of float32
buffers (sizes in bytes from argv) over ringtree (``--system ringtree``, with
``--algorithm``), torch's gloo (``--system gloo``) or MPI through mpi4py (``--system mpi``,
under mpirun), and rank 0 writes the medians (seconds) to ``--out`` as JSON. An
iteration's time is the longest any rank took (a broadcast's root is done long before its
receivers). Sizes are nccl-tests': the buffer of all_reduce, broadcast and reduce, the
whole output of all_gather, the whole input of reduce_scatter; barrier moves nothing and
is timed once per size given."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=["ringtree", "gloo", "mpi"], required=True)
    parser.add_argument("--collective", choices=COLLECTIVES, default="all_reduce")
    parser.add_argument("--algorithm", default=None)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("sizes", type=int, nargs="+")
    args = parser.parse_args()
    if args.system == "mpi":
        system = _MpiCalls()
    else:
        system = _DistCalls(args.system, args.algorithm)
    medians = {}
    for nbytes in args.sizes:
        call = system.prepare(args.collective, nbytes)
        call()
        times = []
        for _ in range(args.iterations):
            system.barrier()
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        medians[nbytes] = statistics.median(system.longest(times))
    if system.rank == 0:
        with open(args.out + ".tmp", "w") as f:
            json.dump(medians, f)
        os.replace(args.out + ".tmp", args.out)
    system.close()


class _DistCalls:
    """ringtree's or torch's torch.distributed-shaped API (ringtree over NumPy buffers)."""

    def __init__(self, system: str, algorithm: str | None) -> None:
        if system == "ringtree":
            import numpy as np

            import ringtree as dist

            self.array = lambda values: np.array(values, np.float64)
            self.buffer = lambda count: np.ones(count, np.float32)
            self.options = {"algorithm": algorithm} if algorithm else {}
        else:
            import torch
            import torch.distributed as dist

            self.array = lambda values: torch.tensor(values, dtype=torch.float64)
            self.buffer = lambda count: torch.ones(count, dtype=torch.float32)
            self.options = {}
        self.dist = dist
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()
        self.n = dist.get_world_size()

    def prepare(self, collective: str, nbytes: int):
        """The call of this collective over nbytes, as a function of no arguments."""
        dist, options, count = self.dist, self.options, nbytes // 4
        if collective == "all_reduce":
            a = self.buffer(count)
            return lambda: dist.all_reduce(a, **options)
        if collective == "broadcast":
            a = self.buffer(count)
            return lambda: dist.broadcast(a, src=0, **options)
        if collective == "reduce":
            a = self.buffer(count)
            return lambda: dist.reduce(a, dst=0, **options)
        if collective == "all_gather":
            outputs = [self.buffer(count // self.n) for _ in range(self.n)]
            block = self.buffer(count // self.n)
            return lambda: dist.all_gather(outputs, block, **options)
        if collective == "reduce_scatter":
            inputs = [self.buffer(count // self.n) for _ in range(self.n)]
            out = self.buffer(count // self.n)
            return lambda: dist.reduce_scatter(out, inputs, **options)
        return lambda: dist.barrier()

    def barrier(self) -> None:
        self.dist.barrier()

    def longest(self, times: list[float]) -> list[float]:
        values = self.array(times)
        self.dist.all_reduce(values, self.dist.ReduceOp.MAX)
        return [float(v) for v in values]

    def close(self) -> None:
        self.dist.destroy_process_group()


class _MpiCalls:
    """MPI's collectives through mpi4py, over NumPy buffers."""

    def __init__(self) -> None:
        import numpy as np
        from mpi4py import MPI

        self.np, self.mpi, self.comm = np, MPI, MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.n = self.comm.Get_size()

    def prepare(self, collective: str, nbytes: int):
        np, mpi, comm, count = self.np, self.mpi, self.comm, nbytes // 4
        if collective == "all_reduce":
            a = np.ones(count, np.float32)
            return lambda: comm.Allreduce(mpi.IN_PLACE, a)
        if collective == "broadcast":
            a = np.ones(count, np.float32)
            return lambda: comm.Bcast(a, root=0)
        if collective == "reduce":
            a = np.ones(count, np.float32)
            if self.rank == 0:
                return lambda: comm.Reduce(mpi.IN_PLACE, a, root=0)
            return lambda: comm.Reduce(a, None, root=0)
        if collective == "all_gather":
            block = np.ones(count // self.n, np.float32)
            out = np.empty(count // self.n * self.n, np.float32)
            return lambda: comm.Allgather(block, out)
        if collective == "reduce_scatter":
            inputs = np.ones(count // self.n * self.n, np.float32)
            out = np.empty(count // self.n, np.float32)
            return lambda: comm.Reduce_scatter_block(inputs, out)
        return lambda: comm.Barrier()

    def barrier(self) -> None:
        self.comm.Barrier()

    def longest(self, times: list[float]) -> list[float]:
        values = self.np.array(times, self.np.float64)
        self.comm.Allreduce(self.mpi.IN_PLACE, values, op=self.mpi.MAX)
        return values.tolist()

    def close(self) -> None:
        pass



if __name__ == "__main__":
    main()
