"""``ringtree-run``: start the worker processes of a ringtree job on one node.

Usage mirrors ``torchrun`` (``torch.distributed.run``) with a static rendezvous::

    ringtree-run --nproc-per-node 4 train.py --lr 0.1
    ringtree-run --standalone --nproc-per-node auto -m my_package.train
    ringtree-run --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 train.py

On node rank 0 the launcher hosts the job's key-value store itself (a ``ringtree.TCPStore``
server on ``--master-port``, or on a port the kernel picks when none is given, so there is
no "find a free port" race). Every worker, rank 0 included, is a client of that store:
``RINGTREE_USE_AGENT_STORE=1`` tells ringtree's ``env://`` rendezvous so, and
``TORCHELASTIC_USE_AGENT_STORE=True`` tells torch's (as under torchrun): the store speaks
torch's TCPStore protocol too, so a program that calls torch's own ``init_process_group``
(any backend) runs under ``ringtree-run`` unchanged. The store lives
until every local worker has exited, so no rank loses it because rank 0 finished first.
Launchers on other nodes host nothing and need ``--master-addr``/``--master-port``; when
their workers are done (successfully or not) they report it through the store, and the
launcher on node rank 0, once its own workers have succeeded, keeps the store up until
every node has reported (at most 5 minutes), then exits with 1 if a node reported failure.

Each worker gets a copy of the launcher's environment plus ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``ROLE_NAME``,
``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``RINGTREE_USE_AGENT_STORE=1``, ``TORCHELASTIC_USE_AGENT_STORE=True``,
``TORCHELASTIC_RESTART_COUNT=0``, and ``OMP_NUM_THREADS=1`` and ``PYTHONUNBUFFERED=1``
unless already set. The global rank is ``node_rank * nproc_per_node + local_rank``.

Workers run in their own process groups. Their stdout and stderr are pipes the launcher
reads and writes through to its own stdout and stderr in whole lines, so the lines of
several workers never mix (whatever their buffering); the last lines of each worker's
stderr are kept for the failure report. When a worker fails (non-zero exit or killed by a
signal) the others get half a second to exit on their own (to notice the failure and tell
their peers, on other hosts too, which rank caused it), then SIGTERM, then SIGKILL after a
grace period; the launcher reports
the first failure (rank, pid, exit code or signal, stderr tail) and exits with that
worker's exit code (1 when it was killed by a signal). SIGINT, SIGTERM, SIGHUP and
SIGQUIT sent to the launcher are forwarded to every worker (SIGKILL follows after the
grace period, or at once on a second signal) and the launcher exits with 128 + the signal
number. Processes a worker leaves behind in its process group are killed when the job
ends. A launcher killed with SIGKILL takes its workers with it (the kernel sends them
SIGKILL: ``PR_SET_PDEATHSIG``), so none runs on without its store; processes the workers
started themselves are not covered. A launcher on node rank > 0 checks every second that
the job's store still answers; when it stops answering (node rank 0's launcher died, or
its host is unreachable: no answer within 5 s) it says so, stops its workers and exits
with 1.

Other programs that start jobs (the benchmarks of ``ringtree.bench``) use :func:`command`,
:data:`GRACE_PERIOD_S`, :func:`signal_process_group` and :func:`describe_status`.

This module imports only the standard library at start; ``ringtree.TCPStore`` is imported
when the store is created. Nothing heavy (torch, numpy) is loaded.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time

__all__ = ["GRACE_PERIOD_S", "command", "describe_status", "main", "signal_process_group"]

# Signals the launcher forwards to its workers (torchrun's default set).
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
#: Seconds workers get to exit after SIGTERM (or a forwarded signal) before SIGKILL.
GRACE_PERIOD_S = 3.0
# Upper bound on one wait of the monitor loop; exits and signals wake it earlier.
_MONITOR_WAKE_S = 1.0
#: Seconds the other workers get to exit on their own after one failed, before SIGTERM: a
#: rank on this host notices a dead local peer within ~50 ms and sends its peers on other
#: hosts a notice naming it; a SIGTERM before that leaves them naming only this rank.
_FAILURE_SETTLE_S = 0.5
# Seconds to wait for a worker's output pipes to reach end of file after the worker
# exited (a process that escaped the worker's process group may hold them open).
_DRAIN_S = 1.0
# Lines of a failed worker's stderr shown in the failure report.
_TAIL_LINES = 40
# A line without newline is written through once it is this long.
_MAX_PARTIAL_LINE = 65536
_READ_CHUNK = 65536
_PROG = "ringtree-run"
# Multi-node jobs: the launcher on node rank 0 keeps the store up until the launchers of
# the other nodes have reported the end of their workers (torchrun's exit barrier), for at
# most this long, polling every _EXIT_POLL_S.
_EXIT_BARRIER_TIMEOUT_S = 300.0
_EXIT_POLL_S = 0.05
# Seconds a launcher on node rank > 0 tries to reach the store to report its end.
_CHECK_OUT_TIMEOUT_S = 10.0
# A launcher on node rank > 0 checks every wake of its monitor loop that the job's store
# still answers; a check that gets no answer within this long counts as the store lost.
_STORE_CHECK_TIMEOUT_S = 5.0
# prctl(2) option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1
_EXITED_KEY = "ringtree-run/nodes_exited"
_FAILED_KEY = "ringtree-run/nodes_failed"
# Set by node rank 0 before it closes the store on purpose (the exit barrier timed out):
# the other nodes' watch then does not count the store as lost. It waits this long after
# setting it, so that every watch (one check a second) sees it.
_CLOSING_KEY = "ringtree-run/store_closing"
_CLOSING_NOTICE_S = 2 * _MONITOR_WAKE_S + 0.5


def _nproc_per_node(value: str) -> int:
    """Parse ``--nproc-per-node``: a positive int, or ``auto``/``cpu`` for the CPU count."""
    if value in ("auto", "cpu"):
        return os.cpu_count() or 1
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer, 'auto' or 'cpu', got {value!r}"
        ) from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {count}")
    return count


def _nnodes(value: str) -> int:
    """Parse ``--nnodes``: ``N`` or torchrun's ``N:N`` (elastic ranges are not supported)."""
    low, sep, high = value.partition(":")
    try:
        count = int(low)
        if sep and int(high) != count:
            raise argparse.ArgumentTypeError(
                f"elastic node ranges are not supported, got {value!r}; give one number"
            )
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {count}")
    return count


