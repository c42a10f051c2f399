"""Started by test_mpi_backend.py under ``mpirun -n N``: every collective, point-to-point
and object call on backend "mpi" against the same call, on the same inputs, on ringtree's
own engine ("gloo"), compared bit for bit, sync and async, on the world and on a subgroup.

``python mpi_program.py mpi-world``: the world is "mpi" (rank and size from MPI, store
bootstrapped over MPI), the reference groups are new_group(backend="gloo").
``python mpi_program.py gloo-world``: the reverse; the world is "gloo" through env://
(rank and size from mpirun's variables), the tested groups new_group(backend="mpi").

Inputs are small integers, so every reduction order gives the exact result: the check is
that both backends compute the same thing, not that they round alike. Prints
"mpi-program: <n> cases passed" and exits 0, or lists the failures and exits 1.
"""

from __future__ import annotations

import sys
import warnings
from datetime import timedelta

import torch

import ringtree as dist
from ringtree import ReduceOp

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]
OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR,
       ReduceOp.BXOR, ReduceOp(ReduceOp.PREMUL_SUM, 2.0)]

failures: list[str] = []
passed = 0
# The async_op values check() runs: main() runs every case synchronously first, while the
# tested groups have never run an asynchronous collective (so their all_reduce and
# broadcast take the backend's C path), then asynchronously.
modes: tuple[bool, ...] = (False,)


def values(dtype: torch.dtype, count: int, salt: int, rank: int, op: object = None) -> torch.Tensor:
    """Deterministic small integers of ``dtype``, different on every rank and salt."""
    generator = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=generator).bool()
    low, high = (1, 3) if getattr(op, "op", op) == ReduceOp.PRODUCT else (0 if dtype == torch.uint8 else -4, 8)
    ints = torch.randint(low, high, (count,), generator=generator)
    if dtype.is_complex:
        return torch.complex(ints.double(), ints.flip(0).double()).to(dtype)
    return ints.to(dtype)


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def check(name: str, run, tested, reference) -> None:
    """run(group, async_op) -> the outputs; the tested group's (sync and async) must equal
    the reference's, or both must raise the same exception type."""
    global passed
    for async_op in modes:
        results = []
        for group in (tested, reference):
            try:
                results.append(("ok", run(group, async_op)))
            except Exception as exc:  # noqa: BLE001 - compared below
                results.append(("error", type(exc).__name__ + ": " + str(exc).splitlines()[0]))
        (kind_t, got), (kind_r, want) = results
        label = f"{name} {'async' if async_op else 'sync'}"
        if kind_t != kind_r:
            failures.append(f"{label}: mpi {kind_t} {got!r:.200}, gloo {kind_r} {want!r:.200}")
        elif kind_t == "error":
            if got.split(":")[0] != want.split(":")[0]:
                failures.append(f"{label}: mpi raised {got}, gloo raised {want}")
            else:
                passed += 1
        elif not same(got, want):
            failures.append(f"{label}: mpi gave {got!r:.300}, gloo gave {want!r:.300}")
        else:
            passed += 1


def finish(work) -> None:
    if work is not None:
        assert work.wait() is True
        assert work.is_completed() and work.is_success()


