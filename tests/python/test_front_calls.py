"""The C entries of the front's hot calls (process_group.native_front, ringtree._C.FrontCall):
to a caller each is the Python function it wraps (signature, docs, pickling), it runs that
function's common branch itself (the default group, no group argument), and every other
call reaches the Python function, so that results and errors are the same either way."""

from __future__ import annotations

import inspect
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import pytest

import ringtree
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
        (ringtree.broadcast, lambda f: f(data, [0])),
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
        if in_c[0] != "TypeError" or "argument" not in in_c[1]:  # refused before the body runs
            assert runs[0] == 1, f"{front.__name__} did not reach the Python function"


def test_without_a_default_group_the_calls_raise_as_the_python_functions_do():
    data = np.zeros(2, dtype=np.float32)
    for name in HOT_CALLS:
        front = getattr(ringtree, name)
        args = () if name == "barrier" else (data, data) if "single" in name else (data, 0)
        assert outcome(lambda: front(*args)) == outcome(lambda: front.__wrapped__(*args)), name
        assert outcome(lambda: front(*args))[0] != "ok", name