def _port(value: str) -> int:
    """Parse ``--master-port``: 0 (the kernel picks one, node rank 0 only) to 65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {port}")
    return port


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Start the worker processes of a ringtree job on this node "
        "(torchrun-compatible flags, static rendezvous).",
    )
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=_nproc_per_node,
        default=1,
        metavar="N",
        help="workers on this node: an integer, or 'auto'/'cpu' for the CPU count (default 1)",
    )
    parser.add_argument(
        "--nnodes",
        type=_nnodes,
        default=1,
        metavar="N",
        help="number of nodes (default 1); torchrun's 'N:N' form is accepted",
    )
    parser.add_argument(
        "--node-rank",
        "--node_rank",
        type=int,
        default=0,
        metavar="RANK",
        help="rank of this node, 0..nnodes-1 (default 0)",
    )
    parser.add_argument(
        "--master-addr",
        "--master_addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address of node rank 0, where the store is hosted (default 127.0.0.1)",
    )
    parser.add_argument(
        "--master-port",
        "--master_port",
        type=_port,
        default=None,
        metavar="PORT",
        help="port of the store on node rank 0; omitted: the kernel picks a free one "
        "(required when --nnodes > 1)",
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="single-node job: nnodes=1, node rank 0, store on 127.0.0.1 at a picked port "
        "(overrides --nnodes, --node-rank, --master-addr and --master-port)",
    )
    parser.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="run the training script as a module, like 'python -m'",
    )
    parser.add_argument(
        "--no-python",
        "--no_python",
        action="store_true",
        help="run the training script as a program, not through the Python interpreter",
    )
    parser.add_argument(
        "training_script",
        help="the script (or module with -m, or program with --no-python) each worker runs",
    )
    parser.add_argument(
        "training_script_args",
        nargs=argparse.REMAINDER,
        help="arguments passed to the training script",
    )
    return parser


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and check the command line; argparse exits with status 2 on bad arguments."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.no_python and args.module:
        parser.error("--no-python and --module cannot be used together")
    if args.standalone:
        args.nnodes = 1
        args.node_rank = 0
        args.master_addr = "127.0.0.1"
        args.master_port = None
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank must be in 0..{args.nnodes - 1}, got {args.node_rank}")
    if args.nnodes > 1 and not args.master_port:
        parser.error("--master-port (non-zero) is required when --nnodes > 1")
    return args


def command(nproc_per_node: int, program: list[str], module: bool = False) -> list[str]:
    """The command line that runs ``program`` (a script and its arguments; with ``module``,
    a module and its arguments, as ``python -m`` takes them) as ``nproc_per_node`` workers
    of a one-node job, through this launcher under the current interpreter."""
    flags = ["--nproc-per-node", str(nproc_per_node), *(["-m"] if module else [])]
    return [sys.executable, "-m", "ringtree.run", *flags, *program]


def _worker_command(args: argparse.Namespace) -> list[str]:
    """The command line every worker runs."""
    if args.no_python:
        return [args.training_script, *args.training_script_args]
    interpreter = [sys.executable, "-m"] if args.module else [sys.executable]
    return [*interpreter, args.training_script, *args.training_script_args]


def _worker_env(args: argparse.Namespace, local_rank: int, master_port: int) -> dict[str, str]:
    """The environment of the worker of ``local_rank``: the launcher's plus the job's."""
    nproc = args.nproc_per_node
    rank = args.node_rank * nproc + local_rank
    world_size = args.nnodes * nproc
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK=str(args.node_rank),
        GROUP_WORLD_SIZE=str(args.nnodes),
        ROLE_NAME="default",
        ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(world_size),
        MASTER_ADDR=args.master_addr,
        MASTER_PORT=str(master_port),
        RINGTREE_USE_AGENT_STORE="1",
        # What torchrun sets: torch's env:// then connects to the launcher's store (which
        # also speaks torch's TCPStore protocol) instead of binding MASTER_PORT itself.
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="0",
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    # The launcher forwards whole lines, so unbuffered output shows at once without mixing.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _die_with_launcher():
    """A ``preexec_fn`` that has the worker killed (SIGKILL) when the launcher dies, so a
    launcher killed with SIGKILL leaves no orphaned workers behind; None where prctl is
    unavailable. Everything it calls is resolved here, before the fork."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    launcher = os.getpid()
    sigkill = int(signal.SIGKILL)
    getppid, exit_now = os.getppid, os._exit

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if getppid() != launcher:  # the launcher died before prctl took effect
            exit_now(1)

    return preexec


