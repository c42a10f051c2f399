"""Runs torch's own backend test suite (``DistributedTest`` from the torch wheel's
``torch/testing/_internal/distributed/distributed_test.py``) with every process group on
ringtree, the way torch's ``test/distributed/test_distributed_spawn.py`` runs it for gloo.

The suite decides at import time, by the name in ``BACKEND``, which tests apply and what
they expect (timeouts, complex dtypes, sparse tensors, ...). Most tests are written for
"gloo", "nccl", "mpi" or "ucc" by name, so this harness imports it as for gloo and then
creates every group torch asks for with backend "gloo" (the world, ``new_group``,
``new_subgroups``) on backend "ringtree" instead, checking that each one it hands back is
ringtree's. torch's bookkeeping records the name "ringtree" (``get_backend()`` says so),
so a test that asserts the name "gloo" or that torch serves to gloo alone fails as it
would for any other backend; ``tests/peer_suite/README.md`` lists them.

Usage::

    python tests/peer_suite/run_peer_suite.py                  # the whole suite (~15 min)
    python tests/peer_suite/run_peer_suite.py -k all_reduce -k barrier
    python tests/peer_suite/run_peer_suite.py --exact -k test_barrier -k test_send_recv
    WORLD_SIZE=3 python tests/peer_suite/run_peer_suite.py --json results.json

Each test runs in ``world_size`` fresh processes (torch's ``MultiProcessTestCase``),
spawned as torch's runs do, or forked from this one with ``--fork`` (no torch import per
process: seconds a test faster; what ``tests/python/test_peer_suite.py`` uses). The
report has one line per test (PASS/FAIL/SKIP and seconds), the counts, and the tests gloo
passes on this suite (``gloo_passes.txt``) that ringtree did not. Exit status 1 when any
selected test failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import unittest
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _configure_environment(world_size: int) -> None:
    """What ``test_distributed_spawn.py`` sets before importing the suite (a ``WORLD_SIZE``
    already set wins). Spawned child processes inherit this environment and import this
    module again; forked ones (--fork) inherit all of it."""
    os.environ.setdefault("BACKEND", "gloo")
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="ringtree-peer-suite-"))


def _route_gloo_groups_to_ringtree() -> None:
    """Makes torch create backend "ringtree" wherever it is asked for backend "gloo",
    by wrapping the one function that creates every process group."""
    import torch.distributed.distributed_c10d as c10d

    import ringtree.torch_backend as ringtree_torch
    from ringtree.torch_backend.process_group import RingtreeProcessGroup

    ringtree_torch.register()
    if getattr(c10d._new_process_group_helper, "_ringtree_route", False):
        return
    create_group = c10d._new_process_group_helper

    def create_on_ringtree(group_size, group_rank, global_ranks, backend, *args, **kwargs):
        if str(backend).lower() in ("gloo", "cpu:gloo"):
            backend = ringtree_torch.BACKEND_NAME
        group, store = create_group(group_size, group_rank, global_ranks, backend, *args, **kwargs)
        if group is not c10d.GroupMember.NON_GROUP_MEMBER and not isinstance(group, RingtreeProcessGroup):
            raise AssertionError(f"the harness expected a ringtree group, torch made {type(group).__name__}")
        return group, store

    create_on_ringtree._ringtree_route = True
    c10d._new_process_group_helper = create_on_ringtree


_configure_environment(2)
_route_gloo_groups_to_ringtree()

import torch  # noqa: E402 - the suite reads the environment above when imported
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """torch's test class, defined as ``test_distributed_spawn.py`` defines it (at module
    level: the spawned processes find it by name)."""

    start_method = "spawn"  # main(--fork) switches to fork

    def setUp(self):
        super().setUp()
        if self.start_method == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


class _Recorder(unittest.TextTestResult):
    """Keeps each test's outcome and duration and prints one line per test."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict] = {}
        self._started = 0.0

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, detail=""):
        name = test.id().rsplit(".", 1)[-1]
        seconds = time.monotonic() - self._started
        self.outcomes[name] = {"outcome": outcome, "seconds": round(seconds, 2), "detail": detail}
        line = f"{outcome:4} {name} ({seconds:.1f} s)"
        if outcome != "PASS" and detail:
            line += f": {detail.strip().splitlines()[-1][:200]}"
        print(line, flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "PASS")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "FAIL", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "FAIL", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "SKIP", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "PASS", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "FAIL", "unexpected success")


def _selected(names: list[str], patterns: list[str], exact: bool, listed: list[str]) -> list[str]:
    chosen = [n for n in names if not patterns or any(p == n if exact else p in n for p in patterns)]
    if listed:
        wanted = set(listed)
        chosen = [n for n in chosen if n in wanted]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", dest="patterns", action="append", default=[],
                        help="run the tests whose name contains this (repeatable)")
    parser.add_argument("--exact", action="store_true", help="-k names whole tests, not parts of names")
    parser.add_argument("--only-gloo-passes", action="store_true",
                        help="run only the tests gloo passes (gloo_passes.txt)")
    parser.add_argument("--json", type=Path, help="write every outcome to this file")
    parser.add_argument("--fork", action="store_true",
                        help="fork each test's ranks from this process instead of spawning them (no torch import per "
                             "rank and test: faster; the suite's own runs spawn)")
    args = parser.parse_args(argv)

    from torch.testing._internal import common_utils

    saved_argv, sys.argv = sys.argv, sys.argv[:1]
    common_utils.parse_cmd_line_args()
    sys.argv = saved_argv

    suite_class = TestDistBackendWithSpawn
    if args.fork:
        suite_class.start_method = "fork"
    gloo_passes = (_HERE / "gloo_passes.txt").read_text().split()
    names = unittest.TestLoader().getTestCaseNames(suite_class)
    chosen = _selected(list(names), args.patterns, args.exact, gloo_passes if args.only_gloo_passes else [])
    if not chosen:
        print("no test matches", file=sys.stderr)
        return 2

    runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=0, stream=open(os.devnull, "w"))
    result = runner.run(unittest.TestSuite(suite_class(name) for name in chosen))
    outcomes = result.outcomes

    counts = {kind: sum(1 for o in outcomes.values() if o["outcome"] == kind) for kind in ("PASS", "FAIL", "SKIP")}
    print(f"\nringtree, world size {os.environ['WORLD_SIZE']}: {len(outcomes)} tests, "
          f"{counts['PASS']} pass, {counts['FAIL']} fail, {counts['SKIP']} skip")
    gloo_selected = [n for n in chosen if n in set(gloo_passes)]
    missed = [n for n in gloo_selected if outcomes.get(n, {}).get("outcome") != "PASS"]
    print(f"of the {len(gloo_selected)} selected tests gloo passes, ringtree passes "
          f"{len(gloo_selected) - len(missed)}" + (": not " + ", ".join(missed) if missed else ""))
    if args.json:
        args.json.write_text(json.dumps(outcomes, indent=1, sort_keys=True))
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
