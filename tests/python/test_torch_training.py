"""What torch builds on a process group, over backend "ringtree", against the same steps
over torch's "gloo" in the same processes: DDP in the configurations torch users run,
functional collectives, DTensor over a 2x2 DeviceMesh, FSDP2 and object collectives.
At 2 ranks results must be equal bit for bit (a float sum of two values is the same in
either order); at 4 ranks the backends may add in different orders, so float results
must agree within a relative 1e-5."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from harness import free_port, run_world  # noqa: E402
from torch_training_workers import DDP_CASES, HIGHER_LAYER_CASES  # noqa: E402

BACKENDS = ["gloo", "ringtree"]


@pytest.fixture(scope="module")
def results():
    """results(target, world_size) -> each rank's {backend: {case: outcome}}, run once."""
    cache: dict = {}

    def get(target: str, world_size: int) -> list[dict]:
        if (target, world_size) not in cache:
            ports = {backend: free_port() for backend in BACKENDS}
            runs = run_world(f"torch_training_workers:{target}", world_size, timeout=300, ports=ports)
            cache[target, world_size] = [run["ok"] for run in runs]
        return cache[target, world_size]

    return get


def _close(a, b, exact: bool) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], exact) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, exact) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and not exact:
        return abs(a - b) <= 1e-5 * max(abs(a), abs(b)) + 1e-7
    return a == b


def _compare(per_rank: list[dict], case: str) -> None:
    exact = len(per_rank) == 2
    for rank, by_backend in enumerate(per_rank):
        for backend in BACKENDS:
            outcome = by_backend[backend][case]
            assert "ok" in outcome, f"{backend} failed {case} on rank {rank}: {outcome['error']}"
        ours, theirs = by_backend["ringtree"][case]["ok"], by_backend["gloo"][case]["ok"]
        assert _close(ours, theirs, exact), (case, rank, ours, theirs)


@pytest.mark.parametrize("case", sorted(DDP_CASES))
def test_ddp_matches_gloo(results, case):
    per_rank = results("ddp", 2)
    _compare(per_rank, case)
    # DDP keeps the replicas' parameters equal.
    assert per_rank[0]["ringtree"][case]["ok"]["parameters"] == per_rank[1]["ringtree"][case]["ok"]["parameters"]


@pytest.mark.parametrize("case", sorted(HIGHER_LAYER_CASES))
@pytest.mark.parametrize("world_size", [2, 4])
def test_higher_layers_match_gloo(results, case, world_size):
    _compare(results("higher_layers", world_size), case)


def test_dtensor_over_a_2x2_mesh_matches_gloo(results):
    per_rank = results("higher_layers", 4)
    _compare(per_rank, "dtensor_2d")
    assert all(by_backend["ringtree"]["dtensor_2d"]["ok"]["equal_to_full"] == [1.0] for by_backend in per_rank)
