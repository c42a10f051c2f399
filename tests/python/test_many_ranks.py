"""32 ranks on this host (2 cores: 16 per core): init, every collective and point-to-point
call exact (many_ranks_program.py), a clean exit, and the host's shared memory back where
it was. Shared memory stays linear in the ranks: the node arena plus the ring pages that
carried data, not a ring per ordered pair of ranks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from harness import launcher_free_env

from ringtree.bench.scale import shmem_kb

PROGRAM = Path(__file__).resolve().parent / "many_ranks_program.py"
RANKS = 32


def test_32_ranks_on_one_host(tmp_path):
    before = shmem_kb()
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ringtree.run", "--nproc-per-node", str(RANKS), str(PROGRAM),
                           str(tmp_path)], env=launcher_free_env(), capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(RANKS)]
    for rank, report in enumerate(reports):
        assert report["wrong"] == [], (rank, report["wrong"][:5])
        assert report["transports"] == ["shm"], (rank, report["transports"])
    # The node arena is 4 MiB a rank; every rank's rings to every peer, had they been
    # faulted in as before, were 2 x 1 MiB per peer per communicator (~2.2 GB here).
    in_use_mb = max(r["shmem_kb_after_init"] for r in reports) / 1024 - before / 1024
    assert in_use_mb < RANKS * 4 + 64, in_use_mb
    # Nothing left: every segment went with its last mapping, every rank exited.
    time.sleep(0.2)
    assert shmem_kb() - before < 16 * 1024, (before, shmem_kb())
    pids = [r["pid"] for r in reports]
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], pids
    print(f"32 ranks: {elapsed:.1f} s launch to exit, {in_use_mb:.0f} MB shared memory after init")