def cases(tested, reference, rank_in_group: int, size: int, global_ranks: list[int]) -> None:
    def run_all_reduce(dtype, op, count, salt):
        def run(group, async_op):
            tensor = values(dtype, count, salt, rank_in_group, op)
            finish(dist.all_reduce(tensor, op=op, group=group, async_op=async_op))
            return tensor
        return run

    for salt, dtype in enumerate(DTYPES):
        for op in OPS:
            for count in (1, 1000):
                check(f"all_reduce {dtype} {op} x{count}", run_all_reduce(dtype, op, count, salt), tested, reference)
    check("all_reduce float32 x300000", run_all_reduce(torch.float32, ReduceOp.SUM, 300_000, 99), tested, reference)

    for root in range(size):
        src = global_ranks[root]
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
            def run_broadcast(group, async_op, dtype=dtype, src=src):
                tensor = values(dtype, 33, 7, rank_in_group)
                finish(dist.broadcast(tensor, src=src, group=group, async_op=async_op))
                return tensor
            check(f"broadcast {dtype} root {root}", run_broadcast, tested, reference)
        for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX, ReduceOp(ReduceOp.PREMUL_SUM, 2.0)):
            for dtype in (torch.float32, torch.float16, torch.int32):
                def run_reduce(group, async_op, dtype=dtype, op=op, dst=src):
                    tensor = values(dtype, 17, 8, rank_in_group, op)
                    finish(dist.reduce(tensor, dst=dst, op=op, group=group, async_op=async_op))
                    return tensor  # unchanged off the root
                check(f"reduce {dtype} {op} root {root}", run_reduce, tested, reference)

        def run_gather(group, async_op, dst=src, root=root):
            tensor = values(torch.float64, 5, 9, rank_in_group)
            outputs = [torch.zeros(5, dtype=torch.float64) for _ in range(size)] if rank_in_group == root else None
            finish(dist.gather(tensor, outputs, dst=dst, group=group, async_op=async_op))
            return outputs
        check(f"gather root {root}", run_gather, tested, reference)

        def run_scatter(group, async_op, src=src, root=root):
            inputs = [values(torch.int16, 6, 10 + r, rank_in_group) for r in range(size)] if rank_in_group == root else None
            tensor = torch.zeros(6, dtype=torch.int16)
            finish(dist.scatter(tensor, inputs, src=src, group=group, async_op=async_op))
            return tensor
        check(f"scatter root {root}", run_scatter, tested, reference)

    for adjacent in (False, True):
        def run_all_gather(group, async_op, adjacent=adjacent):
            tensor = values(torch.bfloat16, 9, 11, rank_in_group)
            if adjacent:
                outputs = list(torch.zeros(size, 9, dtype=torch.bfloat16).unbind(0))
            else:
                outputs = [torch.zeros(9, dtype=torch.bfloat16) for _ in range(size)]
            finish(dist.all_gather(outputs, tensor, group=group, async_op=async_op))
            return outputs
        check(f"all_gather adjacent={adjacent}", run_all_gather, tested, reference)

    def run_all_gather_into_tensor(group, async_op):
        output = torch.zeros(size * 12, dtype=torch.int32)
        finish(dist.all_gather_into_tensor(output, values(torch.int32, 12, 12, rank_in_group), group=group,
                                           async_op=async_op))
        return output
    check("all_gather_into_tensor", run_all_gather_into_tensor, tested, reference)

    for op in OPS:
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            def run_reduce_scatter(group, async_op, op=op, dtype=dtype):
                inputs = [values(dtype, 7, 13 + r, rank_in_group, op) for r in range(size)]
                before = [tensor.clone() for tensor in inputs]
                output = torch.zeros(7, dtype=dtype)
                finish(dist.reduce_scatter(output, inputs, op=op, group=group, async_op=async_op))
                return [output, same(inputs, before)]
            check(f"reduce_scatter {dtype} {op}", run_reduce_scatter, tested, reference)

            def run_reduce_scatter_tensor(group, async_op, op=op, dtype=dtype):
                tensor = values(dtype, 8 * size, 14, rank_in_group, op)
                before = tensor.clone()
                output = torch.zeros(8, dtype=dtype)
                finish(dist.reduce_scatter_tensor(output, tensor, op=op, group=group, async_op=async_op))
                return [output, same(tensor, before)]
            check(f"reduce_scatter_tensor {dtype} {op}", run_reduce_scatter_tensor, tested, reference)

    def run_all_to_all(group, async_op):
        inputs = [values(torch.float32, 2 + r + rank_in_group, 15 + r, rank_in_group) for r in range(size)]
        outputs = [torch.zeros(2 + rank_in_group + r) for r in range(size)]
        finish(dist.all_to_all(outputs, inputs, group=group, async_op=async_op))
        return outputs
    check("all_to_all uneven", run_all_to_all, tested, reference)

    for splits in (False, True):
        def run_all_to_all_single(group, async_op, splits=splits):
            if splits:
                in_splits = [1 + (rank_in_group + r) % 3 for r in range(size)]
                out_splits = [1 + (r + rank_in_group) % 3 for r in range(size)]
            else:
                in_splits = out_splits = None
            rows_in = sum(in_splits) if splits else 2 * size
            rows_out = sum(out_splits) if splits else 2 * size
            tensor = values(torch.int64, rows_in * 3, 16, rank_in_group).reshape(rows_in, 3)
            output = torch.zeros(rows_out, 3, dtype=torch.int64)
            finish(dist.all_to_all_single(output, tensor, out_splits, in_splits, group=group, async_op=async_op))
            return output
        check(f"all_to_all_single splits={splits}", run_all_to_all_single, tested, reference)

    for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp(ReduceOp.PREMUL_SUM, 2.0)):
        def run_all_reduce_coalesced(group, async_op, op=op):
            tensors = [values(torch.float32, n, 17 + n, rank_in_group) for n in (1, 5, 70_000)]
            finish(dist.all_reduce_coalesced(tensors, op=op, group=group, async_op=async_op))
            return tensors
        check(f"all_reduce_coalesced {op}", run_all_reduce_coalesced, tested, reference)

    def run_all_gather_coalesced(group, async_op):
        inputs = [values(torch.int8, n, 18 + n, rank_in_group) for n in (3, 4)]
        outputs = [[torch.zeros(3, dtype=torch.int8), torch.zeros(4, dtype=torch.int8)] for _ in range(size)]
        finish(dist.all_gather_coalesced(outputs, inputs, group=group, async_op=async_op))
        return outputs
    check("all_gather_coalesced", run_all_gather_coalesced, tested, reference)

    def run_barrier(group, async_op):
        finish(dist.barrier(group=group, async_op=async_op))
        dist.barrier(group=group, timeout=timedelta(seconds=60))
        return "done"
    check("barrier", run_barrier, tested, reference)

    def run_errors(group, async_op):
        tensor = torch.ones(4)
        return dist.all_reduce(tensor, op=ReduceOp.BAND, group=group, async_op=async_op)
    check("all_reduce BAND float32 refused", run_errors, tested, reference)

    def run_objects(group, async_op):
        objects = [{"rank": rank_in_group, "data": list(range(rank_in_group * 3))}, "x" * rank_in_group]
        gathered = [None] * size
        dist.all_gather_object(gathered, objects[0], group=group)
        broadcast = list(objects)
        dist.broadcast_object_list(broadcast, src=global_ranks[size - 1], group=group)
        received = [None]
        dist.scatter_object_list(received, [f"to {r}" for r in range(size)] if rank_in_group == 0 else None,
                                 src=global_ranks[0], group=group)
        collected = [None] * size if rank_in_group == 0 else None
        dist.gather_object(objects[1], collected, dst=global_ranks[0], group=group)
        return [gathered, broadcast, received, collected]
    check("object collectives", run_objects, tested, reference)

    def run_p2p(group, async_op):
        right, left = (rank_in_group + 1) % size, (rank_in_group - 1) % size
        outputs = []
        for tag in (0, 5, 1234):
            send = values(torch.float32, 10, 20 + tag, rank_in_group)
            receive = torch.zeros(10)
            if async_op:
                works = [dist.isend(send, global_ranks[right], group=group, tag=tag),
                         dist.irecv(receive, global_ranks[left], group=group, tag=tag)]
                for work in works:
                    finish(work)
                outputs.append(works[1].source_rank() if hasattr(works[1], "source_rank") else None)
            elif rank_in_group % 2 == 0:
                dist.send(send, global_ranks[right], group=group, tag=tag)
                dist.recv(receive, global_ranks[left], group=group, tag=tag)
            else:
                dist.recv(receive, global_ranks[left], group=group, tag=tag)
                dist.send(send, global_ranks[right], group=group, tag=tag)
            outputs.append(receive)
        ops = [dist.P2POp(dist.isend, values(torch.int32, 4, 30, rank_in_group), global_ranks[right], group, 7),
               dist.P2POp(dist.irecv, torch.zeros(4, dtype=torch.int32), global_ranks[left], group, 7)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        outputs.append(ops[1].tensor)
        # Any source: rank 0 takes one message from every other rank, in arrival order.
        if rank_in_group == 0:
            senders = []
            for _ in range(size - 1):
                buffer = torch.zeros(3, dtype=torch.int64)
                sender = dist.recv(buffer, src=None, group=group, tag=9)
                assert buffer.tolist() == [sender] * 3, (sender, buffer)
                senders.append(sender)
            outputs.append(sorted(senders))
        else:
            dist.send(torch.full((3,), global_ranks[rank_in_group], dtype=torch.int64), global_ranks[0], group=group,
                      tag=9)
        return outputs
    check("point-to-point", run_p2p, tested, reference)


def main() -> int:
    warnings.simplefilter("ignore", FutureWarning)  # the deprecated names are called on purpose
    mode = sys.argv[1]
    if mode == "mpi-world":
        dist.init_process_group("mpi")
        world_tested, world_reference = None, dist.new_group(backend="gloo")
        assert dist.get_backend() == "mpi"
    else:
        dist.init_process_group("gloo")
        world_tested, world_reference = dist.new_group(backend="mpi"), None
        assert dist.get_backend(world_tested) == "mpi"
    rank, size = dist.get_rank(), dist.get_world_size()
    members = [0, size - 1] if size > 2 else [1]
    sub_tested = dist.new_group(members, backend="mpi")
    sub_reference = dist.new_group(members, backend="gloo")
    global modes
    for modes in ((False,), (True,)):
        cases(world_tested, world_reference, rank, size, list(range(size)))
        if rank in members:
            cases(sub_tested, sub_reference, members.index(rank), len(members), members)
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        print(f"rank {rank}: {len(failures)} failures", *failures[:40], sep="\n", file=sys.stderr)
        return 1
    sys.stdout.write(f"mpi-program: {passed} cases passed\n")  # one write: the ranks' lines must not interleave
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
