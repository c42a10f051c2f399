"""init_process_group over every init method at world sizes 1..4, in real processes, and
its error cases."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest

import ringtree
from harness import LATE_BY_S, PROMPT_S, free_port, read_result, run_world, start_world

WORLD_SIZES = [1, 2, 3, 4]


def _expected(world_size: int) -> list[str]:
    return [f"from-{r}" for r in range(world_size)]


def _check(results: list[dict], world_size: int) -> None:
    for rank, result in enumerate(results):
        value = result["ok"]
        assert value["rank"] == rank
        assert value["world_size"] == world_size
        assert value["backend"] == "gloo"
        assert value["initialized"] is True
        assert value["initialized_after"] is False
        assert value["values"] == _expected(world_size)
        assert result["returncode"] == 0


def _run_hosted(method: str, world_size: int, **kwargs) -> list[dict]:
    """Rank 0 hosts the TCPStore on a port chosen here; retried if another process took
    that port between our check and rank 0's bind."""
    for _ in range(3):
        port = free_port()
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size)}
        env.pop("RINGTREE_USE_AGENT_STORE", None)
        results = run_world(
            "workers:init_and_exchange",
            world_size,
            env=env,
            per_rank_env=[{"RANK": str(r), "RINGTREE_USE_AGENT_STORE": "0"} for r in range(world_size)],
            expect_errors=True,
            method=method,
            port=port,
            **kwargs,
        )
        if any("Address already in use" in r.get("message", "") for r in results):
            continue
        errors = [r for r in results if "error" in r]
        assert not errors, errors[0]["traceback"]
        return results
    pytest.fail("could not find a free port in 3 tries")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_env_init(world_size):
    _check(_run_hosted("env", world_size), world_size)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_tcp_init(world_size):
    _check(_run_hosted("tcp", world_size), world_size)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_file_init(world_size, tmp_path):
    path = tmp_path / "rendezvous"
    results = run_world("workers:init_and_exchange", world_size, method="file", path=str(path))
    _check(results, world_size)
    assert not path.exists(), "the last FileStore user removes the file"


