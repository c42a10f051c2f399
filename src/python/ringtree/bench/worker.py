"""The rank side of ``ringtree-bench``: what every rank of a benchmarked job runs.

For each collective and size: with ``-c 1``, write verifiable data (and fill an output
that is not the input with a value no correct result holds), run the collective once and
count the wrong elements; then ``warmup_iters`` untimed operations, a barrier, and
``iters`` back-to-back operations timed with ``time.perf_counter``. With ``--device
cuda`` the device is synchronised (``system.synchronize()``) before every clock read:
after the warm-up and after the barrier, at the end of the timed loop, and with
``--timing median`` after each operation; and after the checked operation, before its
result is read. Each rank allocates an input buffer and, when a collective is not in
place, an output buffer, once, at the largest size. Each rank's per-operation average and wrong count go to rank 0 (see
``gather`` in :mod:`ringtree.bench.systems`), which prints the nccl-tests row at once (a
job started by a launcher) or appends it to the orchestrator's result file
(``--result-file``, one JSON object per line: ``meta``, ``begin``, ``row``, ``end``,
``skip``, then ``done``).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import Any, Callable

from . import report
from .options import Collective, size_sweep
from .systems import create, have_torch, unsupported_reason

__all__ = ["run"]


class _ResultFile:
    """Rank 0's records for the orchestrator, flushed line by line."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by done()

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def meta(self, meta: dict[str, Any]) -> None:
        self._write({"meta": meta})

    def begin(self, collective: Collective) -> None:
        self._write({"begin": collective.name})

    def row(self, row: dict[str, Any]) -> None:
        self._write({"row": row})

    def end(self, collective: Collective) -> None:
        self._write({"end": collective.name})

    def skip(self, collective: Collective, reason: str) -> None:
        self._write({"skip": {"collective": collective.name, "reason": reason}})

    def done(self) -> None:
        self._write({"done": True})
        self._file.close()


