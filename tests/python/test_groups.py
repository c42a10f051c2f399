"""Process groups beyond the world: new_group (strict subsets, overlapping, reordered,
member-only), new_subgroups, new_subgroups_by_enumeration, split_group, rank translation,
non-member behaviour, destroy and re-create — in real processes at world sizes 1..5, and
the argument checks and queries in this process at world size 1."""

from __future__ import annotations

import functools
import warnings
from datetime import timedelta

import pytest
import torch

import ringtree as dist
from harness import run_world

WORLD_SIZES = [1, 2, 3, 4, 5]


@functools.cache
def _groups_world(world_size: int) -> tuple:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    # At 3 ranks, new_group also ends with a store barrier (RINGTREE_INIT_BARRIER=1).
    env = {"RINGTREE_INIT_BARRIER": "1"} if world_size == 3 else {}
    results = run_world("group_workers:groups_world", world_size, env=env, timeout=120, port=server.port)
    return tuple(r["ok"] for r in results)


def _specs(n: int) -> dict[str, list[int]]:
    """The member lists group_workers.groups_world uses, in group rank order."""
    return {"subset": list(range(1, n)) or [0], "low": list(range((n + 2) // 2)), "high": list(range(n // 2, n)),
            "reversed": list(reversed(range(n))), "world": list(range(n))}


def _expected_round(ranks: list[int], rank: int, salt: int) -> dict:
    size = len(ranks)
    dst = ranks[(size - 1 - salt) % size]
    src = ranks[salt % size]
    return {"sum": [sum(r + 1 for r in ranks), salt * size], "bcast": float(src * 10 + salt), "src": src,
            "max": max(r + salt for r in ranks) if rank == dst else rank + salt,
            "min": min(r + salt for r in ranks) if rank == dst else rank + salt, "dst": dst}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_groups_used_alternately(world_size):
    specs = _specs(world_size)
    for rank, out in enumerate(_groups_world(world_size)):
        for name, ranks in specs.items():
            member = rank in ranks
            expected = [ranks.index(rank), len(ranks)] if member else [-1, -1]
            assert out["membership"][name] == expected, (rank, name)
        for salt, results in enumerate(out["rounds"]):
            assert sorted(results) == sorted(name for name, ranks in specs.items() if rank in ranks)
            for name, result in results.items():
                assert result == _expected_round(specs[name], rank, salt), (rank, name, salt)
        low, high = rank in specs["low"], rank in specs["high"]
        expected_async = ([len(specs["low"])] if low else []) + ([2.0 * len(specs["high"])] if high else [])
        assert out["overlapping_async"] == expected_async


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_collective_on_groups(world_size):
    specs = _specs(world_size)
    for rank, out in enumerate(_groups_world(world_size)):
        assert sorted(out["family"]) == sorted(name for name, ranks in specs.items() if rank in ranks)
        for name, result in out["family"].items():
            ranks = specs[name]
            size, me = len(ranks), ranks.index(rank)
            expected = {
                "all_gather": [[r, i] for i, r in enumerate(ranks)],
                "reduce_scatter": 10 * sum(ranks) + size * me,
                "all_to_all_single": [r * 100 + me for r in ranks],
                "gather": ranks if rank == ranks[-1] else None,
                "scatter": ranks[0] * 10 + me,
                "objects": [{"rank": r} for r in ranks],
            }
            if size > 1:
                expected["ring"] = ranks[(me - 1) % size]  # from the previous member
            assert result == expected, (rank, name)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_rank_translation(world_size):
    specs = _specs(world_size)
    for rank, out in enumerate(_groups_world(world_size)):
        for name, result in out["translation"].items():
            ranks = specs[name]
            assert result["ranks"] == ranks and result["global"] == ranks
            assert result["group"] == list(range(len(ranks)))
            outsiders = [r for r in range(world_size) if r not in ranks]
            if outsiders:
                assert result["outsider"]["type"] == "ValueError"
                assert result["outsider"]["message"].startswith(f"Global rank {outsiders[0]} is not part of group")
            if name == "world":  # the default group maps every rank to itself, as in torch
                assert result["bad_group_rank"] is None
            else:
                assert result["bad_group_rank"]["message"].startswith(f"Group rank {len(ranks)} is not part of group")


@pytest.mark.parametrize("world_size", WORLD_SIZES[1:])  # one rank has no non-members
def test_non_members(world_size):
    specs = _specs(world_size)
    for rank, out in enumerate(_groups_world(world_size)):
        assert sorted(out["non_member"]) == sorted(name for name, ranks in specs.items() if rank not in ranks)
        for result in out["non_member"].values():
            assert result["is_non_member"] and result["rank"] == -1 and result["size"] == -1
            assert result["returned"] == [None] * 5 and result["unchanged"] == [7.0]
            assert result["warnings"] == [
                f"Running {op} on global rank {rank} which does not belong to the given group."
                for op in ("all_reduce", "broadcast", "reduce", "barrier", "monitored_barrier")
            ]
            assert result["get_backend"] == {"type": "ValueError", "message": "Invalid process group specified"}
            assert result["get_process_group_ranks"]["type"] == "ValueError"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_subgroups_enumeration_and_split(world_size):
    n = world_size
    evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
    high = _specs(n)["high"]
    for rank, out in enumerate(_groups_world(n)):
        sizes = [d for d in range(1, n + 1) if n % d == 0]
        assert sorted(int(size) for size in out["subgroups"]) == sizes
        for size, result in out["subgroups"].items():
            size = int(size)
            mine = list(range(rank - rank % size, rank - rank % size + size))
            assert result == {"ranks": mine, "sum": sum(r + 1 for r in mine), "count": n // size,
                              "non_members": n // size - 1}
        assert out["enumeration"] == {"mine": evens if rank in evens else None, "every": [rank not in evens]}
        split = evens if rank in evens else odds
        assert out["split"]["ranks"] == split and out["split"]["sum"] == sum(r + 1 for r in split)
        assert out["split"]["desc"] == "default_pg:split:1"
        if rank in high:
            assert out["split_of_high"] == ([rank] if rank == high[0] else None)
        else:
            assert "split_of_high" not in out


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_member_only_groups(world_size):
    low = _specs(world_size)["low"]
    for rank, out in enumerate(_groups_world(world_size)):
        if rank in low:
            assert out["local"] == {"sums": [sum(r + 1 for r in low)] * 2, "names_differ": True}
        else:
            assert "local" not in out


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_destroy_recreate_and_count(world_size):
    n = world_size
    low = _specs(n)["low"]
    # The world, 4 new_group calls, every new_subgroups group, one enumeration, one re-created.
    expected_count = 1 + 4 + sum(n // d for d in range(1, n + 1) if n % d == 0) + 1 + 1
    for rank, out in enumerate(_groups_world(n)):
        if rank in low:
            assert out["destroyed_use"]["type"] == "DistBackendError"
            assert "destroyed" in out["destroyed_use"]["message"]
            assert out["destroy_again"]["type"] == "ValueError"
            assert out["destroy_again"]["message"].startswith("Invalid process group specified")
            assert out["recreated"] == {"sum": sum(r + 1 for r in low), "same_name": False}
        else:
            assert out["recreated"] == {"non_member": True}
        assert out["pg_count"] == expected_count
        assert out["pg_count_after_destroy"] == 0


# --- world size 1, in this process ------------------------------------------------------------


@pytest.fixture
def world1():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD


def test_names_are_exported():
    for name in ("new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group", "get_process_group_ranks",
                 "get_global_rank", "get_group_rank", "get_pg_count", "monitored_barrier"):
        assert name in dist.__all__ and callable(getattr(dist, name))
    assert dist.GroupMember.NON_GROUP_MEMBER == -100


def test_new_group_handle(world1):
    group = dist.new_group([0], timeout=timedelta(seconds=5), group_desc="mine")
    assert isinstance(group, dist.ProcessGroup) and group is not world1
    assert (group.rank(), group.size(), group.group_desc, group.timeout) == (0, 1, "mine", timedelta(seconds=5))
    assert dist.get_backend(group) == "gloo" and dist.get_backend_config(group) == "cpu:gloo,cuda:gloo"
    assert dist.get_process_group_ranks(group) == [0] and dist.get_process_group_ranks(None) == [0]
    # Named by a count of new_group calls, after the world.
    assert int(group.group_name) == int(world1.group_name) + 1
    assert int(dist.new_group().group_name) == int(world1.group_name) + 2
    assert dist.new_group(timeout=None).timeout == dist.default_pg_timeout  # not the world's
    assert world1.group_desc == "default_pg" and dist.new_group().group_desc == "undefined"
    t = torch.arange(3.0)
    dist.all_reduce(t, group=group)
    dist.broadcast(t, group_src=0, group=group)
    assert t.tolist() == [0.0, 1.0, 2.0]
    assert dist.get_pg_count() == 5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ranks": [0, 0]}, r"ranks list must not contain duplicate entries, got \[0, 0\]"),
        ({"ranks": [0, 1]}, "the new group's world size should be less or equal to the world size"),
        ({"ranks": [3]}, r"Rank 3 is out of range. Valid ranks are 0 to 0 \(world_size=1\)"),
        ({"ranks": [-1]}, "Rank -1 is out of range"),
        ({"backend": "nosuchbackend"}, "Unknown backend type"),
        ({"device_id": "cpu"}, "accelerator"),
        ({"timeout": timedelta(0)}, "timeout must be positive"),
    ],
)
def test_new_group_argument_errors(world1, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dist.new_group(**kwargs)
    assert dist.get_pg_count() == 1  # nothing was created


def test_new_group_errors_without_world_or_backend():
    with pytest.raises(ValueError, match="has not been initialized"):
        dist.new_group([0])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with pytest.raises(dist.DistBackendError, match="not available"):
        dist.new_group([0], backend="nccl")
    with pytest.raises(TypeError, match="timedelta"):
        dist.new_group([0], timeout=5)


def test_sort_ranks_and_local_synchronization(world1):
    group = dist.new_group([0], sort_ranks=False, use_local_synchronization=True)
    assert dist.get_process_group_ranks(group) == [0]
    again = dist.new_group([0], use_local_synchronization=True)
    assert len(group.group_name) == 40 and group.group_name != again.group_name
    assert dist.get_pg_count() == 1  # member-only groups are not counted, as in torch


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: dist.new_subgroups(), ValueError, "Default group size only takes effect when CUDA is available"),
        (lambda: dist.new_subgroups(0), ValueError, r"The arg 'group_size' \(0\) must be positive"),
        (lambda: dist.new_subgroups(2), ValueError, r"The arg 'group_size' \(2\) must not exceed the world size \(1\)"),
        (lambda: dist.new_subgroups_by_enumeration([]), ValueError,
         "The arg 'ranks_per_subgroup_list' cannot be empty"),
        (lambda: dist.new_subgroups_by_enumeration([[0], [0]]), ValueError,
         r"Rank 0 has appeared in both subgroup \[0\] and \[0\]"),
        (lambda: dist.split_group(split_ranks=None), ValueError, "split_ranks cannot be None or empty"),
        (lambda: dist.split_group(split_ranks=[[]]), ValueError, "the split group cannot be empty"),
        (lambda: dist.split_group(split_ranks=[[0, 0]]), ValueError, "the split group's size should be less or equal"),
        (lambda: dist.split_group(split_ranks=[[1]]), ValueError, "Rank 1 in split_ranks is not a rank of the parent"),
        (lambda: dist.split_group(split_ranks=[[0]], backend="nccl"), dist.DistBackendError, "not available"),
        (lambda: dist.split_group(split_ranks=[[0]], backend="cpu:gloo,xpu:gloo"), ValueError,
         "Requested backend for device 'xpu' is not present in the parent process group"),
    ],
)
def test_subgroup_argument_errors(world1, call, error, match):
    with pytest.raises(error, match=match):
        call()
    assert dist.get_pg_count() == 1


