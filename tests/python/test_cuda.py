"""ringtree's CUDA path on a real GPU (the whole module is skipped without one: torch must
see a CUDA device and ringtree.cuda.is_available() must hold).

- The reduction kernels (ringtree._C._cuda_reduce/_cuda_scale/_cuda_divide) against the
  CPU engine's semantics, for every (dtype, op) pair the engine supports, at counts
  {0, 1, 7, 1000, 2^20 + 3}, at element offsets that leave the buffers off 16-byte
  boundaries, with guard elements that must not change; and their refusals.
- One rank with NCCL: every collective on torch CUDA tensors (every dtype and op for
  all_reduce, NCCL's own and the ones ringtree's kernels do), results against the host;
  stream ordering (producer, collective and consumer on a side stream, no device-wide
  synchronisation); CuPy arrays; groups created with backend "nccl".
- Ranks sharing one GPU (staged through host memory) at 2 and 4 ranks: every collective
  and point-to-point call, in real processes (cuda_workers.py); forcing NCCL there is
  refused; a rank killed in the middle of collectives fails the others fast, naming it.
- torch's DDP on CUDA tensors over the torch backend "ringtree" (one rank on NCCL, two
  sharing the GPU), against torch's own backend in the same processes.

Runs under pytest, or as a program without it (``python tests/python/test_cuda.py``,
through plain_runner.py): one line per test, exit status 1 when one failed.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":
    import plain_runner as pytest
else:
    import pytest

torch = pytest.importorskip("torch")

import ringtree as dist  # noqa: E402
import ringtree.cuda  # noqa: E402
from ringtree import _C  # noqa: E402


def _skip_reason() -> str:
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    if not ringtree.cuda.is_available():
        return "ringtree's CUDA path is unavailable: " + ringtree.cuda.unavailable_reason()
    return ""


if _skip_reason():
    pytest.skip(_skip_reason(), allow_module_level=True)

import cuda_workers as workers  # noqa: E402
from harness import PROMPT_S, failed_cases, free_port, read_result, run_world, start_world  # noqa: E402

ReduceOp = dist.ReduceOp
SUM, AVG, PRODUCT, MIN, MAX = ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX
BAND, BOR, BXOR, PREMUL_SUM = ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR, ReduceOp.PREMUL_SUM
ALL_OPS = [SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM]

NCCL = ringtree.cuda.is_nccl_available()
needs_nccl = pytest.mark.skipif(not NCCL, reason=f"no usable NCCL: {ringtree.cuda.unavailable_reason()}")

# What the workers of ranks sharing GPU 0 get: the automatic choice must pick staging, and
# says so at log level info.
SHARED_GPU_ENV = {"LOCAL_RANK": "0", "RINGTREE_CUDA_BACKEND": "auto", "RINGTREE_LOG_LEVEL": "info"}
STAGED_NOTE = "staged through host memory"


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


# --- the kernels against the CPU engine ------------------------------------------------------

# ringtree's DataType values and names, with the torch dtype of the buffers (bool is held
# as uint8 bytes, so that bytes other than 0 and 1 can be given: any non-zero byte is true).
KERNEL_TYPES = {
    "float16": (0, torch.float16), "bfloat16": (1, torch.bfloat16), "float32": (2, torch.float32),
    "float64": (3, torch.float64), "int8": (4, torch.int8), "uint8": (5, torch.uint8), "int16": (6, torch.int16),
    "int32": (7, torch.int32), "int64": (8, torch.int64), "bool": (9, torch.uint8),
    "complex64": (10, torch.complex64), "complex128": (11, torch.complex128),
}
HALF_TYPES = ("float16", "bfloat16")
NARROW_INTEGERS = ("int8", "uint8", "int16", "int32")  # exact in int64 arithmetic, then wrapped


def _engine_supports(name: str, op) -> bool:
    try:
        _C._check_reduction("test", name, int(op))
    except ValueError:
        return False
    return True


SUPPORTED = [(name, op) for name in KERNEL_TYPES for op in ALL_OPS if _engine_supports(name, op)]
UNSUPPORTED = [(name, op) for name in KERNEL_TYPES for op in ALL_OPS if not _engine_supports(name, op)]
KERNEL_COUNTS = [0, 1, 7, 1000, (1 << 20) + 3]
# Element offsets of (inout, in) from the start of their allocations (which torch aligns
# to 512 bytes): aligned, equally misaligned, and differently misaligned.
KERNEL_OFFSETS = [(0, 0), (1, 1), (0, 3), (5, 2)]
GUARD = 8  # elements after each buffer that the kernel must leave alone
BANK = max(KERNEL_COUNTS) + 8 + GUARD


@functools.cache
def _operands(name: str) -> tuple:
    """Two host tensors (inout and in) of BANK elements of type `name`: multiples of 1/4 in
    [-16, 16] for floating types (ties, zeros of both signs, exact sums) with NaN, +-inf,
    values near float16's largest and float16 subnormals at scattered places; any bit
    pattern for integers; bytes 0, 1, 2 and 255 for bool."""
    code, dtype = KERNEL_TYPES[name]
    g = torch.Generator().manual_seed(20261201 + code)

    def quarters() -> torch.Tensor:
        return torch.randint(-64, 65, (BANK,), generator=g, dtype=torch.int64).double() / 4

    def make(specials: dict) -> torch.Tensor:
        if name == "bool":
            choices = torch.tensor([0, 1, 2, 255], dtype=torch.uint8)
            return choices[torch.randint(0, 4, (BANK,), generator=g)]
        if dtype.is_complex:
            return torch.complex(quarters(), quarters()).to(dtype)
        if dtype.is_floating_point:
            x = quarters()
            for (start, step), value in specials.items():
                x[start::step] = value
            return x.to(dtype)
        return torch.randint(-(2**63), 2**63 - 1, (BANK,), generator=g, dtype=torch.int64).to(dtype)

    nan, inf = math.nan, math.inf
    a = make({(3, 97): nan, (7, 83): inf, (13, 71): -0.0, (29, 59): -inf, (31, 101): 6.0e4, (41, 107): 3 * 2.0**-20})
    b = make({(5, 89): nan, (11, 79): -inf, (19, 61): -0.0, (23, 53): inf, (37, 103): 6.0e4, (43, 109): -(2.0**-22)})
    return a, b


def _reference(a: torch.Tensor, b: torch.Tensor, name: str, op) -> torch.Tensor:
    """inout (a) op in (b), as the CPU engine defines it (algorithms/reduce_ops.h): half
    types combined in float32 and rounded once; MIN/MAX propagate NaN (inout's first) and
    give in's element on ties; integers wrap; bool bytes are true when non-zero and results
    are 0 or 1; AVG and PREMUL_SUM reduce as SUM."""
    if name == "bool":
        x, y = a != 0, b != 0
        if op in (SUM, MAX, BOR):
            return (x | y).to(torch.uint8)
        if op in (PRODUCT, MIN, BAND):
            return (x & y).to(torch.uint8)
        return (x ^ y).to(torch.uint8)
    if op in (BAND, BOR, BXOR):
        return {BAND: torch.bitwise_and, BOR: torch.bitwise_or, BXOR: torch.bitwise_xor}[op](a, b)
    if op in (MIN, MAX):
        wa, wb = (a.float(), b.float()) if name in HALF_TYPES else (a, b)
        r = torch.where(wb <= wa if op == MIN else wb >= wa, b, a)
        if a.is_floating_point():
            r = torch.where(torch.isnan(wb), b, r)
            r = torch.where(torch.isnan(wa), a, r)
        return r
    fn = torch.mul if op == PRODUCT else torch.add
    if name in HALF_TYPES:
        return fn(a.float(), b.float()).to(a.dtype)
    if name in NARROW_INTEGERS:
        return fn(a.long(), b.long()).to(a.dtype)
    return fn(a, b)


def _mismatch(got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when equal bit for bit (any NaN equals any NaN), else where and how they differ."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {tuple(got.shape)} {got.dtype} != {tuple(want.shape)} {want.dtype}"
    g, w = (torch.view_as_real(got), torch.view_as_real(want)) if got.is_complex() else (got, want)
    if g.is_floating_point():
        nan_g, nan_w = torch.isnan(g), torch.isnan(w)
        lanes = {2: torch.int16, 4: torch.int32, 8: torch.int64}[g.element_size()]
        differ = (nan_g != nan_w) | (~nan_g & ~nan_w & (g.view(lanes) != w.view(lanes)))
    else:
        differ = g != w
    if got.is_complex():
        differ = differ.any(-1)
    if not bool(differ.any()):
        return ""
    where = torch.nonzero(differ).flatten()
    i = int(where[0])
    return f"{where.numel()} elements differ, first at {i}: got {got[i].item()!r}, want {want[i].item()!r}"


@pytest.mark.parametrize("name,op", SUPPORTED, ids=[f"{n}-{ReduceOp.RedOpType(o).name}" for n, o in SUPPORTED])
def test_reduce_kernel_matches_the_cpu_engine(name, op):
    code, _ = KERNEL_TYPES[name]
    a, b = _operands(name)
    problems = []
    for count in KERNEL_COUNTS:
        for off_a, off_b in KERNEL_OFFSETS:
            span_a, span_b = off_a + count + GUARD, off_b + count + GUARD
            inout, source = a[:span_a].to("cuda", copy=True), b[:span_b].to("cuda", copy=True)
            _C._cuda_reduce(inout[off_a:].data_ptr(), source[off_b:].data_ptr(), count, code, int(op), _stream())
            want = a[:span_a].clone()
            want[off_a:off_a + count] = _reference(a[off_a:off_a + count], b[off_b:off_b + count], name, op)
            where = f"count={count} offsets=({off_a}, {off_b})"
            if problem := _mismatch(inout.cpu(), want):
                problems.append(f"{where}: inout: {problem}")
            if problem := _mismatch(source.cpu(), b[:span_b]):
                problems.append(f"{where}: the input changed: {problem}")
    assert not problems, "\n".join(problems)


def test_reduce_kernel_refuses_what_the_cpu_engine_refuses():
    buffer = torch.zeros(256, dtype=torch.uint8, device="cuda")
    inout, source = buffer.data_ptr(), buffer.data_ptr() + 128
    unrefused = []
    for name, op in UNSUPPORTED:
        try:
            _C._cuda_reduce(inout, source, 4, KERNEL_TYPES[name][0], int(op), _stream())
        except ValueError as exc:
            if ReduceOp.RedOpType(op).name not in str(exc) or name not in str(exc):
                unrefused.append(f"{name} {ReduceOp.RedOpType(op).name}: the message does not name both: {exc}")
        else:
            unrefused.append(f"{name} {ReduceOp.RedOpType(op).name}: not refused")
    for dtype_value, op_value in ((12, 0), (2, 9), (255, 0)):
        with pytest.raises(ValueError):
            _C._cuda_reduce(inout, source, 4, dtype_value, op_value, _stream())
    assert len(UNSUPPORTED) == 12 * 9 - 82
    assert not unrefused, "\n".join(unrefused)
    assert int(buffer.cpu().sum()) == 0  # nothing was written


SCALE_TYPES = [name for name in KERNEL_TYPES if name != "bool"]


@pytest.mark.parametrize("name", SCALE_TYPES)
def test_scale_and_divide_kernels_match_the_cpu_engine(name):
    code, dtype = KERNEL_TYPES[name]
    a, _ = _operands(name)
    floating = dtype.is_floating_point or dtype.is_complex
    factors = [2.0, -0.5, 0.1, 2.5, 1e3] + ([math.inf] if floating else [])
    divisors = [1, 3, 7, 1 << 20]
    problems = []
    for count in KERNEL_COUNTS:
        for offset in (0, 3):
            span = offset + count + GUARD
            for kind, values in (("scale", factors), ("divide", divisors)):
                for value in values:
                    device = a[:span].to("cuda", copy=True)
                    host = a[:span].clone()
                    if kind == "scale":
                        _C._cuda_scale(device[offset:].data_ptr(), count, code, value, _stream())
                        _C._premultiply(host[offset:].data_ptr(), count, name, value)
                    else:
                        _C._cuda_divide(device[offset:].data_ptr(), count, code, value, _stream())
                        _C._divide_by_ranks(host[offset:].data_ptr(), count, name, value)
                    if problem := _mismatch(device.cpu(), host):
                        problems.append(f"{kind} by {value} count={count} offset={offset}: {problem}")
    assert not problems, "\n".join(problems)


def test_scale_and_divide_kernels_refuse_what_the_cpu_engine_refuses():
    buffer = torch.zeros(64, dtype=torch.int64, device="cuda")
    ptr = buffer.data_ptr()
    with pytest.raises(ValueError, match="bool"):
        _C._cuda_scale(ptr, 4, KERNEL_TYPES["bool"][0], 2.0, _stream())
    with pytest.raises(ValueError, match="bool"):
        _C._cuda_divide(ptr, 4, KERNEL_TYPES["bool"][0], 2, _stream())
    for integer in NARROW_INTEGERS + ("int64",):
        for factor in (math.inf, -math.inf, math.nan):
            with pytest.raises(ValueError):
                _C._cuda_scale(ptr, 4, KERNEL_TYPES[integer][0], factor, _stream())
    for divisor in (0, -3):
        with pytest.raises(ValueError):
            _C._cuda_divide(ptr, 4, KERNEL_TYPES["float32"][0], divisor, _stream())
    assert int(buffer.cpu().abs().sum()) == 0


def test_scale_kernel_refuses_a_non_finite_factor_on_integers_as_the_cpu_engine_does():
    buffer = torch.zeros(4, dtype=torch.int32, device="cuda")
    host = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError):
        _C._premultiply(host.data_ptr(), 4, "int32", math.inf)
    with pytest.raises(ValueError):
        _C._cuda_scale(buffer.data_ptr(), 4, KERNEL_TYPES["int32"][0], math.inf, _stream())


# --- one rank with NCCL ------------------------------------------------------------------------


@contextlib.contextmanager
def _one_rank_group(backend: str | None = None):
    """The default group of this process alone, on GPU 0 (backend None: cpu:gloo and, NCCL
    being available, cuda:nccl)."""
    torch.cuda.set_device(0)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@needs_nccl
def test_nccl_is_found_and_reported():
    major, minor, _ = ringtree.cuda.nccl_version()
    assert (major, minor) >= (2, 10)
    assert os.path.isfile(ringtree.cuda.nccl_path()), ringtree.cuda.nccl_path()
    assert ringtree.cuda.unavailable_reason() == ""
    assert ringtree.cuda.device_count() == torch.cuda.device_count()
    assert dist.is_nccl_available() and dist.is_backend_available("nccl")
    with _one_rank_group():
        assert dist.get_backend_config() == "cpu:gloo,cuda:nccl"


@needs_nccl
def test_one_rank_runs_every_collective_on_cuda_tensors():
    """all_reduce over every dtype x op x count (NCCL's reductions and the ones ringtree's
    kernels do: bitwise ops, integer AVG and PREMUL_SUM, int16, bool), then broadcast,
    reduce, all_gather(_into_tensor), gather, scatter, reduce_scatter(_tensor),
    all_to_all(_single) and barrier, sync and async, against results computed on the host.
    Point-to-point calls need a peer: see the shared-GPU tests."""
    check = workers.Checker()
    with _one_rank_group():
        workers.all_reduce_grid(check, 0, 1, "cuda")
        workers.rooted_and_gathering(check, 0, 1, "cuda")
        for async_op in (False, True):
            check.run(f"barrier async={async_op}", lambda a=async_op: workers.call(dist.barrier, async_op=a) is None)
    summary = check.summary()
    assert not summary["failures"], failed_cases(summary, "one rank on NCCL")
    assert summary["cases"] > 600


SLEEP_CYCLES = 200_000_000  # about 0.1 s of one SM at 2 GHz


@needs_nccl
def test_collectives_follow_the_callers_current_stream():
    """Producer on a side stream made current (a device sleep, then the fill), the
    collective, then a consumer on the same stream, with no synchronisation but the copy
    of the result to the host (which waits for that stream only): the collective reads the
    producer's data and the consumer reads the collective's. A synchronous call returns
    once enqueued: the producer's stream is still busy when it returns."""
    count = 1 << 24  # 64 MiB of float32: the collective takes a while on the device
    stream = torch.cuda.Stream()

    def all_reduce_premul(x, out):
        dist.all_reduce(x, ReduceOp(PREMUL_SUM, 3.0))
        return x, 6.0

    def all_reduce_async(x, out):
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        return x, 2.0

    def all_gather_into_tensor(x, out):
        dist.all_gather_into_tensor(out, x)
        return out, 2.0

    def reduce_scatter_band(x, out):  # a reduction NCCL lacks: ringtree's kernels on int32
        xi, outi = x.to(torch.int32), out.to(torch.int32)
        dist.reduce_scatter_tensor(outi, xi, op=BAND)
        return outi.float(), 2.0

    problems = []
    with _one_rank_group():
        dist.all_reduce(torch.ones(8, device="cuda"))  # the communicator exists before the timed cases
        torch.cuda.synchronize()
        for case in (all_reduce_premul, all_reduce_async, all_gather_into_tensor, reduce_scatter_band):
            with torch.cuda.stream(stream):
                x = torch.full((count,), -1.0, device="cuda")
                out = torch.full((count,), -5.0, device="cuda")
                torch.cuda._sleep(SLEEP_CYCLES)
                x.fill_(2.0)
                result, want = case(x, out)
                still_busy = not stream.query()
                consumed = (result + 1).cpu()
            if case is not all_reduce_async and not still_busy:
                problems.append(f"{case.__name__}: the call returned only after the producer's stream was done")
            wrong = consumed != want + 1
            if bool(wrong.any()):
                problems.append(f"{case.__name__}: {int(wrong.sum())} of {count} elements wrong, values "
                                f"{torch.unique(consumed[wrong])[:8].tolist()}, want {want + 1}")
        torch.cuda.synchronize()
    assert not problems, "\n".join(problems)


@needs_nccl
def test_cpu_tensor_on_a_group_of_backend_nccl_is_refused_as_torch_does():
    with _one_rank_group("nccl"):
        with pytest.raises(ValueError, match="No backend type associated with device type cpu"):
            dist.all_reduce(torch.ones(4))


@needs_nccl
def test_cuda_tensor_on_a_group_of_backend_nccl_is_reduced():
    with _one_rank_group("nccl"):
        t = torch.arange(16, dtype=torch.float32, device="cuda")
        dist.all_reduce(t, ReduceOp(PREMUL_SUM, 2.0))
        assert torch.equal(t.cpu(), torch.arange(16, dtype=torch.float32) * 2)


@needs_nccl
def test_cupy_arrays_are_cuda_buffers():
    cupy = pytest.importorskip("cupy")
    with _one_rank_group():
        expect = cupy.arange(1000, dtype=cupy.float32)
        a = expect.copy()
        dist.all_reduce(a, ReduceOp(PREMUL_SUM, 2.0))
        assert bool((a == expect * 2).all())
        bits = cupy.arange(1000, dtype=cupy.int32) * 7919
        b = bits.copy()
        dist.all_reduce(b, op=BXOR)  # ringtree's kernel path
        assert bool((b == bits).all())
        out = cupy.full(1000, -1.0, dtype=cupy.float32)
        dist.all_gather_into_tensor(out, expect)
        assert bool((out == expect).all())
        out = cupy.full(1000, -1.0, dtype=cupy.float32)
        dist.reduce_scatter_tensor(out, expect, op=MAX)
        assert bool((out == expect).all())
        c = expect.copy()
        work = dist.broadcast(c, src=0, async_op=True)
        assert work.wait() is True
        assert bool((c == expect).all())


# --- ranks sharing one GPU: the staged path ----------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_sharing_one_gpu_run_every_collective_staged(world_size):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = run_world("cuda_workers:staged_collectives", world_size, env=SHARED_GPU_ENV, timeout=180,
                        port=server.port)
    for rank, result in enumerate(results):
        assert STAGED_NOTE in result["stderr"], f"rank {rank} did not report staging:\n{result['stderr'][-3000:]}"
        summary = result["ok"]
        assert not summary["failures"], failed_cases(summary, f"{world_size} ranks on one GPU, rank {rank}")
        assert summary["cases"] > 900


