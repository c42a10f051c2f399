"""``ringtree-bench`` / ``python -m ringtree.bench``: the entry point.

``ringtree-bench TOOL ...`` with TOOL one of :data:`~ringtree.bench.options.TOOLS`
(``startup``, ``call-overhead``, ``p2p-pingpong``, ``failure-table``,
``rendezvous-faults``) runs that
measurement. Otherwise the words are the collective sweep's command line.

Without ``--nproc`` this process is one rank of a job started by a launcher and runs
:func:`ringtree.bench.worker.run`. With ``--nproc N`` it orchestrates: it launches an
N-rank job per system (``--system``, then each of ``--compare``), ``--repeat`` times
with the order of the systems rotated from one round to the next, prints each system's
nccl-tests table (rows as they arrive when there is one round, per-size medians after the
last round otherwise) and a side-by-side comparison per collective, and writes ``-J`` and
``--plot``. The exit status is 1 when a system failed or an element was wrong, else 0.

With ``--device cuda`` both modes first ask whether this machine can run the command line
(:func:`ringtree.bench.devices.check`: torch with CUDA, a GPU per rank unless
``--allow-shared-gpu``) and exit with status 2 and a one-line error when it cannot; the
orchestrator then skips, with a note, a system that cannot run on these GPUs (nccl on
shared GPUs, ringtree without its CUDA path).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from . import devices, report
from .launch import LaunchResult, availability, run_system
from .options import PROG, TOOLS, parse_args
from .systems import device_reason, have_torch, unsupported_reason

__all__ = ["main"]


def _print(lines: list[str]) -> None:
    """Print ``lines`` (nothing when empty) at once, flushed."""
    if lines:
        print("\n".join(lines), flush=True)


class _Stream:
    """Prints one launch's tables as its records arrive (used when there is one round)."""

    def __init__(self, system: str, args: argparse.Namespace) -> None:
        self._system = system
        self._args = args
        self._meta: dict[str, Any] = {}
        self._rows: list[dict[str, Any]] = []

    def __call__(self, record: dict[str, Any]) -> None:
        if "meta" in record:
            self._meta = record["meta"]
        elif "begin" in record:
            self._rows = []
            collective = next(c for c in self._args.collectives if c.name == record["begin"])
            header = report.format_header(
                self._system, collective, self._args.nproc, self._meta, 1, self._args.timing
            )
            _print(["#", *header])
        elif "row" in record:
            self._rows.append(record["row"])
            _print([report.format_row(record["row"])])
        elif "end" in record:
            _print(report.format_footer(self._rows))
        elif "skip" in record:
            skip = record["skip"]
            _print([f"# {self._system} {skip['collective']}: skipped: {skip['reason']}"])


def _runnable(system: str, args: argparse.Namespace, gpus: int) -> str | None:
    """Why ``system`` is not launched at all on this host's ``gpus`` GPUs (None when it is)."""
    reason = availability(system) or device_reason(system, args.device, args.nproc, gpus)
    if reason is not None:
        return reason
    torch_found = have_torch()
    reasons = [
        unsupported_reason(system, c, args.datatype, args.op, args.nproc, torch_found)
        for c in args.collectives
    ]
    if all(reasons):
        return "; ".join(dict.fromkeys(reasons))
    return None


