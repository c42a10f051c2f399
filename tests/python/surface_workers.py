"""Functions run by harness.run_world for test_gather_scatter.py, test_p2p.py and
test_object_collectives.py, in each rank's process, and the launch they share.

One launch per world size runs every area (process start-up and importing torch are the
slow part): the gather/scatter family and the coalesced collectives, point-to-point, the
object collectives, then the cases that leave the group unusable (mismatches). Inputs are
small integers from collective_workers.make_input, exact in every dtype, which every rank
can compute for every other rank; results are compared bit for bit.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from datetime import timedelta

import numpy as np
import torch

import ringtree as dist
from harness import run_world
from collective_workers import (
    LARGE,
    NUMPY_DTYPES,
    SUM,
    TORCH_DTYPES,
    Checker,
    expect_raises,
    expected_reduction,
    make_input,
    mode,
    op_argument,
    run,
    same_bits,
    valid_ops,
)

BASES = [0, 1, 7, 1023]  # element counts; uneven cases add the rank (or a pattern) to them
BIG = 1 << 20  # float32 elements of the large point-to-point messages (4 MiB)
ALGORITHMS = {
    "all_gather": ["ring", "halving_doubling", "shm_direct"],
    "reduce_scatter": ["ring", "pairwise", "shm_direct"],
    "all_to_all": ["pairwise"],
    "gather": ["tree", "linear"],
    "scatter": ["tree", "linear"],
}


def piece(rank: int, world_size: int, count: int, dtype: torch.dtype, salt: int, op=SUM) -> torch.Tensor:
    """A fresh tensor of rank's data for one case (make_input's values, writable)."""
    return make_input(rank, world_size, count, dtype, op, salt).clone()


# --- the gather/scatter family ----------------------------------------------------------------


def family_torch(rank: int, n: int, check: Checker) -> None:
    """Every collective x dtype x count (uneven where the collective allows) x root x op,
    in place and out of place, sync and async alternately."""
    case = 0
    for dtype in TORCH_DTYPES:
        for base in BASES:
            case += 1
            async_op = case % 2 == 1
            counts = [base + r for r in range(n)]
            inputs = [piece(r, n, counts[r], dtype, case) for r in range(n)]
            outs = [torch.empty(c, dtype=dtype) for c in counts]
            run(dist.all_gather, outs, inputs[rank].clone(), async_op=async_op)
            check(all(map(same_bits, outs, inputs)), f"all_gather {dtype} base={base} {mode(async_op)}")
            outs = [torch.zeros(c, dtype=dtype) for c in counts]
            outs[rank].copy_(inputs[rank])
            run(dist.all_gather, outs, outs[rank], async_op=not async_op)
            check(all(map(same_bits, outs, inputs)), f"all_gather in place {dtype} base={base} {mode(not async_op)}")

            equal = [piece(r, n, base, dtype, case) for r in range(n)]
            out = torch.empty(n * base, dtype=dtype)
            run(dist.all_gather_single, out, equal[rank].clone(), async_op=async_op)
            check(same_bits(out, torch.cat(equal)), f"all_gather_single {dtype} base={base} {mode(async_op)}")
            stacked = torch.zeros(n, base, dtype=dtype)
            stacked[rank].copy_(equal[rank])
            run(dist.all_gather_single, stacked, stacked[rank], async_op=not async_op)
            check(same_bits(stacked, torch.stack(equal)),
                  f"all_gather_single in place {dtype} base={base} {mode(not async_op)}")

            for root in range(n):
                gather_list = [torch.empty(base, dtype=dtype) for _ in range(n)] if rank == root else None
                run(dist.gather, equal[rank].clone(), gather_list, dst=root, async_op=(case + root) % 2 == 0)
                check(rank != root or all(map(same_bits, gather_list, equal)),
                      f"gather {dtype} base={base} dst={root} {mode((case + root) % 2 == 0)}")
                scatter_list = [e.clone() for e in equal] if rank == root else None
                out = torch.empty(base, dtype=dtype)
                run(dist.scatter, out, scatter_list, src=root, async_op=(case + root) % 2 == 1)
                check(same_bits(out, equal[rank]),
                      f"scatter {dtype} base={base} src={root} {mode((case + root) % 2 == 1)}")

            def sent(p: int, q: int) -> torch.Tensor:  # what rank p sends rank q
                return piece(p * n + q, n, base + (p + 2 * q) % 3, dtype, case)

            outs = [torch.empty(base + (p + 2 * rank) % 3, dtype=dtype) for p in range(n)]
            run(dist.all_to_all, outs, [sent(rank, q) for q in range(n)], async_op=async_op)
            check(all(same_bits(outs[p], sent(p, rank)) for p in range(n)),
                  f"all_to_all {dtype} base={base} {mode(async_op)}")

            rows = [[(p + q + base) % 3 for q in range(n)] for p in range(n)]  # rows[p][q]: p sends q
            send_rows = [piece(rank * n + q, n, 2 * rows[rank][q], dtype, case).reshape(-1, 2) for q in range(n)]
            output = torch.empty(sum(rows[p][rank] for p in range(n)), 2, dtype=dtype)
            run(dist.all_to_all_single, output, torch.cat(send_rows), [rows[p][rank] for p in range(n)], rows[rank],
                async_op=async_op)
            expected = torch.cat([piece(p * n + rank, n, 2 * rows[p][rank], dtype, case).reshape(-1, 2)
                                  for p in range(n)])
            check(same_bits(output, expected), f"all_to_all_single splits {dtype} base={base} {mode(async_op)}")
            output = torch.empty(n * base, dtype=dtype)
            whole = torch.cat([piece(rank * n + q, n, base, dtype, case) for q in range(n)])
            run(dist.all_to_all_single, output, whole, async_op=not async_op)
            expected = torch.cat([piece(p * n + rank, n, base, dtype, case) for p in range(n)])
            check(same_bits(output, expected), f"all_to_all_single equal {dtype} base={base} {mode(not async_op)}")

            for op in valid_ops(dtype):
                case += 1

                def part(p: int, q: int) -> torch.Tensor:  # rank p's input for rank q
                    return piece(p, n, counts[q], dtype, case + 17 * q, op)

                want = expected_reduction(torch.stack([part(p, rank) for p in range(n)]), op, n)
                input_list = [part(rank, q) for q in range(n)]
                in_place = case % 3 == 0
                out = input_list[rank] if in_place else torch.empty(counts[rank], dtype=dtype)
                run(dist.reduce_scatter, out, input_list, op_argument(op, case), async_op=case % 2 == 0)
                check(same_bits(out, want),
                      f"reduce_scatter {dtype} {op.name} base={base} in_place={in_place} {mode(case % 2 == 0)}")

                def equal_part(p: int, q: int) -> torch.Tensor:
                    return piece(p, n, base, dtype, case + 17 * q, op)

                want = expected_reduction(torch.stack([equal_part(p, rank) for p in range(n)]), op, n)
                whole = torch.stack([equal_part(rank, q) for q in range(n)])
                out = whole[rank] if in_place else torch.empty(base, dtype=dtype)
                run(dist.reduce_scatter_single, out, whole, op_argument(op, case), async_op=case % 2 == 1)
                check(same_bits(out, want),
                      f"reduce_scatter_single {dtype} {op.name} base={base} in_place={in_place} {mode(case % 2 == 1)}")


def family_large_and_numpy(rank: int, n: int, check: Checker) -> None:
    """Messages beyond one segment, NumPy arrays of every dtype NumPy has."""
    counts = [LARGE - 3 * r for r in range(n)]  # make_input has LARGE + 256 elements from its offset on
    inputs = [piece(r, n, counts[r], torch.float32, 1) for r in range(n)]
    outs = [torch.empty(c) for c in counts]
    dist.all_gather(outs, inputs[rank])
    check(all(map(same_bits, outs, inputs)), f"all_gather float32 n={LARGE}-3*rank")
    input_list = [piece(rank, n, counts[q], torch.int32, 2 + q) for q in range(n)]
    want = sum(piece(p, n, counts[rank], torch.int32, 2 + rank) for p in range(n))
    out = torch.empty(counts[rank], dtype=torch.int32)
    dist.reduce_scatter(out, input_list)
    check(same_bits(out, want), f"reduce_scatter int32 SUM n={LARGE}-3*rank")
    output = torch.empty(n * LARGE, dtype=torch.float64)
    dist.all_to_all_single(output, torch.cat([piece(rank * n + q, n, LARGE, torch.float64, 3) for q in range(n)]))
    check(same_bits(output, torch.cat([piece(p * n + rank, n, LARGE, torch.float64, 3) for p in range(n)])),
          f"all_to_all_single float64 n={LARGE}")

    for case, dtype in enumerate(NUMPY_DTYPES):
        counts = [7 + r for r in range(n)]
        inputs = [piece(r, n, counts[r], dtype, case).numpy() for r in range(n)]
        outs = [np.empty(c, dtype=inputs[0].dtype) for c in counts]
        run(dist.all_gather, outs, inputs[rank], async_op=case % 2 == 0)
        check(all(same_bits(torch.from_numpy(o), torch.from_numpy(i)) for o, i in zip(outs, inputs)),
              f"numpy all_gather {dtype} n=7+rank {mode(case % 2 == 0)}")
        whole = np.concatenate([piece(rank, n, 5, dtype, case + 17 * q).numpy() for q in range(n)])
        out = np.empty(5, dtype=whole.dtype)
        run(dist.reduce_scatter_single, out, whole, async_op=case % 2 == 1)
        want = expected_reduction(torch.stack([piece(p, n, 5, dtype, case + 17 * rank) for p in range(n)]), SUM, n)
        check(same_bits(torch.from_numpy(out), want),
              f"numpy reduce_scatter_single {dtype} SUM n=5 {mode(case % 2 == 1)}")
        output = np.empty(3 * n, dtype=whole.dtype)
        run(dist.all_to_all_single, output,
            np.concatenate([piece(rank * n + q, n, 3, dtype, case).numpy() for q in range(n)]), async_op=case % 2 == 0)
        want = torch.cat([piece(p * n + rank, n, 3, dtype, case) for p in range(n)])
        check(same_bits(torch.from_numpy(output), want), f"numpy all_to_all_single {dtype} n=3 {mode(case % 2 == 0)}")
        root = case % n
        scatter_list = [piece(r, n, 4, dtype, case).numpy() for r in range(n)] if rank == root else None
        out = np.empty(4, dtype=whole.dtype)
        run(dist.scatter, out, scatter_list, src=root, async_op=case % 2 == 1)
        check(same_bits(torch.from_numpy(out), piece(rank, n, 4, dtype, case)),
              f"numpy scatter {dtype} n=4 src={root} {mode(case % 2 == 1)}")


def family_coalesced(rank: int, n: int, check: Checker) -> None:
    """all_reduce_coalesced packs small tensors and reduces large ones alone: both kinds in
    one call; all_gather_coalesced with per-rank sizes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # both warn that they will be deprecated
        coalesced(rank, n, check)