@needs_nccl
def test_forcing_nccl_where_ranks_share_a_gpu_is_refused_naming_them():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = dict(SHARED_GPU_ENV, RINGTREE_CUDA_BACKEND="nccl")
    results = run_world("cuda_workers:first_cuda_call_error", 2, env=env, timeout=90, port=server.port)
    for rank, result in enumerate(results):
        error = result["ok"]
        assert error, f"rank {rank}: an all_reduce on a shared GPU with RINGTREE_CUDA_BACKEND=nccl succeeded"
        assert error["error"] == "DistBackendError", error
        assert "RINGTREE_CUDA_BACKEND=nccl" in error["message"], error
        assert "ranks 0 and 1 share one GPU" in error["message"], error


# --- torch's DDP over the torch backend "ringtree" on CUDA tensors -----------------------------


@pytest.mark.parametrize("world_size", [1, 2])
def test_ddp_on_cuda_over_the_torch_backend_matches_torchs_own(world_size):
    """Every DDP configuration of test_torch_training.py with the model and data on the GPU,
    over backend "ringtree" (NCCL at one rank, staging where two ranks share the GPU) and
    over torch's own backend in the same processes (nccl at one rank, gloo on CUDA tensors
    at two): parameters and buffers equal bit for bit (a sum of two values does not depend
    on its order), and equal across ranks."""
    if world_size == 1 and not NCCL:
        pytest.skip(f"no usable NCCL: {ringtree.cuda.unavailable_reason()}")
    reference = "nccl" if world_size == 1 else "gloo"
    ports = {reference: free_port(), "ringtree": free_port()}
    runs = run_world("torch_training_workers:ddp_cuda", world_size, env=SHARED_GPU_ENV, timeout=240, ports=ports)
    per_rank = [run["ok"] for run in runs]
    for rank, by_backend in enumerate(per_rank):
        for case, outcome in by_backend["ringtree"].items():
            theirs = by_backend[reference][case]
            assert "ok" in theirs, f"{reference} failed {case} on rank {rank}: {theirs['error']}"
            assert "ok" in outcome, f"ringtree failed {case} on rank {rank}: {outcome['error']}"
            assert outcome["ok"] == theirs["ok"], (case, rank)
            assert outcome["ok"]["parameters"] == per_rank[0]["ringtree"][case]["ok"]["parameters"], (case, rank)
    assert len(per_rank[0]["ringtree"]) == 12


