"""Object collectives (all_gather_object, gather_object, broadcast_object_list,
scatter_object_list, send_object_list, recv_object_list) in real processes at world sizes
1..5 (surface_workers, one launch shared with test_gather_scatter.py and test_p2p.py), and
in this process at world size 1: non-members, unpicklable objects, the documented warning."""

from __future__ import annotations

import pickle

import pytest

import ringtree as dist
from harness import failed_cases
from surface_workers import WORLDS, launch

NAMES = ["all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list", "send_object_list",
         "recv_object_list"]


@pytest.mark.parametrize("world_size", [1, *sorted(WORLDS)])
def test_object_grid(world_size):
    for rank, summary in enumerate(launch()[world_size]):
        assert not summary["objects"]["failures"], failed_cases(
            summary["objects"], f"world of {world_size}, rank {rank}")
        assert summary["objects"]["cases"] >= 14


def test_names_are_exported_and_warn_about_pickle():
    assert "arbitrary code" in dist.object_collectives.__doc__
    for name in NAMES:
        assert name in dist.__all__
        assert "arbitrary code" in getattr(dist, name).__doc__, name


def test_non_member_group_warns_and_does_nothing(world1):
    outsider = dist.GroupMember.NON_GROUP_MEMBER
    objects = ["untouched"]
    for name, call, result in [
        ("all_gather_object", lambda: dist.all_gather_object(objects, 1, group=outsider), None),
        ("gather_object", lambda: dist.gather_object(1, objects, group=outsider), None),
        ("broadcast_object_list", lambda: dist.broadcast_object_list(objects, group=outsider), None),
        ("scatter_object_list", lambda: dist.scatter_object_list(objects, [1], group=outsider), None),
        ("send_object_list", lambda: dist.send_object_list(objects, 0, group=outsider), None),
        ("recv_object_list", lambda: dist.recv_object_list(objects, group=outsider), -1),
    ]:
        with pytest.warns(UserWarning, match=f"Running {name} on global rank 0 which does not belong"):
            assert call() == result
    assert objects == ["untouched"]


def test_unpicklable_object_raises_before_anything_moves(world1):
    out = [None]
    with pytest.raises((pickle.PicklingError, AttributeError)):
        dist.all_gather_object(out, lambda: 0)
    dist.all_gather_object(out, {"still": "works"})
    assert out == [{"still": "works"}]


def test_gather_object_checks_its_list_on_the_destination(world1):
    with pytest.raises(ValueError, match="Argument ``gather_list`` must be specified on destination rank."):
        dist.gather_object(1, None)
    with pytest.raises(ValueError, match=r"object_gather_list must hold one entry per rank of the group \(1\), got 2"):
        dist.gather_object(1, [None, None])
    out = [None]
    dist.gather_object({"one": 1}, out)
    assert out == [{"one": 1}]
