"""Functions run by harness.run_world for test_cuda.py, in each rank's process: ringtree's
collectives on CUDA tensors of ranks that share one GPU (the staged path), checked against
results computed on the host, and a rank that dies in the middle of collectives.

Each joins the default group (default backend) through the TCPStore the test hosts, on
GPU ``LOCAL_RANK``. Inputs are small integers derived from (rank, count, dtype, op, salt),
exact in every dtype, so every rank computes every rank's input and the expected results
locally; results are compared bit for bit. Only torch is needed (no NumPy). ``device`` is
where the tensors live: "cuda" in test_cuda.py; the same code runs on "cpu".
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch

import ringtree as dist
from reduction_reference import (AVG, BAND, BITWISE, BOR, BXOR, MAX, MIN, PREMUL_FACTOR, PREMUL_SUM, PRODUCT, SUM,
                                 bits, expected_reduction)

ReduceOp = dist.ReduceOp
ALL_OPS = [SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM]

DTYPES = [
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
]
# all_reduce runs the whole (dtype x op x count) grid; the other collectives a sample of
# dtypes that covers each kind (half, float, narrow and wide integers, bool, complex).
ALLREDUCE_COUNTS = [0, 1, 7, 1000, 65539]
SAMPLE_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.int64, torch.bool, torch.complex128]
SAMPLE_COUNTS = [1, 1000, 65539]


def valid_ops(dtype: torch.dtype) -> list:
    """The ops ringtree defines on dtype: no AVG/PREMUL_SUM on bool, complex only
    SUM/AVG/PREMUL_SUM, bitwise ops on integers and bool."""
    if dtype is torch.bool:
        return [SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR]
    if dtype.is_complex:
        return [SUM, AVG, PREMUL_SUM]
    if dtype.is_floating_point:
        return [SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM]
    return list(ALL_OPS)


def make_input(rank: int, world_size: int, count: int, dtype: torch.dtype, op, salt: int) -> torch.Tensor:
    """Rank's input of one case, on the host. Values in [-3, 3] ([-2, 2] for PRODUCT, shifted
    to start at 0 for uint8), times world_size for AVG (the sum divides exactly); any bit
    pattern for bitwise ops; for bool, a pattern where every value mix occurs."""
    k = torch.arange(count, dtype=torch.int64) + (rank * 37 + salt * 11) % 251
    if dtype is torch.bool:
        return k % (world_size + 1) != 0
    if op in BITWISE:
        return ((k * 1103515245 + 12345) % (1 << 62)).to(dtype)  # narrowing conversions wrap
    low, high = (-2, 2) if op == PRODUCT else (-3, 3)
    if dtype is torch.uint8:
        low, high = 0, high - low
    scale = world_size if op == AVG else 1

    def values(shift: int) -> torch.Tensor:
        return ((k + shift) % (high - low + 1) + low) * scale

    if dtype.is_complex:
        return torch.complex(values(0).double(), values(3).double()).to(dtype)
    return values(0).to(dtype)


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit-for-bit equality of a device result (copied to the host here) and a host one."""
    got = got.cpu()
    return got.dtype == want.dtype and got.shape == want.shape and torch.equal(bits(got), bits(want))


def op_argument(op):
    return ReduceOp(PREMUL_SUM, PREMUL_FACTOR) if op == PREMUL_SUM else op


def op_name(op) -> str:
    return ReduceOp.RedOpType(op).name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class Checker:
    """Counts cases and failures, keeping the names of the first KEPT failures (the
    summary is what harness.failed_cases formats)."""

    KEPT = 20

    def __init__(self) -> None:
        self.cases = 0
        self.failed = 0
        self.failures: list[str] = []

    def __call__(self, ok: bool, what: str) -> None:
        self.cases += 1
        if not ok:
            self.failed += 1
            if len(self.failures) < self.KEPT:
                self.failures.append(what)

    def run(self, what: str, case) -> None:
        """case() returns whether it passed; an exception fails the case (named in it)."""
        try:
            ok = bool(case())
        except Exception as exc:  # noqa: BLE001 - reported as the case's failure
            self(False, f"{what}: raised {type(exc).__name__}: {exc}")
            return
        self(ok, what)

    def summary(self) -> dict:
        return {"cases": self.cases, "failed": self.failed, "failures": self.failures}


