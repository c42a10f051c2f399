"""Diagnostics from Python: dump_flight_recorder, the per-rank files of
RINGTREE_FLIGHT_RECORDER_DIR, the merge CLI on a real three-rank failure and on a
mismatch, the timeout text that names the rank that did not arrive, and abort followed
by a new init."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ringtree as dist
from harness import PROMPT_S, run_world

ENTRY_KEYS = {"seq", "collective", "algorithm", "dtype", "count", "root", "op", "description", "state", "error",
              "start_time", "end_time", "duration_us"}


def _server() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _merge(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtree.flight_recorder", str(directory)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_exports():
    assert "dump_flight_recorder" in dist.__all__ and "abort_process_group" in dist.__all__


def test_dump_flight_recorder_and_the_directory_dump(tmp_path):
    server = _server()
    dumps = tmp_path / "dumps"
    results = run_world("diagnostics_workers:record_and_dump", 2, env={"RINGTREE_FLIGHT_RECORDER_DIR": str(dumps)},
                        port=server.port, directory=str(tmp_path))
    for rank, result in enumerate(results):
        entries = result["ok"]["entries"]
        assert [e["collective"] for e in entries] == ["allreduce", "broadcast", "barrier"]
        assert [e["seq"] for e in entries] == [1, 2, 3]
        for entry in entries:
            assert set(entry) == ENTRY_KEYS
            assert entry["state"] == "completed" and entry["error"] is None
            assert entry["end_time"] >= entry["start_time"] and entry["duration_us"] >= 0
        assert entries[0]["dtype"] == "float32" and entries[0]["count"] == 4 and entries[0]["op"] == "SUM"
        assert entries[1]["root"] == 1
        assert entries[0]["description"].startswith("allreduce(seq=1, algorithm=")
        assert result["ok"]["result"] == [3.0] * 4

        document = json.loads((dumps / f"rank_{rank}.json").read_text())
        assert document["format"] == "ringtree-flight-recorder"
        assert (document["rank"], document["group_rank"], document["group_size"]) == (rank, rank, 2)
        assert document["world"] is True and document["reason"] == "destroy_process_group"
        assert document["entries"] == entries
        written = json.loads((tmp_path / f"dump_{rank}.json").read_text())
        assert written["reason"] == "dump_flight_recorder" and written["rank"] == rank
        assert written["entries"] == entries
    merged = _merge(dumps)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "seq 1-3" in merged.stdout and "completed alike on every rank" in merged.stdout


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_rank_that_skips_a_collective(tmp_path, transport):
    """Rank 2 skips the last all_reduce: ranks 0 and 1 time out naming it and what it last
    did (from its status in the store over TCP, from the node arena over shared memory),
    destroy their group at once, and the merged files point at seq 3."""
    server = _server()
    results = run_world("diagnostics_workers:skip_the_last_call", 3, port=server.port, timeout_s=2.0,
                        env={"RINGTREE_FLIGHT_RECORDER_DIR": str(tmp_path), "RINGTREE_TRANSPORT": transport})
    for rank in (0, 1):
        failed = results[rank]["ok"]
        assert failed["error"] == "DistTimeoutError", failed
        # This rank's own timeout, or the one another waiting rank passed on first.
        assert "allreduce(seq=3, algorithm=" in failed["message"], failed["message"]
        assert "rank 2 did not enter allreduce(seq=3): rank 2 last completed barrier(seq=2)" in failed["message"], \
            failed["message"]
        assert failed["destroy_s"] < 2.0, failed
        assert "latest calls of rank" in results[rank]["stderr"], results[rank]["stderr"]
    merged = _merge(tmp_path)
    assert merged.returncode == 1, merged.stdout + merged.stderr
    lines = merged.stdout.splitlines()
    assert lines[0].startswith("world '0' (3 ranks; files: rank_0.json, rank_1.json, rank_2.json)"), merged.stdout
    assert any(line.strip().startswith("seq 1-2") and "completed alike on every rank" in line for line in lines)
    divergence = [i for i, line in enumerate(lines) if "first divergence" in line]
    assert len(divergence) == 1 and lines[divergence[0]].strip().startswith("seq 3"), merged.stdout
    assert "allreduce(seq=3" in lines[divergence[0]]
    assert " ".join(lines[divergence[0] + 1].split()) == "entered: 0, 1 failed: 0, 1 did not enter: 2", merged.stdout
    assert "rank 0 failed in seq 3: rank 0: " in merged.stdout


def _document(rank: int, descriptions: list[str]) -> dict:
    entries = []
    for seq, description in enumerate(descriptions, start=1):
        name = description.split("(")[0]
        entries.append({"seq": seq, "collective": name, "algorithm": "ring", "dtype": "float32", "count": 4,
                        "root": -1, "op": "SUM", "description": description.format(seq=seq), "state": "completed",
                        "error": None, "start_time": 1.0 + seq, "end_time": 1.5 + seq, "duration_us": 5.0})
    return {"format": "ringtree-flight-recorder", "version": 1, "group": "tp", "world": False, "rank": 10 + rank,
            "group_rank": rank, "group_size": 2, "host": "h", "pid": 1, "reason": "test", "written_at": 9.0,
            "capacity": 2048, "calls": len(entries), "entries": entries}


def test_merge_reports_a_mismatch(tmp_path):
    calls = {0: ["barrier(seq={seq})", "allreduce(seq={seq}, algorithm=ring, dtype=float32, count=4, op=SUM)"],
             1: ["barrier(seq={seq})", "allreduce(seq={seq}, algorithm=ring, dtype=float32, count=8, op=SUM)"]}
    for rank, descriptions in calls.items():
        (tmp_path / f"rank_{10 + rank}.tp.json").write_text(json.dumps(_document(rank, descriptions)))
    (tmp_path / "notes.json").write_text("{}")
    merged = _merge(tmp_path)
    assert merged.returncode == 1, merged.stdout + merged.stderr
    assert merged.stdout.startswith("group 'tp' (2 ranks; files: rank_10.tp.json, rank_11.tp.json)")
    assert "seq 1" in merged.stdout and "completed alike on every rank (last: barrier(seq=1))" in merged.stdout
    mismatch = next(line for line in merged.stdout.splitlines() if "MISMATCH" in line)
    assert mismatch.strip().startswith("seq 2") and "first divergence" in mismatch
    assert "rank 10 called allreduce(seq=2, algorithm=ring, dtype=float32, count=4, op=SUM)" in mismatch
    assert "rank 11 called allreduce(seq=2, algorithm=ring, dtype=float32, count=8, op=SUM)" in mismatch
    assert "skipped notes.json: not a ringtree flight record" in merged.stderr


def test_merge_without_records_fails(tmp_path):
    merged = _merge(tmp_path)
    assert merged.returncode == 2 and "no ringtree flight record" in merged.stderr


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_abort_interrupts_a_blocked_collective_and_the_process_can_init_again(transport):
    server = _server()
    rank0, rank1 = (r["ok"] for r in run_world("diagnostics_workers:abort_and_init_again", 2, port=server.port,
                                                env={"RINGTREE_TRANSPORT": transport}))
    failure = rank0["failure"]
    assert failure["error"] == "DistBackendError", failure
    assert "allreduce(seq=2" in failure["message"] and "was aborted" in failure["message"], failure
    # The blocked call fails, abort returns and the peer's destroy returns at once, not at
    # the 30 s group timeout.
    assert failure["after_abort_s"] < PROMPT_S, failure
    assert rank0["abort_s"] < PROMPT_S and rank0["initialized_after_abort"] is False
    assert rank1["peer_error"] == "DistNetworkError"
    assert rank1["destroy_s"] < PROMPT_S
    for result in (rank0, rank1):
        assert result["after"] == [3.0] * 4
        assert "has been aborted" in result["after_abort_error"], result
        assert result["recorded_after_abort"] == ["allreduce", "barrier"]
