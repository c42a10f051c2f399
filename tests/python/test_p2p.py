"""Point-to-point: send, recv, isend, irecv, P2POp and batch_isend_irecv in real processes
at world sizes 1..5 (surface_workers, one launch shared with test_gather_scatter.py and
test_object_collectives.py): every dtype, NumPy, any source, tags, sends posted before
receives; and in this process at world size 1 the engine's life cycle and argument rules."""

from __future__ import annotations

import pytest
import torch

import ringtree as dist
from harness import failed_cases, run_world
from surface_workers import WORLDS, launch


@pytest.mark.parametrize("world_size", [1, *sorted(WORLDS)])
def test_point_to_point_grid(world_size):
    for rank, summary in enumerate(launch()[world_size]):
        assert not summary["p2p"]["failures"], failed_cases(
            summary["p2p"], f"world of {world_size}, rank {rank}")
        assert summary["p2p"]["cases"] >= (11 if world_size == 1 else 70)


@pytest.mark.parametrize("world_size", [size for size in sorted(WORLDS) if size >= 3])
def test_subgroup_ranks(world_size):
    """Collectives, point-to-point and objects on a subgroup whose group ranks differ from
    the global ones (surface_workers.subgroup_cases)."""
    for rank, summary in enumerate(launch()[world_size]):
        assert not summary["subgroup"]["failures"], failed_cases(
            summary["subgroup"], f"world of {world_size}, rank {rank}")
        assert summary["subgroup"]["cases"] >= 3


def test_size_mismatch_fails_the_receive():
    receiver = launch()[2][1]["mismatches"]
    assert receiver["p2p"] == "CollectiveMismatchError"
    assert receiver["p2p_exception"] == "CollectiveMismatchError"


def test_names_are_exported():
    for name in ("send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"):
        assert name in dist.__all__


def test_engine_lives_with_the_group(world1):
    engine = world1._p2p
    assert isinstance(engine, dist._C.ProcessGroup) and (engine.rank, engine.size) == (0, 1)
    dist.destroy_process_group()
    with pytest.raises(dist.DistBackendError, match="has been destroyed"):
        dist.irecv(torch.zeros(1), group=world1)


def test_non_member_group_warns_and_does_nothing(world1):
    t = torch.ones(2)
    outsider = dist.GroupMember.NON_GROUP_MEMBER
    for name, call, result in [("send", lambda: dist.send(t, 0, group=outsider), None),
                               ("recv", lambda: dist.recv(t, 0, group=outsider), -1),
                               ("isend", lambda: dist.isend(t, 0, group=outsider), None),
                               ("irecv", lambda: dist.irecv(t, group=outsider), None)]:
        with pytest.warns(UserWarning, match=f"Running {name} on global rank 0 which does not belong"):
            assert call() == result
    with pytest.raises(ValueError, match="not a member"):
        dist.P2POp(dist.isend, t, 0, group=outsider)


def test_argument_rules(world1):
    t = torch.ones(2)
    with pytest.raises(ValueError, match="Invalid destination rank: destination rank should not be the same"):
        dist.send(t, 0)
    with pytest.raises(ValueError, match="isend: peer 0 is this rank"):
        dist.isend(t, group_dst=0)
    with pytest.raises(ValueError, match="Can't specify both dst and group_dst"):
        dist.isend(t, dst=0, group_dst=0)
    with pytest.raises(ValueError, match="Invalid ``op``"):
        dist.P2POp(dist.send, t, 0)
    with pytest.raises(ValueError, match="Each op is expected to to be of type ``ringtree.P2POp``"):
        dist.batch_isend_irecv("not a list")
    op = dist.P2POp(dist.irecv, t, group_peer=0, tag=4)
    assert (op.peer, op.group_peer, op.tag, op.group) == (0, 0, 4, world1)
    assert repr(op) == f"P2POp(irecv pg={world1.group_name}, group_src=0, group_dst=0, torch.Size([2]), torch.float32)"


def test_requires_an_initialized_group():
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.send(torch.zeros(1), 1)


def test_threads_share_the_gil():
    """Small calls keep the GIL until they wait: collectives, point-to-point with futures
    and plain Python code on three threads of each rank all finish (workers.py)."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for rank, result in enumerate(run_world("workers:threads_share_the_gil", 2, timeout=90, port=server.port)):
        value = result["ok"]
        assert not value["hung"] and not value["errors"], f"rank {rank}: {value}"
        assert value["counts"]["all_reduce"] == 5000 and value["counts"]["exchanges"] == 2000, value["counts"]
        assert value["counts"]["python"] > 0
