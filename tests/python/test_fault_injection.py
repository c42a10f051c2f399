"""Fault injection in real processes: ranks killed from the outside (SIGKILL), ranks that
exit or close their connections, frozen ranks (SIGSTOP), and mismatched collectives, over
TCP and shared memory at 2, 3 and 4 ranks.

What every case checks is ringtree's promise: the other ranks fail fast (within 5 s of
the fault) with the documented error type and a text naming the culprit (rank, host,
pid, and the call with its sequence number), nobody hangs, and afterwards nothing of the
job is left: no process, no new /dev/shm entry, no file in the job's TMPDIR, and the
job's store port can be bound again.

Where a fault strikes (the victim, the delay, the buffer size) is drawn from a seeded
RNG per case: set RINGTREE_FAULT_SEED to explore other draws; a failure message always
shows the draw.

The rank-side code is in fault_workers.py. Ranks start through harness._child_main, so
each prints one result line (harness.RESULT_PREFIX) to its stdout, which goes to a file.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import ringtree
from fault_workers import MISMATCHES
from harness import HERE, RESULT_PREFIX, free_port

SEED = int(os.environ.get("RINGTREE_FAULT_SEED", "20261130"))
# The promise: every other rank's pending and next call fail within this many seconds.
FAIL_WITHIN_S = 5.0
# How long a case may take from the fault until every process is gone before it counts
# as a hang (generous: 4 ranks share 2 cores with whatever else runs).
EXIT_WITHIN_S = 12.0
# Start-up (interpreter, imports, rendezvous) of a whole world.
START_WITHIN_S = 60.0
# Each job process carries this variable (with the job's own value), so that a scan of
# /proc finds whatever is left of the job, children included.
JOB_MARKER = "RINGTREE_FAULT_JOB"
HOST = socket.gethostname()


def _operation_pattern(collective: str) -> str:
    """How the error text names a call of ``collective``: its name and sequence number."""
    name = "all_?gather" if collective == "all_gather" else collective
    return name + r"\(seq=\d+"


def _shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _job_processes(token: str) -> list[int]:
    """Live processes (zombies excluded: their environ reads empty) of the job ``token``."""
    needle = f"{JOB_MARKER}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path("/proc", entry, "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


class Job:
    """The processes of one case and what they share: the control store (hosted here),
    the job's store port (rank 0 or the launcher hosts it), a marker in every process's
    environment, a directory for their stdout and stderr (``logs``) and their TMPDIR
    (``scratch``). ``procs`` are the processes this test started: the ranks, or the
    launcher."""

    def __init__(self, world_size: int, transport: str, root: Path) -> None:
        self.world_size = world_size
        self.transport = transport
        self.token = uuid.uuid4().hex
        self.master_port = free_port()
        self.logs = root / "logs"
        self.scratch = root / "scratch"
        self.logs.mkdir(parents=True)
        self.scratch.mkdir()
        self.shm_before = _shm_entries()
        self.control = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.procs: list[subprocess.Popen] = []

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "RINGTREE_USE_AGENT_STORE"}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.master_port), WORLD_SIZE=str(self.world_size),
                   RINGTREE_TRANSPORT=self.transport, TMPDIR=str(self.scratch), PYTHONPATH=str(HERE),
                   FAULT_CONTROL_PORT=str(self.control.port))
        env[JOB_MARKER] = self.token
        return env

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        with open(self.logs / f"out_{name}", "wb") as out, open(self.logs / f"err_{name}", "wb") as err:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=err, cwd=self.scratch)
        self.procs.append(proc)
        return proc

    def start_ranks(self, target: str, **kwargs) -> Job:
        """One process per rank running ``fault_workers.<target>(rank, world_size,
        control_port=..., **kwargs)``; rank 0 hosts the job's store (``env://``)."""
        kwargs["control_port"] = self.control.port
        for rank in range(self.world_size):
            code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import harness; "
                    f"harness._child_main('fault_workers:{target}', {rank}, {self.world_size}, "
                    f"{json.dumps(json.dumps(kwargs))})")
            self._spawn(str(rank), [sys.executable, "-c", code], dict(self.env(), RANK=str(rank)))
        return self

    def start_launcher(self) -> subprocess.Popen:
        """``ringtree-run`` hosting the job's store and running ``python -m fault_workers``
        on every rank."""
        command = [sys.executable, "-m", "ringtree.run", "--nproc-per-node", str(self.world_size), "--master-port",
                   str(self.master_port), "-m", "fault_workers"]
        return self._spawn("launcher", command, self.env())

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def outputs(self) -> str:
        text = []
        for path in sorted(self.logs.iterdir()):
            text.append(f"--- {path.name}:\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(text)

    def wait_for(self, keys: list[str], what: str, timeout: float = START_WITHIN_S) -> None:
        """Blocks until the ranks have set ``keys`` in the control store. Fails at once
        when a process of the job exits meanwhile (it will never set them), or after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.control.check(keys):
            exited = [rank for rank, proc in enumerate(self.procs) if proc.poll() is not None]
            if exited and self.control.check(keys):  # set just before those exits
                break
            if exited or time.monotonic() > deadline:
                reason = f"process(es) {exited} exited" if exited else f"{timeout:.0f} s passed"
                raise AssertionError(f"{reason} while waiting for {what}\n{self.outputs()}")
            time.sleep(0.02)

    def wait_ready(self) -> None:
        self.wait_for([f"ready/{r}" for r in range(self.world_size)], "every rank's first call")

    def wait_exits(self, ranks: list[int], within: float) -> None:
        """Every process of ``ranks`` exits on its own within ``within`` seconds, or the
        case fails as a hang (the processes are killed by ``finish``)."""
        deadline = time.monotonic() + within
        for rank in ranks:
            try:
                self.procs[rank].wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        running = [rank for rank in ranks if self.procs[rank].poll() is None]
        if running:
            raise AssertionError(f"rank(s) {running} still run {within:.0f} s after the fault (a hang)\n"
                                 f"{self.reported_outcomes(ranks)}\n{self.outputs()}")

    def reported_outcomes(self, ranks: list[int]) -> str:
        """What each of ``ranks`` published as ``outcome/<rank>`` before waiting for the
        others (fault_workers._report_and_wait_for_the_others)."""
        lines = []
        for rank in ranks:
            key = f"outcome/{rank}"
            reported = self.control.get(key).decode() if self.control.check([key]) else "nothing (still in a call?)"
            lines.append(f"rank {rank} reported: {reported}")
        return "\n".join(lines)

    def result(self, rank: int) -> dict:
        out = (self.logs / f"out_{rank}").read_text(errors="replace")
        lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
        assert lines, f"rank {rank} (exit status {self.procs[rank].returncode}) printed no result\n{self.outputs()}"
        result = json.loads(lines[-1][len(RESULT_PREFIX):])
        assert "ok" in result, f"rank {rank} raised {result['error']}: {result['message']}\n{result['traceback']}"
        return result["ok"]

    def finish(self) -> None:
        """Kills and reaps whatever is still running (a failed case) and closes the
        control store."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.control = None

    def leftovers(self) -> list[str]:
        """What the job left behind: processes, new /dev/shm entries, files in its
        TMPDIR, its store port still bound. Call after every process has been reaped."""
        found = []
        deadline = time.monotonic() + 5.0
        while _job_processes(self.token) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _job_processes(self.token):
            found.append(f"processes of the job left: {_job_processes(self.token)}")
        if not _shm_entries() <= self.shm_before:
            found.append(f"left in /dev/shm: {_shm_entries() - self.shm_before}")
        if list(self.scratch.iterdir()):
            found.append(f"left in the job's TMPDIR: {list(self.scratch.iterdir())}")
        try:
            ringtree.TCPStore("127.0.0.1", self.master_port, is_master=True, wait_for_workers=False)
        except ringtree.DistNetworkError as exc:
            found.append(f"the job's store port {self.master_port} cannot be bound again: {exc}")
        return found


@pytest.fixture
def make_job(tmp_path):
    """Makes Jobs; kills and reaps whatever a failed test left running."""
    jobs = []

    def make(world_size: int, transport: str) -> Job:
        jobs.append(Job(world_size, transport, tmp_path / f"job{len(jobs)}"))
        return jobs[-1]

    yield make
    for job in jobs:
        job.finish()


def _problems_naming_dead_peer(failure: dict | None, what: str, victim: int, pid: int, collective: str) -> list[str]:
    """How ``failure`` falls short of a DistNetworkError naming the dead ``victim``."""
    if failure is None:
        return [f"{what}: no error"]
    message = failure["message"]
    if failure["error"] != "DistNetworkError" or "ConnectionError" not in failure["bases"]:
        return [f"{what}: {failure['error']} instead of DistNetworkError: {message}"]
    problems = []
    if f"rank {victim}" not in message:
        problems.append(f"{what} does not name rank {victim}: {message}")
    if HOST not in message or f"pid {pid}" not in message:
        problems.append(f"{what} does not name host {HOST!r} and pid {pid}: {message}")
    if not re.search(_operation_pattern(collective), message):
        problems.append(f"{what} does not name the {collective} call with its sequence number: {message}")
    return problems


# (fault, collective, transport, world size, point): every collective, transport, world
# size and point is covered, and each pair of them at least once over the kill cases.
FAULT_CASES = [
    ("kill", "allreduce", "tcp", 2, "during"),
    ("kill", "allreduce", "tcp", 2, "between"),
    ("kill", "allreduce", "shm", 3, "before"),
    ("kill", "allreduce", "shm", 4, "between"),
    ("kill", "allreduce", "tcp", 4, "during"),
    ("kill", "broadcast", "tcp", 3, "between"),
    ("kill", "broadcast", "shm", 2, "during"),
    ("kill", "broadcast", "shm", 4, "before"),
    ("kill", "broadcast", "tcp", 3, "during"),
    ("kill", "all_gather", "tcp", 2, "before"),
    ("kill", "all_gather", "shm", 3, "during"),
    ("kill", "all_gather", "tcp", 4, "between"),
    ("exit", "allreduce", "tcp", 2, "between"),
    ("exit", "broadcast", "shm", 3, "during"),
    ("close", "allreduce", "shm", 2, "between"),
    ("close", "all_gather", "tcp", 3, "before"),
]


@pytest.mark.parametrize("fault,collective,transport,world_size,point", FAULT_CASES,
                         ids=["-".join(map(str, case)) for case in FAULT_CASES])
def test_failed_peer_fails_the_others_fast_naming_it(make_job, fault, collective, transport, world_size, point):
    rng = random.Random(f"{SEED}/{fault}/{collective}/{transport}/{world_size}/{point}")
    victim = rng.randrange(world_size)
    count = 1 << 20 if point == "during" else rng.choice([1024, 1 << 20])
    delay = rng.uniform(0.05, 0.5)
    draw = f"seed {SEED}: victim rank {victim}, {count} elements, fault {delay:.2f} s after the cue"
    job = make_job(world_size, transport).start_ranks(
        "collective_under_fault", collective=collective, point=point, fault=fault, victim=victim, count=count,
        group_timeout_s=60.0)
    survivors = [r for r in range(world_size) if r != victim]
    job.wait_ready()
    if point == "before":
        job.wait_for([f"inside/{r}" for r in survivors], "the others to enter the call")
    elif point == "during":
        job.wait_for([f"inside/{r}" for r in range(world_size)], "every rank's loop")
    time.sleep(delay)

    if fault == "kill":
        fault_at = time.monotonic()
        os.kill(job.pid(victim), signal.SIGKILL)
        job.procs[victim].wait()
    else:
        job.control.set("act", "1")
        if fault == "exit":
            job.wait_exits([victim], EXIT_WITHIN_S)
        else:
            job.wait_for(["closed"], "the victim to close its group")
        fault_at = float(job.control.get("fault_at"))
    job.control.set("go", "1")  # "between": the others enter the next call now

    job.wait_exits(survivors, EXIT_WITHIN_S)
    job.control.set("finished", "1")
    job.wait_exits([victim], EXIT_WITHIN_S)
    pid = job.pid(victim)
    problems = []
    for rank in survivors:
        result = job.result(rank)
        what = f"rank {rank} ({draw})"
        if result["first"] is None:
            problems.append(f"{what}: no call failed ({result['calls']} completed)")
            continue
        problems += _problems_naming_dead_peer(result["first"], f"{what}, the call pending at the fault or after it",
                                               victim, pid, collective)
        problems += _problems_naming_dead_peer(result["next"], f"{what}, the call after the failed one", victim, pid,
                                               collective)
        for name in ("first", "next"):
            took = result[name]["at"] - fault_at if result[name] else None
            if took is not None and took >= FAIL_WITHIN_S:
                problems.append(f"{what}: the {name} call failed {took:.2f} s after the fault")
    job.finish()
    problems += job.leftovers()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("transport,victim", [("tcp", 1), ("shm", 0)])
def test_frozen_rank_is_named_as_not_arrived(make_job, transport, victim):
    """SIGSTOP one rank a while after its first call (long enough for ringtree to have
    published what it last did) and let the others enter the next call with a 2 s group
    timeout: they must time out naming the frozen rank and its last call."""
    timeout_s, idle_s = 2.0, 1.0
    job = make_job(3, transport).start_ranks("frozen_peer", collective="allreduce", victim=victim,
                                             group_timeout_s=timeout_s)
    job.wait_ready()
    survivors = [r for r in range(3) if r != victim]
    time.sleep(idle_s)
    os.kill(job.pid(victim), signal.SIGSTOP)
    try:
        job.control.set("go", "1")
        job.wait_for([f"outcome/{r}" for r in survivors], "the others' timeouts", timeout_s + EXIT_WITHIN_S)
    finally:
        os.kill(job.pid(victim), signal.SIGKILL)
        os.kill(job.pid(victim), signal.SIGCONT)
    job.wait_exits(survivors, EXIT_WITHIN_S)
    job.finish()
    problems = []
    for rank in survivors:
        result = job.result(rank)
        message = result.get("message", "")
        if result["error"] != "DistTimeoutError" or "TimeoutError" not in result["bases"]:
            problems.append(f"rank {rank}: {result['error']} instead of DistTimeoutError: {message}")
            continue
        if not timeout_s * 0.9 <= result["elapsed"] < timeout_s + 3.0:
            problems.append(f"rank {rank} failed after {result['elapsed']:.2f} s with a {timeout_s} s timeout")
        if f"rank {victim}" not in message:
            problems.append(f"rank {rank} does not name the frozen rank {victim}: {message}")
        # The frozen rank's last call was the first allreduce (seq=1); the waiting call is seq=2.
        if "allreduce(seq=2" not in message:
            problems.append(f"rank {rank} does not name the call it waited in: {message}")
        if "allreduce(seq=1" not in message:
            problems.append(f"rank {rank} does not say what rank {victim} did last: {message}")
    problems += job.leftovers()
    assert not problems, "\n".join(problems)


# Two ranks that both believe they are the root of a broadcast only send: no message
# reaches either of them in the call, so detecting it there would take an extra round
# trip. Over TCP the rank whose check runs after the other's message arrived fails in the
# call; the other one may return and then fails at its next call (still naming both
# calls). Every other case must fail on both ranks within the call.
DETECTED_AT_NEXT_CALL = {"broadcast_root"}


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_mismatched_collectives_fail_on_both_ranks_naming_both_calls(make_job, transport):
    cases = list(MISMATCHES)
    late_ranks: dict[str, int] = {}
    job = make_job(2, transport).start_ranks("mismatch_matrix", cases=cases, group_timeout_s=6.0)
    job.wait_exits([0, 1], START_WITHIN_S + len(cases) * 6.0)
    problems = []
    for rank in range(2):
        results = job.result(rank)
        for case in cases:
            failure = results[case]
            first, second = MISMATCHES[case][2]
            where = f"{case} mismatch, rank {rank}"
            if failure["error"] != "CollectiveMismatchError":
                problems.append(f"{where}: {failure['error']}: {failure.get('message')}")
                continue
            if failure["at_next_call"]:
                late_ranks[case] = late_ranks.get(case, 0) + 1
                if case not in DETECTED_AT_NEXT_CALL or late_ranks[case] > 1:
                    problems.append(f"{where}: detected only at the next call")
            message = failure["message"]
            if "ValueError" not in failure["bases"]:
                problems.append(f"{where}: not a ValueError: {failure['bases']}")
            if not ("rank 0" in message and "rank 1" in message and first in message and second in message):
                problems.append(f"{where}: does not name both ranks and both calls ({first!r}, {second!r}): "
                                f"{message}")
            if failure["elapsed"] >= FAIL_WITHIN_S:
                problems.append(f"{where}: took {failure['elapsed']:.2f} s")
    job.finish()
    problems += job.leftovers()
    assert not problems, "\n".join(problems)


def test_launcher_stops_the_job_and_names_the_killed_rank(make_job):
    """Under ringtree-run: SIGKILL one worker in the middle of large allreduces. The
    launcher must stop the job and exit non-zero within the failure bound, naming the
    killed rank (rank 0: the launcher reports the lowest failed rank among those it has
    seen exit, and the killed one exits first) and its signal."""
    victim, delay = 0, random.Random(f"{SEED}/launcher").uniform(0.05, 0.5)
    job = make_job(3, "shm")
    launcher = job.start_launcher()
    job.wait_ready()
    pids = {rank: int(job.control.get(f"ready/{rank}")) for rank in range(3)}
    time.sleep(delay)
    killed_at = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    try:
        launcher.wait(EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the launcher still runs {EXIT_WITHIN_S:.0f} s after the kill\n{job.outputs()}") from None
    took = time.monotonic() - killed_at
    job.finish()
    report = (job.logs / "err_launcher").read_text(errors="replace")
    assert launcher.returncode != 0, report
    assert took < FAIL_WITHIN_S, f"the launcher exited {took:.2f} s after the kill\n{report}"
    named = rf"global rank {victim} \(local rank {victim}, .*pid {pids[victim]}\): killed by SIGKILL"
    assert re.search(named, report), report
    assert not job.leftovers()