COMPLETION_S = 30.0  # how long a waited-for Work may take to report its completion


def call(fn, *args, async_op: bool, **kwargs):
    """fn(*args, **kwargs) synchronously, or asynchronously and then waited for; returns
    what a synchronous call returns (recv's sender). On CUDA buffers wait() only makes the
    current stream wait (torch's NCCL semantics): the Work reports completion once the GPU
    finished it, which must come within COMPLETION_S, and then success."""
    if not async_op:
        return fn(*args, **kwargs)
    work = fn(*args, async_op=True, **kwargs)
    assert work.wait() is True, "wait() did not return True"
    deadline = time.monotonic() + COMPLETION_S
    while not work.is_completed():
        assert time.monotonic() < deadline, f"not completed {COMPLETION_S:g} s after wait()"
        time.sleep(0.0005)
    assert work.is_success(), f"completed without success: {work.exception()!r}"
    return None


def join(rank: int, world_size: int, port: int, device: str, timeout_s: float = 60.0) -> None:
    """Joins the default group (default backend: CUDA tensors go to ringtree's CUDA path)
    through the test's TCPStore; on "cuda", first selects GPU LOCAL_RANK."""
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # all_gather_into_tensor and reduce_scatter_tensor are called by torch's names on purpose.
    warnings.filterwarnings("ignore", message=r".*is deprecated", category=FutureWarning)
    torch.set_num_threads(1)  # the ranks share the machine's cores
    store = dist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))


# --- every collective on the shared-GPU path ------------------------------------------------


def all_reduce_grid(check: Checker, rank: int, ws: int, device: str) -> None:
    case = 0
    for dtype in DTYPES:
        for op in valid_ops(dtype):
            for count in ALLREDUCE_COUNTS:
                case += 1
                async_op = case % 2 == 1
                inputs = [make_input(r, ws, count, dtype, op, case) for r in range(ws)]
                want = expected_reduction(torch.stack(inputs), op, ws)
                what = f"all_reduce {dtype_name(dtype)} {op_name(op)} count={count} async={async_op}"

                def run(inputs=inputs, want=want, op=op, async_op=async_op) -> bool:
                    t = inputs[rank].to(device, copy=True)
                    call(dist.all_reduce, t, op_argument(op), async_op=async_op)
                    return same(t, want)

                check.run(what, run)


