"""Merges the flight records of every rank and says where the ranks diverged.

Usage: ``python -m ringtree.flight_recorder DIR`` (or ``ringtree-flight-recorder DIR``),
where DIR holds the JSON files the ranks wrote (``RINGTREE_FLIGHT_RECORDER_DIR``, or
``dump_flight_recorder(path=...)``). For each group it prints, per sequence number, the
call and which ranks entered it, completed it, failed in it or did not enter it; runs
of calls that every rank completed alike are folded into one line. The first sequence
number where the ranks diverge is marked, and so is every mismatch (ranks that made
different calls, or the same call with a different dtype, count, op or root, at one
sequence number).

Exit status: 0 when the ranks agree, 1 when they diverge, 2 when DIR holds no flight
record.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "ringtree-flight-recorder"
FIRST_DIVERGENCE = "<== first divergence"


@dataclass
class RankRecord:
    """One rank's file for one group."""

    path: Path
    rank: int  # global rank
    group_rank: int
    group_size: int
    world: bool
    calls: int  # calls started since the communicator was created
    entries: dict[int, dict[str, Any]]  # by sequence number

    def first_recorded(self) -> int:
        """The oldest sequence number this rank still recorded (calls before it are gone)."""
        return min(self.entries) if self.entries else self.calls + 1

    def last_started(self) -> int:
        return max(self.entries) if self.entries else 0


@dataclass
class Group:
    name: str
    records: list[RankRecord] = field(default_factory=list)


def _signature(entry: dict[str, Any]) -> str:
    """The call without its sequence number: what must be equal on every rank."""
    return re.sub(r"seq=\d+(, )?", "", entry["description"])


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks) if ranks else "-"


def load(directory: Path) -> tuple[dict[str, Group], list[str]]:
    """The flight records under ``directory`` by group name, and notes about files that
    are not flight records."""
    groups: dict[str, Group] = {}
    notes = []
    for path in sorted(directory.glob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            notes.append(f"skipped {path.name}: {exc}")
            continue
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            notes.append(f"skipped {path.name}: not a ringtree flight record")
            continue
        record = RankRecord(
            path=path,
            rank=document["rank"],
            group_rank=document["group_rank"],
            group_size=document["group_size"],
            world=document["world"],
            calls=document["calls"],
            entries={entry["seq"]: entry for entry in document["entries"]},
        )
        groups.setdefault(document["group"], Group(document["group"])).records.append(record)
    for group in groups.values():
        group.records.sort(key=lambda r: r.group_rank)
    return groups, notes


def _describe_sequence(group: Group, seq: int) -> tuple[bool, list[str]]:
    """Whether every rank completed the same call at ``seq``, and the lines that say
    otherwise (empty when it did)."""
    entered: dict[int, dict[str, Any]] = {}
    absent, unknown = [], []
    for record in group.records:
        entry = record.entries.get(seq)
        if entry is not None:
            entered[record.rank] = entry
        elif seq < record.first_recorded() and record.calls >= seq:
            unknown.append(record.rank)
        else:
            absent.append(record.rank)
    by_call: dict[str, list[int]] = {}
    for rank, entry in entered.items():
        by_call.setdefault(_signature(entry), []).append(rank)
    states: dict[str, list[int]] = {"completed": [], "failed": [], "started": []}
    for rank, entry in entered.items():
        states[entry["state"]].append(rank)
    agreed = not absent and not unknown and len(by_call) == 1 and len(states["completed"]) == len(group.records)
    if agreed:
        return True, []
    lines = []
    if len(by_call) > 1:
        calls = "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)} called {entered[ranks[0]]['description']}"
            for ranks in by_call.values()
        )
        lines.append(f"MISMATCH: {calls}")
    else:
        lines.append(next(iter(entered.values()))["description"] if entered else "(no rank entered it)")
    parts = [f"entered: {_ranks(sorted(entered))}"]
    for state in ("completed", "failed", "started"):
        if states[state]:
            parts.append(f"{'still in it' if state == 'started' else state}: {_ranks(sorted(states[state]))}")
    if absent:
        parts.append(f"did not enter: {_ranks(absent)}")
    if unknown:
        parts.append(f"no longer recorded: {_ranks(unknown)}")
    lines.append("   ".join(parts))
    return False, lines


def _agreed_run(group: Group, run: list[int]) -> str:
    """The line for consecutive sequence numbers that every rank completed alike."""
    label = f"seq {run[0]}" if len(run) == 1 else f"seq {run[0]}-{run[-1]}"
    last = group.records[0].entries[run[-1]]["description"]
    return f"  {label:<14}completed alike on every rank (last: {last})"


def _report_group(name: str, group: Group) -> tuple[list[str], bool]:
    """The report of one group, and whether its ranks diverged."""
    size = group.records[0].group_size
    kind = "world" if group.records[0].world else "group"
    files = ", ".join(r.path.name for r in group.records)
    out = [f"{kind} {name!r} ({size} ranks; files: {files})"]
    missing = sorted(set(range(size)) - {r.group_rank for r in group.records})
    if missing:
        out.append(f"  no flight record from group rank{'s' if len(missing) > 1 else ''} {_ranks(missing)}")
    for record in group.records:
        if record.calls > len(record.entries):
            out.append(f"  rank {record.rank} kept only its last {len(record.entries)} of {record.calls} calls")
    first_divergence = None
    run: list[int] = []  # consecutive sequence numbers every rank completed alike
    for seq in sorted(set().union(*(r.entries for r in group.records))):
        agreed, lines = _describe_sequence(group, seq)
        if agreed:
            run.append(seq)
            continue
        if run:
            out.append(_agreed_run(group, run))
            run = []
        marker = ""
        if first_divergence is None:
            first_divergence = seq
            marker = "  " + FIRST_DIVERGENCE
        out.append(f"  {'seq ' + str(seq):<14}{lines[0]}{marker}")
        out.extend(f"  {'':<14}{line}" for line in lines[1:])
    if run:
        out.append(_agreed_run(group, run))
    if first_divergence is None:
        out.append("  every rank made the same calls, and completed them")
        return out, False
    for record in group.records:
        for entry in record.entries.values():
            if entry["state"] == "failed":
                out.append(f"  rank {record.rank} failed in seq {entry['seq']}: {entry['error']}")
    return out, True


def report(groups: dict[str, Group]) -> tuple[str, bool]:
    """The merged report, and whether some group's ranks diverged."""
    out: list[str] = []
    diverged = False
    for name in sorted(groups):
        lines, group_diverged = _report_group(name, groups[name])
        out.extend(lines)
        diverged = diverged or group_diverged
    return "\n".join(out), diverged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ringtree-flight-recorder",
        description="Merge the flight records of every rank and show where the ranks diverged.",
    )
    parser.add_argument("directory", type=Path, help="directory holding the ranks' JSON flight records")
    args = parser.parse_args(argv)
    groups, notes = load(args.directory)
    for note in notes:
        print(note, file=sys.stderr)
    if not groups:
        print(f"no ringtree flight record in {args.directory}", file=sys.stderr)
        return 2
    text, diverged = report(groups)
    print(text)
    return 1 if diverged else 0


if __name__ == "__main__":
    sys.exit(main())
