"""The C entries of the front's hot calls (process_group.native_front, ringtree._C.FrontCall):
to a caller each is the Python function it wraps (signature, docs, pickling), it runs that
function's common branch itself (the default group, no group argument), and every other
call reaches the Python function, so that results and errors are the same either way."""

from __future__ import annotations

import inspect
import pickle
import pydoc
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import pytest

import ringtree
from harness import run_world
from ringtree import _C

HOT_CALLS = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather_single",
    "reduce_scatter_single",
    "all_to_all_single",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
]


@contextmanager
def python_calls(function: Any) -> Iterator[list[int]]:
    """Counts the runs of ``function``'s Python body (its __wrapped__) while active."""
    code = function.__wrapped__.__code__
    runs = [0]

    def tracer(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            runs[0] += 1

    previous = sys.getprofile()
    sys.setprofile(tracer)
    try:
        yield runs
    finally:
        sys.setprofile(previous)


def outcome(call: Callable[[], Any]) -> tuple[str, str]:
    """(exception type name, message), or ("ok", repr of the result)."""
    try:
        return ("ok", type(call()).__name__)
    except Exception as error:  # noqa: BLE001 (any outcome is compared)
        return (type(error).__name__, str(error))


@pytest.mark.parametrize("name", HOT_CALLS)
def test_a_hot_call_shows_as_its_python_function(name):
    front = getattr(ringtree, name)
    assert isinstance(front, _C.FrontCall)
    python = front.__wrapped__
    assert inspect.isfunction(python)
    for attribute in ("__doc__", "__name__", "__qualname__", "__module__", "__defaults__", "__kwdefaults__"):
        assert getattr(front, attribute) == getattr(python, attribute), attribute
    assert inspect.signature(front) == inspect.signature(python)
    assert pickle.loads(pickle.dumps(front)) is front
    assert repr(front) == repr(python)
    assert callable(front)
    assert inspect.isroutine(front)
    assert python.__doc__.splitlines()[0] in pydoc.render_doc(front)
    assert weakref.ref(front)() is front

    class Holder:
        call = front

    assert Holder.call is front  # looked up on the class: itself, as a function is
    assert Holder().call.__func__ is front  # on an instance: a bound method, as a function's


def test_a_front_call_refuses_what_it_cannot_wrap():
    def unknown(tensor):
        return tensor

    from ringtree._world import world
    from ringtree.process_group import ProcessGroup

    with pytest.raises(ValueError, match="no C entry"):
        _C.FrontCall(unknown, world, ProcessGroup)
    with pytest.raises(TypeError):
        _C.FrontCall(len, world, ProcessGroup)

    def all_reduce(tensor, *rest):
        return tensor

    with pytest.raises(ValueError, match="args"):
        _C.FrontCall(all_reduce, world, ProcessGroup)
    with pytest.raises(TypeError, match="__slots__"):
        _C.FrontCall(ringtree.all_reduce.__wrapped__, object(), ProcessGroup)


def test_common_calls_run_in_c_and_give_the_python_results(world1):
    data = np.arange(4, dtype=np.float32)
    out = np.zeros(4, dtype=np.float32)
    calls = [
        (ringtree.all_reduce, lambda f: f(data)),
        (ringtree.all_reduce, lambda f: f(data, ringtree.ReduceOp.MAX)),
        (ringtree.all_reduce, lambda f: f(tensor=data, op=ringtree.ReduceOp.SUM, async_op=True).wait()),
        (ringtree.all_reduce, lambda f: f(data, algorithm="ring")),
        (ringtree.broadcast, lambda f: f(data, 0)),
        (ringtree.broadcast, lambda f: f(data, src=0, async_op=False)),
        (ringtree.reduce, lambda f: f(data, 0)),
        (ringtree.all_gather_single, lambda f: f(out, data)),
        (ringtree.reduce_scatter_single, lambda f: f(out, data)),
        (ringtree.all_to_all_single, lambda f: f(out, data)),
        (ringtree.barrier, lambda f: f()),
        (ringtree.barrier, lambda f: f(async_op=True).wait()),
    ]
    for front, call in calls:
        with python_calls(front) as runs:
            in_c = outcome(lambda: call(front))
        assert runs[0] == 0, f"{front.__name__} took the Python way"
        assert in_c == outcome(lambda: call(front.__wrapped__)), front.__name__
    np.testing.assert_array_equal(out, data)


def test_other_calls_reach_the_python_function_with_the_same_outcome(world1):
    data = np.arange(4, dtype=np.float32)
    out = np.zeros(4, dtype=np.float32)
    world = ringtree.group.WORLD
    calls = [
        (ringtree.all_reduce, lambda f: f(data, group=world)),
        (ringtree.all_reduce, lambda f: f(data, bogus=1)),
        (ringtree.all_reduce, lambda f: f(data, ringtree.ReduceOp.SUM, None, False, "ring")),
        (ringtree.all_reduce, lambda f: f()),
        (ringtree.all_reduce, lambda f: f(data, tensor=data)),
        (ringtree.broadcast, lambda f: f(data, 3)),
        (ringtree.broadcast, lambda f: f(data, None, group_src=0)),
        (ringtree.broadcast, lambda f: f(data)),
        (ringtree.reduce, lambda f: f(data, dst=7)),
        (ringtree.all_gather_single, lambda f: f(out, data, world)),
        (ringtree.all_to_all_single, lambda f: f(out, data, [4], [4], group=world)),
        (ringtree.barrier, lambda f: f(timeout=5)),
        (ringtree.send, lambda f: f(data, 0)),
        (ringtree.isend, lambda f: f(data, 1)),
        (ringtree.recv, lambda f: f(data, 0)),
        (ringtree.irecv, lambda f: f(data, 2, tag=-1)),
    ]
    for front, call in calls:
        with python_calls(front) as runs:
            in_c = outcome(lambda: call(front))
        assert in_c == outcome(lambda: call(front.__wrapped__)), front.__name__
        refused_by_binding = in_c[0] == "TypeError" and any(
            words in in_c[1]
            for words in ("unexpected keyword", "multiple values", "required positional", "positional arguments but")
        )
        if not refused_by_binding:  # the interpreter refuses those before the body runs
            assert runs[0] == 1, f"{front.__name__} did not reach the Python function"


def test_without_a_default_group_the_calls_raise_as_the_python_functions_do():
    data = np.zeros(2, dtype=np.float32)
    for name in HOT_CALLS:
        front = getattr(ringtree, name)
        args = () if name == "barrier" else (data, data) if "single" in name else (data, 0)
        assert outcome(lambda: front(*args)) == outcome(lambda: front.__wrapped__(*args)), name
        assert outcome(lambda: front(*args))[0] != "ok", name


def test_defaults_are_the_functions_own_at_each_call(world1, monkeypatch):
    """The C entry reads the defaults at the call, as the interpreter does."""
    data = np.ones(2, dtype=np.float32)
    python = ringtree.all_reduce.__wrapped__
    monkeypatch.setattr(python, "__defaults__", (ringtree.ReduceOp.SUM, None, True))
    with python_calls(ringtree.all_reduce) as runs:
        work = ringtree.all_reduce(data)
    assert runs[0] == 0
    assert isinstance(work, ringtree.Work) and work.wait()
    monkeypatch.setattr(python, "__kwdefaults__", {"algorithm": "no such algorithm"})
    assert outcome(lambda: ringtree.all_reduce(data)) == outcome(lambda: python(data))
    assert outcome(lambda: ringtree.all_reduce(data))[0] == "ValueError"


def test_a_rank_lookup_that_raises_raises_once_as_in_python(world1):
    """The rank's own __hash__ runs once per call, and its exception comes out as the
    Python function raises it."""

    class Rank:
        hashes = 0

        def __hash__(self) -> int:
            Rank.hashes += 1
            raise ZeroDivisionError("rank hash")

    data = np.ones(2, dtype=np.float32)
    for front in (ringtree.broadcast, ringtree.reduce, ringtree.send, ringtree.irecv):
        Rank.hashes = 0
        assert outcome(lambda: front(data, Rank())) == ("ZeroDivisionError", "rank hash")
        assert Rank.hashes == 1, front.__name__
        assert outcome(lambda: front.__wrapped__(data, Rank())) == ("ZeroDivisionError", "rank hash")


def two_rank_calls(rank: int, world_size: int, port: int) -> dict:
    """Run by test_two_ranks_run_every_call_in_c: each hot call with its common arguments,
    positional and by keyword, checked for its data and for no run of its Python body."""
    from datetime import timedelta

    store = ringtree.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=20))
    ringtree.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=20))
    peer = 1 - rank
    failures: list[str] = []
    python_runs = {name: 0 for name in HOT_CALLS}
    codes = {getattr(ringtree, name).__wrapped__.__code__: name for name in HOT_CALLS}

    def tracer(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            python_runs[codes[frame.f_code]] += 1

    def check(what: str, got: np.ndarray, expected: list[float]) -> None:
        if got.tolist() != expected:
            failures.append(f"{what}: {got.tolist()} != {expected}")

    mine = np.array([rank + 1.0, 10.0 * (rank + 1)], dtype=np.float32)
    sys.setprofile(tracer)
    try:
        for by_keyword in (False, True):
            t = mine.copy()
            ringtree.all_reduce(tensor=t, op=ringtree.ReduceOp.MAX) if by_keyword else ringtree.all_reduce(t)
            check("all_reduce", t, [2.0, 20.0] if by_keyword else [3.0, 30.0])
            t = mine.copy()
            ringtree.broadcast(tensor=t, src=1) if by_keyword else ringtree.broadcast(t, 1)
            check("broadcast", t, [2.0, 20.0])
            t = mine.copy()
            ringtree.reduce(tensor=t, dst=1) if by_keyword else ringtree.reduce(t, 1)
            check("reduce", t, [3.0, 30.0] if rank == 1 else mine.tolist())
            out = np.zeros(4, dtype=np.float32)
            ringtree.all_gather_single(out, mine)
            check("all_gather_single", out, [1.0, 10.0, 2.0, 20.0])
            part = np.zeros(1, dtype=np.float32)
            ringtree.reduce_scatter_single(output=part, input=mine) if by_keyword else ringtree.reduce_scatter_single(part, mine)
            check("reduce_scatter_single", part, [3.0] if rank == 0 else [30.0])
            out = np.zeros(2, dtype=np.float32)
            ringtree.all_to_all_single(out, mine)
            check("all_to_all_single", out, [1.0, 2.0] if rank == 0 else [10.0, 20.0])
            ringtree.barrier()
            got = np.zeros(2, dtype=np.float32)
            if rank == 0:
                ringtree.send(tensor=mine, dst=peer, tag=4) if by_keyword else ringtree.send(mine, peer)
                source = ringtree.recv(got, peer)
            else:
                source = ringtree.recv(tensor=got, src=peer, tag=4) if by_keyword else ringtree.recv(got, peer)
                ringtree.send(mine, peer)
            check("send/recv", got, [2.0, 20.0] if rank == 0 else [1.0, 10.0])
            if source != peer:
                failures.append(f"recv returned {source}, not {peer}")
            got = np.zeros(2, dtype=np.float32)
            sent = ringtree.isend(mine, peer, tag=5)
            received = ringtree.irecv(tensor=got, src=peer, tag=5) if by_keyword else ringtree.irecv(got, peer, tag=5)
            sent.wait()
            received.wait()
            check("isend/irecv", got, [2.0, 20.0] if rank == 0 else [1.0, 10.0])
        ringtree.barrier(group=ringtree.group.WORLD)  # the Python way: shows the tracer works here
    finally:
        sys.setprofile(None)
    ringtree.destroy_process_group()
    return {"failures": failures, "python_runs": python_runs}


def test_two_ranks_run_every_call_in_c():
    """Two processes: every hot call's common form, positional and by keyword, gives the
    right data without running its Python body (point-to-point included, whose peer map
    is empty in a one-rank world)."""
    server = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for rank, result in enumerate(run_world("test_front_calls:two_rank_calls", 2, timeout=60, port=server.port)):
        value = result["ok"]
        assert not value["failures"], f"rank {rank}: {value['failures']}"
        runs = value["python_runs"]
        assert runs.pop("barrier") == 1, f"rank {rank}: the tracer missed the one call made the Python way"
        assert not any(runs.values()), f"rank {rank}: Python bodies ran {runs}"
