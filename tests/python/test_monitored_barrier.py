"""monitored_barrier: torch gloo's semantics over the group's store. Rank 0 names the ranks
that did not arrive in time (the first one, or all with wait_all_ranks), the others fail
with rank 0's verdict, the group recovers, and the barrier keys do not pile up."""

from __future__ import annotations

import functools
import warnings
from datetime import timedelta

import pytest
import torch

import ringtree as dist
from harness import run_world

TIMEOUT_S = 1.0
LATE_BY_S = 3.0  # far past the timeout, even on an oversubscribed machine
LATE = [1, 3]


@functools.cache
def _world() -> tuple:
    """Four ranks run group_workers.monitored_barrier_world once."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = run_world("group_workers:monitored_barrier_world", 4, timeout=120, port=server.port, late=LATE,
                        timeout_s=TIMEOUT_S, late_by_s=LATE_BY_S)
    return tuple(r["ok"] for r in results)


@pytest.mark.parametrize(
    ("wait_all_ranks", "verdict"),
    [
        (False, "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms"),
        (True, "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 1000 ms"),
    ],
    ids=["first_missing", "wait_all_ranks"],
)
def test_late_ranks_are_named(wait_all_ranks, verdict):
    results = [result[f"late/{wait_all_ranks}"]["failed"] for result in _world()]
    root = results[0]
    assert (root["type"], root["message"]) == ("DistTimeoutError", verdict)
    assert TIMEOUT_S * 0.9 < root["elapsed"] < LATE_BY_S, "rank 0 gave its verdict at the deadline"
    on_time = results[2]
    assert on_time["type"] == "DistTimeoutError"
    assert on_time["message"] == f"Rank 2 successfully reached monitoredBarrier, but it failed: {verdict}"
    assert on_time["elapsed"] < LATE_BY_S
    for rank in LATE:  # they arrive after the verdict and learn it at once
        expected = f"Rank {rank} successfully reached monitoredBarrier, but it failed: {verdict}"
        assert results[rank]["message"] == expected
        assert results[rank]["elapsed"] < TIMEOUT_S


@pytest.mark.parametrize(("wait_all_ranks", "last"), [(False, 3), (True, 6)], ids=["first_missing", "wait_all_ranks"])
def test_group_recovers_and_cleans_up(wait_all_ranks, last):
    for result in _world():
        late = result[f"late/{wait_all_ranks}"]
        assert late["recovered"]["type"] is None and late["again"]["type"] is None
    # Keys of the failed barrier went when the next one passed; only the last verdict is
    # left, for ranks that may still be reading it.
    assert _world()[0][f"keys_left/{wait_all_ranks}"] == [f"ringtree/monitored_barrier/{last}/verdict"]


def test_passes_subgroups_and_non_members():
    results = _world()
    for rank, result in enumerate(results):
        assert result["passes"] == [None] * 4
        if rank == 0:
            assert result["non_member"] == {
                "returned": None,
                "warnings": ["Running monitored_barrier on global rank 0 which does not belong to the given group."],
            }
        else:
            assert result["subgroup"] is None
            assert result["destroyed"]["type"] == "DistBackendError"
    assert results[0]["keys_left_after_passes"] == ["ringtree/monitored_barrier/10/verdict"]


def test_late_rank_0_fails_everyone():
    """The others give up waiting for rank 0; rank 0, arriving later, fails with that
    instead of passing alone."""
    results = _world()
    root = results[0]["root_late"]
    assert root["type"] == "DistTimeoutError"
    assert root["message"].startswith("[Rank 0]: monitoredBarrier of group '")
    assert "failed before rank 0 arrived" in root["message"] and "did not release it within 1000 ms" in root["message"]
    for rank in range(1, len(results)):
        result = results[rank]["root_late"]
        assert result["type"] == "DistTimeoutError"
        assert result["message"].startswith(f"Rank {rank} successfully reached monitoredBarrier, but ")
        assert result["message"].endswith(
            "rank 0 did not release it within 1000 ms. Please check rank 0 logs for faulty rank.")
        assert result["elapsed"] < LATE_BY_S


# --- world size 1, in this process ------------------------------------------------------------


def test_world_size_1_and_arguments():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert dist.monitored_barrier() is None
    assert dist.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=True) is None
    with pytest.warns(UserWarning, match="Please specify timeout arg as a timedelta"):
        dist.monitored_barrier(timeout=2.0)
    with pytest.raises(TypeError, match="timedelta"):
        dist.monitored_barrier(timeout=2)
    assert dist.monitored_barrier(timeout=timedelta(0)) is None  # allowed, as torch allows it
    with pytest.raises(ValueError, match="timeout must not be negative"):
        dist.monitored_barrier(timeout=timedelta(seconds=-1))
    group = dist.new_group([0])
    dist.destroy_process_group(group)
    with pytest.raises(dist.DistBackendError, match="destroyed"):
        dist.monitored_barrier(group=group)


def test_only_for_gloo():
    dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)  # cpu:gloo,cuda:nccl
    with pytest.raises(ValueError, match="monitored_barrier is only implemented for GLOO backend."):
        dist.monitored_barrier()
    gloo = dist.new_group([0], backend="gloo")
    assert dist.monitored_barrier(group=gloo) is None


def test_before_init():
    with pytest.raises(ValueError, match="has not been initialized"):
        dist.monitored_barrier()


def test_non_member_in_process():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dist.monitored_barrier(group=dist.GroupMember.NON_GROUP_MEMBER) is None
    assert [str(w.message) for w in caught] == [
        "Running monitored_barrier on global rank 0 which does not belong to the given group."
    ]
    dist.all_reduce(torch.ones(1))  # the world is untouched
