"""Functions run by harness.run_world for test_collectives.py, in each rank's process.

Each joins the default group through the TCPStore the test hosts, runs its cases and
returns a JSON-able summary. Inputs are small integers (exact in every dtype, so float
results are exact too) derived from (rank, count, dtype, op, salt), so every rank can
compute every other rank's input and the expected results locally; results are compared
bit for bit.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from datetime import timedelta

import numpy as np
import torch

import ringtree as dist
from reduction_reference import (AVG, BAND, BITWISE, BOR, BXOR, MAX, MIN, PREMUL_FACTOR, PREMUL_SUM, PRODUCT, SUM,
                                 bits, expected_reduction)

ReduceOp = dist.ReduceOp
ALL_OPS = [SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM]

TORCH_DTYPES = [
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
]
NUMPY_DTYPES = [d for d in TORCH_DTYPES if d is not torch.bfloat16]  # NumPy has no bfloat16
COUNTS = [0, 1, 7, 1023, 300000]
LARGE = 300000


def valid_ops(dtype: torch.dtype) -> list:
    """torch.distributed's rules (supports_complex) plus ringtree's: no AVG/PREMUL_SUM on bool."""
    if dtype is torch.bool:
        return [SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR]
    if dtype.is_complex:
        return [SUM, AVG, PREMUL_SUM]
    if dtype.is_floating_point:
        return [SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM]
    return list(ALL_OPS)


@functools.cache
def _bank(dtype: torch.dtype, kind: str, span: int, low: int, scale: int) -> torch.Tensor:
    """A periodic sequence, long enough for any count at any offset below 256, converted
    to dtype once: inputs are slices of it (cheap even for 300000 elements)."""
    k = torch.arange(LARGE + 256, dtype=torch.int64)
    if kind == "bits":  # any bit pattern: narrowing conversions wrap
        return ((k * 1103515245 + 12345) % (1 << 62)).to(dtype)
    values = (k % span + low) * scale
    if kind == "bool":
        return values != 0
    if dtype.is_complex:
        return torch.complex(values.double(), values.roll(-3).double()).to(dtype)
    return values.to(dtype)


def make_input(rank: int, world_size: int, count: int, dtype: torch.dtype, op, salt: int) -> torch.Tensor:
    """Rank's input for one case (a view: clone it before writing)."""
    offset = (rank * 37 + salt) % 251
    if dtype is torch.bool:
        return _bank(dtype, "bool", world_size + 1, 0, 1)[offset:offset + count]
    if op in BITWISE:
        return _bank(dtype, "bits", 0, 0, 1)[offset:offset + count]
    low, high = (-2, 2) if op == PRODUCT else (-3, 3)
    if dtype is torch.uint8:
        low, high = 0, high - low
    scale = world_size if op == AVG else 1  # the sum divides exactly by the number of ranks
    return _bank(dtype, "small", high - low + 1, low, scale)[offset:offset + count]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def op_argument(op, case: int):
    """Alternates between the two forms torch accepts: the enum member and a ReduceOp."""
    if op == PREMUL_SUM:
        return ReduceOp(PREMUL_SUM, PREMUL_FACTOR)
    return op if case % 2 == 0 else ReduceOp(op)


def mode(async_op: bool) -> str:
    """How a case ran, for its name."""
    return "async" if async_op else "sync"


def run(fn, *args, async_op: bool, **kwargs) -> None:
    if not async_op:
        result = fn(*args, **kwargs)
        assert result is None, result
        return
    work = fn(*args, async_op=True, **kwargs)
    assert isinstance(work, dist.Work), work
    assert work.wait() is True
    assert work.is_completed() and work.is_success() and work.exception() is None


def init(rank: int, world_size: int, port: int, timeout_s: float = 60.0) -> None:
    torch.set_num_threads(1)  # the ranks share two cores
    store = dist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def last_collective() -> str:
    """The description of the default group's latest collective call, from the flight
    recorder (it names the algorithm that ran, the dtype, count, op and root)."""
    try:
        entries = dist.dump_flight_recorder()
    except Exception as exc:  # noqa: BLE001 - only decorates a failure report
        return f"no flight record ({type(exc).__name__})"
    return entries[-1]["description"] if entries else "no collective recorded"