def _print_medians(
    system: str, args: argparse.Namespace, meta: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    for collective in args.collectives:
        mine = [r for r in rows if r["collective"] == collective.name]
        if mine:
            header = report.format_header(system, collective, args.nproc, meta, args.repeat, args.timing)
            _print(["#", *header, *map(report.format_row, mine), *report.format_footer(mine)])


def _comparisons(args: argparse.Namespace, medians: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Print the side-by-side table of every collective that at least two systems ran
    (ratios relative to the first of them in the order of ``--system``, ``--compare``) and
    return the comparisons for the JSON file."""
    found = []
    for collective in args.collectives:
        results = [
            (name, [r for r in rows if r["collective"] == collective.name]) for name, rows in medians.items()
        ]
        results = [(name, rows) for name, rows in results if rows]
        if len(results) < 2:
            continue
        _print(["#", *report.comparison_table(collective, args.nproc, results)])
        found.append(
            {
                "collective": collective.name,
                "sizes": [
                    {"size": e["size"], "ratios": e["ratios"]} for e in report.compare(collective, results)
                ],
            }
        )
    return found


def _launch_rounds(args: argparse.Namespace, active: list[str]) -> dict[str, list[LaunchResult]]:
    """Launch every active system ``--repeat`` times, the order rotated each round."""
    launches: dict[str, list[LaunchResult]] = {system: [] for system in active}
    for round_index in range(args.repeat):
        shift = round_index % max(1, len(active))
        for system in active[shift:] + active[:shift]:
            result = run_system(system, args, _Stream(system, args) if args.repeat == 1 else None)
            launches[system].append(result)
            if args.repeat > 1:
                status = f"{system} {result.status} in {result.seconds:.1f} s"
                _print([f"# round {round_index + 1}/{args.repeat}: {status}"])
                if round_index == 0:
                    _print([f"# {note}" for note in result.notes if " skipped: " in note])
            if result.status != "ok":
                failure = [note for note in result.notes if " skipped: " not in note]
                _print([note if note.startswith("  ") else f"# {note}" for note in failure])
    return launches


def _json_systems(launches: dict[str, list[LaunchResult]], medians: dict[str, list[dict[str, Any]]]) -> dict:
    """The ``systems`` part of the JSON document for the launched systems."""
    return {
        system: {
            "status": "ok" if all(r.status == "ok" for r in results) else "failed",
            "notes": list(dict.fromkeys(note for r in results for note in r.notes)),
            "meta": results[0].meta,
            "runs": [r.rows for r in results],
            "rows": medians[system],
        }
        for system, results in launches.items()
    }


def _orchestrate(args: argparse.Namespace) -> int:
    systems = [args.system, *args.compare]
    ranks = f"{args.nproc} per system"
    gpus = 0
    if args.device == "cuda":
        gpus = devices.gpu_count()
        ranks += f" on {gpus} GPU(s){', shared round-robin' if args.nproc > gpus else ', one each'}"
    _print(
        [
            report.settings_line(args),
            f"# ranks: {ranks}, systems: {', '.join(systems)}, repeat: {args.repeat}",
        ]
    )
    active, skipped = [], {}
    for system in systems:
        reason = _runnable(system, args, gpus)
        if reason is None:
            active.append(system)
        else:
            skipped[system] = {"status": "skipped", "notes": [f"{system}: skipped: {reason}"]}
            _print([f"# {system}: skipped: {reason}"])
    launches = _launch_rounds(args, active)
    medians = {
        system: report.median_rows([r.rows for r in results], args.nproc)
        for system, results in launches.items()
    }
    if args.repeat > 1:
        for system, results in launches.items():
            _print_medians(system, args, results[0].meta, medians[system])
    comparisons = _comparisons(args, medians)
    if args.json:
        document = {**_json_systems(launches, medians), **skipped}
        report.write_json(args.json, report.json_document(args, args.nproc, document, comparisons))
    if args.plot:
        _print([report.plot(args.plot, args.collectives, args.nproc, list(medians.items()))])
    failed = any(r.status != "ok" for results in launches.values() for r in results)
    wrong = any(row["wrong"] for rows in medians.values() for row in rows)
    return 1 if failed or wrong else 0


def main(argv: list[str] | None = None) -> int:
    """Run ``ringtree-bench`` with ``argv`` (default: the command line); returns the exit
    status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TOOLS:
        return importlib.import_module(f"{__package__}.{TOOLS[argv[0]]}").main(argv[1:])
    args = parse_args(argv)
    problem = devices.check(args)
    if problem is not None:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    if args.nproc is None:
        from .worker import run

        return run(args)
    return _orchestrate(args)