def rooted_and_gathering(check: Checker, rank: int, ws: int, device: str) -> None:
    """broadcast, reduce, all_gather(_into_tensor), gather, scatter, reduce_scatter(_tensor),
    all_to_all(_single), on the sample dtypes and counts, sync and async alternately."""
    case = 1000
    for dtype in SAMPLE_DTYPES:
        reduce_ops = [op for op in (SUM, MAX, BAND, AVG) if op in valid_ops(dtype)]
        for count in SAMPLE_COUNTS:
            case += 1
            a = case % 2 == 1
            parts = [make_input(r, ws, count, dtype, SUM, case) for r in range(ws)]
            name = f"{dtype_name(dtype)} count={count} async={a}"

            for root in range(ws):
                def bcast(root=root) -> bool:
                    t = parts[rank].to(device, copy=True)
                    call(dist.broadcast, t, src=root, async_op=a)
                    return same(t, parts[root])

                check.run(f"broadcast root={root} {name}", bcast)

            for op in reduce_ops:
                inputs = [make_input(r, ws, count, dtype, op, case) for r in range(ws)]
                want = expected_reduction(torch.stack(inputs), op, ws)
                for root in range(ws):
                    def reduce(inputs=inputs, want=want, op=op, root=root) -> bool:
                        t = inputs[rank].to(device, copy=True)
                        call(dist.reduce, t, dst=root, op=op_argument(op), async_op=a)
                        return rank != root or same(t, want)  # other ranks' buffers: unspecified

                    check.run(f"reduce {op_name(op)} root={root} {name}", reduce)

                # reduce_scatter: rank r's input is ws chunks of `count`; chunk q reduces into rank q.
                chunks = [[make_input(r, ws, count, dtype, op, case * 7 + q) for q in range(ws)] for r in range(ws)]
                want_part = expected_reduction(torch.stack([chunks[r][rank] for r in range(ws)]), op, ws)

                def reduce_scatter(chunks=chunks, want_part=want_part, op=op) -> bool:
                    out = torch.empty(count, dtype=dtype, device=device)
                    call(dist.reduce_scatter, out, [c.to(device, copy=True) for c in chunks[rank]], op=op_argument(op),
                         async_op=a)
                    return same(out, want_part)

                def reduce_scatter_tensor(chunks=chunks, want_part=want_part, op=op) -> bool:
                    out = torch.empty(count, dtype=dtype, device=device)
                    call(dist.reduce_scatter_tensor, out, torch.cat(chunks[rank]).to(device, copy=True),
                         op=op_argument(op), async_op=a)
                    return same(out, want_part)

                check.run(f"reduce_scatter {op_name(op)} {name}", reduce_scatter)
                check.run(f"reduce_scatter_tensor {op_name(op)} {name}", reduce_scatter_tensor)

            def all_gather() -> bool:
                outs = [torch.empty(count, dtype=dtype, device=device) for _ in range(ws)]
                call(dist.all_gather, outs, parts[rank].to(device, copy=True), async_op=a)
                return all(same(o, p) for o, p in zip(outs, parts))

            def all_gather_into_tensor() -> bool:
                out = torch.empty(ws * count, dtype=dtype, device=device)
                call(dist.all_gather_into_tensor, out, parts[rank].to(device, copy=True), async_op=a)
                return same(out, torch.cat(parts))

            check.run(f"all_gather {name}", all_gather)
            check.run(f"all_gather_into_tensor {name}", all_gather_into_tensor)

            for root in range(ws):
                def gather(root=root) -> bool:
                    outs = [torch.empty(count, dtype=dtype, device=device) for _ in range(ws)] if rank == root else None
                    call(dist.gather, parts[rank].to(device, copy=True), gather_list=outs, dst=root, async_op=a)
                    return rank != root or all(same(o, p) for o, p in zip(outs, parts))

                # scatter: the root's piece q goes to rank q.
                pieces = [make_input(root, ws, count, dtype, SUM, case * 13 + q) for q in range(ws)]

                def scatter(root=root, pieces=pieces) -> bool:
                    out = torch.empty(count, dtype=dtype, device=device)
                    sources = [p.to(device, copy=True) for p in pieces] if rank == root else None
                    call(dist.scatter, out, scatter_list=sources, src=root, async_op=a)
                    return same(out, pieces[rank])

                check.run(f"gather root={root} {name}", gather)
                check.run(f"scatter root={root} {name}", scatter)

            # all_to_all: rank r sends block[r][q] to rank q.
            blocks = [[make_input(r, ws, count, dtype, SUM, case * 17 + q) for q in range(ws)] for r in range(ws)]

            def all_to_all() -> bool:
                outs = [torch.empty(count, dtype=dtype, device=device) for _ in range(ws)]
                call(dist.all_to_all, outs, [b.to(device, copy=True) for b in blocks[rank]], async_op=a)
                return all(same(outs[q], blocks[q][rank]) for q in range(ws))

            def all_to_all_single() -> bool:
                out = torch.empty(ws * count, dtype=dtype, device=device)
                call(dist.all_to_all_single, out, torch.cat(blocks[rank]).to(device, copy=True), async_op=a)
                return same(out, torch.cat([blocks[q][rank] for q in range(ws)]))

            # Uneven splits: rank r sends count + (r + 2q) % 3 elements to rank q.
            def split(r: int, q: int) -> int:
                return count + (r + 2 * q) % 3

            def sent(r: int, q: int) -> torch.Tensor:
                return make_input(r, ws, split(r, q), dtype, SUM, case * 19 + q)

            def all_to_all_single_uneven() -> bool:
                send = torch.cat([sent(rank, q) for q in range(ws)])
                want = torch.cat([sent(q, rank) for q in range(ws)])
                out = torch.empty(want.numel(), dtype=dtype, device=device)
                call(dist.all_to_all_single, out, send.to(device, copy=True),
                     output_split_sizes=[split(q, rank) for q in range(ws)],
                     input_split_sizes=[split(rank, q) for q in range(ws)], async_op=a)
                return same(out, want)

            check.run(f"all_to_all {name}", all_to_all)
            check.run(f"all_to_all_single {name}", all_to_all_single)
            check.run(f"all_to_all_single uneven splits {name}", all_to_all_single_uneven)