class Checker:
    """Counts the cases run and the ones that failed; keeps the names of the first
    KEPT failures, each with the collective call that ran last (last_collective()), so
    that a report says which case failed and which algorithm ran it."""

    KEPT = 20

    def __init__(self) -> None:
        self.cases = 0
        self.failed = 0
        self.failures: list[str] = []

    def __call__(self, ok: bool, what: str) -> None:
        self.cases += 1
        if ok:
            return
        self.failed += 1
        if len(self.failures) < self.KEPT:
            self.failures.append(f"{what} [last call: {last_collective()}]")

    def summary(self) -> dict:
        """The JSON-able result a test reports with harness.failed_cases()."""
        return {"cases": self.cases, "failed": self.failed, "failures": self.failures}


def expect_raises(check: Checker, name: str, error: type, call) -> None:
    """Checks that call() raises ``error`` (reported under ``name`` either way)."""
    try:
        call()
    except error:
        check(True, name)
    except Exception as exc:  # noqa: BLE001 - reported
        check(False, f"{name}: raised {type(exc).__name__}: {exc}")
    else:
        check(False, f"{name}: did not raise")


def torch_grid(rank: int, world_size: int, check: Checker) -> None:
    """Every collective x dtype x valid op x count x root, sync and async alternately."""
    case = 0
    for dtype in TORCH_DTYPES:
        for count in COUNTS:
            for root in (range(world_size) if count < LARGE else [case % world_size]):
                case += 1
                t = make_input(rank, world_size, count, dtype, SUM, case).clone()
                ptr = t.data_ptr()
                run(dist.broadcast, t, src=root, async_op=case % 2 == 1)
                expected = make_input(root, world_size, count, dtype, SUM, case)
                check(same_bits(t, expected) and t.data_ptr() == ptr,
                      f"broadcast {dtype} n={count} src={root} {mode(case % 2 == 1)}")
            for op in valid_ops(dtype):
                case += 1
                stack = torch.stack([make_input(r, world_size, count, dtype, op, case) for r in range(world_size)])
                expected = expected_reduction(stack, op, world_size)
                t = stack[rank].clone()
                ptr = t.data_ptr()
                run(dist.all_reduce, t, op_argument(op, case), async_op=case % 2 == 1)
                check(same_bits(t, expected) and t.data_ptr() == ptr,
                      f"all_reduce {dtype} {op.name} n={count} {mode(case % 2 == 1)}")
                roots = range(world_size) if count < LARGE else [case % world_size]
                for root in roots:
                    t = stack[rank].clone()
                    run(dist.reduce, t, dst=root, op=op_argument(op, case + root), async_op=(case + root) % 2 == 0)
                    want = expected if rank == root else stack[rank]
                    check(same_bits(t, want),
                          f"reduce {dtype} {op.name} n={count} dst={root} {mode((case + root) % 2 == 0)}")


def numpy_grid(rank: int, world_size: int, check: Checker) -> None:
    """The same collectives on NumPy arrays (DLPack capsules rather than torch's C table)."""
    case = 0
    for dtype in NUMPY_DTYPES:
        for count in COUNTS[:-1]:
            case += 1
            root = case % world_size
            a = make_input(rank, world_size, count, dtype, SUM, case).numpy().copy()
            run(dist.broadcast, a, src=root, async_op=case % 2 == 1)
            expected = make_input(root, world_size, count, dtype, SUM, case)
            check(same_bits(torch.from_numpy(a), expected),
                  f"numpy broadcast {dtype} n={count} src={root} {mode(case % 2 == 1)}")
            for op in valid_ops(dtype):
                case += 1
                stack = torch.stack([make_input(r, world_size, count, dtype, op, case) for r in range(world_size)])
                expected = expected_reduction(stack, op, world_size)
                a = stack[rank].numpy().copy()
                run(dist.all_reduce, a, op_argument(op, case), async_op=case % 2 == 1)
                check(same_bits(torch.from_numpy(a), expected),
                      f"numpy all_reduce {dtype} {op.name} n={count} {mode(case % 2 == 1)}")
                root = case % world_size
                a = stack[rank].numpy().copy()
                run(dist.reduce, a, dst=root, op=op_argument(op, case), async_op=case % 2 == 0)
                want = expected if rank == root else stack[rank]
                check(same_bits(torch.from_numpy(a), want),
                      f"numpy reduce {dtype} {op.name} n={count} dst={root} {mode(case % 2 == 0)}")