class _StoreWatch:
    """Node rank > 0: whether the job's store, hosted by the launcher of node rank 0, still
    answers. Connects on the first check that finds the store up (node rank 0 may start
    later); from then on each check is one round trip, bounded by _STORE_CHECK_TIMEOUT_S."""

    def __init__(self, host: str, port: int) -> None:
        self.address = f"{host}:{port}"
        self._host = host
        self._port = port
        self._store = None
        self._closing = False  # node rank 0 announced that it closes the store

    def lost(self) -> str | None:
        """None while the store answers (or was never reached, or node rank 0 closes it on
        purpose); once it stops answering, why (the error of the failed check)."""
        if self._closing:
            return None
        from datetime import timedelta

        from ringtree import TCPStore

        if self._store is None:
            try:
                self._store = TCPStore(self._host, self._port, timeout=timedelta(seconds=0.2))
                self._store.set_timeout(timedelta(seconds=_STORE_CHECK_TIMEOUT_S))
            except (OSError, RuntimeError):
                return None  # not up yet: the workers' own rendezvous reports that
        try:
            self._closing = self._store.check([_CLOSING_KEY])
        except (OSError, RuntimeError) as exc:
            return str(exc)
        return None


def _stream_writer(stream):
    """Return a function writing bytes to ``stream`` at once (its buffer when it has one)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:

        def write(data: bytes) -> None:
            buffer.write(data)
            buffer.flush()

    else:

        def write(data: bytes) -> None:
            stream.write(data.decode(errors="replace"))
            stream.flush()

    return write


def describe_status(status: int) -> str:
    """Describe a ``Popen.returncode``-style status: >= 0 exit code, < 0 signal number."""
    if status >= 0:
        return f"exit code {status}"
    try:
        return f"killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"killed by signal {-status}"


class _LineForwarder(threading.Thread):
    """Reads one output pipe of a worker until end of file and writes it through to the
    launcher's stream in whole lines, so the lines of several workers never mix, whatever
    the workers' buffering. A line longer than _MAX_PARTIAL_LINE is written in pieces; an
    unfinished last line is written at end of file, with a newline so that no other output
    joins it. Keeps the last lines for the failure report. Write errors (closed stream)
    stop the write-through but not the reading, so the worker never blocks on a full pipe."""

    def __init__(self, pipe, write) -> None:
        super().__init__(daemon=True)
        self._pipe = pipe
        self._write = write
        self._lock = threading.Lock()
        self._lines: collections.deque[bytes] = collections.deque(maxlen=_TAIL_LINES)
        self._partial = b""

    def _forward(self, data: bytes) -> None:
        if self._write is not None and data:
            try:
                self._write(data)
            except (OSError, ValueError):
                self._write = None

    def run(self) -> None:
        fd = self._pipe.fileno()
        while True:
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                break
            data = self._partial + chunk
            end = data.rfind(b"\n") + 1
            if end == 0 and len(data) >= _MAX_PARTIAL_LINE:
                end = len(data)
            self._forward(data[:end])
            with self._lock:
                self._lines.extend(data[:end].splitlines())
                self._partial = data[end:]
        if self._partial:
            self._forward(self._partial + b"\n")
        self._pipe.close()

    def tail(self) -> list[str]:
        """The last lines read so far (the unfinished last line included), decoded."""
        with self._lock:
            lines = list(self._lines)
            if self._partial:
                lines.append(self._partial)
        lines = lines[-_TAIL_LINES:]
        return [line.decode(errors="replace").rstrip("\r") for line in lines]


class _Worker:
    """One worker process, the leader of its own process group (pgid == pid)."""

    def __init__(self, rank: int, local_rank: int, proc: subprocess.Popen) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.proc = proc
        self.stdout = _LineForwarder(proc.stdout, _stream_writer(sys.stdout))
        self.stderr = _LineForwarder(proc.stderr, _stream_writer(sys.stderr))
        self.stdout.start()
        self.stderr.start()
        # Popen.returncode convention (negative: killed by that signal); None while running.
        self.status: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> bool:
        """Whether the worker has exited; does not block. The process is left a zombie
        (not reaped) so that its pid, and hence its process group id, cannot be reused
        before ``reap``."""
        if self.status is None:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                exited = info.si_code == os.CLD_EXITED
                self.status = info.si_status if exited else -info.si_status
        return self.status is not None

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to every process of the worker's process group."""
        signal_process_group(self.pid, signum)

    def reap(self) -> None:
        """Kill whatever is left of the process group, then reap the worker; blocks until
        it is gone. Does nothing once the worker has been reaped (its pid may be reused)."""
        if self.proc.returncode is not None:
            return
        self.signal_group(signal.SIGKILL)
        self.proc.wait()
        if self.status is None:
            self.status = self.proc.returncode


