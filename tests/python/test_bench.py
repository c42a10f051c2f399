"""Tests of the benchmark CLI ``ringtree-bench`` (``python -m ringtree.bench``) and of how its
other measurements are reached (subcommands, and the scripts of benchmarks/).

Unit tests cover the command line (size suffixes, sweeps, busbw factors), the tables
(nccl-tests' format), medians and comparisons, and the verifiable data of every
collective (checked against a NumPy simulation of each). End-to-end tests run 2-rank jobs
(3-rank for the collectives whose peers depend on the rank) of every system installed
here on small sizes with ``-c 1`` and expect no wrong element; each is bounded by a
subprocess timeout.

``--device cuda`` is tested without a GPU: its options and their errors, the exit status
2 and message when CUDA is missing, the GPU count checks against a stand-in torch, the
synchronisation of the timed loop, and the worker's CUDA flow on buffers from torch's
allocator in host memory. One test runs ringtree and nccl on a GPU, skipped where torch
sees none.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import types
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

import ringtree
from ringtree.bench import data, devices, options, report, systems, worker

BENCH = [sys.executable, "-m", "ringtree.bench"]
SMALL = "-b 8 -e 64K -n 2 -w 1 -c 1 --timeout 40".split()
E2E_TIMEOUT_S = 50
ALL = ["allreduce", "broadcast", "reduce", "barrier"]
SPLIT = ["allgather", "reduce_scatter", "alltoall"]
POINT_TO_POINT = ["sendrecv", "pingpong"]

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_MPI = shutil.which("mpirun") is not None and importlib.util.find_spec("mpi4py") is not None
HAVE_GPU = HAVE_TORCH and __import__("torch").cuda.is_available()
RINGTREE_READY = all(hasattr(ringtree, f) for c in options.COLLECTIVES.values() for f in c.functions)


def _bench(*argv: str, timeout: float = E2E_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *argv], capture_output=True, text=True, timeout=timeout)


# --- command line ----------------------------------------------------------------------


_SIZES = [("8", 8), ("64K", 65536), ("64k", 65536), ("64KB", 65536), ("64KiB", 65536), ("64M", 64 << 20)]


@pytest.mark.parametrize(("text", "expected"), [*_SIZES, ("1G", 1 << 30), ("100b", 100), (" 2M ", 2 << 20)])
def test_parse_size(text, expected):
    assert options.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-1", "64X", "64 MBs"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="not a size"):
        options.parse_size(text)


def test_size_sweep_doubles_from_min_to_max():
    sweep = options.size_sweep(8, 64 << 10, 2, 4)
    assert sweep[0] == (8, 2)
    assert sweep[-1] == (65536, 16384)
    assert len(sweep) == 14
    assert all(size == count * 4 for size, count in sweep)


def test_size_sweep_rounds_to_elements_and_drops_empty_sizes():
    assert options.size_sweep(4, 32, 2, 8) == [(8, 1), (16, 2), (32, 4)]
    assert options.size_sweep(10, 100, 3, 4) == [(8, 2), (28, 7), (88, 22)]
    assert options.size_sweep(1, 4, 2, 8) == []


def test_size_sweep_rejects_bad_factor():
    with pytest.raises(ValueError):
        options.size_sweep(8, 64, 1, 4)


def test_size_sweep_rounds_to_whole_parts():
    assert options.size_sweep(8, 64, 2, 4, parts=3) == [(12, 3), (24, 6), (60, 15)]
    assert options.size_sweep(8, 64, 2, 4, parts=2) == [(8 << i, 2 << i) for i in range(4)]


@pytest.mark.parametrize(("world_size", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_busbw_factors(world_size, factor):
    collectives = options.COLLECTIVES
    assert collectives["allreduce"].busbw_factor(world_size) == factor
    for name in SPLIT:
        assert collectives[name].busbw_factor(world_size) == factor / 2, name
    for name in ["broadcast", "reduce", *POINT_TO_POINT]:
        assert collectives[name].busbw_factor(world_size) == 1.0, name
    assert collectives["barrier"].busbw_factor is None
    assert not collectives["barrier"].has_data


def test_buffer_layouts():
    collectives = options.COLLECTIVES
    expected = {
        "allreduce": (1, (1, 1), True),
        "allgather": (4, (1, 4), False),
        "reduce_scatter": (4, (4, 1), False),
        "alltoall": (4, (4, 4), False),
        "sendrecv": (1, (1, 1), False),
        "pingpong": (1, (1, 1), False),
    }
    for name, (parts, buffer_parts, in_place) in expected.items():
        collective = collectives[name]
        assert (collective.parts(4), collective.buffer_parts(4), collective.in_place) == (
            parts,
            buffer_parts,
            in_place,
        ), name
    assert collectives["pingpong"].transfers_per_call == 2
    assert collectives["sendrecv"].transfers_per_call == 1
    assert collectives["sendrecv"].min_ranks == collectives["pingpong"].min_ranks == 2


def test_defaults():
    args = options.parse_args([])
    assert [c.name for c in args.collectives] == ["allreduce"]
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (8, 64 << 20, 2)
    assert (args.iters, args.warmup_iters, args.check, args.root) == (20, 5, 1, 0)
    assert (args.datatype.name, args.op, args.system, args.compare) == ("float32", "sum", "ringtree", [])
    assert (args.nproc, args.repeat, args.json, args.plot) == (None, 1, None, None)


def test_torch_names_are_aliases():
    words = "all_gather all_gather_into_tensor reduce_scatter_tensor reducescatter all_to_all sendrecv,pingpong"
    args = options.parse_args(words.split())
    assert [c.name for c in args.collectives] == SPLIT + POINT_TO_POINT


def test_flags_and_aliases():
    args = options.parse_args(
        "all_reduce,broadcast barrier allreduce -b 1K -e 1G -f 4 -n 3 -w 0 -c 0 -d half -o product "
        "-r 1 --nproc 4 --compare gloo,mpi,ringtree --repeat 3 --algo ring --transport shm".split()
    )
    assert [c.name for c in args.collectives] == ["allreduce", "broadcast", "barrier"]
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (1024, 1 << 30, 4)
    assert (args.iters, args.warmup_iters, args.check) == (3, 0, 0)
    assert (args.datatype.name, args.datatype.label, args.op, args.root) == ("float16", "half", "prod", 1)
    assert (args.nproc, args.compare, args.repeat) == (4, ["gloo", "mpi"], 3)
    assert (args.algo, args.transport) == ("ring", "shm")


_BAD_COMMAND_LINES = [
    "-o band", "-d complex64", "gather", "-b 1M -e 1K", "--compare gloo", "--repeat 2", "--plot x.png",
    "--nproc 2 -r 2", "-f 1", "-c 2", "--nproc 2 --compare nccl", "-b 0", "--device tpu",
]  # fmt: skip


@pytest.mark.parametrize("argv", _BAD_COMMAND_LINES)
def test_bad_command_lines(argv, capsys):
    with pytest.raises(SystemExit) as info:
        options.parse_args(argv.split())
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_system_defaults_to_mpi_under_mpirun(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert options.parse_args([]).system == "mpi"
    monkeypatch.setenv("RANK", "0")
    assert options.parse_args([]).system == "ringtree"


def test_worker_argv_round_trips():
    args = options.parse_args(
        "reduce broadcast -b 16 -e 4M -f 4 -n 7 -w 2 --timing median -c 0 -d int8 -o max -r 1 --nproc 3 "
        "--timeout 99".split()
    )
    again = options.parse_args(options.worker_argv(args, "gloo", "/tmp/result"))
    keys = "minbytes maxbytes stepfactor iters warmup_iters timing check datatype op root timeout collectives"
    for key in [*keys.split(), "device", "allow_shared_gpu"]:
        assert getattr(again, key) == getattr(args, key), key
    assert (again.system, again.result_file, again.nproc) == ("gloo", "/tmp/result", None)
    args = options.parse_args("--device cuda --allow-shared-gpu --nproc 3 --compare nccl".split())
    again = options.parse_args(options.worker_argv(args, "nccl", "/tmp/result"))
    assert (again.device, again.allow_shared_gpu, again.system) == ("cuda", True, "nccl")


def test_unsupported_combinations(monkeypatch):
    collectives = options.COLLECTIVES
    allreduce, broadcast = collectives["allreduce"], collectives["broadcast"]
    reduce_scatter, alltoall = collectives["reduce_scatter"], collectives["alltoall"]
    f16, f32, i32 = options.DTYPES["float16"], options.DTYPES["float32"], options.DTYPES["int32"]

    def reason(system, collective, dtype, op, world_size=2, torch_found=True):
        return systems.unsupported_reason(system, collective, dtype, op, world_size, torch_found)

    assert "float16" in reason("mpi", allreduce, f16, "sum")
    assert "float16" in reason("mpi", reduce_scatter, f16, "sum")
    assert reason("mpi", broadcast, f16, "sum") is None
    assert reason("mpi", alltoall, f16, "sum") is None
    assert "AVG" in reason("mpi", allreduce, f32, "avg")
    assert "AVG" in reason("gloo", allreduce, i32, "avg")
    assert "AVG" in reason("gloo", reduce_scatter, i32, "avg")
    assert reason("gloo", reduce_scatter, f32, "avg") is None
    assert "torch" in reason("gloo", allreduce, f32, "sum", torch_found=False)
    for system in options.SYSTEMS:
        for name in POINT_TO_POINT:
            assert reason(system, collectives[name], f32, "sum", world_size=1) == "needs at least 2 ranks"
            assert reason(system, collectives[name], f32, "sum") is None
    monkeypatch.delattr(ringtree, "irecv")
    assert reason("ringtree", collectives["sendrecv"], f32, "sum") == "this ringtree has no ringtree.irecv"


# --- rows and tables ---------------------------------------------------------------------


def test_row_matches_nccl_tests_format():
    # The data row of NVIDIA/nccl#1161 (2 ranks, 1 GiB float sum, 9306.7 us).
    collective = options.COLLECTIVES["allreduce"]
    row = report.make_row(
        collective, "float", "sum", 0, 2, 1 << 30, 1 << 28, [[[9306.7e-6], 0], [[9000e-6], 0]]
    )
    assert row["time_us"] == pytest.approx(9306.7)
    assert row["algbw"] == pytest.approx(115.37, abs=0.005)
    assert row["busbw"] == row["algbw"]
    expected = "  1073741824     268435456     float     sum      -1   9306.7  115.37  115.37      0"
    assert report.format_row(row) == expected


def test_row_busbw_wrong_and_root():
    allreduce, broadcast = options.COLLECTIVES["allreduce"], options.COLLECTIVES["broadcast"]
    row = report.make_row(
        allreduce, "float", "sum", 3, 4, 4000, 1000, [[[1e-6], 0], [[2e-6], 3], [[1e-6], 0], [[1e-6], 1]]
    )
    assert (row["time_us"], row["wrong"], row["root"], row["redop"]) == (pytest.approx(2.0), 4, -1, "sum")
    assert row["algbw"] == pytest.approx(2.0)
    assert row["busbw"] == pytest.approx(3.0)
    row = report.make_row(broadcast, "int8", "max", 3, 4, 100, 100, [[[1e-6], None]] * 4)
    assert (row["redop"], row["root"], row["wrong"]) == ("none", 3, None)
    assert report.format_row(row).split()[-1] == "N/A"


def test_median_timing_takes_the_slowest_rank_per_operation():
    per_rank = [[[1e-6, 9e-6, 3e-6, 2e-6], 0], [[4e-6, 1e-6, 1e-6, 5e-6], 0]]
    collective = options.COLLECTIVES["allreduce"]
    row = report.make_row(collective, "float", "sum", 0, 2, 8, 2, per_rank, timing="median")
    assert row["time_us"] == pytest.approx(4.5)  # median of 4, 9, 3, 5
    assert row["rank_time_us"] == [pytest.approx(3.75), pytest.approx(2.75)]
    assert report.make_row(collective, "float", "sum", 0, 2, 8, 2, per_rank)["time_us"] == pytest.approx(3.75)
    header = report.format_header("mpi", collective, 2, {}, 1, "median")
    assert "median over the timed iterations of the slowest rank" in header[1]


def test_pingpong_time_is_half_the_round_trip():
    pingpong = options.COLLECTIVES["pingpong"]
    # Rank 2 takes no part: its operation returns at once.
    averages = [[[16e-6], 0], [[12e-6], 0], [[0.0], None]]
    row = report.make_row(pingpong, "float", "sum", 0, 3, 1000, 250, averages)
    assert row["time_us"] == pytest.approx(8.0)  # the slowest rank's average round trip, halved
    assert row["algbw"] == row["busbw"] == pytest.approx(1000 / 8e-6 / 1e9)
    per_operation = [[[10e-6, 30e-6], 0], [[12e-6, 20e-6], 0], [[0.0, 0.0], None]]
    median = report.make_row(pingpong, "float", "sum", 0, 3, 1000, 250, per_operation, timing="median")
    assert median["time_us"] == pytest.approx(10.5)  # median of 12 and 30 us, halved
    assert "divided by the 2 transfers of one call" in report.format_header("mpi", pingpong, 2, {}, 1)[1]


def test_barrier_row_is_time_only():
    row = report.make_row(
        options.COLLECTIVES["barrier"], "float", "sum", 0, 2, 0, 0, [[[5e-6], None], [[7e-6], None]]
    )
    assert (row["algbw"], row["busbw"], row["wrong"]) == (None, None, None)
    assert report.format_row(row).split() == ["0", "0", "none", "none", "-1", "7.00", "N/A", "N/A", "N/A"]


def test_header_columns_line_up_with_rows():
    collective = options.COLLECTIVES["allreduce"]
    header = report.format_header(
        "ringtree", collective, 4, {"version": "ringtree 0.1.0", "buffers": "torch"}, 3
    )
    assert "4 ranks, in-place (" in header[0]
    assert "median of 3 runs" in header[1] and "busbw = algbw x 1.5" in header[1]
    assert header[-3].rstrip().endswith(" in-place")
    titles = header[-2]
    row = report.format_row(report.make_row(collective, "float", "sum", 0, 4, 8, 2, [[[12.34e-6], 0]]))
    for column in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"):
        end = titles.index(column) + len(column)
        assert row[end - 1] != " " and (end == len(row) or row[end] == " "), column


def test_split_collective_header_and_row():
    allgather = options.COLLECTIVES["allgather"]
    header = report.format_header("ringtree", allgather, 4, {}, 1)
    assert "4 ranks, out-of-place" in header[0] and "busbw = algbw x 0.75" in header[1]
    assert header[-3].rstrip().endswith(" out-of-place")
    # S = 4096 B of float over 4 ranks: the count column shows one rank's 256 elements.
    row = report.make_row(allgather, "float", "sum", 0, 4, 4096, 256, [[[2e-6], 0]] * 4)
    expected = ["4096", "256", "float", "none", "-1", "2.00", "2.05", "1.54", "0"]
    assert report.format_row(row).split() == expected


def test_footer():
    rows = [{"wrong": 0, "busbw": 1.0}, {"wrong": 2, "busbw": 3.0}]
    assert report.format_footer(rows) == ["# Out of bounds values : 2 FAILED", "# Avg bus bandwidth    : 2"]
    assert report.format_footer([{"wrong": None, "busbw": None}]) == [
        "# Out of bounds values : N/A (not checked)"
    ]


def _rows(system_times: dict[int, float], wrong: int | None = 0) -> list[dict]:
    allreduce = options.COLLECTIVES["allreduce"]
    return [
        report.make_row(allreduce, "float", "sum", 0, 2, size, size // 4, [[[us * 1e-6], wrong]] * 2)
        for size, us in system_times.items()
    ]


def test_median_rows():
    runs = [_rows({8: 10.0, 1024: 100.0}), _rows({8: 30.0, 1024: 50.0}, wrong=1), _rows({8: 20.0})]
    medians = report.median_rows(runs, 2)
    assert [(r["size"], r["time_us"], r["wrong"]) for r in medians] == [
        (8, pytest.approx(20.0), 2),
        (1024, pytest.approx(75.0), 2),
    ]
    assert medians[1]["runs_time_us"] == [pytest.approx(100.0), pytest.approx(50.0)]
    assert medians[1]["busbw"] == pytest.approx(1024 / 75e-6 / 1e9)


def test_comparison_table_ratios():
    collective = options.COLLECTIVES["allreduce"]
    results = [
        ("ringtree", _rows({8: 2.0, 1024: 10.0})),
        ("gloo", _rows({8: 400.0, 1024: 600.0})),
        ("mpi", _rows({8: 1.0})),
    ]
    entries = report.compare(collective, results)
    assert entries[0]["ratios"] == {"gloo": pytest.approx(200.0), "mpi": pytest.approx(0.5)}
    assert entries[1]["ratios"] == {"gloo": pytest.approx(60.0), "mpi": None}
    lines = report.comparison_table(collective, 2, results)
    assert "ringtree/gloo" in lines[1] and "ringtree/mpi" in lines[1]
    assert lines[4].split() == ["8", "0.00", "2.00", "0.00", "400.0", "0.01", "1.00", "200x", "0.50x"]
    assert lines[5].split()[-2:] == ["60.00x", "-"]
    assert lines[-1] == "# geometric mean over sizes: ringtree/gloo 110x, ringtree/mpi 0.50x"


def test_plot(tmp_path, monkeypatch):
    path = tmp_path / "bench.png"
    results = [("ringtree", _rows({8: 2.0, 1024: 10.0})), ("gloo", _rows({8: 400.0, 1024: 500.0}))]
    allreduce, barrier = options.COLLECTIVES["allreduce"], options.COLLECTIVES["barrier"]
    assert "nothing to plot" in report.plot(str(path), [barrier], 2, results)
    if importlib.util.find_spec("matplotlib") is not None:
        assert str(path) in report.plot(str(path), [allreduce, barrier], 2, results)
        assert path.stat().st_size > 0
        path.unlink()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert "matplotlib is not installed" in report.plot(str(path), [allreduce], 2, results)
    assert not path.exists()


# --- verifiable data ----------------------------------------------------------------------

def _simulate(collective_name: str, dtype_name: str, op: str, world_size: int, count: int, root: int = 0):
    """Plans of every rank, and each rank's buffer after a correct collective computed in
    the element type in a scrambled rank order."""
    collective, dtype = options.COLLECTIVES[collective_name], options.DTYPES[dtype_name]
    plans = [data.make_plan(collective, dtype, op, root, r, world_size, count) for r in range(world_size)]
    buffers = [data.NumpyBuffer(dtype, count) for _ in range(world_size)]
    for buffer, plan in zip(buffers, plans):
        buffer.write(plan, count)
    if collective_name == "broadcast":
        result = buffers[root].array.copy()
    else:
        order = [(r + 1) % world_size for r in reversed(range(world_size))]
        result = None
        for r in order:
            values = buffers[r].array
            result = (
                values.copy() if result is None else data.FOLDS[op](result, values).astype(values.dtype)
            )
        if op == "avg":
            result = (result / world_size).astype(result.dtype)
    for rank, buffer in enumerate(buffers):
        if collective_name != "reduce" or rank == root:
            buffer.array[:] = result
    return plans, buffers


@pytest.mark.parametrize("dtype_name", ["float16", "float32", "float64", "int8", "uint8", "int32", "int64"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_allreduce_data_is_exact(dtype_name, op, world_size):
    count = 3000
    plans, buffers = _simulate("allreduce", dtype_name, op, world_size, count)
    for plan, buffer in zip(plans, buffers):
        assert data.count_wrong(buffer, plan, count) == 0
    assert len(np.unique(plans[0].source)) > 1
    buffers[1].array[17] += 2
    buffers[1].array[2999] -= 2
    assert data.count_wrong(buffers[1], plans[1], count) == 2
    assert data.count_wrong(buffers[1], plans[1], 17) == 0


@pytest.mark.parametrize("op", ["band", "bor", "bxor"])
def test_bitwise_data(op):
    plans, buffers = _simulate("allreduce", "int32", op, 4, 1000)
    assert [data.count_wrong(b, p, 1000) for b, p in zip(buffers, plans)] == [0, 0, 0, 0]


def test_sum_stays_exact_at_many_ranks():
    assert data.sum_bits(options.DTYPES["bfloat16"], 8) == 5
    assert data.sum_bits(options.DTYPES["int8"], 127) == 1
    plans, buffers = _simulate("allreduce", "int8", "sum", 16, 500)
    assert all(data.count_wrong(b, p, 500) == 0 for b, p in zip(buffers, plans))


def test_float_nan_counts_as_wrong():
    plans, buffers = _simulate("allreduce", "float32", "avg", 3, 100)
    buffers[0].array[5] = np.nan
    assert data.count_wrong(buffers[0], plans[0], 100) == 1


def test_broadcast_data():
    plans, buffers = _simulate("broadcast", "float16", "sum", 3, 2000, root=1)
    assert plans[0].source is None and plans[1].source is not None
    assert all(data.count_wrong(b, p, 2000) == 0 for b, p in zip(buffers, plans))
    untouched = data.NumpyBuffer(options.DTYPES["float16"], 2000)
    untouched.write(plans[2], 2000)
    assert data.count_wrong(untouched, plans[2], 2000) == 2000


def test_reduce_checks_the_root_only():
    plans, buffers = _simulate("reduce", "int64", "sum", 3, 1000, root=2)
    assert plans[0].expected is None and plans[1].expected is None
    assert [data.count_wrong(b, p, 1000) for b, p in zip(buffers, plans)] == [0, 0, 0]
    buffers[2].array[3] = -1
    assert data.count_wrong(buffers[2], plans[2], 1000) == 1


def _simulate_out_of_place(
    name: str, dtype_name: str, op: str, world_size: int, part: int, largest_part: int, misroute: bool = False
):
    """Plans of every rank, made for parts of ``largest_part`` elements, and every rank's
    output after ``name`` on parts of ``part`` elements, from outputs that start unwritten.
    Reductions are computed in the element type in a scrambled rank order. ``misroute``:
    data goes to the wrong place (a rank's own part, the wrong neighbour)."""
    collective, dtype = options.COLLECTIVES[name], options.DTYPES[dtype_name]
    n = world_size
    input_parts, output_parts = collective.buffer_parts(n)
    count = largest_part * collective.parts(n)
    plans = [data.make_plan(collective, dtype, op, 0, r, n, count) for r in range(n)]
    inputs = [data.NumpyBuffer(dtype, input_parts * largest_part) for _ in range(n)]
    outputs = [data.NumpyBuffer(dtype, output_parts * largest_part) for _ in range(n)]
    for plan, buffer, output in zip(plans, inputs, outputs):
        buffer.write(plan, part)
        output.fill(data.unwritten_value(dtype), output_parts * part)
    ins = [b.array[: input_parts * part].reshape(input_parts, part) for b in inputs]
    outs = [b.array[: output_parts * part].reshape(output_parts, part) for b in outputs]
    source_of = (lambda r: r) if misroute else (lambda r: (r - 1) % n)
    for r in range(n):
        if name == "allgather":
            outs[r][:] = [ins[r if misroute else s][0] for s in range(n)]
        elif name == "alltoall":
            outs[r][:] = [ins[s][s if misroute else r] for s in range(n)]
        elif name == "sendrecv":
            outs[r][0] = ins[source_of(r)][0]
        elif name == "reduce_scatter":
            order = [(s + 1) % n for s in reversed(range(n))]
            result = ins[order[0]][r].copy()
            for s in order[1:]:
                block = ins[s][(r + 1) % n if misroute else r]
                result = data.FOLDS[op](result, block).astype(result.dtype)
            if op == "avg":
                result = (result / n).astype(result.dtype)
            outs[r][0] = result
    if name == "pingpong":
        outs[1][0] = ins[0][0]
        outs[0][0] = ins[1][0] if misroute else outs[1][0]
    return plans, outputs


@pytest.mark.parametrize("name", SPLIT + POINT_TO_POINT)
@pytest.mark.parametrize("world_size", [2, 3, 5])
@pytest.mark.parametrize("part", [700, 333])
def test_out_of_place_data(name, world_size, part):
    checked = range(2) if name == "pingpong" else range(world_size)
    output_parts = options.COLLECTIVES[name].buffer_parts(world_size)[1]
    plans, outputs = _simulate_out_of_place(name, "float32", "sum", world_size, part, 700)
    assert [data.count_wrong(o, p, part) for o, p in zip(outputs, plans)] == [0] * world_size
    for rank in checked:
        outputs[rank].array[part - 1] += 1
        assert data.count_wrong(outputs[rank], plans[rank], part) == 1
    assert all(plans[rank].expected is None for rank in range(2, world_size) if name == "pingpong")
    plans, outputs = _simulate_out_of_place(name, "float32", "sum", world_size, part, 700, misroute=True)
    assert sum(data.count_wrong(o, p, part) for o, p in zip(outputs, plans)) > part // 2
    unwritten = data.NumpyBuffer(options.DTYPES["float32"], output_parts * part)
    unwritten.fill(data.unwritten_value(options.DTYPES["float32"]), output_parts * part)
    for rank in checked:
        assert data.count_wrong(unwritten, plans[rank], part) == output_parts * part


_REDUCE_SCATTER_CASES = [
    (dtype_name, op)
    for dtype_name in ("float16", "float32", "int8", "uint8", "int64")
    for op in ("sum", "prod", "min", "max", "avg", "bxor")
    if not (op == "bxor" and options.DTYPES[dtype_name].is_float)
]


@pytest.mark.parametrize(("dtype_name", "op"), _REDUCE_SCATTER_CASES)
@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_reduce_scatter_data_is_exact(dtype_name, op, world_size):
    plans, outputs = _simulate_out_of_place("reduce_scatter", dtype_name, op, world_size, 500, 600)
    assert [data.count_wrong(o, p, 500) for o, p in zip(outputs, plans)] == [0] * world_size
    dtype = options.DTYPES[dtype_name]
    unwritten = data.NumpyBuffer(dtype, 500)
    unwritten.fill(data.unwritten_value(dtype), 500)
    assert data.count_wrong(unwritten, plans[0], 500) == 500


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_torch_buffer_bfloat16():
    import torch

    dtype = options.DTYPES["bfloat16"]
    plans = [data.make_plan(options.COLLECTIVES["allreduce"], dtype, "sum", 0, r, 8, 4096) for r in range(8)]
    buffers = [data.TorchBuffer(dtype, 4096) for _ in range(8)]
    for buffer, plan in zip(buffers, plans):
        buffer.write(plan, 4096)
    total = torch.stack([b.tensor for b in buffers]).sum(0, dtype=torch.bfloat16)
    buffers[0].tensor.copy_(total)
    assert data.count_wrong(buffers[0], plans[0], 4096) == 0
    buffers[0].tensor[10] += 64
    assert data.count_wrong(buffers[0], plans[0], 4096) == 1


# --- CUDA buffers (without a GPU) ---------------------------------------------------------


def test_device_flags():
    args = options.parse_args([])
    assert (args.device, args.allow_shared_gpu) == ("cpu", False)
    args = options.parse_args("--device cuda --nproc 4 --compare nccl,ringtree --allow-shared-gpu".split())
    assert (args.device, args.system, args.compare, args.allow_shared_gpu) == ("cuda", "ringtree", ["nccl"], True)
    assert options.parse_args("--device cuda --system nccl".split()).system == "nccl"


_BAD_DEVICE_LINES = [
    ("--nproc 2 --compare nccl", "the nccl system (torch's NCCL backend) needs --device cuda"),
    ("--system nccl", "the nccl system (torch's NCCL backend) needs --device cuda"),
    ("--device cuda --nproc 2 --compare gloo", "the gloo system measures host buffers only"),
    ("--device cuda --system mpi", "the mpi system measures host buffers only"),
    ("--device cuda --backend mpi", "the ringtree-mpi system measures host buffers only"),
    ("--allow-shared-gpu", "--allow-shared-gpu needs --device cuda"),
    ("--device cuda --compare nccl", "--compare needs --nproc"),
    ("--device gpu", "argument --device: invalid choice: 'gpu'"),
]


@pytest.mark.parametrize(("argv", "message"), _BAD_DEVICE_LINES)
def test_bad_device_command_lines(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        options.parse_args(argv.split())
    assert info.value.code == 2
    assert f"ringtree-bench: error: {message}" in capsys.readouterr().err


def _fake_torch(monkeypatch, gpus: int, cuda_version: str | None = "12.8"):
    """A stand-in torch module with ``gpus`` GPUs; returns the devices set_device got."""
    chosen: list[int] = []
    cuda = types.SimpleNamespace(
        device_count=lambda: gpus, is_available=lambda: gpus > 0, set_device=chosen.append,
        get_device_name=lambda index: f"Test GPU {index}",
    )  # fmt: skip
    fake = types.SimpleNamespace(__version__="9.9.9", version=types.SimpleNamespace(cuda=cuda_version), cuda=cuda)
    monkeypatch.setitem(sys.modules, "torch", fake)
    return chosen


def test_cuda_problem_names_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert devices.cuda_problem() == "--device cuda needs torch, which is not installed"
    _fake_torch(monkeypatch, 2, cuda_version=None)
    assert "needs a torch built with CUDA; this one (9.9.9) has no CUDA support" in devices.cuda_problem()
    _fake_torch(monkeypatch, 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    problem = devices.cuda_problem()
    assert "torch 9.9.9 sees no CUDA device" in problem and "CUDA_VISIBLE_DEVICES=''" in problem
    _fake_torch(monkeypatch, 1)
    assert devices.cuda_problem() is None


def test_gpu_count_checks(monkeypatch):
    _fake_torch(monkeypatch, 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)

    def check(line: str) -> str | None:
        return devices.check(options.parse_args(line.split()))

    assert check("--nproc 4") is None  # host buffers: torch is not asked
    assert check("--device cuda --nproc 2 --compare nccl") is None
    problem = check("--device cuda --nproc 4")
    assert problem == (
        "--nproc 4 needs 4 GPUs, one per rank, and torch sees 2; --allow-shared-gpu lets ranks share them round-robin"
    )
    assert check("--device cuda --nproc 4 --allow-shared-gpu") is None
    assert check("--device cuda") is None  # one rank of a launched job: local rank 0
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert check("--device cuda").startswith("local rank 2 needs 3 GPUs")
    assert check("--device cuda --allow-shared-gpu") is None


def test_ranks_take_gpus_round_robin(monkeypatch):
    chosen = _fake_torch(monkeypatch, 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert devices.select_gpu(allow_shared=False) == 1
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert devices.select_gpu(allow_shared=True) == 1
    with pytest.raises(SystemExit, match="local rank 3 needs 4 GPUs"):
        devices.select_gpu(allow_shared=False)
    assert chosen == [1, 1]


@pytest.mark.skipif(HAVE_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("launch", [["--nproc", "2"], []], ids=["orchestrator", "rank"])
def test_cuda_without_a_gpu_exits_2(launch):
    proc = _bench("--device", "cuda", *launch, "-e", "8", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    missing = ("needs torch, which is not installed", "needs a torch built with CUDA", "sees no CUDA device")
    assert proc.stderr.startswith("ringtree-bench: error: --device cuda")
    assert any(text in proc.stderr for text in missing), proc.stderr


def test_cuda_without_torch_exits_2():
    code = "import sys; sys.modules['torch'] = None; from ringtree.bench import cli; sys.exit(cli.main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, "--device", "cuda", "--nproc", "2", "--compare", "nccl"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == "ringtree-bench: error: --device cuda needs torch, which is not installed\n"


def test_nccl_unsupported_combinations():
    collectives, dtypes = options.COLLECTIVES, options.DTYPES
    allreduce, reduce_scatter = collectives["allreduce"], collectives["reduce_scatter"]
    int16 = options.DType("int16", "int16", 2, False, 2**15 - 1, 14, 0.0)
    boolean = options.DType("bool", "bool", 1, False, 1, 0, 0.0)

    def reason(collective, dtype, op="sum", torch_found=True):
        return systems.unsupported_reason("nccl", collective, dtype, op, 2, torch_found)

    for op in ("band", "bor", "bxor"):
        assert reason(allreduce, dtypes["int32"], op) == f"torch's NCCL backend has no bitwise reductions ({op.upper()})"
        assert reason(collectives["broadcast"], dtypes["int32"], op) is None  # reduces nothing
    for name in ("int8", "uint8", "int32", "int64"):
        assert reason(reduce_scatter, dtypes[name], "avg") == "torch's NCCL AVG needs a floating-point type"
    for name in ("float32", "float16", "bfloat16", "float64"):
        assert reason(allreduce, dtypes[name], "avg") is None
    assert reason(allreduce, int16) == reason(collectives["alltoall"], int16) == "torch's NCCL backend has no int16"
    assert reason(collectives["sendrecv"], boolean) == "torch's NCCL backend has no bool"
    assert reason(collectives["barrier"], int16) is None
    for name in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"):
        for op in ("sum", "prod", "min", "max"):
            assert reason(collectives[name], dtypes["int8"], op) is None
    assert reason(allreduce, dtypes["float32"], torch_found=False) == "torch is not installed"


def test_device_reasons():
    assert systems.device_reason("nccl", "cpu", 2, 0) == "torch's NCCL backend needs --device cuda"
    assert systems.device_reason("nccl", "cuda", 2, 2) is None
    shared = systems.device_reason("nccl", "cuda", 4, 2)
    assert shared == "4 ranks share 2 GPU(s) (--allow-shared-gpu), and torch's NCCL refuses two ranks on one GPU"
    assert systems.device_reason("gloo", "cuda", 2, 2) == "it measures host buffers only (--device cpu)"
    assert systems.device_reason("ringtree", "cpu", 2, 0) is None


def test_cuda_header_and_settings():
    meta = {"version": "ringtree 0.1.0", "buffers": "torch cuda", "device": "Test GPU", "gpus": 8,
            "cuda_path": "NCCL 2.28.7", "env": {"RINGTREE_CUDA_BACKEND": "auto"}}  # fmt: skip
    header = report.format_header("ringtree", options.COLLECTIVES["allreduce"], 2, meta, 1)
    details = "(ringtree 0.1.0; torch cuda buffers; Test GPU (8 GPUs on this host); CUDA path: NCCL 2.28.7; "
    assert details + "RINGTREE_CUDA_BACKEND=auto)" in header[0]
    assert report.settings_line(options.parse_args([])).endswith("redop: sum root: 0")
    cuda = options.parse_args("--device cuda --nproc 4 --allow-shared-gpu".split())
    assert report.settings_line(cuda).endswith("root: 0 device: cuda (shared GPUs allowed)")
    assert report.settings_dict(cuda)["device"] == "cuda" and report.settings_dict(cuda)["allow_shared_gpu"]


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "int8", "uint8"])
def test_torch_buffer_on_a_device(dtype_name):
    # TorchBuffer's device branch (torch's allocator, copies to and from NumPy), on the CPU.
    dtype = options.DTYPES[dtype_name]
    plan = data.make_plan(options.COLLECTIVES["allgather"], dtype, "sum", 0, 0, 1, 3000)
    buffer = data.TorchBuffer(dtype, 4000, "cpu")
    assert buffer.tensor.device.type == "cpu" and str(buffer.tensor.dtype) == f"torch.{dtype_name}"
    assert data.count_wrong(buffer, plan, 3000) > 0  # still ones
    buffer.write(plan, 3000)
    assert data.count_wrong(buffer, plan, 3000) == 0
    buffer.fill(data.unwritten_value(dtype), 3000)
    assert data.count_wrong(buffer, plan, 3000) == 3000


class _Recorder:
    """A system whose operation, barrier and synchronize only leave their names in ``calls``."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def operation(self) -> None:
        self.calls.append("op")

    def barrier(self) -> None:
        self.calls.append("barrier")

    def synchronize(self) -> None:
        self.calls.append("sync")


@pytest.mark.parametrize("timing", ["avg", "median"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_timed_loop_synchronizes_the_device(timing, device, monkeypatch):
    system = _Recorder()
    clock_reads: list[int] = []  # how many calls were made at each read of the clock
    monkeypatch.setattr(worker.time, "perf_counter", lambda: clock_reads.append(len(system.calls)) or 0.0)
    args = argparse.Namespace(device=device, timing=timing, warmup_iters=2, iters=3)
    durations = worker._timed(system, system.operation, args)
    assert len(durations) == (3 if timing == "median" else 1)
    if device == "cpu":
        assert system.calls == ["op", "op", "barrier", "op", "op", "op"]
        return
    timed = ["op", "sync"] * 3 if timing == "median" else ["op", "op", "op", "sync"]
    assert system.calls == ["op", "op", "sync", "barrier", "sync", *timed]
    # Every clock read follows a synchronisation.
    assert all(system.calls[n - 1] == "sync" for n in clock_reads), clock_reads


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(not (HAVE_TORCH and RINGTREE_READY), reason="needs torch and ringtree")
def test_worker_cuda_flow_on_host_memory(monkeypatch, tmp_path):
    """A 1-rank ringtree job through the worker's --device cuda path, its buffers from
    torch's allocator in host memory: every row checked, and one synchronisation before
    each read of a result and of the clock."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    made: list[systems.RingtreeSystem] = []

    class HostCuda(systems.RingtreeSystem):
        synchronized = 0

        def new_buffer(self, dtype, count):
            return data.TorchBuffer(dtype, count, "cpu")

        def synchronize(self) -> None:
            self.synchronized += 1

        def describe(self):
            return {**super().describe(), "device": "host memory"}

    def create(name, timeout_s, device, allow_shared_gpu):
        assert (name, device, allow_shared_gpu) == ("ringtree", "cuda", False)
        made.append(HostCuda(timedelta(seconds=timeout_s)))
        return made[0]

    monkeypatch.setattr(worker, "create", create)
    result = tmp_path / "result.jsonl"
    line = f"allreduce allgather barrier -b 8 -e 64 -n 3 -w 1 --timing median --device cuda --result-file {result}"
    assert worker.run(options.parse_args(line.split())) == 0
    records = [json.loads(text) for text in result.read_text().splitlines()]
    assert records[0]["meta"]["device"] == "host memory" and records[-1] == {"done": True}
    rows = [record["row"] for record in records if "row" in record]
    assert [r["collective"] for r in rows] == ["allreduce"] * 4 + ["allgather"] * 4 + ["barrier"]
    assert all(r["wrong"] == 0 for r in rows if r["collective"] != "barrier")
    # Per size with data: after the checked operation, around the barrier, after each of 3 operations.
    assert made[0].synchronized == 8 * (1 + 2 + 3) + (2 + 3)


# --- import weight ----------------------------------------------------------------------


def test_imports_stay_light():
    code = (
        "import sys, ringtree; assert 'ringtree.bench' not in sys.modules; "
        "import ringtree.bench.cli; "
        "heavy = {'torch', 'numpy', 'mpi4py'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


# --- the other measurements -------------------------------------------------------------


# The tools that older notes run as benchmarks/<module>.py.
_SCRIPTED_TOOLS = ["call-overhead", "failure-table", "p2p-pingpong", "startup"]


@pytest.mark.parametrize("tool", sorted(options.TOOLS))
def test_tools_are_subcommands(tool):
    proc = _bench(tool, "--help", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert f"usage: ringtree-bench {tool}" in proc.stdout


@pytest.mark.parametrize("tool", _SCRIPTED_TOOLS)
def test_older_scripts_run_the_subcommands(tool):
    # benchmarks/<module>.py, named by older notes, runs the same subcommand.
    script = Path(__file__).resolve().parents[2] / "benchmarks" / f"{options.TOOLS[tool]}.py"
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert f"usage: ringtree-bench {tool}" in proc.stdout


def test_scale_table():
    """Two ranks, every system installed here: one row each, nothing left after exit."""
    proc = _bench("scale", "--ranks", "2", "--iterations", "2", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("| 2 |")]
    systems = [row[1] for row in rows]
    assert systems[:2] == ["ringtree shm", "ringtree tcp"], proc.stdout
    assert len(rows) == (3 if "Open MPI left out" not in proc.stdout else 2), proc.stdout
    for row in rows:
        assert float(row[2]) > 0 and float(row[2]) >= float(row[3]) >= 0 and int(row[7]) > 0, row  # init, rendezvous, fds
    shm = rows[0]
    assert float(shm[6]) > 0, shm  # rank 0 maps the node arena and its rings


def test_scale_table_connection_modes():
    """Four ranks, eager and lazy: the lazy jobs end with fewer descriptors and mappings."""
    proc = _bench("scale", "--ranks", "4", "--iterations", "2", "--connect", "eager,lazy", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {row[1]: row for row in (line.split(" | ") for line in proc.stdout.splitlines())
            if row[0] == "| 4"}
    # Over TCP at 4 ranks the allreduces' algorithms reach every peer of rank 0: both modes
    # end with as many connections (the descriptors differ by the wait descriptors of links
    # that slept).
    assert {"ringtree tcp eager", "ringtree tcp lazy"} <= set(rows), proc.stdout
    # Over shared memory the node arena serves the allreduces: no pair connects.
    eager, lazy = rows["ringtree shm eager"], rows["ringtree shm lazy"]
    assert float(lazy[8]) < float(eager[8]) and int(lazy[9]) < int(eager[9]), (eager, lazy)


def test_groups_table():
    """Two ranks, five groups, ringtree's API: groups open no socket and no descriptor."""
    proc = _bench("groups", "--nproc", "2", "--groups", "5", "--system", "ringtree", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("| ringtree |")]
    assert len(rows) == 1, proc.stdout
    row = rows[0]
    assert float(row[1]) > 0 and float(row[3]) > 0, row  # new_group, first all_reduce
    sockets_before, sockets_after = row[4].split(" / ")
    fds_before, fds_after = row[5].split(" / ")
    assert sockets_before == sockets_after and fds_before == fds_after, row


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the gloo column)")
def test_rendezvous_faults_table():
    """One fault end to end: both libraries measured, one table row."""
    proc = _bench("rendezvous-faults", "--faults", "host_killed_store", "--limit", "30", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| store host")]
    assert len(rows) == 1, proc.stdout
    cells = rows[0].split(" | ")
    assert cells[1].startswith("DistNetworkError: connection to TCPStore at 127.0.0.1:"), rows[0]
    assert cells[2].endswith(" ms"), rows[0]


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
@pytest.mark.parametrize("bucket_view", [False, True])
def test_ddp_step_table(bucket_view):
    """A small model end to end: both backends measured, one row each."""
    extra = ["--gradient-as-bucket-view"] if bucket_view else []
    proc = _bench("ddp-step", "--rounds", "1", "--steps", "2", "--width", "64", "--layers", "2", *extra, timeout=240)
    assert f"gradient_as_bucket_view={bucket_view}" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"ringtree", "gloo"}, proc.stdout
    assert rows["gloo"].rstrip().endswith("| - |") and not rows["ringtree"].rstrip().endswith("| - |")
    assert "ringtree's step is" in proc.stdout


# --- end to end ---------------------------------------------------------------------------


def _check_json(
    path, system: str, collectives: list[str], world_size: int = 2, maxbytes: int = 64 << 10
) -> dict:
    """The -J document, after checking that ``system`` ran every collective at every size
    of the sweep from 8 B (float32) with no wrong element."""
    document = json.loads(path.read_text())
    result = document["systems"][system]
    assert result["status"] == "ok", result["notes"]
    rows = result["rows"]
    for name in collectives:
        collective = options.COLLECTIVES[name]
        mine = [r for r in rows if r["collective"] == name]
        if name == "barrier":
            assert [r["size"] for r in mine] == [0]
        else:
            parts = collective.parts(world_size)
            sweep = options.size_sweep(8, maxbytes, 2, 4, parts)
            assert [(r["size"], r["count"]) for r in mine] == [(b, n // parts) for b, n in sweep], name
            assert all(r["wrong"] == 0 for r in mine), name
        assert all(r["time_us"] > 0 for r in mine)
    return document


@pytest.mark.parametrize(
    "system",
    [
        pytest.param("ringtree", marks=pytest.mark.skipif(not RINGTREE_READY, reason="ringtree not built")),
        pytest.param("mpi", marks=pytest.mark.skipif(not HAVE_MPI, reason="mpirun or mpi4py missing")),
    ]
    # With MPI installed, gloo's end-to-end run is the one of test_compare_prints_side_by_side.
    + ([] if HAVE_MPI or not HAVE_TORCH else ["gloo"]),
)
def test_end_to_end(system, tmp_path):
    out = tmp_path / "bench.json"
    timing = "median" if system == "mpi" else "avg"
    proc = _bench(*ALL, "--nproc", "2", "--system", system, "--timing", timing, *SMALL, "-J", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("# Out of bounds values : 0 OK") == 3
    assert f"# {system} allreduce, 2 ranks, in-place (" in proc.stdout
    _check_json(out, system, ALL)


@pytest.mark.skipif(not RINGTREE_READY, reason="ringtree not built")
@pytest.mark.parametrize(("world_size", "maxbytes"), [(2, 16 << 10), (3, 1 << 10)])
def test_split_and_point_to_point_end_to_end(world_size, maxbytes, tmp_path):
    # At 3 ranks the neighbours of sendrecv differ and alltoall's blocks all go elsewhere;
    # gloo runs the same calls as ringtree (one adapter), so it is compared at 2 ranks only.
    out = tmp_path / "bench.json"
    candidates = (("gloo", HAVE_TORCH and world_size == 2), ("mpi", HAVE_MPI))
    others = [name for name, present in candidates if present]
    argv = [*SPLIT, *POINT_TO_POINT, "--nproc", str(world_size), *SMALL, "-e", str(maxbytes), "-J", str(out)]
    # Up to three launches one after the other, each bounded by SMALL's --timeout 40.
    proc = _bench(*argv, *(["--compare", ",".join(others)] if others else []), timeout=3 * E2E_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("# Out of bounds values : 0 OK") == 5 * (1 + len(others))
    assert f"# ringtree alltoall, {world_size} ranks, out-of-place (" in proc.stdout
    for system in ["ringtree", *others]:
        _check_json(out, system, SPLIT + POINT_TO_POINT, world_size, maxbytes)
    if others:
        comparisons = json.loads(out.read_text())["comparison"]
        assert [c["collective"] for c in comparisons] == SPLIT + POINT_TO_POINT
        assert f"# pingpong comparison, {world_size} ranks, out-of-place" in proc.stdout


@pytest.mark.skipif(not (HAVE_TORCH and HAVE_MPI), reason="needs torch and MPI")
def test_compare_prints_side_by_side(tmp_path):
    out = tmp_path / "bench.json"
    proc = _bench(*ALL, "--nproc", "2", "--system", "mpi", "--compare", "gloo", *SMALL, "-J", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = proc.stdout[proc.stdout.index("# broadcast comparison") :].splitlines()
    assert "mpi/gloo" in table[1]
    assert [int(line.split()[0]) for line in table[4:18]] == [8 << i for i in range(14)]
    assert all(line.endswith("x") for line in table[4:18])
    document = _check_json(out, "gloo", ALL)
    _check_json(out, "mpi", ALL)
    assert [c["collective"] for c in document["comparison"]] == ALL
    assert document["comparison"][1]["sizes"][0]["ratios"]["gloo"] > 0


@pytest.mark.skipif(not HAVE_GPU, reason="torch sees no CUDA device")
def test_cuda_compare_nccl(tmp_path):
    out = tmp_path / "bench.json"
    argv = "--device cuda --nproc 1 -b 8 -e 1M -f 4 -c 1 --compare nccl --timeout 120 -J".split()
    proc = _bench(*argv, str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("# Out of bounds values : 0 OK") == 2, proc.stdout
    assert "FAILED" not in proc.stdout and "ringtree/nccl" in proc.stdout
    document = json.loads(out.read_text())
    for system in ("ringtree", "nccl"):
        result = document["systems"][system]
        assert result["status"] == "ok", result["notes"]
        assert result["meta"]["buffers"] == "torch cuda" and result["meta"]["device"]
        assert [r["size"] for r in result["rows"]] == [8 << 2 * i for i in range(9)]
        assert all(r["wrong"] == 0 for r in result["rows"]), result["rows"]


@pytest.mark.skipif(not HAVE_MPI, reason="mpirun or mpi4py missing")
def test_repeat_reports_medians(tmp_path):
    out = tmp_path / "bench.json"
    proc = _bench(*"allreduce --nproc 2 --system mpi --repeat 3 -b 1K -e 2K -J".split(), str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("# round ") == 3
    assert "median of 3 runs" in proc.stdout
    result = json.loads(out.read_text())["systems"]["mpi"]
    assert [len(run) for run in result["runs"]] == [2, 2, 2]
    for row in result["rows"]:
        assert row["time_us"] == pytest.approx(sorted(row["runs_time_us"])[1])


def _bench_under_mpirun(arguments: str) -> subprocess.CompletedProcess:
    mpirun = "mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2".split()
    return subprocess.run([*mpirun, *BENCH, *arguments.split()], capture_output=True, text=True,
                          timeout=E2E_TIMEOUT_S)


@pytest.mark.skipif(not HAVE_MPI, reason="mpirun or mpi4py missing")
def test_launched_by_mpirun():
    # Launcher mode (rank 0 prints the table itself) is the same code for every system.
    proc = _bench_under_mpirun("allreduce -e 1K -n 2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# mpi allreduce, 2 ranks" in proc.stdout
    assert proc.stdout.count("     float     sum      -1") == 8


@pytest.mark.skipif(not HAVE_MPI, reason="mpirun or mpi4py missing")
def test_p2p_pingpong_times_the_layer_over_mpi():
    proc = _bench_under_mpirun("p2p-pingpong --backend mpi --sizes 8,4096 --repeats 1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["size", "mode", "ringtree-mpi(us)", "mpi4py(us)", "layer(us)"]
    rows = [line.rsplit(None, 3) for line in lines[1:]]
    assert [row[0].split()[1] for row in rows] == ["send/recv", "isend/irecv+wait", "sendrecv"] * 2
    for _, ours, theirs, layer in rows:
        assert float(ours) > 0 and float(theirs) > 0
        assert float(layer) == pytest.approx(float(ours) - float(theirs), abs=0.011)


@pytest.mark.skipif(not HAVE_MPI, reason="mpirun or mpi4py missing")
def test_timeout_stops_the_job():
    proc = _bench(*"allreduce --nproc 2 --system mpi -b 1K -e 1K -n 100000000 --timeout 1".split())
    assert proc.returncode == 1
    assert "# mpi: failed: timed out" in proc.stdout


def test_gather_and_scatter_rows_use_the_older_torch_names_where_the_newer_are_missing():
    """torch before 2.13 has all_gather_into_tensor and reduce_scatter_tensor only: the
    torch-style systems call those there, and the 2.13 names where they exist."""
    calls = []
    ops = types.SimpleNamespace(SUM="sum", PRODUCT="product", MIN="min", MAX="max", AVG="avg",
                                BAND="band", BOR="bor", BXOR="bxor", PREMUL_SUM="premul_sum")
    older = types.SimpleNamespace(
        get_rank=lambda: 0, get_world_size=lambda: 1, ReduceOp=ops,
        all_gather_into_tensor=lambda out, inp: calls.append(("all_gather_into_tensor", out, inp)),
        reduce_scatter_tensor=lambda out, inp, op: calls.append(("reduce_scatter_tensor", out, inp, op)),
    )
    system = systems._TorchStyleSystem(older, None)
    system.operation(options.COLLECTIVES["allgather"], "in", "out", None, 0)()
    system.operation(options.COLLECTIVES["reduce_scatter"], "in", "out", "sum", 0)()
    assert calls == [("all_gather_into_tensor", "out", "in"), ("reduce_scatter_tensor", "out", "in", "sum")]
    newer = types.SimpleNamespace(**vars(older), all_gather_single=lambda out, inp: calls.append(("single", out, inp)))
    systems._TorchStyleSystem(newer, None).operation(options.COLLECTIVES["allgather"], "in", "out", None, 0)()
    assert calls[-1] == ("single", "out", "in")