def ordering(rank: int, world_size: int, check: Checker) -> None:
    """Async ops queue in submission order; a sync call queues behind them."""
    ts = [torch.full((1023,), float(rank + k)) for k in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    chained = torch.full((5,), 1.0)
    works.append(dist.all_reduce(chained, async_op=True))
    dist.all_reduce(chained)  # runs after the async one on the same buffer: (n) * n
    for work in works:
        work.wait()
    base = sum(range(world_size))
    check(all(torch.equal(t, torch.full((1023,), float(base + k * world_size))) for k, t in enumerate(ts)),
          "async all_reduces in order")
    check(torch.equal(chained, torch.full((5,), float(world_size * world_size))), "sync call queued behind async")
    barrier_work = dist.barrier(async_op=True)
    check(isinstance(barrier_work, dist.Work) and barrier_work.wait() is True, "async barrier")
    check(dist.barrier(timeout=timedelta(seconds=30)) is None, "barrier with a timeout")


def fast_path(rank: int, world_size: int, check: Checker) -> None:
    """A synchronous call on an idle group runs on the calling thread; one submitted while
    async work is pending is queued behind it (checked on rank 0, whose async work cannot
    finish before the other ranks, held back here, join it)."""
    engine = dist.group.WORLD._engine
    t = torch.ones(2)
    before = engine._inline_call_count
    dist.all_reduce(t)
    check(engine._inline_call_count == before + 1, "idle sync all_reduce ran inline")
    calls = 1
    if world_size > 1:
        if rank != 0:
            time.sleep(0.2)
        pending = dist.all_reduce(torch.ones(8), async_op=True)
        before = engine._inline_call_count
        dist.all_reduce(t)
        calls += 1
        if rank == 0:
            check(engine._inline_call_count == before, "sync all_reduce behind pending async work was queued")
        pending.wait()
        before = engine._inline_call_count
        dist.all_reduce(t)
        calls += 1
        check(engine._inline_call_count == before + 1, "sync all_reduce after a queued one ran inline")
    check(torch.equal(t, torch.full((2,), float(world_size**calls))), "fast-path results")


def invalid_calls(rank: int, world_size: int, check: Checker) -> None:
    """Each raises before any data moves: the buffers are untouched and the group still
    works afterwards (a collective that had sent anything would make the next one fail)."""
    f = torch.arange(4, dtype=torch.float32)
    c = torch.ones(3, dtype=torch.complex64)
    read_only = np.arange(3.0)
    read_only.flags.writeable = False
    cases = [
        ("complex MAX", lambda: dist.all_reduce(c, op=MAX), ValueError),
        ("complex PRODUCT async", lambda: dist.all_reduce(c, op=PRODUCT, async_op=True), ValueError),
        ("complex BXOR reduce", lambda: dist.reduce(c, dst=0, op=BXOR), ValueError),
        ("float BAND", lambda: dist.all_reduce(f, op=BAND), ValueError),
        ("bool AVG", lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=AVG), ValueError),
        ("PREMUL_SUM without factor", lambda: dist.all_reduce(f, op=PREMUL_SUM), ValueError),
        ("non-contiguous", lambda: dist.all_reduce(torch.ones(3, 4).T), ValueError),
        ("read-only numpy", lambda: dist.all_reduce(read_only), ValueError),
        ("requires_grad", lambda: dist.all_reduce(torch.ones(3, requires_grad=True)), ValueError),
        ("conj bit", lambda: dist.all_reduce(c.conj()), ValueError),
        ("neg bit", lambda: dist.all_reduce(torch._neg_view(f)), ValueError),
        ("uint16", lambda: dist.all_reduce(torch.ones(3, dtype=torch.uint16)), TypeError),
        ("meta device", lambda: dist.all_reduce(torch.ones(3, device="meta")), ValueError),
        ("src out of range", lambda: dist.broadcast(f, src=world_size), ValueError),
        ("group_src out of range", lambda: dist.broadcast(f, group_src=-1), ValueError),
        ("src and group_src", lambda: dist.broadcast(f, src=0, group_src=0), ValueError),
        ("no src", lambda: dist.broadcast(f), ValueError),
        ("dst out of range async", lambda: dist.reduce(f, dst=world_size + 3, async_op=True), ValueError),
        ("not a buffer", lambda: dist.all_reduce([1.0, 2.0]), TypeError),
    ]
    for name, call, error in cases:
        expect_raises(check, name, error, call)
    check(torch.equal(f, torch.arange(4, dtype=torch.float32)) and torch.equal(c, torch.ones(3, dtype=torch.complex64)),
          "buffers untouched by invalid calls")
    t = torch.full((7,), float(rank))
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((7,), float(sum(range(world_size))))), "group usable after invalid calls")


