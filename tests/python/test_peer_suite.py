"""A fast part of torch's own backend test suite (DistributedTest, shipped in the torch
wheel) run against ringtree by tests/peer_suite/run_peer_suite.py: tests that gloo passes,
one or two per kind of call, each test's ranks forked from the harness (spawning them, as
the suite's own runs do, costs a torch import per rank and test: 54 s against 8 s here; one
more test spawns them). The
whole suite is the script without -k (about 13 minutes; results in docs/torch.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch's test utilities need it

from harness import launcher_free_env  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "peer_suite" / "run_peer_suite.py"

FAST_SUBSET = [
    "test_all_reduce_sum_async", "test_all_reduce_coalesced_max", "test_all_reduce_sum_complex",
    "test_sparse_all_reduce_sum", "test_broadcast_full_group", "test_reduce_product", "test_all_gather_complex",
    "test_all_gather_coalesced_with_empty", "test_gather_checks", "test_scatter_object_list",
    "test_send_recv_any_source", "test_batch_isend_irecv_gloo_tags", "test_barrier_full_group",
    "test_monitored_barrier_gloo_rank_0_timeout", "test_DistributedDataParallelCPU", "test_ddp_create_graph",
]  # fmt: skip


def _run_suite(tmp_path, names: list[str], *options: str) -> None:
    results = tmp_path / "results.json"
    env = launcher_free_env()
    env.update(PYTORCH_PRINT_REPRO_ON_FAILURE="0", TEMP_DIR=str(tmp_path), WORLD_SIZE="2")
    args = [a for name in names for a in ("-k", name)]
    proc = subprocess.run([sys.executable, str(SCRIPT), "--exact", *options, *args, "--json", str(results)],
                          capture_output=True, text=True, timeout=600, env=env)
    outcomes = json.loads(results.read_text()) if results.exists() else {}
    chosen = {name: outcomes.get(name, {}).get("outcome") for name in names}
    assert all(outcome == "PASS" for outcome in chosen.values()), (chosen, proc.stdout[-4000:], proc.stderr[-4000:])


def test_a_fast_subset_of_torchs_backend_suite_passes(tmp_path):
    _run_suite(tmp_path, FAST_SUBSET, "--fork")


def test_spawned_ranks_run_the_suite_as_torchs_own_runs_do(tmp_path):
    """One test with its ranks spawned (fresh interpreters that find the test class by
    name and route their groups again), the way the whole suite runs."""
    _run_suite(tmp_path, ["test_barrier_full_group"])
