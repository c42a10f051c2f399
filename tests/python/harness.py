"""Run a worker function in N real processes and collect what each returned.

``run_world(worker, world_size, env=...)`` starts ``world_size`` processes with
``python -c`` that import this module and call ``worker(rank, world_size, **kwargs)``
(``worker`` is given as "module:function", importable from tests/python). Each process
prints one JSON line with the return value or the exception; ``run_world`` returns the
list of results by rank, or raises AssertionError with every rank's output when a
process failed, hung past ``timeout`` (all are killed then) or printed no result.
``start_world`` starts them without waiting, for processes that go on running after their
result (``read_result`` reads it).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULT_PREFIX = "RINGTREE_TEST_RESULT "

# Bounds of timing assertions (as tests/cpp/harness/test_util.h). The suite runs on loaded
# two-core machines, where a process may wait a second or more for a core: an upper bound
# tells "at once" or "near its deadline" from "after a fallback timeout" or "never", and
# each test keeps its fallbacks (group and store timeouts) well beyond it.
PROMPT_S = 5.0  # what needs no waiting: a failure reaching a peer, an abort, a refusal
LATE_BY_S = 3.0  # how late after its deadline a timeout may fire (never before it)


# The variables launchers set (torchrun, ringtree-run, mpirun, Hydra, srun): a job that a
# test starts itself must not inherit the ones of whatever started the test run.
_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RINGTREE_", "TORCHELASTIC_",
                       "OMPI_", "PMI", "SLURM_")


def launcher_free_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARIABLES)}
    env.update(extra)
    return env


def free_port() -> int:
    """A port that was free a moment ago (tests of rank-0-hosted rendezvous need a fixed
    port up front; callers retry on the rare collision)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_main(target: str, rank: int, world_size: int, kwargs_json: str) -> None:
    module_name, func_name = target.split(":")
    sys.path.insert(0, str(HERE))
    try:
        module = __import__(module_name)
        result: Any = {"ok": getattr(module, func_name)(rank, world_size, **json.loads(kwargs_json))}
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = {"error": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def failed_cases(summary: dict, where: str) -> str:
    """The assertion message for a worker's Checker summary (collective_workers.Checker):
    where it ran (world size, rank, transport), how many of its cases failed, then each
    failed case that it kept, one a line."""
    lines = [f"{where}: {summary['failed']} of {summary['cases']} cases failed", *summary["failures"]]
    if summary["failed"] > len(summary["failures"]):
        lines.append(f"... and {summary['failed'] - len(summary['failures'])} more")
    return "\n  ".join(lines)


def start_world(
    target: str,
    world_size: int,
    env: dict[str, str] | None = None,
    per_rank_env: list[dict[str, str]] | None = None,
    **kwargs: Any,
) -> list[subprocess.Popen]:
    """Starts ``target`` on ``world_size`` processes (text pipes for stdout and stderr)
    and returns them without waiting; each prints its result line when the target
    returns (see read_result)."""
    procs = []
    for rank in range(world_size):
        child_env = dict(os.environ)
        child_env.update(env or {})
        if per_rank_env:
            child_env.update(per_rank_env[rank])
        code = (
            f"import sys; sys.path.insert(0, {str(HERE)!r}); import harness; "
            f"harness._child_main({target!r}, {rank}, {world_size}, {json.dumps(json.dumps(kwargs))})"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=child_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def read_result(proc: subprocess.Popen, timeout: float) -> dict[str, Any]:
    """The result line a process of start_world printed (it may go on running), read from
    its stdout within ``timeout`` seconds. Reads the pipe itself (os.read), not through
    the text wrapper, whose buffer select() cannot see."""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    pending = b""
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            text = line.decode(errors="replace")
            if text.startswith(RESULT_PREFIX):
                return json.loads(text[len(RESULT_PREFIX):])
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise AssertionError(f"pid {proc.pid} printed no result within {timeout} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"pid {proc.pid} exited with {proc.wait()} and no result")
        pending += chunk


def run_world(
    target: str,
    world_size: int,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    expect_errors: bool = False,
    per_rank_env: list[dict[str, str]] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Runs ``target`` on ``world_size`` processes and returns each rank's result dict
    ({"ok": value} or {"error": name, "message": ...})."""
    procs = start_world(target, world_size, env=env, per_rank_env=per_rank_env, **kwargs)
    deadline = time.monotonic() + timeout
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            details = [p.communicate() for p in procs]
            raise AssertionError(f"world of {world_size} hung past {timeout}s: {details}") from None
        outputs.append((proc.returncode, out, err))
    results = []
    for rank, (code, out, err) in enumerate(outputs):
        lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
        if not lines:
            raise AssertionError(f"rank {rank} exited with {code} and no result; stderr:\n{err}\nstdout:\n{out}")
        result = json.loads(lines[-1][len(RESULT_PREFIX):])
        result["returncode"] = code
        result["stderr"] = err
        if "error" in result and not expect_errors:
            raise AssertionError(f"rank {rank} raised {result['error']}: {result['message']}\n{result['traceback']}")
        results.append(result)
    return results