class _Printer:
    """Rank 0's tables on stdout, row by row (and the JSON file of ``-J``)."""

    def __init__(self, args: argparse.Namespace, system: str, world_size: int) -> None:
        self._args = args
        self._system = system
        self._world_size = world_size
        self._meta: dict[str, Any] = {}
        self._rows: list[dict[str, Any]] = []
        self._notes: list[str] = []

    def _print(self, lines: list[str]) -> None:
        print("\n".join(lines), flush=True)

    def meta(self, meta: dict[str, Any]) -> None:
        self._meta = meta
        self._print([report.settings_line(self._args)])

    def begin(self, collective: Collective) -> None:
        header = report.format_header(
            self._system, collective, self._world_size, self._meta, 1, self._args.timing
        )
        self._print(["#", *header])

    def row(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        self._print([report.format_row(row)])

    def end(self, collective: Collective) -> None:
        self._print(report.format_footer([r for r in self._rows if r["collective"] == collective.name]))

    def skip(self, collective: Collective, reason: str) -> None:
        note = f"{self._system} {collective.name}: skipped: {reason}"
        self._notes.append(note)
        self._print([f"# {note}"])

    def done(self) -> None:
        if self._args.json:
            result = {
                "status": "ok",
                "notes": self._notes,
                "meta": self._meta,
                "runs": [self._rows],
                "rows": self._rows,
            }
            report.write_json(
                self._args.json,
                report.json_document(self._args, self._world_size, {self._system: result}, []),
            )

    @property
    def wrong(self) -> int:
        """Wrong elements over every row printed."""
        return sum(row["wrong"] or 0 for row in self._rows)


def _timed(system: Any, operation: Callable[[], Any], args: argparse.Namespace) -> list[float]:
    """Durations in seconds of ``args.iters`` back-to-back operations after the warm-up
    and a barrier: their average alone (``--timing avg``), or one per operation. On CUDA
    buffers every clock read follows ``system.synchronize()``, so a duration covers the
    device work of its operations; the warm-up has finished before the barrier starts,
    and the barrier's device work (NCCL's) before the clock is first read. Host buffers
    run the loops without it."""
    device = args.device == "cuda"
    for _ in range(args.warmup_iters):
        operation()
    if device:
        system.synchronize()
    system.barrier()
    if device:
        system.synchronize()
    clock = time.perf_counter
    if args.timing == "median":
        step = operation
        if device:

            def step() -> None:
                operation()
                system.synchronize()

        stamps = [clock()]
        for _ in range(args.iters):
            step()
            stamps.append(clock())
        return [end - start for start, end in zip(stamps, stamps[1:])]
    start = clock()
    for _ in range(args.iters):
        operation()
    if device:
        system.synchronize()
    return [(clock() - start) / args.iters]


def _run_collective(
    system: Any,
    collective: Collective,
    args: argparse.Namespace,
    sink: Any,
    inputs: Any,
    outputs: Any,
) -> None:
    """Benchmark one collective over the sweep (one row for barrier). ``inputs`` holds the
    input, and the output of an in-place collective; ``outputs`` the output of the others
    (both large enough for the sweep's largest size; None when not needed)."""
    rank, world_size = system.rank, system.world_size

    def make_row(size: int, count: int, per_rank: list[list[Any]]) -> dict[str, Any]:
        return report.make_row(
            collective,
            args.datatype.label,
            args.op,
            args.root,
            world_size,
            size,
            count,
            per_rank,
            args.timing,
        )

    if not collective.has_data:
        durations = _timed(system, system.operation(collective, None, None, None, args.root), args)
        per_rank = system.gather([durations, None])
        if rank == 0:
            sink.row(make_row(0, 0, per_rank))
        return
    from .data import count_wrong, make_plan, unwritten_value

    parts = collective.parts(world_size)
    input_parts, output_parts = collective.buffer_parts(world_size)
    sweep = size_sweep(args.minbytes, args.maxbytes, args.stepfactor, args.datatype.itemsize, parts)
    plan = None
    if args.check and sweep:
        plan = make_plan(collective, args.datatype, args.op, args.root, rank, world_size, sweep[-1][1])
    native_op = system.reduce_op(args.op) if collective.uses_redop else None
    results = inputs if collective.in_place else outputs
    for size, count in sweep:
        part = count // parts
        send_buf = inputs.view(input_parts * part)
        recv_buf = send_buf if collective.in_place else outputs.view(output_parts * part)
        operation = system.operation(collective, send_buf, recv_buf, native_op, args.root)
        wrong = None
        if plan is not None:
            inputs.write(plan, part)
            if not collective.in_place:
                outputs.fill(unwritten_value(args.datatype), output_parts * part)
            operation()
            system.synchronize()
            wrong = count_wrong(results, plan, part)
        per_rank = system.gather([_timed(system, operation, args), wrong])
        if rank == 0:
            sink.row(make_row(size, part, per_rank))


def run(args: argparse.Namespace) -> int:
    """Run every requested collective as one rank of ``args.system``'s job. Returns the
    exit status: 1 on rank 0 of a launched job when an element was wrong, else 0."""
    system = create(args.system, args.timeout, args.device, args.allow_shared_gpu)
    rank, world_size = system.rank, system.world_size
    if args.root >= world_size:
        system.close()
        raise SystemExit(f"{args.system}: --root {args.root} is not a rank of a {world_size}-rank job")
    sink: Any = None
    if rank == 0:
        sink = _ResultFile(args.result_file) if args.result_file else _Printer(args, args.system, world_size)
        meta = system.describe()
        meta["host"] = socket.gethostname()
        meta["world_size"] = world_size
        sink.meta(meta)
    torch_found = have_torch()
    try:
        runnable = []
        for collective in args.collectives:
            reason = unsupported_reason(
                args.system, collective, args.datatype, args.op, world_size, torch_found
            )
            if reason is None:
                runnable.append(collective)
            elif rank == 0:
                sink.skip(collective, reason)
        sweep = size_sweep(args.minbytes, args.maxbytes, args.stepfactor, args.datatype.itemsize)
        inputs = outputs = None
        if sweep and any(c.has_data for c in runnable):
            inputs = system.new_buffer(args.datatype, sweep[-1][1])
        if sweep and any(c.has_data and not c.in_place for c in runnable):
            outputs = system.new_buffer(args.datatype, sweep[-1][1])
        for collective in runnable:
            if rank == 0:
                sink.begin(collective)
            _run_collective(system, collective, args, sink, inputs, outputs)
            if rank == 0:
                sink.end(collective)
        if rank == 0:
            sink.done()
    finally:
        system.close()
    if rank == 0 and isinstance(sink, _Printer) and sink.wrong:
        print(f"# {sink.wrong} wrong elements", file=sys.stderr)
        return 1
    return 0
