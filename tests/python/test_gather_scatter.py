"""The gather/scatter family (all_gather, all_gather_single, gather, scatter,
reduce_scatter, reduce_scatter_single, all_to_all, all_to_all_single) and the coalesced
collectives: the case grid in real processes at world sizes 1..5 (surface_workers, one
launch shared with test_p2p.py and test_object_collectives.py), and in this process at
world size 1 the deprecated aliases, non-members, asynchronous errors and exports."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import ringtree as dist
from harness import failed_cases
from surface_workers import WORLDS, launch

FAMILY = ["all_gather", "all_gather_single", "gather", "scatter", "reduce_scatter", "reduce_scatter_single",
          "all_to_all", "all_to_all_single", "all_reduce_coalesced", "all_gather_coalesced"]


@pytest.mark.parametrize("world_size", [1, *sorted(WORLDS)])
def test_family_grid(world_size):
    for rank, summary in enumerate(launch()[world_size]):
        assert not summary["family"]["failures"], failed_cases(
            summary["family"], f"world of {world_size}, rank {rank}")
        assert summary["family"]["cases"] > 1000


def test_sizes_that_disagree_across_ranks_raise_on_every_rank():
    assert [summary["mismatches"]["all_gather"] for summary in launch()[2]] == ["CollectiveMismatchError"] * 2


def test_names_are_exported():
    for name in FAMILY + ["all_gather_into_tensor", "reduce_scatter_tensor"]:
        assert name in dist.__all__ and callable(getattr(dist, name))
    assert callable(dist._all_gather_base) and callable(dist._reduce_scatter_base)


def test_deprecated_aliases_warn_and_work(world1):
    out, data = torch.zeros(3), torch.arange(3.0)
    for alias, args in [("all_gather_into_tensor", (out, data)), ("_all_gather_base", (out, data)),
                        ("reduce_scatter_tensor", (out, data)), ("_reduce_scatter_base", (out, data))]:
        out.zero_()
        with pytest.warns(FutureWarning, match=f"ringtree.{alias}` .*(all_gather|reduce_scatter)_single"):
            assert getattr(dist, alias)(*args) is None
        assert torch.equal(out, data), alias
    with pytest.warns(FutureWarning, match="all_reduce_coalesced` will be deprecated"):
        work = dist.all_reduce_coalesced(data, op=dist.ReduceOp.MAX, async_op=True)
    assert work.wait() and torch.equal(data, torch.arange(3.0))
    outputs = [[torch.zeros(2)]]
    with pytest.warns(FutureWarning, match="all_gather_coalesced` will be deprecated"):
        assert dist.all_gather_coalesced(outputs, [torch.ones(2)]) is None
    assert torch.equal(outputs[0][0], torch.ones(2))


def test_non_member_group_warns_and_does_nothing(world1):
    t = torch.ones(2)
    outsider = dist.GroupMember.NON_GROUP_MEMBER
    calls = {
        "all_gather": lambda: dist.all_gather([t], t, group=outsider),
        "all_gather_single": lambda: dist.all_gather_single(t, t, group=outsider),
        "gather": lambda: dist.gather(t, [t], group=outsider),
        "scatter": lambda: dist.scatter(t, [t], group=outsider),
        "reduce_scatter": lambda: dist.reduce_scatter(t, [t], group=outsider),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(t, t, group=outsider),
        "all_to_all": lambda: dist.all_to_all([t], [t], group=outsider),
        "all_to_all_single": lambda: dist.all_to_all_single(t, t, group=outsider),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([t], group=outsider),
        "all_gather_coalesced": lambda: dist.all_gather_coalesced([[t]], [t], group=outsider),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for name, call in calls.items():
            with pytest.warns(UserWarning, match=f"Running {name} on global rank 0 which does not belong"):
                assert call() is None


def test_async_error_is_raised_by_wait(world1):
    work = dist.all_gather([torch.empty(3)], torch.ones(3), async_op=True, algorithm="chain")
    with pytest.raises(ValueError, match="'chain' is not available for allgather"):
        work.wait()
    assert work.is_completed() and not work.is_success()
    assert isinstance(work.exception(), ValueError)
    assert work.source_rank() == -1
    out = [torch.empty(3)]
    dist.all_gather(out, torch.ones(3))  # refused before anything moved: the group still works
    assert torch.equal(out[0], torch.ones(3))


def test_messages_name_the_call_and_argument(world1):
    with pytest.raises(ValueError, match=r"tensor_list must hold one tensor per rank of the group \(1\), got 2"):
        dist.all_gather([torch.zeros(1), torch.zeros(1)], torch.zeros(1))
    with pytest.raises(ValueError, match="different dtypes: tensor is float32 but tensor_list.0. is int64"):
        dist.all_gather([torch.zeros(1, dtype=torch.int64)], torch.zeros(1))
    with pytest.raises(TypeError, match="scatter_list must be a list of tensors, got Tensor"):
        dist.scatter(torch.zeros(1), torch.zeros(1), src=0)
    with pytest.raises(ValueError, match="Argument ``gather_list`` must be specified on destination rank."):
        dist.gather(torch.zeros(1), None, dst=0)
    with pytest.raises(ValueError, match="input_split_sizes add up to 3 but input's dim 0 is 2"):
        dist.all_to_all_single(torch.zeros(2), torch.zeros(2), None, [3])
    with pytest.raises(ValueError, match=r"output_split_sizes must hold one size per rank of the group \(1\), got 2"):
        dist.all_to_all_single(torch.zeros(2), torch.zeros(2), [1, 1], None)
    with pytest.raises(ValueError, match="input_split_sizes must be non-negative, got -1 at index 0"):
        dist.all_to_all_single(torch.zeros(2), torch.zeros(2), None, [-1])
    with pytest.raises(ValueError, match="does not support ReduceOp.MIN on complex64"):
        dist.reduce_scatter_single(torch.zeros(1, dtype=torch.complex64), torch.zeros(1, dtype=torch.complex64),
                                   op=dist.ReduceOp.MIN)
    with pytest.raises(ValueError, match="read-only"):
        read_only = np.zeros(2)
        read_only.flags.writeable = False
        dist.all_gather_single(read_only, np.zeros(2))


def test_buffer_protocol_and_split_rows(world1):
    out = bytearray(3)
    dist.all_gather_single(out, b"abc")  # read-only input is fine
    assert out == bytearray(b"abc")
    rows = torch.arange(6).reshape(3, 2)
    output = torch.zeros(3, 2, dtype=torch.int64)
    dist.all_to_all_single(output, rows, [3], [3])  # split sizes count rows of dim 0
    assert torch.equal(output, rows)
    array_rows = np.arange(6, dtype=np.float64).reshape(3, 2)  # through the buffer protocol
    array_out = np.zeros((3, 2))
    dist.all_to_all_single(array_out, array_rows, (3,), (3,))
    assert (array_out == array_rows).all()
    scalar_out = torch.zeros(())
    dist.all_to_all_single(scalar_out, torch.tensor(7.0))  # a 0-dim tensor is one row
    assert scalar_out.item() == 7.0


def test_requires_an_initialized_group():
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.all_gather([torch.zeros(1)], torch.zeros(1))


def test_destroyed_group_refuses(world1):
    group = dist.group.WORLD
    dist.destroy_process_group()
    with pytest.raises(dist.DistBackendError, match="has been destroyed"):
        dist.reduce_scatter(torch.zeros(1), [torch.zeros(1)], group=group)
