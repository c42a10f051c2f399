"""Differential test: the same deterministic program (differential_script.py) under
torch.distributed's gloo backend, under ringtree's API and under torch.distributed with
ringtree's torch backend ("torch-ringtree"), at 2 and 3 ranks; every output of every case
must match gloo's, per case.

Comparison: bit for bit (dtype, shape and bytes; objects with ==), because the inputs are
small integers, so every reduction is exact in any order — except
``all_reduce_random_float``, whose random float32 inputs make the sum depend on the
reduction order, compared with the tolerance in TOLERANCES, and bool tensors, compared by
value: gloo sums bools as bytes and leaves bytes other than 0 and 1 in them (the sum of the
bytes: 3 where three ranks had True), where ringtree stores the canonical 1.

What torch's gloo itself cannot do is not compared; GLOO_CANNOT lists it, and
``test_gloo_limits_are_real`` checks that gloo still refuses each.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ringtree
from differential_script import CASES
from harness import free_port, launcher_free_env

SCRIPT = Path(__file__).resolve().parent / "differential_script.py"
WORLD_SIZES = [2, 3]
IMPLS = ["torch", "ringtree", "torch-ringtree"]
CANDIDATES = ["ringtree", "torch-ringtree"]
COMPARED = [name for name in CASES if name != "gloo_limits"]
TOLERANCES = {"all_reduce_random_float": {"rtol": 1e-5, "atol": 1e-5}}

# What gloo refuses in torch 2.13 (so the program does not ask it), with its error text.
GLOO_CANNOT = {
    "PREMUL_SUM": "Cannot use ReduceOp.PREMUL_SUM with Gloo",
    "AVG on integers": "result type Float can't be cast to the desired output type Int",
    "int16": "Invalid scalar type",  # likewise uint16, uint32, uint64
    "split_group": "No device associated with the default pg, not safe to split any process groups",
    "all_to_all of different sizes": "ProcessGroupGloo::alltoall: invalid tensor size",
}
# What torch itself refuses to a backend other than gloo: the case fails under
# torch-ringtree with one of these texts (torch 2.13's, 2.14's; checked by
# test_matches_gloo).
TORCH_REFUSES_OTHER_BACKENDS = {
    "monitored_barrier": ("monitored_barrier is only implemented for GLOO backend",
                          "monitored_barrier requires a group with a CPU-capable backend (e.g. GLOO)"),
}


def _launch(world_size: int, out_dir: Path) -> dict | str:
    """Runs the program (each impl in turn, in each rank's process) on ``world_size``
    processes; {impl: each rank's results}, or the output of a run that did not finish."""
    coord = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    runs = [f"{impl}:{free_port()}" for impl in IMPLS]
    env = launcher_free_env()
    procs = []
    for rank in range(world_size):
        command = [sys.executable, str(SCRIPT), "--rank", str(rank), "--world-size", str(world_size),
                   "--coord-port", str(coord.port), "--out-dir", str(out_dir), "--cases", ",".join(COMPARED)]
        for run in runs:
            command += ["--run", run]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        return f"the program at {world_size} ranks hung: " + "\n".join(proc.communicate()[0] for proc in procs)
    if any(proc.returncode != 0 for proc in procs):
        return "\n".join(f"rank {rank} exited with {proc.returncode}:\n{out}"
                         for rank, (proc, out) in enumerate(zip(procs, outputs)))
    return {impl: [torch.load(out_dir / f"{impl}-{rank}.pt", weights_only=False) for rank in range(world_size)]
            for impl in IMPLS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs(world_size) -> {impl: each rank's results}, run once per module (a second try
    with other ports when the first did not finish, in case a port was taken)."""
    cache: dict = {}

    def get(world_size: int) -> dict:
        if world_size not in cache:
            result = _launch(world_size, tmp_path_factory.mktemp(f"world{world_size}"))
            if isinstance(result, str):
                result = _launch(world_size, tmp_path_factory.mktemp(f"world{world_size}"))
            cache[world_size] = result
        if isinstance(cache[world_size], str):
            pytest.fail(cache[world_size])
        return cache[world_size]

    return get


def _differences(expected, actual, path: str, tolerance: dict | None) -> list[str]:
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return [f"{path}: gloo gave a tensor, ringtree {type(actual).__name__}"]
        if (expected.dtype, expected.shape) != (actual.dtype, actual.shape):
            shapes = f"gloo {expected.dtype} {tuple(expected.shape)}, ringtree {actual.dtype} {tuple(actual.shape)}"
            return [f"{path}: {shapes}"]
        if tolerance is not None:
            same = torch.allclose(actual, expected, **tolerance)
        elif expected.dtype is torch.bool:
            same = torch.equal(_bits(actual) != 0, _bits(expected) != 0)
        else:
            same = torch.equal(_bits(actual), _bits(expected))
        return [] if same else [f"{path}: gloo {expected.tolist()} != ringtree {actual.tolist()}"]
    if isinstance(expected, dict) and isinstance(actual, dict):
        if sorted(map(str, expected)) != sorted(map(str, actual)):
            return [f"{path}: keys differ: gloo {sorted(map(str, expected))}, ringtree {sorted(map(str, actual))}"]
        return [d for key in expected for d in _differences(expected[key], actual[key], f"{path}/{key}", tolerance)]
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: gloo gave {len(expected)} items, ringtree {len(actual)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual))
                for d in _differences(e, a, f"{path}[{i}]", tolerance)]
    return [] if expected == actual else [f"{path}: gloo {expected!r} != ringtree {actual!r}"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so that comparisons are bit for bit (-0.0 != 0.0, NaN == NaN)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("impl", CANDIDATES)
@pytest.mark.parametrize("case", COMPARED)
def test_matches_gloo(runs, case, world_size, impl):
    reference, candidate = runs(world_size)["torch"], runs(world_size)[impl]
    for rank in range(world_size):
        expected = reference[rank][case]
        assert expected["ok"], f"torch gloo failed {case} on rank {rank}: {expected['error']}\n{expected['traceback']}"
        actual = candidate[rank][case]
        if impl == "torch-ringtree" and case in TORCH_REFUSES_OTHER_BACKENDS:
            assert not actual["ok"] and any(text in actual["error"] for text in TORCH_REFUSES_OTHER_BACKENDS[case]), actual
            continue
        assert actual["ok"], f"{impl} failed {case} on rank {rank}: {actual['error']}\n{actual['traceback']}"
        differences = _differences(expected["outputs"], actual["outputs"], f"rank {rank}", TOLERANCES.get(case))
        assert not differences, "\n".join(differences[:10])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gloo_limits_are_real(runs, world_size):
    for rank, results in enumerate(runs(world_size)["torch"]):
        messages = results["gloo_limits"]["outputs"]
        assert sorted(messages) == sorted(GLOO_CANNOT)
        for name, text in GLOO_CANNOT.items():
            assert messages[name] is not None and text in messages[name], (rank, name, messages[name])
