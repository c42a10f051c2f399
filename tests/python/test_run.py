"""Tests of the launcher ``ringtree-run`` (``python -m ringtree.run``).

Each test runs the launcher as a subprocess on small worker scripts written to
``tmp_path``; workers report what they saw through files there. Every subprocess call
has a timeout, and a fixture kills whatever a failed test leaves running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ringtree
from ringtree import run as ringtree_run

LAUNCHER = [sys.executable, "-m", "ringtree.run"]
TIMEOUT_S = 30.0

# Written at the top of every Python worker: OUT is the directory for reports, RANK the
# global rank, and report(name, value) writes OUT/name_RANK atomically.
PRELUDE = textwrap.dedent(
    """
    import json, os, sys, time
    OUT = os.environ["TEST_OUT"]
    RANK = int(os.environ["RANK"])

    def report(name, value):
        path = os.path.join(OUT, f"{name}_{RANK}")
        with open(path + ".tmp", "w") as f:
            json.dump(value, f)
        os.replace(path + ".tmp", path)

    report("pid", os.getpid())
    """
)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wait_for(predicate, timeout: float = TIMEOUT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _read_reports(out: Path, name: str) -> dict[int, object]:
    reports = {}
    for path in out.glob(f"{name}_*"):
        if not path.name.endswith(".tmp"):
            reports[int(path.name.rsplit("_", 1)[1])] = json.loads(path.read_text())
    return reports


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """Writes worker scripts into ``tmp_path`` and runs the launcher on them."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.env = dict(os.environ, TEST_OUT=str(self.out))
        self.env.pop("OMP_NUM_THREADS", None)
        self.env.pop("PYTHONUNBUFFERED", None)
        self._popens: list[subprocess.Popen] = []

    def script(self, body: str, name: str = "worker.py") -> Path:
        path = self.dir / name
        path.write_text(PRELUDE + textwrap.dedent(body))
        return path

    def run(self, *args: str, timeout: float = TIMEOUT_S, **kwargs) -> subprocess.CompletedProcess:
        """Run the launcher to completion; returns its exit code, stdout and stderr."""
        kwargs.setdefault("env", self.env)
        return subprocess.run(
            [*LAUNCHER, *args], capture_output=True, text=True, timeout=timeout, **kwargs
        )

    def start(self, *args: str) -> subprocess.Popen:
        """Start the launcher in the background (killed at teardown if still running)."""
        proc = subprocess.Popen(
            [*LAUNCHER, *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._popens.append(proc)
        return proc

    def pids(self) -> dict[int, int]:
        return _read_reports(self.out, "pid")

    def cleanup(self) -> None:
        for proc in self._popens:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
        # Kill what is left of this test's workers, recognised by their TEST_OUT (a pid
        # read from a report may belong to some other process by now).
        marker = f"TEST_OUT={self.out}".encode() + b"\0"
        for report in ("pid", "grandchild"):
            for pid in _read_reports(self.out, report).values():
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue
                if marker in environ and _alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def job(tmp_path):
    job = Job(tmp_path)
    yield job
    job.cleanup()


def _report_section(stderr: str) -> str:
    """The failure report the launcher prints at the end of its stderr."""
    assert "worker failed" in stderr, stderr
    return stderr[stderr.index("worker failed") :]


# --- arguments ----------------------------------------------------------------------


def test_parse_args_accepts_torchrun_spellings():
    args = ringtree_run._parse_args(
        ["--nproc_per_node=3", "--nnodes", "2:2", "--node_rank", "1", "--master_addr", "h",
         "--master_port", "1234", "train.py", "--nnodes", "5", "-m", "x"]
    )
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == (3, 2, 1)
    assert (args.master_addr, args.master_port) == ("h", 1234)
    assert args.training_script == "train.py"
    assert args.training_script_args == ["--nnodes", "5", "-m", "x"]
    assert not args.module


def test_parse_args_auto_and_standalone():
    args = ringtree_run._parse_args(
        ["--nproc-per-node", "auto", "--standalone", "--master-port", "5", "--master-addr",
         "elsewhere", "-m", "pkg.mod"]
    )
    assert args.nproc_per_node == (os.cpu_count() or 1)
    assert (args.nnodes, args.node_rank) == (1, 0)
    assert (args.master_addr, args.master_port) == ("127.0.0.1", None)
    assert args.module and args.training_script == "pkg.mod"
    assert ringtree_run._parse_args(["--nproc-per-node", "cpu", "x"]).nproc_per_node == (
        os.cpu_count() or 1
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--nproc-per-node", "0", "x.py"],
        ["--nproc-per-node", "two", "x.py"],
        ["--nnodes", "1:2", "x.py"],
        ["--nnodes", "2", "--node-rank", "2", "--master-port", "1", "x.py"],
        ["--nnodes", "2", "x.py"],
        ["--master-port", "70000", "x.py"],
        ["--no-python", "-m", "x"],
        [],
    ],
)
def test_parse_args_rejects(argv, capsys):
    with pytest.raises(SystemExit) as info:
        ringtree_run._parse_args(argv)
    assert info.value.code == 2
    assert "ringtree-run: error:" in capsys.readouterr().err


# --- environment, command forms -----------------------------------------------------

ENV_NAMES = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "RINGTREE_USE_AGENT_STORE", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
    "OMP_NUM_THREADS", "PYTHONUNBUFFERED",
]  # fmt: skip

