"""A multi-host test bed on one machine: simulated hosts, each a network, UTS and mount
namespace with its own hostname, /etc/hosts and address, joined by veth links to a bridge
in a switch namespace, as hosts on one Ethernet segment. Ranks on one simulated host share
memory; ranks on different ones talk TCP, as ringtree's own co-location check decides
(different hostnames, and an abstract Unix socket is not reachable across network
namespaces). Needs root and iproute2 (``ip``, ``tc``) and util-linux's ``unshare``.

    with Testbed(hosts=2, rate="1gbit", mtu=9000) as bed:
        proc = bed.start(0, ["ringtree-run", "--nnodes", "2", ...])
        bed.cut(1)       # the link of host 1 goes down (ip link set down)

Only the addresses assigned here (10.77.0.0/24, inside these namespaces) are used. Each
test bed's namespaces are named ``rtbed<pid>x<n>-...`` after the process that made it. It
tears itself down on exit from the ``with`` block, at interpreter exit, on SIGTERM, and,
for test beds whose creator was killed, when any later test bed comes up: namespaces of a
creator that no longer runs are swept (their processes killed first). Processes started in
a host die with the process that started them (PR_SET_PDEATHSIG).

Also a command line, for trying things by hand::

    python tests/python/testbed.py --hosts 2 --rate 1gbit -- python -c "import socket; print(socket.gethostname())"

runs the command in every host at once and tears the bed down afterwards.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Sequence

__all__ = ["Testbed", "available", "sweep_stale"]

_PREFIX = "rtbed"
_SUBNET = "10.77.0"
_counter = itertools.count()
_live: list[Testbed] = []
_PR_SET_PDEATHSIG = 1


def available() -> str | None:
    """None when a test bed can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _namespaces() -> list[str]:
    listing = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def _delete_namespace(name: str) -> None:
    """Kills what runs in the namespace, then deletes it (its veth ends go with it)."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", name, check=False)


def sweep_stale() -> list[str]:
    """Deletes the namespaces of test beds whose creator no longer runs; returns their names."""
    swept = []
    for name in _namespaces():
        match = re.fullmatch(rf"{_PREFIX}(\d+)x\d+-\w+", name)
        if match is None:
            continue
        creator = int(match.group(1))
        try:
            os.kill(creator, 0)
            continue  # its creator still runs: its own teardown will delete it
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _delete_namespace(name)
        swept.append(name)
    return swept


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class Testbed:
    """``hosts`` simulated hosts named node0, node1, ... at 10.77.0.1, .2, ... .
    ``rate`` (a tc rate, "1gbit") shapes both directions of every host's link with a token
    bucket; ``mtu`` sets the links' MTU (9000 for jumbo frames)."""

    def __init__(self, hosts: int, rate: str | None = None, mtu: int = 1500) -> None:
        if not 1 <= hosts <= 200:
            raise ValueError(f"hosts must be in [1, 200], got {hosts}")
        self.hosts = hosts
        self.rate = rate
        self.mtu = mtu
        self.tag = f"{_PREFIX}{os.getpid()}x{next(_counter)}"
        self._switch = f"{self.tag}-sw"
        self._up = False
        self._dir = tempfile.mkdtemp(prefix=f"{self.tag}-")

    # --- names --------------------------------------------------------------------------

    def namespace(self, host: int) -> str:
        return f"{self.tag}-h{host}"

    def hostname(self, host: int) -> str:
        return f"node{host}"

    def address(self, host: int) -> str:
        return f"{_SUBNET}.{host + 1}"

    # --- life cycle ---------------------------------------------------------------------

    def __enter__(self) -> Testbed:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        """Creates the switch and the hosts (after sweeping stale test beds)."""
        problem = available()
        if problem is not None:
            raise RuntimeError(f"cannot make a test bed: {problem}")
        sweep_stale()
        _live.append(self)
        self._up = True
        try:
            _ip("netns", "add", self._switch)
            _ip("-n", self._switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self._switch, "link", "set", "br0", "mtu", str(self.mtu), "up")
            hosts_file = os.path.join(self._dir, "hosts")
            with open(hosts_file, "w") as f:
                f.write("127.0.0.1 localhost\n::1 localhost\n")
                for host in range(self.hosts):
                    f.write(f"{self.address(host)} {self.hostname(host)}\n")
            for host in range(self.hosts):
                self._add_host(host)
        except BaseException:
            self.down()
            raise

    def _add_host(self, host: int) -> None:
        ns = self.namespace(host)
        outer = f"h{host}"
        _ip("netns", "add", ns)
        # Both ends are created in their namespaces: no name ever exists in the caller's
        # namespace, so concurrent test beds cannot clash.
        _ip("link", "add", "eth0", "netns", ns, "mtu", str(self.mtu), "type", "veth", "peer", "name", outer,
            "netns", self._switch, "mtu", str(self.mtu))
        _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self._switch, "link", "set", outer, "master", "br0", "up")
        if self.rate is not None:
            # Both directions: the host's egress, and the switch port's egress towards it.
            for where, dev in ((ns, "eth0"), (self._switch, outer)):
                subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                                "rate", self.rate, "burst", "256kb", "latency", "50ms"],
                               check=True, capture_output=True, text=True)

    def down(self) -> None:
        """Kills every process in the hosts and deletes every namespace. Idempotent."""
        if not self._up:
            return
        # _up stays set until everything is gone, so that a SIGTERM in the middle of this
        # (whose handler calls down() again) still deletes what is left.
        for host in range(self.hosts):
            _delete_namespace(self.namespace(host))
        _delete_namespace(self._switch)
        shutil.rmtree(self._dir, ignore_errors=True)
        self._up = False
        if self in _live:
            _live.remove(self)

    # --- using it -----------------------------------------------------------------------

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """argv as run in ``host``: in its network namespace, with its own hostname and
        /etc/hosts (a private mount and UTS namespace)."""
        setup = (f'mount --bind "{os.path.join(self._dir, "hosts")}" /etc/hosts && '
                 f'hostname {self.hostname(host)} && exec "$@"')
        return ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "--mount", "--propagation",
                "private", "--", "sh", "-c", setup, "sh", *argv]

    def launch_agent(self) -> str:
        """The path of a remote-shell stand-in for launchers that start their daemons on
        each host with ``ssh HOST COMMAND...`` (Open MPI's ``--mca plm_rsh_agent``): it
        runs COMMAND (a shell command line, as ssh would) in the host named HOST."""
        path = os.path.join(self._dir, "launch_agent")
        if not os.path.exists(path):
            cases = "".join(f'  {self.hostname(h)}) ns={self.namespace(h)} ;;\n' for h in range(self.hosts))
            hosts_file = os.path.join(self._dir, "hosts")
            with open(path, "w") as f:
                f.write("#!/bin/sh\n"
                        "# ssh-like: launch_agent HOST COMMAND... runs COMMAND in the test bed's HOST\n"
                        'host="$1"; shift\n'
                        'case "$host" in\n' + cases +
                        '  *) echo "launch_agent: no host $host in this test bed" >&2; exit 255 ;;\n'
                        "esac\n"
                        'exec ip netns exec "$ns" unshare --uts --mount --propagation private -- sh -c '
                        f'\'mount --bind "{hosts_file}" /etc/hosts && hostname "$0" && exec sh -c "$*"\' '
                        '"$host" "$@"\n')
            os.chmod(path, 0o755)
        return path

    def start(self, host: int, argv: Sequence[str], **popen: object) -> subprocess.Popen:
        """Starts argv in ``host``; it is killed if this process dies."""
        return subprocess.Popen(self.command(host, argv), preexec_fn=_die_with_parent, **popen)  # type: ignore[arg-type]

    def run(self, host: int, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, argv), **kwargs)  # type: ignore[call-overload]

    def cut(self, host: int) -> None:
        """Takes the host's link down: its peers see nothing more from it (no reset)."""
        _ip("-n", self.namespace(host), "link", "set", "eth0", "down")

    def restore(self, host: int) -> None:
        _ip("-n", self.namespace(host), "link", "set", "eth0", "up")


def _down_all() -> None:
    for bed in list(_live):
        bed.down()


atexit.register(_down_all)


def _on_sigterm(signum: int, frame: object) -> None:
    _down_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# A SIGTERM (a CI job's timeout) tears the test beds down too, unless someone else
# handles SIGTERM already.
if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # imported outside the main thread
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a command in every host of a test bed.")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--rate", help="tc rate of every link, e.g. 1gbit")
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is needed")
    with Testbed(args.hosts, args.rate, args.mtu) as bed:
        procs = [bed.start(host, command) for host in range(args.hosts)]
        return max(proc.wait() for proc in procs)


if __name__ == "__main__":
    sys.exit(main())