def test_split_group_backend_and_non_divisible_subgroups():
    dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)  # cpu:gloo (no NCCL here)
    child = dist.split_group(split_ranks=[[0]], backend="gloo", group_desc="child")
    assert (dist.get_backend(child), child.group_desc) == ("gloo", "child")
    with pytest.raises(ValueError, match="Requested backend for device 'cuda' is not present in the parent"):
        dist.split_group(split_ranks=[[0]], backend="cpu:gloo,cuda:gloo")
    grandchild = dist.split_group(child, split_ranks=[[0]])
    assert dist.get_process_group_ranks(grandchild) == [0]
    assert grandchild.group_name != child.group_name


def test_translation_errors(world1):
    group = dist.new_group([0])
    assert dist.get_group_rank(world1, 5) == 5 and dist.get_global_rank(world1, 5) == 5  # identity, as in torch
    assert dist.get_group_rank(group, 0) == 0 and dist.get_global_rank(group, 0) == 0
    with pytest.raises(ValueError, match="Global rank 1 is not part of group"):
        dist.get_group_rank(group, 1)
    with pytest.raises(ValueError, match="Group rank 1 is not part of group"):
        dist.get_global_rank(group, 1)
    for bad in (None, dist.GroupMember.NON_GROUP_MEMBER, "0"):
        with pytest.raises(ValueError, match=f"Group {bad} is not registered"):
            dist.get_group_rank(bad, 0)
    dist.destroy_process_group(group)
    for query in (dist.get_group_rank, dist.get_global_rank):
        with pytest.raises(ValueError, match="is not registered"):
            query(group, 0)
    with pytest.raises(ValueError, match="is not registered"):
        dist.get_process_group_ranks(group)