@pytest.mark.parametrize("world_size", [2, 4])
def test_file_init_after_a_crashed_job_on_the_same_path(world_size, tmp_path):
    """A job that crashed leaves its file:// file; the next job on the same path recognises
    that every process registered in it has exited, starts it over, and runs."""
    path = tmp_path / "rendezvous"
    expected = world_size * (world_size + 1) / 2
    crashed = run_world("workers:file_init_all_reduce", world_size, path=str(path), crash=True)
    assert [r["ok"] for r in crashed] == [expected] * world_size
    assert all(r["returncode"] == 1 for r in crashed)
    assert path.exists(), "a crashed job leaves its rendezvous file behind"
    start = time.monotonic()
    rerun = run_world("workers:file_init_all_reduce", world_size, path=str(path), crash=False, timeout=30)
    assert [r["ok"] for r in rerun] == [expected] * world_size
    assert time.monotonic() - start < 10, "the rerun must not wait out the 20 s timeout"
    assert any("starting the file over" in r["stderr"] for r in rerun)
    assert not path.exists()


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("lingering", ["rank 0", "every rank"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_relaunch_on_the_port_of_a_job_that_lingers_fails_at_once(world_size, lingering, transport):
    """An earlier env:// job on MASTER_PORT left processes running (its rank 0, which hosts
    its store, among them); a relaunch on the same port fails on every rank within
    PROMPT_S, each naming the process in its way, instead of using the old job's store and
    waiting out its 20 s timeout. (Over shared memory the new ranks first ask the old rank 0
    for the node arena; over TCP they dial it: it still listens, and refuses them.)"""
    linger = [0] if lingering == "rank 0" else list(range(world_size))
    for _ in range(3):
        port = free_port()
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
               "RINGTREE_USE_AGENT_STORE": "0", "RINGTREE_TRANSPORT": transport}
        per_rank = [{"RANK": str(r)} for r in range(world_size)]
        old = start_world("workers:job_that_lingers", world_size, env=env, per_rank_env=per_rank, lingering=linger)
        try:
            earlier = [read_result(proc, 60) for proc in old]
            if any("Address already in use" in r.get("message", "") for r in earlier):
                continue
            old_pids = [r["ok"]["pid"] for r in earlier]
            for rank, proc in enumerate(old):
                if rank not in linger:
                    proc.wait(timeout=30)
            relaunch = run_world("workers:timed_env_init", world_size, env=env, per_rank_env=per_rank, timeout=60)
        finally:
            for proc in old:
                proc.kill()
                proc.communicate()
        break
    else:
        pytest.fail("could not find a free port in 3 tries")
    for rank, result in enumerate(relaunch):
        report = result["ok"]
        expected_error = "DistNetworkError" if rank == 0 or lingering == "rank 0" else "DistStoreError"
        assert report["error"] == expected_error, (rank, report)
        assert report["seconds"] < PROMPT_S, (rank, report)
        if rank == 0:
            expected = [f"rank 0 cannot host the job's store on port {port}", f"held by pid {old_pids[0]} ("]
        elif lingering == "rank 0":
            # It reaches rank 0's record for its connection or the node arena's hand-over
            # (or a faster rank did, which said so as it gave up): either way the record is
            # named as one of a rendezvous that is over.
            expected = ["cannot ", f"rank 0 (host '", f"pid {old_pids[0]} (", "an earlier job whose processes linger"]
        else:
            expected = [f"the store already holds the address of rank {rank} from another process that still runs",
                        f"pid {old_pids[rank]} ("]
        for part in expected:
            assert part in report["message"], (rank, part, report)
        assert "RINGTREE_SOCKET_IFNAME" not in report["message"], (rank, report)


@pytest.mark.parametrize("phase", ["store", "collective"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_store_host_killed_mid_job_fails_every_rank_at_once(world_size, phase):
    """Rank 0 hosts the TCPStore and is killed mid-job: ranks blocked in the store, or in
    collectives, fail within PROMPT_S (not at their 20 s timeouts) naming what they lost."""
    for _ in range(3):
        port = free_port()
        results = run_world(
            "workers:store_host_killed", world_size,
            env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
                 "RINGTREE_USE_AGENT_STORE": "0"},
            per_rank_env=[{"RANK": str(r)} for r in range(world_size)],
            expect_errors=True, timeout=60, phase=phase,
        )
        if not any("Address already in use" in r.get("message", "") for r in results):
            break
    else:
        pytest.fail("could not find a free port in 3 tries")
    assert results[0].get("ok") == {"killed": True}, results[0]
    for rank, result in enumerate(results[1:], start=1):
        assert "ok" in result, result
        report = result["ok"]
        assert report["message"] is not None, f"rank {rank} saw no error"
        assert report["seconds"] < PROMPT_S, (rank, report)
        expected = f"TCPStore at 127.0.0.1:{port} lost during get" if phase == "store" else "rank 0 (host '"
        assert expected in report["message"], (rank, report)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_store_init_with_tcp_store(world_size):
    server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = run_world("workers:init_and_exchange", world_size, method="store-tcp", port=server.port)
    _check(results, world_size)


@pytest.mark.parametrize("world_size", [1, 3])
def test_store_init_with_file_store(world_size, tmp_path):
    results = run_world("workers:init_and_exchange", world_size, method="store-file", path=str(tmp_path / "fs"))
    _check(results, world_size)


def test_agent_store_makes_every_rank_a_client():
    """With RINGTREE_USE_AGENT_STORE=1 (what ringtree-run sets) nobody binds MASTER_PORT."""
    agent = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(agent.port), "WORLD_SIZE": "3",
           "RINGTREE_USE_AGENT_STORE": "1"}
    results = run_world("workers:init_and_exchange", 3, env=env,
                        per_rank_env=[{"RANK": str(r)} for r in range(3)], method="env")
    _check(results, 3)


def test_host_rank_leaving_first_does_not_break_others():
    for _ in range(3):
        port = free_port()
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "3",
               "RINGTREE_USE_AGENT_STORE": "0"}
        results = run_world("workers:host_leaves_first", 3, env=env, expect_errors=True,
                            per_rank_env=[{"RANK": str(r)} for r in range(3)])
        if any("Address already in use" in r.get("message", "") for r in results):
            continue
        break
    for result in results:
        assert "error" not in result, result.get("traceback")
        assert result["returncode"] == 0
    assert [r["ok"]["value"] for r in results[1:]] == ["hello", "hello"]
    assert sorted(r["ok"]["late"] for r in results[1:]) == [1, 2]