def grid(rank: int, world_size: int, port: int, transports: list[str]) -> dict:
    """Runs every case once per transport, each over a new default group created with
    RINGTREE_TRANSPORT set to it; returns per transport the cases, the failures and how
    this rank reached its peers."""
    summaries = {}
    for transport in transports:
        os.environ["RINGTREE_TRANSPORT"] = transport
        init(rank, world_size, port)
        check = Checker()
        communicator = dist.group.WORLD._engine.communicator
        reached = sorted({communicator.transport_to(peer) for peer in range(world_size) if peer != rank})
        invalid_calls(rank, world_size, check)
        fast_path(rank, world_size, check)
        ordering(rank, world_size, check)
        torch_grid(rank, world_size, check)
        numpy_grid(rank, world_size, check)
        dist.destroy_process_group()
        summaries[transport] = {**check.summary(), "reached": reached}
    return summaries


def world(rank: int, world_size: int, port: int, transports: list[str], failure_cases: bool) -> dict:
    """grid(), then (two ranks only) waits_timeouts_and_mismatch(): one process start-up
    for both, as importing torch is the slow part."""
    result = {"grid": grid(rank, world_size, port, transports)}
    if failure_cases:
        result["failure_cases"] = waits_timeouts_and_mismatch(rank, world_size, port)
    return result


def waits_timeouts_and_mismatch(rank: int, world_size: int, port: int) -> dict:
    """Two ranks, rank 1 held back each time: blocking calls release the GIL, Work.wait
    times out while the collective keeps running, barrier(timeout=) expires. Then, over a
    new group, the ranks disagree on an element count: CollectiveMismatchError, raised
    by Work.wait() and returned by Work.exception()."""
    init(rank, world_size, port, timeout_s=30.0)
    # Rank 0 says here when its timeouts have expired; rank 1 waits for that instead of
    # sleeping a guess, so the timeouts expire however slow the machine is.
    control = dist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=30))
    out: dict = {}
    # A Python thread keeps running while this thread blocks in a collective.
    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1

    thread = threading.Thread(target=spin)
    if rank == 1:
        time.sleep(0.5)
    else:
        thread.start()
    dist.barrier()
    out["spins_during_barrier"] = counter[0]
    stop.set()
    if rank == 0:
        thread.join()

    # Work.wait(timeout) expires; the all_reduce goes on and completes later.
    t = torch.full((1023,), float(rank + 1))
    if rank == 1:
        control.wait(["failure_cases/wait_expired"])
    work = dist.all_reduce(t, async_op=True)
    if rank == 0:
        try:
            work.wait(timedelta(milliseconds=50))
            out["wait_timeout"] = None
        except dist.DistTimeoutError as exc:
            out["wait_timeout"] = str(exc)
        control.set("failure_cases/wait_expired", "1")
    out["completed_after_timeout"] = work.wait() is True and torch.equal(t, torch.full((1023,), 3.0))

    # barrier(timeout=) expires on rank 0 while rank 1 is away.
    if rank == 1:
        control.wait(["failure_cases/barrier_expired"])
    start = time.monotonic()
    try:
        dist.barrier(timeout=timedelta(milliseconds=300) if rank == 0 else timedelta(seconds=3))
        out["barrier_error"] = None
    except dist.DistError as exc:
        out["barrier_error"] = type(exc).__name__
    out["barrier_elapsed"] = time.monotonic() - start
    if rank == 0:
        control.set("failure_cases/barrier_expired", "1")
    dist.destroy_process_group()

    init(rank, world_size, port, timeout_s=10.0)
    work = dist.all_reduce(torch.ones(3 + rank), async_op=True)
    try:
        work.wait()
        out["mismatch_raised"] = None
    except dist.DistError as exc:
        out["mismatch_raised"] = type(exc).__name__
        out["mismatch_is_value_error"] = isinstance(exc, ValueError)
    stored = work.exception()
    out["mismatch_stored"] = type(stored).__name__ if stored is not None else None
    out["mismatch_state"] = [work.is_completed(), work.is_success()]
    dist.destroy_process_group()
    return out