def test_non_member_handle_in_collectives(world1):
    non_member = dist.GroupMember.NON_GROUP_MEMBER
    t = torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dist.all_reduce(t, group=non_member) is None
        assert dist.broadcast(t, src=0, group=non_member, async_op=True) is None
    assert t.tolist() == [1.0, 1.0]
    assert [str(w.message) for w in caught] == [
        "Running all_reduce on global rank 0 which does not belong to the given group.",
        "Running broadcast on global rank 0 which does not belong to the given group.",
    ]
    assert caught[0].filename == __file__  # the warning points at the caller
    assert dist.get_rank(non_member) == -1 and dist.get_world_size(non_member) == -1
    with pytest.raises(ValueError, match="Invalid process group specified"):
        dist.get_backend_config(non_member)
    dist.destroy_process_group(non_member)
    assert dist.is_initialized()


def test_destroy_one_group_or_all(world1):
    first, second = dist.new_group([0]), dist.new_group([0])
    dist.destroy_process_group(first)
    assert dist.is_initialized()
    with pytest.raises(dist.DistBackendError, match="destroyed"):
        dist.all_reduce(torch.ones(1), group=first)
    dist.all_reduce(torch.ones(1), group=second)
    dist.destroy_process_group(dist.group.WORLD)  # the default group: every group, as in torch
    assert not dist.is_initialized() and dist.get_pg_count() == 0
    with pytest.raises(dist.DistBackendError, match="destroyed"):
        dist.all_reduce(torch.ones(1), group=second)
    # A new world does not reuse the old groups' names (the store may be the same).
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert dist.get_pg_count() == 1
    assert dist.new_group([0]).group_name not in {first.group_name, second.group_name}