def point_to_point(check: Checker, rank: int, ws: int, device: str) -> None:
    """send/recv around the ring (even ranks send first), recv from any source, isend/irecv,
    batch_isend_irecv both ways round, and barrier."""
    nxt, prev = (rank + 1) % ws, (rank - 1) % ws
    for dtype in SAMPLE_DTYPES:
        for count in SAMPLE_COUNTS:
            mine = make_input(rank, ws, count, dtype, SUM, 5000 + count)
            from_prev = make_input(prev, ws, count, dtype, SUM, 5000 + count)
            from_next = make_input(nxt, ws, count, dtype, SUM, 5000 + count)
            name = f"{dtype_name(dtype)} count={count}"

            def send_recv() -> bool:
                out = torch.empty(count, dtype=dtype, device=device)
                if rank % 2 == 0:
                    dist.send(mine.to(device, copy=True), dst=nxt)
                    sender = dist.recv(out, src=prev)
                else:
                    sender = dist.recv(out, src=prev)
                    dist.send(mine.to(device, copy=True), dst=nxt)
                return sender == prev and same(out, from_prev)

            def recv_any_source() -> bool:
                # Rank 1 sends to rank 0, which names no source (a tag of their own: rank 0
                # may already have messages of the next case from its other neighbour).
                if rank == 1:
                    dist.send(mine.to(device, copy=True), dst=0, tag=7)
                    return True
                if rank == 0:
                    out = torch.empty(count, dtype=dtype, device=device)
                    sender = dist.recv(out, tag=7)
                    return sender == 1 and same(out, make_input(1, ws, count, dtype, SUM, 5000 + count))
                return True

            def isend_irecv() -> bool:
                out = torch.empty(count, dtype=dtype, device=device)
                works = [dist.irecv(out, src=prev), dist.isend(mine.to(device, copy=True), dst=nxt)]
                return all(w.wait() is True for w in works) and same(out, from_prev)

            def batch() -> bool:
                from_p = torch.empty(count, dtype=dtype, device=device)
                from_n = torch.empty(count, dtype=dtype, device=device)
                src = mine.to(device, copy=True)
                ops = [dist.P2POp(dist.irecv, from_p, prev), dist.P2POp(dist.isend, src, nxt),
                       dist.P2POp(dist.isend, src, prev), dist.P2POp(dist.irecv, from_n, nxt)]
                works = dist.batch_isend_irecv(ops)
                for w in works:
                    w.wait()
                # Each op's Work gives its own tensor (NCCL runs the batch as one operation).
                own_tensors = all(w.get_future().wait()[0] is op.tensor for w, op in zip(works, ops))
                # At 2 ranks prev == nxt: the two receives match that rank's two sends in order.
                return own_tensors and same(from_p, from_prev) and same(from_n, from_next)

            check.run(f"send/recv ring {name}", send_recv)
            check.run(f"recv from any source {name}", recv_any_source)
            check.run(f"isend/irecv ring {name}", isend_irecv)
            check.run(f"batch_isend_irecv both ways {name}", batch)
    for a in (False, True):
        check.run(f"barrier async={a}", lambda a=a: call(dist.barrier, async_op=a) is None)


def stream_ordering(check: Checker, rank: int, ws: int) -> None:
    """A producer on a side stream made current, the collective, then a consumer on the
    same stream, with no device-wide synchronisation: the staged path must wait for the
    caller's stream before reading, and its results must be in place for the consumer."""
    count = 1 << 22
    stream = torch.cuda.Stream()
    for a in (False, True):
        with torch.cuda.stream(stream):
            t = torch.full((count,), -1.0, device="cuda")
            torch.cuda._sleep(50_000_000)  # tens of milliseconds of device time before the producer
            t.fill_(float(rank + 1))
            call(dist.all_reduce, t, async_op=a)
            consumed = (t * 2).cpu()  # waits for this stream only
        want = float(sum(r + 1 for r in range(ws)) * 2)
        check(bool(torch.all(consumed == want)),
              f"stream ordering async={a}: got {consumed[:4].tolist()}..., want {want}")


