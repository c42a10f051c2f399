"""all_reduce, broadcast, reduce and barrier: the full case grid in real processes at world
sizes 1..5 (and over each transport at 3), Work, the synchronous fast path, and buffer
rules (DLPack, buffer protocol, invalid buffers) in this process at world size 1."""

from __future__ import annotations

import array
import ctypes
import functools
import subprocess
import sys
from datetime import timedelta

import numpy as np
import pytest
import torch

import collective_workers
import ringtree as dist
from harness import LATE_BY_S, failed_cases, run_world

# --- the grid, in real processes ---------------------------------------------------------------

# World size -> the transports (RINGTREE_TRANSPORT) it runs the grid over, one group each.
WORLDS = {2: ["auto"], 3: ["tcp", "shm", "auto"], 4: ["auto"], 5: ["auto"]}


@functools.cache
def _world(world_size: int) -> tuple:
    """Runs collective_workers.world once per world size (the two-rank world also runs the
    failure cases) and returns each rank's result."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = run_world("collective_workers:world", world_size, timeout=150, port=server.port,
                        transports=WORLDS[world_size], failure_cases=world_size == 2)
    assert all(r["returncode"] == 0 for r in results)
    return tuple(r["ok"] for r in results)


def _check_grid(summaries: dict, world_size: int, rank: int) -> None:
    for transport, summary in summaries.items():
        assert not summary["failures"], failed_cases(
            summary, f"world of {world_size}, rank {rank} over {transport}")
        assert summary["cases"] > 800
        reached = [] if world_size == 1 else ["shm" if transport == "auto" else transport]
        assert summary["reached"] == reached, transport


def test_collective_grid_world_size_1(monkeypatch):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("RINGTREE_TRANSPORT", "auto")  # grid() sets it; restored afterwards
    _check_grid(collective_workers.grid(0, 1, server.port, ["auto"]), 1, 0)


@pytest.mark.parametrize("world_size", sorted(WORLDS))
def test_collective_grid(world_size):
    for rank, result in enumerate(_world(world_size)):
        _check_grid(result["grid"], world_size, rank)


def test_waits_timeouts_and_mismatch():
    rank0, rank1 = (result["failure_cases"] for result in _world(2))
    assert rank0["spins_during_barrier"] > 1000, "the blocked barrier held the GIL"
    assert rank0["wait_timeout"] is not None and "50 ms" in rank0["wait_timeout"]
    assert rank0["completed_after_timeout"] and rank1["completed_after_timeout"]
    assert rank0["barrier_error"] == "DistTimeoutError"
    # At its 300 ms deadline, not before, and not much later.
    assert 0.25 < rank0["barrier_elapsed"] < 0.3 + LATE_BY_S
    for result in (rank0, rank1):
        assert result["mismatch_raised"] == "CollectiveMismatchError"
        assert result["mismatch_is_value_error"]
        assert result["mismatch_stored"] == "CollectiveMismatchError"
        assert result["mismatch_state"] == [True, False]


# --- world size 1, in this process ------------------------------------------------------------


def test_import_is_light():
    code = "import sys, ringtree; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_names_are_exported():
    for name in ("all_reduce", "broadcast", "reduce", "barrier", "Work", "CollectiveMismatchError"):
        assert name in dist.__all__
    assert issubclass(dist.CollectiveMismatchError, dist.DistError)
    assert issubclass(dist.CollectiveMismatchError, ValueError)


def test_work_api(world1):
    t = torch.arange(4, dtype=torch.float32)
    work = dist.all_reduce(t, op=dist.ReduceOp(dist.ReduceOp.PREMUL_SUM, 3.0), async_op=True)
    assert work.wait(timedelta(seconds=5)) is True
    assert work.wait() is True  # again: still done
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert "all_reduce completed" in repr(work)
    assert torch.equal(t, torch.arange(4, dtype=torch.float32) * 3)
    with pytest.raises(ValueError):
        work.wait(timedelta(seconds=-1))


def test_collectives_return_none_when_sync(world1):
    t = torch.ones(3)
    assert dist.all_reduce(t) is None
    assert dist.broadcast(t, src=0) is None
    assert dist.broadcast(t, group_src=0) is None
    assert dist.reduce(t, dst=0) is None
    assert dist.reduce(t, group_dst=0) is None
    assert dist.barrier() is None
    assert dist.barrier(device_ids=[0]) is None


def test_sync_call_on_idle_group_runs_inline(world1):
    engine = world1._engine
    before = engine._inline_call_count
    for _ in range(10):
        dist.all_reduce(torch.ones(2))
    assert engine._inline_call_count == before + 10
    dist.all_reduce(torch.ones(2), async_op=True).wait()
    assert engine._inline_call_count == before + 10


def test_buffer_protocol_objects(world1):
    ba = bytearray(b"\x01\x02\x03")
    dist.all_reduce(ba, op=dist.ReduceOp.MAX)
    assert ba == bytearray(b"\x01\x02\x03")
    arr = array.array("d", [1.0, 2.0])
    dist.all_reduce(arr, op=dist.ReduceOp(dist.ReduceOp.PREMUL_SUM, 2.0))
    assert list(arr) == [2.0, 4.0]
    ints = array.array("i", [5, -7])
    work = dist.all_reduce(memoryview(ints), op=dist.ReduceOp.AVG, async_op=True)
    assert work.wait()
    assert list(ints) == [5, -7]
    with pytest.raises(ValueError, match="read-only"):
        dist.all_reduce(b"abc")
    with pytest.raises(ValueError, match="non-contiguous"):
        dist.all_reduce(memoryview(bytearray(8))[::2])
    with pytest.raises(TypeError, match="uint16"):
        dist.all_reduce(array.array("H", [1]))
    dist.broadcast(b"read-only is fine on the broadcast root", src=0)


def test_numpy_views_honour_offsets(world1):
    a = np.arange(10.0)
    view = a[3:7]
    dist.all_reduce(view, op=dist.ReduceOp(dist.ReduceOp.PREMUL_SUM, 2.0))
    assert a.tolist() == [0, 1, 2, 6, 8, 10, 12, 7, 8, 9]
    column = np.zeros((4, 1))[:, :1]  # size-1 dimension: any stride is contiguous
    dist.all_reduce(column)
    with pytest.raises(ValueError, match="non-contiguous"):
        dist.all_reduce(np.zeros((4, 4))[:, 1])


def test_torch_slices_and_scalars(world1):
    base = torch.arange(10, dtype=torch.int32)
    dist.all_reduce(base[2:5], op=dist.ReduceOp(dist.ReduceOp.PREMUL_SUM, 10.0))
    assert base.tolist() == [0, 1, 20, 30, 40, 5, 6, 7, 8, 9]
    scalar = torch.tensor(4.0)
    dist.all_reduce(scalar, op=dist.ReduceOp.AVG)
    assert scalar.item() == 4.0
    dist.all_reduce(torch.ones(3, 1, 2).transpose(1, 2)[:, :, :])  # permuted size-1 dim
    dist.all_reduce(torch.ones(3, requires_grad=True).detach())
    dist.all_reduce(torch.ones(3, dtype=torch.complex64).conj().resolve_conj())


def test_view_bits_are_looked_at_for_every_new_tensor(world1):
    """A tensor used again skips the conjugate and negative checks (they cannot change on
    it); a new view of it, which is another tensor, is looked at, and so is a tensor that
    now requires grad."""
    f = torch.ones(4)
    dist.all_reduce(f)
    dist.all_reduce(f)
    with pytest.raises(ValueError, match="negative bit"):
        dist.all_reduce(torch._neg_view(f))
    z = torch.ones(2, dtype=torch.complex64)
    dist.all_reduce(z)
    with pytest.raises(ValueError, match="conjugate"):
        dist.all_reduce(z.conj())
    dist.all_reduce(f)
    f.requires_grad_()
    with pytest.raises(ValueError, match="requires grad"):
        dist.all_reduce(f)


def test_invalid_arguments(world1):
    f = torch.ones(4)
    with pytest.raises(ValueError, match="complex"):
        dist.all_reduce(torch.ones(2, dtype=torch.complex128), op=dist.ReduceOp.MIN)
    with pytest.raises(ValueError, match="BAND"):
        dist.all_reduce(f, op=dist.ReduceOp.BAND)
    with pytest.raises(ValueError, match="requires grad"):
        dist.all_reduce(torch.ones(2, requires_grad=True))
    with pytest.raises(ValueError, match="conjugate"):
        dist.all_reduce(torch.ones(2, dtype=torch.complex64).conj())
    with pytest.raises(ValueError, match="negative bit"):
        dist.all_reduce(torch._neg_view(f))
    with pytest.raises(ValueError, match="contiguous"):
        dist.all_reduce(torch.ones(3, 3).T)
    with pytest.raises(ValueError, match="cannot be exported"):
        dist.all_reduce(torch.ones(3, device="meta"))
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        dist.all_reduce(torch.ones(2).to(torch.float8_e4m3fn))
    with pytest.raises(TypeError, match="uint32"):
        dist.all_reduce(np.ones(2, dtype=np.uint32))
    with pytest.raises(ValueError, match="PREMUL_SUM"):
        dist.all_reduce(f, op=dist.ReduceOp.PREMUL_SUM)
    with pytest.raises(ValueError, match="PREMUL_SUM"):
        dist.all_reduce(f, op=dist.ReduceOp(dist.ReduceOp.PREMUL_SUM))
    with pytest.raises(TypeError, match="ReduceOp"):
        dist.all_reduce(f, op="sum")
    with pytest.raises(ValueError, match="src=1"):
        dist.broadcast(f, src=1)
    with pytest.raises(ValueError, match="group_dst=3"):
        dist.reduce(f, group_dst=3)
    with pytest.raises(ValueError, match="Must specify"):
        dist.reduce(f)
    with pytest.raises(ValueError, match="both"):
        dist.reduce(f, dst=0, group_dst=0)
    with pytest.raises(TypeError, match="timedelta"):
        dist.barrier(timeout=5)
    assert torch.equal(f, torch.ones(4))


def test_destroyed_group_refuses_collectives(world1):
    group = world1
    dist.destroy_process_group()
    with pytest.raises(ValueError, match="not been initialized"):
        dist.all_reduce(torch.ones(1))
    with pytest.raises(dist.DistBackendError, match="destroyed"):
        dist.all_reduce(torch.ones(1), group=group)


# --- DLPack capsules from a producer we control -----------------------------------------------


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


class _Legacy(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_NAMES = {True: b"dltensor_versioned", False: b"dltensor"}


class FakeProducer:
    """Exports a float64 NumPy array's memory through hand-made DLPack capsules and counts
    the deleter calls; fields can be overridden to produce what real producers rarely do."""

    def __init__(self, values, versioned=True, byte_offset=0, **fields):
        self.array = np.asarray(values, dtype=np.float64)
        self.deleted = 0
        self.versioned = versioned
        self._shape = (ctypes.c_int64 * 1)(self.array.size - byte_offset // 8)
        self._deleter = _DELETER(self._on_delete)
        tensor = _DLTensor(data=self.array.ctypes.data, device_type=1, device_id=0, ndim=1, code=2, bits=64,
                           lanes=1, shape=self._shape, strides=None, byte_offset=byte_offset)
        for name, value in fields.items():
            if name != "flags":
                setattr(tensor, name, value)
        if versioned:
            self._managed = _Versioned(major=1, minor=0, deleter=self._deleter, flags=fields.get("flags", 0),
                                       dl_tensor=tensor)
        else:
            self._managed = _Legacy(dl_tensor=tensor, deleter=self._deleter)

    def _on_delete(self, _pointer):
        self.deleted += 1

    def _capsule(self):
        return _capsule_new(ctypes.addressof(self._managed), _NAMES[self.versioned], None)

    def __dlpack__(self, **kwargs):
        if not self.versioned and "max_version" in kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self._capsule()


@pytest.mark.parametrize("versioned", [True, False], ids=["v1", "legacy"])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_dlpack_deleter_runs_once_after_the_op(world1, versioned, async_op):
    producer = FakeProducer([1.0, 2.0, 3.0], versioned=versioned)
    result = dist.all_reduce(producer, op=dist.ReduceOp(dist.ReduceOp.PREMUL_SUM, 2.0), async_op=async_op)
    if async_op:
        result.wait()
    assert producer.array.tolist() == [2.0, 4.0, 6.0]
    assert producer.deleted == 1


def test_dlpack_byte_offset(world1):
    producer = FakeProducer([1.0, 2.0, 3.0, 4.0], byte_offset=16)
    dist.all_reduce(producer, op=dist.ReduceOp(dist.ReduceOp.PREMUL_SUM, 10.0))
    assert producer.array.tolist() == [1.0, 2.0, 30.0, 40.0]


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"device_type": 8}, ValueError, "device type 8"),
        ({"flags": 1}, ValueError, "read-only"),
        ({"code": 10, "bits": 8}, TypeError, "float8_e4m3fn"),
        ({"code": 1, "bits": 64}, TypeError, "uint64"),
        ({"lanes": 4}, TypeError, "lanes"),
    ],
    ids=["metal", "read-only", "float8", "uint64", "vector"],
)
def test_dlpack_refusals_release_the_capsule(world1, fields, error, match):
    producer = FakeProducer([1.0, 2.0], **fields)
    with pytest.raises(error, match=match):
        dist.all_reduce(producer)
    assert producer.deleted == 1
    assert producer.array.tolist() == [1.0, 2.0]


def test_cuda_buffers_without_a_gpu_say_what_is_missing(world1):
    if dist.cuda.is_available():
        pytest.skip("this machine runs CUDA buffers (tests/cuda covers them)")
    producer = FakeProducer([1.0, 2.0], device_type=2)
    with pytest.raises(dist.DistBackendError, match="CUDA") as raised:
        dist.all_reduce(producer)
    assert str(raised.value) == dist.cuda.unavailable_reason().split("; ")[0]
    assert producer.deleted == 1
    assert producer.array.tolist() == [1.0, 2.0]


def test_cuda_host_memory_is_accepted(world1):
    producer = FakeProducer([1.0, 2.0], device_type=3)
    dist.all_reduce(producer, op=dist.ReduceOp(dist.ReduceOp.PREMUL_SUM, 2.0))
    assert producer.array.tolist() == [2.0, 4.0]