def test_store_timeout_names_key_and_comes_back_in_time():
    for _ in range(3):
        port = free_port()
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "1", "RANK": "0",
               "RINGTREE_USE_AGENT_STORE": "0"}
        results = run_world("workers:get_missing_key", 1, env=env, expect_errors=True, timeout_ms=300)
        if "Address already in use" not in results[0].get("message", ""):
            break
    value = results[0]["ok"]
    assert 0.25 <= value["elapsed"] < 0.3 + LATE_BY_S  # at its 300 ms deadline, not much later
    assert "never-set" in value["message"]
    assert "300" in value["message"]


# --- error cases, in this process -----------------------------------------------------------

@pytest.mark.parametrize("missing", ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"])
def test_env_missing_variable_is_named(missing, monkeypatch):
    values = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "RANK": "0", "WORLD_SIZE": "1"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(missing)
    with pytest.raises(ValueError, match=f"environment variable {missing} expected, but not set"):
        ringtree.init_process_group("gloo")
    assert not ringtree.is_initialized()


def test_env_arguments_override_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("RINGTREE_USE_AGENT_STORE", "1")
    agent = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    ringtree.init_process_group("gloo", rank=0, world_size=1)
    assert (ringtree.get_rank(), ringtree.get_world_size()) == (0, 1)


def test_second_init_raises(tmp_path):
    ringtree.init_process_group("gloo", init_method=f"file://{tmp_path}/f", rank=0, world_size=1)
    with pytest.raises(ValueError, match="twice"):
        ringtree.init_process_group("gloo", init_method=f"file://{tmp_path}/g", rank=0, world_size=1)
    ringtree.destroy_process_group()
    # After destroy, a new init works.
    ringtree.init_process_group("gloo", init_method=f"file://{tmp_path}/h", rank=0, world_size=1)
    assert ringtree.is_initialized()


@pytest.mark.parametrize("method", ["file", "store"])
def test_rank_not_below_world_size_raises(method, tmp_path):
    with pytest.raises(ValueError, match="rank"):
        if method == "file":
            ringtree.init_process_group("gloo", init_method=f"file://{tmp_path}/f", rank=2, world_size=2)
        else:
            ringtree.init_process_group("gloo", store=ringtree.HashStore(), rank=2, world_size=2)
    assert not ringtree.is_initialized()


def test_store_and_init_method_are_exclusive():
    with pytest.raises(ValueError, match="Cannot specify both init_method and store"):
        ringtree.init_process_group("gloo", init_method="env://", store=ringtree.HashStore(), rank=0, world_size=1)


@pytest.mark.parametrize("rank,world_size,match", [(-1, 1, "rank must be non-negative"), (0, -1, "world_size must be positive")])
def test_store_needs_rank_and_world_size(rank, world_size, match):
    with pytest.raises(ValueError, match=match):
        ringtree.init_process_group("gloo", store=ringtree.HashStore(), rank=rank, world_size=world_size)


def test_file_init_needs_rank_and_world_size(tmp_path):
    with pytest.raises(ValueError, match="rank parameter missing"):
        ringtree.init_process_group("gloo", init_method=f"file://{tmp_path}/f")


def test_tcp_init_needs_port():
    with pytest.raises(ValueError, match="port number missing"):
        ringtree.init_process_group("gloo", init_method="tcp://127.0.0.1", rank=0, world_size=1)


def test_unknown_scheme():
    with pytest.raises(RuntimeError, match="No rendezvous handler for foo://"):
        ringtree.init_process_group("gloo", init_method="foo://x", rank=0, world_size=1)


@pytest.mark.parametrize("bad", [timedelta(seconds=-1), timedelta(0)])
def test_bad_timeout_value(bad):
    with pytest.raises(ValueError, match="timeout"):
        ringtree.init_process_group("gloo", store=ringtree.HashStore(), rank=0, world_size=1, timeout=bad)


def test_timeout_type():
    with pytest.raises(TypeError, match="timedelta"):
        ringtree.init_process_group("gloo", store=ringtree.HashStore(), rank=0, world_size=1, timeout=5)


def test_unknown_backend():
    with pytest.raises(ValueError, match="Unknown backend type"):
        ringtree.init_process_group("nosuchbackend", store=ringtree.HashStore(), rank=0, world_size=1)


# mpi without an MPI library: test_mpi_backend.py (this process must not initialise MPI).
@pytest.mark.parametrize("backend", ["nccl", "ucc", "cpu:nccl"])
def test_unavailable_backend(backend):
    with pytest.raises(ringtree.DistBackendError, match="not available"):
        ringtree.init_process_group(backend, store=ringtree.HashStore(), rank=0, world_size=1)


def test_cpu_device_id_rejected():
    with pytest.raises(ValueError, match="accelerator"):
        ringtree.init_process_group("gloo", store=ringtree.HashStore(), rank=0, world_size=1, device_id="cpu")


def test_unreachable_store_is_a_network_error_within_timeout(monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("RINGTREE_USE_AGENT_STORE", "0")
    start = time.monotonic()
    with pytest.raises(ringtree.DistNetworkError, match=f"127.0.0.1:{port}") as info:
        ringtree.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2,
                                    timeout=timedelta(seconds=1))
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed < 1.0 + LATE_BY_S, elapsed  # gives up at its 1 s deadline
    assert isinstance(info.value, ConnectionError)
    assert not ringtree.is_initialized()


def test_default_backend_and_queries():
    ringtree.init_process_group(store=ringtree.HashStore(), rank=0, world_size=1)
    # torch's answers: "undefined", and the defaults (no NCCL in this build: cpu only).
    assert ringtree.get_backend() == "undefined"
    assert ringtree.get_backend_config() == "cpu:gloo"
    assert ringtree.group.WORLD is ringtree.GroupMember.WORLD
    assert ringtree.group.WORLD.rank() == 0 and ringtree.group.WORLD.size() == 1
    ringtree.destroy_process_group()
    assert ringtree.group.WORLD is None


def test_queries_before_init_raise():
    for fn in (ringtree.get_rank, ringtree.get_world_size, ringtree.get_backend, ringtree.destroy_process_group):
        with pytest.raises(ValueError, match="has not been initialized"):
            fn()


def test_init_barrier_env(monkeypatch):
    monkeypatch.setenv("RINGTREE_INIT_BARRIER", "1")
    ringtree.init_process_group("gloo", store=ringtree.HashStore(), rank=0, world_size=1)
    assert ringtree.is_initialized()


def test_availability():
    assert ringtree.is_available() and ringtree.is_gloo_available()
    assert ringtree.is_nccl_available() == (ringtree.cuda.is_available() and ringtree.cuda.nccl_path() != "")
    assert ringtree.is_mpi_available() == ringtree.is_backend_available("mpi")  # with or without MPI
    assert ringtree.is_backend_available("gloo")
    assert ringtree.get_default_backend_for_device("cpu") == "gloo"
    assert ringtree.get_default_backend_for_device("cuda:0") == "nccl"


def test_get_node_local_rank(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert ringtree.get_node_local_rank(fallback_rank=3) == 3
    with pytest.raises(RuntimeError, match="LOCAL_RANK"):
        ringtree.get_node_local_rank()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert ringtree.get_node_local_rank() == 1
    assert os.environ["LOCAL_RANK"] == "1"



def test_a_group_that_serves_only_cuda_refuses_host_tensors():
    """What a group made with backend="nccl" does with host buffers, as torch's NCCL
    groups: tensors and arrays on the CPU are refused; the object collectives' bytes pass."""
    import numpy as np
    import torch
    from array import array

    from ringtree.process_group import _CudaOnlyEngine

    ringtree.init_process_group("gloo", store=ringtree.HashStore(), rank=0, world_size=1)
    try:
        engine = _CudaOnlyEngine(ringtree.group.WORLD.engine)
        for host in (torch.ones(2), np.ones(2, dtype=np.float32)):
            with pytest.raises(ValueError, match="No backend type associated with device type cpu"):
                engine.allreduce(host, 0, False)
            with pytest.raises(ValueError, match="device type cpu"):
                engine.batch_isend_irecv([(True, host, 0, 0)])
        sizes = array("q", [7])
        engine.broadcast(sizes, 0, False)
        assert sizes.tolist() == [7] and engine.rank == 0
    finally:
        ringtree.destroy_process_group()