ENV_WORKER = f"""
names = {ENV_NAMES!r}
report("env", {{"env": {{n: os.environ.get(n) for n in names}}, "argv": sys.argv[1:]}})
print(f"stdout of rank {{RANK}}")
print(f"stderr of rank {{RANK}}", file=sys.stderr)
"""


@pytest.mark.parametrize("nproc", [1, 2, 3, 4])
def test_worker_environment(job, nproc):
    script = job.script(ENV_WORKER)
    result = job.run("--nproc-per-node", str(nproc), str(script), "--flag", "-x", "value")
    assert result.returncode == 0, result.stderr
    reports = _read_reports(job.out, "env")
    assert sorted(reports) == list(range(nproc))
    ports = {r["env"]["MASTER_PORT"] for r in reports.values()}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    for rank, report in reports.items():
        env = report["env"]
        assert env == dict(
            env,
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
            ROLE_NAME="default", ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1", RINGTREE_USE_AGENT_STORE="1", TORCHELASTIC_USE_AGENT_STORE="True",
            TORCHELASTIC_RESTART_COUNT="0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
        )  # fmt: skip
        assert report["argv"] == ["--flag", "-x", "value"]
        assert f"stdout of rank {rank}\n" in result.stdout
        assert f"stderr of rank {rank}\n" in result.stderr


PIECEWISE_WORKER = """
import time
for line in range(20):
    for piece in ("rank", f" {RANK}", f" line {line}", "\\n"):
        os.write(1, piece.encode())
        os.write(2, piece.encode())
        time.sleep(0.001)
os.write(1, f"unfinished last line of rank {RANK}".encode())
"""


@pytest.mark.parametrize("nproc", [3])
def test_lines_of_workers_never_mix(job, nproc):
    # Each worker writes every line in four pieces, to both streams, while the others do
    # the same: the launcher writes through whole lines only.
    script = job.script(PIECEWISE_WORKER)
    result = job.run("--nproc-per-node", str(nproc), str(script))
    assert result.returncode == 0, result.stderr
    expected = {f"rank {r} line {i}" for r in range(nproc) for i in range(20)}
    assert set(result.stderr.splitlines()) >= expected
    stdout_lines = result.stdout.splitlines()
    assert set(stdout_lines) - expected == {
        f"unfinished last line of rank {r}" for r in range(nproc)
    }, result.stdout
    assert len(stdout_lines) == len(expected) + nproc


def test_node_rank_offsets_ranks_and_keeps_omp_num_threads(job):
    # A node of rank 1 hosts nothing; the store of "node 0" is hosted here, and the
    # launcher reports its end through it.
    store = ringtree.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    script = job.script(ENV_WORKER)
    job.env["OMP_NUM_THREADS"] = "7"
    port = str(store.port)
    result = job.run(
        "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr",
        "localhost", "--master-port", port, str(script),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert store.add("ringtree-run/nodes_exited", 0) == 1
    reports = _read_reports(job.out, "env")
    assert sorted(reports) == [2, 3]
    for rank, report in reports.items():
        env = report["env"]
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank - 2))
        assert env["WORLD_SIZE"] == "4"
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("1", "2")
        assert env["LOCAL_WORLD_SIZE"] == "2"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("localhost", port)
        assert env["OMP_NUM_THREADS"] == "7"


def test_module(job):
    package = job.dir / "trainpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(
        PRELUDE + 'report("module", {"name": __name__, "argv": sys.argv[1:]})\n'
    )
    result = job.run("--standalone", "--nproc-per-node", "2", "-m", "trainpkg.train", "a", "--b",
                     cwd=job.dir)  # fmt: skip
    assert result.returncode == 0, result.stderr
    reports = _read_reports(job.out, "module")
    assert reports == {r: {"name": "__main__", "argv": ["a", "--b"]} for r in (0, 1)}


