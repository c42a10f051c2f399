"""What the benchmarks that start their own rank processes (``failure-table``,
``rendezvous-faults``, ``ddp-step``) share: rank processes that report events as JSON
lines on stdout, the driver's side that reads them until a deadline, and how a table
cell shows an error text or a time."""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import time

from .. import run

__all__ = ["PREFIX", "Ranks", "chosen_faults", "emit", "key_text", "seconds_text"]

PREFIX = "FAULT_EVENT "
# How much of an error text a table shows: the start and, for long texts, the end
# (ringtree puts the call, "[in allreduce(seq=..)]", last).
HEAD_CHARS, TAIL_CHARS = 240, 100


def emit(event: str, **fields) -> None:
    """Rank side: report ``event`` (with ``fields`` and the monotonic time) to the driver."""
    print(PREFIX + json.dumps(dict(fields, event=event, at=time.monotonic())), flush=True)


class Ranks:
    """Driver side: processes started from ``commands`` (one per rank, each in a session
    of its own, stderr discarded), read until ``deadline`` (monotonic seconds)."""

    def __init__(self, commands: list[list[str]], env: dict[str, str], deadline: float) -> None:
        self.procs = [
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True)
            for command in commands
        ]
        self.events: list[dict] = [{} for _ in commands]
        self.deadline = deadline
        self._pending = [b"" for _ in commands]  # bytes read past the last whole line

    def wait_for(self, rank: int, events: tuple[str, ...]) -> dict | None:
        """Reads the rank's reports until one of ``events`` (returned), the end of its
        output or the deadline (None)."""
        fd = self.procs[rank].stdout.fileno()  # read directly: select() cannot see a wrapper's buffer
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while not any(event in self.events[rank] for event in events):
                if b"\n" in self._pending[rank]:
                    line, self._pending[rank] = self._pending[rank].split(b"\n", 1)
                    text = line.decode(errors="replace")
                    if text.startswith(PREFIX):
                        record = json.loads(text[len(PREFIX):])
                        self.events[rank][record["event"]] = record
                    continue
                remaining = self.deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._pending[rank] += chunk
        return next(self.events[rank][event] for event in events if event in self.events[rank])

    def close(self) -> None:
        """Kill every rank (and what it started in its session) and reap it."""
        for proc in self.procs:
            if proc.poll() is None:
                run.signal_process_group(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()


def key_text(message: str) -> str:
    """One line of at most HEAD_CHARS + TAIL_CHARS characters, safe in a table cell."""
    text = " ".join(message.split())
    if len(text) > HEAD_CHARS + TAIL_CHARS + 5:
        text = text[:HEAD_CHARS] + " … " + text[-TAIL_CHARS:]
    return text.replace("|", "\\|")


def seconds_text(seconds: float) -> str:
    """``12.3 ms`` below a second, ``1.23 s`` above."""
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def chosen_faults(parser: argparse.ArgumentParser, text: str, known) -> list[str]:
    """The comma-separated names of ``--faults``; the parser's error for an unknown one."""
    faults = text.split(",")
    unknown = set(faults) - set(known)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    return faults