class _Launcher:
    """Runs one node's share of a job. Must be used from the main thread: it installs
    signal handlers (restored afterwards)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._workers: list[_Worker] = []
        self._signals: list[int] = []
        self._wake_r = -1
        # Node rank > 0: why the job's store stopped answering, once it has.
        self._store_lost: str | None = None

    def run(self) -> int:
        """Host the store (node rank 0), start the workers, supervise them until they have
        all exited or been stopped, and return the launcher's exit code."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        self._wake_r = wake_r
        previous_handlers = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (*_FORWARDED_SIGNALS, signal.SIGCHLD)
        }
        previous_wakeup_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            return self._run()
        finally:
            signal.set_wakeup_fd(previous_wakeup_fd)
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            os.close(wake_r)
            os.close(wake_w)

    def _on_signal(self, signum: int, frame) -> None:
        if signum != signal.SIGCHLD:
            self._signals.append(signum)

    def _run(self) -> int:
        """``run`` once the signal handlers are in place."""
        args = self._args
        store = None
        master_port = args.master_port
        if args.node_rank == 0:
            from ringtree import TCPStore

            try:
                store = TCPStore(
                    args.master_addr,
                    args.master_port or 0,
                    world_size=None,
                    is_master=True,
                    wait_for_workers=False,
                )
            except (OSError, RuntimeError) as exc:
                _print(
                    f"cannot host the store at {args.master_addr}:{args.master_port or 0}: {exc}"
                )
                return 1
            master_port = store.port
        try:
            code = self._supervise(master_port)
        finally:
            # Every worker is dead and reaped before the store (a local) goes away.
            for worker in self._workers:
                worker.reap()
            drain_deadline = time.monotonic() + _DRAIN_S
            for worker in self._workers:
                for forwarder in (worker.stdout, worker.stderr):
                    forwarder.join(max(0.0, drain_deadline - time.monotonic()))
        if args.nnodes == 1 or self._signals:
            return code
        if store is None:
            if self._store_lost is None:
                self._check_out(master_port, code)
            return code
        return self._wait_for_other_nodes(store) if code == 0 else code

    def _supervise(self, master_port: int) -> int:
        """Start the workers, then block until they have all exited, one of them failed or
        a signal arrived; stop the rest in the last two cases. Returns the exit code."""
        args = self._args
        worker_command = _worker_command(args)
        die_with_launcher = _die_with_launcher()
        for local_rank in range(args.nproc_per_node):
            if self._signals:
                break
            try:
                proc = subprocess.Popen(
                    worker_command,
                    env=_worker_env(args, local_rank, master_port),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=die_with_launcher,
                )
            except OSError as exc:
                _print(f"cannot start local rank {local_rank} ({worker_command[0]}): {exc}")
                self._stop(signal.SIGTERM)
                return 1
            rank = args.node_rank * args.nproc_per_node + local_rank
            self._workers.append(_Worker(rank, local_rank, proc))

        watch = _StoreWatch(args.master_addr, master_port) if args.node_rank > 0 else None
        failures: list[_Worker] = []
        while not self._signals:
            failures = [w for w in self._workers if w.exited() and w.status != 0]
            if failures or all(w.status is not None for w in self._workers):
                break
            self._store_lost = watch.lost() if watch is not None else None
            if self._store_lost is not None:
                break
            self._wait(_MONITOR_WAKE_S)

        if self._signals:
            signum = self._signals[0]
            running = sum(w.status is None for w in self._workers)
            _print(f"received {signal.Signals(signum).name}; stopping {running} worker(s)")
            self._stop(signum)
            return 128 + signum
        if self._store_lost is not None:
            running = sum(not w.exited() for w in self._workers)
            _print(
                f"lost the job's store at {watch.address}, hosted by the launcher of node rank 0 "
                f"({self._store_lost}): that launcher has exited or its host is unreachable; stopping "
                f"this node's {running} worker(s)"
            )
            self._stop(signal.SIGTERM)
            return 1
        if failures:
            self._settle(_FAILURE_SETTLE_S)
            self._stop(signal.SIGTERM)
            # Workers of this node often fail because node rank 0 went away with its
            # launcher: say so when the store is gone too.
            self._store_lost = watch.lost() if watch is not None else None
            self._report(failures, self._store_lost and f"{watch.address} ({self._store_lost})")
            status = failures[0].status
            return status if status > 0 else 1
        return 0

    def _check_out(self, master_port: int, code: int) -> None:
        """Node rank > 0: report the end of this node's workers (and a failure) through
        the store; blocks up to _CHECK_OUT_TIMEOUT_S. Errors are printed, not raised."""
        from datetime import timedelta

        from ringtree import TCPStore

        address = f"{self._args.master_addr}:{master_port}"
        try:
            store = TCPStore(
                self._args.master_addr,
                master_port,
                timeout=timedelta(seconds=_CHECK_OUT_TIMEOUT_S),
            )
            if code != 0:
                store.add(_FAILED_KEY, 1)
            store.add(_EXITED_KEY, 1)
        except (OSError, RuntimeError) as exc:
            _print(f"could not report this node's end to the store at {address}: {exc}")

    def _wait_for_other_nodes(self, store) -> int:
        """Node rank 0, after its workers succeeded: keep the store up until every other
        node has reported its end (at most _EXIT_BARRIER_TIMEOUT_S; a signal ends the
        wait). Returns the launcher's exit code: 1 if another node reported a failure."""
        others = self._args.nnodes - 1
        deadline = time.monotonic() + _EXIT_BARRIER_TIMEOUT_S
        while store.add(_EXITED_KEY, 0) < others:
            if self._signals:
                signum = self._signals[0]
                _print(f"received {signal.Signals(signum).name} while waiting for other nodes")
                return 128 + signum
            if time.monotonic() > deadline:
                _print(
                    f"{others - store.add(_EXITED_KEY, 0)} other node(s) did not report their "
                    f"end within {_EXIT_BARRIER_TIMEOUT_S:.0f} s; closing the store"
                )
                store.set(_CLOSING_KEY, b"1")
                self._wait(_CLOSING_NOTICE_S)
                return 0
            self._wait(_EXIT_POLL_S)
        failed = store.add(_FAILED_KEY, 0)
        if failed:
            _print(f"workers failed on {failed} other node(s); see their launchers' reports")
            return 1
        return 0

    def _wait(self, timeout: float) -> None:
        """Block until a signal arrives (a child's exit included) or ``timeout`` passes."""
        select.select([self._wake_r], [], [], timeout)
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _settle(self, seconds: float) -> None:
        """Waits up to ``seconds`` (less if a signal arrives) for the running workers to
        exit on their own."""
        deadline = time.monotonic() + seconds
        while not self._signals and any(not w.exited() for w in self._workers):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wait(min(left, 0.05))

    def _stop(self, signum: int) -> None:
        """Send ``signum`` to the running workers, wait up to the grace period for them to
        exit (less if another signal arrives), then SIGKILL what is left and reap all."""
        running = [w for w in self._workers if not w.exited()]
        for worker in running:
            worker.signal_group(signum)
        deadline = time.monotonic() + GRACE_PERIOD_S
        signals_seen = len(self._signals)
        while running and len(self._signals) == signals_seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wait(remaining)
            running = [w for w in running if not w.exited()]
        for worker in self._workers:
            worker.reap()

    def _report(self, failures: list[_Worker], store_lost: str | None = None) -> None:
        """Print the failure report: the first failed worker (its stderr tail) and the
        others; ``store_lost``, when given, says the job's store is lost too."""
        first = failures[0]
        host = os.uname().nodename
        lines = [
            "=" * 72,
            f"{_PROG}: worker failed (root cause: first observed failure)",
            f"  global rank {first.rank} (local rank {first.local_rank}, node rank "
            f"{self._args.node_rank}, host {host}, pid {first.pid}): "
            f"{describe_status(first.status)}",
        ]
        for other in failures[1:]:
            lines.append(
                f"  also failed: global rank {other.rank} (local rank {other.local_rank}, "
                f"pid {other.pid}): {describe_status(other.status)}"
            )
        first.stderr.join(_DRAIN_S)
        tail = first.stderr.tail()
        if tail:
            lines.append(f"  last {len(tail)} line(s) of global rank {first.rank}'s stderr:")
            lines.extend(f"    {line}" for line in tail)
        else:
            lines.append(f"  global rank {first.rank} wrote nothing to stderr")
        if store_lost:
            lines.append(
                f"  the job's store at {store_lost} no longer answers either: the launcher of node "
                f"rank 0 has exited (its workers with it) or its host is unreachable"
            )
        lines.append("=" * 72)
        _print("\n".join(lines), prefix=False)


def signal_process_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to every process of the process group ``pgid`` (the group of a
    process started with ``start_new_session=True`` has its pid); nothing if it is gone."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _print(message: str, prefix: bool = True) -> None:
    print(f"{_PROG}: {message}" if prefix else message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run ``ringtree-run`` with ``argv`` (default ``sys.argv[1:]``) and return its exit code.

    Blocks until every worker of this node has exited. Returns 0 when all succeeded, the
    first failed worker's exit code (1 if a signal killed it), 128 + signum when the
    launcher was stopped by a signal, and 1 when the store or a worker cannot be started.
    Raises SystemExit(2) on bad arguments. Must be called from the main thread.
    """
    return _Launcher(_parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