def test_no_python(job):
    script = job.dir / "worker.sh"
    script.write_text('#!/bin/sh\necho "$RANK $WORLD_SIZE $LOCAL_RANK $*" > "$TEST_OUT/sh_$RANK"\n')
    script.chmod(0o755)
    result = job.run("--nproc-per-node", "3", "--no-python", str(script), "one", "two")
    assert result.returncode == 0, result.stderr
    for rank in range(3):
        assert (job.out / f"sh_{rank}").read_text() == f"{rank} 3 {rank} one two\n"


def test_nproc_auto_runs_one_worker_per_cpu(job):
    script = job.dir / "worker.sh"
    script.write_text('#!/bin/sh\ntouch "$TEST_OUT/auto_$RANK"\n')
    script.chmod(0o755)
    result = job.run("--nproc-per-node", "auto", "--no-python", str(script))
    assert result.returncode == 0, result.stderr
    assert len(list(job.out.glob("auto_*"))) == (os.cpu_count() or 1)


def test_program_that_cannot_start(job):
    missing = str(job.dir / "no-such-program")
    result = job.run("--nproc-per-node", "2", "--no-python", missing)
    assert result.returncode == 1
    assert "cannot start local rank 0" in result.stderr and missing in result.stderr


# --- failures -----------------------------------------------------------------------

# Rank FAIL_RANK waits until every rank reported its pid, then fails as FAIL_HOW says;
# the other ranks sleep (ignoring SIGTERM when IGNORE_TERM is set).
FAILING_WORKER = """
import signal
world = int(os.environ["WORLD_SIZE"])
if RANK == int(os.environ["FAIL_RANK"]):
    while len([p for p in os.listdir(OUT) if p.startswith("pid_") and ".tmp" not in p]) < world:
        time.sleep(0.01)
    for i in range(50):
        print(f"noise line {i}", file=sys.stderr)
    print("FATAL: rank gave up", file=sys.stderr, flush=True)
    report("failed_at", time.time())
    if os.environ["FAIL_HOW"] == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    report("ignoring", True)
time.sleep(60)
"""


def test_failing_rank_stops_the_others_and_is_reported(job):
    script = job.script(FAILING_WORKER)
    job.env.update(FAIL_RANK="1", FAIL_HOW="exit")
    result = job.run("--nproc-per-node", "3", str(script))
    stopped_after = time.time() - _read_reports(job.out, "failed_at")[1]
    assert result.returncode == 3, result.stderr
    pids = job.pids()
    assert sorted(pids) == [0, 1, 2]
    assert not any(_alive(pid) for pid in pids.values())
    report = _report_section(result.stderr)
    host = os.uname().nodename
    assert f"global rank 1 (local rank 1, node rank 0, host {host}, pid {pids[1]})" in report
    assert "exit code 3" in report
    # The tail holds the last 40 lines of rank 1's stderr.
    assert "FATAL: rank gave up" in report
    assert "noise line 49" in report and "noise line 11\n" in report
    assert "noise line 10\n" not in report
    # The other ranks were sleeping and died of SIGTERM at once (no grace period spent).
    assert stopped_after < ringtree_run.GRACE_PERIOD_S - 1, stopped_after


def test_rank_killed_by_sigkill_is_reported_by_signal_name(job):
    script = job.script(FAILING_WORKER)
    job.env.update(FAIL_RANK="0", FAIL_HOW="kill")
    result = job.run("--nproc-per-node", "2", str(script))
    assert result.returncode == 1, result.stderr
    report = _report_section(result.stderr)
    assert "global rank 0 (local rank 0" in report and "killed by SIGKILL" in report
    assert not any(_alive(pid) for pid in job.pids().values())


def test_worker_ignoring_sigterm_is_killed_after_the_grace_period(job):
    script = job.script(FAILING_WORKER)
    job.env.update(FAIL_RANK="1", FAIL_HOW="exit", IGNORE_TERM="1")
    result = job.run("--nproc-per-node", "2", str(script))
    stopped_after = time.time() - _read_reports(job.out, "failed_at")[1]
    assert result.returncode == 3, result.stderr
    assert _read_reports(job.out, "ignoring") == {0: True}
    assert not any(_alive(pid) for pid in job.pids().values())
    grace = ringtree_run.GRACE_PERIOD_S
    assert grace - 0.1 <= stopped_after < grace + 5, stopped_after


