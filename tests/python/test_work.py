"""Work.result(), Work.get_future() and Work.synchronize() (torch 2.13's Work API): the
values per operation, completion without wait(), failures, in real processes."""

from __future__ import annotations

import pytest

import ringtree
from harness import run_world


def test_results_and_futures_of_async_operations():
    pytest.importorskip("torch")
    server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for rank, result in enumerate(run_world("workers:work_results_and_futures", 2, port=server.port,
                                            env={"RINGTREE_TRANSPORT": "shm"})):
        failures = result["ok"]["failures"]
        assert not failures, f"rank {rank}: " + "\n  ".join(failures)


def test_result_and_future_in_one_process(world1):
    torch = pytest.importorskip("torch")
    t = torch.ones(3)
    work = ringtree.all_reduce(t, async_op=True)
    assert work.get_future().wait() == [t]
    assert work.result()[0] is t
    assert ringtree.Work.get_future.__doc__ and "torch.futures.Future" in ringtree.Work.get_future.__doc__
