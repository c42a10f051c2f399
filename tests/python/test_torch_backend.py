"""ringtree as torch.distributed's backend "ringtree": registration by ``import torch``,
every init method, the backend strings, and torch's error classes. The collectives
themselves are compared with gloo's in test_differential_gloo.py (impl "torch-ringtree");
DDP, FSDP2, DTensor and functional collectives in test_torch_training.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from harness import PROMPT_S, free_port, launcher_free_env, run_world  # noqa: E402

WORLD_SIZES = [2, 3]


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env))


def test_import_torch_registers_the_backend():
    code = ("import sys, torch, torch.distributed as d; "
            "print('ringtree' in d.Backend.backend_list, d.Backend.RINGTREE, 'ringtree' in sys.modules)")
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "ringtree", "True"]


def test_without_autoload_register_does_it_once():
    code = ("import torch.distributed as d; before = 'ringtree' in d.Backend.backend_list; "
            "import ringtree.torch_backend as tb; tb.register(); tb.register(); "
            "print(before, d.Backend.backend_list.count('ringtree'))")
    proc = _python(code, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "1"]


def _check(results: list[dict], world_size: int) -> None:
    expected = [world_size * (world_size + 1) / 2] * 4
    for result in results:
        value = result["ok"]
        assert value["sum"] == expected
        assert value["backend"] == "ringtree"
        assert value["pg_type"] == "RingtreeProcessGroup"
        assert value["ringtree_imported_by_torch"]


@pytest.mark.parametrize("method", ["env", "tcp", "store-tcp"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_init_methods_with_a_port(method, world_size):
    for _ in range(3):
        port = free_port()
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size)}
        results = run_world("torch_backend_workers:init_and_all_reduce", world_size, env=env,
                            per_rank_env=[{"RANK": str(r)} for r in range(world_size)], expect_errors=True,
                            method=method, port=port)
        if not any("EADDRINUSE" in r.get("message", "") for r in results):
            break
    errors = [r for r in results if "error" in r]
    assert not errors, errors[0]["traceback"]
    _check(results, world_size)


@pytest.mark.parametrize("method", ["file", "store-file"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_init_methods_with_a_file(method, world_size, tmp_path):
    results = run_world("torch_backend_workers:init_and_all_reduce", world_size, method=method,
                        path=str(tmp_path / "rendezvous"))
    _check(results, world_size)


@pytest.fixture
def one_rank():
    """Calls init_process_group(backend) on a world of one in this process; destroys it."""
    def init(backend: str) -> None:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["ringtree", "RINGTREE", "cpu:ringtree", "cpu:ringtree,cuda:ringtree"])
def test_backend_strings_that_work(one_rank, backend):
    one_rank(backend)
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0, 1.0]
    assert type(dist.group.WORLD).__name__ == "RingtreeProcessGroup"
    assert dist.group.WORLD.group_name == "0"


@pytest.mark.parametrize(("backend", "text"), [
    ("cpu:ringtree,cuda:gloo", "cannot share one with 'gloo' for cuda"),
    ("cpu:gloo,cuda:ringtree", "cannot share one with 'gloo' for cpu"),
    ("cpu:ringtree,xpu:ringtree", "ringtree serves cpu and cuda tensors, not xpu"),
])
def test_backend_strings_that_cannot_be_honoured_raise(one_rank, backend, text):
    with pytest.raises(ValueError, match=text):
        one_rank(backend)


def test_cuda_tensors_go_to_ringtrees_cuda_path(one_rank):
    one_rank("ringtree")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import ringtree

    t = torch.ones(2, device="cuda")
    if not ringtree.cuda.is_available():
        with pytest.raises(Exception, match="CUDA"):
            dist.all_reduce(t)
        return
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]


def test_bad_arguments_raise_torch_exceptions(one_rank):
    one_rank("ringtree")
    with pytest.raises(ValueError, match="contiguous"):
        dist.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(TypeError):
        dist.all_reduce(torch.ones(2, dtype=torch.float8_e5m2))
    t = torch.ones(2, requires_grad=True)
    dist.all_reduce(t)  # a parameter is accepted (torch's backends do)
    assert t.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(("fault", "texts", "classes"), [
    ("kill", ["rank 1 (host '", "closed its connection"],
     ["torch.DistNetworkError", "torch.DistError", "ringtree.DistNetworkError", "ConnectionError"]),
    ("mismatch", ["broadcast", "allreduce"],
     ["torch.DistBackendError", "torch.DistError", "ringtree.CollectiveMismatchError", "ValueError"]),
    ("timeout", ["rank 1"], ["torch.DistBackendError", "torch.DistError", "ringtree.DistTimeoutError", "TimeoutError"]),
])
def test_failures_raise_torch_classes_with_ringtree_messages(fault, texts, classes):
    results = run_world("torch_backend_workers:failure", 2, port=free_port(), fault=fault, timeout=60)
    report = results[0]["ok"]
    assert report["message"] is not None, report
    for text in texts:
        assert text in report["message"], report
    assert [name for name, yes in report["classes"].items() if yes and name in classes] == classes, report
    limit = 2 + PROMPT_S if fault == "timeout" else PROMPT_S
    assert report["seconds"] < limit, report


def test_a_collectives_own_timeout_is_its_deadline():
    # torch's *Options.timeout, set, bounds that call (the group's timeout is 60 s); the
    # group is unusable after it, as after any failure, and says why.
    results = run_world("torch_backend_workers:per_call_timeout", 2, port=free_port(), timeout=60)
    (seconds, name, message, torch_class), (after_seconds, after_name, after_message, _) = results[0]["ok"]["outcomes"]
    assert name == "DistTimeoutError" and torch_class, message
    assert "rank 0: timed out after 500 ms in broadcast" in message and "rank 1 did not enter" in message, message
    assert 0.4 < seconds < 0.5 + PROMPT_S, seconds
    assert after_name == "DistTimeoutError" and after_seconds < PROMPT_S, after_message
    assert "cannot run, the communicator is unusable after an earlier failure" in after_message, after_message
    assert "timed out after 500 ms in broadcast" in after_message, after_message


@pytest.mark.parametrize("world_size", [2, 3])
def test_monitored_barrier_called_on_the_group(world_size):
    results = run_world("torch_backend_workers:monitored_barrier", world_size, port=free_port(), timeout=60)
    for rank in range(world_size):
        report = results[rank]["ok"]
        assert report["passed"]
        assert report["refused_by_torch"] == "monitored_barrier is only implemented for GLOO backend."
    last = world_size - 1
    assert results[0]["ok"]["missing"] == [
        "DistTimeoutError", f"[Rank 0]: Rank {last} failed to pass monitoredBarrier in 1000 ms"]
    for rank in range(1, last):
        assert results[rank]["ok"]["missing"] == [
            "DistTimeoutError", f"Rank {rank} successfully reached monitoredBarrier, but it failed: "
            f"[Rank 0]: Rank {last} failed to pass monitoredBarrier in 1000 ms"]
    assert results[0]["ok"]["own_timeout"] == [
        "DistTimeoutError",
        "Rank 0 timed out in monitoredBarrier after 0 ms.\nNo ranks successfully processed in monitoredBarrier."]


@pytest.mark.parametrize("world_size", [2, 3])
def test_sparse_all_reduce_matches_gloo(world_size):
    got = {backend: run_world("torch_backend_workers:sparse_all_reduce", world_size, port=free_port(),
                              backend=backend, timeout=60)
           for backend in ("ringtree", "gloo")}
    for rank in range(world_size):
        ringtree, gloo = got["ringtree"][rank]["ok"], got["gloo"][rank]["ok"]
        assert ringtree["dense"] == gloo["dense"] == got["ringtree"][0]["ok"]["dense"]
        assert ringtree["async"] == gloo["async"]
        assert "sparse tensors are reduced with SUM only" in ringtree["max"]
        assert "strided" in ringtree["broadcast"]
    assert "rank 0 gave shape (4,)" in got["ringtree"][1]["ok"]["shapes"]


RINGTREE_PROGRAM = """
import ringtree, numpy as np
ringtree.init_process_group("gloo")
a = np.full(4, ringtree.get_rank() + 1, dtype=np.float32)
ringtree.all_reduce(a)
open(f"{OUT}/result_{ringtree.get_rank()}", "w").write(repr(a.tolist()))
ringtree.destroy_process_group()
"""

TORCH_PROGRAM = """
import torch, torch.distributed as dist
dist.init_process_group("ringtree")
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
open(f"{OUT}/result_{dist.get_rank()}", "w").write(repr(t.tolist()))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("program", ["ringtree", "torch"])
def test_programs_run_under_torchrun(program, tmp_path):
    """torchrun's agent hosts a torch TCPStore on MASTER_PORT: a torch program with backend
    "ringtree" uses it through torch, a ringtree program (env://) as a client through torch."""
    script = tmp_path / "program.py"
    script.write_text(f"OUT = {str(tmp_path)!r}\n" + (RINGTREE_PROGRAM if program == "ringtree" else TORCH_PROGRAM))
    env = launcher_free_env()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(2):
        assert (tmp_path / f"result_{rank}").read_text() == "[3.0, 3.0, 3.0, 3.0]"