# --- signals ------------------------------------------------------------------------

SLEEPING_WORKER = """
import subprocess
child = subprocess.Popen(["sleep", "60"])
report("grandchild", child.pid)
time.sleep(60)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_launcher_stops_workers_and_their_children(job, signum):
    script = job.script(SLEEPING_WORKER)
    launcher = job.start("--nproc-per-node", "2", str(script))
    _wait_for(lambda: len(_read_reports(job.out, "grandchild")) == 2, what="workers to start")
    launcher.send_signal(signum)
    _, stderr = launcher.communicate(timeout=TIMEOUT_S)
    assert launcher.returncode == 128 + signum, stderr
    assert f"received {signal.Signals(signum).name}; stopping 2 worker(s)" in stderr
    pids = [*job.pids().values(), *_read_reports(job.out, "grandchild").values()]
    assert len(pids) == 4 and not any(_alive(pid) for pid in pids)


def test_leftover_processes_of_a_successful_worker_are_killed(job):
    script = job.script(
        """
        import subprocess
        report("grandchild", subprocess.Popen(["sleep", "60"]).pid)
        """
    )
    result = job.run("--nproc-per-node", "2", str(script))
    assert result.returncode == 0, result.stderr
    grandchildren = _read_reports(job.out, "grandchild").values()
    assert len(grandchildren) == 2 and not any(_alive(pid) for pid in grandchildren)


# --- the agent store ----------------------------------------------------------------

STORE_WORKER = """
import ringtree
world = int(os.environ["WORLD_SIZE"])
store = ringtree.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
store.add("sum", RANK + 1)
store.add("count", 1)
if RANK != 0:
    # Rank 0 exits right away; the store must outlive it.
    time.sleep(0.2)
    deadline = time.monotonic() + 20
    while store.add("count", 0) < world and time.monotonic() < deadline:
        time.sleep(0.005)
report("sum", store.add("sum", 0))
"""


def test_workers_share_the_launchers_store(job):
    script = job.script(STORE_WORKER)
    result = job.run("--nproc-per-node", "4", str(script))
    assert result.returncode == 0, result.stderr
    sums = _read_reports(job.out, "sum")
    assert sorted(sums) == [0, 1, 2, 3]
    assert all(total == 10 for rank, total in sums.items() if rank != 0)


def test_env_rendezvous_makes_every_rank_a_client_of_the_agent_store(job):
    script = job.script(
        """
        import ringtree
        store, rank, world_size = next(ringtree.rendezvous("env://"))
        assert (rank, world_size) == (RANK, 3)
        store.add("arrived", 1)
        if rank == 0:
            store.set("go", b"1")
        else:
            store.wait(["go"])
        report("arrived", store.add("arrived", 0))
        """
    )
    result = job.run("--nproc-per-node", "3", str(script))
    assert result.returncode == 0, result.stderr
    assert sorted(_read_reports(job.out, "arrived")) == [0, 1, 2]


def test_two_launchers_at_once_pick_different_ports(job):
    script = job.script(STORE_WORKER + 'report("port", os.environ["MASTER_PORT"])\n')
    first = job.start("--nproc-per-node", "2", str(script))
    second_out = job.out / "second"
    second_out.mkdir()
    second = subprocess.run(
        [*LAUNCHER, "--nproc-per-node", "2", str(script)],
        env=dict(job.env, TEST_OUT=str(second_out)),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    _, first_err = first.communicate(timeout=TIMEOUT_S)
    assert first.returncode == 0, first_err
    assert second.returncode == 0, second.stderr
    first_ports = set(_read_reports(job.out, "port").values())
    second_ports = set(_read_reports(second_out, "port").values())
    assert len(first_ports) == 1 and len(second_ports) == 1 and first_ports != second_ports
    assert _read_reports(job.out, "sum")[1] == _read_reports(second_out, "sum")[1] == 3


def test_two_nodes_on_one_host(job):
    script = job.script(STORE_WORKER)
    port = str(_free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-port", port]
    node1 = job.start(*common, "--node-rank", "1", str(script))
    node0 = job.run(*common, "--node-rank", "0", str(script))
    _, node1_err = node1.communicate(timeout=TIMEOUT_S)
    assert node0.returncode == 0, node0.stderr
    assert node1.returncode == 0, node1_err
    sums = _read_reports(job.out, "sum")
    assert sorted(sums) == [0, 1, 2, 3]
    assert all(total == 10 for rank, total in sums.items() if rank != 0)


def test_failure_on_another_node_fails_node_zero(job):
    script = job.script("sys.exit(3 if RANK == 3 else 0)\n")
    port = str(_free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-port", port]
    node0 = job.start(*common, "--node-rank", "0", str(script))
    node1 = job.run(*common, "--node-rank", "1", str(script))
    _, node0_err = node0.communicate(timeout=TIMEOUT_S)
    assert node1.returncode == 3, node1.stderr
    assert "global rank 3 (local rank 1, node rank 1" in node1.stderr
    assert node0.returncode == 1, node0_err
    assert "workers failed on 1 other node(s)" in node0_err


# A job that runs until it is stopped: init over the launcher's store, an all_reduce, a
# report, then all_reduces until one fails (TEST_PHASE=collective), or a long sleep
# (TEST_PHASE=idle: a rank busy with something else than ringtree).
LONG_JOB_WORKER = """
from datetime import timedelta
import numpy as np
import ringtree
ringtree.init_process_group("gloo", timeout=timedelta(seconds=30))
data = np.ones(16, dtype=np.float32)
ringtree.all_reduce(data)
report("ready", True)
while os.environ.get("TEST_PHASE", "collective") == "collective":
    ringtree.all_reduce(data)
    time.sleep(0.01)