def coalesced(rank: int, n: int, check: Checker) -> None:
    sizes = [3, 70000, 0, 1023, 1]  # 70000 float32 elements are past the packing limit
    for case, (dtype, op) in enumerate([(torch.float32, SUM), (torch.int64, dist.ReduceOp.MAX),
                                        (torch.complex128, dist.ReduceOp.AVG), (torch.bool, dist.ReduceOp.BXOR)]):
        tensors = [piece(rank, n, size, dtype, case * 7 + i, op) for i, size in enumerate(sizes)]
        wants = [expected_reduction(torch.stack([piece(p, n, size, dtype, case * 7 + i, op) for p in range(n)]), op, n)
                 for i, size in enumerate(sizes)]
        run(dist.all_reduce_coalesced, tensors, op_argument(op, case), async_op=case % 2 == 1)
        check(all(map(same_bits, tensors, wants)),
              f"all_reduce_coalesced {dtype} {op.name} sizes={sizes} {mode(case % 2 == 1)}")
    single = piece(rank, n, 5, torch.int16, 9)
    dist.all_reduce_coalesced(single)
    check(same_bits(single, sum(piece(p, n, 5, torch.int16, 9) for p in range(n)).to(torch.int16)),
          "all_reduce_coalesced of one tensor")

    def item(p: int, i: int) -> torch.Tensor:  # rank p's i-th input
        return piece(p, n, i + p, torch.float64, 40 + i).reshape(1, -1)

    inputs = [item(rank, i) for i in range(3)]
    outputs = [[torch.empty(1, i + p, dtype=torch.float64) for i in range(3)] for p in range(n)]
    run(dist.all_gather_coalesced, outputs, inputs, async_op=True)
    check(all(same_bits(outputs[p][i], item(p, i)) for p in range(n) for i in range(3)), "all_gather_coalesced")