TORCH_PROGRAM_OF_BACKEND = """
import torch, torch.distributed as dist
dist.init_process_group(BACKEND)
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
dist.barrier()
objects = [None, None]
dist.all_gather_object(objects, {"rank": dist.get_rank()})
assert objects == [{"rank": 0}, {"rank": 1}], objects
open(f"{OUT}/result_{dist.get_rank()}", "w").write(repr(t.tolist()))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("backend", ["ringtree", "gloo"])
def test_torch_programs_run_under_ringtree_run(backend, tmp_path):
    """ringtree-run's store speaks torch's TCPStore protocol and the launcher sets
    TORCHELASTIC_USE_AGENT_STORE, so torch's env:// connects to it (any backend) instead of
    binding MASTER_PORT, which the launcher holds."""
    script = tmp_path / "program.py"
    script.write_text(f"OUT = {str(tmp_path)!r}\nBACKEND = {backend!r}\n" + TORCH_PROGRAM_OF_BACKEND)
    env = launcher_free_env()
    proc = subprocess.run([sys.executable, "-m", "ringtree.run", "--nproc-per-node", "2", str(script)],
                          capture_output=True, text=True, timeout=120, env=env)
    # torch 2.13's gloo aborts at exit in about 1 run of 4 (see the DDP example's test).
    if backend == "ringtree" or "terminate called without an active exception" not in proc.stderr:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(2):
        assert (tmp_path / f"result_{rank}").read_text() == "[3.0, 3.0, 3.0, 3.0]"


def test_the_ddp_example_gives_the_same_losses_as_gloo():
    example = Path(__file__).resolve().parents[2] / "examples" / "python" / "train_ddp.py"
    env = launcher_free_env()
    losses = {}
    for backend in ("ringtree", "gloo"):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(example),
                               "--backend", backend, "--steps", "12", "--width", "64"],
                              capture_output=True, text=True, timeout=120, env=env)
        # torch 2.13's gloo aborts at exit after destroy_process_group in about 1 run of 4
        # here ("terminate called without an active exception"), with ringtree installed
        # or not (TORCH_DEVICE_BACKEND_AUTOLOAD=0): its exit code is not ringtree's to check.
        if backend == "ringtree" or "terminate called without an active exception" not in proc.stderr:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        losses[backend] = [line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("step")]
        assert f"{backend}: 2 ranks" in proc.stdout, proc.stdout + proc.stderr
    assert len(losses["ringtree"]) == 3 and losses["ringtree"] == losses["gloo"]


def test_groups_share_the_worlds_connections():
    results = [r["ok"] for r in run_world("torch_backend_workers:shared_connections", 4, port=free_port(), timeout=120)]
    for rank, out in enumerate(results):
        assert out["after"] == out["before"], (rank, out)
        assert out["concurrent"] == {"dp": True, "tp": True, "world": True}, (rank, out)
        if rank in (0, 3):
            assert out["mismatch"] is not None and out["mismatch"]["torch_class"], out["mismatch"]
            assert "mismatch" in out["mismatch"]["message"], out["mismatch"]
        else:
            assert out["mismatch"] is None
        assert out["world"] == [4.0] * 4 and out["subgroup"] == [2.0] * 4, (rank, out)
