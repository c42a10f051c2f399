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


def test_the_work_type_in_one_process(world1):
    """ringtree.Work is the module's own type: its arguments are checked as torch's are,
    it takes weak references, and it cannot be made by hand."""
    import datetime
    import gc
    import weakref

    import numpy as np

    data = np.ones(4, dtype=np.float32)
    work = ringtree.all_reduce(data, async_op=True)
    assert type(work) is ringtree.Work
    assert work.wait() is True
    assert work.wait(datetime.timedelta(seconds=1)) is True
    assert work.wait(timeout=datetime.timedelta(0)) is True
    assert work.wait(0.5) is True  # seconds as a float, as before
    with pytest.raises(TypeError, match="timedelta"):
        work.wait("soon")
    with pytest.raises(TypeError, match="one argument"):
        work.wait(datetime.timedelta(0), datetime.timedelta(0))
    with pytest.raises(TypeError, match="one argument"):
        work.wait(deadline=datetime.timedelta(0))
    with pytest.raises(ValueError, match="must not be negative"):
        work.wait(datetime.timedelta(seconds=-1))
    with pytest.raises(ValueError, match="must not be negative"):
        work.wait(-0.5)
    with pytest.raises(ValueError, match="nan"):
        work.wait(float("nan"))
    with pytest.raises(TypeError, match="timedelta"):
        work.wait(5)  # an int is neither (torch takes a timedelta)
    for negative in (datetime.timedelta.min, datetime.timedelta(days=-106_751_992), float("-inf"), -1e300, -1e-9):
        with pytest.raises(ValueError, match="must not be negative"):
            work.wait(negative)
    # Past the clock's range is no limit, not an overflow.
    for endless in (datetime.timedelta.max, float("inf"), 1e300):
        assert work.wait(endless) is True
    assert (work.is_completed(), work.is_success(), work.exception(), work.source_rank()) == (True, True, None, -1)
    assert work.result()[0] is data and work.synchronize() is None
    assert repr(work) == "<ringtree.Work all_reduce completed>"

    seen = []
    work._add_done_callback(callback=seen.append)
    work._add_done_callback(seen.append)
    assert seen == [None, None]
    with pytest.raises(TypeError, match="callable"):
        work._add_done_callback(3)

    with pytest.raises(TypeError, match="made by the asynchronous calls"):
        ringtree.Work()
    reference = weakref.ref(work)
    assert reference() is work
    del work
    gc.collect()
    assert reference() is None