def family_algorithms(rank: int, n: int, check: Checker, shm: bool) -> None:
    """Each collective with every algorithm it implements (shm_direct needs one host over
    shared memory)."""
    for name, algorithms in ALGORITHMS.items():
        for algorithm in algorithms:
            if algorithm == "shm_direct" and not shm:
                continue
            what = f"algorithm={algorithm}"
            if name == "all_gather":
                outs = [torch.empty(1000 + r) for r in range(n)]
                dist.all_gather(outs, piece(rank, n, 1000 + rank, torch.float32, 5), algorithm=algorithm)
                check(all(same_bits(outs[r], piece(r, n, 1000 + r, torch.float32, 5)) for r in range(n)),
                      f"all_gather float32 n=1000+rank {what}")
                out = torch.empty(n, 999)
                dist.all_gather_single(out, piece(rank, n, 999, torch.float32, 6), algorithm=algorithm)
                check(same_bits(out, torch.stack([piece(r, n, 999, torch.float32, 6) for r in range(n)])),
                      f"all_gather_single float32 n=999 {what}")
            elif name == "reduce_scatter":
                out = torch.empty(1000 + rank, dtype=torch.int32)
                dist.reduce_scatter(out, [piece(rank, n, 1000 + q, torch.int32, 7 + q) for q in range(n)],
                                    algorithm=algorithm)
                check(same_bits(out, sum(piece(p, n, 1000 + rank, torch.int32, 7 + rank) for p in range(n))),
                      f"reduce_scatter int32 SUM n=1000+rank {what}")
                out = torch.empty(999, dtype=torch.int32)
                dist.reduce_scatter_single(out, torch.cat([piece(rank, n, 999, torch.int32, 9 + q) for q in range(n)]),
                                           algorithm=algorithm)
                check(same_bits(out, sum(piece(p, n, 999, torch.int32, 9 + rank) for p in range(n))),
                      f"reduce_scatter_single int32 SUM n=999 {what}")
            elif name == "all_to_all":
                outs = [torch.empty(100 + p + rank) for p in range(n)]
                dist.all_to_all(outs, [piece(rank * n + q, n, 100 + rank + q, torch.float32, 8) for q in range(n)],
                                algorithm=algorithm)
                check(all(same_bits(outs[p], piece(p * n + rank, n, 100 + p + rank, torch.float32, 8))
                          for p in range(n)), f"all_to_all float32 n=100+p+q {what}")
                output = torch.empty(n * 50)
                whole = torch.cat([piece(rank * n + q, n, 50, torch.float32, 9) for q in range(n)])
                dist.all_to_all_single(output, whole, algorithm=algorithm)
                want = torch.cat([piece(p * n + rank, n, 50, torch.float32, 9) for p in range(n)])
                check(same_bits(output, want), f"all_to_all_single float32 n=50 {what}")
            else:
                root = n - 1
                data = [piece(r, n, 1000, torch.float32, 10) for r in range(n)]
                if name == "gather":
                    gather_list = [torch.empty(1000) for _ in range(n)] if rank == root else None
                    dist.gather(data[rank], gather_list, dst=root, algorithm=algorithm)
                    check(rank != root or all(map(same_bits, gather_list, data)),
                          f"gather float32 n=1000 dst={root} {what}")
                else:
                    out = torch.empty(1000)
                    dist.scatter(out, data if rank == root else None, src=root, algorithm=algorithm)
                    check(same_bits(out, data[rank]), f"scatter float32 n=1000 src={root} {what}")


