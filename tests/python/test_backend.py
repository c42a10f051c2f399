"""Backend, BackendConfig, ReduceOp, register_backend and register_rendezvous_handler."""

from __future__ import annotations

import warnings

import pytest

import ringtree
from ringtree import Backend, BackendConfig, ReduceOp


def test_backend_names_are_lowercase_strings():
    assert Backend("GLOO") == "gloo" and Backend("Nccl") == "nccl"
    assert Backend.GLOO == "gloo" and Backend.MPI == "mpi" and Backend.UNDEFINED == "undefined"
    assert type(Backend("gloo")) is str
    assert Backend("MyBackend") == "mybackend"  # not validated here, as in torch


@pytest.mark.parametrize("bad", [3, None, 1.5, b"gloo"])
def test_backend_rejects_non_strings(bad):
    with pytest.raises(ValueError, match="string-ish"):
        Backend(bad)


def test_backend_config_parsing():
    assert repr(BackendConfig("gloo")) == "cpu:gloo,cuda:gloo"
    assert repr(BackendConfig(None)) == "cpu:gloo"  # cuda:nccl only where NCCL is available
    assert BackendConfig("cpu:gloo,cuda:nccl").get_device_backend_map() == {"cpu": "gloo", "cuda": "nccl"}
    for bad in ("cpu:", "cpu:gloo,cpu:gloo", ":gloo", "cpu:gloo,,"):
        with pytest.raises(ValueError):
            BackendConfig(bad)


def test_reduce_op_members():
    names = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"]
    assert [m.name for m in ReduceOp.RedOpType] == names
    assert [int(getattr(ReduceOp, n)) for n in names] == list(range(9))
    assert ReduceOp(ReduceOp.MAX) == ReduceOp.MAX
    assert ReduceOp(ReduceOp.MAX) != ReduceOp.MIN
    premul = ReduceOp(ReduceOp.PREMUL_SUM, 0.5)
    assert premul.factor == 0.5 and premul == ReduceOp.PREMUL_SUM
    with pytest.raises(ValueError):
        ReduceOp(42)
    with pytest.raises(ValueError):
        ReduceOp(ReduceOp.SUM, 2.0)


def test_reduce_op_deprecated_alias():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ringtree.reduce_op is ReduceOp
    assert any(issubclass(w.category, FutureWarning) for w in caught)


def test_register_backend_plugin_is_created_at_init():
    created = []

    def creator(store, rank, size, timeout):
        store.set("plugin-key", "v")
        created.append((rank, size, timeout))
        return object()

    Backend.register_backend("dummyplugin", creator, devices=["cpu"])
    try:
        assert Backend.DUMMYPLUGIN == "dummyplugin"
        assert "dummyplugin" in Backend.backend_list
        assert ringtree.is_backend_available("dummyplugin")
        with pytest.raises(ValueError, match="already exist"):
            Backend.register_backend("dummyplugin", creator)
        ringtree.init_process_group("dummyplugin", store=ringtree.HashStore(), rank=0, world_size=1)
        assert ringtree.get_backend() == "dummyplugin"
        assert created and created[0][:2] == (0, 1)
    finally:
        if ringtree.is_initialized():
            ringtree.destroy_process_group()
        del Backend._plugins["DUMMYPLUGIN"]
        delattr(Backend, "DUMMYPLUGIN")
        Backend.backend_list.remove("dummyplugin")
        del Backend.backend_capability["dummyplugin"]


def test_register_rendezvous_handler():
    store = ringtree.HashStore()

    def handler(url, **kwargs):
        yield (store, 0, 1)

    ringtree.register_rendezvous_handler("memtest", handler)
    with pytest.raises(RuntimeError, match="already registered"):
        ringtree.register_rendezvous_handler("memtest", handler)
    ringtree.init_process_group("gloo", init_method="memtest://anything")
    assert ringtree.get_world_size() == 1


def test_rendezvous_rejects_duplicate_rank():
    with pytest.raises(ValueError, match="node-specific arguments"):
        next(ringtree.rendezvous("file:///tmp/x?rank=0&world_size=1", rank=0))


def test_errors_subclass_builtins():
    assert issubclass(ringtree.DistNetworkError, ConnectionError)
    assert issubclass(ringtree.DistTimeoutError, TimeoutError)
    for cls in (ringtree.DistNetworkError, ringtree.DistStoreError, ringtree.DistTimeoutError, ringtree.DistBackendError):
        assert issubclass(cls, ringtree.DistError) and issubclass(cls, RuntimeError)


def test_supports_complex_matches_torch():
    dist = pytest.importorskip("torch.distributed")
    for op in ReduceOp.RedOpType:
        expected = dist.supports_complex(getattr(dist.ReduceOp, op.name))
        assert ringtree.supports_complex(op) is expected, op
        assert ringtree.supports_complex(ReduceOp(op) if op != ReduceOp.PREMUL_SUM else op) is expected, op


def test_availability_queries(monkeypatch):
    assert not ringtree.is_ucc_available() and not ringtree.is_xccl_available()
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert not ringtree.is_torchelastic_launched()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    assert ringtree.is_torchelastic_launched()