def staged_collectives(rank: int, world_size: int, *, port: int, device: str = "cuda") -> dict:
    """Every collective and point-to-point call on ``device`` tensors; returns the checker's
    summary."""
    join(rank, world_size, port, device)
    check = Checker()
    all_reduce_grid(check, rank, world_size, device)
    rooted_and_gathering(check, rank, world_size, device)
    point_to_point(check, rank, world_size, device)
    if device == "cuda":
        stream_ordering(check, rank, world_size)
    # Host tensors of the same group still run on the CPU engine.
    host = make_input(rank, world_size, 1000, torch.float32, SUM, 9)
    want = expected_reduction(torch.stack([make_input(r, world_size, 1000, torch.float32, SUM, 9)
                                           for r in range(world_size)]), SUM, world_size)
    check.run("all_reduce of a CPU tensor on the same group", lambda: (dist.all_reduce(host), same(host, want))[1])
    dist.barrier()
    dist.destroy_process_group()
    return check.summary()


def first_cuda_call_error(rank: int, world_size: int, *, port: int) -> dict:
    """One all_reduce of a CUDA tensor; returns the error it raised ({} when none)."""
    join(rank, world_size, port, "cuda")
    try:
        dist.all_reduce(torch.ones(4, device="cuda"))
    except Exception as exc:  # noqa: BLE001 - the result
        return {"error": type(exc).__name__, "message": str(exc)}
    return {}


# --- a rank that dies in the middle of collectives ------------------------------------------


def _failure(exc: BaseException) -> dict:
    return {
        "error": type(exc).__name__,
        "bases": [cls.__name__ for cls in type(exc).__mro__],
        "message": str(exc),
        "at": time.monotonic(),
    }


def staged_peer_failure(rank: int, world_size: int, *, port: int, victim: int, fault: str, marker_dir: str,
                        loop_limit_s: float = 30.0, device: str = "cuda") -> dict:
    """Every rank runs 4 MiB CUDA all_reduces in a loop until one fails; rank ``victim``
    dies in the middle of them: ``exit`` -- a thread of its own calls os._exit 0.3 s after
    every rank's loop started, having written the time (time.monotonic(), one clock for every
    process of the machine) to ``marker_dir/fault_at``; ``kill`` -- the test sends SIGKILL.
    Each rank writes ``marker_dir/ready-<rank>`` (its pid) once its loop is about to start.
    Returns the first failed call's error and the next call's (which must fail too)."""
    join(rank, world_size, port, device)
    t = torch.ones(1 << 20, device=device)
    dist.all_reduce(t)  # every rank is connected and has the CUDA backend
    if device == "cuda":
        torch.cuda.synchronize()
    Path(marker_dir, f"ready-{rank}").write_text(str(os.getpid()))
    if rank == victim and fault == "exit":
        def die() -> None:  # once every rank is in its loop
            while not all(Path(marker_dir, f"ready-{r}").exists() for r in range(world_size)):
                time.sleep(0.01)
            time.sleep(0.3)
            Path(marker_dir, "fault_at").write_text(repr(time.monotonic()))
            os._exit(3)

        threading.Thread(target=die, daemon=True).start()
    first = nxt = None
    calls = 0
    deadline = time.monotonic() + loop_limit_s
    while time.monotonic() < deadline:
        try:
            dist.all_reduce(t)
            t.fill_(1.0)
            calls += 1
        except Exception as exc:  # noqa: BLE001 - the result
            first = _failure(exc)
            break
    if first is not None:
        try:
            dist.all_reduce(t)
        except Exception as exc:  # noqa: BLE001 - the result
            nxt = _failure(exc)
    return {"first": first, "next": nxt, "calls": calls}