def test_group_stores_are_separate():
    root = dist.HashStore()
    dist.init_process_group("gloo", store=root, rank=0, world_size=1)
    group = dist.new_group([0])
    group.store.set("k", "group")
    dist.group.WORLD.store.set("k", "world")
    assert group.store.get("k") == b"group" and root.get(f"{group.group_name}/k") == b"group"


def test_groups_share_the_worlds_connections():
    # 4 ranks on one host: 20 groups open no socket; two groups and the world run at once
    # from three threads; a mismatch in one group fails its two ranks and nothing else.
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = [r["ok"] for r in run_world("group_workers:shared_connections", 4, timeout=120, port=server.port)]
    for rank, out in enumerate(results):
        assert out["after"] == out["before"], (rank, out["before"], out["after"])
        for index, ranks in out["members"].items():
            assert out["sums"][index] == sum(r + 1 for r in ranks), (rank, index)
        expected = {"world", "all"} | ({"pair"} if rank in (0, 3) else set())
        assert set(out["concurrent"]) == expected and all(out["concurrent"].values()), (rank, out["concurrent"])
        if rank in (0, 3):
            assert out["mismatch"] is not None and "mismatch" in out["mismatch"]["message"], out["mismatch"]
        assert out["after_failure"] == {"world": 10, "all": 10}, (rank, out["after_failure"])