def _wait_for(predicate, timeout: float, what: str, procs) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        exited = [p.pid for p in procs if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            outputs = "\n".join(f"--- pid {p.pid} (exit {p.wait()}):\n{p.stdout.read()}\n{p.stderr.read()[-3000:]}"
                                for p in procs)
            raise AssertionError(f"waiting for {what}: " + (f"pids {exited} exited" if exited else "timed out")
                                 + "\n" + outputs)
        time.sleep(0.02)


EXIT_WITHIN_S = 15.0  # from a survivor's result until its process is gone


@pytest.mark.parametrize("fault,world_size,victim", [("kill", 2, 1), ("exit", 3, 0)])
def test_a_rank_dying_mid_collective_on_the_staged_path_fails_the_others_fast(fault, world_size, victim):
    """Every rank runs CUDA all_reduces on one GPU in a loop; the victim is killed (SIGKILL
    from here) or ends its own process (os._exit from a thread) in the middle of them. Each
    other rank's pending or next call, and the call after that, must fail within PROMPT_S
    of the fault with DistNetworkError or DistBackendError naming the victim's rank, and the
    survivors' processes must end."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {k: v for k, v in SHARED_GPU_ENV.items() if k != "RINGTREE_LOG_LEVEL"}
    survivors = [r for r in range(world_size) if r != victim]
    with tempfile.TemporaryDirectory() as marker_dir:
        procs = start_world("cuda_workers:staged_peer_failure", world_size, env=env, port=server.port, victim=victim,
                            fault=fault, marker_dir=marker_dir)
        try:
            _wait_for(lambda: all(Path(marker_dir, f"ready-{r}").exists() for r in range(world_size)), 120,
                      "every rank's loop", procs)
            if fault == "kill":
                time.sleep(0.3)
                fault_at = time.monotonic()
                os.kill(procs[victim].pid, signal.SIGKILL)
            else:
                marker = Path(marker_dir, "fault_at")
                _wait_for(lambda: marker.exists() and marker.read_text().strip() != "", 30, "the victim's exit",
                          [p for r, p in enumerate(procs) if r != victim])
                fault_at = float(marker.read_text())
            problems = []
            for rank in survivors:
                result = read_result(procs[rank], timeout=PROMPT_S + 20)
                if "ok" not in result:
                    problems.append(f"rank {rank} raised {result['error']}: {result['message']}")
                    continue
                for which in ("first", "next"):
                    failure = result["ok"][which]
                    what = f"rank {rank}, the {which} failed call"
                    if failure is None:
                        problems.append(f"{what}: no call failed ({result['ok']['calls']} calls completed)")
                        continue
                    if not {"DistNetworkError", "DistBackendError"} & set(failure["bases"]):
                        problems.append(f"{what}: {failure['error']}: {failure['message']}")
                    if f"rank {victim}" not in failure["message"]:
                        problems.append(f"{what} does not name rank {victim}: {failure['message']}")
                    took = failure["at"] - fault_at
                    if took >= PROMPT_S:
                        problems.append(f"{what} came {took:.2f} s after the fault")
            for rank in survivors:
                try:
                    procs[rank].wait(timeout=EXIT_WITHIN_S)
                except Exception:  # noqa: BLE001 - reported
                    problems.append(f"rank {rank} did not exit within {EXIT_WITHIN_S} s of its result")
            assert not problems, "\n".join(problems)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
                p.stdout.close()
                p.stderr.close()


if __name__ == "__main__":
    import plain_runner

    sys.exit(plain_runner.main(globals()))