def family_errors(rank: int, n: int, check: Checker) -> None:
    """Each raises on every rank before any data moves: buffers untouched, group usable."""
    f = torch.arange(4, dtype=torch.float32)
    outs = [torch.zeros(4) for _ in range(n)]
    read_only = np.zeros(4, dtype=np.float32)
    read_only.flags.writeable = False
    c = torch.ones(4, dtype=torch.complex64)
    not_root_list = [torch.zeros(4) for _ in range(n)] if rank != 0 else None  # wrong on every rank
    cases = [
        ("all_gather list too short", ValueError, lambda: dist.all_gather(outs[:-1], f)),
        ("all_gather dtype mismatch", ValueError, lambda: dist.all_gather([torch.zeros(4, dtype=torch.int32)] * n, f)),
        ("all_gather own slot size", ValueError, lambda: dist.all_gather([torch.zeros(5) for _ in range(n)], f)),
        ("all_gather tensor_list not a list", TypeError, lambda: dist.all_gather(torch.zeros(4 * n), f)),
        ("all_gather read-only output", ValueError, lambda: dist.all_gather([read_only] * n, f)),
        ("all_gather not a buffer", TypeError, lambda: dist.all_gather(outs, [1.0, 2.0])),
        ("all_gather_single output size", ValueError, lambda: dist.all_gather_single(torch.zeros(4 * n + 1), f)),
        ("gather list where wrong", ValueError, lambda: dist.gather(f, not_root_list, dst=0)),
        ("gather list size", ValueError, lambda: dist.gather(f, [torch.zeros(3)] * n, group_dst=rank)),
        ("gather dst out of range", ValueError, lambda: dist.gather(f, None, dst=n)),
        ("scatter list where wrong", ValueError, lambda: dist.scatter(f, not_root_list, src=0)),
        ("scatter list length", ValueError, lambda: dist.scatter(f, [torch.zeros(4)] * (n + 1), group_src=rank)),
        ("scatter src and group_src", ValueError, lambda: dist.scatter(f, None, src=0, group_src=0)),
        ("reduce_scatter complex MAX", ValueError,
         lambda: dist.reduce_scatter(c, [c] * n, op=dist.ReduceOp.MAX)),
        ("reduce_scatter list length", ValueError, lambda: dist.reduce_scatter(f, [f] * (n + 1))),
        ("reduce_scatter own part size", ValueError, lambda: dist.reduce_scatter(f, [torch.zeros(3)] * n)),
        ("reduce_scatter_single sizes", ValueError, lambda: dist.reduce_scatter_single(f, torch.zeros(4 * n - 1))),
        ("reduce_scatter_single float BXOR", ValueError,
         lambda: dist.reduce_scatter_single(f, torch.zeros(4 * n), op=dist.ReduceOp.BXOR)),
        ("all_to_all list length", ValueError, lambda: dist.all_to_all(outs + [f], outs)),
        ("all_to_all dtype mismatch", ValueError,
         lambda: dist.all_to_all(outs, [torch.zeros(4, dtype=torch.float64)] * n)),
        ("all_to_all_single split count", ValueError,
         lambda: dist.all_to_all_single(torch.zeros(n), torch.zeros(n), [1] * (n + 1), None)),
        ("all_to_all_single split sum", ValueError,
         lambda: dist.all_to_all_single(torch.zeros(n), torch.zeros(n), None, [1] * (n - 1) + [2])),
        ("all_to_all_single negative split", ValueError,
         lambda: dist.all_to_all_single(torch.zeros(n), torch.zeros(n), None, [-1] + [1] * (n - 1))),
        ("all_to_all_single overlap", ValueError, lambda: dist.all_to_all_single(outs[0], outs[0])),
        ("unknown algorithm", ValueError, lambda: dist.all_gather(outs, f, algorithm="nonsense")),
        ("all_reduce_coalesced dtypes", ValueError,
         lambda: dist.all_reduce_coalesced([f, torch.zeros(2, dtype=torch.int8)])),
        ("all_gather_coalesced lists", ValueError, lambda: dist.all_gather_coalesced([[f]] * (n + 1), [f])),
    ]
    if n > 1:
        cases.append(("all_to_all_single dim 0", ValueError,
                      lambda: dist.all_to_all_single(torch.zeros(n + 1, 2), torch.zeros(n + 1, 2))))
        whole = torch.zeros(4 * n)
        cases.append(("all_gather_single in place at the wrong part", ValueError,
                      lambda: dist.all_gather_single(whole, whole[4 * ((rank + 1) % n):][:4])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for name, error, call in cases:
            expect_raises(check, name, error, call)
    check(torch.equal(f, torch.arange(4, dtype=torch.float32)) and all(torch.equal(o, torch.zeros(4)) for o in outs),
          "buffers untouched by invalid calls")
    gathered = [torch.empty(1) for _ in range(n)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    check([g.item() for g in gathered] == list(range(n)), "group usable after invalid calls")


# --- point-to-point ---------------------------------------------------------------------------


def p2p_cases(rank: int, n: int, check: Checker) -> None:
    f = torch.ones(3)
    cases = [
        ("send to self", ValueError, lambda: dist.send(f, dst=rank)),
        ("send to no rank", ValueError, lambda: dist.send(f, dst=n)),
        ("isend to self", ValueError, lambda: dist.isend(f, dst=rank)),
        ("irecv from self", ValueError, lambda: dist.irecv(f, group_src=rank)),
        ("isend without dst", ValueError, lambda: dist.isend(f)),
        ("negative tag", ValueError, lambda: dist.isend(f, dst=(rank + 1) % n, tag=-1) if n > 1 else
         dist.irecv(f, tag=-1)),
        ("irecv read-only", ValueError, lambda: dist.irecv(b"abc")),
        ("P2POp of another op", ValueError, lambda: dist.P2POp(dist.all_reduce, f, 0)),
        ("P2POp without peer", ValueError, lambda: dist.P2POp(dist.isend, f)),
        ("batch of nothing", ValueError, lambda: dist.batch_isend_irecv([])),
        ("batch of non-ops", ValueError, lambda: dist.batch_isend_irecv([f])),
    ]
    for name, error, call in cases:
        expect_raises(check, name, error, call)
    if n == 1:
        return
    nxt, prv = (rank + 1) % n, (rank - 1) % n

    # Blocking ring over every dtype and a few counts: even ranks send first.
    case = 0
    for dtype in TORCH_DTYPES:
        for count in (0, 1, 1023):
            case += 1
            got = torch.empty(count, dtype=dtype)
            if rank % 2 == 0:
                dist.send(piece(rank, n, count, dtype, case), nxt)
                source = dist.recv(got, prv)
            else:
                source = dist.recv(got, group_src=prv)
                dist.send(piece(rank, n, count, dtype, case), group_dst=nxt)
            check(source == prv and same_bits(got, piece(prv, n, count, dtype, case)), f"send/recv {dtype} n={count}")
    for dtype in NUMPY_DTYPES:
        case += 1
        got = np.empty(5, dtype=piece(0, n, 1, dtype, 0).numpy().dtype)
        works = [dist.irecv(got, prv, tag=3), dist.isend(piece(rank, n, 5, dtype, case).numpy(), nxt, tag=3)]
        check(all(w.wait() for w in works) and works[0].source_rank() == prv, f"numpy isend/irecv {dtype}")
        check(same_bits(torch.from_numpy(got), piece(prv, n, 5, dtype, case)), f"numpy isend/irecv data {dtype}")

    # Any source: rank 0 receives one message from every other rank, with recv and irecv
    # (a tag of their own: the senders go on to send rank 0 other messages).
    if rank == 0:
        senders = set()
        for k in range(n - 1):
            got = torch.empty(4, dtype=torch.int64)
            if k % 2 == 0:
                source = dist.recv(got, tag=9)
            else:
                work = dist.irecv(got, tag=9)
                work.wait()
                source = work.source_rank()
            senders.add(source)
            check(torch.equal(got, torch.arange(4) + 10 * source), f"recv from any source ({source})")
        check(senders == set(range(1, n)), f"every sender seen once: {sorted(senders)}")
    else:
        dist.send(torch.arange(4) + 10 * rank, 0, tag=9)

    # Tags: messages with different tags may be received in any order; with one tag in order.
    if rank == 0:
        works = [dist.isend(torch.full((2,), 7.0), 1, tag=7), dist.isend(torch.full((2,), 3.0), 1, tag=3),
                 dist.isend(torch.full((2,), 1.0), 1, tag=1), dist.isend(torch.full((2,), 2.0), 1, tag=1)]
        check(all(w.wait() for w in works), "tagged sends")
    elif rank == 1:
        got = [torch.empty(2) for _ in range(4)]
        works = [dist.irecv(got[0], 0, tag=3), dist.irecv(got[1], 0, tag=7),
                 dist.irecv(got[2], 0, tag=1), dist.irecv(got[3], 0, tag=1)]
        check(all(w.wait() for w in works), "tagged receives")
        check([g[0].item() for g in got] == [3.0, 7.0, 1.0, 2.0], f"tag matching: {[g[0].item() for g in got]}")

    def big(p: int, k: int) -> torch.Tensor:  # rank p's k-th large message (make_input's are shorter)
        return torch.arange(BIG, dtype=torch.float32) + (2 * p + k) * BIG

    # An operation keeps what it moves: tensors whose only reference is the call's (dropped
    # at once), too large to complete while posted (above the 64 KiB sent without waiting);
    # the isend's Work is dropped too. Other tensors are made meanwhile, which would reuse
    # freed memory. irecv's result() gives its tensor back.
    dist.isend(big(rank, 5), nxt, tag=11)
    received = dist.irecv(torch.empty(BIG), prv, tag=11)
    reduced = dist.all_reduce(torch.full((BIG,), float(rank)), async_op=True)
    clutter = [torch.full((BIG,), -1.0) for _ in range(4)]
    check(received.wait() and reduced.wait(), "Works on dropped tensors complete")
    check(same_bits(received.result()[0], big(prv, 5)), "irecv into a dropped tensor: its data")
    check(torch.equal(reduced.result()[0], torch.full((BIG,), float(n * (n - 1) // 2))),
          "all_reduce of a dropped tensor: its result")
    del clutter

    # batch_isend_irecv: every rank posts its sends (large ones) before its receives.
    outgoing = [big(rank, k) for k in range(2)]
    incoming = [torch.empty(BIG) for _ in range(2)]
    ops = [dist.P2POp(dist.isend, outgoing[0], nxt), dist.P2POp(dist.isend, outgoing[1], group_peer=prv, tag=1),
           dist.P2POp(dist.irecv, incoming[0], prv), dist.P2POp(dist.irecv, incoming[1], nxt, tag=1)]
    check("isend" in repr(ops[0]) and ops[1].peer == prv and ops[2].group_peer == prv, "P2POp attributes")
    works = dist.batch_isend_irecv(ops)
    check(len(works) == 4 and all(w.wait() for w in works), "batch_isend_irecv completes")
    check(same_bits(incoming[0], big(prv, 0)) and same_bits(incoming[1], big(nxt, 1)), "batch_isend_irecv data")

    # Done callbacks that run inside a blocking call (small calls keep the GIL until they
    # wait), or on the engine's thread, and post point-to-point calls of their own, small
    # (posted with the GIL) and large.
    first, marker, echo = torch.zeros(2), torch.zeros(1), torch.zeros(BIG)
    replies: list = []
    pending = dist.irecv(first, prv, tag=20)

    def on_first(_error: object) -> None:
        replies.append(dist.isend(first * 2, nxt, tag=21))
        replies.append(dist.isend(big(rank, 6), nxt, tag=22))

    pending._add_done_callback(on_first)
    dist.send(torch.full((2,), float(rank)), nxt, tag=20)
    dist.send(torch.ones(1), nxt, tag=23)
    dist.recv(marker, prv, tag=23)  # the callback may run inside this call
    doubled = torch.zeros(2)
    dist.recv(doubled, prv, tag=21)
    dist.recv(echo, prv, tag=22)
    pending.wait()
    settled = time.monotonic() + 10  # the callback may still be running on the engine's thread
    while len(replies) < 2 and time.monotonic() < settled:
        time.sleep(0.001)
    check(len(replies) == 2 and all(w.wait() for w in replies), "callbacks' point-to-point calls complete")
    check(torch.equal(doubled, torch.full((2,), 2.0 * ((prv - 1) % n))) and same_bits(echo, big(prv, 6)),
          "point-to-point calls made by done callbacks inside a blocking call")


# --- object collectives ----------------------------------------------------------------------


def make_object(rank: int, salt: int) -> dict:
    return {"rank": rank, "salt": salt, "text": "x" * (rank * 3 + salt), "blob": bytes(100_000 if rank == 1 else 3),
            "nested": [None, (rank, 1.5), {"k": {rank}}]}


def objects_cases(rank: int, n: int, check: Checker) -> None:
    gathered = [None] * n
    dist.all_gather_object(gathered, make_object(rank, 0))
    check(gathered == [make_object(r, 0) for r in range(n)], "all_gather_object")
    tensors = [None] * n
    dist.all_gather_object(tensors, torch.arange(rank + 1))
    check(all(torch.equal(t, torch.arange(r + 1)) for r, t in enumerate(tensors)), "all_gather_object of tensors")

    for root in range(n):
        out = [None] * n if rank == root else None
        dist.gather_object(make_object(rank, root), out, dst=root)
        check(rank != root or out == [make_object(r, root) for r in range(n)], f"gather_object dst={root}")

        objects = [make_object(root, 1), "s", 42] if rank == root else [None, None, None]
        dist.broadcast_object_list(objects, src=root, device="cpu")
        check(objects == [make_object(root, 1), "s", 42], f"broadcast_object_list src={root}")

        out = [None]
        dist.scatter_object_list(out, [make_object(r, 2) for r in range(n)] if rank == root else None, group_src=root)
        check(out == [make_object(rank, 2)], f"scatter_object_list src={root}")

    empty: list = []
    dist.broadcast_object_list(empty, src=0)
    check(empty == [], "broadcast_object_list of nothing")

    if n > 1:
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        received = [None, None]
        if rank % 2 == 0:
            dist.send_object_list([make_object(rank, 3), rank], dst=nxt)
            source = dist.recv_object_list(received, src=prv)
        else:
            source = dist.recv_object_list(received, group_src=prv, device="cpu")
            dist.send_object_list([make_object(rank, 3), rank], group_dst=nxt, use_batch=True)
        check(source == prv and received == [make_object(prv, 3), prv], "send/recv_object_list")
        if rank == 0:
            sources = set()
            for _ in range(n - 1):
                received = [None]
                source = dist.recv_object_list(received)
                sources.add(source)
                check(received == [f"from {source}"], f"recv_object_list from any source ({source})")
            check(sources == set(range(1, n)), "recv_object_list saw every sender")
        else:
            dist.send_object_list([f"from {rank}"], 0)

    not_root_list = [None] * n if rank != 0 else None  # wrong on every rank
    cases = [
        ("scatter_object_list empty output", ValueError, lambda: dist.scatter_object_list([], [1] * n)),
        ("scatter_object_list source without input", ValueError,
         lambda: dist.scatter_object_list([None], None, group_src=rank)),
        ("scatter_object_list input length", ValueError,
         lambda: dist.scatter_object_list([None], [1] * (n + 1), group_src=rank)),
        ("gather_object list where wrong", ValueError, lambda: dist.gather_object(1, not_root_list, dst=0)),
        ("send_object_list to self", ValueError, lambda: dist.send_object_list([1], dst=rank)),
        ("recv_object_list from self", ValueError, lambda: dist.recv_object_list([1], src=rank)),
        ("broadcast_object_list src out of range", ValueError, lambda: dist.broadcast_object_list([1], src=n)),
    ]
    for name, error, call in cases:
        expect_raises(check, name, error, call)
    gathered = [None] * n
    dist.all_gather_object(gathered, rank)
    check(gathered == list(range(n)), "group usable after invalid object calls")


# --- a subgroup --------------------------------------------------------------------------------


def subgroup_cases(rank: int, n: int, check: Checker) -> None:
    """Global and group ranks on a subgroup whose group rank 0 is the last world rank:
    gather (dst global / group_dst), point-to-point (recv returns the global rank), objects;
    the other ranks get torch's warning and a no-op."""
    members = [n - 1, 0]
    sub = dist.new_group(members, sort_ranks=False)
    if rank not in members:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check(dist.all_gather([torch.zeros(1)], torch.zeros(1), group=sub) is None, "non-member all_gather")
            check(dist.recv(torch.zeros(1), group=sub) == -1, "non-member recv")
        check(len(caught) == 2 and "does not belong" in str(caught[0].message), "non-members are warned")
        dist.destroy_process_group(sub)
        return
    me = members.index(rank)
    data = torch.full((3,), float(rank))
    gather_list = [torch.empty(3) for _ in members] if rank == 0 else None
    dist.gather(data, gather_list, dst=0, group=sub)
    check(rank != 0 or [g[0].item() for g in gather_list] == [n - 1.0, 0.0], "subgroup gather to global dst")
    out = torch.empty(3)
    dist.scatter(out, [torch.full((3,), 10.0 + g) for g in range(2)] if me == 0 else None, group_src=0, group=sub)
    check(out[0].item() == 10.0 + me, "subgroup scatter from group_src")
    got = torch.empty(1)
    if me == 0:
        dist.send(torch.tensor([5.0]), dst=0, group=sub)
        check(dist.recv(got, group=sub) == 0 and got.item() == 6.0, "subgroup recv returns the global rank")
    else:
        check(dist.recv(got, group=sub) == n - 1 and got.item() == 5.0, "subgroup recv from any source")
        dist.send(torch.tensor([6.0]), group_dst=0, group=sub)
    objects = [None, None]
    dist.all_gather_object(objects, rank, group=sub)
    check(objects == members, "subgroup all_gather_object in group rank order")
    dist.destroy_process_group(sub)


# --- failures that leave the group unusable (last) --------------------------------------------


def mismatches(rank: int, n: int) -> dict:
    """Two ranks: an all_gather whose sizes disagree, then a point-to-point message whose
    size differs from its receive; the error each rank gets (class names; the sender of a
    small message may finish before the receiver finds the mismatch)."""
    out = {}
    outs = [torch.zeros(3), torch.zeros(3 + rank)]  # rank 0 expects 3 elements from rank 1, which sends 4
    try:
        dist.all_gather(outs, torch.ones(3 + rank))
        out["all_gather"] = None
    except dist.DistError as exc:
        out["all_gather"] = type(exc).__name__
    works = [dist.isend(torch.ones(3), 1)] if rank == 0 else [dist.irecv(torch.ones(4), 0)]
    try:
        works[0].wait()
        out["p2p"] = None
    except dist.DistError as exc:
        out["p2p"] = type(exc).__name__
    out["p2p_exception"] = type(works[0].exception()).__name__
    return out


# World size -> RINGTREE_TRANSPORT of its group. One launch of max(WORLDS) processes runs
# them all, largest first: process start-up (importing torch) is what takes time.
WORLDS = {5: "auto", 4: "shm", 3: "auto", 2: "tcp"}


@functools.cache
def launch() -> dict[int, tuple]:
    """Test side, shared by the three test files: runs surface() for world size 1 in this
    process and for every size of WORLDS in one launch; returns, per world size, each
    rank's summaries."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    saved = os.environ.get("RINGTREE_TRANSPORT")
    try:
        worlds = {1: (surface(0, 1, server.port, "auto"),)}
    finally:
        if saved is None:
            os.environ.pop("RINGTREE_TRANSPORT", None)
        else:
            os.environ["RINGTREE_TRANSPORT"] = saved
    results = run_world("surface_workers:surfaces", max(WORLDS), timeout=240, port=server.port)
    for world_size in WORLDS:
        worlds[world_size] = tuple(r["ok"][str(world_size)] for r in results[:world_size])
    return worlds


def surfaces(rank: int, world_size: int, port: int) -> dict:
    """surface() over a group of each size of WORLDS that this rank belongs to (the first
    ranks), one after the other."""
    return {size: surface(rank, size, port, WORLDS[size]) for size in WORLDS if rank < size}


def surface(rank: int, world_size: int, port: int, transport: str) -> dict:
    """Every area on one default group of world_size ranks (named after its size, so that
    the groups of one launch keep apart in the store); returns per area the cases and
    failures."""
    os.environ["RINGTREE_TRANSPORT"] = transport
    torch.set_num_threads(1)  # the ranks share two cores
    timeout = timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout,
                            group_name=f"surface{world_size}")
    summaries = {}
    for area, steps in {
        "family": [family_errors, family_torch, family_large_and_numpy, family_coalesced,
                   functools.partial(family_algorithms, shm=transport != "tcp" and world_size > 1)],
        "p2p": [p2p_cases],
        "objects": [objects_cases],
    }.items():
        check = Checker()
        for step in steps:
            step(rank, world_size, check)
        summaries[area] = check.summary()
    if world_size >= 3:
        check = Checker()
        subgroup_cases(rank, world_size, check)
        summaries["subgroup"] = check.summary()
    if world_size == 2:
        summaries["mismatches"] = mismatches(rank, world_size)
    dist.destroy_process_group()
    return summaries