time.sleep(60)
"""


def test_launcher_killed_takes_its_workers_with_it(job):
    """SIGKILL leaves the launcher no chance to stop its workers; the kernel does it
    (PR_SET_PDEATHSIG): no worker runs on without its store."""
    launcher = job.start("--nproc-per-node", "2", str(job.script(LONG_JOB_WORKER)))
    _wait_for(lambda: len(_read_reports(job.out, "ready")) == 2, what="both workers ready")
    pids = job.pids()
    launcher.kill()
    launcher.communicate(timeout=TIMEOUT_S)
    _wait_for(lambda: not any(_alive(pid) for pid in pids.values()), timeout=5, what="the workers to die")


@pytest.mark.parametrize("phase", ["collective", "idle"])
def test_lost_store_of_node_zero_stops_the_other_node(job, phase):
    """The launcher of node rank 0 (the store's host) is killed mid-job: its workers die
    with it, and node rank 1's launcher reports the lost store, stops its workers and
    exits with 1 within seconds, whether they notice the loss themselves (in collectives
    with the dead ranks) or not (idle)."""
    job.env["TEST_PHASE"] = phase
    script = job.script(LONG_JOB_WORKER)
    port = str(_free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-port", port]
    node0 = job.start(*common, "--node-rank", "0", str(script))
    node1 = job.start(*common, "--node-rank", "1", str(script))
    _wait_for(lambda: len(_read_reports(job.out, "ready")) == 4, what="four workers ready")
    pids = job.pids()
    node0.kill()
    node0.communicate(timeout=TIMEOUT_S)
    killed = time.monotonic()
    _, node1_err = node1.communicate(timeout=TIMEOUT_S)
    took = time.monotonic() - killed
    assert node1.returncode == 1, node1_err
    assert took < 2 + ringtree_run.GRACE_PERIOD_S, (took, node1_err)
    assert f"127.0.0.1:{port}" in node1_err, node1_err
    if phase == "idle":
        assert f"lost the job's store at 127.0.0.1:{port}, hosted by the launcher of node rank 0" in node1_err
    else:  # the workers fail first, and the report adds the lost store
        assert "no longer answers either" in node1_err or "lost the job's store at" in node1_err, node1_err
    assert not any(_alive(pid) for pid in pids.values())


def test_store_port_in_use_is_reported(job):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = job.run("--master-port", str(port), str(job.script("")))
    assert result.returncode == 1
    assert f"cannot host the store at 127.0.0.1:{port}" in result.stderr
    assert not job.pids()


def test_launcher_imports_nothing_heavy():
    code = (
        "import sys, ringtree.run; from ringtree import TCPStore; "
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_quickstart_example_runs():
    """The README's Quickstart: two ranks, a real all_reduce and broadcast."""
    example = Path(__file__).resolve().parents[2] / "examples" / "python" / "allreduce.py"
    proc = subprocess.run(
        [sys.executable, "-m", "ringtree.run", "--nproc-per-node", "2", str(example)],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    assert lines == [
        "rank 0/2: all_reduce -> [3.0, 3.0, 3.0, 3.0] (expected 3.0 each)",
        "rank 0/2: broadcast from rank 0 -> 42",
        "rank 1/2: all_reduce -> [3.0, 3.0, 3.0, 3.0] (expected 3.0 each)",
        "rank 1/2: broadcast from rank 0 -> 42",
    ], proc.stdout
